"""Record blocks: the compact encoding of samples, ``BLOCK_SAMPLES`` to an LMDB value.

A block holds consecutive samples (it may span shards). Each sample is one *row*
of fixed-width little-endian fields; the widths are chosen per block, the
fewest bytes that hold every value of a field after subtracting the field's
base (its smallest value in the block; a field equal in every row takes 0
bytes). Fields hold what cannot be predicted::

    u32 n, u32 M (member slots), u32 n_patterns, u8 key_mode, u8 key_digits,
    u32 prefix_len, u32 heap_len                       header (22 bytes)
    (5 + 2 M) x u8                                      field widths, 0..8
    (5 + 2 M) x u64                                     field bases
    n_patterns x (M + 1) x u16                          patterns: member count, extension numbers
    prefix_len bytes                                    the key prefix every key of the block shares
    n rows                                              the fields below
    heap_len bytes                                      key suffixes (key_mode 0)

    field 0  shard number
    field 1  offset of the sample's first header in its shard
    field 2  sample size - round512(end of its last member)     (0 without extension headers)
    field 3  pattern number (the sample's extensions, in member order)
    field 4  key_mode 0: end of the key's suffix in the heap (start: the previous row's end)
             key_mode 1: n - row, where n is the key's number: key = prefix + n in key_digits decimals
    field 5 + 2k  member k's data offset - predicted (512 for k = 0, else
                  round512(end of member k - 1) + 512: its header follows the previous member)
    field 6 + 2k  member k's data size

Values are taken modulo 2**64, so any value round-trips (a prediction that
misses costs width, never correctness). A whole block is checked once when a
process first reads it (:func:`parse`); every record is checked when read
(members inside the sample's range, in order; a known shard).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import IndexFormatError, shown

__all__ = ["MAX_KEY_BYTES", "MAX_MEMBERS", "Block", "Columns", "encode_block", "parse"]

MAX_MEMBERS = 0xFFFF
"""Members one sample may have."""
MAX_KEY_BYTES = 0xFFFF
"""Bytes one key may have (utf-8)."""

HEADER = struct.Struct("<IIIBBII")
_U64 = np.uint64
_ROUND = _U64(0xFFFF_FFFF_FFFF_FE00)
_MASK = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class Columns:
    """Samples as arrays, in index order (the unit blocks are encoded from and decoded to)."""

    shard: np.ndarray
    """uint64 per sample: shard number."""
    offset: np.ndarray
    """uint64 per sample: offset of its first header."""
    size: np.ndarray
    """uint64 per sample: whole byte range."""
    nmembers: np.ndarray
    """int64 per sample: member count."""
    member_ext: np.ndarray
    """uint16 per member: extension number (into the index's extension table)."""
    member_offset: np.ndarray
    """uint64 per member: data offset relative to its sample's start."""
    member_size: np.ndarray
    """uint64 per member: data size."""
    keys: list[bytes]
    """utf-8 (surrogateescape) key per sample."""

    def __len__(self) -> int:
        return len(self.keys)

    def cut(self, lo: int, hi: int) -> Columns:
        """Samples ``lo..hi``."""
        first = np.zeros(len(self.nmembers) + 1, np.int64)
        np.cumsum(self.nmembers, out=first[1:])
        a, b = int(first[lo]), int(first[hi])
        return Columns(
            self.shard[lo:hi], self.offset[lo:hi], self.size[lo:hi], self.nmembers[lo:hi],
            self.member_ext[a:b], self.member_offset[a:b], self.member_size[a:b], self.keys[lo:hi],
        )  # fmt: skip

    @staticmethod
    def join(parts: list[Columns]) -> Columns:
        """One run of samples from consecutive runs."""
        if len(parts) == 1:
            return parts[0]

        def cat(name: str, dtype: Any) -> np.ndarray:
            arrays = [getattr(p, name) for p in parts]
            return np.concatenate(arrays).astype(dtype, copy=False) if arrays else np.zeros(0, dtype)

        return Columns(
            cat("shard", _U64), cat("offset", _U64), cat("size", _U64), cat("nmembers", np.int64),
            cat("member_ext", np.uint16), cat("member_offset", _U64), cat("member_size", _U64),
            [k for p in parts for k in p.keys],
        )  # fmt: skip


def _round(x: np.ndarray) -> np.ndarray:
    return (x + _U64(511)) & _ROUND


def _width(values: np.ndarray) -> tuple[int, np.ndarray]:
    """The base (smallest value), and the values minus it."""
    if not len(values):
        return 0, values
    base = values.min()
    return int(base), values - base


def _nbytes(largest: int) -> int:
    return (largest.bit_length() + 7) // 8


def _members(cols: Columns, n: int) -> tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Member slots: ``M`` and ``(n, M)`` matrices of extension, offset, size, presence."""
    nm = cols.nmembers.astype(np.int64)
    m = int(nm.max()) if n else 0
    owner = np.repeat(np.arange(n), nm)
    within = np.arange(len(owner)) - (np.cumsum(nm) - nm)[owner]
    ext = np.zeros((n, m), np.uint16)
    off = np.zeros((n, m), _U64)
    size = np.zeros((n, m), _U64)
    present = np.zeros((n, m), bool)
    ext[owner, within] = cols.member_ext
    off[owner, within] = cols.member_offset
    size[owner, within] = cols.member_size
    present[owner, within] = True
    return m, ext, off, size, present


def _keys(keys: list[bytes], n: int) -> tuple[int, int, bytes, np.ndarray, bytes]:
    """``(key_mode, key_digits, prefix, field 4, heap)`` for the block's keys."""
    lengths = np.fromiter(map(len, keys), np.int64, count=n)
    if n and int(lengths.max()) > MAX_KEY_BYTES:
        worst = int(np.argmax(lengths))
        raise IndexFormatError(f"key {shown(keys[worst])} has {int(lengths[worst])} bytes; a key has at most {MAX_KEY_BYTES}")
    if n and int(lengths.min()) == int(lengths.max()) and int(lengths[0]) > 0:  # counters: zero-padded numbers
        length = int(lengths[0])
        mat = np.frombuffer(b"".join(keys), np.uint8).reshape(n, length)
        same = (mat == mat[0]).all(axis=0)
        plen = int(np.argmin(same)) if not same.all() else length
        digits = mat[:, plen:]
        width = length - plen
        if 0 < width <= 19 and bool(((digits >= 48) & (digits <= 57)).all()):
            weights = np.array([10**e for e in range(width - 1, -1, -1)], _U64)
            number = ((digits - 48).astype(_U64) * weights).sum(axis=1, dtype=_U64)
            return 1, width, keys[0][:plen], number - np.arange(n, dtype=_U64), b""
    prefix = bytes(_common_prefix(keys)) if n else b""
    plen = len(prefix)
    heap = b"".join(k[plen:] for k in keys)
    return 0, 0, prefix, np.cumsum(lengths - plen).astype(_U64), heap


def _common_prefix(keys: list[bytes]) -> bytes:
    lo, hi = min(keys), max(keys)
    for k, (a, b) in enumerate(zip(lo, hi)):
        if a != b:
            return lo[:k]
    return lo


def encode_block(cols: Columns) -> bytes:
    """Encode samples (at most ``BLOCK_SAMPLES``, normally exactly) as one block.

    Raises:
        IndexFormatError: a sample has more than 65,535 members or a key longer than 65,535 bytes.
    """
    n = len(cols)
    if n and int(cols.nmembers.max()) > MAX_MEMBERS:
        worst = int(np.argmax(cols.nmembers))
        raise IndexFormatError(
            f"sample {shown(cols.keys[worst])} has {int(cols.nmembers[worst])} members; a sample has at most {MAX_MEMBERS}"
        )
    m, ext, off, size, present = _members(cols, n)
    patterns = np.zeros((n, m + 1), np.uint16)
    patterns[:, 0] = cols.nmembers
    patterns[:, 1:] = ext
    if n and bool((patterns == patterns[0]).all()):  # the usual case: one pattern (np.unique on rows is slow)
        table, pattern = patterns[:1], np.zeros(n, np.int64)
    elif n:
        table, pattern = np.unique(patterns, axis=0, return_inverse=True)
    else:
        table, pattern = np.zeros((0, m + 1), np.uint16), np.zeros(0, np.int64)
    predicted = np.zeros((n, m), _U64)
    if m:
        predicted[:, 0] = 512
        predicted[:, 1:] = _round(off[:, :-1] + size[:, :-1]) + _U64(512)
    last = np.maximum(cols.nmembers.astype(np.int64) - 1, 0)
    rows = np.arange(n)
    end = np.where(cols.nmembers > 0, _round(off[rows, last] + size[rows, last]), _U64(0)) if m else np.zeros(n, _U64)
    mode, digits, prefix, key_field, heap = _keys(cols.keys, n)
    fields = [cols.shard.astype(_U64), cols.offset.astype(_U64), cols.size.astype(_U64) - end, pattern.reshape(-1).astype(_U64), key_field]
    for k in range(m):
        resid = off[:, k] - predicted[:, k]
        have = present[:, k]
        resid[~have] = resid[have].min() if have.any() else 0  # absent slots cost no width
        sz = size[:, k].copy()
        sz[~have] = sz[have].min() if have.any() else 0
        fields += [resid, sz]
    bases, widths, parts = [], [], []
    for values in fields:
        base, rel = _width(values)
        w = _nbytes(int(rel.max())) if len(rel) else 0
        bases.append(base)
        widths.append(w)
        if w:
            parts.append(rel.astype("<u8").view(np.uint8).reshape(n, 8)[:, :w])
    body = np.concatenate(parts, axis=1).tobytes() if parts else b""
    head = HEADER.pack(n, m, len(table), mode, digits, len(prefix), len(heap))
    return b"".join((head, bytes(widths), np.array(bases, "<u8").tobytes(), table.astype("<u2").tobytes(), prefix, body, heap))


class Block:
    """One record block, parsed and checked once (see :func:`parse`)."""

    __slots__ = ("at", "bases", "digits", "heap", "heap_len", "m", "mode", "n", "patterns", "prefix", "rowlen", "rows", "view", "widths")

    def __init__(self, view: memoryview, n_exts: int, expected: int, where: str) -> None:
        bad = f"{where} is damaged"
        if len(view) < HEADER.size:
            raise IndexFormatError(f"{bad} (a block of {len(view)} bytes); rebuild the index")
        n, m, npat, mode, digits, plen, heap_len = HEADER.unpack_from(view)
        if n != expected or m > MAX_MEMBERS or mode > 1 or (mode == 1 and not 0 < digits <= 19) or npat > max(n, 1):
            raise IndexFormatError(f"{bad} (header n={n} M={m} patterns={npat} key_mode={mode}, expected n={expected}); rebuild the index")
        ncols = 5 + 2 * m
        pos = HEADER.size
        widths = list(view[pos : pos + ncols])
        pos += ncols
        bases = np.frombuffer(view, "<u8", ncols, pos).tolist() if len(view) >= pos + 8 * ncols else None
        pos += 8 * ncols
        rowlen = sum(widths)
        pat_at, pos = pos, pos + 2 * npat * (m + 1)
        end = pos + plen + n * rowlen + heap_len
        if bases is None or len(widths) != ncols or max(widths) > 8 or end != len(view):
            raise IndexFormatError(f"{bad} (expected {end} bytes from its header, got {len(view)}); rebuild the index")
        table = np.frombuffer(view, "<u2", npat * (m + 1), pat_at).reshape(npat, m + 1)
        if npat and int(table[:, 0].max()) > m:
            raise IndexFormatError(f"{bad} (a member pattern of {int(table[:, 0].max())} members, at most {m}); rebuild the index")
        used = table[:, 1:][np.arange(m)[None, :] < table[:, :1]]
        if len(used) and int(used.max()) >= n_exts:
            raise IndexFormatError(f"{bad} (a member pattern names extension {int(used.max())} of {n_exts}); rebuild the index")
        self.view, self.n, self.m, self.mode, self.digits = view, n, m, mode, digits
        self.widths, self.rowlen, self.heap_len = widths, rowlen, heap_len
        self.bases: list[int] = bases
        self.patterns: list[tuple[int, ...]] = [tuple(row[1 : 1 + row[0]]) for row in table.tolist()]
        if any(len(set(p)) != len(p) for p in self.patterns):  # a sample dict would keep one member of the two
            raise IndexFormatError(f"{bad} (a member pattern names one extension twice); rebuild the index")
        self.prefix = bytes(view[pos : pos + plen])
        self.rows = view[pos + plen : pos + plen + n * rowlen]
        self.heap = view[pos + plen + n * rowlen :]
        self.at = [sum(widths[:c]) for c in range(ncols)]

    def _field(self, row: memoryview, c: int) -> int:
        w = self.widths[c]
        base: int = self.bases[c]
        return (base + (int.from_bytes(row[self.at[c] : self.at[c] + w], "little") if w else 0)) & _MASK

    def record(self, j: int, where: str, sample: int = -1) -> tuple[int, int, int, list[tuple[int, int, int]], bytes]:
        """Row ``j``: ``(shard, offset, size, [(extension number, data offset, data size)...], key)``, checked.

        An error names ``where`` (the index), and sample ``sample`` when one is given (the message is made only then).

        Raises:
            IndexFormatError: the record is inconsistent (a member outside the sample, an unknown pattern or key).
        """
        row = self.rows[j * self.rowlen : (j + 1) * self.rowlen]
        f = self._field
        pattern = f(row, 3)
        if pattern >= len(self.patterns):
            raise IndexFormatError(f"{_of(where, sample)} is damaged (pattern {pattern} of {len(self.patterns)}); rebuild the index")
        exts = self.patterns[pattern]
        members, pos = [], 0
        for k, e in enumerate(exts):
            predicted = 512 if k == 0 else ((pos + 511) & ~511) + 512
            mo, ms = (predicted + f(row, 5 + 2 * k)) & _MASK, f(row, 6 + 2 * k)
            members.append((e, mo, ms))
            pos = mo + ms
        size = (f(row, 2) + ((pos + 511) & ~511 if exts else 0)) & _MASK
        if size >= 1 << 63:
            raise IndexFormatError(f"{_of(where, sample)} is damaged (a sample of {size} bytes); rebuild the index")
        check = 0
        for _, mo, ms in members:
            if mo < check or mo > size or ms > size - mo:
                raise IndexFormatError(f"{_of(where, sample)} is damaged (a member at {mo}+{ms} outside the sample's {size} bytes); rebuild the index")
            check = mo + ms
        return f(row, 0), f(row, 1), size, members, self._key(j, row, where, sample)

    def _key(self, j: int, row: memoryview, where: str, sample: int) -> bytes:
        v = self._field(row, 4)
        if self.mode == 1:
            number = (v + j) & _MASK
            if number >= 10**self.digits:
                raise IndexFormatError(f"{_of(where, sample)} is damaged (key number {number} has more than {self.digits} digits); rebuild the index")
            return self.prefix + b"%0*d" % (self.digits, number)
        start = self._field(self.rows[(j - 1) * self.rowlen : j * self.rowlen], 4) if j else 0
        if not start <= v <= self.heap_len:
            raise IndexFormatError(f"{_of(where, sample)} is damaged (key bytes {start}..{v} of {self.heap_len}); rebuild the index")
        return self.prefix + bytes(self.heap[start:v])

    def columns(self, where: str) -> Columns:
        """Every row, decoded and checked as :meth:`record` checks one, as arrays (vectorised).

        Raises:
            IndexFormatError: a record is inconsistent.
        """
        n, m = self.n, self.m
        mat = np.frombuffer(self.rows, np.uint8).reshape(n, self.rowlen)

        def field(c: int) -> np.ndarray:
            w, at = self.widths[c], self.at[c]
            wide = np.zeros((n, 8), np.uint8)
            wide[:, :w] = mat[:, at : at + w]
            return wide.view("<u8").reshape(n) + _U64(self.bases[c])

        pattern = field(3)
        if n and int(pattern.max()) >= len(self.patterns):
            raise IndexFormatError(f"{where} is damaged (pattern {int(pattern.max())} of {len(self.patterns)}); rebuild the index")
        table = np.zeros((max(len(self.patterns), 1), m + 1), np.int64)
        for p, exts in enumerate(self.patterns):
            table[p, 0] = len(exts)
            table[p, 1 : 1 + len(exts)] = exts
        counts, ext = table[pattern.astype(np.int64), 0], table[pattern.astype(np.int64), 1:]
        moff, msize = np.zeros((n, m), _U64), np.zeros((n, m), _U64)
        pos = np.zeros(n, _U64)
        for k in range(m):
            predicted = np.full(n, 512, _U64) if k == 0 else _round(pos) + _U64(512)
            moff[:, k] = predicted + field(5 + 2 * k)
            msize[:, k] = field(6 + 2 * k)
            pos = np.where(k < counts, moff[:, k] + msize[:, k], pos)
        size = field(2) + np.where(counts > 0, _round(pos), _U64(0))
        present = np.arange(m)[None, :] < counts[:, None]
        previous = np.zeros((n, m), _U64)
        previous[:, 1:] = moff[:, :-1] + msize[:, :-1]
        bad = present & ((moff < previous) | (moff > size[:, None]) | (msize > size[:, None] - moff))
        bad |= (size >= _U64(1 << 63))[:, None] if m else False
        if bad.any():
            j = int(np.argmax(bad.any(axis=1)))
            raise IndexFormatError(f"{where} is damaged (sample {j} of the block has a member outside its {int(size[j])} bytes); rebuild the index")
        return Columns(
            field(0), field(1), size, counts.astype(np.int64), ext[present].astype(np.uint16),
            moff[present], msize[present], self._all_keys(field(4), where),
        )  # fmt: skip

    def _all_keys(self, values: np.ndarray, where: str) -> list[bytes]:
        prefix = self.prefix
        if self.mode == 1:
            number = values + np.arange(self.n, dtype=_U64)
            if self.n and int(number.max()) >= 10**self.digits:
                raise IndexFormatError(f"{where} is damaged (a key number has more than {self.digits} digits); rebuild the index")
            fmt = b"%s%0" + str(self.digits).encode() + b"d"
            return [fmt % (prefix, x) for x in number.tolist()]
        ends = values.tolist()
        starts = [0, *ends[:-1]]
        if any(a > b for a, b in zip(starts, ends)) or (ends and ends[-1] > self.heap_len):
            raise IndexFormatError(f"{where} is damaged (key bytes out of order or past the heap's {self.heap_len}); rebuild the index")
        heap = bytes(self.heap)
        if not prefix:  # the common case: a quarter faster without the concatenation
            return [heap[a:b] for a, b in zip(starts, ends)]
        return [prefix + heap[a:b] for a, b in zip(starts, ends)]


def _of(where: str, sample: int) -> str:
    return f"{where}: the record of sample {sample}" if sample >= 0 else where


def parse(view: memoryview, n_exts: int, expected: int, where: str) -> Block:
    """Parse and check a block's header and layout (its checksum is already verified).

    Raises:
        IndexFormatError: the block's header does not describe its bytes.
    """
    return Block(view, n_exts, expected, where)
