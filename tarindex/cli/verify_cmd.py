"""``tarindex verify``."""

from __future__ import annotations

import os

import click

from ..errors import ShardNotFoundError, StaleIndexError
from ..identity import check_shard
from ..index.format import ShardTable
from ..opener import check_commands, shard_name
from ..scan import scan_shard
from ._common import open_index


@click.command("verify")
@click.argument("index")
@click.option("--deep", is_flag=True, help="Rescan every shard and compare its tables with the index.")
@click.option("--allow-commands", is_flag=True, help="Run the pipe: commands the index names as shards (trusted indexes only).")
def command(index: str, deep: bool, allow_commands: bool) -> None:
    """Check that every shard of INDEX is unchanged since indexing."""
    ix = open_index(index)
    check_commands(ix.path, ix.shards, allow_commands)
    names = [shard_name(ix.path, info) for info in ix.shards]
    for i, info in enumerate(ix.shards):
        if info.kind != "file":  # a URL or command: one sequential read gives size, fingerprint and tables
            new, table = scan_shard(names[i])
            if new.size != info.size:
                raise StaleIndexError(info.path, f"size {info.size} -> {new.size}")
            if new.fingerprint != info.fingerprint:
                raise StaleIndexError(info.path, "content fingerprint differs")
            if deep and not _same_tables(table, ix.shard_table(i)):
                raise StaleIndexError(info.path, "rescan gives different offset tables")
            continue
        path = names[i]
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise ShardNotFoundError(f"{path}: shard named by {ix.path} is missing") from None
        try:
            check_shard(path, fd, info, check="fingerprint")
        finally:
            os.close(fd)
        if deep:
            _, table = scan_shard(path)
            if not _same_tables(table, ix.shard_table(i)):
                raise StaleIndexError(path, "rescan gives different offset tables")
    click.echo(f"{ix.path}: {len(ix.shards)} shards ok" + (" (deep)" if deep else ""))


def _same_tables(table: ShardTable, old: ShardTable) -> bool:
    return bool(
        table.keys == old.keys
        and (table.sample_offset == old.sample_offset).all()
        and (table.sample_size == old.sample_size).all()
        and (table.member_offset == old.member_offset).all()
        and (table.member_size == old.member_size).all()
        and [table.exts[e] for e in table.member_ext] == [old.exts[e] for e in old.member_ext]
    )
