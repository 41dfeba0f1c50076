"""``tarindex merge``."""

from __future__ import annotations

import sys

import click


@click.command("merge")
@click.argument("parts", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--index", "output", required=True, type=click.Path(dir_okay=False), help="Merged index file.")
@click.option("-p", "--parents", is_flag=True, help="Make the merged index's directory when it does not exist; without it, a missing directory is refused.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar or summary.")
def command(parts: tuple[str, ...], output: str, parents: bool, quiet: bool) -> None:
    """Combine indexes PARTS into one: the parts of a --part K/N build in K order, whatever the order given; whole indexes in the order given."""
    import os

    from ..build import merge_indexes
    from ..errors import counted
    from ..index.reader import IndexReader
    from ._common import check_parent, shown_path
    from ._progress import Bar

    check_parent(output, parents)
    total = 0
    for part in parts:
        reader = IndexReader(part)
        total += int(reader.meta["n_shards"])  # the meta alone: no record is read
        reader.close()
    size = sum(os.path.getsize(p) for p in parts)
    with Bar("merging", total, "shard", total_bytes=size, show=not quiet and sys.stderr.isatty()) as bar:
        path = merge_indexes(parts, output, progress=bar.advance)
    if not quiet:
        click.echo(f"{shown_path(path)}: merged {counted(len(parts), 'index', 'indexes')}, {counted(total, 'shard')}")
