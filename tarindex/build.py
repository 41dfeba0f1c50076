"""Build indexes: parallel (local processes or any ``concurrent.futures.Executor``), incremental, atomic."""

from __future__ import annotations

import contextlib
import functools
import logging
import multiprocessing
import operator
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from . import _args
from .errors import (
    NO_RANGES,
    CorruptArchiveError,
    IndexFormatError,
    IndexNotFoundError,
    OverwriteError,
    ShardNotFoundError,
    TarIndexError,
    shown,
)
from .identity import current_info
from .index.merge import merge, placed, relative_path
from .index.reader import IndexReader
from .index.writer import IndexWriter
from .naming import ShardRef, shard_name
from .options import SourceOptions
from .scan import scan_shard
from .shards import INDEX_SUFFIX, default_index_path, expand_shards
from .sources import RangeReader
from .tables import ShardInfo, ShardTable

__all__ = ["BuildReport", "build_index", "merge_indexes"]

Progress = Callable[[int, int], None]
"""Called with a number of shards done since the last call and the bytes scanned for them (0 for shards
taken unchanged from the existing index)."""
Part = tuple[int, int] | str

_log = logging.getLogger(__name__)
_NAMED_DROPS = 20  # dropped shards named one by one in the log; more are counted


@dataclass(frozen=True, slots=True, eq=False)  # compared and hashed as itself, as before it held its fields in a dataclass
class BuildReport:
    """What a build did: the index path, which shards were scanned or reused, and which servers of URL shards
    do not answer Range requests."""

    path: Path
    """The index file."""
    scanned: list[str]
    """The shards scanned (new or changed), in shard order."""
    reused: list[str]
    """The shards taken from the existing index unchanged, in shard order."""
    no_ranges: list[str] = field(default_factory=list)
    """The servers (``scheme://host:port``) of ``http(s)://`` shards that answered a ranged request with the
    whole file: the index streams (:class:`~tarindex.TarStream`), random reads of those shards fail."""

    def __repr__(self) -> str:
        unranged = f", no_ranges={self.no_ranges!r}" if self.no_ranges else ""
        return f"BuildReport(path={str(self.path)!r}, scanned={_listed(self.scanned)}, reused={_listed(self.reused)}{unranged})"


def _listed(names: list[str], shown: int = 3) -> str:
    """A list of names for a repr: in full up to ``shown`` names, else the first ones and the count."""
    if len(names) <= shown:
        return repr(names)
    return "[" + ", ".join(map(repr, names[:shown])) + f", ... {len(names) - shown} more] ({len(names)} shards)"


_REOPEN_SAMPLES = 1 << 22
"""Samples an incremental build takes from the existing index between reopenings of it (~35 MB of record blocks)."""


class _Previous:
    """The existing index an incremental build takes its unchanged shards from (none if there is none or it
    is unreadable). Reopened once ``_REOPEN_SAMPLES`` samples were taken: the pages of its map that were
    read then leave the process, so a rebuild's memory stays bounded however large the index (as a merge
    closes each part once it is written)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.reader: IndexReader | None = None
        self.shards: dict[str, int] = {}  # relative path -> shard number
        self._taken = 0
        try:
            self.reader = IndexReader(path)
        except (IndexNotFoundError, IndexFormatError):
            return
        self.shards = {info.path: i for i, info in enumerate(self.reader.shards)}

    def _open(self) -> IndexReader:
        if self.reader is None:  # there was no index: it lists no shard to ask for
            raise IndexNotFoundError(f"{self.path}: no index to reuse shards from")
        return self.reader

    def info(self, i: int) -> ShardInfo:
        return self._open().shards[i]

    def table(self, i: int) -> ShardTable:
        """Shard ``i``'s table (valid until the next call: the index may then be reopened).

        Raises:
            TarIndexError: the index was replaced while this build read it.
        """
        reader = self._open()
        if self._taken >= _REOPEN_SAMPLES:
            reader.close()
            self.reader, self._taken = IndexReader(self.path), 0
            if self.reader.build_id != reader.build_id:
                raise TarIndexError(f"{self.path}: the index was replaced while this build read it; build again")
            reader = self.reader
        table = reader.shard_table(i)
        self._taken += table.n_samples
        return table

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()


def parse_part(part: Part) -> tuple[int, int]:
    """``(K, N)`` from ``"K/N"`` or ``(K, N)``: the K-th of N slices, 1-based.

    Raises:
        ValueError: not of that form, or K is not between 1 and N.
    """
    if isinstance(part, str):
        try:
            k, n = (int(x) for x in part.split("/"))
        except ValueError:
            raise ValueError(f"part {part!r}: expected K/N, for example 1/4") from None
    else:
        try:
            k, n = (operator.index(x) for x in part)
        except (TypeError, ValueError):
            raise ValueError(f"part {part!r}: expected (K, N) or 'K/N', for example (1, 4)") from None
    if not 1 <= k <= n:
        raise ValueError(f"part {k}/{n}: K must be between 1 and N")
    return k, n


def part_slice(shards: list[str], part: tuple[int, int]) -> list[str]:
    """The shards of part ``(K, N)``: the K-th of N contiguous slices of ``shards``."""
    k, n = part
    return shards[(k - 1) * len(shards) // n : k * len(shards) // n]


def _scan_worker() -> None:
    """In a scan worker, first: ignore SIGINT (a Ctrl-C reaches the whole process group; the build stops its
    workers itself, so none prints a traceback or dies holding the pool's queue lock), then end with the build
    that started it (``kill -9`` of a build leaves no worker behind).

    The worker was forked with SIGINT blocked (:func:`_sigint_blocked`): one sent meanwhile is discarded here.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
        if os.getppid() == 1:  # the parent died before the line above
            os._exit(1)


def _scanned(
    shards: list[str],
    workers: int,
    executor: Executor | None,
    progress: Progress | None,
    max_member_size: int | None = None,
    options: SourceOptions | None = None,
    allow_missing_end: bool = False,
) -> Iterator[tuple[ShardInfo, ShardTable]]:
    """Scan results in shard order, as they complete (scanned on ``executor``, or in ``workers`` local processes)."""
    scan = functools.partial(  # picklable: a module function and data
        scan_shard, max_member_size=max_member_size, options=options, allow_missing_end=allow_missing_end
    )
    with ExitStack() as stack:
        if executor is None and workers > 1 and len(shards) > 1:
            threads = any(ShardRef.of(s).kind == "object" for s in shards)  # network-bound; and obstore's runtime does not survive fork
            executor = stack.enter_context(worker_pool(min(workers, len(shards)), threads=threads, name="tarindex-scan"))
        results = mapped(executor, scan, shards)
        for result in results:
            if progress:  # before handing it out: the last shard's count must not wait for a next() that never comes
                progress(1, result[0].size)
            yield result


@contextlib.contextmanager
def worker_pool(n: int, *, threads: bool = False, name: str = "tarindex") -> Iterator[Executor]:
    """``n`` workers for a build or a pack: threads, or processes (forked where the system can) that ignore
    Ctrl-C and die with this process (:func:`_scan_worker`); on an error or interruption the queued jobs are
    cancelled and the processes killed at once (:func:`_stopped_on_error`)."""
    pool: Executor
    if threads:
        pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix=name)
    else:
        methods = multiprocessing.get_all_start_methods()
        ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
        pool = ProcessPoolExecutor(max_workers=n, mp_context=ctx, initializer=_scan_worker)
    with _stopped_on_error(pool) as running:
        yield running


def mapped(executor: Executor | None, fn: Callable[[Any], Any], jobs: Iterable[Any]) -> Iterator[Any]:
    """``fn`` over ``jobs`` in order, on ``executor`` (its workers started with SIGINT held back) or here."""
    if executor is None:
        return map(fn, jobs)
    with _sigint_blocked():  # the workers start here: none may see a Ctrl-C before it ignores them
        return executor.map(fn, jobs)


@contextlib.contextmanager
def _sigint_blocked() -> Iterator[None]:
    """SIGINT held back while workers are forked (they inherit the mask); a Ctrl-C meanwhile is raised after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


@contextlib.contextmanager
def _stopped_on_error(pool: Executor) -> Iterator[Executor]:
    """``pool``, shut down when done; on an error or interruption (Ctrl-C, a failed shard, the consumer gone)
    its queued scans are cancelled and its worker processes killed at once, not waited for."""
    try:
        yield pool
    except BaseException:
        # the pool's manager thread closes its wake-up pipe as it ends, a pipe concurrent.futures' exit hook writes
        # to while the thread runs: joined below (shutdown forgets it), or a traceback follows the error at exit
        manager = getattr(pool, "_executor_manager_thread", None)
        pool.shutdown(wait=False, cancel_futures=True)
        processes = list((getattr(pool, "_processes", None) or {}).values())  # no public way to stop workers (3.14 adds one)
        for process in processes:
            process.kill()
        for process in processes:
            process.join(5)
        if manager is not None:
            manager.join(5)
        raise
    pool.shutdown(wait=True)


def build_index(
    shards: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    *,
    index: str | os.PathLike[str] | None = None,
    workers: int | None = None,
    part: Part | None = None,
    progress: Progress | None = None,
    executor: Executor | None = None,
    max_member_size: int | None = None,
    options: SourceOptions | None = None,
    storage_options: Mapping[str, Any] | None = None,
    headers: Mapping[str, str] | None = None,
    allow_missing_end: bool = False,
    drop_unlisted: bool = False,
) -> BuildReport:
    """Index tar shards into one LMDB index file.

    Incremental: shards whose size and mtime match an existing index at the
    same path are reused, not rescanned. Atomic: the new index replaces the
    old one only when complete.

    Args:
        shards: paths, globs or brace patterns (``'data/train-{000..099}.tar'``).
        index: where to write the index; default beside the shards (see
            :func:`tarindex.shards.default_index_path`).
        workers: processes that scan shards; default ``os.cpu_count()``.
        part: ``(K, N)`` or ``"K/N"`` to index only the K-th of N contiguous slices
            of the shard list (1-based), for builds spread over machines; combine the
            parts with :func:`merge_indexes`, which orders them by the K recorded in each.
        progress: called as ``progress(shards, nbytes)`` with the number of shards done since the
            last call and the bytes scanned for them (a shard's file size; 0 for shards found
            unchanged, which are not scanned); the index is written after the last.
        executor: scan the shards on this ``concurrent.futures.Executor`` instead of
            local processes: a ``ProcessPoolExecutor``, ``dask.distributed.Client(...).get_executor()``,
            Ray's ``ray.util.multiprocessing.Pool`` wrapped in an executor (docs/building.md).
            Results come back in shard order and are written as they arrive.
        max_member_size: refuse a shard with a member larger than this many bytes
            (:class:`~tarindex.errors.CorruptArchiveError` naming the shard, the member and its
            offset). ``None`` (default): 8 GiB for shards of unknown length (URLs, zstd and gzip
            shards), a plain local tar's own size. Shards reused from the existing index are
            checked against it too, from their tables.
        options: how URL shards are read (retries, timeouts; see :class:`~tarindex.options.SourceOptions`).
        storage_options: object-store or fsspec client options (endpoint, credentials) for reading
            and listing URL shards; overrides ``options.storage_options``. Never stored in the index.
        headers: extra HTTP(S) request headers (e.g. ``Authorization``); overrides ``options.headers``.
            Never stored in the index.
        allow_missing_end: accept shards that end without the end-of-archive marker (written by tools
            that omit it); by default such a shard is a :class:`~tarindex.errors.CorruptArchiveError`,
            since a shard cut at a member boundary looks the same.
        drop_unlisted: allow the build to drop shards the existing index holds and the shard
            list no longer names (left out of the list, or deleted from disk so a glob no longer
            matches them); each is named in a logged warning. Without it such a build is refused
            (:class:`~tarindex.errors.OverwriteError`), so that indexing a subset of a set
            (``'d/train-{000028..000029}.tar'``) never replaces the set's index: write a subset's
            index elsewhere (``index=``). A ``part`` build compares with the whole list, not its slice.

    When nothing changed (the same shards in the same order, each with its indexed size and
    mtime), the index is left as it is: the build costs an ``open`` and ``fstat`` per shard.
    The new index is opened and checked before it replaces the old one: a build that fails,
    at any step, leaves the previous index as it was.

    Raises:
        ValueError: ``part`` is not K/N with 1 <= K <= N.
        ShardNotFoundError: a shard does not exist.
        NotRegularFileError: a shard is a FIFO, a socket or a device.
        CorruptArchiveError: a shard is not a valid tar archive, or has a member over ``max_member_size``.
        OverwriteError: the index path holds a file that is not a tarindex index, or is one of the
            shards, or the existing index holds shards the list does not name (see ``drop_unlisted``).

    ``http(s)://`` shards: one ranged request per server, before any scan, checks that the server
    answers ``Range`` requests; a server that does not is named in a logged warning and in the
    report's ``no_ranges`` (the index is written: :class:`~tarindex.TarStream` streams it, while
    random reads of those shards fail), see docs/remote.md.
    """
    _args.shard_names(shards, "shards", call="build_index")
    workers = _args.count(workers, "workers", means="local scan processes", none="one per CPU")
    if max_member_size is not None and max_member_size < 0:
        raise ValueError(f"max_member_size must be >= 0, not {max_member_size}")
    part = parse_part(part) if part is not None else None
    opts = SourceOptions.given(options, storage_options=storage_options, headers=headers)
    paths = expand_shards(shards, storage_options=dict(opts.storage_options) or None)
    if not paths:
        raise ShardNotFoundError("no shards given")
    if index is not None:
        out = Path(index)
    elif (url := next((p for p in paths if not ShardRef.of(p).local), None)) is not None:
        raise TarIndexError(f"{url}: URL shards need an index path (index=..., or -o)")
    else:
        out = default_index_path(paths)
        if part is not None:
            digits = len(str(part[1]))  # zero-padded, so the parts also sort by name
            out = out.with_name(out.name[: -len(INDEX_SUFFIX)] + f".part-{part[0]:0{digits}d}-of-{part[1]}{INDEX_SUFFIX}")
    _check_not_a_shard(out, paths)
    index_dir = out.absolute().parent
    rel = [relative_path(s, index_dir) for s in paths]
    listed = set(rel)  # the whole list: a part build does not drop the shards of other parts
    if part is not None:
        paths, rel = part_slice(paths, part), part_slice(rel, part)
    if len(set(rel)) != len(rel):
        raise TarIndexError("the same shard is named twice")
    no_ranges = _without_ranges(paths, opts)
    previous = _Previous(out)
    known = previous.shards
    try:
        if not drop_unlisted:
            _refuse_drops(out, index_dir, [r for r in known if r not in listed])
        kept = {s: info for s, r in zip(paths, rel) if r in known and (info := current_info(s, previous.info(known[r]))) is not None}
        todo = [s for s in paths if s not in kept]  # new or changed: scanned
        if progress and len(todo) < len(paths):
            progress(len(paths) - len(todo), 0)
        unchanged = previous.reader is not None and previous.reader.part == part and list(known) == rel
        if not todo and unchanged and all(kept[s] == previous.info(known[r]) for s, r in zip(paths, rel)):
            if max_member_size is not None:  # the index stands if every shard's members are within the bound
                for s, r in zip(paths, rel):
                    _check_members(s, previous.table(known[r]), max_member_size)
            return BuildReport(out, [], list(paths), no_ranges)  # nothing changed (same shards, order and mtimes): the index stands
        scans = _scanned(todo, workers or os.cpu_count() or 1, executor, progress, max_member_size, opts, allow_missing_end)
        todo_set = set(todo)
        with IndexWriter(out, part=part) as writer:
            for s, r in zip(paths, rel):
                if s in todo_set:
                    info, table = next(scans)
                    writer.add(placed(info, r, ShardRef.of(s).stored), table)
                else:
                    table = previous.table(known[r])
                    if max_member_size is not None:
                        _check_members(s, table, max_member_size)
                    writer.add(kept[s], table)
            next(scans, None)  # the scans are done: the pool shuts down in order (closed early, it is stopped)
        _warn_dropped(out, known, rel)  # once the new index has replaced the old one
    finally:
        previous.close()
    return BuildReport(out, todo, [s for s in paths if s not in todo_set], no_ranges)


def _without_ranges(paths: list[str], options: SourceOptions) -> list[str]:
    """The servers of the ``http(s)://`` shards in ``paths`` that do not answer ``Range`` requests, each named
    in a logged warning: one ranged request of one byte to the first shard of each server (a ``206`` with
    that range is an answer; a ``200``, the whole file, is not: its body is not read).

    Raises:
        ShardNotFoundError, SourceError: as the scan of that shard would (HTTP 404, a refused connection).
    """
    first: dict[str, str] = {}
    for path in paths:
        ref = ShardRef.of(path)
        if ref.kind == "http":
            first.setdefault(f"{ref.scheme}://{urlsplit(path).netloc.rpartition('@')[2]}", path)
    unranged = []
    for server, url in first.items():
        reader = RangeReader(url, options)
        reader.close()
        if not reader.ranges:
            unranged.append(server)
            _log.warning("%s: asked for byte 0 of %s, got the whole file: %s", server, url, NO_RANGES)
    return unranged


def _check_not_a_shard(out: Path, paths: list[str]) -> None:
    """Refuse an index path that names one of the shards (``-o d/train-000002.tar``, a typo).

    Raises:
        OverwriteError: naming the shard.
    """
    target = os.path.abspath(out)
    if any(ShardRef.of(s).local and os.path.abspath(s) == target for s in paths):
        raise OverwriteError(f"{out}: is one of the shards to index; refusing to write the index over it (choose another index path, -o)")


def _refuse_drops(out: Path, index_dir: Path, dropped: list[str]) -> None:
    """Refuse a build that would drop shards the existing index holds and the shard list does not name.

    Raises:
        OverwriteError: naming the index, how many shards it would lose (and which), and the flags.
    """
    if not dropped:
        return
    gone = sum(1 for r in dropped if ShardRef.of(r).local and not os.path.lexists(index_dir / r))
    names = ", ".join(dropped[:3]) + (f" and {len(dropped) - 3} more" if len(dropped) > 3 else "")
    one = len(dropped) == 1
    why = ("; it no longer exists" if one else f"; {gone} of them no longer exist") if gone else ""
    them = "it" if one else "them"
    raise OverwriteError(
        f"{out}: holds {len(dropped)} shard{'' if one else 's'} this build was not given ({names}{why}); building would "
        f"drop {them} from the index. To index only the shards given, write another index (-o, e.g. -o "
        f"{out.parent / ('val' + INDEX_SUFFIX)}); to drop {them}, pass --drop-unlisted (drop_unlisted=True)"
    )


def _check_members(shard: str, table: ShardTable, max_member_size: int) -> None:
    """Refuse a reused shard (its table from the index) with a member over ``max_member_size``, as its scan would.

    Raises:
        CorruptArchiveError: naming the shard, the member and its data's offset.
    """
    if not table.n_members or int(table.member_size.max()) <= max_member_size:
        return
    k = int(table.member_size.argmax())
    sample = int(np.searchsorted(np.cumsum(table.sample_nmembers, dtype=np.uint64), k, side="right"))
    name = f"{table.keys[sample]}.{table.exts[int(table.member_ext[k])]}"
    offset = int(table.sample_offset[sample]) + int(table.member_offset[k])
    raise CorruptArchiveError(
        shard, offset, f"member {shown(name)} of {int(table.member_size[k])} bytes (data) is over max_member_size "
        f"({max_member_size} bytes); to accept it, raise max_member_size= (--max-member-size)"
    )


def _warn_dropped(out: Path, previous: dict[str, int], rel: list[str]) -> None:
    """Log each shard of the existing index that the new shard list no longer names."""
    kept = set(rel)
    dropped = [path for path in previous if path not in kept]
    for path in dropped[:_NAMED_DROPS]:
        _log.warning("%s: shard %s is no longer in the shard list; dropped from the index", out, path)
    if len(dropped) > _NAMED_DROPS:
        _log.warning("%s: %d more shards are no longer in the shard list; dropped from the index", out, len(dropped) - _NAMED_DROPS)


def merge_indexes(
    parts: Iterable[str | os.PathLike[str]], output: str | os.PathLike[str], *, progress: Progress | None = None
) -> Path:
    """Combine indexes into one: parts of a ``--part K/N`` build in K order (all N of them), other indexes as given.

    Streams shard by shard (memory bounded by the largest shard); the output is
    written atomically, so an interrupted merge leaves any previous index at
    ``output`` as it was. ``progress(shards, nbytes)``: called with 1 shard as each shard is
    written, and with a part's file size (0 shards) as each part is done.

    Raises:
        IndexNotFoundError, IndexFormatError: a part is missing or not an index.
        TarIndexError: two parts name the same shard; a part of a split is missing or given twice.
    """
    return merge(_args.index_files(parts, "parts", call="merge_indexes"), output, shard_name, progress)
