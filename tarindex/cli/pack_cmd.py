"""``tarindex pack``."""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from ._common import size_option
from .build_cmd import _headers, _logged_warnings, _storage_options

# packing's defaults (a test keeps them equal): importing it here would import numpy for every --help
DEFAULT_MAXCOUNT = 100_000
DEFAULT_MAXSIZE = "3000000000"
DEFAULT_MEMORY = "256M"


def _exts(ctx: click.Context, param: click.Parameter, value: str | None) -> frozenset[str] | None:
    if value is None:
        return None
    found = frozenset(e.strip().lower().lstrip(".") for e in value.split(",") if e.strip())
    if not found:
        raise click.BadParameter(f"{value!r}: expected extensions separated by commas, e.g. jpg,cls")
    return found


def _keys(ctx: click.Context, param: click.Parameter, value: str | None) -> frozenset[str] | None:
    if value is None:
        return None
    try:
        with open(value, encoding="utf-8") as f:
            return frozenset(line.rstrip("\r\n") for line in f if line.strip())
    except (OSError, UnicodeDecodeError) as exc:
        raise click.BadParameter(f"{value}: cannot read a list of keys ({exc})") from None


@click.command("pack")
@click.argument("sources", nargs=-1, required=True)
@click.option("-o", "--output", required=True, metavar="PATTERN", help="Shard names with a %d-style number: out/train-%06d.tar, or .tar.zst for seekable zstd.")
@click.option("--index", "index", type=click.Path(dir_okay=False), help="Index file (default: beside the shards).")
@click.option("--maxcount", type=click.IntRange(1), default=DEFAULT_MAXCOUNT, show_default=True, help="Samples per shard at most.")
@click.option("--maxsize", callback=size_option, default=DEFAULT_MAXSIZE, show_default=True, metavar="SIZE", help="Bytes of tar per shard at most (or 512M, 2G: powers of 1024).")
@click.option("-w", "--workers", type=click.IntRange(1), default=None, help="Processes writing shards (default: CPU count).")
@click.option("--select", "exts", callback=_exts, metavar="EXTS", help="Keep only these extensions, e.g. jpg,cls (samples left with none are dropped).")
@click.option("--keys", "keys", callback=_keys, metavar="FILE", help="Keep only the samples whose keys FILE lists (one a line).")
@click.option("--label", is_flag=True, help="Directories: add a cls member, the number of each sample's top directory (as ImageFolder).")
@click.option("--shuffle", is_flag=True, help="Write the samples in a random order (see --seed); over shards, an external shuffle in --memory.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of --shuffle.")
@click.option("--memory", callback=size_option, default=DEFAULT_MEMORY, show_default=True, metavar="SIZE", help="--shuffle of shards: bytes of samples in memory at a time.")
@click.option("--level", type=click.IntRange(-7, 22), default=3, show_default=True, help="zstd level (.tar.zst output).")
@click.option("--frame-size", type=click.IntRange(1), default=8 << 10, show_default=True, metavar="BYTES", help="Uncompressed bytes per zstd frame (.tar.zst output).")
@click.option("--no-resume", "no_resume", is_flag=True, help="Write every shard, even those an interrupted run of this pack completed.")
@click.option("--force", is_flag=True, help="Replace the files at the output names and the output index, whoever wrote them (default: only an earlier pack of this pattern's).")
@click.option("--tmpdir", type=click.Path(file_okay=False), default=None, help="Bucket files of --shuffle, index of input shards (default: the output's directory).")
@click.option(
    "-H", "--header", "headers", multiple=True, callback=_headers, metavar="'NAME: VALUE'",
    help="An HTTP(S) request header for URL shards (repeatable). Never stored.",
)
@click.option(
    "--storage-option", "storage_options", multiple=True, callback=_storage_options, metavar="KEY=VALUE",
    help="An object-store or fsspec client option for URL shards (repeatable), as for build. Never stored.",
)
@click.option("-q", "--quiet", is_flag=True, help="No progress bar or summary.")
def command(
    sources: tuple[str, ...],
    output: str,
    index: str | None,
    maxcount: int,
    maxsize: int,
    workers: int | None,
    exts: frozenset[str] | None,
    keys: frozenset[str] | None,
    label: bool,
    shuffle: bool,
    seed: int,
    memory: int,
    level: int,
    frame_size: int,
    no_resume: bool,
    force: bool,
    tmpdir: str | None,
    headers: dict[str, str],
    storage_options: dict[str, Any],
    quiet: bool,
) -> None:
    """Pack SOURCES (directories, file lists, or shards) into indexed shards.

    A directory's files are grouped into samples by webdataset's key rule (a/b/123.jpg and a/b/123.json make
    sample a/b/123), keys sorted. A list file is .txt/.lst (a path a line), .csv (a header row: __key__, then a
    column per extension; EXT:text columns hold the text itself) or .jsonl (one object a line, fields as in the
    CSV). Anything else is shards (paths, globs, patterns, URLs, an index, a wids .json list), resharded. The
    index is written beside the shards; run again after an interruption, complete shards are kept.
    """
    from ..errors import TarIndexError, counted
    from ..options import SourceOptions
    from ..packing import pack
    from ._common import shown_path
    from ._progress import Bar

    options = SourceOptions.given(None, storage_options=storage_options or None, headers=headers or None)
    start = time.monotonic()
    bar = Bar("packing", None, "sample", show=not quiet and sys.stderr.isatty(), item_rate=True)  # its total: with the first count

    def progress(samples: int, nbytes: int, total: int) -> None:
        bar.total = total
        bar.advance(samples, nbytes)

    try:
        with _logged_warnings(), bar:
            report = pack(
                sources, output, index=index, maxcount=maxcount, maxsize=maxsize, workers=workers, exts=exts, keys=keys,
                label=label, shuffle=shuffle, seed=seed, memory=memory, level=level, frame_size=frame_size,
                resume=not no_resume, force=force, progress=progress, tmpdir=tmpdir, options=options,
            )  # fmt: skip
    except ValueError as exc:
        if isinstance(exc, TarIndexError):  # bad data: one line, exit 1 (cli/main.py)
            raise
        raise click.UsageError(str(exc)) from None  # a bad option
    if not quiet:
        elapsed = time.monotonic() - start
        kept = f", {len(report.kept)} kept from an earlier run" if report.kept else ""
        click.echo(
            f"{shown_path(report.index)}: {counted(len(report.shards), 'shard')} ({len(report.written)} written{kept}), {report.samples:,} sample{'' if report.samples == 1 else 's'}, "
            f"{report.bytes / 1e6:,.1f} MB in {elapsed:.1f} s"
        )
        if report.classes is not None:
            click.echo(f"classes: {', '.join(f'{i}={name}' for i, name in enumerate(report.classes))}")
