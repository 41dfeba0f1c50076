"""``tarindex build``."""

from __future__ import annotations

import os
import sys

import click


def _part(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[int, int] | None:
    if value is None:
        return None
    try:
        k, n = (int(x) for x in value.split("/"))
    except ValueError:
        raise click.BadParameter("expected K/N, for example 1/4") from None
    if not 1 <= k <= n:
        raise click.BadParameter("K must be between 1 and N")
    return k, n


@click.command("build")
@click.argument("shards", nargs=-1, required=True)
@click.option("-o", "--index", "index", type=click.Path(dir_okay=False), help="Index file (default: beside the shards).")
@click.option("-w", "--workers", type=click.IntRange(1), default=None, help="Scanning processes (default: CPU count).")
@click.option("--part", callback=_part, metavar="K/N", help="Index only the K-th of N slices of the shards.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar or summary.")
def command(shards: tuple[str, ...], index: str | None, workers: int | None, part: tuple[int, int] | None, quiet: bool) -> None:
    """Index SHARDS (paths, globs, brace patterns) into one LMDB index."""
    from ..build import build_index
    from ..shards import expand_shards

    paths = expand_shards(shards)
    total = len(paths) if part is None else len(paths[(part[0] - 1) * len(paths) // part[1] : part[0] * len(paths) // part[1]])
    show = not quiet and sys.stderr.isatty()
    with click.progressbar(length=total, label="indexing", file=sys.stderr, hidden=not show) as bar:
        report = build_index(paths, index=index, workers=workers, part=part, progress=bar.update)
    if not quiet:
        click.echo(f"{report.path}: {len(report.scanned)} shards scanned, {len(report.reused)} unchanged")
    _warn_slow_zstd(str(report.path))


def _warn_slow_zstd(index: str) -> None:
    """One line per zstd shard that cannot be read at random cheaply, with the command that fixes it."""
    from ..index.reader import IndexReader
    from ..opener import fix_command

    ix = IndexReader(index)
    for i, info in enumerate(ix.shards):
        if info.compression == "zstd" and not info.random_access:
            path = os.path.normpath(ix.shard_path(i))
            click.echo(
                f"tarindex: warning: {path}: zstd frames too large for random access (one frame for the whole shard?); "
                f"TarDataset needs zstd_cache_dir= to read it; fix: '{fix_command(path)}', then build again",
                err=True,
            )
    ix.close()
