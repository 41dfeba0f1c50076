"""``tarindex verify``."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import click

from ..errors import ShardNotFoundError, StaleIndexError
from ._common import open_index

if TYPE_CHECKING:
    from ..index.format import ShardTable


@click.command("verify")
@click.argument("index")
@click.option("--deep", is_flag=True, help="Rescan every shard and compare its tables with the index.")
def command(index: str, deep: bool) -> None:
    """Check that every shard of INDEX is unchanged since indexing."""
    from ..scan import scan_shard
    from ..shards import fingerprint
    from ..sources import is_url

    ix = open_index(index)
    for i, info in enumerate(ix.shards):
        if is_url(info.path):  # indexed from a URL: one sequential read gives size, fingerprint and tables
            new, table = scan_shard(info.path)
            if new.size != info.size:
                raise StaleIndexError(info.path, f"size {info.size} -> {new.size}")
            if new.fingerprint != info.fingerprint:
                raise StaleIndexError(info.path, "content fingerprint differs")
            if deep and not _same_tables(table, ix.shard_table(i)):
                raise StaleIndexError(info.path, "rescan gives different offset tables")
            continue
        path = str(ix.shard_path(i))
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise ShardNotFoundError(f"{path}: shard named by {ix.path} is missing") from None
        try:
            size = os.fstat(fd).st_size
            if size != info.size:
                raise StaleIndexError(path, f"size {info.size} -> {size}")
            if fingerprint(fd, size) != info.fingerprint:
                raise StaleIndexError(path, "content fingerprint differs")
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
