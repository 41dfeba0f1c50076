"""``tarindex verify``."""

from __future__ import annotations

import sys

import click


@click.command("verify")
@click.argument("index")
@click.option("--deep", is_flag=True, help="Rescan every shard and compare its tables with the index.")
@click.option("--allow-commands", is_flag=True, help="Run the pipe: commands the index names as shards (trusted indexes only).")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar or summary (the exit code says it).")
def command(index: str, deep: bool, allow_commands: bool, quiet: bool) -> None:
    """Check that every shard of INDEX (an index file, or the index beside shards that holds them) is unchanged since indexing."""
    from ..errors import counted
    from ..index.reader import IndexReader
    from ..verify import verify_index
    from ._common import index_of, shown_path
    from ._progress import Bar

    path = index_of(index)
    reader = IndexReader(path)
    meta = reader.meta  # the totals: no record is read
    reader.close()
    size = meta.get("shard_bytes") if deep else None  # kept by indexes since the content summary
    with Bar("verifying", int(meta["n_shards"]), "shard", total_bytes=size, show=not quiet and sys.stderr.isatty()) as bar:
        report = verify_index(path, deep=deep, allow_commands=allow_commands, progress=bar.advance)
    if not quiet:
        click.echo(f"{shown_path(report.path)}: {counted(len(report.shards), 'shard')} ok" + (" (deep)" if report.deep else ""))
