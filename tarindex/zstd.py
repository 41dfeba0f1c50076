"""zstd shards: magic detection, frame walking, seek tables, streaming and random-access decompression.

A zstd file is a sequence of frames. A *data frame* starts with the magic
``28 B5 2F FD`` and holds blocks (3-byte headers give each block's compressed
size), so its compressed extent is found by reading headers only. A
*skippable frame* starts with ``0x184D2A5?`` and a 4-byte length; ``pzstd``
puts one before every data frame, and the seekable format
(facebook/zstd ``contrib/seekable_format``) keeps its seek table in a trailing
one, whose last 4 bytes are ``0x8F92EAB1``.

The *frame table* of a shard is a ``uint64`` array of shape ``(n_frames, 4)``:
compressed offset, compressed size, decompressed offset, decompressed size
of each data frame. Indexing records it; :mod:`tarindex.zstd_random` reads any
decompressed byte range through it.

No frame header is trusted: a declared content size must match what the frame's
blocks decompress to (a declared size of 0 with data after it is a
:class:`~tarindex.errors.CorruptFrameError`, not an empty frame), and content
checksums are verified wherever a frame has one.
"""

from __future__ import annotations

import mmap
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import zstandard

from .compression import ArchiveEnd, Budget
from .errors import CorruptFrameError, counted

__all__ = ["iter_decompressed"]  # public: streaming decompression; the rest serves the package

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
"""The first four bytes of a zstd data frame."""
_ZSTD_MAGIC_INT = 0xFD2FB528
_SKIPPABLE_MASK = 0xFFFFFFF0
_SKIPPABLE_BASE = 0x184D2A50
_SEEK_TABLE_SKIPPABLE = 0x184D2A5E
SEEKABLE_MAGIC = 0x8F92EAB1
"""Last four bytes (little-endian) of a seekable-format seek table."""
_FOOTER = 9
_BLOCK_MAX = 128 << 10
MAX_FRAME_BYTES = 1 << 30
"""Largest decompressed frame the seekable format allows (and our writer makes)."""
RANDOM_ACCESS_FRAME_LIMIT = 16 << 20
"""Shards whose largest frame decompresses to more than this are not read at random."""
FRAME_FIELDS = ("c_offset", "c_size", "d_offset", "d_size")
"""Columns of a frame table."""

_PIECE_BLOCKS = 32  # blocks per scanner piece (4 MiB of output at most)
PIECE_LIMIT = _PIECE_BLOCKS * (128 << 10)  # the most one scanner piece decompresses to
MAP_SLICE = 16 << 20  # compressed bytes handed to the scanner at a time when indexing a file
_HOLD_BYTES = 32 << 20  # a frame's output is held back until its end is verified, up to this much
_OUT_PIECE = 1 << 20  # decompressed bytes per read of a frame that arrives in several pieces

# scanner states
_MAGIC, _SKIP_SIZE, _FHD, _FHD_REST, _BLOCK, _CHECKSUM = range(6)
# scanner events
PIECE, END, SKIPPED = range(3)
_WANT = {_MAGIC: 4, _SKIP_SIZE: 4, _FHD: 1, _BLOCK: 3, _CHECKSUM: 4}


def is_zstd(head: bytes) -> bool:
    """Whether ``head`` (the first bytes of a file) starts a zstd stream: a data or skippable frame."""
    if len(head) < 4:
        return False
    magic = int.from_bytes(head[:4], "little")
    return magic == _ZSTD_MAGIC_INT or (magic & _SKIPPABLE_MASK) == _SKIPPABLE_BASE


class _Scanner:
    """Walk a zstd stream incrementally by its headers, without decompressing.

    ``feed(chunk)`` returns events: ``(PIECE, frame_offset, bytes_like)`` for
    consecutive byte ranges of a data frame (at most ``_PIECE_BLOCKS`` blocks
    each, magic and headers included), ``(END, frame_offset, compressed_size)``
    when a data frame is complete and ``(SKIPPED, frame_offset, size)`` for a
    skippable frame. ``finish()`` checks that the stream did not stop mid-frame.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.pos = 0  # absolute offset of the next byte to consume
        self.state = _MAGIC
        self.want = 4
        self.hdr = b""
        self.skip = 0  # payload bytes to pass before ``after``
        self.after = _MAGIC
        self.frame_off = 0
        self.in_data = False
        self.checksum = False
        self.blocks = 0

    def _error(self, what: str, offset: int | None = None) -> CorruptFrameError:
        return CorruptFrameError(self.path, self.frame_off if offset is None else offset, what)

    def feed(self, chunk: Any) -> list[tuple[int, int, Any]]:
        mv = memoryview(chunk)
        n = len(mv)
        base = self.pos
        events: list[tuple[int, int, Any]] = []
        i = 0
        seg = 0  # start of the current data piece within this chunk
        while True:
            if self.skip:
                take = min(self.skip, n - i)
                i += take
                self.skip -= take
                if self.skip:
                    break
                seg = self._after_skip(events, mv, seg, i, base)
                continue
            if i >= n:
                break
            # gather ``want`` header bytes
            if not self.hdr and i + self.want <= n:
                head = mv[i : i + self.want].tobytes()
                i += self.want
            else:
                take = min(self.want - len(self.hdr), n - i)
                self.hdr += mv[i : i + take].tobytes()
                i += take
                if len(self.hdr) < self.want:
                    break
                head, self.hdr = self.hdr, b""
            seg = self._header(head, events, mv, seg, i, base)
        if self.in_data and i > seg:
            events.append((PIECE, self.frame_off, mv[seg:i]))
        self.pos = base + n
        return events

    def _enter(self, state: int) -> None:
        self.state = state
        self.want = _WANT.get(state, self.want)

    def _after_skip(self, events: list[tuple[int, int, Any]], mv: memoryview, seg: int, i: int, base: int) -> int:
        """A block's payload or a skippable frame's body has been passed."""
        if not self.in_data:
            events.append((SKIPPED, self.frame_off, base + i - self.frame_off))
            self._enter(_MAGIC)
            return seg
        self._enter(self.after)
        if self.after == _MAGIC:
            return self._end(events, mv, seg, i, base)
        if self.blocks >= _PIECE_BLOCKS:
            events.append((PIECE, self.frame_off, mv[seg:i]))
            self.blocks = 0
            return i
        return seg

    def _end(self, events: list[tuple[int, int, Any]], mv: memoryview, seg: int, i: int, base: int) -> int:
        if i > seg:
            events.append((PIECE, self.frame_off, mv[seg:i]))
        events.append((END, self.frame_off, base + i - self.frame_off))
        self.in_data = False
        return i

    def _header(self, head: bytes, events: list[tuple[int, int, Any]], mv: memoryview, seg: int, i: int, base: int) -> int:
        """Act on one complete header; return the (possibly new) piece start."""
        state = self.state
        if state == _MAGIC:
            self.frame_off = base + i - 4
            magic = int.from_bytes(head, "little")
            if magic == _ZSTD_MAGIC_INT:
                self.in_data, self.blocks = True, 0
                if i >= 4:
                    seg = i - 4
                else:  # the magic straddled the previous chunk
                    events.append((PIECE, self.frame_off, ZSTD_MAGIC))
                    seg = i
                self._enter(_FHD)
            elif (magic & _SKIPPABLE_MASK) == _SKIPPABLE_BASE:
                self._enter(_SKIP_SIZE)
            else:
                raise self._error(f"not a zstd frame (magic {head.hex()})")
        elif state == _SKIP_SIZE:
            self.skip = int.from_bytes(head, "little")
            if not self.skip:
                seg = self._after_skip(events, mv, seg, i, base)
        elif state == _FHD:
            d = head[0]
            if d & 0x08:
                raise self._error("bad zstd frame header (reserved bit set)")
            single = bool(d & 0x20)
            self.checksum = bool(d & 0x04)
            rest = (0 if single else 1) + (0, 1, 2, 4)[d & 3] + ((1 if single else 0), 2, 4, 8)[d >> 6]
            if rest:
                self.state, self.want = _FHD_REST, rest
            else:
                self._enter(_BLOCK)
        elif state == _FHD_REST:
            self._enter(_BLOCK)
        elif state == _BLOCK:
            v = int.from_bytes(head, "little")
            btype, bsize = (v >> 1) & 3, v >> 3
            if btype == 3:
                raise self._error(f"corrupt zstd frame (reserved block type at offset {base + i - 3})")
            if bsize > _BLOCK_MAX:
                raise self._error(f"corrupt zstd frame (block of {bsize} bytes at offset {base + i - 3})")
            self.skip = 1 if btype == 1 else bsize
            self.blocks += 1
            self.after = _BLOCK if not v & 1 else (_CHECKSUM if self.checksum else _MAGIC)
            if not self.skip:
                seg = self._after_skip(events, mv, seg, i, base)
        elif state == _CHECKSUM:
            self._enter(_MAGIC)
            seg = self._end(events, mv, seg, i, base)
        return seg

    def finish(self) -> None:
        """Raise if the stream ended inside a frame."""
        if self.state != _MAGIC or self.hdr or self.skip:
            raise self._error(f"truncated zstd frame (stream ends at {self.pos})")


class _Events:
    """The scanner's events over ``chunks``, pulled one at a time, with one event of lookahead."""

    def __init__(self, chunks: Iterable[Any], path: str) -> None:
        self._chunks = iter(chunks)
        self._scanner = _Scanner(path)
        self._queue: deque[tuple[int, int, Any]] = deque()

    def peek(self) -> tuple[int, int, Any] | None:
        queue = self._queue
        while not queue:
            chunk = next(self._chunks, None)
            if chunk is None:
                self._scanner.finish()  # raises if the input ended inside a frame
                return None
            queue.extend(self._scanner.feed(chunk))
        return queue[0]

    def pop(self) -> tuple[int, int, Any] | None:
        event = self.peek()
        if event is not None:
            self._queue.popleft()
        return event

    @property
    def position(self) -> int:
        """Compressed bytes read so far."""
        return self._scanner.pos

    def pass_over(self) -> None:
        """Walk the rest of the input by its headers, decompressing nothing (structure still checked).

        Raises:
            CorruptFrameError: the rest is not zstd, or ends inside a frame.
        """
        while self.pop() is not None:
            pass


class _FrameSource:
    """A file-like ``read`` over the pieces of the current data frame, for ``stream_reader``."""

    def __init__(self, events: _Events, piece: Any) -> None:
        self._events = events
        self._piece = piece
        self.ended: tuple[int, int] | None = None  # (frame offset, compressed size) once the frame's END is seen

    def read(self, n: int = -1) -> Any:
        while not len(self._piece):
            if self.ended is not None:
                return b""
            event = self._events.pop()
            if event is None:
                return b""
            kind, off, value = event
            if kind == PIECE:
                self._piece = value
            elif kind == END:
                self.ended = (off, value)
        piece = self._piece
        if n < 0 or n >= len(piece):
            self._piece = b""
            return piece
        self._piece = piece[n:]
        return piece[:n]


def _whole_frame(dctx: Any, piece: Any, path: str, off: int) -> bytes:
    """Decompress a complete frame given as one piece (at most ``_PIECE_BLOCKS`` blocks)."""
    try:
        size = zstandard.frame_content_size(piece)
        if size > _PIECE_BLOCKS * _BLOCK_MAX:
            raise CorruptFrameError(path, off, f"corrupt zstd frame (header says {size} bytes, its blocks hold less)")
        if size == 0:  # python-zstandard returns b"" for a declared size of 0 without decoding: stream it
            return _checked_empty(dctx, piece, path, off)
        return bytes(dctx.decompress(piece, max_output_size=_PIECE_BLOCKS * _BLOCK_MAX))
    except zstandard.ZstdError as exc:
        raise CorruptFrameError(path, off, f"corrupt zstd frame ({exc})") from exc


def _checked_empty(dctx: Any, frame: Any, path: str, off: int) -> bytes:
    """A frame whose header declares 0 bytes, decoded block by block (its checksum verified): ``b""``, or an error.

    Raises:
        zstandard.ZstdError: the frame's blocks hold data (libzstd: "Src size is incorrect").
        CorruptFrameError: the frame decodes to data without libzstd objecting.
    """
    out = dctx.decompressobj().decompress(bytes(frame))
    if out:
        raise CorruptFrameError(path, off, f"zstd frame header says 0 bytes, its blocks hold {len(out)}")
    return b""


def decompress_frame(dctx: Any, frame: Any, d_size: int, path: str, off: int) -> bytes:
    """Decompress one whole frame that must hold exactly ``d_size`` bytes (a frame table's row).

    The header's content size is checked first (a damaged header never sizes an allocation), a
    declared size of 0 is decoded to prove it, and the checksum, when present, is verified.

    Raises:
        CorruptFrameError: the header disagrees with ``d_size``, the frame is corrupt, or it
            decompresses to another size, naming ``path`` and the frame's compressed offset.
    """
    try:
        declared = zstandard.frame_content_size(frame)
        if declared not in (-1, d_size):  # never allocate what a damaged header claims
            raise CorruptFrameError(path, off, f"zstd frame header disagrees with the index ({d_size} bytes)")
        if declared == 0:
            data = _checked_empty(dctx, frame, path, off)
        else:
            data = dctx.decompress(frame, max_output_size=d_size)
    except zstandard.ZstdError as exc:
        raise CorruptFrameError(path, off, f"corrupt zstd frame ({exc})") from exc
    if len(data) != d_size:
        raise CorruptFrameError(path, off, f"zstd frame decompresses to {len(data)} bytes, the index says {d_size}")
    return data


def decompress_frames(
    chunks: Iterable[Any],
    path: str,
    frames: list[tuple[int, int, int, int]] | None = None,
    *,
    hold: bool = True,
    end: ArchiveEnd | None = None,
) -> Iterator[bytes]:
    """Decompress a zstd stream, frame by frame; append each frame's table row to ``frames``.

    Each data frame gets a fresh decompressor, so a damaged frame is named by
    its own compressed offset. With ``hold``, the output of frames up to 32 MiB
    is held back until the frame's end (and content checksum, when present) is
    verified, so nothing from a damaged frame is returned; larger frames
    stream. Without it (indexing, where any error discards everything) output
    flows at once, which keeps memory hot. Output pieces are at most 4 MiB.

    The output is bounded (:class:`tarindex.compression.Limits`): an expansion ratio, and, once the
    consumer sets ``end`` (it saw the end-of-archive marker), the padding still decompressed; the
    rest of the input is then walked by its headers, not decompressed, and gets no table rows.

    Raises:
        CorruptFrameError: a corrupt or truncated frame, or bytes that are not zstd.
        DecompressionLimitError: the output exceeds the expansion ratio.
    """
    dctx = zstandard.ZstdDecompressor()
    events = _Events(chunks, path)
    budget = Budget(path, end)
    d_off = 0
    hold_limit = _HOLD_BYTES if hold else 0
    while True:
        event = events.pop()
        if event is None:
            return
        kind, off, value = event
        if kind != PIECE:
            continue  # skippable frames (an END always follows a PIECE of its frame)
        if budget.padding_done():  # past the end of the archive: read the rest, decompress none of it
            events.pass_over()
            return
        after = events.peek()
        if after is not None and after[0] == END:  # the whole frame in one piece: one call
            events.pop()
            out = _whole_frame(dctx, value, path, off)
            budget.spend(len(out), events.position)
            if frames is not None:
                frames.append((off, after[2], d_off, len(out)))
            d_off += len(out)
            if out:
                yield out
            continue
        source = _FrameSource(events, value)
        reader = dctx.stream_reader(source, read_size=_OUT_PIECE, read_across_frames=False)  # type: ignore[arg-type]  # any object with read()
        held: list[bytes] = []
        held_bytes = d_frame = 0
        try:
            while True:
                out = reader.read(_OUT_PIECE)
                if not out:
                    break
                d_frame += len(out)
                budget.spend(len(out), events.position)
                held.append(out)
                held_bytes += len(out)
                if held_bytes > hold_limit:
                    yield from held
                    held, held_bytes = [], 0
                if budget.padding_done():  # the frame goes on past the padding: stop decompressing it
                    yield from held
                    while source.read(_OUT_PIECE):  # the rest of its blocks, by their headers
                        pass
                    if source.ended is not None and frames is not None:
                        frames.append((off, source.ended[1], d_off, d_frame))
                    end.partial = True  # type: ignore[union-attr]  # padding_done() implies an end
                    events.pass_over()
                    return
        except zstandard.ZstdError as exc:
            raise CorruptFrameError(path, off, f"corrupt zstd frame ({exc})") from exc
        if source.ended is None and source.read(1):  # the decompressor stopped before the blocks did
            raise CorruptFrameError(path, off, "corrupt zstd frame (data ends before its blocks do)")
        if source.ended is None:  # the input ended inside the frame
            events.peek()  # raises the scanner's truncation error
            raise CorruptFrameError(path, off, "truncated zstd frame")
        if frames is not None:
            frames.append((off, source.ended[1], d_off, d_frame))
        d_off += d_frame
        yield from held


def iter_decompressed(
    chunks: Iterable[Any], path: str, *, frames: list[tuple[int, int, int, int]] | None = None
) -> Iterator[bytes]:
    """Decompress a zstd stream given as consecutive compressed pieces (any sizes).

    The pieces are bytes-like objects that stay unchanged once handed over
    (``bytes``, or slices of a map); a reused read buffer must be copied first.

    Streaming across frames; skippable frames (``pzstd`` headers, seek tables)
    are ignored. Each piece of output is at most 4 MiB. With ``frames``, each
    data frame's ``(compressed offset, compressed size, decompressed offset,
    decompressed size)`` is appended to it once the frame is complete (the
    frame table an index records).

    Raises:
        CorruptFrameError: corrupt or truncated data, naming ``path`` and the
            compressed offset of the damaged frame.
    """
    return decompress_frames(chunks, path, frames)


# -- seek tables (seekable format) --------------------------------------------


def read_seek_table(buf: Any, path: str) -> np.ndarray | None:
    """The ``(compressed_size, decompressed_size)`` rows of a trailing seek table, or ``None``.

    Raises:
        CorruptFrameError: the footer says seek table but the table is malformed.
    """
    n = len(buf)
    if n < _FOOTER + 8:
        return None
    footer = bytes(buf[n - _FOOTER : n])
    if int.from_bytes(footer[5:9], "little") != SEEKABLE_MAGIC:
        return None
    n_frames = int.from_bytes(footer[0:4], "little")
    descriptor = footer[4]
    if descriptor & 0x7C:
        raise CorruptFrameError(path, n - _FOOTER, "bad seek table descriptor (reserved bits set)")
    entry = 12 if descriptor & 0x80 else 8
    size = n_frames * entry + _FOOTER
    start = n - size - 8
    if start < 0:
        raise CorruptFrameError(path, n - _FOOTER, f"seek table of {counted(n_frames, 'frame')} does not fit in the file")
    head = bytes(buf[start : start + 8])
    if int.from_bytes(head[:4], "little") != _SEEK_TABLE_SKIPPABLE or int.from_bytes(head[4:], "little") != size:
        raise CorruptFrameError(path, start, "seek table footer without a matching skippable frame header")
    raw = np.frombuffer(bytes(buf[start + 8 : start + 8 + n_frames * entry]), "<u4").reshape(n_frames, entry // 4)
    return raw[:, :2].astype(np.uint64)


def seek_table_frame(sizes: Iterable[tuple[int, int]]) -> bytes:
    """A seek table (skippable frame) for ``(compressed_size, decompressed_size)`` frames, no checksums."""
    rows = np.array(list(sizes), "<u4").reshape(-1, 2)
    n = len(rows)
    body = rows.tobytes() + n.to_bytes(4, "little") + b"\x00" + SEEKABLE_MAGIC.to_bytes(4, "little")
    return _SEEK_TABLE_SKIPPABLE.to_bytes(4, "little") + len(body).to_bytes(4, "little") + body


def check_seek_table(table: np.ndarray, seek: np.ndarray, path: str, *, prefix: bool = False) -> None:
    """Compare a walked frame table with a seek table (with ``prefix``: the table's rows with the
    seek table's first ones, for a walk that stopped after the end of the archive).

    Raises:
        CorruptFrameError: they disagree, naming the first frame that differs.
    """
    for k in range(min(len(table), len(seek))):
        c, d = int(seek[k, 0]), int(seek[k, 1])
        if c != int(table[k, 1]) or d != int(table[k, 3]):
            raise CorruptFrameError(
                path,
                int(table[k, 0]),
                f"seek table disagrees with frame {k} (table: {c} -> {d} bytes, "
                f"frame: {int(table[k, 1])} -> {int(table[k, 3])} bytes)",
            )
    if len(table) != len(seek) and not (prefix and len(table) <= len(seek)):
        raise CorruptFrameError(
            path, 0, f"seek table lists {counted(len(seek), 'frame')}, the file has {counted(len(table), 'data frame')}"
        )


def seek_table_frames(read_at: Callable[[int, int], bytes], size: int, path: str) -> np.ndarray | None:
    """The frame table of a seekable zstd file of ``size`` bytes, from its trailing seek table (two
    reads at its end through ``read_at``), or ``None`` when there is none or it does not describe the
    file exactly: data frames back to back from offset 0, then the table (what ``tarindex compress``
    writes; ``pzstd`` headers between frames do not qualify).

    The table is not trusted further: a reader through it checks every frame it decompresses
    against its row (:mod:`tarindex.zstd_random`).
    """
    if size < _FOOTER + 8:
        return None
    footer = bytes(read_at(size - _FOOTER, _FOOTER))
    if len(footer) != _FOOTER or int.from_bytes(footer[5:9], "little") != SEEKABLE_MAGIC:
        return None
    n_frames = int.from_bytes(footer[0:4], "little")
    tail = n_frames * (12 if footer[4] & 0x80 else 8) + _FOOTER + 8
    if tail > size:
        return None
    try:
        seek = read_seek_table(bytes(read_at(size - tail, tail)), path)
    except CorruptFrameError:
        return None
    if seek is None or int(seek[:, 0].sum()) + tail != size:
        return None
    rows = np.zeros((len(seek), 4), np.uint64)
    rows[:, 1], rows[:, 3] = seek[:, 0], seek[:, 1]
    rows[1:, 0], rows[1:, 2] = np.cumsum(seek[:-1, 0]), np.cumsum(seek[:-1, 1])
    return rows


def frame_array(rows: list[tuple[int, int, int, int]]) -> np.ndarray:
    """Rows ``(c_offset, c_size, d_offset, d_size)`` as a ``(n, 4)`` uint64 frame table."""
    return np.array(rows, np.uint64).reshape(-1, 4)


# -- indexing -------------------------------------------------------------------


def random_access(frames: np.ndarray) -> bool:
    """Whether every frame is small enough to decompress for one sample."""
    return bool(len(frames) == 0 or int(frames[:, 3].max()) <= RANDOM_ACCESS_FRAME_LIMIT)


def close_map(buf: mmap.mmap) -> None:
    """Close a map now, or leave it to the garbage collector while an error's traceback still holds views of it."""
    try:
        buf.close()
    except BufferError:
        pass


class SeekTableMismatch(Exception):
    """The seek table does not describe the file exactly: index it by walking its frames instead."""


def by_seek_table(
    mv: Any, seek: np.ndarray, rows: list[tuple[int, int, int, int]], path: str, end: ArchiveEnd | None = None
) -> Iterator[bytes]:
    """Decompress the frames the seek table lists, one call each, checking every size and frame end.

    ``mv`` is the whole file: anything with a length whose slices are bytes-like (a memoryview, or the
    scan's ``pread`` view of a local shard).

    Once ``end`` is set and the padding after it decompressed, the remaining frames get the seek
    table's rows without being decompressed (their bytes are never served: they follow the tar).

    Raises:
        SeekTableMismatch: any disagreement or damage (the frame walk then names it precisely).
        DecompressionLimitError: the output exceeds the expansion ratio.
    """
    dctx = zstandard.ZstdDecompressor()
    budget = Budget(path, end)
    off = d_off = at = 0
    window = mv[0:0]  # frames are sliced from windows of 1 MiB of mv (one slice of mv each: one read of a file)
    for c_size, d_size in seek.tolist():
        if budget.padding_done():
            rows.append((off, c_size, d_off, d_size))
            off += c_size
            d_off += d_size
            continue
        if off + c_size > at + len(window):
            at, window = off, mv[off : off + max(c_size, 1 << 20)]
        frame = window[off - at : off - at + c_size]
        if len(frame) != c_size or zstandard.frame_content_size(frame) == 0:  # a 0 is proved by the frame walk
            raise SeekTableMismatch
        try:
            out = dctx.decompress(frame, max_output_size=d_size, allow_extra_data=False)
        except zstandard.ZstdError as exc:
            raise SeekTableMismatch from exc
        if len(out) != d_size or zstandard.frame_content_size(frame) not in (-1, d_size):
            raise SeekTableMismatch
        budget.spend(d_size, off + c_size)
        rows.append((off, c_size, d_off, d_size))
        off += c_size
        d_off += d_size
        yield out
    if off + 8 + len(seek) * 8 + _FOOTER != len(mv):  # the seek table frame (no checksums) must follow at once
        raise SeekTableMismatch
