"""Index layout: LMDB keys, column types, ``FORMAT_VERSION`` and per-shard records.

See ``docs/design.md`` ("Index layout") for the table of keys.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .._native import SPEEDUPS
from ..samples import SampleRecord, group_members
from ..tar import Entry

# the common case of grouping and packing in C; from_samples(group_members(...)) is the reference
_pack_members = SPEEDUPS.pack_members if SPEEDUPS is not None else None

__all__ = ["COLUMNS", "FORMAT_VERSION", "MAGIC", "ShardInfo", "ShardTable"]

FORMAT_VERSION = 3
MAGIC = "tarindex"
META_KEY = b"meta"
KEY_PREFIX = b"key/"
COL_PREFIX = b"col/"
FRAMES_PREFIX = b"frames/"  # + shard number: a zstd shard's (n_frames, 4) uint64 frame table

#: Column name -> dtype. Every column is one little-endian array; ``records`` holds one
#: variable-length record per sample (layout in :mod:`tarindex.index.records`).
COLUMNS: dict[str, str] = {
    "shard_start": "<u8",
    "record_offset": "<u8",
    "records": "u1",
}


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

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> ShardInfo:
        return cls(**obj)


@dataclass(slots=True)
class ShardTable:
    """The offset tables of one shard, as produced by a scan (or cut from an index)."""

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
    def from_entries(cls, entries: Iterable[Entry], path: str) -> ShardTable:
        """Group a shard's :func:`tarindex.tar.iter_tar` entries into samples and pack them.

        The C extension does the common case (every name has a dot in its base
        name and no leading ``_``); otherwise, or without the extension,
        :func:`tarindex.samples.group_members` does it, with the full key rules.

        Raises:
            DuplicateMemberError: two members of one sample have the same extension.
            CorruptArchiveError: the entries' archive is not valid (from the walk).
        """
        listed = list(entries)
        packed = _pack_members(listed) if _pack_members is not None else None
        if packed is None:
            return cls.from_samples(group_members(listed, path))
        s_off, s_size, s_n, m_ext, m_off, m_size, keys, exts = packed
        return cls(
            np.frombuffer(s_off, np.uint64),
            np.frombuffer(s_size, np.uint64),
            np.frombuffer(s_n, np.uint32),
            np.frombuffer(m_ext, np.uint16),
            np.frombuffer(m_off, np.uint64),
            np.frombuffer(m_size, np.uint64),
            keys,
            exts,
        )

    @classmethod
    def from_samples(cls, samples: Iterable[SampleRecord]) -> ShardTable:
        """Pack sample records into arrays."""
        s_off: list[int] = []
        s_size: list[int] = []
        s_n: list[int] = []
        keys: list[str] = []
        m_ext: list[int] = []
        m_off: list[int] = []
        m_size: list[int] = []
        ext_ids: dict[str, int] = {}
        for rec in samples:
            keys.append(rec.key)
            s_off.append(rec.offset)
            s_size.append(rec.size)
            s_n.append(len(rec.members))
            base = rec.offset
            for ext, off, size in rec.members:
                eid = ext_ids.get(ext)
                if eid is None:
                    eid = ext_ids[ext] = len(ext_ids)
                m_ext.append(eid)
                m_off.append(off - base)
                m_size.append(size)
        return cls(
            np.array(s_off, np.uint64),
            np.array(s_size, np.uint64),
            np.array(s_n, np.uint32),
            np.array(m_ext, np.uint16),
            np.array(m_off, np.uint64),
            np.array(m_size, np.uint64),
            keys,
            list(ext_ids),
        )
