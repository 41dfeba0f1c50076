"""Opening indexed shards for random reads: the one owner of open handles, the handle kinds, the checks at open.

A handle is an ``int`` descriptor (a plain local shard, or a decompressed copy of a zstd shard in
an opt-in cache) or an object with ``read_at(offset, size)`` (:class:`tarindex.zstd_random.ZstdShardReader`
or the C ``ZstdReader``; :class:`tarindex.sources.RangeReader` for URL shards).

:class:`ShardOpener` owns a process's handles of one index's shards: it opens them (through a function
that makes the checks), counts the reads in progress on each, evicts the least recently used beyond a
bound (or when the process runs out of descriptors), and closes a handle only once no read uses it, so a
descriptor number is never reused under a read, ``close()`` included.

The bound is two-fold: each opener's own (``max_open_files`` of its dataset), and one for the whole process
(:class:`_Budget`: half the soft ``RLIMIT_NOFILE``, lowered when the process runs out of descriptors), shared
by every opener of every dataset and mix: twenty datasets under ``ulimit -n 64`` evict each other's least
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
from collections.abc import Callable, Iterator, Sequence
from typing import Any, BinaryIO, overload

import numpy as np

from ._cache import FileCache
from .errors import CommandNotAllowedError, CorruptFrameError, DescriptorLimitError, IndexFormatError, RandomAccessError
from .gzip import random_access_refused
from .gzip_random import GzipShardReader, SeekPoints
from .objstore import open_reader
from .options import SourceOptions
from .shards import as_path, is_fingerprint, shard_kind
from .tables import ShardInfo
from .zstd import MAP_SLICE, decompress_frames
from .zstd_random import ReadAt, zstd_reader

__all__: list[str] = []  # internal module: its names serve the package, the public API is tarindex.__all__


def shard_name(index_path: str | os.PathLike[str], info: ShardInfo) -> str:
    """The name a shard of an index is opened by, checked against its recorded kind.

    A ``file`` is a path relative to the index's directory and stays inside it
    (no ``..``, not absolute) unless the index recorded it as built outside;
    whatever it looks like, the result reads as a path (``./pipe:x`` for a file
    named ``pipe:x``). A ``url`` or ``command`` is returned as recorded (a
    command runs only where :func:`check_commands` allowed it).

    Raises:
        IndexFormatError: the entry's kind is unknown or does not match its path, or a file's path
            leaves the index's directory and the index does not say it was built so.
    """
    path, kind = info.path, info.kind
    if not isinstance(path, str) or not path or "\0" in path:
        raise IndexFormatError(f"{index_path}: a shard entry has no usable path ({path!r}); rebuild the index")
    if kind == "file":
        norm = os.path.normpath(path)
        leaves = os.path.isabs(norm) or norm.split(os.sep)[0] == os.pardir
        if leaves and not info.outside:
            raise IndexFormatError(
                f"{index_path}: shard path {path!r} leaves the index's directory, and the index was not built so; "
                f"rebuild the index"
            )
        return as_path(os.path.join(os.path.dirname(os.fspath(index_path)), path))
    if kind in ("url", "command") and shard_kind(path) == kind:
        return path
    raise IndexFormatError(f"{index_path}: shard {path!r} is recorded as kind {kind!r}, which its name is not; rebuild the index")


class ShardNames(Sequence[str]):
    """Each shard's name (:func:`shard_name`), resolved from its index record the first time it is asked for.

    Opening an index reads no shard record: a name costs its record's block (``SHARD_BLOCK`` records)
    once, when a sample of that shard is first read. :attr:`names` is the list the C reader reads
    (``None`` until resolved; its length never changes).

    Args:
        index_path: the index the records belong to (relative names are resolved against its directory).
        records: the shard records (an :class:`tarindex.index.reader.ShardList`, read by block).
    """

    def __init__(self, index_path: str | os.PathLike[str], records: Sequence[ShardInfo]) -> None:
        self.index_path = index_path
        self.records = records
        self.names: list[str | None] = [None] * len(records)

    def __len__(self) -> int:
        return len(self.names)

    @overload
    def __getitem__(self, s: int) -> str: ...
    @overload
    def __getitem__(self, s: slice) -> list[str]: ...
    def __getitem__(self, s: int | slice) -> str | list[str]:
        """Raises:
        IndexFormatError: the shard's record is damaged or its name does not match its kind.
        """
        if isinstance(s, slice):
            return [self[k] for k in range(*s.indices(len(self.names)))]
        name = self.names[s]
        if name is None:
            name = self.names[s] = shard_name(self.index_path, self.records[s])
        return name

    def __iter__(self) -> Iterator[str]:
        for s in range(len(self.names)):
            yield self[s]

    def __eq__(self, other: object) -> bool:
        return list(self) == list(other) if isinstance(other, Sequence) else NotImplemented

    __hash__ = None  # type: ignore[assignment]  # a sequence compared by value

    def __repr__(self) -> str:
        return f"ShardNames({str(self.index_path)!r}, {len(self.names)} shards)"


def check_commands(index_path: str | os.PathLike[str], infos: Sequence[ShardInfo], allow_commands: bool) -> None:
    """Refuse an index whose shards are commands unless the caller allowed commands (as with pickle).

    Raises:
        CommandNotAllowedError: a shard is a command and ``allow_commands`` is false.
    """
    if allow_commands:
        return
    for info in infos:
        if info.kind == "command":
            raise CommandNotAllowedError(
                f"{index_path}: shard {info.path!r} is a command; an index runs commands only when allowed "
                f"(allow_commands=True, --allow-commands), and only for an index you trust"
            )


def fix_command(path: str) -> str:
    """The command that rewrites ``path`` with sample-aligned frames."""
    return f"tarindex compress {path} {path}"


def open_url(
    url: str,
    info: ShardInfo,
    frames: np.ndarray | None = None,
    options: SourceOptions | None = None,
    *,
    points: bytes | memoryview | None = None,
    index: str | os.PathLike[str] | None = None,
) -> Any:
    """A random reader for a URL shard (:func:`tarindex.objstore.open_reader`: ``http(s)://``, object
    stores, fsspec), checked against its index entry (size, ETag, mtime where recorded).

    A zstd shard (``info.compression``) is read through its frame table over the ranged reads
    (:func:`open_zstd_shard`), a gzip shard through its seek points ``points`` (:func:`open_gzip_shard`;
    ``index``, the index they come from, is named in their errors): the reader hands out decompressed tar
    bytes, never compressed ones.

    Raises:
        StaleIndexError: the shard's size, ETag or modification time differs from the index.
        ShardNotFoundError: the shard is gone.
        SourceError: the server or store cannot be reached, or no credentials.
        IndexFormatError: a zstd shard without a frame table in the index, damaged or crafted gzip seek points.
        RandomAccessError: a zstd shard of large frames (no local cache of decompressed URL shards), a
            gzip shard without seek points.
    """
    reader = open_reader(url, size=info.size, etag=info.etag, mtime_ns=info.mtime_ns, options=options or SourceOptions())
    if info.compression == "zstd":
        return open_zstd_shard(url, reader, info, frames)
    if info.compression == "gzip":
        return open_gzip_shard(url, reader, points, size=info.size, index=index)
    return reader


def open_gzip_shard(
    path: str, handle: Any, points: bytes | memoryview | None, *, size: int, index: str | os.PathLike[str] | None = None
) -> GzipShardReader:
    """A random reader of a gzip shard's decompressed tar through its seek points (from the index ``index``,
    named in their errors); ``handle`` (an int descriptor or an object with ``read_at``) of ``size`` bytes
    belongs to the reader from here on.

    Raises:
        RandomAccessError: the index holds no seek points for the shard (indexed before they existed).
        IndexFormatError: the seek-point table is damaged or crafted (its fields checked against each other
            and ``size``: :class:`~tarindex.gzip_random.SeekPoints`).
    """
    try:
        if points is None:
            raise random_access_refused(path)
        where = f"{os.fspath(index)}: the gzip seek points of {path}" if index is not None else f"{path}: the gzip seek points in the index"
        return GzipShardReader(path, handle, SeekPoints(points, where, size=size))
    except BaseException:
        close_handle(handle)
        raise


def close_handle(handle: Any) -> None:
    if type(handle) is int:
        os.close(handle)
    else:
        handle.close()


_MAX_BUDGET = 1 << 20  # handles open at once, whatever the limit (RLIM_INFINITY)


_RLIMIT_EVERY = 64  # opens between two readings of RLIMIT_NOFILE (a system call)


class _Budget:
    """The process-wide bound on open shard handles, shared by every :class:`ShardOpener`, and the order in
    which they were opened (or last asked for) across all of them.

    The bound is half the soft ``RLIMIT_NOFILE`` (read again every ``_RLIMIT_EVERY`` opens, and used anew when it
    changed), the other half left to the rest of the process (index files, sockets, DataLoader pipes); lowered
    to what the process could hold when an open fails with ``EMFILE``/``ENFILE``, or takes its last descriptor.

    Threads: ``order`` changes by single calls (an insertion, a ``move_to_end``, a ``pop``: one step under the
    GIL each) made by an opener holding its own lock; :meth:`evict_oldest` works on a copy of its oldest
    entries, under ``lock``, and evicts another opener's handle only if that opener's lock is free at once
    (``acquire(blocking=False)``; else the next oldest), so datasets never wait on each other's opens (a URL
    shard's can take seconds) and no two locks are ever waited for in opposite orders.
    """

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.order: OrderedDict[tuple[int, int], weakref.ref[ShardOpener]] = OrderedDict()  # (opener, shard), oldest first
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
        """Evict the least recently used handles of any opener until one more fits the bound."""
        while len(self.order) >= self._limit and self.evict_oldest():
            pass

    def evict_oldest(self) -> bool:
        """Evict the least recently used handle whose opener is free to evict it now; ``False`` when none is."""
        with self.lock:
            for some in (64, None):  # the oldest few first: a copy of all of them only if none of those would do
                for key, ref in list(itertools.islice(self.order.items(), some)):  # copied in one step
                    opener = ref()
                    if opener is None or key[1] not in opener._lru:  # gone, or closed meanwhile: no handle to count
                        self.order.pop(key, None)
                        continue
                    if not opener._lock.acquire(blocking=False):  # that opener is busy (opening): not waited for
                        continue
                    try:
                        if key[1] in opener._lru:
                            opener._evict(key[1])
                            return True
                    finally:
                        opener._lock.release()
                if some is not None and len(self.order) <= some:
                    break
        return False

    def touch(self, opener: ShardOpener, shard: int) -> None:
        with contextlib.suppress(KeyError):  # evicted by another thread meanwhile: nothing to move
            self.order.move_to_end((opener._serial, shard))

    def forget(self, opener: ShardOpener, shard: int) -> None:
        self.order.pop((opener._serial, shard), None)


_BUDGET = _Budget()


def _new_budget() -> None:  # a forked child holds none of the parent's handles as its own, nor its lock
    global _BUDGET
    _BUDGET = _Budget()


os.register_at_fork(after_in_child=_new_budget)
_SERIAL = itertools.count()


class ShardOpener:
    """The one owner of a process's open handles of one index's shards.

    Its tables are read by the C reader without a call and written only here, with the GIL held:

    - ``fds``: int32 per shard, the descriptor of a plain shard open here, else -1;
    - ``handles``: per shard, the object with ``read_at`` of a shard open here, else ``None``;
    - ``busy``: uint32 per shard, reads in progress in the C reader (counted before it looks at the
      tables, until the read is done; the GIL is released while it reads), and one more entry: the
      number of closed handles waiting for their reads to end (the C reader calls :meth:`reap`
      after a read while it is not zero).

    The Python reader counts its reads with :meth:`acquire` and :meth:`release`.

    Args:
        n_shards: shards of the index.
        open_handle: opens shard ``i`` and makes the checks (an int descriptor or an object with ``read_at``).
        max_open: bound on this opener's open handles (least recently used evicted). The process-wide bound
            (:class:`_Budget`) applies too: an open beyond it evicts the least recently used handle of any
            opener; one that fails with ``EMFILE`` evicts one, lowers that bound and retries.
    """

    def __init__(self, n_shards: int, open_handle: Callable[[int], Any], max_open: int) -> None:
        self.fds = np.full(n_shards, -1, np.int32)
        self.handles: list[Any] = [None] * n_shards
        self.busy = np.zeros(n_shards + 1, np.uint32)
        self.max_open = max(1, max_open)
        self._open_handle = open_handle
        self._n = n_shards
        self._lru: OrderedDict[int, Any] = OrderedDict()  # shard -> handle, least recently used first
        self._closing: list[tuple[int, Any]] = []  # evicted or closed while read: closed when their reads end
        self._py_busy: dict[int, int] = {}  # the Python reader's reads in progress
        self._lock = threading.RLock()
        self._budget = _BUDGET
        self._serial = next(_SERIAL)
        self._ref = weakref.ref(self)

    @property
    def open_count(self) -> int:
        """Handles open now (those waiting for a read to end included)."""
        return len(self._lru) + len(self._closing)

    def open(self, shard: int) -> Any:
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
            if type(handle) is int:
                if handle >= budget.last_fd and budget.order:  # the process's last descriptor: keep one free
                    budget.lower(len(budget.order) + 1)  # as if the next open had failed
                    budget.evict_oldest()  # another handle: this one is not in the order yet
                self.fds[shard] = handle
            else:
                self.handles[shard] = handle
            self._lru[shard] = handle
            budget.order[(self._serial, shard)] = self._ref
            return handle

    def _open_retrying(self, shard: int) -> Any:
        """Raises:
        DescriptorLimitError: out of descriptors (``EMFILE``, ``ENFILE``) with no handle of any opener left to close.
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
            close_handle(handle)

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
                    close_handle(handle)
            self._closing = waiting
            self.busy[self._n] = len(waiting)

    def acquire(self, shard: int) -> Any:
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


def open_zstd_shard(
    path: str,
    fd: int | ReadAt,
    info: ShardInfo,
    frames: np.ndarray | None,
    *,
    cache_dir: str | None = None,
    cache_bytes: int = 16 << 30,
) -> Any:
    """A handle for random reads of an indexed zstd shard: a :class:`ZstdShardReader`, or the
    ``int`` descriptor of a decompressed copy in ``cache_dir`` for a shard whose frames are too
    large to decompress per sample. Takes ownership of ``fd`` (a local descriptor, or any handle
    with ``read_at``, such as a URL's :class:`RangeReader`; only a local shard has a cached copy).

    Raises:
        IndexFormatError: the index has no frame table for the shard.
        RandomAccessError: the shard is one large frame and no ``cache_dir`` was given.
        CorruptArchiveError: the shard is corrupt or does not decompress to the indexed size.
    """
    if frames is None:
        close_handle(fd)
        raise IndexFormatError(f"{path}: the index has no zstd frame table for this shard; rebuild the index")
    if info.random_access:
        return zstd_reader(path, fd, frames)
    largest = int(frames[:, 3].max())
    if cache_dir is None or not isinstance(fd, int):
        close_handle(fd)
        raise RandomAccessError(
            path,
            f"{len(frames)} zstd frame(s), the largest {largest} bytes uncompressed: random access would "
            f"decompress that much per sample. Rewrite the shard with sample-aligned frames "
            f"('{fix_command(path)}') and rebuild the index, or opt in to a local cache of decompressed "
            f"shards with TarDataset(..., zstd_cache_dir=DIR)",
        )
    try:
        return _cached_copy(path, fd, info, frames, cache_dir, cache_bytes)
    finally:
        os.close(fd)


ZSTD_CACHE_ENTRY = r"[0-9a-f]{32}-[0-9]+\.tar"
"""Entries of the decompressed-shard cache: ``<fingerprint>-<compressed size>.tar``."""


def _cached_copy(path: str, fd: int, info: ShardInfo, frames: np.ndarray, cache_dir: str, cache_bytes: int) -> int:
    """The descriptor of the shard's decompressed copy in the cache under ``cache_dir``, decompressing it first if needed."""
    total = int(frames[-1, 2] + frames[-1, 3]) if len(frames) else 0
    if total > cache_bytes:
        raise RandomAccessError(path, f"decompressed size {total} exceeds zstd_cache_bytes={cache_bytes}")
    if not is_fingerprint(info.fingerprint) or type(info.size) is not int or info.size < 0:
        raise IndexFormatError(f"{path}: the index's fingerprint {info.fingerprint!r} or size {info.size!r} is damaged; rebuild the index")
    cache = FileCache(cache_dir, "zstd", ZSTD_CACHE_ENTRY, cache_bytes)
    name = f"{info.fingerprint}-{info.size}.tar"
    found = cache.open(name, total)
    if found is not None:
        return found

    def fill(f: BinaryIO) -> None:
        pieces = iter(lambda: os.read(fd, MAP_SLICE // 4), b"")
        os.lseek(fd, 0, os.SEEK_SET)
        for chunk in decompress_frames(pieces, path):
            f.write(chunk[: total - f.tell()])
            if f.tell() >= total:  # the indexed frames are written: what follows is padding
                break
        if f.tell() != total:
            raise CorruptFrameError(path, 0, f"decompresses to {f.tell()} bytes, the index says {total}")

    return cache.add(name, total, fill)
