"""``tarindex compress``."""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING

import click

from .._codecs import SUFFIXES

if TYPE_CHECKING:
    from ._progress import Bar

# shard_writer's DEFAULT_LEVEL and DEFAULT_FRAME_SIZE (a test keeps them equal): importing it here would
# import the codecs for every --help
DEFAULT_LEVEL = 3
DEFAULT_FRAME_SIZE = 8 << 10

def output_name(src: str) -> str:
    """The name ``src`` gets in an output directory: its name with a shard's suffix (the codec registry's:
    ``.tar``, ``.tar.gz``, ``.tgz``, ``.tar.zst``, ``.tar.zstd``, ``.tzst``) replaced by ``.tar.zst`` (any other
    name: ``.tar.zst`` appended)."""
    name = os.path.basename(src)
    for suffix in SUFFIXES:
        if name.lower().endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)] + ".tar.zst"
    return name + ".tar.zst"


def _compress_one(job: tuple[str, str], level: int, frame_size: int) -> tuple[int, int, int]:
    """Compress one file in a worker: its frames, compressed and uncompressed bytes."""
    from ..shard_writer import compress_shard

    sizes = compress_shard(job[0], job[1], level=level, frame_size=frame_size)
    return len(sizes), sum(s[0] for s in sizes), sum(s[1] for s in sizes)


@click.command("compress")
@click.argument("paths", nargs=-1, required=True, metavar="IN... OUT")
@click.option("--level", type=click.IntRange(-7, 22), default=DEFAULT_LEVEL, show_default=True, help="zstd level.")
@click.option(
    "--frame-size",
    type=click.IntRange(1),
    default=DEFAULT_FRAME_SIZE,
    show_default=True,
    metavar="BYTES",
    help="Uncompressed bytes per frame (frames end on the first sample boundary past this).",
)
@click.option("-w", "--workers", type=click.IntRange(1), default=None, help="Files compressed at once (default: CPU count).")
@click.option("-p", "--parents", is_flag=True, help="Make OUT's directory (or the directory OUT) when it does not exist; without it, a missing directory is refused.")
@click.option("-f", "--force", is_flag=True, help="Replace outputs that exist (without it, an existing output other than IN itself is refused).")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar or summary.")
def command(paths: tuple[str, ...], level: int, frame_size: int, workers: int | None, parents: bool, force: bool, quiet: bool) -> None:
    """Rewrite tar shards IN (plain, zstd or gzip) as seekable zstd with sample-aligned frames.

    'compress IN OUT' writes the file OUT. With several IN, a glob or brace pattern ('d/*.tar'), or an OUT
    that is a directory (or ends with /), each file is written into the directory OUT as NAME.tar.zst
    (.tar, .tar.gz, .tgz, .tar.zst replaced), -w files at a time. Each output ends with a seek table (zstd
    seekable format); 'zstd -d' gives back the tar byte for byte. OUT may be IN (recompress in place;
    rebuild the index after); any other output that exists is refused unless -f, as zstd does.
    """
    from ..errors import counted
    from ..shards import expand_shards
    from ._common import check_parent, human, shown_path
    from ._progress import Bar

    if len(paths) < 2:
        raise click.UsageError("expected IN... OUT: the files to compress, then the output file (or directory)")
    *given, out = paths
    sources = expand_shards(given)
    into = os.path.isdir(out) or out.endswith(("/", os.sep)) or len(given) > 1 or sources != given
    if into:
        if not os.path.isdir(out):
            if os.path.exists(out):
                raise click.UsageError(f"{out}: not a directory; several files (or a pattern) are written into a directory")
            if not parents:
                raise click.UsageError(f"{out}: directory does not exist; create it, or pass -p (--parents) to have it made")
            os.makedirs(out, exist_ok=True)
        jobs = [(src, os.path.join(out, output_name(src))) for src in sources]
        seen: dict[str, str] = {}
        for src, dst in jobs:
            if os.path.abspath(dst) in seen:
                raise click.UsageError(f"{seen[os.path.abspath(dst)]} and {src} would both be written to {dst}; compress them into different directories")
            seen[os.path.abspath(dst)] = src
    else:
        check_parent(out, parents)
        jobs = [(sources[0], out)]
    if not force:
        _refuse_overwrites(jobs)
    sizes = [os.path.getsize(src) for src, _ in jobs]
    n = min(workers or os.cpu_count() or 1, len(jobs))
    start = time.monotonic()
    done: list[tuple[int, int, int]] = []
    with Bar("compressing", len(jobs), "file", total_bytes=sum(sizes), show=not quiet and sys.stderr.isatty()) as bar:
        if n == 1:  # here, each file's progress as it goes
            from ..shard_writer import compress_shard

            for src, dst in jobs:
                frames = compress_shard(src, dst, level=level, frame_size=frame_size, progress=lambda k: bar.advance(0, k))
                bar.advance(1)
                done.append((len(frames), sum(f[0] for f in frames), sum(f[1] for f in frames)))
        else:
            _in_workers(jobs, sizes, n, level, frame_size, bar, done)
    if quiet:
        return
    frames, c, d = (sum(x) for x in zip(*done))
    if not into:
        click.echo(f"{shown_path(out)}: {counted(frames, 'frame')}, {d} -> {c} bytes ({c / max(d, 1):.1%})")
    else:
        click.echo(
            f"{shown_path(out)}: {counted(len(jobs), 'file')} compressed, {human(d)} -> {human(c)} ({c / max(d, 1):.1%}) "
            f"in {time.monotonic() - start:.1f} s"
        )


def _refuse_overwrites(jobs: list[tuple[str, str]]) -> None:
    """Refuse an output that exists, is not empty and is not its input (a shard or any file named by mistake,
    ``compress d/a.tar d/b.tar``), before anything is written.

    Raises:
        OverwriteError: naming the first such output.
    """
    from ..errors import OverwriteError

    for src, dst in jobs:
        try:
            st = os.stat(dst)
        except FileNotFoundError:
            continue
        if os.path.samestat(st, os.stat(src)) or (st.st_size == 0 and not os.path.isdir(dst)):
            continue
        raise OverwriteError(f"{dst}: exists; refusing to overwrite it with {src}: pass -f (--force) to replace it, or choose another output")


def _in_workers(jobs: list[tuple[str, str]], sizes: list[int], n: int, level: int, frame_size: int, bar: Bar, done: list[tuple[int, int, int]]) -> None:
    """The jobs in ``n`` worker processes (the build's pool), each file counted as it completes; on an error or
    Ctrl-C the workers are stopped and their temporary files removed."""
    import functools
    from pathlib import Path

    from .._atomic import clean_stale
    from ..build import mapped, worker_pool

    try:
        with worker_pool(n, name="tarindex-compress") as pool:
            for k, result in enumerate(mapped(pool, functools.partial(_compress_one, level=level, frame_size=frame_size), jobs)):
                bar.advance(1, sizes[k])
                done.append(result)
    except BaseException:
        for _, dst in jobs:  # the stopped workers' temporary files (their processes are gone)
            clean_stale(Path(dst))
            clean_stale(Path(dst).with_name(Path(dst).name + ".plain"))
        raise
