"""``tarindex merge``."""

from __future__ import annotations

import click


@click.command("merge")
@click.argument("parts", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--index", "output", required=True, type=click.Path(dir_okay=False), help="Merged index file.")
def command(parts: tuple[str, ...], output: str) -> None:
    """Combine partial indexes PARTS (shards in the order given) into one."""
    from ..build import merge_indexes

    path = merge_indexes(parts, output)
    click.echo(f"{path}: merged {len(parts)} indexes")
