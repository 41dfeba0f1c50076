"""What a scan finds in a shard and the index stores: ``ShardInfo`` (identity, counts, kind) and
``ShardTable`` (offset tables of its samples and members).

Plain data below both the scan (which fills them) and the index (which stores them): this module
reads no file and walks no tar.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

from .errors import IndexFormatError
from .naming import ShardKind, ShardRef

if TYPE_CHECKING:
    import numpy as np  # imported on use: the index's meta (`tarindex info`) is read without numpy

__all__: list[str] = []  # internal: the index and the scan share these records

MAX_EXTS = 1 << 16
"""Distinct extensions a shard's tables, and an index, can number (a member's extension is a u16)."""


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
            obj = {**obj, "kind": ShardRef.of(path).stored, "outside": os.path.isabs(norm) or norm.split(os.sep)[0] == os.pardir}
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
    gzip_points: bytes | None = None
    """gzip shards: the encoded seek-point table (see :mod:`tarindex.gzip_random`)."""

    @property
    def n_samples(self) -> int:
        return len(self.keys)

    @property
    def n_members(self) -> int:
        return len(self.member_ext)

    @classmethod
    def from_columns(cls, columns: tuple[Any, ...]) -> ShardTable:
        """A table from a packer's columns (lists of ints or little-endian buffers)."""
        import numpy as np

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
    import numpy as np

    if isinstance(values, (bytes, bytearray, memoryview)):  # the C packer's, in native byte order
        return np.frombuffer(values, dtype)
    return np.array(values, dtype)
