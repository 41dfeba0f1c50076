"""Scanning: a shard (file, stream, zstd) -> its offset tables (:class:`~tarindex.tables.ShardTable`).

The one place that walks shards for the index: the parser (:mod:`tarindex.tar`) and the grouping
(:mod:`tarindex.grouping`) feed a packer, the codecs (:mod:`tarindex.zstd`) decompress, the sources
(:mod:`tarindex.sources`) deliver bytes. The index package only stores what this module produces.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ._codecs import GZIP, HEAD_BYTES, TAR, ZSTD, Codec, of_head, sniffed
from ._localreads import block_chunks, slow_storage
from ._sourcebase import Source
from .compression import ArchiveEnd
from .errors import (
    CorruptArchiveError,
    CorruptDeflateError,
    CorruptFrameError,
    DecompressionLimitError,
    IndexFormatError,
    ShardNotFoundError,
)
from .grouping import Packer, new_packer
from .gzip_random import decompress_indexed
from .naming import ShardRef
from .options import SourceOptions
from .shards import FINGERPRINT_SPAN, fingerprint, fingerprint_stream
from .sources import open_regular, open_source
from .tables import MAX_EXTS, ShardInfo, ShardTable
from .tar import Buffer, Entry, index_tar, index_tar_file
from .zstd import (
    MAP_SLICE,
    PIECE_LIMIT,
    SeekTableMismatch,
    by_seek_table,
    check_seek_table,
    decompress_frames,
    frame_array,
    random_access,
    read_seek_table,
)

__all__: list[str] = []  # internal module: its names serve the package, the public API is tarindex.__all__


# -- tables from walks ------------------------------------------------------------


def table_from_chunks(
    chunks: Iterable[Buffer], path: str, *, max_member_size: int | None = None, allow_missing_end: bool = False
) -> ShardTable:
    """Index an archive given as consecutive chunks (see :func:`tarindex.tar.index_tar`).

    Members go straight from the walk into a packer (:func:`tarindex.grouping.new_packer`):
    with the C extension, runs of plain headers are walked and packed in C, one call per chunk.
    A member over ``max_member_size`` (default :data:`tarindex.tar.MAX_MEMBER_SIZE`) is an error, and so is
    an archive without its end-of-archive marker unless ``allow_missing_end``.

    Raises:
        CorruptArchiveError: the archive is not valid (from the walk).
        DuplicateMemberError: two members of one sample have the same extension.
    """
    return _walked(
        path, lambda packer: index_tar(chunks, path, packer, max_member_size=max_member_size, allow_missing_end=allow_missing_end)
    )

def table_from_file(fd: int, path: str, *, max_member_size: int | None = None, allow_missing_end: bool = False) -> ShardTable:
    """:func:`table_from_chunks` over an open file, reading headers with ``os.pread`` (see :func:`tarindex.tar.iter_tar_file`);
    members must fit in the file, and with ``max_member_size`` be at most that.

    Raises:
        CorruptArchiveError: the archive is not valid (from the walk).
        DuplicateMemberError: two members of one sample have the same extension.
    """
    return _walked(
        path, lambda packer: index_tar_file(fd, path, packer, max_member_size=max_member_size, allow_missing_end=allow_missing_end)
    )

def _walked(path: str, walk: Callable[[Packer], None]) -> ShardTable:
    packer = new_packer(path)
    try:
        walk(packer)
        columns = packer.finish()
    except OverflowError as exc:  # the C packer, at a 65,537th distinct extension (it numbers them in 16 bits)
        raise _too_many_exts(path) from exc
    if len(columns[7]) > MAX_EXTS:  # the reference packer numbers them all
        raise _too_many_exts(path)
    return ShardTable.from_columns(columns)


def _too_many_exts(path: str) -> IndexFormatError:
    return IndexFormatError(f"{path}: more than {MAX_EXTS:,} distinct extensions in one shard; an index holds at most {MAX_EXTS:,}")

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


# -- archives: raw chunks -> tar chunks --------------------------------------------


def iter_archive(
    chunks: Iterable[Any],
    url: str,
    *,
    frames: list[Any] | None = None,
    end: ArchiveEnd | None = None,
    points: list[bytes] | None = None,
) -> Iterator[bytes]:
    """The uncompressed tar stream of a source's chunks: the codec registry names the codec by the first
    bytes (:func:`tarindex._codecs.of_head`) and its row's stream walk decompresses.

    ``frames``, when given, receives the frame table of a zstd stream (see
    :func:`tarindex.zstd.iter_decompressed`) and stays empty for a plain tar; ``points``, when given,
    receives a gzip stream's seek-point table (:func:`tarindex.gzip_random.decompress_indexed`). ``end``, set by the
    consumer once the tar has ended, stops decompression after the padding (the rest is read).

    Raises:
        CorruptArchiveError: bad compressed data.
        UnsupportedCompressionError: bzip2, xz, lz4 or Unix compress.
        DecompressionLimitError: the output exceeds the bounds.
    """
    chunks = iter(chunks)
    first = next(chunks, None)
    if first is None:
        return
    while len(first) < HEAD_BYTES:  # enough bytes to tell every format apart
        more = next(chunks, None)
        if more is None:
            break
        first = bytes(first) + bytes(more)
    codec = of_head(bytes(first[:HEAD_BYTES]), url)
    rest = itertools.chain((first,), chunks)
    yield from rest if codec.walk is None else codec.walk(rest, url, frames, points, end)


def archive(
    source: Source,
    tap: Callable[[Iterator[bytes]], Iterator[bytes]] | None = None,
    *,
    frames: list[Any] | None = None,
    first: bytes = b"",
    end: ArchiveEnd | None = None,
    points: list[bytes] | None = None,
) -> Iterator[bytes]:
    """A source's uncompressed tar stream (see :func:`iter_archive`), decompressed in its reader thread.

    ``tap`` wraps the raw chunks before decompression (it runs in the reader thread); ``frames``
    collects a zstd stream's frame table, ``points`` a gzip stream's seek points; ``first``: bytes already read from the source; ``end``:
    set it once the tar has ended, so that draining the rest decompresses only the padding.
    """
    raw = source.raw(first)
    return source.threaded(iter_archive(tap(raw) if tap is not None else raw, source.url, frames=frames, end=end, points=points))


# -- shards ------------------------------------------------------------------------


def scan_shard(
    path: str, *, max_member_size: int | None = None, options: SourceOptions | None = None, allow_missing_end: bool = False
) -> tuple[ShardInfo, ShardTable]:
    """Scan one shard (plain tar, or zstd by content) into its offset tables (``ShardInfo.path`` is ``path``).

    A URL (``http(s)://``, ``pipe:``, fsspec) is read once, sequentially
    (see :func:`scan_sequential`). A member over ``max_member_size`` is an error (default: 8 GiB,
    :data:`tarindex.tar.MAX_MEMBER_SIZE`, for a stream or a decompressed shard; for a plain
    local file, only its own size). ``options`` (headers, storage options, retries) apply to URLs.
    ``allow_missing_end``: the archive may end without its end-of-archive marker.

    Raises:
        ShardNotFoundError: the shard does not exist.
        CorruptArchiveError: the shard is not a valid tar archive, or has a member over ``max_member_size``.
        SourceError: a URL could not be read (after retries).
    """
    if not ShardRef.of(path).local:
        return scan_sequential(path, max_member_size=max_member_size, options=options, allow_missing_end=allow_missing_end)
    try:
        fd, st = open_regular(path)  # a FIFO is refused, not waited on
    except FileNotFoundError as exc:
        raise ShardNotFoundError(f"{path}: no such shard") from exc
    try:
        if st.st_size == 0:
            raise CorruptArchiveError(path, 0, "empty file, not a tar archive")
        codec = of_head(os.pread(fd, HEAD_BYTES, 0), path)
        table, partial = LOCAL_SCANS[codec](fd, path, max_member_size, allow_missing_end, options)
        info = shard_info(path, st.st_size, st.st_mtime_ns, fingerprint(fd, st.st_size), table, codec)
        return (dataclasses.replace(info, random_access=False) if partial else info), table
    finally:
        os.close(fd)


def scan_sequential(
    url: str, *, max_member_size: int | None = None, options: SourceOptions | None = None, allow_missing_end: bool = False
) -> tuple[ShardInfo, ShardTable]:
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
    points: list[bytes] = []
    end = ArchiveEnd()
    with open_source(url, options=options) as source:
        raw = archive(source, tapped, frames=rows, end=end, points=points)
        table = table_from_chunks(raw, url, max_member_size=max_member_size, allow_missing_end=allow_missing_end)
        end.set()
        for _ in raw:  # the rest (end-of-archive padding), read but not decompressed past Limits.padding:
            pass  # the size and fingerprint cover the whole stream
        size = source.position
    codec = sniffed(bytes(head[:HEAD_BYTES]))
    if codec.frame_table:  # the frame table, as for a local zstd shard
        table.frames = frame_array(rows)
    table.gzip_points = points[0] if points else None
    info = shard_info(url, size, source.mtime_ns, fingerprint_stream(size, bytes(head), tail), table, codec, etag=source.etag)
    return (dataclasses.replace(info, random_access=False) if end.partial else info), table


def shard_info(
    path: str, size: int, mtime_ns: int, fp: str, table: ShardTable, codec: Codec = TAR, *, etag: str | None = None
) -> ShardInfo:
    """A scanned shard's record; a compressed shard names its codec and says whether random access is cheap:
    a zstd shard by its frame table, a gzip shard by its seek points."""
    info = ShardInfo(path, size, mtime_ns, fp, table.n_samples, table.n_members, etag=etag)
    if not codec.compressed:
        return info
    cheap = random_access(table.frames) if table.frames is not None else table.gzip_points is not None
    return dataclasses.replace(info, compression=codec.compression, random_access=cheap)


def scan_zstd(fd: int, path: str, *, max_member_size: int | None = None) -> ShardTable:
    """Index a zstd shard: one streaming decompression, the tar parser on its output, the frame table.

    With a seek table (seekable format) whose frames are at most 4 MiB, the
    frames are decompressed where the table puts them, one call each, and
    every size is checked; any disagreement, and any file without such a
    table, is indexed by walking the frames' headers, which also names the
    frame at fault.

    After the end-of-archive marker only :attr:`tarindex.compression.Limits.padding` bytes are
    decompressed; the frames after that are walked by their headers and get no rows.

    Raises:
        CorruptFrameError: corrupt or truncated zstd data, or a seek table that
            disagrees with the frames (compressed offsets).
        CorruptArchiveError: a decompressed stream that is not a valid tar.
        DecompressionLimitError: the output exceeds the expansion ratio.
    """
    return _scan_zstd(fd, path, max_member_size)[0]


def _scan_zstd(fd: int, path: str, max_member_size: int | None = None, allow_missing_end: bool = False) -> tuple[ShardTable, bool]:
    """:func:`scan_zstd`, and whether the walk stopped inside a frame (whose row is then incomplete)."""
    end = ArchiveEnd()
    buf = _FileBytes(fd, path)
    seek = read_seek_table(buf, path)
    rows: list[tuple[int, int, int, int]] = []
    table = None
    if seek is not None and len(seek) and int(seek[:, 1].max()) <= PIECE_LIMIT:
        try:
            table = _scan_chunks(by_seek_table(buf, seek, rows, path, end), path, end, max_member_size, allow_missing_end)
        except SeekTableMismatch:
            rows.clear()
            end = ArchiveEnd()
    if table is None:
        pieces = (buf[i : i + _WINDOW] for i in range(0, len(buf), _WINDOW))
        table = _scan_chunks(decompress_frames(pieces, path, rows, hold=False, end=end), path, end, max_member_size, allow_missing_end)
    frames = frame_array(rows)
    if seek is not None:
        check_seek_table(frames[:-1] if end.partial else frames, seek, path, prefix=end.skipped)
    table.frames = frames
    return table, end.partial


_WINDOW = 256 << 10
"""Bytes of a zstd shard read at a time by the scan: a window stays in cache while it is decompressed (16 MiB
windows, copied to memory and read back, cost 1.4x as much; docs/performance.md has the figures)."""


class _FileBytes:
    """A local shard's bytes, sliced as a map is but read with ``pread`` in windows of ``_WINDOW`` bytes or
    the slice asked (slices are views of a window's ``bytes``, which stay valid after the next window is
    read). A map would kill the process (``SIGBUS``) when the shard is truncated while it is scanned; here
    that is a short read, a :class:`~tarindex.errors.CorruptFrameError` naming the shard and the offset."""

    def __init__(self, fd: int, path: str) -> None:
        self.fd, self.path = fd, path
        self.size = os.fstat(fd).st_size
        self.at, self.window = 0, memoryview(b"")
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)  # read ahead, as the map was told

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, key: slice) -> memoryview:
        start, stop = max(key.start or 0, 0), min(self.size if key.stop is None else key.stop, self.size)
        if stop <= start:
            return memoryview(b"")
        if not (self.at <= start and stop <= self.at + len(self.window)):
            want = min(max(stop - start, _WINDOW), self.size - start)
            data = os.pread(self.fd, want, start)
            if len(data) != want:
                what = f"the shard was truncated while it was read ({self.size} bytes when its scan began)"
                raise CorruptFrameError(self.path, start + len(data), what)
            self.at, self.window = start, memoryview(data)
        return self.window[start - self.at : stop - self.at]


def _scan_plain(
    fd: int, path: str, max_member_size: int | None, allow_missing_end: bool, options: SourceOptions | None
) -> tuple[ShardTable, bool]:
    """Index a plain local tar: headers read with ``pread``, or on slow storage (NFS, FUSE, ...) blocks read
    ahead and the walk over them in memory (:mod:`tarindex._localreads`)."""
    if slow_storage(fd):
        chunks = block_chunks(fd, os.fstat(fd).st_size, block=(options or SourceOptions()).block_size)
        return table_from_chunks(chunks, path, max_member_size=max_member_size, allow_missing_end=allow_missing_end), False
    return table_from_file(fd, path, max_member_size=max_member_size, allow_missing_end=allow_missing_end), False


def _scan_zstd_local(
    fd: int, path: str, max_member_size: int | None, allow_missing_end: bool, options: SourceOptions | None
) -> tuple[ShardTable, bool]:
    return _scan_zstd(fd, path, max_member_size, allow_missing_end)


def _scan_gzip_local(
    fd: int, path: str, max_member_size: int | None, allow_missing_end: bool, options: SourceOptions | None
) -> tuple[ShardTable, bool]:
    return _scan_gzip(fd, path, max_member_size, allow_missing_end), False


def _scan_gzip(fd: int, path: str, max_member_size: int | None = None, allow_missing_end: bool = False) -> ShardTable:
    """Index a gzip shard: one streaming decompression (1 MiB reads) that records seek points
    (:func:`tarindex.gzip_random.decompress_indexed`), the tar parser on its output.

    Raises:
        CorruptDeflateError: damaged gzip data (compressed offset).
        CorruptArchiveError: a decompressed stream that is not a valid tar.
        DecompressionLimitError: the output exceeds the expansion ratio.
    """
    end = ArchiveEnd()
    reads = (os.pread(fd, MAP_SLICE // 16, off) for off in range(0, os.fstat(fd).st_size, MAP_SLICE // 16))
    points: list[bytes] = []
    table = _scan_chunks(decompress_indexed(reads, path, points, end=end), path, end, max_member_size, allow_missing_end)
    table.gzip_points = points[0]
    return table


def _scan_chunks(
    chunks: Iterator[bytes], path: str, end: ArchiveEnd, max_member_size: int | None = None, allow_missing_end: bool = False
) -> ShardTable:
    """The tar parser over decompressed pieces; the input after the end-of-archive marker is drained
    too (``end`` set: only the padding is decompressed, the rest read).

    Raises:
        CorruptFrameError: damaged zstd data (compressed offset).
        CorruptArchiveError: the decompressed stream is not a valid tar (the
            message says the offset is in the decompressed tar).
    """
    try:
        table = table_from_chunks(chunks, path, max_member_size=max_member_size, allow_missing_end=allow_missing_end)
    except (CorruptFrameError, CorruptDeflateError, DecompressionLimitError):  # offsets in the compressed file
        raise
    except CorruptArchiveError as exc:
        raise type(exc)(path, exc.offset, f"{exc.what} (in the decompressed tar)") from exc
    end.set()
    for _ in chunks:  # the frames after the end-of-archive marker
        pass
    return table


LocalScan = Callable[[int, str, "int | None", bool, "SourceOptions | None"], tuple[ShardTable, bool]]
"""``(fd, path, max_member_size, allow_missing_end, options)`` -> the shard's table, and whether the walk
stopped inside a frame (its row then incomplete: random access refused)."""

LOCAL_SCANS: dict[Codec, LocalScan] = {TAR: _scan_plain, ZSTD: _scan_zstd_local, GZIP: _scan_gzip_local}
"""The index scan of a local file, per row of the codec registry (:mod:`tarindex._codecs`)."""
