"""The index file: its values, each sealed under its key, and the LMDB file read with ``pread`` (LMDB's meta
pages and B-tree walked here, the file never mapped).

Every value but the LMDB container's own pages is *sealed* (:func:`seal`, :func:`unseal`): a little-endian
CRC-32 of its key and payload, then the payload, so a damaged value is an
:class:`~tarindex.errors.IndexFormatError`, never data. Numbered values (record blocks, shard records, frame
tables, key buckets) are keyed by :func:`numbered`; which keys an index holds is :mod:`tarindex.index.format`.

An index can change under a reader (``cp`` or ``rsync --inplace`` over it, a truncation, a sync
client): a mapped file then faults (``SIGBUS``) on any page past its new end, and a page read through
the map after the change is the new file's. Read with ``pread``, a page past the end is a short read,
and every value is a private copy, checked once: what a reader holds stays what it checked. Whether the
file is still the one opened is :meth:`IndexFile.changed` (one ``fstat``).

The layout read is LMDB 0.9's on-disk format (the one ``lmdb`` writes; ``index/writer.py``): pages of
``psize`` bytes; pages 0 and 1 are meta pages (the later transaction's is current) naming the main
tree's root and depth and the last page; a branch page holds ``(key, child page)`` nodes, a leaf page
``(key, value)`` nodes, a value too large for its leaf lies in consecutive overflow pages. Every page
read is checked (its number, its kind, its nodes inside it, a child inside the file), so a damaged or
crafted file is an :class:`~tarindex.errors.IndexFormatError`, never a loop, an out-of-range read or an
allocation larger than the file.
"""

from __future__ import annotations

import os
import stat
import struct
import zlib
from bisect import bisect_left, bisect_right
from pathlib import Path
from typing import NamedTuple

from ..errors import IndexFormatError

__all__: list[str] = []  # internal module: the index reader and writer and `tarindex info` use it

_LMDB_MAGIC = 0xBEEFC0DE
_META = struct.Struct("<II8x8x4xHH8x8x8x8x8x4xHH8x8x8xQQQQ")
"""A meta page after its 16-byte header: magic, version, the free tree's (flags, depth: psize in the pad
before), the main tree's flags and depth, then entries, root, last page, transaction id."""
_PSIZE = struct.Struct("<I")  # the page size: the free tree's md_pad, 40 bytes into a meta page
_HEAD = struct.Struct("<QHHHH")  # page number, pad, flags, lower, upper (16 bytes)
_NODE = struct.Struct("<HHHH")  # lo, hi, flags, key size (8 bytes, then the key, then the value)
_P_BRANCH, _P_LEAF, _P_OVERFLOW = 0x01, 0x02, 0x04
_F_BIGDATA = 0x01
_NO_PAGE = (1 << 64) - 1
_MAX_DEPTH = 32  # a B-tree of 4 KiB pages this deep holds more than any file; deeper is damage
_BRANCHES_KEPT = 1024  # branch pages kept parsed (~100 at 100M samples)
_LEAVES_KEPT = 2048  # leaf pages kept read (8 MiB: the key table of 1.5M samples)
_PARSED_LEAF = 16  # a leaf of at most this many nodes is kept parsed (the key table's hold 3)


def numbered(prefix: bytes, number: int) -> bytes:
    """The LMDB key of value ``number`` under ``prefix`` (big-endian, so keys sort by number)."""
    return prefix + number.to_bytes(8, "big")


def seal(key: bytes, payload: bytes | bytearray | memoryview) -> bytes:
    """``payload`` behind the CRC-32 of its LMDB key and itself (4 bytes, little-endian).

    The key is in the checksum, so a value found under another key (a damaged B-tree) is refused too.
    """
    return zlib.crc32(payload, zlib.crc32(key)).to_bytes(4, "little") + bytes(payload)


def unseal(raw: bytes | memoryview | None, key: bytes, where: str) -> memoryview:
    """The payload of a value sealed under ``key``, its checksum verified (a view, no copy).

    Raises:
        IndexFormatError: the value is missing, too short, or its checksum does not match.
    """
    if raw is None:
        raise IndexFormatError(f"{where} is missing; rebuild the index")
    view = memoryview(raw)
    if len(view) < 4:
        raise IndexFormatError(f"{where} is damaged (expected at least 4 bytes, got {len(view)}); rebuild the index")
    expected, got = int.from_bytes(view[:4], "little"), zlib.crc32(view[4:], zlib.crc32(key))
    if expected != got:
        raise IndexFormatError(f"{where} is damaged (checksum expected {expected:08x}, got {got:08x}); rebuild the index")
    return view[4:]


class IndexFile:
    """One open index file: its current meta page, ``get(key)`` by ``pread``, its identity at open.

    Raises:
        IndexFormatError: not an LMDB file, or shorter than its meta pages say (a truncated copy).
        OSError: the file cannot be opened or read.
    """

    def __init__(self, path: Path, fd: int | None = None) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK) if fd is None else fd
        try:
            st = os.fstat(self.fd)
            if not stat.S_ISREG(st.st_mode):
                raise IndexFormatError(f"{path}: not a tarindex index (not a regular file)")
            if fd is None and hasattr(os, "posix_fadvise"):
                os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_RANDOM)  # a page asked for is read, not the next 128 KiB
            self.identity = _identity(st)
            self.reads = 0  # pages and values read from the file (not from the pages kept)
            self._branches: dict[int, _Page] = {}
            self._leaves: dict[int, _Page] = {}
            self._read_meta(st.st_size)
        except BaseException:
            if fd is None:
                os.close(self.fd)
            raise

    def _read_meta(self, size: int) -> None:
        head = os.pread(self.fd, 152, 0)
        psize = _PSIZE.unpack_from(head, 40)[0] if len(head) == 152 else 0
        if len(head) < 152 or int.from_bytes(head[16:20], "little") != _LMDB_MAGIC or not 512 <= psize <= 1 << 16:
            raise IndexFormatError(f"{self.path}: not a tarindex index (not an LMDB file: {size} bytes)")
        second = os.pread(self.fd, 152, psize)
        metas = [head] + ([second] if len(second) == 152 and int.from_bytes(second[16:20], "little") == _LMDB_MAGIC else [])
        meta = max(metas, key=lambda m: int.from_bytes(m[144:152], "little"))  # LMDB uses the later transaction's
        _, _, _, _, flags, self.depth, self.entries, self.root, self.last, self.txnid = _META.unpack_from(meta, 16)
        self.psize = psize
        if (self.last + 1) * psize > size:
            raise IndexFormatError(
                f"{self.path}: the index is truncated (expected at least {(self.last + 1) * psize} bytes, got {size}); "
                "rebuild or copy it again"
            )
        if flags or self.depth > _MAX_DEPTH or (self.root != _NO_PAGE and not 2 <= self.root <= self.last):
            raise IndexFormatError(f"{self.path}: not a tarindex index (an LMDB file of another layout)")

    @property
    def container(self) -> tuple[int, int, int, int]:
        """What the current meta page says: page size, last page, root page, transaction id."""
        return self.psize, self.last, self.root, self.txnid

    def changed(self) -> str | None:
        """What changed since this file was opened (size, modification or change time), or ``None``."""
        now = _identity(os.fstat(self.fd))
        if now == self.identity:
            return None
        if now[0] != self.identity[0]:
            return f"size {self.identity[0]} -> {now[0]} bytes"
        return "modified in place"

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    # -- the B-tree ------------------------------------------------------------------------
    def _damaged(self, pgno: int, what: str) -> IndexFormatError:
        return IndexFormatError(f"{self.path}: the index is damaged (page {pgno} at offset {pgno * self.psize}: {what}); rebuild the index")

    def get(self, key: bytes) -> bytes | memoryview | None:
        """The value stored under ``key`` (a copy read from the file), or ``None``.

        Raises:
            IndexFormatError: a page on the way is damaged, or the file is shorter than its pages.
        """
        found = self._find(key)
        if found is None:
            return None
        page, size, flags, at = found
        if not flags & _F_BIGDATA:
            return page[at : at + size]
        first = int.from_bytes(page[at : at + 8], "little")
        pages = -(-(size + 16) // self.psize)
        if not 2 <= first <= self.last - pages + 1:
            raise self._damaged(first, f"a value of {size} bytes here, past the file's {self.last + 1} pages")
        data = os.pread(self.fd, size + 16, first * self.psize)  # its first page's header, then the value
        self.reads += 1
        if len(data) != size + 16:
            raise self._damaged(first, f"read {len(data)} of a value's {size + 16} bytes")
        number, _, oflags, _, _ = _HEAD.unpack_from(data)
        count = int.from_bytes(data[12:16], "little")
        if number != first or oflags != _P_OVERFLOW or count < pages:
            raise self._damaged(first, f"an overflow page header of page {number}, flags {oflags:#x}, {count} pages")
        return memoryview(data)[16:]

    def size_of(self, key: bytes) -> int | None:
        """The size of the value under ``key``, from its leaf (a large value itself is not read), or ``None``.

        Raises:
            IndexFormatError: a page on the way is damaged.
        """
        found = self._find(key)
        return None if found is None else found[1]

    def _find(self, key: bytes) -> tuple[bytes, int, int, int] | None:
        """``(leaf page, value size, node flags, where the value (or its first page's number) is)``, or ``None``."""
        pgno = self.root
        if pgno == _NO_PAGE:
            return None
        for _ in range(self.depth):
            page = self._branches.get(pgno) or self._leaves.get(pgno) or self._read(pgno)
            if page.leaf:
                return self._leaf(page, pgno, key)
            pgno = page.children[bisect_right(page.keys, key, 1) - 1]  # the last node whose key <= key (node 0: "anything lower")
        raise self._damaged(self.root, f"no leaf within the tree's depth of {self.depth}")

    def _read(self, pgno: int) -> _Page:
        """Page ``pgno`` read and checked; a branch page parsed. Kept (a copy: valid while the file is, which every
        read checks after it, see :meth:`changed`): the first ``_BRANCHES_KEPT`` branch pages, and leaf pages
        until ``_LEAVES_KEPT`` are kept (then they are read again)."""
        if not 2 <= pgno <= self.last:
            raise self._damaged(pgno, f"a page outside the file's {self.last + 1}")
        data = os.pread(self.fd, self.psize, pgno * self.psize)
        self.reads += 1
        if len(data) != self.psize:
            raise self._damaged(pgno, f"read {len(data)} of {self.psize} bytes")
        number, _, flags, lower, upper = _HEAD.unpack_from(data)
        n = (lower - 16) // 2
        if number != pgno or flags not in (_P_BRANCH, _P_LEAF) or not 16 <= lower <= upper <= self.psize or lower % 2 or n < 1:
            raise self._damaged(pgno, f"a page header of page {number}, flags {flags:#x}, {n} nodes")
        page = _Page(data, n, flags == _P_LEAF, [], [])
        if not page.leaf or n <= _PARSED_LEAF:  # parsed: a branch, or a leaf small enough (the key table's)
            for i in range(n):
                at = self._at(page, pgno, i)
                lo, hi, high, ksize = _NODE.unpack_from(data, at)
                page.keys.append(data[at + 8 : at + 8 + ksize] if i or page.leaf else b"")  # a branch's node 0: "anything lower"
                if not page.leaf:
                    page.children.append(lo | hi << 16 | high << 32)
            if any(a >= b for a, b in zip(page.keys[1 - page.leaf :], page.keys[2 - page.leaf :])):
                raise self._damaged(pgno, "keys out of order")
        if not page.leaf:
            if len(self._branches) < _BRANCHES_KEPT:
                self._branches[pgno] = page
            return page
        if len(self._leaves) >= _LEAVES_KEPT:
            self._leaves.clear()
        self._leaves[pgno] = page
        return page

    def _at(self, page: _Page, pgno: int, i: int) -> int:
        """Where node ``i`` of a page starts, checked: its header and key inside the page."""
        data = page.data
        at = data[16 + 2 * i] | data[17 + 2 * i] << 8
        if not 16 + 2 * page.n <= at <= self.psize - 8 or at + 8 + (data[at + 6] | data[at + 7] << 8) > self.psize:
            raise self._damaged(pgno, f"node {i} at {at}, or its key, past the page")
        return at

    def _leaf(self, page: _Page, pgno: int, key: bytes) -> tuple[bytes, int, int, int] | None:
        data, lo, hi = page.data, 0, page.n
        if page.keys:
            lo = hi = bisect_left(page.keys, key)
        while lo < hi:  # the first node whose key >= key
            mid = (lo + hi) // 2
            at = self._at(page, pgno, mid)
            if data[at + 8 : at + 8 + (data[at + 6] | data[at + 7] << 8)] < key:
                lo = mid + 1
            else:
                hi = mid
        if lo == page.n:
            return None
        at = self._at(page, pgno, lo)
        low, high, flags, ksize = _NODE.unpack_from(data, at)
        if data[at + 8 : at + 8 + ksize] != key:
            return None
        size, start = low | high << 16, at + 8 + ksize
        if flags & ~_F_BIGDATA or start + (8 if flags else size) > self.psize:
            raise self._damaged(pgno, f"node {lo}'s value past the page (flags {flags:#x})")
        return data, size, flags, start


class _Page(NamedTuple):
    """A checked page: its bytes and node count; a branch's keys and child pages; a small leaf's keys (a
    larger leaf's nodes are searched in its bytes)."""

    data: bytes
    n: int
    leaf: bool
    keys: list[bytes]
    children: list[int]


def _identity(st: os.stat_result) -> tuple[int, int, int]:
    """Size, modification and change time (ns): what a write, a truncation or a copy over the file changes."""
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns
