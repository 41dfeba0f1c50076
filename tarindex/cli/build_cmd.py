"""``tarindex build``."""

from __future__ import annotations

import sys

import click

from ..build import build_index


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
    from ..shards import expand_shards

    paths = expand_shards(shards)
    total = len(paths) if part is None else len(paths[(part[0] - 1) * len(paths) // part[1] : part[0] * len(paths) // part[1]])
    show = not quiet and sys.stderr.isatty()
    with click.progressbar(length=total, label="indexing", file=sys.stderr, hidden=not show) as bar:
        report = build_index(paths, index=index, workers=workers, part=part, progress=bar.update)
    if not quiet:
        click.echo(f"{report.path}: {len(report.scanned)} shards scanned, {len(report.reused)} unchanged")
