"""Is this still the indexed shard? The one rule, for reads, ``verify`` and incremental builds.

Same size and mtime: the indexed shard. Same size, another mtime (a copy made by ``cp -r`` or
``rsync`` without ``-t``, a restore from backup): the fingerprint (size, first and last 64 KiB) is
compared once, and an identical copy is accepted. Anything else is a :class:`StaleIndexError` that
names what changed.

What the rule cannot see: a shard rewritten in place with the same size and the same mtime (``touch -r``),
or with another mtime and its first and last 64 KiB unchanged. ``verify="fingerprint"`` (``TarDataset``)
compares the fingerprint at every first open even when the mtime matches (changes within 64 KiB of either
end). A change in the middle is seen where it moves, renames or resizes a member: by every read of a sample
whose headers no longer say what its record says (:mod:`tarindex._readcheck`) and by ``tarindex verify --deep``
(a rescan compared with every record). A member's bytes changed with its header's name, type and size kept (a
caption rewritten to the same length) is seen by none of them: the index holds no checksum of member contents.
"""

from __future__ import annotations

import dataclasses
import errno
import os
from array import array
from typing import Literal

from .errors import StaleIndexError
from .shards import fingerprint
from .sources import open_regular
from .tables import ShardInfo

__all__: list[str] = []  # internal module: its names serve the package, the public API is tarindex.__all__

_noatime = getattr(os, "O_NOATIME", 0)  # 0 once the system refuses it (a shard this user does not own)


def open_shard(path: str) -> tuple[int, os.stat_result]:
    """A read-only descriptor of a local shard for random reads, and its ``fstat``: opened with ``O_NOATIME`` where
    the system allows it (the caller owns the file, or is privileged): each read then skips the access-time check
    that costs a cache miss on the file's kernel structures when thousands of shards are open; else a plain open.
    Never blocks: a FIFO in a shard's place is refused (:func:`tarindex.sources.open_regular`).

    Raises:
        NotRegularFileError: the path is a FIFO, a socket, a device or a directory.
        OSError: the file cannot be opened (``FileNotFoundError`` when it is missing).
    """
    global _noatime
    if _noatime:
        try:
            return open_regular(path, _noatime)
        except PermissionError as exc:
            if exc.errno != errno.EPERM:  # EACCES: not readable at all, said by the plain open below
                raise
            _noatime = 0  # EPERM: not this user's file; never asked again in this process
    return open_regular(path)


Check = Literal["stat", "fingerprint"]
"""``stat``: size and mtime, the fingerprint when only the mtime differs; ``fingerprint``: always the fingerprint too."""


def check_shard(path: str, fd: int, info: ShardInfo, *, check: Check = "stat", st: os.stat_result | None = None) -> int:
    """Check that the open file ``fd`` (whose ``fstat`` is ``st`` when the caller has it) is the shard ``info``
    describes; returns its mtime in nanoseconds.

    Raises:
        StaleIndexError: the size differs, or the fingerprint does (compared when the mtime differs,
            or always with ``check="fingerprint"``).
    """
    if st is None:
        st = os.fstat(fd)
    if st.st_size != info.size:
        raise StaleIndexError(path, f"size {info.size} -> {st.st_size}")
    if st.st_mtime_ns == info.mtime_ns and check == "stat":
        return st.st_mtime_ns
    if fingerprint(fd, st.st_size) != info.fingerprint:
        what = "content fingerprint differs"
        if st.st_mtime_ns != info.mtime_ns:
            raise StaleIndexError.of_mtime(path, info.mtime_ns, st.st_mtime_ns, f", {what}")
        raise StaleIndexError(path, what)
    return st.st_mtime_ns


def check_source(url: str, info: ShardInfo, size: int | None, mtime_ns: int) -> None:
    """Check a shard read over a URL or a pipe (no descriptor to fingerprint cheaply) against its index
    entry: the size when known (``None`` or negative: unknown), the modification time when both sides
    know one (0: unknown; a server's ``Last-Modified``).

    Raises:
        StaleIndexError: the size or the modification time differs from the index.
    """
    if size is not None and size >= 0 and size != info.size:
        raise StaleIndexError(url, f"size {info.size} -> {size}")
    if mtime_ns and info.mtime_ns and mtime_ns != info.mtime_ns:
        raise StaleIndexError.of_mtime(url, info.mtime_ns, mtime_ns)


def current_info(path: str, info: ShardInfo) -> ShardInfo | None:
    """``info`` with the file's current mtime when ``path`` is still that shard (see the module rule), else ``None``."""
    try:
        fd, st = open_regular(path)  # a FIFO in its place: not that shard (its scan then names it)
    except OSError:
        return None
    try:
        mtime_ns = check_shard(path, fd, info, st=st)
    except StaleIndexError:
        return None
    finally:
        os.close(fd)
    return info if mtime_ns == info.mtime_ns else dataclasses.replace(info, mtime_ns=mtime_ns)


class Checked:
    """Plain local shards this process has checked against their index records (by :func:`check_shard`):
    each one's size and mtime at that check, 16 bytes a shard, made on first use.

    A shard reopened after its descriptor was evicted, whose ``fstat`` still shows both, is the shard that
    passed (the module rule) and needs neither its record nor its fingerprint again: random reads over
    more shards than stay open (``max_open_files``) then cost an ``open`` and an ``fstat``, not a shard
    record decoded (a block of them, about 1 ms, once the decoded blocks no longer hold every shard).
    """

    def __init__(self, n_shards: int) -> None:
        self._n = n_shards
        self._size: array[int] | None = None  # -1: not checked in this process
        self._mtime: array[int] | None = None

    def reopen(self, path: str, shard: int) -> tuple[int, int] | None:
        """A descriptor of ``path`` and its size when ``shard`` was checked and its size and mtime are unchanged,
        else ``None`` (the caller then checks it in full, which names what changed)."""
        if self._size is None or self._mtime is None or self._size[shard] < 0:
            return None
        try:
            fd, st = open_shard(path)
        except OSError:
            return None
        if st.st_size == self._size[shard] and st.st_mtime_ns == self._mtime[shard]:
            return fd, st.st_size
        os.close(fd)
        return None

    def remember(self, shard: int, size: int, mtime_ns: int) -> None:
        """``shard`` passed the check with this size and mtime."""
        if self._size is None or self._mtime is None:
            self._size, self._mtime = array("q", [-1]) * self._n, array("q", [0]) * self._n
        self._size[shard], self._mtime[shard] = size, mtime_ns
