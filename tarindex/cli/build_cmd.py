"""``tarindex build``."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import click

from ._common import parsed, size_option


def _part(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[int, int] | None:
    from ..build import parse_part

    return parsed(value, parse_part)


def _pairs(values: tuple[str, ...], sep: str, form: str) -> list[tuple[str, str]]:
    """``NAME<sep>VALUE`` options as (name, value) pairs, both stripped."""
    pairs = []
    for value in values:
        name, found, text = value.partition(sep)
        if not found or not name.strip():
            raise click.BadParameter(f"{value!r}: expected {form}")
        pairs.append((name.strip(), text.strip()))
    return pairs


def _headers(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, str]:
    return dict(_pairs(values, ":", "'NAME: VALUE'"))


def _storage_options(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, Any]:
    import json

    found: dict[str, Any] = {}
    for key, text in _pairs(values, "=", "KEY=VALUE"):
        try:
            found[key] = json.loads(text)
        except ValueError:
            found[key] = text
    return found


@click.command("build")
@click.argument("shards", nargs=-1, required=True)
@click.option("-o", "--index", "index", type=click.Path(dir_okay=False), help="Index file (default: beside the shards).")
@click.option("-w", "--workers", type=click.IntRange(1), default=None, help="Scanning processes (default: CPU count).")
@click.option("--part", callback=_part, metavar="K/N", help="Index only the K-th of N slices of the shards.")
@click.option(
    "--max-member-size", callback=size_option, metavar="SIZE",
    help="Refuse a shard with a member larger than SIZE (bytes, or 64M, 2G: powers of 1024). "
    "Default: 8G for URLs, zstd and gzip shards; a plain tar's own size.",
)
@click.option(
    "-H", "--header", "headers", multiple=True, callback=_headers, metavar="'NAME: VALUE'",
    help="An HTTP(S) request header for URL shards (repeatable), e.g. -H 'Authorization: Bearer ...'. Never stored in the index.",
)
@click.option(
    "--storage-option", "storage_options", multiple=True, callback=_storage_options, metavar="KEY=VALUE",
    help="An object-store or fsspec client option (repeatable), e.g. --storage-option endpoint_url=http://127.0.0.1:9000; "
    "VALUE is read as JSON when it parses (numbers, true/false), else as text. Never stored in the index.",
)
@click.option(
    "--allow-missing-end", is_flag=True,
    help="Accept shards that end without the end-of-archive marker (some writers omit it); "
    "by default that is an error, as a shard cut at a member boundary looks the same.",
)
@click.option(
    "--drop-unlisted", is_flag=True,
    help="Let the build drop shards the existing index holds and SHARDS no longer names (left out, or deleted from disk); "
    "without it such a build is refused, so indexing a subset never replaces the set's index.",
)
@click.option("-p", "--parents", is_flag=True, help="Make the index's directory (-o) when it does not exist; without it, a missing directory is refused.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar or summary.")
def command(
    shards: tuple[str, ...],
    index: str | None,
    workers: int | None,
    part: tuple[int, int] | None,
    max_member_size: int | None,
    headers: dict[str, str],
    storage_options: dict[str, Any],
    allow_missing_end: bool,
    drop_unlisted: bool,
    parents: bool,
    quiet: bool,
) -> None:
    """Index SHARDS (paths, globs, brace patterns) into one LMDB index."""
    from ..build import build_index, part_slice
    from ..errors import counted
    from ..naming import ShardRef
    from ..shards import expand_shards
    from ._common import check_parent, shown_path
    from ._progress import Bar

    if index is not None:
        check_parent(index, parents)
    paths = expand_shards(shards, storage_options=storage_options or None)
    url = next((p for p in paths if not ShardRef.of(p).local), None)
    if index is None and url is not None:  # no directory to put the index beside
        raise click.UsageError(f"{url}: URL shards need an index path: add -o INDEX")
    total = len(paths if part is None else part_slice(paths, part))
    show = not quiet and sys.stderr.isatty()
    with _logged_warnings(), Bar("scanning", total, "shard", show=show) as bar:

        def progress(n: int, nbytes: int) -> None:
            if nbytes:
                bar.advance(n, nbytes)
            else:  # found unchanged: not scanned
                bar.skip(n)
            if bar.done >= total:  # every shard scanned: the index is written next
                bar.relabel("writing index")

        report = build_index(
            paths, index=index, workers=workers, part=part, progress=progress, max_member_size=max_member_size,
            headers=headers, storage_options=storage_options, allow_missing_end=allow_missing_end,
            drop_unlisted=drop_unlisted,
        )  # fmt: skip
    if not quiet:
        click.echo(f"{shown_path(report.path)}: {counted(len(report.scanned), 'shard')} scanned, {len(report.reused)} unchanged")
    _warn_slow_zstd(str(report.path))


@contextlib.contextmanager
def _logged_warnings() -> Iterator[None]:
    """The library's logged warnings (a dropped shard, a skipped sparse member) as ``tarindex: warning:`` lines."""
    import logging  # on use: --help lists this command without it

    logger = logging.getLogger("tarindex")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("\ntarindex: warning: %(message)s" if sys.stderr.isatty() else "tarindex: warning: %(message)s"))
    handler.setLevel(logging.WARNING)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)


def _warn_slow_zstd(index: str) -> None:
    """One line per zstd shard that cannot be read at random cheaply, with the command that fixes it."""
    from .._codecs import ZSTD
    from ..access.codecs import fix_command
    from ..index.reader import IndexReader
    from ._common import shown_path

    ix = IndexReader(index)
    for i, info in enumerate(ix.shards):
        if info.compression == ZSTD.compression and not info.random_access:
            path = shown_path(ix.shard_path(i))
            click.echo(
                f"tarindex: warning: {path}: zstd frames too large for random access (one frame for the whole shard?); "
                f"TarDataset needs zstd_cache_dir= to read it; fix: '{fix_command(path)}', then build again",
                err=True,
            )
    ix.close()
