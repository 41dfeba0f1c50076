"""Tar header parsing: bytes -> member records (ustar, GNU, PAX).

One parser, two drivers. :func:`iter_tar` walks an archive given as an
iterable of consecutive chunks: a single ``mmap`` of a whole shard (indexing,
never copied) or 1-4 MiB blocks from a pipe, a socket or a decompressor
(streaming). Python's :mod:`tarfile` is the test oracle, not the hot path.

What is a member: regular files (type ``0``, NUL and ``7``). Directories,
symbolic and hard links, devices and FIFOs are skipped silently, and their data is absent
whatever their size field says (as :mod:`tarfile` and Go's ``archive/tar`` read them: a hard
link's header may carry its target's size). GNU sparse members (old GNU type ``S``, whose
extension blocks of sparse entries follow the header, and PAX sparse formats 0.0, 0.1 and 1.0,
``GNU.sparse.*`` records) are skipped with a logged warning, since their data is not stored
contiguously: the walk goes on after their stored bytes.

Nothing in a header is trusted before its checksum is verified (extension headers
included), and every size is checked before it is used: numbers are read as GNU tar
reads them (octal digits after optional blanks, ended by NUL or a blank; GNU base-256;
PAX sizes in decimal digits only), a size must fit in the file's remaining bytes, or, for
a source of unknown length, be at most :data:`MAX_MEMBER_SIZE`; a ``max_member_size`` given
bounds every member of every source. Member data is then gathered as it arrives. PAX (``x``, ``g``: ``path`` and ``size``
applied, other records accepted and ignored) and GNU (``L``, ``K``) extension headers
before one member are applied as :mod:`tarfile` applies them. Anything else is a
:class:`~tarindex.errors.CorruptArchiveError` naming the shard and the header's offset, and so is
an archive that ends without its end-of-archive marker (a zero block), unless the caller allows
that (``allow_missing_end``: archives written without the marker).
"""

from __future__ import annotations

import io
import logging
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from . import _native
from .errors import CorruptArchiveError, shown

__all__: list[str] = []  # internal module: its names serve the package, the public API is tarindex.__all__

BLOCK = 512
_ZERO_BLOCK = bytes(BLOCK)
_REGULAR = frozenset(b"0\x007")
_HEADER_ONLY = frozenset(b"123456")  # links, devices, directories, FIFOs: no data, whatever the size field says
_SPARSE = ord("S")
_SPARSE_EXTENDED = 482  # old GNU sparse header: nonzero when extension blocks of sparse entries follow it
_EXTENSION_EXTENDED = 504  # the same flag in each extension block (after its 21 entries of 24 bytes)
_PAX = ord("x")
_PAX_GLOBAL = ord("g")
_GNU_LONGNAME = ord("L")
_GNU_LONGLINK = ord("K")
_EXTENSIONS = frozenset((_PAX, _PAX_GLOBAL, _GNU_LONGNAME, _GNU_LONGLINK))
_POSIX_MAGIC = b"ustar\x00"
_BATCH_HEADERS = 1024  # headers per call of the C walk
_BATCH_BYTES = 16 << 20  # member data the C walk takes per call (with_data) from chunks (decompressors, reader threads)
_DIRECT_BATCH_BYTES = 1 << 20  # the same when it reads a file, socket or pipe itself: what two streams read in turn hold stays in cache (docs/performance.md)
_WINDOW = 64 << 10
_SMALL_WINDOW = 8 << 10  # a sample's small members with a PAX header each fit
_SIZE_MAX = (1 << 63) - 1
_CHAIN = 8 << 10  # a member's extension headers the C walk is helped to see in one window
_ASSEMBLE = 1 << 20  # bytes from several chunks, from this many on: assembled in one buffer (_Assembly), not joined

_NO_END = "truncated archive: no end-of-archive marker"
_NO_END_HINT = " (to read an archive written without one: allow_missing_end=True, --allow-missing-end)"

MAX_MEMBER_SIZE = 8 << 30
"""The largest member (or extension header) accepted from a source whose length is not known
(a pipe, a socket, decompressed chunks) unless a ``max_member_size`` is given: 8 GiB. A header
that claims more is a :class:`~tarindex.errors.CorruptArchiveError` before anything is allocated
for it. A local file needs no such bound by default: a member must fit in the bytes the file has."""

# GNU tar's reading of an octal field (list.c from_header): one leading NUL allowed, then blanks,
# then octal digits, ended by the field's end, a NUL or a blank; no signs, no underscores
_OCTAL = re.compile(rb"\x00?[ \t\n\v\f\r]*([0-7]*)([\x00 \t\n\v\f\r]|\Z)")
_PAX_LENGTH = re.compile(rb"([0-9]+) ")
_DIGITS = re.compile(r"[0-9]+")

log = logging.getLogger(__name__)

# the common case of the walk in C; _walk below is the reference and handles everything else

Entry = tuple[str, int, int, int, "bytes | None"]
"""``(name, header_offset, data_offset, size, data)`` of one regular member."""


class Buffer(Protocol):
    """Anything sliceable to bytes with a length: ``bytes``, ``mmap``."""

    def __len__(self) -> int: ...
    def __getitem__(self, key: slice) -> bytes: ...


class Sink(Protocol):
    """Where :func:`index_tar` puts each regular member (:class:`tarindex.grouping.Packer`).

    A sink may also have ``scan(buf, pos, base[, limit[, max_member]]) -> (pos, last_header, last_size)``
    (the C packer): it then walks runs of plain headers itself, as the C walk
    ``scan_headers`` does, and takes their members without Python objects.
    A sink for :func:`group_tar` takes each member's bytes too (a fifth argument
    to ``add``), has ``take()`` for the samples it completed, ``finish()``,
    and ``scan_file(fd, offset, size, limit, buf, pos[, max_member]) -> (offset, last_header, last_size)``
    (``max_member``: members larger are left to the Python walker, which names the error).
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



def _octal(field: bytes) -> int | None:
    """An octal header field as GNU tar reads it, or ``None`` if it is malformed (all blank included)."""
    m = _OCTAL.match(field)
    if m is None:
        return None
    digits = m.group(1)
    if not digits:
        return 0 if m.group(2) else None  # a NUL after the blanks is 0; blanks to the end are an error
    return int(digits, 8)


def _number(field: bytes) -> int | None:
    """A numeric header field: octal, or GNU base-256 (first byte 0x80); ``None`` if malformed or negative."""
    if field[0] & 0x80:
        if field[0] != 0x80:  # 0xFF: a negative number; anything else is not a number
            return None
        return int.from_bytes(field[1:], "big")
    return _octal(field)


def _padded(size: int) -> int:
    return (size + BLOCK - 1) & ~(BLOCK - 1)


def _decode_name(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def _checksum_error(path: str, pos: int, block: bytes) -> CorruptArchiveError:
    expected = sum(block) - sum(block[148:156]) + 8 * 32
    raw = block[148:156].split(b"\x00", 1)[0].strip()
    text = raw.decode("ascii", "replace")
    got = (text if text.isprintable() else repr(raw)) or "empty"  # one line, whatever the bytes
    return CorruptArchiveError(
        path, pos, f"bad header checksum (expected {expected:o}, got {got}); not a tar archive or corrupt"
    )


def _verified(block: bytes, path: str, pos: int) -> tuple[int, int]:
    """The type and size of a header block, once its checksum is verified (before any other field is used).

    Raises:
        CorruptArchiveError: a bad checksum, or a size field that is malformed or negative.
    """
    stored = _octal(block[148:156])
    field = sum(block[148:156])
    unsigned = sum(block) - field + 8 * 32
    if stored != unsigned:
        high = sum(1 for b in block if b & 0x80) - sum(1 for b in block[148:156] if b & 0x80)
        if stored is None or stored != unsigned - 256 * high:  # some old writers summed signed chars
            raise _checksum_error(path, pos, block)
    size = _number(block[124:136])
    if size is None or size > _SIZE_MAX:
        raise CorruptArchiveError(path, pos, f"bad size field {block[124:136]!r} (expected octal digits or base-256)")
    return block[156], size


def _parse_pax(data: bytes, path: str, offset: int) -> dict[str, str]:
    """Parse PAX extended header records ``"<len> <key>=<value>\\n"`` (trailing NUL padding allowed).

    A record whose length ends it right after the ``=`` (an empty value without its newline, as
    some writers make it) is read as :mod:`tarfile` reads it: an empty value.

    Raises:
        CorruptArchiveError: a record whose length is not decimal digits followed by a space, that
            runs past the header's data, has no ``=`` or empty key, or (with a value) does not end with
            a newline; a ``size`` that is not decimal digits.
    """
    out: dict[str, str] = {}
    pos = 0
    end = len(data)
    while pos < end and data[pos]:
        m = _PAX_LENGTH.match(data, pos)
        length = int(m.group(1)) if m is not None else 0
        stop = pos + length
        if m is None or stop > end or stop <= m.end():
            raise CorruptArchiveError(path, offset, f"malformed PAX extended header record at byte {pos} of its data")
        eq = data.find(b"=", m.end(), stop)
        if eq <= m.end() or (data[stop - 1] != 0x0A and eq != stop - 1):
            raise CorruptArchiveError(path, offset, f"malformed PAX extended header record at byte {pos} of its data")
        out[_decode_name(data[m.end() : eq])] = _decode_name(data[eq + 1 : stop - 1])
        pos = stop
    if "size" in out:
        _pax_size(out["size"], path, offset)
    return out


def _pax_size(value: str, path: str, offset: int) -> int:
    """A PAX ``size`` record: decimal digits only (GNU tar rejects signs, blanks and underscores).

    Raises:
        CorruptArchiveError: not decimal digits, or over 2**63 - 1.
    """
    if _DIGITS.fullmatch(value) is None or len(value.lstrip("0")) > 19 or int(value) > _SIZE_MAX:
        raise CorruptArchiveError(path, offset, f"bad PAX size {value!r} (expected decimal digits)")
    return int(value)


def _member_name(hdr: bytes) -> str:
    """The name in a header: ``name``, after the ustar ``prefix`` when the magic is POSIX's."""
    nul = hdr.find(b"\x00", 0, 100)
    name = hdr[: nul if nul >= 0 else 100].decode("utf-8", "surrogateescape")
    if hdr[345] and hdr[257:263] == _POSIX_MAGIC:
        name = _decode_name(hdr[345:500].split(b"\x00", 1)[0]) + "/" + name
    return name


def _is_regular(hdr: bytes, typ: int) -> bool:
    """A regular file: type ``0``, ``7`` or NUL, except a NUL-type name ending in ``/`` (an old-style directory)."""
    if typ not in _REGULAR:
        return False
    if typ:
        return True
    nul = hdr.find(b"\x00", 0, 100)
    end = nul if nul >= 0 else 100
    return end == 0 or hdr[end - 1] != 0x2F


@dataclass(slots=True)
class _Extended:
    """Extension headers seen before a member: applied as :mod:`tarfile` applies them."""

    start: int = -1
    """Offset of the first header of the member being assembled (-1: none yet)."""
    local: list[tuple[int, Any]] = field(default_factory=list)
    """``(type, PAX records or GNU long name)`` of each local extension header, in order."""
    glob: dict[str, str] = field(default_factory=dict)
    """The global PAX records so far."""

    def apply(self, name: str, size: int) -> tuple[str, int, bool]:
        """The member's name and size once the extension headers are applied, and whether a PAX record
        marks it GNU sparse.

        :mod:`tarfile` applies the global records to the member, then each local extension header
        from the last to the first (a PAX header with the global records under its own), so the
        first header that sets a field wins; GNU tar agrees wherever a shard has one header of each kind.
        """
        sparse = False
        layers: list[tuple[int, Any]] = [(_PAX, self.glob)] if self.glob else []
        layers += [(typ, {**self.glob, **v} if typ == _PAX else v) for typ, v in reversed(self.local)]
        for typ, value in layers:
            if typ == _PAX:
                sparse = sparse or any(k.startswith("GNU.sparse.") for k in value)
                if "path" in value:
                    name = value["path"]
                if "GNU.sparse.name" in value:  # PAX sparse 1.0: the real name (the header holds GNUSparseFile.N/...)
                    name = value["GNU.sparse.name"]
                if "size" in value:
                    size = int(value["size"])  # digits: checked by _parse_pax
            elif typ == _GNU_LONGNAME:
                name = value
        return name, size, sparse


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
        """Make ``buf[pos:pos + need]`` available; return the new ``pos`` (-1 if the input ends first).

        Bytes from several chunks are joined; ``need`` of :data:`_ASSEMBLE` or more (a large member)
        is assembled in one buffer as its pieces arrive, never more than arrived, and handed out
        as ``bytes`` without another copy (:class:`_Assembly`).
        """
        parts: list[Buffer] = [self.buf[pos:]] if pos < len(self.buf) else []
        have = len(parts[0]) if parts else 0
        self.base += pos
        whole: _Assembly | None = None
        while have < need:
            nxt = self._next()
            if nxt is None:
                break
            chunk, at = nxt
            if not parts and whole is None and len(chunk) - at >= need:  # nothing carried over: the chunk itself
                self.buf = chunk
                self.base -= at
                return at
            take = need - have
            piece: Buffer
            if len(chunk) - at > take:
                piece = chunk[at : at + take]
                self.spill, self.spill_at = chunk, at + take
            else:
                piece = chunk[at:] if at else chunk
            have += len(piece)
            if whole is None and need >= _ASSEMBLE and parts:  # a second piece of a large member
                whole = _Assembly(parts)
                parts = []
            if whole is not None:
                whole.add(piece)
            else:
                parts.append(piece)
        if whole is not None:
            self.buf = whole.take()
        else:
            self.buf = parts[0] if len(parts) == 1 else b"".join(parts)  # type: ignore[arg-type]  # bytes-like parts
        return 0 if have >= need else -1

    def room(self, pos: int) -> int | None:
        """Bytes the input holds from ``pos`` on, when known (``None``: chunks of unknown total length)."""
        return None

    def extend(self, pos: int, need: int) -> int:
        """:meth:`fill` (a file cursor reads a window no larger than the last)."""
        return self.fill(pos, need)

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


class _Assembly:
    """A large member's bytes, assembled as its pieces arrive: one buffer that grows with what came
    (``io.BytesIO``: realloc, which moves pages rather than copying them for large buffers), handed out
    by :meth:`take` as the buffer itself (``getvalue()`` returns its bytes object without a copy when
    nothing else holds a view of it). Peak memory: the member, not the member twice (pieces plus a
    joined copy), and never more than the input delivered, whatever size a header claims."""

    __slots__ = ("out",)

    def __init__(self, parts: Iterable[Buffer]) -> None:
        self.out = io.BytesIO()
        for part in parts:
            self.out.write(part)  # type: ignore[arg-type]  # bytes-like parts

    def add(self, piece: Buffer) -> None:
        self.out.write(piece)  # type: ignore[arg-type]  # bytes-like piece

    def take(self) -> bytes:
        data = self.out.getvalue()
        self.out = io.BytesIO()
        return data


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

    def extend(self, pos: int, need: int) -> int:
        """Like :meth:`fill`, in a window no larger than the last one (when it held a member's headers in part)."""
        self.base += pos
        self.buf = os.pread(self.fd, max(need, len(self.buf) - pos), self.base)
        return 0 if len(self.buf) >= need else -1

    def room(self, pos: int) -> int:
        """Bytes the file holds from ``pos`` on."""
        return self.size - self.base - pos

    def seek(self, offset: int) -> int:
        """Go to ``offset`` in the file (read nothing yet); return the new ``pos``."""
        self.base, self.buf, self.large = offset, b"", False
        return 0

    def walk_direct(self, sink: Any, pos: int, bound: int) -> tuple[int, bool, int, int]:
        """Let a sample sink's C walk read the file from the header at ``pos`` (``scan_file``, members
        up to ``bound`` bytes): ``(pos, whether it took members, last header, its size)``."""
        here = self.base + pos
        after, last_at, last_size = sink.scan_file(self.fd, here, self.size, _DIRECT_BATCH_BYTES, self.buf, pos, bound)
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
class DirectArchive:
    """A :class:`DirectSource` to walk, and the bytes already read from it."""

    source: DirectSource
    """Where the rest comes from."""
    first: bytes
    """The archive's first bytes."""


_STREAM_READ = 4 << 10  # the Python walker's smallest read of a DirectArchive (a header and a bit): the C walk takes the rest


def direct_chunks(stream: DirectArchive) -> Iterator[bytes]:
    """A :class:`DirectArchive`'s bytes as chunks (for walkers that do not read descriptors)."""
    if stream.first:
        yield stream.first
    while chunk := stream.source.read(256 * _STREAM_READ):
        yield chunk


class _DirectCursor(_Cursor):
    """A :class:`_Cursor` over a :class:`DirectArchive` whose descriptor the C walk may read too (:meth:`walk_direct`)."""

    __slots__ = ("need", "source")

    def __init__(self, stream: DirectArchive) -> None:
        super().__init__(self._reads())
        self.buf = stream.first
        self.source = stream.source
        self.need = 0

    def _reads(self) -> Iterator[bytes]:
        while chunk := self.source.read(min(max(self.need, _STREAM_READ), _BATCH_BYTES)):  # a read allocates its size first
            self.need -= len(chunk)
            yield chunk

    def fill(self, pos: int, need: int) -> int:
        held = max(0, len(self.buf) - pos) + (len(self.spill) - self.spill_at if self.spill is not None else 0)
        self.need = need - held  # read what the Python walker misses (at least a few KiB), no more
        try:
            return super().fill(pos, need)
        finally:
            self.need = 0

    def walk_direct(self, sink: Any, pos: int, bound: int) -> tuple[int, bool, int, int] | None:
        """Let a sample sink's C walk read the descriptor from the header at ``pos`` (``scan_fd``,
        members up to ``bound`` bytes),
        once every byte taken from the source is in ``buf`` (``None`` until then, or when the source
        cannot: a chunk's rest waiting in ``spill``, HTTPS...): ``(pos, whether it took members, last
        header, its size)``; what it received and did not walk becomes the window."""
        live = None if self.spill is not None else self.source.direct()
        if live is None:
            return None
        fd, left, timeout_ms = live
        here = self.base + pos
        tail_at, tail, after, last_at, last_size, received, timed_out = sink.scan_fd(
            fd, timeout_ms, left, _DIRECT_BATCH_BYTES, self.buf, pos, self.base, bound
        )
        if received or timed_out:
            self.source.advance(received, timed_out)
        if tail is not None:
            self.buf, self.base = tail, tail_at
            pos = self.skip(0, after - tail_at)
        return pos, after != here, last_at, last_size


def iter_tar(
    chunks: Iterable[Buffer],
    path: str,
    *,
    with_data: bool = False,
    max_member_size: int | None = None,
    allow_missing_end: bool = False,
) -> Iterator[Entry]:
    """Yield ``(name, header_offset, data_offset, size, data)`` for each regular member.

    ``chunks`` are consecutive pieces of the archive (a whole buffer, or
    blocks read from a stream). Offsets are absolute in the archive.
    ``data`` is the member's bytes with ``with_data``, else ``None``. A member
    is yielded once every header it depends on passed its checksum; the walk ends
    at the end-of-archive marker (input after it is not read). A member or
    extension header larger than ``max_member_size`` (default :data:`MAX_MEMBER_SIZE`) is an
    error, raised before anything is allocated for it. ``allow_missing_end``: input that ends
    where a header would start ends the walk (an archive written without its end-of-archive marker);
    by default that is an error, since a shard cut at a member boundary would lose its last members.

    Raises:
        CorruptArchiveError: on a bad checksum, a malformed header or number, a size
            over ``max_member_size``, truncation (input that ends early) or a missing
            end-of-archive marker, naming ``path`` and the offset.
    """
    return _walk(_Cursor(chunks), str(path), with_data, None, max_member_size, allow_missing_end)


class _GlobalSink:
    """A sink that keeps only the global PAX headers a walk meets (:func:`global_records`)."""

    def __init__(self) -> None:
        self.found: list[tuple[int, dict[str, str]]] = []

    def add(self, *member: Any) -> None:
        pass

    def on_global(self, offset: int, records: dict[str, str]) -> None:
        self.found.append((offset, records))


def global_records(chunks: Iterable[Buffer], path: str) -> list[tuple[int, dict[str, str]]]:
    """Each global PAX header in the archive's ``chunks`` (which may stop at any header boundary): its offset
    and the global records in effect after it (they apply to every later member, as :mod:`tarfile` reads them).

    Raises:
        CorruptArchiveError: as :func:`iter_tar`.
    """
    sink = _GlobalSink()
    for _ in _walk(_Cursor(chunks), str(path), False, sink, None, True):
        pass
    return sink.found


def iter_tar_file(
    fd: int, path: str, *, with_data: bool = False, max_member_size: int | None = None, allow_missing_end: bool = False
) -> Iterator[Entry]:
    """Like :func:`iter_tar` over an open file, reading headers with ``os.pread``; member data only
    ``with_data`` (a member larger than the 4 KiB window after a large one is one read of its own).
    Members must fit in the file; with ``max_member_size``, also under it.

    Raises:
        CorruptArchiveError: see :func:`iter_tar`.
    """
    return _walk(_FileCursor(fd), str(path), with_data, None, max_member_size, allow_missing_end)


def index_tar(
    chunks: Iterable[Buffer], path: str, sink: Sink, *, max_member_size: int | None = None, allow_missing_end: bool = False
) -> None:
    """Walk an archive like :func:`iter_tar` (without data), handing each regular member to ``sink`` in order.

    Raises:
        CorruptArchiveError: see :func:`iter_tar`.
    """
    for _ in _walk(_Cursor(chunks), str(path), False, sink, max_member_size, allow_missing_end):
        pass


def index_tar_file(
    fd: int, path: str, sink: Sink, *, max_member_size: int | None = None, allow_missing_end: bool = False
) -> None:
    """:func:`index_tar` over an open file, like :func:`iter_tar_file`.

    Raises:
        CorruptArchiveError: see :func:`iter_tar`.
    """
    for _ in _walk(_FileCursor(fd), str(path), False, sink, max_member_size, allow_missing_end):
        pass


def group_tar(
    source: Iterable[Buffer] | int | DirectArchive,
    path: str,
    sink: Any,
    *,
    max_member_size: int | None = None,
    allow_missing_end: bool = False,
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Walk an archive (chunks, an open file's descriptor, or a :class:`DirectArchive`) with data, each member to ``sink`` (the C
    packer making sample dicts, see :class:`Sink`); yield the ``(sample offset, sample)`` it completes.

    Samples come out in batches, only once every header they depend on passed its checksum.
    ``max_member_size`` bounds every member (default: :data:`MAX_MEMBER_SIZE` for a source of unknown
    length, chunks or a :class:`DirectArchive`; a file's own size for a file); ``allow_missing_end``: see
    :func:`iter_tar`.

    Raises:
        CorruptArchiveError: see :func:`iter_tar`.
        DuplicateMemberError: two members of one sample have the same extension
            (after the samples before it).
    """
    cur: _Cursor | _FileCursor
    if isinstance(source, int):
        cur = _FileCursor(source)
    else:
        cur = _DirectCursor(source) if isinstance(source, DirectArchive) else _Cursor(source)
    return _flushed(_walk(cur, str(path), True, sink, max_member_size, allow_missing_end), sink)


def _flushed(walk: Iterator[Any], sink: Any) -> Iterator[tuple[int, dict[str, Any]]]:
    """A sample walk that, when it fails, first hands out the samples completed before the failure
    (every header they depend on was verified), as the reference does."""
    try:
        yield from walk
    except CorruptArchiveError:
        yield from _taken(sink)
        raise


def _taken(sink: Any) -> Iterator[tuple[int, dict[str, Any]]]:
    """The samples a sample sink completed (its recorded error once they are out)."""
    offsets, samples = sink.take()
    while samples:
        yield from zip(offsets, samples)
        offsets, samples = sink.take()


def _check_size(
    cur: _Cursor | _FileCursor, path: str, here: int, pos: int, size: int, limit: int | None, name: str | None = None
) -> None:
    """Refuse a size before anything is read or allocated for it: past a file's end, or over ``limit``
    (``None``: :data:`MAX_MEMBER_SIZE` for a source of unknown length, no bound but the file's for a file).

    Raises:
        CorruptArchiveError: naming the header at ``here`` (and the member's ``name``, once known).
    """
    room = cur.room(pos)
    if room is not None and size > room:
        raise CorruptArchiveError(path, here, f"truncated archive: member data needs {size} bytes, input ends at {cur.base + pos + room}")
    if limit is None and room is None:
        limit = MAX_MEMBER_SIZE
    if limit is not None and size > limit:
        what = "extension header" if name is None else f"member {shown(name)}"
        raise CorruptArchiveError(
            path, here, f"{what} of {size} bytes is over max_member_size ({limit} bytes); to accept it, raise max_member_size= (--max-member-size)"
        )


def _past_sparse_blocks(cur: _Cursor | _FileCursor, path: str, start: int, pos: int) -> int:
    """Pass the extension blocks that follow an old GNU sparse header at ``pos`` (21 sparse entries each,
    then a flag saying whether another block follows), as GNU tar and :mod:`tarfile` read them: the
    ``pos`` of the member's stored data.

    Raises:
        CorruptArchiveError: the input ends inside the blocks (naming the member's header at ``start``).
    """
    while True:
        if pos + BLOCK > len(cur.buf):
            pos = cur.fill(pos, BLOCK)
            if pos < 0:
                raise CorruptArchiveError(path, start, "truncated archive: the input ends inside a GNU sparse member's extension blocks")
        more = cur.buf[pos + _EXTENSION_EXTENDED : pos + _EXTENSION_EXTENDED + 1] != b"\x00"
        pos += BLOCK
        if not more:
            return pos


def _walk(
    cur: _Cursor | _FileCursor,
    path: str,
    with_data: bool,
    sink: Any = None,
    limit: int | None = None,
    allow_missing_end: bool = False,
) -> Iterator[Any]:
    """The walk; with a ``sink``, members go to its ``add`` (and its ``scan``, if it has one, takes runs of
    plain headers, see :class:`Sink`). Every header's checksum is verified before any of its fields is used,
    and every size is checked (:func:`_check_size`) before it is used.

    A table sink makes this yield nothing; a sample sink (``with_data``) makes it yield samples.
    ``allow_missing_end``: input that ends where a header would start ends the walk as the
    end-of-archive marker would (else it is an error).
    """
    pos = 0
    ext = _Extended()
    taking = with_data and sink is not None  # a sample sink: it completes samples, which this yields
    sink_scan = getattr(sink, "scan", None)
    speedups = _native.SPEEDUPS
    scan = speedups.scan_headers if sink_scan is None and speedups is not None else None
    walk_direct = getattr(cur, "walk_direct", None) if taking and hasattr(sink, "scan_file") else None  # file, socket, pipe
    add = getattr(sink, "add", None)
    on_global = getattr(sink, "on_global", None)  # told each global PAX header's offset and the records in effect after it
    added = held = 0  # members and data bytes given to a sample sink since its last take()
    stalled = -1  # where the C walk last stopped short of the window's end
    bound = MAX_MEMBER_SIZE if limit is None else limit  # the C walks leave larger members to _check_size

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
                    if allow_missing_end and ext.start < 0:
                        break
                    raise CorruptArchiveError(path, here, _NO_END + (_NO_END_HINT if ext.start < 0 else ""))
                raise CorruptArchiveError(path, here, f"truncated header ({len(buf)} of {BLOCK} bytes)")
        if ext.start < 0 and not ext.glob and (scan is not None or sink_scan is not None):
            moved = walk_direct(sink, pos, bound) if walk_direct is not None else None
            if moved is not None:  # the sink read the file, socket or pipe itself, member data into its bytes
                pos, progressed, last_at, last_size = moved
                buf = cur.buf
                if progressed:
                    if pos < 0:
                        raise CorruptArchiveError(path, last_at, f"truncated archive: member data needs {last_size} bytes, input ends at {cur.base}")
                    added = held = 0
                    yield from _taken(sink)
                    continue
                after = pos  # not one member: the header is the Python walker's
            elif sink_scan is not None:  # the sink packs the members itself
                after, last_at, last_size = sink_scan(buf, pos, cur.base, _BATCH_BYTES, bound)
            else:
                got, after, last_at, last_size = scan(buf, pos, cur.base, with_data, _BATCH_HEADERS)  # type: ignore[misc]  # scan is set
                if bound < MAX_MEMBER_SIZE and any(e[3] > bound for e in got):  # from that member on, the Python walker's
                    over = next(i for i, e in enumerate(got) if e[3] > bound)
                    after = got[over][1] - cur.base
                    got = got[:over]
                if add is None:
                    yield from got
                else:
                    for e in got:
                        add(*e[:4], *((e[4],) if taking else ()))
                        added += 1
                        held += e[3]
            if after != pos:  # the C walk verified these headers
                pos = after
                if pos > len(buf):  # the last member's data runs past this window
                    here = cur.base + last_at
                    pos = cur.skip(pos, 0)
                    if pos < 0:
                        raise CorruptArchiveError(path, here, f"truncated archive: member data needs {last_size} bytes, input ends at {cur.base}")
                if taking:
                    added = held = 0
                    yield from _taken(sink)
                continue
            if len(buf) - pos < _CHAIN and cur.base + pos != stalled:  # a member's headers across the window's end:
                stalled = cur.base + pos  # bring them into one window (once) and let the C walk try again
                filled = cur.extend(pos, len(buf) - pos + _CHAIN)
                pos = max(filled, 0)  # at the input's end, every byte left is in the window
                continue
        hdr = buf[pos : pos + BLOCK]
        here = cur.base + pos
        if hdr == _ZERO_BLOCK:
            if ext.start >= 0:
                raise CorruptArchiveError(path, ext.start, "extension header without a following member")
            break
        typ, size = _verified(hdr, path, here)
        pos += BLOCK
        if typ in _EXTENSIONS:
            if ext.start < 0 and typ != _PAX_GLOBAL:
                ext.start = here
            _check_size(cur, path, here, pos, size, limit)
            if pos + size > len(buf):
                pos = cur.fill(pos, size)
                buf = cur.buf
                if pos < 0:
                    raise CorruptArchiveError(path, here, f"truncated archive: extension header data needs {size} bytes")
            payload = buf[pos : pos + size]
            if typ == _PAX:
                ext.local.append((typ, _parse_pax(payload, path, here)))
            elif typ == _PAX_GLOBAL:
                ext.glob.update(_parse_pax(payload, path, here))
                if on_global is not None:
                    on_global(here, dict(ext.glob))
            elif typ == _GNU_LONGNAME:
                ext.local.append((typ, _decode_name(payload.split(b"\x00", 1)[0])))
            pos = cur.skip(pos, _padded(size))
            if pos < 0:
                raise CorruptArchiveError(path, here, f"truncated archive: extension header data needs {size} bytes")
            continue
        start = here if ext.start < 0 else ext.start
        name = _member_name(hdr)
        sparse = typ == _SPARSE
        if ext.local or ext.glob:
            name, size, sparse_pax = ext.apply(name, size)
            sparse = sparse or sparse_pax
        regular = _is_regular(hdr, typ)
        if typ in _HEADER_ONLY or not (typ or regular):  # links, devices, directories, FIFOs: no data, as tarfile reads them
            size = 0
        elif typ == _SPARSE and hdr[_SPARSE_EXTENDED]:  # old GNU sparse: its extension blocks, then its data
            pos = _past_sparse_blocks(cur, path, start, pos)
            buf = cur.buf
        _check_size(cur, path, start, pos, size, limit, name)
        data_offset = cur.base + pos
        data: bytes | None = None
        if with_data and regular and not sparse:
            if pos + size > len(buf):
                pos = cur.fill(pos, size)  # the same absolute data_offset, in a new window
                buf = cur.buf
                if pos < 0:
                    raise CorruptArchiveError(path, start, f"truncated archive: member data needs {size} bytes, input ends at {cur.base + len(buf)}")
            data = buf[pos : pos + size]
        if sparse:
            log.warning("%s: skipping GNU sparse member %r at offset %d", path, name, start)
        elif regular:
            if add is None:
                yield name, start, data_offset, size, data
            else:  # in order with the members the sink's scan took; a sample sink takes the data too
                add(name, start, data_offset, size, *((data,) if taking else ()))
                added += 1
                held += size
        padded = _padded(size)
        pos = pos + padded if pos + padded <= len(buf) else cur.skip(pos, padded)
        if pos < 0:
            raise CorruptArchiveError(path, start, f"truncated archive: member data needs {size} bytes, input ends at {cur.base}")
        ext.start = -1
        if ext.local:
            ext.local = []
        if taking and (added >= _BATCH_HEADERS or held >= _BATCH_BYTES):
            added = held = 0
            yield from _taken(sink)
    if taking:
        sink.finish()
        yield from _taken(sink)


def iter_members(buf: Buffer, path: str) -> Iterator[Member]:
    """Yield a :class:`Member` for each regular member of a whole buffer.

    Raises:
        CorruptArchiveError: see :func:`iter_tar`.
    """
    for name, header_offset, offset, size, _ in iter_tar((buf,), path):
        yield Member(name, header_offset, offset, size)
