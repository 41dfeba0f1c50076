"""``tarindex ls``."""

from __future__ import annotations

import click

from ._common import open_index


@click.command("ls")
@click.argument("index")
@click.option("-n", "--limit", type=click.IntRange(0), default=None, help="Show at most this many samples.")
def command(index: str, limit: int | None) -> None:
    """List samples of INDEX (an index file, or shards: theirs only): number, key, shard, offset, size, members."""
    ix, view = open_index(index)
    total = view.n if view is not None else ix.n_samples
    n = total if limit is None else min(limit, total)
    for i in range(n):
        shard, offset, size, members, key = ix.record(view.to_index(i) if view is not None else i)
        listed = ",".join(f"{e}:{s}" for e, _, s in members)
        click.echo(f"{i}\t{key}\t{ix.shards[shard].path}\t{offset}\t{size}\t{listed}")
