"""Local files on storage with latency: which they are, and reads of them sized for it.

``TarStream`` and ``build`` walk a local plain tar with ``pread`` windows (headers) and one read per member
(the C walk), or with one reader thread (Python): on a file system where each read is a round trip (NFS,
Lustre, GPFS, a FUSE-mounted bucket), that is one round trip per member. There a shard is read instead
in blocks of ``block_size`` (1 MiB), ``READ_AHEAD`` of them in flight on the process's read pool, and the
walk runs over those chunks in memory. Where the storage is is read from the mount table (the file
system type of the file's device); a local disk keeps today's path, which its own readahead serves.

The read pool (``executor``) is shared with the batches of ``tarindex._localbatch``: threads started as
reads need them (at most ``THREADS_MAX``), made anew in a forked child.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

__all__ = ["READ_AHEAD", "THREADS_MAX", "block_chunks", "executor", "fs_type", "slow_device", "slow_storage"]

READ_AHEAD = 8
"""Blocks in flight while a shard on slow storage is read in order (8 reached 0.9x of what 8 threads
reading 1 MiB blocks get through a 1 ms FUSE mount: docs/performance.md)."""
THREADS_MAX = 256
"""Threads of the process's read pool."""
SLOW_TYPES = frozenset(
    {"nfs", "nfs4", "lustre", "gpfs", "ceph", "cifs", "smb3", "smbfs", "9p", "beegfs", "glusterfs", "afs", "orangefs", "pvfs2", "davfs"}
)
"""File systems (``/proc/self/mountinfo``'s type) read over a network; every ``fuse`` and ``fuse.*`` type too
(gcsfuse, mountpoint-s3, s3fs, JuiceFS, ...)."""

_pool: list[ThreadPoolExecutor] = []
_lock = threading.Lock()
_types: dict[int, str | None] = {}


def _forked() -> None:  # the parent's threads do not exist in a child
    global _lock
    _pool.clear()
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_forked)


def executor() -> ThreadPoolExecutor:
    """This process's read pool."""
    with _lock:
        if not _pool:
            _pool.append(ThreadPoolExecutor(THREADS_MAX, thread_name_prefix="tarindex-read"))
        return _pool[0]


def fs_type(dev: int) -> str | None:
    """The file system type of device ``dev`` (``st_dev``) from ``/proc/self/mountinfo``, or ``None``
    (not found, or no such table: not Linux). Looked up once per device and process."""
    if dev in _types:
        return _types[dev]
    found = None
    want = f"{os.major(dev)}:{os.minor(dev)}"
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split(" ")
            if len(fields) > 4 and fields[2] == want and "-" in fields:
                found = fields[fields.index("-") + 1]
                break
    _types[dev] = found
    return found


def slow_storage(fd: int) -> bool:
    """Whether the open file ``fd`` lies on a network or FUSE file system (:data:`SLOW_TYPES`)."""
    return slow_device(os.fstat(fd).st_dev)


@functools.cache
def slow_device(dev: int) -> bool:
    """Whether device ``dev`` (``st_dev``) is a network or FUSE file system (:data:`SLOW_TYPES`): asked once per
    device and process (a cached answer runs no Python code: a stream asks it for every shard)."""
    kind = fs_type(dev)
    return kind is not None and (kind in SLOW_TYPES or kind == "fuse" or kind.startswith(("fuse.", "fuseblk")))


def block_chunks(fd: int, size: int, *, block: int = 1 << 20, ahead: int = READ_AHEAD) -> Iterator[bytes]:
    """The bytes of ``fd`` from 0 to ``size`` in order, as blocks of ``block`` bytes read ``ahead`` at a time
    by the read pool (``os.pread`` releases the GIL); a block shorter than asked (the file ended) is the last.

    Raises:
        OSError: a read failed.
    """
    pool = executor()
    offsets = iter(range(0, size, block))
    pending: deque[Future[bytes]] = deque()
    try:
        for _, off in zip(range(max(1, ahead)), offsets):
            pending.append(pool.submit(os.pread, fd, block, off))
        while pending:
            data = pending.popleft().result()
            nxt = next(offsets, None)
            if nxt is not None:
                pending.append(pool.submit(os.pread, fd, block, nxt))
            if data:
                yield data
            if len(data) < block:
                return
    finally:
        for f in pending:  # reads left when the walk stopped early: cancelled, or waited for (the caller closes fd)
            if not f.cancel():
                with contextlib.suppress(Exception):
                    f.result()
