"""``tarindex info``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from ._common import human

if TYPE_CHECKING:
    from pathlib import Path


@click.command("info")
@click.argument("index")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def command(index: str, as_json: bool) -> None:
    """Summarise INDEX (an index file, or the index beside shards that holds them)."""
    from ..index.meta import read_meta
    from ._common import index_of, shown_path

    path = index_of(index)
    meta = read_meta(path)  # the totals are in the meta: no record is decoded, numpy is not imported
    content = _kept(meta) or _counted(path)
    exts = {e: n for e, n in sorted(content["ext_members"].items(), key=lambda kv: -kv[1]) if n}
    summary = {
        "index": shown_path(path),
        "format_version": meta["format_version"],
        "created": meta["created"],
        "shards": meta["n_shards"],
        "samples": meta["n_samples"],
        "members": meta["n_members"],
        "sample_bytes": content["data_bytes"],
        "shard_bytes": content["shard_bytes"],
        "zstd_shards": content["zstd_shards"],
        "zstd_shards_without_random_access": content["zstd_shards_without_random_access"],
        "gzip_shards": content["gzip_shards"],
        "index_bytes": path.stat().st_size,
        "duplicate_keys": meta["duplicate_keys"],
        "extensions": exts,
    }
    if as_json:
        import json  # on use: --help lists this command without it

        click.echo(json.dumps(summary, indent=2))
        return
    click.echo(f"index:          {summary['index']} (format {summary['format_version']}, {human(summary['index_bytes'])})")
    click.echo(f"created:        {summary['created']}")
    click.echo(f"shards:         {summary['shards']} ({human(summary['shard_bytes'])})")
    if summary["zstd_shards"]:
        slow = summary["zstd_shards_without_random_access"]
        click.echo(f"zstd shards:    {summary['zstd_shards']}" + (f" ({slow} too coarse for random access; see docs/zstd.md)" if slow else ""))
    if summary["gzip_shards"]:
        click.echo(f"gzip shards:    {summary['gzip_shards']}")
    click.echo(f"samples:        {summary['samples']} ({human(summary['sample_bytes'])})")
    click.echo(f"members:        {summary['members']}")
    dup = summary["duplicate_keys"]
    click.echo(f"duplicate keys: {dup}" + (" (lookup by key returns the first sample)" if dup else ""))
    click.echo("extensions:     " + ", ".join(f"{e} {n}" for e, n in exts.items()))


def _kept(meta: dict[str, Any]) -> dict[str, Any] | None:
    """The content totals the meta keeps (``CONTENT_SUMMARY``, ``LATER_CONTENT``), or ``None`` for an index written
    before it kept them all."""
    from ..index.format import CONTENT_SUMMARY, LATER_CONTENT

    if "ext_members" not in meta or any(k not in meta for k in LATER_CONTENT):
        return None
    return {**{k: meta[k] for k in (*CONTENT_SUMMARY, *LATER_CONTENT)}, "ext_members": dict(zip(meta["exts"], meta["ext_members"]))}


def _counted(path: Path) -> dict[str, Any]:
    """The content totals of an older index: every record decoded."""
    import numpy as np

    from .._codecs import GZIP, ZSTD
    from ..index.reader import IndexReader

    ix = IndexReader(path)
    samples = ix.decode()
    counts = np.bincount(samples.member_ext, minlength=len(ix.exts)).tolist()
    return {
        "data_bytes": int(samples.size.sum(dtype="u8")),
        "shard_bytes": sum(s.size for s in ix.shards),
        "zstd_shards": sum(1 for s in ix.shards if s.compression == ZSTD.compression),
        "zstd_shards_without_random_access": sum(1 for s in ix.shards if not s.random_access),
        "gzip_shards": sum(1 for s in ix.shards if s.compression == GZIP.compression),
        "ext_members": dict(zip(ix.exts, counts)),
    }
