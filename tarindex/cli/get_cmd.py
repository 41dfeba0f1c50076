"""``tarindex get``."""

from __future__ import annotations

import sys

import click

from ..errors import SampleNotFoundError


@click.command("get")
@click.argument("index")
@click.argument("sample")
@click.option("--ext", help="Member extension (required when the sample has several members).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True), help="File to write (default stdout).")
@click.option("-n", "--number", is_flag=True, help="SAMPLE is a sample number, not a key.")
def command(index: str, sample: str, ext: str | None, output: str | None, number: bool) -> None:
    """Write a member of SAMPLE (a key, or a number with -n) from INDEX (an index file, or shards: theirs only)."""
    from ..dataset import TarDataset

    ds = TarDataset(index)
    if number:
        try:
            i = int(sample)
        except ValueError:
            raise click.BadParameter(f"{sample!r} is not a number", param_hint="SAMPLE") from None
        if not 0 <= i < len(ds):
            raise SampleNotFoundError(f"{index}: no sample {i} ({len(ds)} samples)")
        rec = ds.read(i)
    else:
        rec = ds.get(sample)
    exts = [k for k in rec if not k.startswith("__")]
    if ext is None:
        if len(exts) != 1:
            raise click.UsageError(f"sample {rec['__key__']!r} has members {', '.join(exts)}: choose one with --ext")
        ext = exts[0]
    if ext not in rec:
        raise SampleNotFoundError(f"{ds.index_path}: sample {rec['__key__']!r} has no {ext!r} (has {', '.join(exts)})")
    if output:
        from .._atomic import atomic_write

        with atomic_write(output) as f:  # a missing directory is made; a failed write is one line (WriteError)
            f.write(rec[ext])
    else:
        sys.stdout.buffer.write(rec[ext])
        sys.stdout.buffer.flush()
