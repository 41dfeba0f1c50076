"""Make indexed shards: :func:`pack` writes a folder, a list of files or existing shards as numbered shards and
their index in one pass, in parallel (local processes or any ``concurrent.futures.Executor``).

The module is not named ``pack``, so that ``tarindex.pack`` stays the function.

Every output shard is a job: its samples are known before it is written (a folder's or a list's files with their
sizes, or a range of an input index's samples), so shards are cut (``maxcount``, ``maxsize``) and numbered before
any is written, each is written on its own (temporary name, then a rename), and the index gets each shard's table
from its writer, which knows every offset it wrote. ``shuffle`` over shards is an external shuffle: samples are
scattered into bucket files by a random key, then each bucket is read back, sorted and written in turn.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import multiprocessing
import os
import re
import shutil
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import numpy as np

from ._atomic import alive, clean_stale
from ._codecs import BY_ENTRY, TAR, ZSTD, of_suffix
from ._epochs import stream_key
from ._packin import KeyFilter, Sample, add_labels, class_names, key_test, samples_of, select, source_kind
from ._packout import Compress, FileMember, ShardOut, newest_mtime, same_table
from ._tarwrite import BLOCK, header_size, padding
from .build import build_index, mapped, worker_pool
from .dataset import TarDataset
from .errors import CorruptArchiveError, PackError, ShardNotFoundError, TarIndexError
from .grouping import iter_samples
from .identity import check_shard, current_info
from .index.merge import placed, relative_path
from .index.meta import read_meta
from .index.reader import IndexReader
from .index.writer import IndexWriter
from .naming import ShardRef, shard_name
from .options import SourceOptions
from .sampler import _mix
from .scan import iter_archive, scan_shard
from .shard_writer import Cutter
from .shards import INDEX_SUFFIX, default_index_path, expand_shards
from .tables import ShardInfo, ShardTable

__all__ = ["PackReport", "pack"]

_log = logging.getLogger(__name__)

Progress = Callable[[int, int, int], None]
"""Called with the samples and the bytes (uncompressed tar) written since the last call, and the samples in all."""

DEFAULT_MAXCOUNT = 100_000
DEFAULT_MAXSIZE = 3_000_000_000
DEFAULT_MEMORY = 256 << 20
_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_RECORD = struct.Struct("<QQIIQ")  # bucket record: order key, input sample, metadata bytes, members, data bytes
_BUCKET_BUFFER = 64 << 10  # write buffer of each bucket file of a scatter job
_STREAM_READ = 1 << 20  # bytes a read of a compressed shard decompressed in one pass
_SCATTER_SAMPLES = 1 << 22  # input samples of a scatter job at most (the numbers of those a filter keeps are held)
_OPEN_BUCKETS = 256  # bucket files a scatter job keeps open
_SCATTER_JOBS = 64  # scatter jobs of a shuffle (input shards grouped beyond): bucket files are jobs x buckets


@dataclasses.dataclass(frozen=True)
class PackReport:
    """What a pack did."""

    index: Path
    """The index of the shards."""
    shards: list[str]
    """Every shard, in order."""
    written: list[str]
    """The shards this run wrote."""
    kept: list[str]
    """Complete shards of an earlier, interrupted run of the same pack, kept as they were."""
    samples: int
    """Samples in the shards."""
    bytes: int
    """Bytes of the shards' tars (uncompressed)."""
    classes: list[str] | None = None
    """With ``label=True``: the class names, in the order of their numbers."""

    def __repr__(self) -> str:
        return f"PackReport({str(self.index)!r}, shards={len(self.shards)}, written={len(self.written)}, samples={self.samples})"


@dataclasses.dataclass(frozen=True)
class _Options:
    """What every job of one pack shares."""

    compress: Compress
    level: int
    frame_size: int
    resume: bool
    replace: bool = False
    """Whether a file at an output name may be written over (``force``, or the output index says a pack of this
    pattern wrote it): else only a complete shard is kept there and any other file is refused."""


@dataclasses.dataclass(frozen=True)
class _Spec:
    """One pack's choices, as its parent process uses them (the jobs get :class:`_Options`)."""

    pattern: str
    index: Path
    """The output index."""
    opts: _Options
    exts: frozenset[str] | None
    keys: Callable[[str], bool] | None
    label: bool
    shuffle: bool
    seed: int
    maxcount: int
    maxsize: int
    memory: int
    work: Path
    """Where bucket files, the index of input shards and the decompressed-shard cache go."""
    options: SourceOptions | None


# -- the pack -----------------------------------------------------------------------------------


def pack(
    sources: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    output: str | os.PathLike[str],
    *,
    index: str | os.PathLike[str] | None = None,
    maxcount: int = DEFAULT_MAXCOUNT,
    maxsize: int = DEFAULT_MAXSIZE,
    workers: int | None = None,
    executor: Executor | Any | None = None,
    exts: Collection[str] | None = None,
    keys: KeyFilter = None,
    label: bool = False,
    shuffle: bool = False,
    seed: int = 0,
    memory: int = DEFAULT_MEMORY,
    level: int = 3,
    frame_size: int = 8 << 10,
    resume: bool = True,
    force: bool = False,
    progress: Progress | None = None,
    tmpdir: str | os.PathLike[str] | None = None,
    options: SourceOptions | None = None,
) -> PackReport:
    """Write samples as numbered shards with their index, in one pass.

    Sources are directories (every file, grouped into samples by webdataset's key rule: ``a/b/123.jpg`` and
    ``a/b/123.json`` are one sample ``a/b/123``; keys sorted), list files (``.txt``/``.lst``: a path a line;
    ``.csv`` with a header row, ``.jsonl``: ``__key__`` and a field per member, ``EXT`` a path, ``EXT:text`` the
    text itself), or shards (paths, globs, brace patterns, URLs, an index file, a wids shard list), plain, zstd
    or gzip, which are resharded. Directories and lists may be mixed; shards are packed on their own.

    Output shard ``k`` is ``output % k``: ``.tar`` (plain) or ``.tar.zst`` (seekable zstd, sample-aligned frames
    as :func:`~tarindex.compress_shard` writes them). Each holds at most ``maxcount`` samples and ``maxsize``
    bytes of tar (one larger sample makes a shard of its own). The same sources and options always make the same
    shards, byte for byte (headers carry mtime 0, mode 0644, uid and gid 0). Each shard is written under a
    temporary name and renamed when complete; the index is written last. Run again after an interruption, a pack
    keeps the complete shards of the earlier run (each checked against what it would write now, and newer than
    its inputs) and writes the rest.

    Args:
        sources: directories, list files or shards (one or several).
        output: the shard pattern, e.g. ``"out/train-%06d.tar"`` or ``"out/train-%06d.tar.zst"``.
        index: where to write the index; default beside the shards (``out/train.tarindex``).
        maxcount: samples per shard at most.
        maxsize: bytes of tar per shard at most (uncompressed).
        workers: processes that write shards; default ``os.cpu_count()``.
        executor: write the shards on this ``concurrent.futures.Executor`` (or a Dask client: its
            ``get_executor()``) instead of local processes; the output and its index must be on storage every
            worker sees.
        exts: keep only members of these extensions (a sample left with none is dropped).
        keys: keep only samples whose key is in this collection, or for which this function is true.
        label: directories only: add a ``cls`` member to every sample, the number of its top directory among
            the sorted top directories (as torchvision's ``ImageFolder`` numbers classes).
        shuffle: write the samples in a random order drawn from ``seed`` instead of the sources' order.
        seed: the shuffle's seed.
        memory: shuffling shards: the bytes of samples held in memory at a time (the rest waits in bucket
            files in ``tmpdir``).
        level: zstd level (``.tar.zst`` output).
        frame_size: uncompressed bytes per zstd frame (``.tar.zst`` output).
        resume: keep the complete shards of an earlier run of this pack (``False``: write every shard).
        force: replace the files at the output names and the output index whoever wrote them. Without it, a
            pack writes over only what a pack of this output pattern wrote (its index says so); any other file
            there, shard or not, is refused, and so is an output index a pack of this pattern did not write.
        progress: called as each shard is done with its samples and bytes (uncompressed tar) and the number of
            samples the pack writes in all.
        tmpdir: where a shuffle of shards keeps its bucket files, and where the index of input shards that have
            none is built; default the output's directory.
        options: how URL shards are read and listed (headers, object-store credentials, retries: see
            :class:`~tarindex.options.SourceOptions`); never written anywhere.

    Raises:
        ValueError: a bad option, an output pattern without one ``%d``-style number or with another suffix,
            directories or lists mixed with shards, ``label`` without directories.
        PackError: an input cannot be read or changed while it was packed, two files would be one member, an
            output names an input, a file at an output name or the output index is not this pack's (``force``).
        ListError: a list file that does not parse.
        ShardNotFoundError, CorruptArchiveError: an input shard is missing or damaged.
        WriteError: a shard or the index cannot be written.
    """
    pattern, compress = _pattern(output)
    if maxcount < 1 or maxsize < 1 or memory < 1:
        raise ValueError(f"maxcount, maxsize and memory must be positive, not {maxcount}, {maxsize}, {memory}")
    items = [os.fspath(sources)] if isinstance(sources, (str, os.PathLike)) else [os.fspath(s) for s in sources]
    if not items:
        raise ValueError("no sources given")
    kinds = [source_kind(s) for s in items]
    out_index = Path(index) if index is not None else default_index_path([pattern % 0, pattern % 1])
    replace = force or _packed_by(out_index, pattern)
    spec = _Spec(
        pattern, out_index, _Options(compress, level, frame_size, resume, replace), frozenset(e.lower() for e in exts) if exts is not None else None,
        key_test(keys), label, shuffle, seed, maxcount, maxsize, memory, Path(tmpdir) if tmpdir is not None else out_index.absolute().parent,
        options,
    )  # fmt: skip
    run = _Runner(workers or os.cpu_count() or 1, executor, progress)
    if all(k == "shards" for k in kinds):
        if label:
            raise ValueError("label=True takes its labels from directories; these sources are shards")
        return _pack_shards(items, spec, run)
    if any(k == "shards" for k in kinds):
        shards = next(s for s, k in zip(items, kinds) if k == "shards")
        raise ValueError(f"{shards}: shards cannot be packed together with directories or lists; pack them on their own")
    if label and any(k != "folder" for k in kinds):
        raise ValueError("label=True takes its labels from directories; give only directories")
    return _pack_files(items, kinds, spec, run)


def _pattern(output: str | os.PathLike[str]) -> tuple[str, Compress]:
    """The output pattern and its compression (by the names' suffix).

    Raises:
        ValueError: not a pattern with one ``%d``-style number, or names that end in neither ``.tar`` nor ``.tar.zst``.
    """
    pattern = os.fspath(output)
    try:
        first, second = pattern % 0, pattern % 1
    except (TypeError, ValueError):
        first = second = ""
    if not first or first == second:
        raise ValueError(f"output {pattern!r}: expected a pattern with one %d-style number for the shard, e.g. 'out/train-%06d.tar'")
    row = of_suffix(first)  # the writers pack has: plain tar and seekable zstd
    if row is ZSTD:
        return pattern, "zstd"
    if row is TAR:
        return pattern, None
    raise ValueError(f"output {pattern!r}: shard names must end in .tar (plain) or .tar.zst (seekable zstd)")


def _packed_by(out_index: Path, pattern: str) -> bool:
    """Whether the index at ``out_index`` was written by a pack of ``pattern`` (its meta's ``packed``), so that its
    shards may be written over; ``False`` when there is none.

    Raises:
        PackError: a file is there that is not such an index (an index ``build`` wrote, a pack of another
            pattern's, or not an index at all): replacing it would lose it.
    """
    if not os.path.lexists(out_index):
        return False
    try:
        packed = read_meta(out_index).get("packed")
    except (TarIndexError, OSError):
        packed = None
    if packed != os.path.abspath(pattern):
        raise PackError(
            out_index,
            f"exists and is not the index of an earlier pack of {pattern!r}; choose another --index or output, "
            "or pass force=True (tarindex pack --force) to replace it and the files at the output names",
        )
    return True


def _may_write(path: str, opts: _Options) -> None:
    """Refuse to write a shard over a file at ``path`` that this pack may not replace (:attr:`_Options.replace`).

    Raises:
        PackError: the file is there and is not a shard an earlier pack of this pattern wrote.
    """
    if not opts.replace and os.path.lexists(path):
        raise PackError(
            path,
            "exists and is not a shard an earlier pack of this output pattern wrote (no index of that pack lists "
            "it); remove it, choose another output, or pass force=True (tarindex pack --force) to replace it",
        )


class _Runner:
    """Runs jobs in order: in this process, local processes (threads for object-store inputs) or an executor."""

    def __init__(self, workers: int, executor: Any, progress: Progress | None) -> None:
        if executor is not None and not isinstance(executor, Executor) and callable(getattr(executor, "get_executor", None)):
            executor = executor.get_executor()  # a Dask client
        self.workers = workers
        self.executor: Executor | None = executor
        self.progress = progress
        self.total = 0
        """Samples the pack writes, once known."""

    def forks(self) -> bool:
        """Whether jobs run here or in processes forked from here (which see this process's memory as it was)."""
        return self.executor is None and (self.workers == 1 or "fork" in multiprocessing.get_all_start_methods())

    def map(self, fn: Callable[[Any], Any], jobs: Sequence[Any], *, threads: bool = False) -> Iterator[Any]:
        with contextlib.ExitStack() as stack:
            executor = self.executor
            if executor is None and self.workers > 1 and len(jobs) > 1:
                executor = stack.enter_context(worker_pool(min(self.workers, len(jobs)), threads=threads, name="tarindex-pack"))
            yield from mapped(executor, fn, jobs)

    def done(self, samples: int, nbytes: int) -> None:
        if self.progress is not None and (samples or nbytes):
            self.progress(samples, nbytes, self.total)


def _written(results: Iterable[tuple[ShardInfo, ShardTable, bool]], out_index: Path, run: _Runner, pattern: str) -> tuple[list[str], list[str], int, int]:
    """Shard results, in order, into the index at ``out_index``; returns the shards, those written, samples, bytes."""
    shards: list[str] = []
    written: list[str] = []
    samples = total = 0
    index_dir = out_index.absolute().parent
    with IndexWriter(out_index, packed=os.path.abspath(pattern)) as writer:
        for info, table, wrote in results:
            nbytes = int(table.sample_size.sum()) if table.n_samples else 0
            writer.add(placed(info, relative_path(info.path, index_dir), "file"), table)
            shards.append(info.path)
            if wrote:
                written.append(info.path)
            samples += table.n_samples
            total += nbytes
            run.done(table.n_samples, nbytes)
    later = pattern % len(shards)
    if os.path.exists(later):
        _log.warning("%s: a shard of an earlier pack of this pattern, not in the new index %s (nor are any after it)", later, out_index)
    return shards, written, samples, total


def _report(out_index: Path, done: tuple[list[str], list[str], int, int], classes: list[str] | None = None) -> PackReport:
    shards, written, samples, total = done
    new = set(written)
    kept = [s for s in shards if s not in new]
    return PackReport(out_index, shards, written, kept, samples, total, classes)


# -- inputs and outputs never meet ----------------------------------------------------------------


class _Entries:
    """Where the inputs are: an output must name no input file (its rename would replace the input: names are
    compared as directory entries, the directory resolved), and no output may be inside an input directory (a
    later pack of it would read the shards)."""

    def __init__(self) -> None:
        self._dirs: dict[str, str] = {}
        self.names: dict[str, list[str]] = {}  # file name -> the input paths of that name
        self.folders: list[str] = []

    def _entry(self, path: str) -> tuple[str, str]:
        parent, name = os.path.split(os.path.abspath(path))
        real = self._dirs.get(parent)
        if real is None:
            real = self._dirs[parent] = os.path.realpath(parent)
        return real, name

    def add(self, path: str) -> None:
        self.names.setdefault(os.path.basename(path), []).append(path)

    def add_folder(self, path: str) -> None:
        self.folders.append(os.path.realpath(path))

    def check(self, output: str) -> None:
        """Raises:
        PackError: ``output`` names an input, or is inside an input directory.
        """
        entry = self._entry(output)
        if any(self._entry(path) == entry for path in self.names.get(entry[1], ())):
            raise PackError(output, "names an input of this pack (it would be replaced); choose another output")
        for folder in self.folders:
            if os.path.commonpath([folder, entry[0]]) == folder:
                raise PackError(output, f"is inside the input directory {folder} (a later pack of it would read its own shards); choose another output")


# -- directories and lists -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _FilesJob:
    path: str
    samples: list[Sample] | None
    """The shard's samples; ``None``: ``_SAMPLES[lo:hi]``, inherited from the parent (local processes are forked)."""
    lo: int
    hi: int
    opts: _Options

    def own_samples(self) -> list[Sample]:
        return self.samples if self.samples is not None else _SAMPLES[self.lo : self.hi]


_SAMPLES: list[Sample] = []
"""The samples of the pack in progress, for jobs run here or in processes forked from here (not pickled)."""


def _sample_bytes(key: str, members: Sequence[tuple[str, Any]]) -> int:
    """Bytes a sample takes in a shard written by :class:`tarindex._packout.ShardOut`."""
    total = 0
    for ext, data in members:
        size = data.size if isinstance(data, FileMember) else len(data)
        total += header_size(f"{key}.{ext}", size) + size + padding(size)
    return total


def _order(n: int, seed: int, numbers: np.ndarray | None = None) -> np.ndarray:
    """The shuffle's random 64-bit key of each sample (by its number): the output is in the order of the keys."""
    base = np.uint64(stream_key("tarindex.pack", seed))
    z = np.arange(n, dtype=np.uint64) if numbers is None else numbers.astype(np.uint64)
    return _mix(base + (z + np.uint64(1)) * _GAMMA)


def _pack_files(items: list[str], kinds: list[Any], spec: _Spec, run: _Runner) -> PackReport:
    inputs = _Entries()
    lists: list[list[Sample]] = []
    rows = 0  # rows of CSV and JSON lines lists so far: keys by number go on from list to list
    for item, kind in zip(items, kinds):
        found = samples_of(item, kind, rows)
        if kind in ("csv", "jsonl"):
            rows += len(found)
        if kind == "folder":
            inputs.add_folder(item)
        else:
            inputs.add(item)
        lists.append(found)
    for kind, found in zip(kinds, lists):
        if kind != "folder":  # a folder's files are inside it: an output is not (checked below)
            for _, members in found:
                for _, data in members:
                    if isinstance(data, FileMember):
                        inputs.add(data.path)
    classes = class_names(s for found in lists for s in found) if spec.label else None
    lists = [select(found, spec.exts, spec.keys) for found in lists]
    if classes is not None:  # after the selection: a label is a member the pack adds, not one it selects
        lists = [add_labels(found, item, classes) for found, item in zip(lists, items)]
    samples = [s for found in lists for s in found]
    del lists
    if spec.shuffle:
        order = np.argsort(_order(len(samples), spec.seed), kind="stable")
        samples = [samples[i] for i in order.tolist()]
    cutter = Cutter(spec.maxcount, spec.maxsize)
    cuts = [i for i, sample in enumerate(samples) if cutter.starts_shard(_sample_bytes(*sample))] + [len(samples)]
    inherit = run.forks()  # a job then names its slice of the samples instead of carrying them
    jobs = [
        _FilesJob(spec.pattern % k, None if inherit else samples[lo:hi], lo, hi, spec.opts) for k, (lo, hi) in enumerate(zip(cuts, cuts[1:]))
    ]
    run.total = len(samples)
    for job in jobs:
        inputs.check(job.path)
    inputs.check(str(spec.index))
    global _SAMPLES
    _SAMPLES = samples
    try:
        done = _written(run.map(_files_job, jobs), spec.index, run, spec.pattern)
    finally:
        _SAMPLES = []
    return _report(spec.index, done, classes)


def _files_job(job: _FilesJob) -> tuple[ShardInfo, ShardTable, bool]:
    """Write one shard of files and inline members (or keep the complete one an earlier run wrote)."""

    samples = job.own_samples()

    def fill(out: ShardOut) -> None:
        for key, members in samples:
            out.add(key, members)

    def inputs() -> int:
        return newest_mtime([data.path for _, members in samples for _, data in members if isinstance(data, FileMember)])

    return _write_shard(job.path, job.opts, fill, inputs)


def _write_shard(path: str, opts: _Options, fill: Callable[[ShardOut], None], inputs_mtime: Callable[[], int]) -> tuple[ShardInfo, ShardTable, bool]:
    """Write a shard with ``fill``, or keep the one at ``path`` when it is complete: what ``fill`` would write
    (same table, scanned), newer than the inputs (``inputs_mtime``); returns its record, table and whether it
    was written."""
    kept = _complete(path, opts, fill, inputs_mtime) if opts.resume else None
    if kept is not None:
        return (*kept, False)
    _may_write(path, opts)
    out = ShardOut(path, compress=opts.compress, level=opts.level, frame_size=opts.frame_size)
    try:
        fill(out)
        info, table = out.finish()
    except BaseException:
        out.abort()
        raise
    return info, table, True


def _complete(path: str, opts: _Options, fill: Callable[[ShardOut], None], inputs_mtime: Callable[[], int]) -> tuple[ShardInfo, ShardTable] | None:
    """The record and table of the shard at ``path`` if an earlier run completed it, else ``None``."""
    try:
        mtime = os.stat(path).st_mtime_ns
    except OSError:
        return None
    if inputs_mtime() > mtime:
        return None
    planned = ShardOut(None)
    fill(planned)
    try:
        info, table = scan_shard(path)
    except TarIndexError:  # a damaged or foreign file under the name: written again
        return None
    if info.compression != opts.compress or not same_table(planned.table(), table):
        return None
    return info, table


# -- shards ------------------------------------------------------------------------------------


def _pack_shards(items: list[str], spec: _Spec, run: _Runner) -> PackReport:
    source_index, temporary = _input_index(items, spec, run)
    cache = spec.work / f".{spec.index.name}.zstd-cache"
    try:
        done = _from_index(source_index, spec, run, cache)
    except Exception:
        if temporary:  # an error: nothing to resume; an interrupted or killed pack keeps it for the next run
            _remove_index(source_index)
        raise
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    if temporary:
        _remove_index(source_index)
    return _report(spec.index, done)


def _remove_index(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()


def _from_index(source_index: Path, spec: _Spec, run: _Runner, cache: Path) -> tuple[list[str], list[str], int, int]:
    """The shards of the samples of the input index (through the readers of :class:`tarindex.TarDataset`)."""
    inputs = _Entries()
    inputs.add(str(source_index))
    reader = IndexReader(source_index)
    try:
        threads = False
        for info in reader.shards:
            name = shard_name(source_index, info)
            if info.kind == "command":
                raise PackError(name, "is a command; its output cannot be read in parts: write it to a file first")
            if info.kind == "file":
                inputs.add(name)
            threads = (
                threads or ShardRef.of(name).kind == "object"
            )  # network-bound; and obstore's runtime does not survive fork
        inputs.check(str(spec.index))
        if spec.shuffle:
            return _shuffled(reader, spec, run, cache, inputs, threads)
        ranges = list(_ranges(reader, spec))
        reader.close()
        jobs = [_ShardsJob(str(source_index), str(cache), spec.options, lo, hi, numbers, spec.exts, path=spec.pattern % k, opts=spec.opts) for k, (lo, hi, numbers) in enumerate(ranges)]
        run.total = sum(hi - lo if numbers is None else len(numbers) for lo, hi, numbers in ranges)
        for job in jobs:
            inputs.check(job.path)
        return _written(run.map(_shards_job, jobs, threads=threads), spec.index, run, spec.pattern)
    finally:
        reader.close()
        _close_datasets()


def _input_index(items: list[str], spec: _Spec, run: _Runner) -> tuple[Path, bool]:
    """The index of the input shards: an index given as the source, the one beside the shards when it lists
    exactly them and each is unchanged, else one built for this pack in ``work`` (``True``: to remove when the
    pack is done).

    Raises:
        ShardNotFoundError, CorruptArchiveError: from the build.
    """
    if len(items) == 1 and items[0].endswith(INDEX_SUFFIX) and os.path.isfile(items[0]):
        return Path(items[0]), False
    storage = dict(spec.options.storage_options) if spec.options is not None else {}
    paths = expand_shards(items, storage_options=storage or None)
    if all(ShardRef.of(p).local for p in paths):
        beside = default_index_path(paths)
        if beside.is_file() and _current(beside, paths):
            return beside, False
    built = spec.work / f".{spec.index.name}.inputs{INDEX_SUFFIX}"
    build_index(paths, index=built, workers=run.workers, executor=run.executor, options=spec.options)
    return built, True


def _current(index: Path, paths: list[str]) -> bool:
    """Whether ``index`` lists exactly ``paths``, in order, each unchanged since it was indexed."""
    try:
        reader = IndexReader(index)
    except TarIndexError:
        return False
    try:
        if len(reader.shards) != len(paths):
            return False
        for path, info in zip(paths, reader.shards):
            if os.path.abspath(shard_name(index, info)) != os.path.abspath(path) or current_info(path, info) is None:
                return False
        return True
    except TarIndexError:
        return False
    finally:
        reader.close()


@dataclasses.dataclass(frozen=True)
class _Members:
    """The records of input samples ``lo..hi``, with the bytes each would take in an output shard."""

    lo: int
    keys: list[str]
    starts: np.ndarray
    """int64 per sample, and one more: its first member."""
    exts: list[str]
    """Extension of each member."""
    sizes: np.ndarray
    """int64 per member: data size."""
    kept: np.ndarray
    """bool per member: kept by the extension filter."""
    nbytes: np.ndarray
    """int64 per sample: bytes in an output shard (0: no member kept)."""
    offsets: np.ndarray
    """uint64 per sample: offset of its first header in its (decompressed) shard."""


def _members(reader: IndexReader, lo: int, hi: int, exts: frozenset[str] | None) -> _Members:
    cols = reader.decode(lo, hi)
    names = reader.exts
    keys = [k.decode("utf-8", "surrogateescape") for k in cols.keys]
    starts = np.zeros(len(keys) + 1, np.int64)
    np.cumsum(cols.nmembers, out=starts[1:])
    ext_ids = cols.member_ext.astype(np.int64)
    keep_ext = np.array([exts is None or e in exts for e in names] or [False], bool)
    kept = keep_ext[ext_ids]
    sizes = cols.member_size.astype(np.int64)
    owner = np.repeat(np.arange(len(keys)), cols.nmembers.astype(np.int64))
    key_len = np.fromiter((len(k) for k in keys), np.int64, len(keys))
    key_ascii = np.fromiter((k.isascii() for k in keys), bool, len(keys))
    ext_len = np.array([len(e) for e in names] or [0], np.int64)
    ext_ascii = np.array([e.isascii() for e in names] or [True], bool)
    plain = (key_len[owner] + 1 + ext_len[ext_ids] <= 100) & key_ascii[owner] & ext_ascii[ext_ids] & (sizes < 8**11)
    head = np.full(len(sizes), BLOCK, np.int64)
    member_exts = [names[e] for e in ext_ids.tolist()]
    for k in np.flatnonzero(~plain & kept).tolist():  # a long or non-ASCII name: a PAX header, made to be measured
        head[k] = header_size(f"{keys[owner[k]]}.{member_exts[k]}", int(sizes[k]))
    per_member = np.where(kept, head + ((sizes + (BLOCK - 1)) & ~np.int64(BLOCK - 1)), 0)
    nbytes = np.add.reduceat(per_member, starts[:-1]) if len(keys) else np.zeros(0, np.int64)
    return _Members(lo, keys, starts, member_exts, sizes, kept, nbytes, cols.offset)


def _kept(m: _Members, keys: Callable[[str], bool] | None) -> np.ndarray:
    """The input numbers of the samples both filters keep."""
    keep = m.nbytes > 0
    if keys is not None:
        keep &= np.fromiter((keys(k) for k in m.keys), bool, len(m.keys))
    return np.flatnonzero(keep) + m.lo


def _input_shards(reader: IndexReader, spec: _Spec) -> Iterator[tuple[_Members, np.ndarray]]:
    """Each input shard with samples: its records, and the numbers of the samples the filters keep."""
    starts = reader.shard_starts()
    for s in range(len(reader.shards)):
        lo, hi = int(starts[s]), int(starts[s + 1])
        if lo < hi:
            m = _members(reader, lo, hi, spec.exts)
            yield m, _kept(m, spec.keys)


def _ranges(reader: IndexReader, spec: _Spec) -> Iterator[tuple[int, int, np.ndarray | None]]:
    """Output shards as ranges ``lo..hi`` of input samples, with the numbers of those kept when a filter drops some."""
    cutter = Cutter(spec.maxcount, spec.maxsize)
    pieces: list[np.ndarray] = []
    for m, numbers in _input_shards(reader, spec):
        lo = m.lo
        first = 0
        for i, nbytes in enumerate(m.nbytes[numbers - lo].tolist()):
            if cutter.starts_shard(nbytes):
                if i > first:
                    pieces.append(numbers[first:i])
                if pieces:
                    yield _range(pieces)
                pieces, first = [], i
        if first < len(numbers):
            pieces.append(numbers[first:])
    if pieces:
        yield _range(pieces)


def _range(pieces: list[np.ndarray]) -> tuple[int, int, np.ndarray | None]:
    numbers = np.concatenate(pieces)
    lo, hi = int(numbers[0]), int(numbers[-1]) + 1
    return lo, hi, numbers if len(numbers) != hi - lo else None


_DATASETS: dict[tuple[str, str], TarDataset] = {}
_DATASETS_LOCK = threading.Lock()  # jobs on threads (object-store inputs) share one dataset: LMDB opens a file once a process


def _dataset(index: str, cache: str, options: SourceOptions | None) -> TarDataset:
    """This process's dataset over the input index (zstd shards of large frames read through a cache in ``cache``)."""
    with _DATASETS_LOCK:
        found = _DATASETS.get((index, cache))
        if found is None:
            found = _DATASETS[(index, cache)] = TarDataset(index, zstd_cache_dir=cache, options=options)
        return found


def _close_datasets() -> None:
    for ds in _DATASETS.values():
        ds.close()
    _DATASETS.clear()


def _input_samples(ds: TarDataset | None, m: _Members, numbers: Iterable[int]) -> Iterator[tuple[str, list[tuple[str, Any]]]]:
    """Input samples (ascending numbers) as ``(key, kept members)``: their bytes read from ``ds`` (a local gzip
    shard decompressed in one pass: its samples one by one would each inflate from a seek point), or, without
    ``ds``, their sizes."""
    if ds is None:
        for n in numbers:
            yield _kept_members(m, n, None)
        return
    starts = ds.index.shard_starts()
    wanted = list(numbers)
    i = 0
    while i < len(wanted):
        shard = int(np.searchsorted(starts, wanted[i], side="right")) - 1
        j = int(np.searchsorted(wanted, int(starts[shard + 1])))  # the wanted samples of this shard: wanted[i:j]
        info = ds.index.shards[shard]
        if (codec := BY_ENTRY.get(info.compression)) is not None and codec.one_pass and info.kind == "file":
            yield from _streamed(ds, shard, info, m, wanted[i:j])
        else:
            for n in wanted[i:j]:
                yield _kept_members(m, n, ds.read(n))
        i = j


def _kept_members(m: _Members, n: int, sample: dict[str, Any] | None) -> tuple[str, list[tuple[str, Any]]]:
    """Sample ``n``'s key and kept members: bytes from ``sample``, or (without one) sizes."""
    j = n - m.lo
    members: list[tuple[str, Any]] = []
    for k in range(int(m.starts[j]), int(m.starts[j + 1])):
        if m.kept[k]:
            ext = m.exts[k]
            members.append((ext, sample[ext] if sample is not None else FileMember("", int(m.sizes[k]))))
    return m.keys[j], members


def _streamed(ds: TarDataset, shard: int, info: ShardInfo, m: _Members, numbers: list[int]) -> Iterator[tuple[str, list[tuple[str, Any]]]]:
    """Samples ``numbers`` of a local compressed shard, decompressed from its start in one pass (checked against
    its index record first, as a read would be), found by their offsets.

    Raises:
        StaleIndexError: the shard changed since it was indexed.
        ShardNotFoundError: the shard is missing.
    """
    path = shard_name(ds.index.path, info)
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError as exc:
        raise ShardNotFoundError(f"{path}: shard named by {ds.index.path} is missing") from exc
    try:
        check_shard(path, fd, info)
        at = {int(m.offsets[n - m.lo]): n for n in numbers}
        chunks = iter(functools.partial(os.read, fd, _STREAM_READ), b"")
        for offset, sample in iter_samples(iter_archive(chunks, path), path):
            n = at.pop(offset, None)
            if n is not None:
                yield _kept_members(m, n, sample)
                if not at:
                    return
        if at:
            raise CorruptArchiveError(path, min(at), "the shard ends before a sample its index lists; rebuild the index")
    finally:
        os.close(fd)


@dataclasses.dataclass(frozen=True)
class _InputRange:
    """Input samples ``lo..hi`` of an index (those in ``numbers`` when a filter drops some) and how to read them."""

    index: str
    cache: str
    options: SourceOptions | None
    lo: int
    hi: int
    numbers: np.ndarray | None
    exts: frozenset[str] | None

    def sample_numbers(self) -> list[int]:
        return self.numbers.tolist() if self.numbers is not None else list(range(self.lo, self.hi))

    def open(self) -> tuple[TarDataset, _Members]:
        """This process's dataset over the index, and the records of the range."""
        ds = _dataset(self.index, self.cache, self.options)
        return ds, _members(ds.index, self.lo, self.hi, self.exts)


@dataclasses.dataclass(frozen=True)
class _ShardsJob(_InputRange):
    path: str
    opts: _Options


def _shards_job(job: _ShardsJob) -> tuple[ShardInfo, ShardTable, bool]:
    """Write one shard of input samples (or keep the complete one an earlier run wrote)."""
    ds, m = job.open()

    def fill(out: ShardOut) -> None:
        for key, members in _input_samples(ds if out.path is not None else None, m, job.sample_numbers()):
            out.add(key, members)

    def inputs() -> int:
        starts = ds.index.shard_starts()
        first, last = (int(np.searchsorted(starts, n, side="right")) - 1 for n in (job.lo, job.hi - 1))
        return max(ds.index.shards[s].mtime_ns for s in range(first, last + 1))

    return _write_shard(job.path, job.opts, fill, inputs)


# -- the external shuffle of shards ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _ScatterJob(_InputRange):
    number: int
    seed: int
    buckets: int
    directory: str
    buffer: int
    """Write buffer of each open bucket file (all of them together a small part of the memory bound)."""


def _bucket_file(directory: str | Path, job: int, bucket: int) -> str:
    return os.path.join(directory, f"{bucket:06d}.{job:06d}")


def _scatter_job(job: _ScatterJob) -> int:
    """Append the kept samples of a range of input samples to bucket files, by their order keys, one input shard's
    records at a time; returns the samples."""
    ds = _dataset(job.index, job.cache, job.options)
    starts = ds.index.shard_starts()
    wanted = np.array(job.sample_numbers(), np.int64)
    files = _BucketFiles(job.directory, job.number, job.buffer)
    try:
        first = int(np.searchsorted(starts, job.lo, side="right")) - 1
        for shard in range(first, len(starts) - 1):
            a, b = max(job.lo, int(starts[shard])), min(job.hi, int(starts[shard + 1]))
            if a >= job.hi:
                break
            numbers = wanted[np.searchsorted(wanted, a) : np.searchsorted(wanted, b)]
            if not len(numbers):
                continue
            m = _members(ds.index, a, b, job.exts)
            order = _order(0, job.seed, numbers)
            buckets = ((order >> np.uint64(32)) * np.uint64(job.buckets)) >> np.uint64(32)  # ranges of keys, in key order
            for (key, members), r, bucket, n in zip(_input_samples(ds, m, numbers.tolist()), order.tolist(), buckets.tolist(), numbers.tolist()):
                meta = "\0".join([key, *(ext for ext, _ in members)]).encode("utf-8", "surrogateescape")
                sizes = [len(data) for _, data in members]
                f = files.get(bucket)
                f.write(_RECORD.pack(r, n, len(meta), len(members), sum(sizes)))
                f.write(meta)
                f.write(struct.pack(f"<{len(sizes)}Q", *sizes))
                for _, data in members:
                    f.write(data)
    finally:
        files.close()
    return len(wanted)


class _BucketFiles:
    """A scatter job's bucket files, at most ``_OPEN_BUCKETS`` open at a time (the rest reopened to append)."""

    def __init__(self, directory: str, job: int, buffer: int) -> None:
        self.directory, self.job, self.buffer = directory, job, buffer
        self.open: OrderedDict[int, Any] = OrderedDict()

    def get(self, bucket: int) -> Any:
        f = self.open.get(bucket)
        if f is not None:
            self.open.move_to_end(bucket)
            return f
        if len(self.open) >= _OPEN_BUCKETS:
            self.open.popitem(last=False)[1].close()
        f = self.open[bucket] = open(_bucket_file(self.directory, self.job, bucket), "ab", buffering=self.buffer)  # noqa: SIM115 - closed by close()
        return f

    def close(self) -> None:
        for f in self.open.values():
            f.close()
        self.open.clear()


def _gathered(directory: Path, buckets: int, jobs: int) -> Iterator[tuple[str, list[tuple[str, Any]]]]:
    """The samples of the bucket files in order-key order: each bucket read whole (every job's file), sorted."""
    for b in range(buckets):
        buffers = []
        for job in range(jobs):
            with contextlib.suppress(FileNotFoundError), open(_bucket_file(directory, job, b), "rb") as f:
                buffers.append(f.read())
        records = []
        for i, buf in enumerate(buffers):
            pos = 0
            while pos < len(buf):
                r, n, meta_len, count, data_len = _RECORD.unpack_from(buf, pos)
                records.append((r, n, i, pos))
                pos += _RECORD.size + meta_len + 8 * count + data_len
        records.sort()
        views = [memoryview(buf) for buf in buffers]
        for _, _, i, pos in records:
            _, _, meta_len, count, _ = _RECORD.unpack_from(buffers[i], pos)
            pos += _RECORD.size
            key, *exts = str(buffers[i][pos : pos + meta_len], "utf-8", "surrogateescape").split("\0")
            pos += meta_len
            sizes = struct.unpack_from(f"<{count}Q", buffers[i], pos)
            pos += 8 * count
            members = []
            for ext, size in zip(exts, sizes):
                members.append((ext, views[i][pos : pos + size]))
                pos += size
            yield key, members
        del buffers, views, records


class _Restart(Exception):
    """A shard kept from an earlier run is not what this gather makes: gather again, writing every shard."""


def _shuffled(reader: IndexReader, spec: _Spec, run: _Runner, cache: Path, inputs: _Entries, threads: bool) -> tuple[list[str], list[str], int, int]:
    """Scatter the input samples into bucket files by a random key (jobs in parallel), then gather the buckets in
    key order, one at a time, into the shards (here)."""
    shards: list[tuple[int, int, np.ndarray]] = []
    total = 0
    for m, numbers in _input_shards(reader, spec):
        total += int(m.sizes[m.kept].sum()) + 64 * len(numbers)
        run.total += len(numbers)
        shards.append((m.lo, m.lo + len(m.keys), numbers))
    ranges = _scatter_ranges(shards, max(min(len(shards), _SCATTER_JOBS), 2 * run.workers, -(-run.total // _SCATTER_SAMPLES)))
    newest = max((info.mtime_ns for info in reader.shards), default=0)
    source = str(reader.path)
    buckets = max(1, -(-total // max(1, spec.memory // 4)))  # a bucket holds a quarter of the memory, on average
    _remove_stale_buckets(spec.work, spec.index)
    directory = spec.work / f".{spec.index.name}.shuffle-{os.getpid()}"
    directory.mkdir(parents=True, exist_ok=True)
    try:
        jobs = [_ScatterJob(
                source, str(cache), spec.options, lo, hi, numbers, spec.exts, number=i, seed=spec.seed, buckets=buckets, directory=str(directory),
                buffer=max(4096, min(_BUCKET_BUFFER, spec.memory // (8 * min(buckets, _OPEN_BUCKETS)))),
            ) for i, (lo, hi, numbers) in enumerate(ranges)]
        for _ in run.map(_scatter_job, jobs, threads=threads):
            pass
        gather = functools.partial(_gather, directory, buckets, len(jobs), spec, newest, inputs)
        try:
            return _written(gather(resume=spec.opts.resume), spec.index, run, spec.pattern)
        except _Restart as exc:
            _log.warning("%s; writing every shard again", exc)
            return _written(gather(resume=False), spec.index, run, spec.pattern)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _scatter_ranges(shards: list[tuple[int, int, np.ndarray]], jobs: int) -> list[tuple[int, int, np.ndarray | None]]:
    """Consecutive input shards (their range and kept samples) grouped into about ``jobs`` scatter jobs of similar
    sample counts: the bucket files are jobs x buckets, however many input shards there are."""
    kept = sum(len(numbers) for _, _, numbers in shards)
    per = max(1, -(-kept // max(1, jobs)))
    out: list[tuple[int, int, np.ndarray | None]] = []
    group: list[tuple[int, int, np.ndarray]] = []
    count = 0
    for shard in shards:
        group.append(shard)
        count += len(shard[2])
        if count >= per or shard is shards[-1]:
            lo, hi = group[0][0], group[-1][1]
            numbers = np.concatenate([g[2] for g in group])
            out.append((lo, hi, None if len(numbers) == hi - lo else numbers))
            group, count = [], 0
    return out


def _remove_stale_buckets(work: Path, out_index: Path) -> None:
    """Remove the bucket directories of shuffles of this output whose process is gone (a killed pack)."""
    pattern = re.compile(rf"\.{re.escape(out_index.name)}\.shuffle-(\d+)")
    with contextlib.suppress(OSError):
        for entry in work.iterdir():
            found = pattern.fullmatch(entry.name)
            if found is not None and not alive(int(found.group(1))):
                shutil.rmtree(entry, ignore_errors=True)


def _gather(
    directory: Path, buckets: int, jobs: int, spec: _Spec, newest: int, inputs: _Entries, *, resume: bool
) -> Iterator[tuple[ShardInfo, ShardTable, bool]]:
    """The shards of the gathered samples, written one after the other (a shard an earlier run completed is only
    compared, not written).

    Raises:
        _Restart: a shard of an earlier run is not the one this gather makes.
    """
    cutter = Cutter(spec.maxcount, spec.maxsize)
    out: ShardOut | None = None
    k = -1
    try:
        for key, members in _gathered(directory, buckets, jobs):
            if cutter.starts_shard(_sample_bytes(key, members)):
                if out is not None:
                    yield _gathered_shard(out, spec.pattern % k, spec.opts)
                k += 1
                path = spec.pattern % k
                inputs.check(path)
                clean_stale(Path(path))
                kept = resume and os.path.exists(path) and os.stat(path).st_mtime_ns >= newest
                if not kept:
                    _may_write(path, spec.opts)
                out = ShardOut(None if kept else path, compress=spec.opts.compress, level=spec.opts.level, frame_size=spec.opts.frame_size)
            out.add(key, members)  # type: ignore[union-attr]  # made with the first sample
        if out is not None:
            yield _gathered_shard(out, spec.pattern % k, spec.opts)
    except BaseException:
        if out is not None:
            out.abort()
        raise


def _gathered_shard(out: ShardOut, path: str, opts: _Options) -> tuple[ShardInfo, ShardTable, bool]:
    if out.path is not None:
        return (*out.finish(), True)
    try:
        info, table = scan_shard(path)
    except TarIndexError:
        raise _Restart(f"{path}: a shard of an earlier run is damaged") from None
    if info.compression != opts.compress or not same_table(out.table(), table):
        raise _Restart(f"{path}: a shard of an earlier run holds other samples than this pack writes")
    return info, table, False
