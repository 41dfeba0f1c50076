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
    """Check that the shards of INDEX are unchanged since indexing: every shard of an index file, or the shards
    named (paths, globs, brace patterns) of the index beside them that holds them."""
    from ..errors import counted
    from ..index.reader import IndexReader
    from ..shards import given_index
    from ..verify import verify_index
    from ._common import open_index, shown_path
    from ._progress import Bar

    given = given_index(index)
    reader, view = open_index(index) if given is None else (IndexReader(given), None)
    path, meta = reader.path, reader.meta  # the totals: no record is read
    shards = view.shards if view is not None else None
    sizes = [reader.shards[i].size for i in shards] if deep and shards is not None else None
    reader.close()
    size = sum(sizes) if sizes is not None else meta.get("shard_bytes") if deep else None  # kept by indexes since the content summary
    count = len(shards) if shards is not None else int(meta["n_shards"])
    with Bar("verifying", count, "shard", total_bytes=size, show=not quiet and sys.stderr.isatty()) as bar:
        report = verify_index(path, deep=deep, allow_commands=allow_commands, progress=bar.advance, shards=shards)
    if not quiet:
        click.echo(f"{shown_path(report.path)}: {counted(len(report.shards), 'shard')} ok" + (" (deep)" if report.deep else ""))
