"""Scanning: a shard (file, stream, zstd) -> its offset tables (:class:`~tarindex.index.format.ShardTable`).

The one place that walks shards for the index: the parser (:mod:`tarindex.tar`) and the grouping
(:mod:`tarindex.grouping`) feed a packer, the codecs (:mod:`tarindex.zstd`) decompress, the sources
(:mod:`tarindex.sources`) deliver bytes. The index package only stores what this module produces.
"""

from __future__ import annotations

import dataclasses
import itertools
import mmap
import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ._source import Source
from .errors import CorruptArchiveError, CorruptFrameError, ShardNotFoundError
from .grouping import Packer, SampleRecord, new_packer, pack_samples
from .index.format import ShardInfo, ShardTable
from .shards import FINGERPRINT_SPAN, fingerprint, fingerprint_stream
from .sources import is_url, open_source
from .tar import Buffer, Entry, index_tar, index_tar_file
from .zstd import (
    MAP_SLICE,
    PIECE_LIMIT,
    SeekTableMismatch,
    by_seek_table,
    check_seek_table,
    close_map,
    decompress_frames,
    frame_array,
    is_zstd,
    iter_decompressed,
    random_access,
    read_seek_table,
)

__all__: list[str] = []  # internal module: its names serve the package, the public API is tarindex.__all__


# -- tables from walks ------------------------------------------------------------


def table_from_chunks(chunks: Iterable[Buffer], path: str) -> ShardTable:
    """Index an archive given as consecutive chunks (see :func:`tarindex.tar.index_tar`).

    Members go straight from the walk into a packer (:func:`tarindex.grouping.new_packer`):
    with the C extension, runs of plain headers are walked and packed in C, one call per chunk.

    Raises:
        CorruptArchiveError: the archive is not valid (from the walk).
        DuplicateMemberError: two members of one sample have the same extension.
    """
    return _walked(path, lambda packer: index_tar(chunks, path, packer))

def table_from_file(fd: int, path: str) -> ShardTable:
    """:func:`table_from_chunks` over an open file, reading headers with ``os.pread`` (see :func:`tarindex.tar.iter_tar_file`).

    Raises:
        CorruptArchiveError: the archive is not valid (from the walk).
        DuplicateMemberError: two members of one sample have the same extension.
    """
    return _walked(path, lambda packer: index_tar_file(fd, path, packer))

def _walked(path: str, walk: Callable[[Packer], None]) -> ShardTable:
    packer = new_packer(path)
    walk(packer)
    return ShardTable.from_columns(packer.finish())

def table_from_entries(entries: Iterable[Entry], path: str) -> ShardTable:
    """Group a shard's :func:`tarindex.tar.iter_tar` entries into samples and pack them.

    Raises:
        DuplicateMemberError: two members of one sample have the same extension.
        CorruptArchiveError: the entries' archive is not valid (from the walk).
    """
    packer = new_packer(path)
    for name, header_offset, offset, size, _ in entries:
        packer.add(name, header_offset, offset, size)
    return ShardTable.from_columns(packer.finish())

def table_from_samples(samples: Iterable[SampleRecord]) -> ShardTable:
    """Pack sample records into arrays."""
    return ShardTable.from_columns(pack_samples(samples))


# -- archives: raw chunks -> tar chunks --------------------------------------------


def iter_archive(chunks: Iterable[Any], url: str, *, frames: list[Any] | None = None) -> Iterator[bytes]:
    """The uncompressed tar stream of a source's chunks: zstd is detected by its first bytes and decompressed.

    ``frames``, when given, receives the frame table of a zstd stream (see
    :func:`tarindex.zstd.iter_decompressed`) and stays empty for a plain tar.

    Raises:
        CorruptArchiveError: bad zstd data.
    """
    chunks = iter(chunks)
    first = next(chunks, None)
    if first is None:
        return
    if is_zstd(bytes(first[:4])):
        yield from iter_decompressed(itertools.chain((first,), chunks), url, frames=frames)
    else:
        yield first
        yield from chunks


def archive(
    source: Source,
    tap: Callable[[Iterator[bytes]], Iterator[bytes]] | None = None,
    *,
    frames: list[Any] | None = None,
    first: bytes = b"",
) -> Iterator[bytes]:
    """A source's uncompressed tar stream (see :func:`iter_archive`), decompressed in its reader thread.

    ``tap`` wraps the raw chunks before decompression (it runs in the reader thread); ``frames``
    collects a zstd stream's frame table; ``first``: bytes already read from the source.
    """
    raw = source.raw(first)
    return source.threaded(iter_archive(tap(raw) if tap is not None else raw, source.url, frames=frames))


# -- shards ------------------------------------------------------------------------


def scan_shard(path: str) -> tuple[ShardInfo, ShardTable]:
    """Scan one shard (plain tar, or zstd by content) into its offset tables (``ShardInfo.path`` is ``path``).

    A URL (``http(s)://``, ``pipe:``, fsspec) is read once, sequentially
    (see :func:`scan_stream`).

    Raises:
        ShardNotFoundError: the shard does not exist.
        CorruptArchiveError: the shard is not a valid tar archive.
        SourceError: a URL could not be read (after retries).
    """
    if is_url(path):
        return scan_stream(path)
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError as exc:
        raise ShardNotFoundError(f"{path}: no such shard") from exc
    try:
        st = os.fstat(fd)
        if st.st_size == 0:
            raise CorruptArchiveError(path, 0, "empty file, not a tar archive")
        table = scan_zstd(fd, path) if is_zstd(os.pread(fd, 4, 0)) else table_from_file(fd, path)
        return shard_info(path, st.st_size, st.st_mtime_ns, fingerprint(fd, st.st_size), table), table
    finally:
        os.close(fd)


def scan_stream(url: str) -> tuple[ShardInfo, ShardTable]:
    """Index a shard in one sequential pass over its stream (HTTP, ``pipe:``, fsspec, zstd or not).

    ``ShardInfo.size`` is the number of bytes read (the whole stream),
    ``mtime_ns`` the ``Last-Modified`` time or 0, and the fingerprint is the
    one :func:`tarindex.shards.fingerprint` gives for the same bytes on disk.

    Raises:
        ShardNotFoundError: the server says the shard does not exist.
        CorruptArchiveError: the stream is not a valid tar archive, or ends early.
        SourceError: the stream could not be read (after retries), or a ``pipe:`` command failed.
    """
    span = FINGERPRINT_SPAN
    head = bytearray()
    tail = b""

    def tapped(source: Iterable[bytes]) -> Iterator[bytes]:
        nonlocal tail
        for chunk in source:
            if len(head) < span:
                head.extend(chunk[: span - len(head)])
            tail = (tail + chunk[-2 * span :])[-2 * span :]
            yield chunk

    rows: list[tuple[int, int, int, int]] = []
    with open_source(url) as source:
        raw = archive(source, tapped, frames=rows)
        table = table_from_chunks(raw, url)
        for _ in raw:  # the rest (end-of-archive padding): the size and fingerprint cover the whole stream
            pass
        size = source.position
    if is_zstd(bytes(head[:4])):  # the frame table, as for a local zstd shard
        table.frames = frame_array(rows)
    info = shard_info(url, size, source.mtime_ns, fingerprint_stream(size, bytes(head), tail), table, etag=source.etag)
    return info, table


def shard_info(path: str, size: int, mtime_ns: int, fp: str, table: ShardTable, *, etag: str | None = None) -> ShardInfo:
    """A scanned shard's record; a zstd shard (one with a frame table) says so, and whether random access is cheap."""
    info = ShardInfo(path, size, mtime_ns, fp, table.n_samples, table.n_members, etag=etag)
    if table.frames is not None:
        info = dataclasses.replace(info, compression="zstd", random_access=random_access(table.frames))
    return info


def scan_zstd(fd: int, path: str) -> ShardTable:
    """Index a zstd shard: one streaming decompression, the tar parser on its output, the frame table.

    With a seek table (seekable format) whose frames are at most 4 MiB, the
    frames are decompressed where the table puts them, one call each, and
    every size is checked; any disagreement, and any file without such a
    table, is indexed by walking the frames' headers, which also names the
    frame at fault.

    Raises:
        CorruptFrameError: corrupt or truncated zstd data, or a seek table that
            disagrees with the frames (compressed offsets).
        CorruptArchiveError: a decompressed stream that is not a valid tar.
    """
    buf = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    try:
        if hasattr(mmap, "MADV_SEQUENTIAL"):
            buf.madvise(mmap.MADV_SEQUENTIAL)
        seek = read_seek_table(buf, path)
        mv = memoryview(buf)
        rows: list[tuple[int, int, int, int]] = []
        table = None
        if seek is not None and len(seek) and int(seek[:, 1].max()) <= PIECE_LIMIT:
            try:
                table = _scan_chunks(by_seek_table(mv, seek, rows), path)
            except SeekTableMismatch:
                rows.clear()
        if table is None:
            pieces = (mv[i : i + MAP_SLICE] for i in range(0, len(mv), MAP_SLICE))
            table = _scan_chunks(decompress_frames(pieces, path, rows, hold=False), path)
            del pieces
        mv.release()
    finally:
        close_map(buf)
    frames = frame_array(rows)
    if seek is not None:
        check_seek_table(frames, seek, path)
    table.frames = frames
    return table


def _scan_chunks(chunks: Iterator[bytes], path: str) -> ShardTable:
    """The tar parser over decompressed pieces; the pieces after the end-of-archive marker are drained too.

    Raises:
        CorruptFrameError: damaged zstd data (compressed offset).
        CorruptArchiveError: the decompressed stream is not a valid tar (the
            message says the offset is in the decompressed tar).
    """
    try:
        table = table_from_chunks(chunks, path)
    except CorruptFrameError:
        raise
    except CorruptArchiveError as exc:
        raise type(exc)(path, exc.offset, f"{exc.what} (in the decompressed tar)") from exc
    for _ in chunks:  # the frames after the end-of-archive marker
        pass
    return table
