"""Tar header parsing: bytes -> member records (ustar, GNU, PAX).

One parser, two drivers. :func:`iter_tar` walks an archive given as an
iterable of consecutive chunks: a single ``mmap`` of a whole shard (indexing,
never copied) or 1-4 MiB blocks from a pipe, a socket or a decompressor
(streaming). Python's :mod:`tarfile` is the test oracle, not the hot path.

What is a member: regular files (type ``0``, NUL and ``7``). Directories,
symbolic and hard links, devices and FIFOs are skipped silently; GNU sparse
members (type ``S`` or PAX ``GNU.sparse.*``) are skipped with a logged
warning, since their data is not stored contiguously. Header checksums are
verified for every header block, extension headers included, in vectorised
batches: a batch's members are yielded only after its checksums passed.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ._native import SPEEDUPS
from .errors import CorruptArchiveError

__all__: list[str] = []  # internal module: its names serve the package, the public API is tarindex.__all__

BLOCK = 512
_ZERO_BLOCK = bytes(BLOCK)
_REGULAR = frozenset(b"0\x007")
_SPARSE = ord("S")
_PAX = ord("x")
_PAX_GLOBAL = ord("g")
_GNU_LONGNAME = ord("L")
_EXTENSIONS = frozenset((_PAX, _PAX_GLOBAL, _GNU_LONGNAME, ord("K")))
_POSIX_MAGIC = b"ustar\x00"
_TERMINATORS = frozenset(b"\x00 ")
_BATCH_HEADERS = 1024  # headers per checksum batch
_BATCH_BYTES = 16 << 20  # member data held back per batch (with_data)
_WINDOW = 64 << 10
_SMALL_WINDOW = 4 << 10

log = logging.getLogger(__name__)

# the common case of the walk in C; _walk below is the reference and handles everything else
_scan_headers = SPEEDUPS.scan_headers if SPEEDUPS is not None else None

Entry = tuple[str, int, int, int, "bytes | None"]
"""``(name, header_offset, data_offset, size, data)`` of one regular member."""


class Buffer(Protocol):
    """Anything sliceable to bytes with a length: ``bytes``, ``mmap``."""

    def __len__(self) -> int: ...
    def __getitem__(self, key: slice) -> bytes: ...


class Sink(Protocol):
    """Where :func:`index_tar` puts each regular member (:class:`tarindex.grouping.Packer`).

    A sink may also have ``scan(buf, pos, base[, limit]) -> (pos, last_header, last_size)``
    (the C packer): it then walks runs of plain headers itself, as the C walk
    ``scan_headers`` does, and takes their members without Python objects.
    A sink for :func:`group_tar` takes each member's bytes too (a fifth argument
    to ``add``), has ``take()`` for the samples it completed, ``finish()``,
    and ``scan_file(fd, offset, size, limit, buf, pos) -> (offset, last_header, last_size)``.
    """

    def add(self, name: str, header_offset: int, offset: int, size: int, /) -> None: ...


@dataclass(frozen=True, slots=True)
class Member:
    """One regular file of a tar archive."""

    name: str
    """Path inside the archive (PAX and GNU long names applied)."""
    header_offset: int
    """Offset of the member's first header block (extension headers included)."""
    offset: int
    """Offset of the member's data."""
    size: int
    """Size of the member's data in bytes."""

    @property
    def end(self) -> int:
        """Offset just past the member's data padding."""
        return self.offset + _padded(self.size)


def _padded(size: int) -> int:
    return (size + BLOCK - 1) & ~(BLOCK - 1)


def _number(field: bytes) -> int:
    """Parse an octal or GNU base-256 numeric field; raise ``ValueError``."""
    if field[0] & 0x80:
        if field[0] == 0xFF:
            raise ValueError("negative base-256 number")
        return int.from_bytes(field, "big") & ~(0x80 << (8 * (len(field) - 1)))
    digits = field.split(b"\x00", 1)[0].strip()
    return int(digits, 8) if digits else 0


def _decode_name(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def _parse_pax(data: bytes, path: str, offset: int) -> dict[str, str]:
    """Parse PAX extended header records: ``"<len> <key>=<value>\\n"``."""
    out: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        if data[pos] == 0:  # trailing NUL padding
            break
        space = data.find(b" ", pos)
        try:
            length = int(data[pos:space])
        except ValueError:
            length = 0
        record = data[space + 1 : pos + length - 1]
        if space < 0 or length <= space - pos or pos + length > len(data) or b"=" not in record:
            raise CorruptArchiveError(path, offset, "malformed PAX extended header record")
        key, _, value = record.partition(b"=")
        out[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return out


# -- checksums -------------------------------------------------------------------


def _checksum_ok(block: bytes) -> bool:
    try:
        stored = _number(block[148:156])
    except ValueError:
        return False
    arr = np.frombuffer(block, np.uint8)
    if stored == int(arr.sum()) - int(arr[148:156].sum()) + 8 * 32:
        return True
    signed = arr.view(np.int8)  # some old writers summed signed chars
    return stored == int(signed.sum()) - int(signed[148:156].sum()) + 8 * 32


def _checksum_error(path: str, pos: int, block: bytes) -> CorruptArchiveError:
    arr = np.frombuffer(block, np.uint8)
    expected = int(arr.sum()) - int(arr[148:156].sum()) + 8 * 32
    raw = block[148:156].split(b"\x00", 1)[0].strip()
    text = raw.decode("ascii", "replace")
    got = (text if text.isprintable() else repr(raw)) or "empty"  # one line, whatever the bytes
    return CorruptArchiveError(
        path, pos, f"bad header checksum (expected {expected:o}, got {got}); not a tar archive or corrupt"
    )


def _octal_column(fields: np.ndarray) -> np.ndarray:
    """Vectorised octal parse of an ``(n, 8)`` array of checksum fields (leading spaces, any terminator)."""
    value = np.zeros(len(fields), np.int64)
    started = np.zeros(len(fields), bool)
    done = np.zeros(len(fields), bool)
    for c in range(fields.shape[1]):
        b = fields[:, c].astype(np.int64)
        digit = (b >= 48) & (b <= 55)
        take = digit & ~done
        value = np.where(take, value * 8 + (b - 48), value)
        started |= take
        done |= ~digit & (started | (b != 32))
    return value


def _verify(blocks: list[bytes], offsets: list[int], path: str) -> None:
    """Check the header checksum of every block (one numpy pass).

    Raises:
        CorruptArchiveError: naming the first block whose checksum is wrong.
    """
    if not blocks:
        return
    arr = np.frombuffer(b"".join(blocks), np.uint8).reshape(len(blocks), BLOCK)
    field = arr[:, 148:156]
    sums = arr.sum(axis=1, dtype=np.int64) - field.sum(axis=1, dtype=np.int64) + 8 * 32
    for j in np.flatnonzero(sums != _octal_column(field)).tolist():
        if not _checksum_ok(blocks[j]):  # base-256 fields and signed sums take the slow path
            raise _checksum_error(path, offsets[j], blocks[j])


# -- the walker --------------------------------------------------------------------


class _Cursor:
    """A forward-only window over consecutive chunks, with absolute offsets.

    Chunks are used in place: only a header or member that straddles two
    chunks is joined (its own bytes, never the rest of the next chunk).
    """

    __slots__ = ("base", "buf", "chunks", "spill", "spill_at")

    def __init__(self, chunks: Iterable[Buffer]) -> None:
        self.chunks = iter(chunks)
        self.buf: Buffer = b""
        self.base = 0  # absolute offset of buf[0]; at the end of input, of the end
        self.spill: Buffer | None = None  # the chunk whose head was joined into buf ...
        self.spill_at = 0  # ... and where its unread bytes start

    def _next(self) -> tuple[Buffer, int] | None:
        """The next unread bytes as ``(chunk, start)``."""
        if self.spill is not None:
            chunk, at = self.spill, self.spill_at
            self.spill = None
            return chunk, at
        for chunk in self.chunks:
            if len(chunk):
                return chunk, 0
        return None

    def fill(self, pos: int, need: int) -> int:
        """Make ``buf[pos:pos + need]`` available; return the new ``pos`` (-1 if the input ends first)."""
        parts: list[Buffer] = [self.buf[pos:]] if pos < len(self.buf) else []
        have = len(parts[0]) if parts else 0
        self.base += pos
        while have < need:
            nxt = self._next()
            if nxt is None:
                break
            chunk, at = nxt
            if not parts and len(chunk) - at >= need:  # nothing carried over: the chunk itself
                self.buf = chunk
                self.base -= at
                return at
            take = need - have
            if len(chunk) - at > take:
                parts.append(chunk[at : at + take])
                self.spill, self.spill_at = chunk, at + take
                have = need
            else:
                parts.append(chunk[at:] if at else chunk)
                have += len(chunk) - at
        self.buf = parts[0] if len(parts) == 1 else b"".join(parts)  # type: ignore[arg-type]  # bytes-like parts
        return 0 if have >= need else -1

    def skip(self, pos: int, count: int) -> int:
        """Advance ``count`` bytes from ``pos`` without keeping them; return the new ``pos`` (-1 at end of input)."""
        pos += count
        while pos > len(self.buf):
            pos -= len(self.buf)
            self.base += len(self.buf)
            nxt = self._next()
            if nxt is None:
                self.buf = b""
                return -1
            chunk, at = nxt
            self.buf = chunk
            self.base -= at
            pos += at
        return pos


class _FileCursor:
    """A forward-only window over a file read with ``os.pread``: skipped data is never read.

    Windows are 64 KiB while they serve several headers (small members) and
    4 KiB once a member ran more than 4 KiB past one, so large members cost one small read each.
    """

    __slots__ = ("base", "buf", "fd", "large", "size")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.size = os.fstat(fd).st_size
        self.buf: bytes = b""
        self.base = 0
        self.large = False  # the last window ended inside a member's data

    def fill(self, pos: int, need: int) -> int:
        self.base += pos
        self.buf = os.pread(self.fd, max(need, _SMALL_WINDOW if self.large else _WINDOW), self.base)
        self.large = False
        return 0 if len(self.buf) >= need else -1

    def seek(self, offset: int) -> int:
        """Go to ``offset`` in the file (read nothing yet); return the new ``pos``."""
        self.base, self.buf, self.large = offset, b"", False
        return 0

    def walk_direct(self, sink: Any, pos: int) -> tuple[int, bool, int, int]:
        """Let a sample sink's C walk read the file from the header at ``pos`` (``scan_file``):
        ``(pos, whether it took members, last header, its size)``."""
        here = self.base + pos
        after, last_at, last_size = sink.scan_file(self.fd, here, self.size, _BATCH_BYTES, self.buf, pos)
        if after == here:
            return pos, False, 0, 0
        return self.seek(after), True, last_at, last_size

    def skip(self, pos: int, count: int) -> int:
        pos += count
        if pos <= len(self.buf):
            return pos
        self.large = pos - len(self.buf) > _SMALL_WINDOW  # a small member past the end: the next window is large
        if self.base + pos > self.size:
            self.base, self.buf = self.size, b""
            return -1
        self.base += pos
        self.buf = b""
        return 0


class DirectSource(Protocol):
    """A sequential source whose socket or pipe the C walk may read itself (plain HTTP, ``pipe:``, ``-``)."""

    def read(self, n: int, /) -> bytes:
        """Up to ``n`` more bytes; ``b""`` at the end."""
        ...

    def direct(self) -> tuple[int, int, int] | None:
        """``(fd, bytes left or -1, timeout in ms or -1)`` once every byte read so far was returned
        by :meth:`read`, else ``None``."""
        ...

    def advance(self, n: int, timed_out: bool = False, /) -> None:
        """``n`` bytes were read from the descriptor; ``timed_out``: then a wait for more timed out
        (the next :meth:`read` fails as a timed-out read would, without waiting again)."""
        ...


@dataclass(frozen=True, slots=True)
class Stream:
    """A :class:`DirectSource` to walk, and the bytes already read from it."""

    source: DirectSource
    """Where the rest comes from."""
    first: bytes
    """The archive's first bytes."""


_STREAM_READ = 4 << 10  # the Python walker's smallest read of a Stream (a header and a bit): the C walk takes the rest


def stream_chunks(stream: Stream) -> Iterator[bytes]:
    """A :class:`Stream`'s bytes as chunks (for walkers that do not read descriptors)."""
    if stream.first:
        yield stream.first
    while chunk := stream.source.read(256 * _STREAM_READ):
        yield chunk


class _StreamCursor(_Cursor):
    """A :class:`_Cursor` over a :class:`Stream` whose descriptor the C walk may read too (:meth:`walk_direct`)."""

    __slots__ = ("need", "source")

    def __init__(self, stream: Stream) -> None:
        super().__init__(self._reads())
        self.buf = stream.first
        self.source = stream.source
        self.need = 0

    def _reads(self) -> Iterator[bytes]:
        while chunk := self.source.read(max(self.need, _STREAM_READ)):
            self.need -= len(chunk)
            yield chunk

    def fill(self, pos: int, need: int) -> int:
        held = max(0, len(self.buf) - pos) + (len(self.spill) - self.spill_at if self.spill is not None else 0)
        self.need = need - held  # read what the Python walker misses (at least a few KiB), no more
        try:
            return super().fill(pos, need)
        finally:
            self.need = 0

    def walk_direct(self, sink: Any, pos: int) -> tuple[int, bool, int, int] | None:
        """Let a sample sink's C walk read the descriptor from the header at ``pos`` (``scan_stream``),
        once every byte taken from the source is in ``buf`` (``None`` until then, or when the source
        cannot: a chunk's rest waiting in ``spill``, HTTPS...): ``(pos, whether it took members, last
        header, its size)``; what it received and did not walk becomes the window."""
        live = None if self.spill is not None else self.source.direct()
        if live is None:
            return None
        fd, left, timeout_ms = live
        here = self.base + pos
        tail_at, tail, after, last_at, last_size, received, timed_out = sink.scan_stream(
            fd, timeout_ms, left, _BATCH_BYTES, self.buf, pos, self.base
        )
        if received or timed_out:
            self.source.advance(received, timed_out)
        if tail is not None:
            self.buf, self.base = tail, tail_at
            pos = self.skip(0, after - tail_at)
        return pos, after != here, last_at, last_size


def iter_tar(chunks: Iterable[Buffer], path: str, *, with_data: bool = False) -> Iterator[Entry]:
    """Yield ``(name, header_offset, data_offset, size, data)`` for each regular member.

    ``chunks`` are consecutive pieces of the archive (a whole buffer, or
    blocks read from a stream). Offsets are absolute in the archive.
    ``data`` is the member's bytes with ``with_data``, else ``None``. Members
    are yielded in batches once their headers' checksums passed; the walk ends
    at the end-of-archive marker (input after it is not read).

    Raises:
        CorruptArchiveError: on a bad checksum, a malformed header, truncation
            (input that ends early) or a missing end-of-archive marker, naming
            ``path`` and the offset.
    """
    return _walk(_Cursor(chunks), str(path), with_data)


def iter_tar_file(fd: int, path: str, *, with_data: bool = False) -> Iterator[Entry]:
    """Like :func:`iter_tar` over an open file, reading headers with ``os.pread``; member data only
    ``with_data`` (a member larger than the 4 KiB window after a large one is one read of its own).

    Raises:
        CorruptArchiveError: see :func:`iter_tar`.
    """
    return _walk(_FileCursor(fd), str(path), with_data)


def index_tar(chunks: Iterable[Buffer], path: str, sink: Sink) -> None:
    """Walk an archive like :func:`iter_tar` (without data), handing each regular member to ``sink`` in order.

    Raises:
        CorruptArchiveError: see :func:`iter_tar`.
    """
    for _ in _walk(_Cursor(chunks), str(path), False, sink):
        pass


def index_tar_file(fd: int, path: str, sink: Sink) -> None:
    """:func:`index_tar` over an open file, like :func:`iter_tar_file`.

    Raises:
        CorruptArchiveError: see :func:`iter_tar`.
    """
    for _ in _walk(_FileCursor(fd), str(path), False, sink):
        pass


def group_tar(source: Iterable[Buffer] | int | Stream, path: str, sink: Any) -> Iterator[tuple[int, dict[str, Any]]]:
    """Walk an archive (chunks, an open file's descriptor, or a :class:`Stream`) with data, each member to ``sink`` (the C
    packer making sample dicts, see :class:`Sink`); yield the ``(sample offset, sample)`` it completes.

    Samples come out in batches, as :func:`iter_tar`'s members do: only once every
    header they depend on passed its checksum.

    Raises:
        CorruptArchiveError: see :func:`iter_tar`.
        DuplicateMemberError: two members of one sample have the same extension
            (after the samples before it).
    """
    cur: _Cursor | _FileCursor
    if isinstance(source, int):
        cur = _FileCursor(source)
    else:
        cur = _StreamCursor(source) if isinstance(source, Stream) else _Cursor(source)
    return _walk(cur, str(path), True, sink)  # type: ignore[return-value]  # a sample sink: samples come out


def _taken(sink: Any) -> Iterator[tuple[int, dict[str, Any]]]:
    """The samples a sample sink completed (its recorded error once they are out)."""
    offsets, samples = sink.take()
    while samples:
        yield from zip(offsets, samples)
        offsets, samples = sink.take()


def _walk(cur: _Cursor | _FileCursor, path: str, with_data: bool, sink: Sink | None = None) -> Iterator[Entry]:
    """The walk; with a ``sink``, members go to it and its ``scan`` takes plain headers (see :class:`Sink`).

    A table sink makes this yield nothing; a sample sink (``with_data``) makes it yield samples.
    """
    pending: list[Entry] = []
    blocks: list[bytes] = []
    block_offsets: list[int] = []
    held = 0  # data bytes in pending
    pos = 0
    start = -1  # absolute offset of the first header of the member being assembled
    long_name: str | None = None
    pax: dict[str, str] = {}
    global_pax: dict[str, str] = {}

    scan = _scan_headers
    sink_scan = getattr(sink, "scan", None) if _scan_headers is not None else None
    taking = with_data and sink is not None  # a sample sink: it completes samples, which this yields
    walk_direct = getattr(cur, "walk_direct", None) if sink_scan is not None and taking else None  # file, socket, pipe

    def fail(at: int, what: str) -> CorruptArchiveError:
        _verify(blocks, block_offsets, path)  # an earlier bad checksum explains more
        if blocks and block_offsets[-1] == at and not _checksum_ok(blocks[-1]):
            return _checksum_error(path, at, blocks[-1])
        return CorruptArchiveError(path, at, what)

    while True:
        buf = cur.buf
        if pos + BLOCK > len(buf):
            pos = cur.fill(pos, BLOCK)
            buf = cur.buf
            if pos < 0:
                here = cur.base
                if here == 0 and not len(buf):
                    raise CorruptArchiveError(path, 0, "empty file, not a tar archive")
                if not len(buf):
                    raise fail(here, "truncated archive: no end-of-archive marker")
                raise fail(here, f"truncated header ({len(buf)} of {BLOCK} bytes)")
        if scan is not None and start < 0 and not pax and not global_pax and long_name is None:
            moved = walk_direct(sink, pos) if walk_direct is not None else None
            if moved is not None:  # the sink read the file, socket or pipe itself, member data into its bytes
                pos, progressed, last_at, last_size = moved
                buf = cur.buf
                if progressed:
                    if pos < 0:
                        raise fail(last_at, f"truncated archive: member data needs {last_size} bytes, input ends at {cur.base}")
                    _verify(blocks, block_offsets, path)
                    blocks, block_offsets = [], []
                    yield from _taken(sink)  # type: ignore[misc]  # samples, from a sample sink
                    continue
                got: list[Entry] = []  # not one member: the header is the Python walker's
                after = pos
            elif sink_scan is not None:  # the sink packs the members itself
                got = []
                after, last_at, last_size = sink_scan(buf, pos, cur.base, _BATCH_BYTES)
            else:
                got, after, last_at, last_size = scan(buf, pos, cur.base, with_data, _BATCH_HEADERS)
            if after != pos:  # the C walk vouched for these headers (checksums included)
                pending += got
                if with_data:
                    held += sum(e[3] for e in got)
                pos = after
                if pos > len(buf):  # the last member's data runs past this window
                    here = cur.base + last_at
                    pos = cur.skip(pos, 0)
                    if pos < 0:
                        raise fail(here, f"truncated archive: member data needs {last_size} bytes, input ends at {cur.base}")
                if len(pending) >= _BATCH_HEADERS or held >= _BATCH_BYTES or taking:
                    _verify(blocks, block_offsets, path)
                    yield from pending
                    pending, blocks, block_offsets, held = [], [], [], 0
                    if taking:
                        yield from _taken(sink)  # type: ignore[misc]  # samples, from a sample sink
                continue
        hdr = buf[pos : pos + BLOCK]
        here = cur.base + pos
        if hdr == _ZERO_BLOCK:
            if start >= 0:
                raise fail(start, "extension header without a following member")
            break
        blocks.append(hdr)
        block_offsets.append(here)
        typ = hdr[156]
        try:
            size = int(hdr[124:135], 8) if hdr[135] in _TERMINATORS else _number(hdr[124:136])
        except ValueError:
            try:
                size = _number(hdr[124:136])
            except ValueError as exc:
                raise fail(here, f"bad size field {hdr[124:136]!r}") from exc
        if start < 0:
            start = here
        pos += BLOCK
        if typ in _EXTENSIONS:
            if pos + size > len(buf):
                pos = cur.fill(pos, size)
                buf = cur.buf
                if pos < 0:
                    raise fail(here, f"truncated archive: extension header data needs {size} bytes")
            payload = buf[pos : pos + size]
            if typ == _PAX:
                pax = _parse_pax(payload, path, here)
            elif typ == _PAX_GLOBAL:
                global_pax.update(_parse_pax(payload, path, here))
                start = -1
            elif typ == _GNU_LONGNAME:
                long_name = _decode_name(payload.split(b"\x00", 1)[0])
            pos = cur.skip(pos, (size + BLOCK - 1) & ~(BLOCK - 1))
            if pos < 0:
                raise fail(here, f"truncated archive: extension header data needs {size} bytes")
            continue
        if pax or global_pax:
            merged = {**global_pax, **pax}
            if "size" in merged:
                try:
                    size = int(merged["size"])
                except ValueError as exc:
                    raise fail(start, f"bad PAX size {merged['size']!r}") from exc
        else:
            merged = pax
        data_offset = cur.base + pos
        data: bytes | None = None
        if with_data and typ in _REGULAR:
            if pos + size > len(buf):
                pos = cur.fill(pos, size)  # the same absolute data_offset, in a new window
                buf = cur.buf
                if pos < 0:
                    raise fail(here, f"truncated archive: member data needs {size} bytes, input ends at {cur.base + len(buf)}")
            data = buf[pos : pos + size]
            held += size
        if typ in _REGULAR:
            if "path" in merged:
                name = merged["path"]
            elif long_name is not None:
                name = long_name
            else:
                nul = hdr.find(b"\x00", 0, 100)
                name = hdr[: nul if nul >= 0 else 100].decode("utf-8", "surrogateescape")
                if hdr[345] and hdr[257:263] == _POSIX_MAGIC:
                    name = _decode_name(hdr[345:500].split(b"\x00", 1)[0]) + "/" + name
            if merged and any(k.startswith("GNU.sparse.") for k in merged):
                log.warning("%s: skipping GNU sparse member %r at offset %d", path, name, start)
            elif sink is not None:  # in order with the members the sink's scan took
                sink.add(name, start, data_offset, size, *((data,) if taking else ()))  # a sample sink takes the data too
            else:
                pending.append((name, start, data_offset, size, data))
        elif typ == _SPARSE:
            log.warning("%s: skipping GNU sparse member at offset %d", path, start)
        padded = (size + BLOCK - 1) & ~(BLOCK - 1)
        if pos + padded <= len(buf):
            pos += padded
        else:
            pos = cur.skip(pos, padded)
        if pos < 0:
            raise fail(here, f"truncated archive: member data needs {size} bytes, input ends at {cur.base}")
        start = -1
        long_name = None
        if pax:
            pax = {}
        if len(blocks) >= _BATCH_HEADERS or held >= _BATCH_BYTES:
            _verify(blocks, block_offsets, path)
            yield from pending
            pending, blocks, block_offsets, held = [], [], [], 0
            if taking:
                yield from _taken(sink)  # type: ignore[misc]  # samples, from a sample sink
    _verify(blocks, block_offsets, path)
    yield from pending
    if taking:
        sink.finish()  # type: ignore[union-attr]  # a sample sink
        yield from _taken(sink)  # type: ignore[misc]


def scan_tar(buf: Buffer, path: str) -> Iterator[tuple[str, int, int, int]]:
    """Yield ``(name, header_offset, data_offset, size)`` for each regular member of a whole buffer.

    Raises:
        CorruptArchiveError: see :func:`iter_tar`.
    """
    for name, header_offset, offset, size, _ in iter_tar((buf,), path):
        yield name, header_offset, offset, size


def iter_members(buf: Buffer, path: str) -> Iterator[Member]:
    """Yield a :class:`Member` for each regular member of a whole buffer.

    Raises:
        CorruptArchiveError: see :func:`iter_tar`.
    """
    for name, header_offset, offset, size, _ in iter_tar((buf,), path):
        yield Member(name, header_offset, offset, size)
