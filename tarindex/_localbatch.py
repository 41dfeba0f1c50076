"""A batch of ranges of local files read together: the Python reader's ``TarDataset.__getitems__`` (the C
reader's is ``Reader.read_batch``, over ``_batchio.c``; both follow the same plan).

On storage where each read is a round trip (NFS, Lustre, a FUSE-mounted bucket) or from a cold disk, one
read at a time gets 1/latency samples a second; the storage serves many at once. The ranges are merged
where neighbours of one file lie at most ``coalesce_gap`` bytes apart, each merged read is first tried
from the page cache without waiting (``preadv`` with ``RWF_NOWAIT``), and what the cache misses is read by
a thread pool (``os.pread`` releases the GIL), at most ``max_in_flight`` reads at once. A file system
without ``RWF_NOWAIT`` reads inline while each read stays fast, then hands the file's later reads to the
pool (its mode, kept by the caller per file, as the C reader keeps it). The pool is the process's read pool
(:func:`tarindex._localreads.executor`).
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import MutableSequence, Sequence

from ._localreads import THREADS_MAX, executor
from ._ranges import coalesce

__all__ = ["NOWAIT", "POOL", "SLOW_SECONDS", "TIMED", "read_ranges"]

NOWAIT, TIMED, POOL = 0, 1, 2
"""A file's mode (as ``_batchio.h``): the page cache tried first; no ``RWF_NOWAIT``, inline while fast; by the pool."""
SLOW_SECONDS = 200e-6
"""An inline read this slow came from the storage, not the page cache."""
_RWF_NOWAIT: int | None = getattr(os, "RWF_NOWAIT", None)
_UNSUPPORTED = (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS)


class _Group:
    """A merged read: ``size`` bytes of ``fd`` at ``start``, serving the ranges numbered ``members``."""

    __slots__ = ("data", "err", "fd", "key", "members", "size", "start")

    def __init__(self, fd: int, key: int, start: int, size: int, members: list[int]) -> None:
        self.fd, self.key, self.start, self.size, self.members = fd, key, start, size, members
        self.data = b""
        self.err: OSError | None = None

    def read(self) -> None:
        """The whole range with ``os.pread`` (short only where the file ends)."""
        try:
            parts = []
            at, left = self.start, self.size
            while left:
                got = os.pread(self.fd, left, at)
                if not got:
                    break
                parts.append(got)
                at += len(got)
                left -= len(got)
            self.data = parts[0] if len(parts) == 1 else b"".join(parts)
        except OSError as exc:
            self.err = exc

    def read_nowait(self) -> bool | None:
        """From the page cache only: True when read (or failed), False on a miss, None without ``RWF_NOWAIT``."""
        if _RWF_NOWAIT is None or not self.size:
            return None
        buf = bytearray(self.size)
        try:
            got = os.preadv(self.fd, [buf], self.start, _RWF_NOWAIT)
        except BlockingIOError:
            return False
        except OSError as exc:
            if exc.errno in _UNSUPPORTED:
                return None
            self.err = exc
            return True
        if got < self.size:
            return False  # part cached: the pool reads it all
        self.data = bytes(buf)
        return True


def _inline(group: _Group, modes: MutableSequence[int]) -> bool:
    """Read the group in this thread as its file's mode says; False: for the pool."""
    mode = modes[group.key]
    if mode == POOL:
        return False
    if mode == NOWAIT:
        done = group.read_nowait()
        if done is not None:
            return done
        modes[group.key] = TIMED
    t0 = time.perf_counter()
    group.read()
    if time.perf_counter() - t0 > SLOW_SECONDS:
        modes[group.key] = POOL
    return True


def _plan(requests: Sequence[tuple[int, int, int, int]], gap: int) -> list[_Group]:
    by_file: dict[tuple[int, int], list[int]] = {}
    for k, (fd, key, _, _) in enumerate(requests):
        by_file.setdefault((key, fd), []).append(k)
    groups: list[_Group] = []
    for (key, fd), ks in sorted(by_file.items()):
        ranges = [(requests[k][2], requests[k][3]) for k in ks]
        for start, end, members in coalesce(ranges, gap) if gap >= 0 else [(o, o + n, [m]) for m, (o, n) in enumerate(ranges)]:
            groups.append(_Group(fd, key, start, end - start, [ks[m] for m in members]))
    return groups


def read_ranges(requests: Sequence[tuple[int, int, int, int]], modes: MutableSequence[int], *, max_in_flight: int, coalesce_gap: int) -> list[bytes | OSError]:
    """The bytes of every ``(fd, file number, offset, size)`` in the order given (short where the file ends),
    or the ``OSError`` its read met. ``modes[file number]`` is the file's mode, updated here.
    """
    groups = _plan(requests, coalesce_gap)
    missed: list[_Group] = []
    hits = 0
    for g in groups:  # after 8 misses and no hit, the rest straight to the pool
        if len(missed) >= 8 and not hits and modes[g.key] == NOWAIT:
            missed.append(g)
        elif _inline(g, modes):
            hits += 1
        else:
            missed.append(g)
    if missed:
        _read_pooled(missed, max(1, min(max_in_flight, THREADS_MAX)))
    out: list[bytes | OSError] = [b""] * len(requests)
    for g in groups:
        for k in g.members:
            if g.err is not None:
                out[k] = g.err
            else:
                at = requests[k][2] - g.start
                out[k] = g.data if at == 0 and requests[k][3] == len(g.data) else g.data[at : at + requests[k][3]]
    return out


def _read_pooled(groups: list[_Group], in_flight: int) -> None:
    """Every group read, ``in_flight`` at a time: this thread and up to ``in_flight - 1`` of the pool."""
    todo = iter(groups)
    lock = threading.Lock()

    def task() -> None:
        while True:
            with lock:
                g = next(todo, None)
            if g is None:
                return
            g.read()

    helpers = min(in_flight, len(groups)) - 1
    futures = [executor().submit(task) for _ in range(helpers)]
    task()
    for f in futures:
        f.result()
