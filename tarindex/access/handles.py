"""The owner of a process's open shard handles: :class:`HandleTable`.

A handle is a :class:`~tarindex.access.reader.RandomReader` (made by :func:`tarindex.access.open.open_random`).
A :class:`HandleTable` holds a process's handles of one index's shards: it opens them (through a function
that makes the checks), counts the reads in progress on each, evicts the least recently used beyond a
bound (or when the process runs out of descriptors), and closes a handle only once no read uses it, so a
descriptor number is never reused under a read, ``close()`` included.

The bound is two-fold: each table's own (``max_open_files`` of its dataset), and one for the whole process
(:class:`_Budget`: half the soft ``RLIMIT_NOFILE``, lowered when the process runs out of descriptors), shared
by every table of every dataset and mix: twenty datasets under ``ulimit -n 64`` evict each other's least
recently used files instead of running out.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import resource
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable

import numpy as np

from ..errors import DescriptorLimitError
from .reader import RandomReader

__all__: list[str] = []  # internal module: its names serve the package, the public API is tarindex.__all__


_MAX_BUDGET = 1 << 20  # handles open at once, whatever the limit (RLIM_INFINITY)


_RLIMIT_EVERY = 64  # opens between two readings of RLIMIT_NOFILE (a system call)


class _Budget:
    """The process-wide bound on open shard handles, shared by every :class:`HandleTable`, and the order in
    which they were opened (or last asked for) across all of them.

    The bound is half the soft ``RLIMIT_NOFILE`` (read again every ``_RLIMIT_EVERY`` opens, and used anew when it
    changed), the other half left to the rest of the process (index files, sockets, DataLoader pipes); lowered
    to what the process could hold when an open fails with ``EMFILE``/``ENFILE``, or takes its last descriptor.

    Threads: ``order`` changes by single calls (an insertion, a ``move_to_end``, a ``pop``: one step under the
    GIL each) made by an table holding its own lock; :meth:`evict_oldest` works on a copy of its oldest
    entries, under ``lock``, and evicts another table's handle only if that table's lock is free at once
    (``acquire(blocking=False)``; else the next oldest), so datasets never wait on each other's opens (a URL
    shard's can take seconds) and no two locks are ever waited for in opposite orders.
    """

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.order: OrderedDict[tuple[int, int], weakref.ref[HandleTable]] = (
            OrderedDict()
        )  # (table, shard), oldest first
        self._soft = -1
        self._limit = 0
        self._opens = 0
        self.last_fd = 0

    def limit(self) -> int:
        self._opens += 1
        if self._opens >= _RLIMIT_EVERY or self._soft < 0:
            self._opens = 0
            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            if soft != self._soft:
                self._soft = soft
                infinite = soft == resource.RLIM_INFINITY
                self._limit = _MAX_BUDGET if infinite else max(1, min(soft // 2, _MAX_BUDGET))
                self.last_fd = _MAX_BUDGET << 4 if infinite else soft - 1  # an open that got it took the last one
        return self._limit

    def lower(self, held: int) -> None:
        """The process ran out of descriptors with ``held`` handles open: hold one fewer from now on (a descriptor
        left for the rest of the process); the limit is read again at the next open."""
        self._limit = max(1, held - 1)
        self._opens = _RLIMIT_EVERY

    def make_room(self) -> None:
        """Evict the least recently used handles of any table until one more fits the bound."""
        while len(self.order) >= self._limit and self.evict_oldest():
            pass

    def evict_oldest(self) -> bool:
        """Evict the least recently used handle whose table is free to evict it now; ``False`` when none is."""
        with self.lock:
            for some in (64, None):  # the oldest few first: a copy of all of them only if none of those would do
                for key, ref in list(itertools.islice(self.order.items(), some)):  # copied in one step
                    table = ref()
                    if table is None or key[1] not in table._lru:  # gone, or closed meanwhile: no handle to count
                        self.order.pop(key, None)
                        continue
                    if not table._lock.acquire(blocking=False):  # that table is busy (opening): not waited for
                        continue
                    try:
                        if key[1] in table._lru:
                            table._evict(key[1])
                            return True
                    finally:
                        table._lock.release()
                if some is not None and len(self.order) <= some:
                    break
        return False

    def touch(self, table: HandleTable, shard: int) -> None:
        with contextlib.suppress(KeyError):  # evicted by another thread meanwhile: nothing to move
            self.order.move_to_end((table._serial, shard))

    def forget(self, table: HandleTable, shard: int) -> None:
        self.order.pop((table._serial, shard), None)


_BUDGET = _Budget()


def _new_budget() -> None:  # a forked child holds none of the parent's handles as its own, nor its lock
    global _BUDGET
    _BUDGET = _Budget()


os.register_at_fork(after_in_child=_new_budget)
_SERIAL = itertools.count()


class HandleTable:
    """The one owner of a process's open handles of one index's shards.

    Its tables are read by the C reader without a call and written only here, with the GIL held:

    - ``fds``: int32 per shard, the descriptor of a shard open here whose reader has one (``fileno()``), else -1;
    - ``handles``: per shard, the reader of a shard open here, else ``None``;
    - ``busy``: uint32 per shard, reads in progress in the C reader (counted before it looks at the
      tables, until the read is done; the GIL is released while it reads), and one more entry: the
      number of closed handles waiting for their reads to end (the C reader calls :meth:`reap`
      after a read while it is not zero).

    The Python reader counts its reads with :meth:`acquire` and :meth:`release`.

    Args:
        n_shards: shards of the index.
        open_handle: opens shard ``i`` and makes the checks (:func:`tarindex.access.open.open_random`).
        max_open: bound on this table's open handles (least recently used evicted). The process-wide bound
            (:class:`_Budget`) applies too: an open beyond it evicts the least recently used handle of any
            table; one that fails with ``EMFILE`` evicts one, lowers that bound and retries.
    """

    def __init__(self, n_shards: int, open_handle: Callable[[int], RandomReader], max_open: int) -> None:
        self.fds = np.full(n_shards, -1, np.int32)
        self.handles: list[RandomReader | None] = [None] * n_shards
        self.busy = np.zeros(n_shards + 1, np.uint32)
        self.max_open = max(1, max_open)
        self._open_handle = open_handle
        self._n = n_shards
        self._lru: OrderedDict[int, RandomReader] = OrderedDict()  # shard -> handle, least recently used first
        self._closing: list[tuple[int, RandomReader]] = []  # evicted or closed while read: closed when their reads end
        self._py_busy: dict[int, int] = {}  # the Python reader's reads in progress
        self._lock = threading.RLock()
        self._budget = _BUDGET
        self._serial = next(_SERIAL)
        self._ref = weakref.ref(self)

    def open(self, shard: int) -> RandomReader:
        """Shard ``shard``'s handle, opened if needed (the caller has counted its read in ``busy``).

        Raises:
            whatever ``open_handle`` raises; OSError: out of descriptors with nothing left to evict.
        """
        with self._lock:
            handle = self._lru.get(shard)
            if handle is not None:
                self._lru.move_to_end(shard)
                self._budget.touch(self, shard)
                return handle
            if self._closing:
                self.reap()
            while len(self._lru) >= self.max_open:
                self._evict(next(iter(self._lru)))
            budget = self._budget
            if len(budget.order) >= budget.limit():
                budget.make_room()
            handle = self._open_retrying(shard)
            fd = handle.fileno()
            if fd is not None:
                if fd >= budget.last_fd and budget.order:  # the process's last descriptor: keep one free
                    budget.lower(len(budget.order) + 1)  # as if the next open had failed
                    budget.evict_oldest()  # another handle: this one is not in the order yet
                self.fds[shard] = fd
            self.handles[shard] = handle
            self._lru[shard] = handle
            budget.order[(self._serial, shard)] = self._ref
            return handle

    def _open_retrying(self, shard: int) -> RandomReader:
        """Raises:
        DescriptorLimitError: out of descriptors (``EMFILE``, ``ENFILE``) with no handle of any table left to close.
        """
        while True:
            try:
                return self._open_handle(shard)
            except OSError as exc:
                if exc.errno not in (errno.EMFILE, errno.ENFILE):
                    raise
                if self._budget.order:
                    self._budget.lower(len(self._budget.order))  # what this process can hold: keep below it
                    self._budget.make_room()  # to one below the new bound: with this open, at the bound
                else:
                    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
                    raise DescriptorLimitError(
                        f"{exc.filename or f'shard {shard}'}: cannot open: the process is out of file descriptors "
                        f"(ulimit -n: {soft}) and holds no shard file tarindex could close; raise the limit (ulimit -n) "
                        f"or hold fewer files open elsewhere ({exc.strerror})"
                    ) from exc

    def _evict(self, shard: int) -> None:
        """Forget ``shard``'s handle first (no new read takes it), then close it, or later if a read uses it."""
        self._budget.forget(self, shard)
        handle = self._lru.pop(shard)
        self.fds[shard] = -1
        self.handles[shard] = None
        if self._reading(shard):
            self._closing.append((shard, handle))
            self.busy[self._n] = len(self._closing)
        else:
            handle.close()

    def _reading(self, shard: int) -> bool:
        return bool(self.busy[shard] or self._py_busy.get(shard))

    def reap(self) -> None:
        """Close the handles waiting for reads that have ended."""
        with self._lock:
            waiting = []
            for shard, handle in self._closing:
                if self._reading(shard):
                    waiting.append((shard, handle))
                else:
                    handle.close()
            self._closing = waiting
            self.busy[self._n] = len(waiting)

    def acquire(self, shard: int) -> RandomReader:
        """The Python reader's handle of ``shard`` for one read; :meth:`release` when the read is done."""
        with self._lock:
            self._py_busy[shard] = self._py_busy.get(shard, 0) + 1
            try:
                return self.open(shard)
            except BaseException:
                self.release(shard)
                raise

    def release(self, shard: int) -> None:
        """End a read counted by :meth:`acquire`."""
        with self._lock:
            left = self._py_busy[shard] - 1
            if left:
                self._py_busy[shard] = left
            else:
                del self._py_busy[shard]
            if self._closing:
                self.reap()

    def close(self) -> None:
        """Close every handle (those in use once their reads end); shards reopen on the next read."""
        with self._lock:
            for shard in list(self._lru):
                self._evict(shard)
            self.reap()
