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
of each data frame. Indexing records it; :class:`ZstdShardReader` reads any
decompressed byte range through it, decompressing only the frames that hold
it, with a per-process LRU of decompressed frames bounded in bytes.
"""

from __future__ import annotations

import array
import bisect
import mmap
import os
from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import zstandard

from ._native import SPEEDUPS as _speedups
from ._process import FORK
from .errors import CorruptFrameError

__all__ = [
    "FRAME_FIELDS",
    "MAP_SLICE",
    "MAX_FRAME_BYTES",
    "PIECE_LIMIT",
    "RANDOM_ACCESS_FRAME_LIMIT",
    "SEED_BYTES",
    "SEEKABLE_MAGIC",
    "ZSTD_MAGIC",
    "FrameCache",
    "SeekTableMismatch",
    "ZstdShardReader",
    "by_seek_table",
    "check_seek_table",
    "close_map",
    "decompress_frames",
    "frame_array",
    "frame_cache",
    "is_zstd",
    "iter_decompressed",
    "random_access",
    "read_seek_table",
    "seek_table_frame",
    "zstd_reader",
]

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
        return bytes(dctx.decompress(piece, max_output_size=_PIECE_BLOCKS * _BLOCK_MAX))
    except zstandard.ZstdError as exc:
        raise CorruptFrameError(path, off, f"corrupt zstd frame ({exc})") from exc


def decompress_frames(
    chunks: Iterable[Any],
    path: str,
    frames: list[tuple[int, int, int, int]] | None = None,
    *,
    hold: bool = True,
) -> Iterator[bytes]:
    """Decompress a zstd stream, frame by frame; append each frame's table row to ``frames``.

    Each data frame gets a fresh decompressor, so a damaged frame is named by
    its own compressed offset. With ``hold``, the output of frames up to 32 MiB
    is held back until the frame's end (and content checksum, when present) is
    verified, so nothing from a damaged frame is returned; larger frames
    stream. Without it (indexing, where any error discards everything) output
    flows at once, which keeps memory hot. Output pieces are at most 4 MiB.

    Raises:
        CorruptFrameError: a corrupt or truncated frame, or bytes that are not zstd.
    """
    dctx = zstandard.ZstdDecompressor()
    events = _Events(chunks, path)
    d_off = 0
    hold_limit = _HOLD_BYTES if hold else 0
    while True:
        event = events.pop()
        if event is None:
            return
        kind, off, value = event
        if kind != PIECE:
            continue  # skippable frames (an END always follows a PIECE of its frame)
        after = events.peek()
        if after is not None and after[0] == END:  # the whole frame in one piece: one call
            events.pop()
            out = _whole_frame(dctx, value, path, off)
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
                held.append(out)
                held_bytes += len(out)
                if held_bytes > hold_limit:
                    yield from held
                    held, held_bytes = [], 0
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
        raise CorruptFrameError(path, n - _FOOTER, f"seek table of {n_frames} frames does not fit in the file")
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


def check_seek_table(table: np.ndarray, seek: np.ndarray, path: str) -> None:
    """Compare a walked frame table with a seek table.

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
    if len(table) != len(seek):
        raise CorruptFrameError(
            path, 0, f"seek table lists {len(seek)} frames, the file has {len(table)} data frames"
        )


def frame_array(rows: list[tuple[int, int, int, int]]) -> np.ndarray:
    """Rows ``(c_offset, c_size, d_offset, d_size)`` as a ``(n, 4)`` uint64 frame table."""
    return np.array(rows, np.uint64).reshape(-1, 4)


# -- random access --------------------------------------------------------------


SEED_BYTES = 4 << 20
"""A frame cache's first length; it grows towards ``max_bytes`` by half the bytes its hits serve."""


class FrameCache:
    """Decompressed frames, bounded in bytes, least recently used dropped first; one per process (see :func:`frame_cache`).

    Holding a frame costs fresh memory, whose page faults can cost more than
    decompressing the frame again, so the bound in force (``limit``) starts at
    :data:`SEED_BYTES` and grows by half the bytes that hits serve, up to
    ``max_bytes``: the cache grows only as fast as it pays for itself.
    ``decompressed`` counts the bytes that readers decompressed through it
    (their admission test, see :meth:`ZstdShardReader.frame`).
    """

    def __init__(self, max_bytes: int) -> None:
        self._max_bytes = max_bytes
        self.limit = min(max_bytes, SEED_BYTES)
        self.hit_bytes = 0
        self.bytes = 0
        self.decompressed = 0
        self._items: OrderedDict[tuple[Any, int], bytes] = OrderedDict()

    @property
    def max_bytes(self) -> int:
        """The bound (0: keep nothing); setting another value empties the cache."""
        return self._max_bytes

    @max_bytes.setter
    def max_bytes(self, value: int) -> None:
        if value < 0:
            raise ValueError("max_bytes must be >= 0")
        if value != self._max_bytes:
            self.clear()
            self._max_bytes = value
            self.limit = min(value, SEED_BYTES)
            self.hit_bytes = 0

    def get(self, key: tuple[Any, int]) -> bytes | None:
        data = self._items.get(key)
        if data is not None:
            self._items.move_to_end(key)
            self.hit_bytes += len(data)
            self.limit = max(self.limit, min(self._max_bytes, SEED_BYTES + self.hit_bytes // 2))
        return data

    def put(self, key: tuple[Any, int], data: bytes) -> None:
        if not data or len(data) > self.limit:
            return
        old = self._items.pop(key, None)
        if old is not None:
            self.bytes -= len(old)
        self._items[key] = data
        self.bytes += len(data)
        while self.bytes > self.limit:
            _, dropped = self._items.popitem(last=False)
            self.bytes -= len(dropped)

    def clear(self) -> None:
        """Drop every frame."""
        self._items.clear()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._items)


_CACHE: Any = None
_CACHE_GEN = -1
DEFAULT_CACHE_BYTES = 64 << 20


def frame_cache() -> Any:
    """This process's cache of decompressed frames (64 MiB; set ``.max_bytes`` to change, 0 turns it off).

    With the C extension, a ``_speedups.FrameCache``: one ring of ``max_bytes``
    allocated at first use, oldest frames dropped first (see docs/zstd.md);
    without it, a :class:`FrameCache`. Both have ``max_bytes``, ``limit`` (the
    bound in force, growing from :data:`SEED_BYTES` as hits pay for it),
    ``bytes``, ``decompressed``, ``clear()`` and ``len()``.
    """
    global _CACHE, _CACHE_GEN
    if _CACHE is None or FORK[0] != _CACHE_GEN:  # a forked child starts with an empty cache
        _CACHE, _CACHE_GEN = (_speedups.FrameCache if _speedups is not None else FrameCache)(DEFAULT_CACHE_BYTES), FORK[0]
    return _CACHE


_pread = os.pread
_bisect_right = bisect.bisect_right


class ZstdShardReader:
    """``read_at(offset, size)`` over a zstd shard's decompressed bytes, through its frame table.

    Reads and decompresses only the frames that overlap the range, each whole
    (its checksum verified before any byte of it is returned). The frame
    decompressed last is remembered (consecutive samples of one frame: one
    decompression); other frames come from the per-process
    :func:`frame_cache`, which keeps a frame only when it was decompressed
    before, recently enough that a cache of its current ``limit`` holding
    every decompressed frame would still have it (a frame read whole for one
    range, such as a one-sample frame, is never kept). The C extension's ``ZstdReader`` does the same (see
    :func:`zstd_reader`).

    Args:
        path: the shard (used in errors).
        fd: an open file descriptor of the shard; the reader owns it.
        frames: the shard's ``(n, 4)`` frame table.
    """

    def __init__(self, path: str, fd: int, frames: np.ndarray) -> None:
        self.path = str(path)
        self.fd = fd
        self._c_off = frames[:, 0].tolist()
        self._c_size = frames[:, 1].tolist()
        self._d_off = frames[:, 2].tolist()
        self._d_size = frames[:, 3].tolist()
        st = os.fstat(fd)
        self._key = (st.st_dev, st.st_ino, st.st_mtime_ns)
        self._dctxs = [zstandard.ZstdDecompressor()]  # one per concurrent call: decompress lets other threads run
        self._seen = array.array("Q", bytes(8 * len(self._c_off)))  # per frame: the cache's clock after its last decompression
        self._last_k = -1
        self._last = b""

    def frame(self, k: int, *, keep: bool = True) -> bytes:
        """Decompressed frame ``k`` (from the cache, or read and decompressed; cached if ``keep``).

        Raises:
            CorruptFrameError: the frame is truncated or corrupt, or decompresses
                to another size than the frame table says.
        """
        if k == self._last_k:
            return self._last
        cache: FrameCache = _CACHE if FORK[0] == _CACHE_GEN and _CACHE is not None else frame_cache()
        key = (self._key, k)
        data = cache.get(key)
        if data is not None:
            return data
        c_off, c_size, d_size = self._c_off[k], self._c_size[k], self._d_size[k]
        raw = _pread(self.fd, c_size, c_off)
        if len(raw) != c_size:
            raise CorruptFrameError(self.path, c_off, f"truncated zstd frame ({len(raw)} of {c_size} bytes)")
        try:
            if zstandard.frame_content_size(raw) not in (-1, d_size):  # never allocate what a damaged header claims
                raise CorruptFrameError(self.path, c_off, f"zstd frame header disagrees with the index ({d_size} bytes)")
            dctxs = self._dctxs
            dctx = dctxs.pop() if dctxs else zstandard.ZstdDecompressor()
            try:
                data = dctx.decompress(raw, max_output_size=d_size)
            finally:
                dctxs.append(dctx)
        except zstandard.ZstdError as exc:
            raise CorruptFrameError(self.path, c_off, f"corrupt zstd frame ({exc})") from exc
        if len(data) != d_size:
            raise CorruptFrameError(
                self.path, c_off, f"zstd frame decompresses to {len(data)} bytes, the index says {d_size}"
            )
        self._last_k, self._last = k, data
        prev, before = self._seen[k], cache.decompressed
        cache.decompressed = self._seen[k] = before + d_size
        if keep and prev and before - prev + d_size <= cache.limit:  # reused, recently: worth keeping
            cache.put(key, data)
        return data

    def read_at(self, offset: int, size: int) -> bytes:
        """``size`` decompressed bytes from ``offset`` (fewer only at the end of the shard).

        Raises:
            CorruptFrameError: see :meth:`frame`.
        """
        d_off = self._d_off
        k = _bisect_right(d_off, offset) - 1
        if k < 0 or size <= 0:
            return b""
        start = offset - d_off[k]
        end = start + size
        whole = start == 0 and end >= self._d_size[k]  # a frame that holds just this range is not kept
        data = self.frame(k, keep=not whole)
        if end <= len(data):
            return data if whole and end == len(data) else data[start:end]
        parts = [data[start:]]
        need = size - len(parts[0])
        while need > 0 and k + 1 < len(d_off):
            k += 1
            data = self.frame(k)
            parts.append(data[:need])
            need -= len(parts[-1])
        return b"".join(parts)

    def close(self) -> None:
        """Close the shard file."""
        self._last_k, self._last = -1, b""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def zstd_reader(path: str, fd: int, frames: np.ndarray) -> Any:
    """A reader with ``read_at(offset, size)``, ``close()`` and ``fd`` over a zstd shard; takes ownership of ``fd``.

    The C extension's ``ZstdReader`` (same behaviour, errors included) when it
    is built, else :class:`ZstdShardReader`; both use :func:`frame_cache`.
    """
    if _speedups is None:
        return ZstdShardReader(path, fd, frames)
    try:
        table = np.ascontiguousarray(frames, np.uint64)
        return _speedups.ZstdReader(
            str(path), fd, table, zstandard.ZstdDecompressor, CorruptFrameError, zstandard.ZstdError, frame_cache()
        )
    except BaseException:
        os.close(fd)
        raise


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


def by_seek_table(mv: memoryview, seek: np.ndarray, rows: list[tuple[int, int, int, int]]) -> Iterator[bytes]:
    """Decompress the frames the seek table lists, one call each, checking every size and frame end.

    Raises:
        SeekTableMismatch: any disagreement or damage (the frame walk then names it precisely).
    """
    dctx = zstandard.ZstdDecompressor()
    off = d_off = 0
    for c_size, d_size in seek.tolist():
        frame = mv[off : off + c_size]
        try:
            if len(frame) != c_size or zstandard.frame_content_size(frame) not in (-1, d_size):
                raise SeekTableMismatch
            out = dctx.decompress(frame, max_output_size=d_size, allow_extra_data=False)
        except zstandard.ZstdError as exc:
            raise SeekTableMismatch from exc
        if len(out) != d_size:
            raise SeekTableMismatch
        rows.append((off, c_size, d_off, d_size))
        off += c_size
        d_off += d_size
        yield out
    if off + 8 + len(seek) * 8 + _FOOTER != len(mv):  # the seek table frame (no checksums) must follow at once
        raise SeekTableMismatch
