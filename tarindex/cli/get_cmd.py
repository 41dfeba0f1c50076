"""``tarindex get``."""

from __future__ import annotations

import re
import sys

import click

from ..errors import SampleNotFoundError

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def is_text(data: bytes) -> bool:
    """Whether ``data`` is text a terminal shows as it is: UTF-8 without control characters other than
    tab, line feed and carriage return (no NUL, no escape sequence)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return _CONTROL.search(text) is None


@click.command("get")
@click.argument("index")
@click.argument("sample")
@click.option("--ext", help="Member extension, in any case (jpg, JPG, .jpg; required when the sample has several members).")
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False, writable=True, allow_dash=True),
    help="File to write; '-': standard output, even a terminal (default: standard output, where a binary member is refused on a terminal).",
)  # fmt: skip
@click.option("-p", "--parents", is_flag=True, help="Make the directory of -o FILE when it does not exist; without it, a missing directory is refused.")
@click.option("-n", "--number", is_flag=True, help="SAMPLE is a sample number, not a key.")
def command(index: str, sample: str, ext: str | None, output: str | None, parents: bool, number: bool) -> None:
    """Write a member of SAMPLE (a key, or a number with -n) from INDEX (an index file, or shards: theirs only)."""
    from ..dataset import TarDataset
    from ..errors import counted
    from ._common import check_parent

    if output is not None and output != "-":
        check_parent(output, parents)
    ds = TarDataset(index)
    if number:
        try:
            i = int(sample)
        except ValueError:
            raise click.BadParameter(f"{sample!r} is not a number", param_hint="SAMPLE") from None
        if not 0 <= i < len(ds):
            raise SampleNotFoundError(f"{index}: no sample {i} ({counted(len(ds), 'sample')})")
        rec = ds.read(i)
    else:
        rec = ds.get(sample)
    exts = [k for k in rec if not k.startswith("__")]
    if ext is None:
        if len(exts) != 1:
            raise click.UsageError(f"sample {rec['__key__']!r} has members {', '.join(exts)}: choose one with --ext")
        ext = exts[0]
    wanted = ext.removeprefix(".").lower()  # extensions are lower-cased when shards are read (webdataset's rule)
    if wanted not in rec or wanted.startswith("__"):
        raise SampleNotFoundError(f"{ds.index_path}: sample {rec['__key__']!r} has no {ext!r} (has {', '.join(exts)})")
    data = rec[wanted]
    if output is not None and output != "-":
        from .._atomic import atomic_write

        with atomic_write(output) as f:  # a failed write is one line (WriteError)
            f.write(data)
        return
    if output is None and sys.stdout.isatty() and not is_text(data):
        raise click.UsageError(
            f"sample {rec['__key__']!r}: the {wanted!r} member ({counted(len(data), 'byte')}) is binary; not written to "
            "a terminal: write it to a file with -o FILE, or pipe it (| less, > FILE); -o - writes it here anyway"
        )
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()
