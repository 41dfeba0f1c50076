"""Random reads of gzip shards through seek points (zran: the deflate state at block boundaries).

A deflate stream cannot be entered at an arbitrary byte: a block starts at a bit offset, and its
back-references reach 32 KiB into the output before it. A *seek point* saves what a restart needs:
the compressed offset of a block boundary, the number of bits of the byte before it that belong to
the block, the decompressed offset there, and the last 32 KiB of output (the window, stored
zlib-compressed). :func:`decompress_indexed` records one every :data:`SPACING` bytes of output while
``build`` decompresses the shard (one pass, the same one the tar parser reads), and one at the start;
:class:`GzipShardReader` serves ``read_at(offset, size)`` of the decompressed tar by priming a raw
inflate at the nearest point before ``offset`` (``inflatePrime`` for the bits, ``inflateSetDictionary``
for the window) and decompressing to ``offset + size``, across member boundaries (``pigz -i``, bgzip,
``cat a.gz b.gz``).

Python's :mod:`zlib` stops only at output or input limits and cannot prime a bit offset, so both
halves call the system zlib's ``inflate`` (``Z_BLOCK``), ``inflatePrime`` and ``inflateSetDictionary``
through :mod:`ctypes` (the same library :mod:`zlib` links). Nothing is held across a fork but the
seek-point table: each read makes its own ``z_stream``.
"""

from __future__ import annotations

import bisect
import ctypes
import ctypes.util
import struct
import threading
import zlib
from collections.abc import Iterable, Iterator
from typing import Any

from ._ranges import ReadAt, ReadsEach
from .compression import ArchiveEnd, Budget
from .errors import CorruptDeflateError, IndexFormatError, RandomAccessError, StaleIndexError
from .gzip import GZIP_MAGIC

__all__: list[str] = []  # internal: read through TarDataset and build

SPACING = 512 << 10
"""Decompressed bytes between seek points (default; see docs/performance.md, "gzip")."""
WINDOW = 32768
_MAX_STORED_WINDOW = WINDOW + (WINDOW >> 12) + (WINDOW >> 14) + 13  # zlib's compressBound(32 KiB): 32,791 bytes
_MAX_RATIO = 1032  # deflate's largest expansion: a 258-byte match in two bits
_CHECK = 32  # compressed bytes at a seek point whose CRC-32 the table keeps (a replaced shard differs)
_OUT = 1 << 20  # decompressed bytes per inflate call
_IN = 1 << 18  # compressed bytes per read of the shard
_ROW = struct.Struct("<QQQII")  # compressed offset, decompressed offset, bits, check CRC, window bytes
_HEAD = struct.Struct("<4sII")  # magic, version, number of points
_MAGIC, _VERSION = b"TIgz", 1

Z_OK, Z_STREAM_END, Z_NEED_DICT, Z_BUF_ERROR, Z_BLOCK, Z_NO_FLUSH = 0, 1, 2, -5, 5, 0


class _ZStream(ctypes.Structure):
    _fields_ = [
        ("next_in", ctypes.c_void_p),
        ("avail_in", ctypes.c_uint),
        ("total_in", ctypes.c_ulong),
        ("next_out", ctypes.c_void_p),
        ("avail_out", ctypes.c_uint),
        ("total_out", ctypes.c_ulong),
        ("msg", ctypes.c_char_p),
        ("state", ctypes.c_void_p),
        ("zalloc", ctypes.c_void_p),
        ("zfree", ctypes.c_void_p),
        ("opaque", ctypes.c_void_p),
        ("data_type", ctypes.c_int),
        ("adler", ctypes.c_ulong),
        ("reserved", ctypes.c_ulong),
    ]


_LIBZ: Any = None
_BUFFERS = threading.local()


def _libz() -> Any:
    """The system zlib, loaded once per process.

    Raises:
        RandomAccessError: no zlib shared library is found.
    """
    global _LIBZ
    if _LIBZ is None:
        name = ctypes.util.find_library("z") or "libz.so.1"
        try:
            lib = ctypes.CDLL(name)
        except OSError as exc:
            raise RandomAccessError("zlib", f"gzip seek points need the zlib shared library ({exc})") from exc
        p = ctypes.POINTER(_ZStream)
        lib.zlibVersion.restype = ctypes.c_char_p
        lib.inflateInit2_.argtypes = [p, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.inflate.argtypes = [p, ctypes.c_int]
        lib.inflateEnd.argtypes = [p]
        lib.inflateReset2.argtypes = [p, ctypes.c_int]
        lib.inflatePrime.argtypes = [p, ctypes.c_int, ctypes.c_int]
        lib.inflateSetDictionary.argtypes = [p, ctypes.c_char_p, ctypes.c_uint]
        _LIBZ = lib
    return _LIBZ


class _Inflate:
    """One ``z_stream``: input set from a ``bytes`` (kept alive here), output into a reused buffer."""

    def __init__(self, wbits: int) -> None:
        self.z = _libz()
        self.s = _ZStream()
        self.ref = ctypes.byref(self.s)
        if self.z.inflateInit2_(self.ref, wbits, self.z.zlibVersion(), ctypes.sizeof(_ZStream)) != Z_OK:
            raise MemoryError("inflateInit2 failed")
        out = getattr(_BUFFERS, "out", None)
        if out is None:  # one output buffer per thread, reused by its reads (zeroing 1 MiB per read costs)
            out = _BUFFERS.out = ctypes.create_string_buffer(_OUT)
        self.out = out
        self.out_addr = ctypes.addressof(out)
        self.data = b""
        self.data_addr = 0

    def set_input(self, data: bytes) -> None:
        self.data = data
        self.data_addr = ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value or 0
        self.s.next_in, self.s.avail_in = self.data_addr, len(data)

    def consumed(self) -> int:
        """Bytes of the current input inflate has taken."""
        return len(self.data) - int(self.s.avail_in)

    def close(self) -> None:
        if self.s.state:
            self.z.inflateEnd(self.ref)


def _fail(path: str, inf: _Inflate, offset: int, ret: int) -> CorruptDeflateError:
    msg = inf.s.msg.decode("ascii", "replace") if inf.s.msg else f"zlib error {ret}"
    return CorruptDeflateError(path, offset, f"corrupt deflate data ({msg})")


# -- seek-point tables ---------------------------------------------------------------------------------


class SeekPoints:
    """A shard's seek points (decoded from the bytes :func:`decompress_indexed` makes, stored in the index),
    every field checked against the table and the shard before any is used.

    Args:
        raw: the encoded table.
        where: what the table is, for errors (``"INDEX: the gzip seek points of SHARD"``).
        size: the compressed shard's size in bytes (every point lies inside it), if known.

    Raises:
        IndexFormatError: the table is damaged or crafted: not the format, a point's bit count outside
            0-7, compressed offsets that do not increase or leave the shard, decompressed offsets that do
            not start at 0 and grow (or stay: empty members) at most as fast as deflate expands (1032 to 1), a stored
            window longer than zlib makes of 32 KiB; naming the point, expected and got.
    """

    __slots__ = ("bits", "check", "compressed", "decompressed", "where", "windows")

    def __init__(self, raw: bytes | memoryview, where: str, *, size: int | None = None) -> None:
        raw = bytes(raw)
        self.where = where
        try:
            magic, version, n = _HEAD.unpack_from(raw)
            if magic != _MAGIC or version != _VERSION:
                raise ValueError(f"magic {magic!r}, version {version}")
            if not n or _HEAD.size + n * _ROW.size > len(raw):
                raise ValueError(f"{len(raw)} bytes for {n} points")
            rows = [_ROW.unpack_from(raw, _HEAD.size + i * _ROW.size) for i in range(n)]
            pos = _HEAD.size + n * _ROW.size
            windows = []
            for r in rows:
                windows.append(raw[pos : pos + r[4]])
                pos += r[4]
            if pos != len(raw):
                raise ValueError(f"{len(raw)} bytes for {n} points")
        except (struct.error, ValueError) as exc:
            raise IndexFormatError(f"{where} are damaged ({exc}); rebuild the index") from exc
        self.compressed = [r[0] for r in rows]
        self.decompressed = [r[1] for r in rows]
        self.bits = [r[2] for r in rows]
        self.check = [r[3] for r in rows]
        self.windows = windows
        self._check_fields(size)

    def _bad(self, k: int, what: str) -> IndexFormatError:
        return IndexFormatError(f"{self.where} are damaged at point {k} of {len(self)}: {what}; rebuild the index")

    def _check_fields(self, size: int | None) -> None:
        if self.decompressed[0] != 0:
            raise self._bad(0, f"decompressed offset {self.decompressed[0]} (expected 0)")
        before_c = before_d = -1
        for k, (c, d, bits, w) in enumerate(zip(self.compressed, self.decompressed, self.bits, self.windows)):
            if not 0 <= bits <= 7:
                raise self._bad(k, f"{bits} bits of the byte before the block (expected 0-7)")
            if size is not None and c >= size:
                raise self._bad(k, f"compressed offset {c} (expected below the shard's {size} bytes)")
            if k and not (c > before_c and before_d <= d <= before_d + (c - before_c + 1) * _MAX_RATIO):
                raise self._bad(
                    k,
                    f"compressed offset {c}, decompressed offset {d} after {before_c}, {before_d} (expected a larger "
                    f"compressed offset, and a decompressed one no smaller, larger by at most {_MAX_RATIO} bytes per compressed byte)",
                )
            if len(w) > _MAX_STORED_WINDOW:
                raise self._bad(k, f"a stored window of {len(w)} bytes (expected at most {_MAX_STORED_WINDOW})")
            before_c, before_d = c, d

    def window(self, k: int) -> bytes:
        """Point ``k``'s window, decompressed to at most :data:`WINDOW` bytes (never more is produced).

        Raises:
            IndexFormatError: the stored window is not one zlib stream of at most 32 KiB, or holds more
                bytes than come before the point.
        """
        stored = self.windows[k]
        if not stored:
            return b""
        inflater = zlib.decompressobj()
        try:
            window = inflater.decompress(stored, WINDOW)
        except zlib.error as exc:
            raise self._bad(k, f"its window is not zlib data ({exc})") from exc
        if inflater.unconsumed_tail or not inflater.eof:
            raise self._bad(k, f"its window is not one zlib stream of at most {WINDOW} bytes")
        if inflater.unused_data:
            raise self._bad(k, f"{len(inflater.unused_data)} bytes after its window's zlib stream")
        if len(window) > self.decompressed[k]:
            raise self._bad(k, f"a window of {len(window)} bytes before decompressed offset {self.decompressed[k]}")
        return window

    def __len__(self) -> int:
        return len(self.compressed)


def _encode(points: list[tuple[int, int, int, int, bytes]]) -> bytes:
    rows = [_ROW.pack(c, d, b, chk, len(w)) for c, d, b, chk, w in points]
    return b"".join([_HEAD.pack(_MAGIC, _VERSION, len(points)), *rows, *(w for *_, w in points)])


def _check_at(data: bytes) -> int:
    return zlib.crc32(data[:_CHECK])


# -- building: decompression that records seek points -----------------------------------------------


def decompress_indexed(
    chunks: Iterable[Any], path: str, table: list[bytes], *, end: ArchiveEnd | None = None, spacing: int | None = None
) -> Iterator[bytes]:
    """What :func:`tarindex.gzip.decompress_gzip` yields (the same checks, bounds and errors), recording
    a seek point at the first deflate block and then at the first block boundary ``spacing`` or more
    decompressed bytes after the previous point (``spacing``: :data:`SPACING` by default); once the input is exhausted the encoded table is
    appended to ``table``.

    Raises:
        CorruptDeflateError: a bad header, corrupt deflate data, a CRC or length mismatch, a truncated
            member, or bytes after the members that are neither a member nor zeros (compressed offset).
        DecompressionLimitError: the output exceeds the expansion ratio.
    """
    spacing = SPACING if spacing is None else spacing
    budget = Budget(path, end)
    inf = _Inflate(31)
    z, ref, s = inf.z, inf.ref, inf.s
    points: list[tuple[int, int, int, int, bytes]] = []
    pending: list[tuple[int, int, int, bytes]] = []  # points whose check bytes are not all read yet
    tail = b""  # the last WINDOW bytes output before the current buffer
    pos = out_pos = base = hbase = 0  # compressed bytes consumed, decompressed bytes out, offset of the piece
    member = member_out = 0
    in_member = zeros = False
    last = -spacing
    history = b""  # the end of the previous piece and this one (a point's check bytes may straddle them)
    chunks = iter(chunks)
    try:
        for raw in chunks:
            data = bytes(raw)
            history = history[-_CHECK:] + data
            hbase = base - (len(history) - len(data))
            inf.set_input(data)
            more = bool(data)
            while more:
                if budget.padding_done():  # past the end of the archive: read the rest, inflate none of it
                    for _ in chunks:
                        pass
                    _finish_points(points, pending, history, hbase, final=True)
                    table.append(_encode(points))
                    return
                if not in_member:
                    rest = data[inf.consumed() :]
                    if zeros or rest[:1] != GZIP_MAGIC[:1]:
                        if rest.strip(b"\x00"):
                            raise CorruptDeflateError(path, pos, f"not a gzip member (bytes {rest[:4].hex()})")
                        zeros = True
                        pos += len(rest)
                        break
                    in_member, member, member_out = True, pos, out_pos
                s.next_out, s.avail_out = inf.out_addr, _OUT
                while True:
                    before = s.avail_in
                    ret = z.inflate(ref, Z_BLOCK)
                    pos += before - s.avail_in
                    if ret not in (Z_OK, Z_STREAM_END, Z_BUF_ERROR):
                        what = (s.msg or b"zlib error").decode("ascii", "replace")
                        raise CorruptDeflateError(path, member, f"corrupt gzip member ({what}; input read to offset {pos})")
                    n = _OUT - s.avail_out
                    here = out_pos + n
                    dt = s.data_type
                    if ret == Z_OK and dt & 128 and not dt & 64 and (here == 0 or here - last >= spacing):
                        window = b"" if here == member_out else (tail + ctypes.string_at(inf.out_addr, n))[-WINDOW:]
                        bits = dt & 7
                        pending.append((pos - (1 if bits else 0), here, bits, zlib.compress(window, 1) if window else b""))
                        last = here
                    if ret != Z_OK or s.avail_out == 0 or s.avail_in == 0:
                        break
                if n:
                    out = ctypes.string_at(inf.out_addr, n)
                    tail = (tail + out)[-WINDOW:] if n < WINDOW else out[-WINDOW:]
                    out_pos += n
                    budget.spend(n, pos)
                    yield out
                more = s.avail_in > 0 or (s.avail_out == 0 and ret == Z_OK)
                if ret == Z_STREAM_END:  # the trailer (CRC-32, length) is verified by zlib
                    in_member = False
                    z.inflateReset2(ref, 31)
                    more = s.avail_in > 0
            base += len(data)
            _finish_points(points, pending, history, hbase)
        if in_member:
            raise CorruptDeflateError(path, member, f"truncated gzip member (input ends at {pos})")
        _finish_points(points, pending, history, hbase, final=True)
        table.append(_encode(points))
    finally:
        inf.close()


def _finish_points(
    points: list[tuple[int, int, int, int, bytes]],
    pending: list[tuple[int, int, int, bytes]],
    history: bytes,
    hbase: int,
    *,
    final: bool = False,
) -> None:
    """Move the pending points whose check bytes ``history`` (from compressed offset ``hbase``) holds."""
    while pending:
        c, d, b, w = pending[0]
        at = c - hbase
        if at < 0:  # cannot happen with inputs of at least _CHECK bytes; be exact anyway
            raise RuntimeError("seek point check bytes were dropped")
        if at + _CHECK > len(history) and not final:
            return
        points.append((c, d, b, _check_at(history[at:]), w))
        pending.pop(0)


# -- reading ---------------------------------------------------------------------------------------------


class GzipShardReader(ReadsEach):
    """``read_at(offset, size)`` of the decompressed tar of a gzip shard, from the nearest seek point.

    Args:
        path: the shard (used in errors).
        handle: the compressed shard, read with its ``read_at`` (a :class:`tarindex.access.reader.RandomReader`);
            the reader owns it.
        points: its seek points (from the index).
    """

    def __init__(self, path: str, handle: ReadAt, points: SeekPoints) -> None:
        self.path = path
        self.handle = handle
        self.points = points
        self._checked: set[int] = set()
        self.size = -1  # the decompressed length is not recorded: reads end where the data does

    def _read(self, offset: int, size: int) -> bytes:
        return bytes(self.handle.read_at(offset, size))

    def read_at(self, offset: int, size: int) -> bytes:
        """The decompressed bytes ``[offset, offset + size)`` (fewer only past the end of the data).

        Raises:
            StaleIndexError: the compressed bytes at the seek point differ from those indexed.
            CorruptDeflateError: damaged deflate data (shard and compressed offset).
            IndexFormatError: the seek point's stored window is damaged or crafted (:meth:`SeekPoints.window`).
        """
        p = self.points
        k = bisect.bisect_right(p.decompressed, offset) - 1
        start, bits = p.compressed[k], p.bits[k]
        # Up to the next point's block when the range ends before it (and at least _CHECK bytes).
        ends_before = k + 1 < len(p) and offset + size <= p.decompressed[k + 1]
        first = self._read(start, max(_CHECK, p.compressed[k + 1] + 1 - start) if ends_before else _IN)
        if k not in self._checked:
            if _check_at(first) != p.check[k]:
                raise StaleIndexError(self.path, f"compressed bytes at seek point {k} (offset {start}) differ from the index")
            self._checked.add(k)
        inf = _Inflate(-15)
        z, ref, s = inf.z, inf.ref, inf.s
        try:
            data = first
            if bits:
                z.inflatePrime(ref, bits, data[0] >> (8 - bits))
                data = data[1:]
                start += 1
            window = p.window(k)
            if window:
                z.inflateSetDictionary(ref, window, len(window))
            skip, want = offset - p.decompressed[k], size
            parts: list[bytes] = []
            pos = start  # compressed offset of data[0]
            raw_mode, trailer = True, 0
            while want > 0:
                if not data:
                    data = self._read(pos, _IN)
                    if not data:
                        break
                if trailer:  # the 8-byte trailer after a raw-mode member: skipped, then gzip mode
                    cut = min(trailer, len(data))
                    data, pos, trailer = data[cut:], pos + cut, trailer - cut
                    continue
                if not raw_mode and s.total_in == 0:
                    stripped = data.lstrip(b"\x00")  # padding after the last member
                    pos += len(data) - len(stripped)
                    data = stripped
                    if not data:
                        continue
                inf.set_input(data)
                while want > 0:
                    s.next_out, s.avail_out = inf.out_addr, _OUT
                    ret = z.inflate(ref, Z_NO_FLUSH)
                    if ret == Z_NEED_DICT or (ret < 0 and ret != Z_BUF_ERROR):
                        raise _fail(self.path, inf, pos + inf.consumed(), ret)
                    n = _OUT - s.avail_out
                    if n > skip:
                        got = ctypes.string_at(inf.out_addr + skip, min(n - skip, want))
                        parts.append(got)
                        want -= len(got)
                    skip = max(0, skip - n)
                    if ret == Z_STREAM_END:
                        trailer = 8 if raw_mode else 0
                        raw_mode = False
                        z.inflateReset2(ref, 31)
                        break
                    if s.avail_in == 0 and s.avail_out != 0:
                        break
                used = inf.consumed()
                data, pos = data[used:], pos + used
                if not data and want > 0 and (raw_mode or s.total_in):
                    more = self._read(pos, _IN)
                    if not more:
                        raise CorruptDeflateError(self.path, pos, "truncated deflate data (the shard ends inside a member)")
                    data = more
            return b"".join(parts)
        finally:
            inf.close()

    def close(self) -> None:
        self.handle.close()

    def fileno(self) -> None:
        """``None``: no descriptor's positional reads give these bytes (:class:`tarindex.access.reader.RandomReader`)."""
        return None
