"""``tarindex ls``."""

from __future__ import annotations

import click

from ._common import open_index


@click.command("ls")
@click.argument("index")
@click.option("-n", "--limit", type=click.IntRange(0), default=None, help="Show at most this many samples.")
def command(index: str, limit: int | None) -> None:
    """List samples of INDEX: number, key, shard, offset, size, members."""
    ix = open_index(index)
    shard_of, off, size = ix.column("sample_shard"), ix.column("sample_offset"), ix.column("sample_size")
    n = ix.n_samples if limit is None else min(limit, ix.n_samples)
    for i in range(n):
        members = ",".join(f"{e}:{s}" for e, _, s in ix.members(i))
        click.echo(f"{i}\t{ix.key(i)}\t{ix.shards[shard_of[i]].path}\t{off[i]}\t{size[i]}\t{members}")
