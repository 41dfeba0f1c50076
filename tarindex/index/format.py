"""Index layout: LMDB keys, ``FORMAT_VERSION``, sealed values and per-shard records.

See ``docs/design.md`` ("Index layout") for the table of keys. Every value but the
LMDB container's own pages is *sealed*: a little-endian CRC-32 of its key and payload, then the
payload, so a damaged value is an :class:`~tarindex.errors.IndexFormatError`, never data.
"""

from __future__ import annotations

import hashlib
import os
import zlib
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np

from ..errors import IndexFormatError
from ..shards import ShardKind, shard_kind

__all__ = [
    "BLOCK_SAMPLES",
    "BUCKET_KEYS",
    "FORMAT_VERSION",
    "MAGIC",
    "SHARD_BLOCK",
    "ShardInfo",
    "ShardTable",
    "bucket_of",
    "key_hash",
    "numbered",
    "seal",
    "unseal",
]

FORMAT_VERSION = 4
MAGIC = "tarindex"
# Keys, in the order a writer appends them (LMDB keeps keys sorted; appending in order fills pages).
BLOCK_PREFIX = b"b/"  # + u64 big-endian block number: the records of BLOCK_SAMPLES samples
START_KEY = b"c/start"  # u64[n_shards + 1]: first sample of each shard, then n_samples
FRAMES_PREFIX = b"f/"  # + u64 big-endian shard number: a zstd shard's (n_frames, 4) uint64 frame table
KEYS_PREFIX = b"k/"  # + u64 big-endian bucket number: one bucket of the hashed key table
META_KEY = b"meta"  # JSON
SHARDS_PREFIX = b"s/"  # + u64 big-endian block number: JSON list of SHARD_BLOCK shard records

BLOCK_SAMPLES = 1024
"""Samples per record block: sample ``i`` is in block ``i // BLOCK_SAMPLES``."""
SHARD_BLOCK = 1024
"""Shard records per shard block."""
BUCKET_KEYS = 256
"""Keys per bucket of the key table, on average (a bucket of 5-byte entries stays within one page)."""


def numbered(prefix: bytes, number: int) -> bytes:
    """The LMDB key of value ``number`` under ``prefix`` (big-endian, so keys sort by number)."""
    return prefix + number.to_bytes(8, "big")


def seal(key: bytes, payload: bytes | bytearray | memoryview) -> bytes:
    """``payload`` behind the CRC-32 of its LMDB key and itself (4 bytes, little-endian).

    The key is in the checksum, so a value found under another key (a damaged B-tree) is refused too.
    """
    return zlib.crc32(payload, zlib.crc32(key)).to_bytes(4, "little") + bytes(payload)


def unseal(raw: Any, key: bytes, where: str) -> memoryview:
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


@dataclass(frozen=True, slots=True)
class ShardInfo:
    """What the index records about one shard."""

    path: str
    """Path relative to the index's directory (absolute if on another drive)."""
    size: int
    """File size in bytes when indexed."""
    mtime_ns: int
    """Modification time in nanoseconds when indexed."""
    fingerprint: str
    """Hex digest of the size and the first and last 64 KiB."""
    n_samples: int
    """Number of samples."""
    n_members: int
    """Number of members that belong to samples."""
    compression: str | None = None
    """``"zstd"`` for a zstd shard (offsets are then in the decompressed tar), else ``None``."""
    random_access: bool = True
    """Whether one sample can be read without decompressing a large part of the shard."""
    kind: ShardKind = "file"
    """How the shard is opened: ``file`` (``path`` is a path, whatever it looks like), ``url``, or ``command``
    (``pipe:CMD``: run only when the reader allows commands)."""
    outside: bool = False
    """A ``file`` outside the index's directory (built so): ``path`` may then start with ``..`` or be absolute."""
    etag: str | None = None
    """The object's ETag (or generation) when indexed from a URL that has one; reads check it."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: Any) -> ShardInfo:
        """A shard record from its JSON form, every field's type checked.

        Raises:
            IndexFormatError: a field is missing, unknown or of the wrong type or sign.
        """
        if not isinstance(obj, dict) or set(obj) - _SHARD_FIELDS or not set(obj) >= _REQUIRED:
            raise IndexFormatError(f"bad shard record {str(obj)[:200]!r}")
        if "kind" not in obj:  # written without kinds (an edited record): the name's look is all there is
            path = str(obj.get("path", ""))
            norm = os.path.normpath(path)
            obj = {**obj, "kind": shard_kind(path), "outside": os.path.isabs(norm) or norm.split(os.sep)[0] == os.pardir}
        ints = ("size", "mtime_ns", "n_samples", "n_members")
        if not (
            isinstance(obj["path"], str)
            and isinstance(obj["fingerprint"], str)
            and all(type(obj[k]) is int and obj[k] >= 0 for k in ints if k != "mtime_ns")
            and type(obj["mtime_ns"]) is int
            and isinstance(obj.get("compression"), (str, type(None)))
            and type(obj.get("random_access", True)) is bool
            and obj["kind"] in ("file", "url", "command")
            and type(obj.get("outside", False)) is bool
            and isinstance(obj.get("etag", ""), (str, type(None)))
        ):
            raise IndexFormatError(f"bad shard record {str(obj)[:200]!r}")
        return cls(**obj)


_SHARD_FIELDS = {f.name for f in fields(ShardInfo)}
_REQUIRED = {"path", "size", "mtime_ns", "fingerprint", "n_samples", "n_members"}


@dataclass(slots=True)
class ShardTable:
    """The offset tables of one shard, as produced by a scan (:mod:`tarindex.scan`) or cut from an index.

    Plain data: this module walks no tar (the scan module makes tables).
    """

    sample_offset: np.ndarray
    """uint64 per sample: offset of its first header."""
    sample_size: np.ndarray
    """uint64 per sample: whole byte range."""
    sample_nmembers: np.ndarray
    """uint32 per sample: member count."""
    member_ext: np.ndarray
    """uint16 per member: index into ``exts``."""
    member_offset: np.ndarray
    """uint64 per member: data offset relative to its sample's start."""
    member_size: np.ndarray
    """uint64 per member: data size."""
    keys: list[str]
    """Key per sample."""
    exts: list[str] = field(default_factory=list)
    """Extension table the ``member_ext`` values index."""
    frames: np.ndarray | None = None
    """zstd shards: the ``(n_frames, 4)`` uint64 frame table (see :mod:`tarindex.zstd`)."""

    @property
    def n_samples(self) -> int:
        return len(self.keys)

    @property
    def n_members(self) -> int:
        return len(self.member_ext)

    @classmethod
    def from_columns(cls, columns: tuple[Any, ...]) -> ShardTable:
        """A table from a packer's columns (lists of ints or little-endian buffers)."""
        s_off, s_size, s_n, m_ext, m_off, m_size, keys, exts = columns
        return cls(
            _column(s_off, np.uint64),
            _column(s_size, np.uint64),
            _column(s_n, np.uint32),
            _column(m_ext, np.uint16),
            _column(m_off, np.uint64),
            _column(m_size, np.uint64),
            keys,
            exts,
        )


def _column(values: Any, dtype: type[np.generic]) -> np.ndarray:
    if isinstance(values, (bytes, bytearray, memoryview)):  # the C packer's, in native byte order
        return np.frombuffer(values, dtype)
    return np.array(values, dtype)


def key_hash(key: bytes) -> int:
    """The 64-bit hash of a key in the key table (BLAKE2b, so it is the same in every process)."""
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")


def bucket_of(h: int, n_buckets: int) -> int:
    """The bucket of hash ``h``: its high 32 bits scaled to ``n_buckets`` (so buckets follow hash order)."""
    return ((h >> 32) * n_buckets) >> 32
