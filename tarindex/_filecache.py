"""Caches that own only what they made.

A cache keeps its entries in its own subdirectory of the directory the caller names, marked as a
tarindex cache by a marker file, evicts only entries it made (names of its own form, in that
subdirectory), and takes an exclusive ``fcntl`` lock while it adds or evicts, so processes sharing a
cache directory do not fill or delete each other's entries. Pointing a cache at a data directory
leaves the data alone. Entries are written by :func:`tarindex._atomic.atomic_write`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from ._atomic import atomic_write, write_error
from .errors import TarIndexError

__all__ = ["MARKER", "FileCache"]

MARKER = ".tarindex-cache"
_LOCK = ".lock"


class FileCache:
    """Whole files under ``root/tarindex-<kind>/``, bounded to ``max_bytes``, least recently used evicted.

    Args:
        root: the directory the caller named (created if needed).
        kind: the cache's name (its subdirectory is ``tarindex-<kind>``).
        entry: the form of this cache's entry names (a regular expression matched in full).
        max_bytes: the bound on the entries' total size.

    Raises:
        TarIndexError: the subdirectory exists, holds files and has no marker (not ours: left alone).
        WriteError: the directory or marker cannot be created.
    """

    def __init__(self, root: str | os.PathLike[str], kind: str, entry: str, max_bytes: int) -> None:
        self.dir = Path(root) / f"tarindex-{kind}"
        self.kind = kind
        self._entry = re.compile(entry)
        self.max_bytes = max_bytes
        marker = self.dir / MARKER
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            if not marker.is_file():
                with self.locked():  # another process may be marking it now
                    self._mark(marker)
        except OSError as exc:
            raise write_error(self.dir, exc) from exc

    def _mark(self, marker: Path) -> None:
        """Mark an empty subdirectory as this cache (under the lock)."""
        if marker.is_file():
            return
        if any(p.name != _LOCK for p in self.dir.iterdir()):
            raise TarIndexError(f"{self.dir}: exists and is not a tarindex cache (no {MARKER}); choose another directory")
        with atomic_write(marker) as f:
            f.write(json.dumps({"cache": self.kind}).encode())

    def path(self, name: str) -> Path:
        """Where entry ``name`` lives.

        Raises:
            ValueError: ``name`` is not of this cache's form (never a path outside the cache).
        """
        if not self._entry.fullmatch(name):
            raise ValueError(f"{name!r} is not a {self.kind} cache entry name")
        return self.dir / name

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the cache's exclusive lock (across processes)."""
        fd = os.open(self.dir / _LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def open(self, name: str, size: int) -> int | None:
        """A read-only descriptor of entry ``name`` if it exists with ``size`` bytes (marked recently used), else ``None``."""
        target = self.path(name)
        try:
            fd = os.open(target, os.O_RDONLY)
        except FileNotFoundError:
            return None
        if os.fstat(fd).st_size != size:
            os.close(fd)
            return None
        with contextlib.suppress(OSError):
            os.utime(target)  # most recently used
        return fd

    def add(self, name: str, size: int, fill: Callable[[BinaryIO], None]) -> int:
        """A read-only descriptor of entry ``name``, made by ``fill`` (which must write ``size`` bytes) unless another
        process made it meanwhile; older entries are evicted first to keep the bound.

        Raises:
            WriteError: the entry could not be written (full disk, read-only directory).
        """
        target = self.path(name)
        with self.locked():
            found = self.open(name, size)
            if found is not None:
                return found
            self.evict(self.max_bytes - size)
            with atomic_write(target) as f:
                fill(f)
            return os.open(target, os.O_RDONLY)

    def entries(self) -> list[tuple[int, int, Path]]:
        """``(mtime_ns, size, path)`` of every entry this cache made."""
        out = []
        for p in self.dir.iterdir():
            if not self._entry.fullmatch(p.name):
                continue
            try:
                st = p.stat()
            except FileNotFoundError:
                continue
            out.append((st.st_mtime_ns, st.st_size, p))
        return out

    def evict(self, budget: int) -> None:
        """Delete this cache's least recently used entries until they total at most ``budget`` bytes."""
        entries = self.entries()
        used = sum(size for _, size, _ in entries)
        for _, size, p in sorted(entries):
            if used <= budget:
                break
            p.unlink(missing_ok=True)
            used -= size
