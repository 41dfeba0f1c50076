"""Tar header parsing: bytes -> member records (ustar, GNU, PAX).

Our own parser, written for speed over a whole-shard buffer (``mmap`` or
``bytes``). Python's :mod:`tarfile` is the test oracle, not the hot path.

What is a member: regular files (type ``0``, NUL and ``7``). Directories,
symbolic and hard links, devices and FIFOs are skipped silently; GNU sparse
members (type ``S`` or PAX ``GNU.sparse.*``) are skipped with a logged
warning, since their data is not stored contiguously. Header checksums are
verified for every header block, extension headers included.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .errors import CorruptArchiveError

__all__ = ["BLOCK", "Buffer", "Member", "iter_members", "scan_tar"]

BLOCK = 512
_ZERO_BLOCK = bytes(BLOCK)
_REGULAR = frozenset(b"0\x007")
_SPARSE = ord("S")
_PAX = ord("x")
_PAX_GLOBAL = ord("g")
_GNU_LONGNAME = ord("L")
_GNU_LONGLINK = ord("K")
_EXTENSIONS = frozenset((_PAX, _PAX_GLOBAL, _GNU_LONGNAME, _GNU_LONGLINK))
_POSIX_MAGIC = b"ustar\x00"

log = logging.getLogger(__name__)


class Buffer(Protocol):
    """Anything sliceable to bytes with a length: ``bytes``, ``mmap``."""

    def __len__(self) -> int: ...
    def __getitem__(self, key: slice) -> bytes: ...


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
        return self.offset + ((self.size + BLOCK - 1) & ~(BLOCK - 1))


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


def _checksum_ok(block: bytes) -> bool:
    stored_field = block[148:156]
    try:
        stored = _number(stored_field)
    except ValueError:
        return False
    arr = np.frombuffer(block, np.uint8)
    unsigned = int(arr.sum()) - int(arr[148:156].sum()) + 8 * 32
    if stored == unsigned:
        return True
    signed = arr.view(np.int8)
    return stored == int(signed.sum()) - int(signed[148:156].sum()) + 8 * 32


def _fail(buf: Buffer, pos: int, path: str, what: str) -> CorruptArchiveError:
    """The error for a bad header at ``pos``: a checksum error wins over ``what``."""
    block = buf[pos : pos + BLOCK]
    if len(block) == BLOCK and not _checksum_ok(block):
        return _checksum_error(path, pos, block)
    return CorruptArchiveError(path, pos, what)


def _checksum_error(path: str, pos: int, block: bytes) -> CorruptArchiveError:
    arr = np.frombuffer(block, np.uint8)
    expected = int(arr.sum()) - int(arr[148:156].sum()) + 8 * 32
    raw = block[148:156].split(b"\x00", 1)[0].strip()
    text = raw.decode("ascii", "replace")
    got = (text if text.isprintable() else repr(raw)) or "empty"  # one line, whatever the bytes
    return CorruptArchiveError(
        path, pos, f"bad header checksum (expected {expected:o}, got {got}); not a tar archive or corrupt"
    )


def verify_checksums(buf: Buffer, offsets: list[int], path: str) -> None:
    """Verify the header checksum of every block at ``offsets`` (vectorised).

    Raises:
        CorruptArchiveError: on the first block whose checksum is wrong.
    """
    bad = _first_bad_checksum(buf, offsets)
    if bad is not None:  # raised here, once no numpy view of ``buf`` is alive
        raise _checksum_error(path, bad, buf[bad : bad + BLOCK])


def _first_bad_checksum(buf: Buffer, offsets: list[int]) -> int | None:
    if not offsets:
        return None
    arr = np.frombuffer(buf, np.uint8)  # type: ignore[call-overload]
    nblocks = len(arr) // BLOCK
    blocks = arr[: nblocks * BLOCK].reshape(nblocks, BLOCK)
    rows = np.asarray(offsets, np.int64) // BLOCK
    step = 16384
    for start in range(0, len(rows), step):
        chunk = blocks[rows[start : start + step]]
        sums = chunk.sum(axis=1, dtype=np.int64) - chunk[:, 148:156].sum(axis=1, dtype=np.int64) + 256
        stored = np.array([_stored(buf, int(r) * BLOCK) for r in rows[start : start + step]], np.int64)
        for j in np.flatnonzero(sums != stored).tolist():
            pos = int(rows[start + j]) * BLOCK
            if not _checksum_ok(buf[pos : pos + BLOCK]):  # the signed variant may still match
                return pos
    return None


def _stored(buf: Buffer, pos: int) -> int:
    try:
        return _number(buf[pos + 148 : pos + 156])
    except ValueError:
        return -1


def scan_tar(buf: Buffer, path: str) -> Iterator[tuple[str, int, int, int]]:
    """Yield ``(name, header_offset, data_offset, size)`` for each regular member.

    The whole archive is walked and every header checksum verified before the
    generator finishes; callers that need a valid archive must exhaust it.

    Raises:
        CorruptArchiveError: on a bad checksum, a malformed header, truncation
            or a missing end-of-archive marker, naming ``path`` and the offset.
    """
    path = str(path)
    n = len(buf)
    if n == 0:
        raise CorruptArchiveError(path, 0, "empty file, not a tar archive")
    headers: list[int] = []
    pos = 0
    start = -1  # first header block of the member being assembled
    long_name: str | None = None
    pax: dict[str, str] = {}
    global_pax: dict[str, str] = {}
    while True:
        if pos + BLOCK > n:
            if pos == n:
                raise CorruptArchiveError(path, pos, "truncated archive: no end-of-archive marker")
            raise CorruptArchiveError(path, pos, f"truncated header ({n - pos} of {BLOCK} bytes)")
        hdr = buf[pos : pos + BLOCK]
        if hdr == _ZERO_BLOCK:
            if start >= 0:
                raise CorruptArchiveError(path, start, "extension header without a following member")
            break
        headers.append(pos)
        typ = hdr[156]
        try:
            size = _number(hdr[124:136])
        except ValueError as exc:
            raise _fail(buf, pos, path, f"bad size field {hdr[124:136]!r}") from exc
        if start < 0:
            start = pos
        data = pos + BLOCK
        if typ in _EXTENSIONS:
            end = data + size
            if end > n:
                raise _fail(buf, pos, path, f"truncated archive: extension header data needs {size} bytes")
            if typ == _PAX:
                pax = _parse_pax(buf[data:end], path, pos)
            elif typ == _PAX_GLOBAL:
                global_pax.update(_parse_pax(buf[data:end], path, pos))
                start = -1
            elif typ == _GNU_LONGNAME:
                long_name = _decode_name(buf[data:end].split(b"\x00", 1)[0])
            pos = data + ((size + BLOCK - 1) & ~(BLOCK - 1))
            continue
        merged = {**global_pax, **pax} if global_pax else pax
        if "size" in merged:
            try:
                size = int(merged["size"])
            except ValueError as exc:
                raise CorruptArchiveError(path, start, f"bad PAX size {merged['size']!r}") from exc
        end = data + size
        if end > n:
            raise _fail(
                buf, pos, path, f"truncated archive: member data needs {size} bytes, file ends at {n}"
            )
        if typ in _REGULAR:
            if "path" in merged:
                name = merged["path"]
            elif long_name is not None:
                name = long_name
            else:
                name = _decode_name(hdr[0:100].split(b"\x00", 1)[0])
                if hdr[257:263] == _POSIX_MAGIC and hdr[345] != 0:
                    name = _decode_name(hdr[345:500].split(b"\x00", 1)[0]) + "/" + name
            if any(k.startswith("GNU.sparse.") for k in merged):
                log.warning("%s: skipping GNU sparse member %r at offset %d", path, name, start)
            else:
                yield name, start, data, size
        elif typ == _SPARSE:
            log.warning("%s: skipping GNU sparse member at offset %d", path, start)
        pos = data + ((size + BLOCK - 1) & ~(BLOCK - 1))
        start = -1
        long_name = None
        if pax:
            pax = {}
    verify_checksums(buf, headers, path)


def iter_members(buf: Buffer, path: str) -> Iterator[Member]:
    """Yield a :class:`Member` for each regular member of a tar archive.

    Raises:
        CorruptArchiveError: see :func:`scan_tar`.
    """
    for name, header_offset, offset, size in scan_tar(buf, path):
        yield Member(name, header_offset, offset, size)
