"""``tarindex info``."""

from __future__ import annotations

import json

import click

from ._common import human, open_index


@click.command("info")
@click.argument("index")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def command(index: str, as_json: bool) -> None:
    """Summarise INDEX (an index file, or the shards it sits beside)."""
    import numpy as np

    ix = open_index(index)
    samples = ix.decode()
    counts = np.bincount(samples.member_ext, minlength=len(ix.exts)).tolist()
    exts = {ix.exts[e]: n for e, n in sorted(enumerate(counts), key=lambda kv: -kv[1]) if n}
    data_bytes = int(samples.size.sum(dtype="u8"))
    summary = {
        "index": str(ix.path),
        "format_version": ix.meta["format_version"],
        "created": ix.meta["created"],
        "shards": len(ix.shards),
        "samples": ix.n_samples,
        "members": ix.n_members,
        "sample_bytes": data_bytes,
        "shard_bytes": sum(s.size for s in ix.shards),
        "zstd_shards": sum(1 for s in ix.shards if s.compression == "zstd"),
        "zstd_shards_without_random_access": sum(1 for s in ix.shards if not s.random_access),
        "index_bytes": ix.file_size(),
        "duplicate_keys": ix.duplicate_keys,
        "extensions": exts,
    }
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    click.echo(f"index:          {summary['index']} (format {summary['format_version']}, {human(summary['index_bytes'])})")
    click.echo(f"created:        {summary['created']}")
    click.echo(f"shards:         {summary['shards']} ({human(summary['shard_bytes'])})")
    if summary["zstd_shards"]:
        slow = summary["zstd_shards_without_random_access"]
        click.echo(f"zstd shards:    {summary['zstd_shards']}" + (f" ({slow} too coarse for random access; see docs/zstd.md)" if slow else ""))
    click.echo(f"samples:        {summary['samples']} ({human(data_bytes)})")
    click.echo(f"members:        {summary['members']}")
    dup = summary["duplicate_keys"]
    click.echo(f"duplicate keys: {dup}" + (" (lookup by key returns the first sample)" if dup else ""))
    click.echo("extensions:     " + ", ".join(f"{e} {n}" for e, n in exts.items()))
