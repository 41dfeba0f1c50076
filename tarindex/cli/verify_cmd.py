"""``tarindex verify``."""

from __future__ import annotations

import click


@click.command("verify")
@click.argument("index")
@click.option("--deep", is_flag=True, help="Rescan every shard and compare its tables with the index.")
@click.option("--allow-commands", is_flag=True, help="Run the pipe: commands the index names as shards (trusted indexes only).")
def command(index: str, deep: bool, allow_commands: bool) -> None:
    """Check that every shard of INDEX is unchanged since indexing."""
    from ..shards import resolve_index
    from ..verify import verify_index

    click.echo(str(verify_index(resolve_index(index), deep=deep, allow_commands=allow_commands)))
