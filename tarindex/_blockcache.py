"""An optional local cache of remote byte ranges, shared by the processes of a node.

Each range a remote read fetched (a sample's bytes) is one entry, named by a digest of the shard's
identity (URL, size, ETag or modification time) and the range, so a changed object never hits old
entries. Entries are written atomically (temporary name, rename) by :class:`tarindex._filecache.FileCache`,
whose directory, marker and lock this cache shares; a counter of the bytes in use, updated under the
lock, keeps the bound without listing the directory on every write: when a write would pass the
bound, the least recently used entries are deleted down to 90% of it (one listing per tenth of the
bound written). A hit marks its entry recently used.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ._atomic import atomic_write, write_error
from ._filecache import FileCache

if TYPE_CHECKING:
    from .objstore import Remote

__all__ = ["BlockCache", "CachedReader"]

_ENTRY = r"[0-9a-f]{32}\.blk"
_USAGE = ".usage"


class BlockCache:
    """Byte ranges of remote shards under ``root/tarindex-blocks/``, at most ``max_bytes`` in total.

    Raises:
        TarIndexError: the subdirectory exists and is not a tarindex cache.
        WriteError: the directory cannot be created.
    """

    def __init__(self, root: str | os.PathLike[str], max_bytes: int) -> None:
        self.files = FileCache(root, "blocks", _ENTRY, max_bytes)
        self.max_bytes = max_bytes
        self._usage = self.files.dir / _USAGE

    @staticmethod
    def name(identity: str, offset: int, size: int) -> str:
        """The entry name of ``size`` bytes at ``offset`` of the shard ``identity``."""
        digest = hashlib.blake2b(f"{identity}\0{offset}\0{size}".encode(), digest_size=16).hexdigest()
        return digest + ".blk"

    def get(self, name: str, size: int) -> bytes | None:
        """The entry's bytes if it holds exactly ``size`` bytes (marked recently used), else ``None``."""
        fd = self.files.open(name, size)
        if fd is None:
            return None
        try:
            data = os.pread(fd, size, 0)
        finally:
            os.close(fd)
        return data if len(data) == size else None

    def put(self, name: str, data: bytes) -> None:
        """Store ``data`` as entry ``name`` (nothing if larger than the bound, or if already there).

        Raises:
            WriteError: the entry could not be written (full disk, read-only directory).
        """
        size = len(data)
        if size > self.max_bytes:
            return
        target = self.files.path(name)
        if target.exists():
            return
        with self.files.locked():
            if target.exists():
                return
            used = self._read_usage()
            if used + size > self.max_bytes:
                self.files.evict(int(self.max_bytes * 0.9) - size)
                used = sum(s for _, s, _ in self.files.entries())
            with atomic_write(target) as f:
                f.write(data)
            self._write_usage(used + size)

    def used(self) -> int:
        """Bytes in this cache's entries now (lists the directory)."""
        return sum(size for _, size, _ in self.files.entries())

    def _read_usage(self) -> int:
        """The bytes in use, from the counter (a listing if it is missing or unreadable); under the lock."""
        try:
            return int(self._usage.read_bytes().strip() or b"x")
        except (FileNotFoundError, ValueError):
            return self.used()

    def _write_usage(self, used: int) -> None:
        """Rewrite the counter in place (under the lock; a torn counter is recounted by :meth:`_read_usage`)."""
        try:
            fd = os.open(self._usage, os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                data = str(used).encode()
                os.pwrite(fd, data, 0)
                os.ftruncate(fd, len(data))
            finally:
                os.close(fd)
        except OSError as exc:
            raise write_error(self._usage, exc) from exc


class CachedReader:
    """A remote reader (``read_at``) whose ranges are looked up in, and added to, a :class:`BlockCache`."""

    def __init__(self, inner: Remote, cache: BlockCache, identity: str) -> None:
        self.inner = inner
        self.cache = cache
        self.identity = identity
        self.url = getattr(inner, "url", identity)

    def cached(self, offset: int, size: int) -> bytes | None:
        """The range from the cache, or ``None``."""
        return self.cache.get(BlockCache.name(self.identity, offset, size), size)

    def store(self, offset: int, size: int, data: bytes) -> None:
        """Add a complete range fetched by the inner reader.

        Raises:
            WriteError: the entry could not be written.
        """
        if len(data) == size:
            self.cache.put(BlockCache.name(self.identity, offset, size), data)

    def read_many(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """Every ``(offset, size)``, in order: the cache's, the rest fetched as one batch of the inner reader's
        (:func:`tarindex.objstore.read_many`), then cached.

        Raises:
            StaleIndexError, ShardNotFoundError, SourceError: as the inner reader.
        """
        from .objstore import read_many  # the batch reader of every remote reader (it imports this module)

        return read_many([(self, offset, size) for offset, size in ranges], self.inner.options)

    def read_at(self, offset: int, size: int) -> bytes:
        """``size`` bytes at ``offset``: from the cache, else from the inner reader (then cached).

        Raises:
            StaleIndexError, ShardNotFoundError, SourceError: as the inner reader.
        """
        data = self.cached(offset, size)
        if data is None:
            data = self.inner.read_at(offset, size)
            self.store(offset, size, data)
        return data

    @property
    def size(self) -> int:
        """The inner reader's size."""
        return int(self.inner.size)

    def fileno(self) -> None:
        """``None``: no descriptor's positional reads give these bytes (:class:`tarindex.access.reader.RandomReader`)."""
        return None

    def close(self) -> None:
        """Close the inner reader."""
        with contextlib.suppress(Exception):
            self.inner.close()
