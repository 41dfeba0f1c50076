"""Sample records: everything needed to read one sample, in one place.

The index stores each sample as one variable-length record in the blob
``col/records``, at the byte offset ``col/record_offset[i]`` (8-aligned,
little-endian)::

    u64 offset      byte offset of the sample's first header in its shard
    u64 size        whole byte range: headers, data and padding of every member
    u32 shard       shard number
    u16 n_members
    u16 key_len     bytes of the utf-8 key
    n_members x (u64 data offset relative to ``offset``, u64 data size)
    n_members x u16 extension number (into the index's extension table)
    key_len bytes   the key
    zero padding to a multiple of 8

When the records are about the same length (the usual case: every sample has
the same extensions and keys of similar length), each is padded to the longest
and they sit at a fixed stride (``record_stride`` in the index's meta; the
offset table is then empty): record ``i`` starts at ``i * stride``. One sample
is then one or two adjacent cache lines of ``records``, however large the
index, with no dependent lookup before it (columns per field would spread a
sample over nine places). Encoding and decoding are vectorised over whole
tables with numpy.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from ..errors import IndexFormatError, shown

__all__ = ["HEAD", "MAX_KEY_BYTES", "MAX_MEMBERS", "STRIDE_SLACK", "Decoded", "decode", "encode", "unpack", "unpack_head"]

HEAD = struct.Struct("<QQIHH")
"""The fixed head of a record: offset, size, shard, n_members, key_len."""
MAX_MEMBERS = 0xFFFF
"""Members one sample may have."""
MAX_KEY_BYTES = 0xFFFF
"""Bytes one key may have (utf-8)."""

STRIDE_SLACK = 1.25
"""Records sit at a fixed stride when padding them all to the longest costs at most this factor in bytes."""

unpack_head = HEAD.unpack_from
_unpack_from = struct.unpack_from


def unpack(blob: Any, at: int, sample: int) -> tuple[int, int, int, tuple[int, ...], str]:
    """Sample ``sample``'s record at byte ``at``: ``(offset, size, shard, spans, key)``.

    ``spans`` holds each member's data offset (relative to ``offset``) and size, then each
    member's extension number: ``2 * n`` then ``n`` values for ``n`` members.

    Raises:
        IndexFormatError: the record runs past the blob.
    """
    try:
        offset, size, shard, nm, klen = unpack_head(blob, at)
        spans = _unpack_from(f"<{2 * nm}Q{nm}H", blob, at + HEAD.size)
    except struct.error as exc:
        raise IndexFormatError(f"the index record of sample {sample} is damaged; rebuild the index") from exc
    key_at = at + HEAD.size + 18 * nm
    if key_at + klen > len(blob):
        raise IndexFormatError(f"the index record of sample {sample} is damaged; rebuild the index")
    return offset, size, shard, spans, str(blob[key_at : key_at + klen], "utf-8", "surrogateescape")


def encode(
    shard: np.ndarray,
    offset: np.ndarray,
    size: np.ndarray,
    nmembers: np.ndarray,
    member_ext: np.ndarray,
    member_offset: np.ndarray,
    member_size: np.ndarray,
    keys: list[bytes],
) -> tuple[np.ndarray, np.ndarray, int]:
    """Encode samples as records: ``(record_offset uint64[n + 1], records uint8[...], stride)``.

    Arguments are per sample (``shard`` .. ``nmembers``, ``keys``) and per
    member, in sample order. With a ``stride`` (> 0), record ``i`` starts at
    ``i * stride`` and ``record_offset`` is empty.

    Raises:
        IndexFormatError: a sample has more than 65,535 members or a key longer than 65,535 bytes.
    """
    n = len(offset)
    nm = nmembers.astype(np.int64)
    klen = np.fromiter(map(len, keys), np.int64, count=n)
    if n and (int(nm.max()) > MAX_MEMBERS or int(klen.max()) > MAX_KEY_BYTES):
        worst = int(np.argmax(nm > MAX_MEMBERS)) if int(nm.max()) > MAX_MEMBERS else int(np.argmax(klen > MAX_KEY_BYTES))
        raise IndexFormatError(
            f"sample {shown(keys[worst])} has {int(nm[worst])} members and a key of "
            f"{int(klen[worst])} bytes; an index record holds at most {MAX_MEMBERS} and {MAX_KEY_BYTES}"
        )
    length = (HEAD.size + 18 * nm + klen + 7) & ~7
    stride = int(length.max()) if n else 0
    if stride * n <= STRIDE_SLACK * int(length.sum()):
        length[:] = stride
    else:
        stride = 0
    start = np.zeros(n + 1, np.int64)
    np.cumsum(length, out=start[1:])
    out = np.zeros(int(start[-1]), np.uint8)
    u64, u32, u16 = out.view("<u8"), out.view("<u4"), out.view("<u2")
    r = start[:-1]
    u64[r // 8] = offset
    u64[r // 8 + 1] = size
    u32[(r + 16) // 4] = shard
    u16[(r + 20) // 2] = nm
    u16[(r + 22) // 2] = klen
    owner, within = _members_of(nm)
    first = (r[owner] + HEAD.size) // 8 + 2 * within
    u64[first] = member_offset
    u64[first + 1] = member_size
    u16[(r[owner] + HEAD.size + 16 * nm[owner]) // 2 + within] = member_ext
    key_at = r + HEAD.size + 18 * nm
    src = np.frombuffer(b"".join(keys), np.uint8)
    src_at = np.cumsum(klen) - klen
    out[np.repeat(key_at - src_at, klen) + np.arange(len(src))] = src
    return (np.zeros(0, np.uint64) if stride else start.astype(np.uint64)), out, stride


class Decoded:
    """Records ``lo..hi`` decoded into arrays (copies; see :func:`decode`)."""

    __slots__ = ("key_at", "key_len", "member_ext", "member_offset", "member_size", "nmembers", "offset", "shard", "size")

    def __init__(self, blob: np.ndarray, starts: np.ndarray) -> None:
        r = starts.astype(np.int64)
        u64, u32, u16 = blob.view("<u8"), blob.view("<u4"), blob.view("<u2")
        self.offset: np.ndarray = u64[r // 8]
        """uint64 per sample."""
        self.size: np.ndarray = u64[r // 8 + 1]
        """uint64 per sample."""
        self.shard: np.ndarray = u32[(r + 16) // 4]
        """uint32 per sample."""
        self.nmembers: np.ndarray = u16[(r + 20) // 2].astype(np.uint32)
        """uint32 per sample."""
        self.key_len: np.ndarray = u16[(r + 22) // 2].astype(np.int64)
        """Key bytes per sample."""
        nm = self.nmembers.astype(np.int64)
        owner, within = _members_of(nm)
        first = (r[owner] + HEAD.size) // 8 + 2 * within
        self.member_offset: np.ndarray = u64[first]
        """uint64 per member, relative to its sample."""
        self.member_size: np.ndarray = u64[first + 1]
        """uint64 per member."""
        self.member_ext: np.ndarray = u16[(r[owner] + HEAD.size + 16 * nm[owner]) // 2 + within]
        """uint16 per member."""
        self.key_at: np.ndarray = r + HEAD.size + 18 * nm
        """Byte position of each key in the blob."""

    def keys(self, blob: np.ndarray) -> list[str]:
        """The keys, decoded (the blob the records came from)."""
        if not len(self.key_at):
            return []
        base = int(self.key_at.min())
        raw = blob[base : int((self.key_at + self.key_len).max())].tobytes()  # the records' span, copied once
        return [
            raw[at : at + n].decode("utf-8", "surrogateescape")
            for at, n in zip((self.key_at - base).tolist(), self.key_len.tolist())
        ]


def decode(blob: np.ndarray, record_offset: np.ndarray, stride: int, lo: int, hi: int) -> Decoded:
    """Decode records ``lo..hi`` of ``blob`` (uint8, length a multiple of 8), at ``stride`` or ``record_offset``.

    Raises:
        IndexFormatError: a record offset points outside the blob or is not 8-aligned.
    """
    starts = np.arange(lo, hi, dtype=np.int64) * stride if stride else record_offset[lo:hi]
    if len(starts) and (int(starts.max()) + HEAD.size > len(blob) or bool((starts % 8).any())):
        raise IndexFormatError("index records are damaged (a record offset is out of range)")
    return Decoded(blob, starts)


def _members_of(nm: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each member: the sample it belongs to and its position in that sample."""
    owner = np.repeat(np.arange(len(nm)), nm)
    first = np.cumsum(nm) - nm
    return owner, np.arange(len(owner)) - first[owner]
