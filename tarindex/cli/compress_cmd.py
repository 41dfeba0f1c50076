"""``tarindex compress``."""

from __future__ import annotations

import click

# shard_writer's DEFAULT_LEVEL and DEFAULT_FRAME_SIZE (a test keeps them equal): importing it here would
# import the codecs for every --help
DEFAULT_LEVEL = 3
DEFAULT_FRAME_SIZE = 8 << 10


@click.command("compress")
@click.argument("src", metavar="IN")
@click.argument("dst", metavar="OUT")
@click.option("--level", type=click.IntRange(-7, 22), default=DEFAULT_LEVEL, show_default=True, help="zstd level.")
@click.option(
    "--frame-size",
    type=click.IntRange(1),
    default=DEFAULT_FRAME_SIZE,
    show_default=True,
    metavar="BYTES",
    help="Uncompressed bytes per frame (frames end on the first sample boundary past this).",
)
@click.option("-q", "--quiet", is_flag=True, help="No summary.")
def command(src: str, dst: str, level: int, frame_size: int, quiet: bool) -> None:
    """Rewrite the tar IN (plain, zstd or gzip) as OUT: seekable zstd with sample-aligned frames.

    OUT ends with a seek table (zstd seekable format); 'zstd -d OUT' gives back
    the tar byte for byte. OUT may be IN (recompress in place; rebuild the index after).
    """
    from ..shard_writer import compress_shard

    sizes = compress_shard(src, dst, level=level, frame_size=frame_size)
    if not quiet:
        c = sum(s[0] for s in sizes)
        d = sum(s[1] for s in sizes)
        click.echo(f"{dst}: {len(sizes)} frames, {d} -> {c} bytes ({c / max(d, 1):.1%})")
