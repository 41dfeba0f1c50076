"""``tarindex verify``."""

from __future__ import annotations

import click


@click.command("verify")
@click.argument("index")
@click.option("--deep", is_flag=True, help="Rescan every shard and compare its tables with the index.")
@click.option("--allow-commands", is_flag=True, help="Run the pipe: commands the index names as shards (trusted indexes only).")
def command(index: str, deep: bool, allow_commands: bool) -> None:
    """Check that every shard of INDEX (an index file, or the index beside shards that holds them) is unchanged since indexing."""
    from ..verify import verify_index
    from ._common import index_of

    click.echo(str(verify_index(index_of(index), deep=deep, allow_commands=allow_commands)))
