"""Read an index: the file opened lazily per process and read with ``pread`` (never mapped), record
blocks read one at a time, hashed key lookup.

Importing this module, or opening an index, never imports torch. Opening reads the LMDB container's
two meta pages (checked against the file's size, so a truncated file is an
:class:`~tarindex.errors.IndexFormatError`) and the sealed ``meta``; a sample reads its record block and
the B-tree pages above it. Every read is followed by a check that the file is still the one opened: a
file changed in place under a reader (``cp``, ``rsync --inplace``, a truncation) is an
:class:`~tarindex.errors.IndexChangedError`, never a ``SIGBUS`` or another index's records.
"""

from __future__ import annotations

import json
import os
import time
import weakref
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any, overload

import numpy as np

from .._codecs import stores_tar
from ..errors import IndexChangedError, IndexFormatError, IndexNotFoundError, SampleNotFoundError
from .format import (
    BLOCK_PREFIX,
    FRAMES_PREFIX,
    GZIP_PREFIX,
    KEYS_PREFIX,
    SHARDS_PREFIX,
    START_KEY,
    ShardInfo,
    ShardTable,
    bucket_of,
    key_hash,
)
from .meta import open_meta
from .pages import IndexFile, numbered, unseal
from .records import Block, Columns, parse

__all__ = ["IndexReader"]

class _Env:
    """One open index file per process, shared by the readers of that file (reference counted: readers
    and every :class:`BlockSource`); keyed by inode, and by what the file was when opened (a rebuilt index
    renamed over the old one, or a file rewritten in place, gets its own).

    Every value read from the file (:class:`~tarindex.index.pages.IndexFile`, ``pread``) is followed by a
    check that the file is still the one opened (one ``fstat``: size, modification and change time); a value
    found in pages read before is the index as opened, and checked again at most every ``CHECK_SECONDS``. A changed
    file whose meta still names the same build (``touch``, ``chmod``, an identical copy) is taken as it
    is; any other change is :class:`~tarindex.errors.IndexChangedError`, from then on for every read.
    """

    def __init__(self, key: tuple[int, int], path: Path) -> None:
        try:
            self.file = IndexFile(path)
        except OSError as exc:
            raise IndexFormatError(f"{path}: cannot read the index ({exc.strerror or exc})") from exc
        self.key, self.refs, self.pid, self.path = key, 0, os.getpid(), path
        self.changed: str | None = None  # what changed, once the file is no longer this index
        self.due = 0.0  # a value read only from pages held is checked (again) from then on
        try:
            self.meta = open_meta(self.file)
        except IndexFormatError:
            self.close()
            raise

    def get(self, key: bytes, path: Path) -> bytes | memoryview | None:
        """The value under ``key``, read from the file, which is then checked to be the one opened.

        Raises:
            IndexChangedError: the file changed since it was opened.
            IndexFormatError: the file is damaged, or was closed.
        """
        for _ in range(2):
            if self.file.fd < 0:
                raise IndexFormatError(f"{path}: the index was closed")
            if self.changed is not None:
                raise IndexChangedError(self.path, self.changed)
            reads = self.file.reads
            try:
                value = self.file.get(key)
            except (IndexFormatError, OSError) as exc:
                if not self.check():  # unchanged: damage, said as such (a changed file said so by check)
                    if isinstance(exc, OSError):
                        raise IndexFormatError(f"{path}: cannot read the index ({exc.strerror or exc})") from exc
                    raise
                continue  # changed under the read and still this build: read again
            if self.file.reads == reads and _monotonic() < self.due:
                return value  # from pages read before (and checked then): the index as opened, as held blocks are
            if not self.check():
                return value
        raise IndexChangedError(self.path, "rewritten while it was read")

    def value(self, key: bytes, path: Path, where: str) -> memoryview:
        """The payload under ``key`` (:meth:`get`, its seal checked: one step for every value the reader
        reads; ``where`` names the value in errors).

        Raises:
            IndexFormatError: the value is missing or damaged.
            IndexChangedError: the file changed since it was opened.
        """
        return unseal(self.get(key, path), key, where)

    def optional(self, key: bytes, path: Path, where: str) -> memoryview | None:
        """:meth:`value`, or ``None`` for a value the index does not hold (a plain shard's frame table)."""
        raw = self.get(key, path)
        return None if raw is None else unseal(raw, key, where)

    def check(self) -> bool:
        """Whether the file changed since it was opened (or last checked) and is still this index; then its
        new identity is taken. One ``fstat`` when unchanged.

        Raises:
            IndexChangedError: the file is no longer this index (another build, or no longer readable as
                one); raised again by every later call.
        """
        if self.changed is None:
            what = self.file.changed()
            if what is None:
                self.due = _monotonic() + CHECK_SECONDS
                return False
            try:
                now = IndexFile(self.path, self.file.fd)  # the same open file, its meta pages read again
                build = open_meta(now)["build_id"]
            except (IndexFormatError, OSError):
                build = None
            else:
                if build == self.meta["build_id"] and now.container == self.file.container:  # touch, chmod, a copy
                    self.file.identity = now.identity
                    self.due = _monotonic() + CHECK_SECONDS
                    return True
            self.changed = what if build is None else f"{what}; build {self.meta['build_id']} -> {build}"
        raise IndexChangedError(self.path, self.changed)

    def acquire(self) -> _Env:
        self.refs += 1
        return self

    def release(self) -> None:
        if self.pid != os.getpid():  # inherited through fork: the child closed it already
            return
        self.refs -= 1
        if self.refs <= 0:
            if _ENVS.get(self.key) is self:
                del _ENVS[self.key]
            self.close()

    def close(self) -> None:
        self.file.close()


_ENVS: dict[tuple[int, int], _Env] = {}
_ENVS_PID = os.getpid()


def _acquire(path: Path) -> _Env:
    global _ENVS_PID
    if os.getpid() != _ENVS_PID:  # inherited through fork: close the parent's, open our own
        for handle in list(_ENVS.values()):
            handle.close()
        _ENVS.clear()
        _ENVS_PID = os.getpid()
    st = path.stat()
    key = (st.st_dev, st.st_ino)
    found = _ENVS.get(key)
    if found is None or found.changed is not None or found.file.changed() is not None:  # rewritten in place since
        found = _ENVS[key] = _Env(key, path)
    return found.acquire()


_UNBOUNDED = (1 << 64) - 1
_monotonic = time.monotonic
CHECK_SECONDS = 0.1
"""A process reading only record blocks it holds checks the index file again (one ``fstat``) at its first
read after this many seconds without a check (the clock read every ``CHECK_EVERY`` reads); every block it
reads for the first time is checked anyway."""
CHECK_EVERY = 16


class BlockSource:
    """The record blocks of one index in one process: each read once (a private copy), checked, then kept.

    A block is read with ``pread`` and the file then checked to be the one opened, so the records a
    process holds are the index it opened, whatever happens to the file later; :meth:`check` (at most
    every :data:`CHECK_SECONDS` for reads of blocks already held) makes a changed file an
    :class:`~tarindex.errors.IndexChangedError` for them too. Holds the index file open while it lives
    (a dataset's C reader keeps one), even after :meth:`IndexReader.close`.
    """

    def __init__(self, reader: IndexReader) -> None:
        self._env: _Env | None = _acquire(reader.path)
        self._where = str(reader.path)
        meta = reader.meta
        self.block_samples: int = meta["block_samples"]
        self._n, self._n_exts = reader.n_samples, len(reader.exts)
        self._blocks: dict[int, Block] = {}
        self._due = _monotonic() + CHECK_SECONDS
        self._countdown = 0
        self._shards = reader.shards
        self.bounds = array("Q", bytes(8 * len(self._shards)))
        """Per shard: 0 until its record is read, then the bytes a record of it may span (its recorded size for
        a plain tar; ``2**64 - 1`` for a compressed one, whose reader checks the ranges it is asked)."""
        self.check_seconds = CHECK_SECONDS
        self.check_every = CHECK_EVERY
        if self._env.meta.get("build_id") != meta["build_id"]:
            raise IndexChangedError(reader.path, f"build {meta['build_id']} -> {self._env.meta.get('build_id')}")

    def block(self, b: int) -> Block:
        """Block ``b``, parsed and checked (cached).

        Raises:
            IndexFormatError: the block is missing or damaged.
            IndexChangedError: the index file changed since it was opened.
        """
        found = self._blocks.get(b)
        if found is None:
            if self._env is None:
                raise IndexFormatError(f"{self._where}: the index was closed")
            if not 0 <= b * self.block_samples < self._n:
                raise IndexError(f"record block {b} out of range")
            where = f"{self._where}: record block {b}"
            view = self._env.value(numbered(BLOCK_PREFIX, b), Path(self._where), where)
            expected = min(self.block_samples, self._n - b * self.block_samples)
            found = parse(view, self._n_exts, expected, where)
            if len(self._blocks) >= 4096:
                self._blocks.clear()
            self._blocks[b] = found
        return found

    def payload(self, b: int) -> memoryview:
        """Block ``b``'s checked bytes (a view of this process's copy, for the C reader)."""
        return self.block(b).view

    def check(self) -> None:
        """Check that the index file is still the one opened (one ``fstat``; the C reader calls this).

        Raises:
            IndexChangedError: it changed (another build, or no longer readable as this one).
            IndexFormatError: the index was closed.
        """
        if self._env is None:
            raise IndexFormatError(f"{self._where}: the index was closed")
        self._env.check()
        self._due = _monotonic() + CHECK_SECONDS

    def record(self, i: int) -> tuple[int, int, int, list[tuple[int, int, int]], bytes]:
        """Sample ``i``: ``(shard, offset, size, [(extension number, data offset, size)...], key bytes)``.

        Raises:
            IndexFormatError: its record is damaged.
            IndexChangedError: the index file changed since it was opened.
        """
        self._countdown -= 1
        if self._countdown < 0:  # the clock read every CHECK_EVERY reads
            if _monotonic() >= self._due:
                self.check()  # when it raises, the countdown stays below 0: every later read checks again
            self._countdown = CHECK_EVERY
        b, j = divmod(i, self.block_samples)
        found = (self._blocks.get(b) or self.block(b)).record(j, self._where, i)
        try:
            bound = self.bounds[found[0]] or self.bound(found[0])
        except IndexError:  # a shard the index does not have
            bound = 0
        if found[1] + found[2] > bound:
            shard, where = found[0], f"{self._where}: the record of sample {i} is damaged"
            past = f"past the {bound} bytes of shard {shard}" if bound else f"in shard {shard} of {len(self.bounds)}"
            raise IndexFormatError(f"{where} ({found[2]} bytes at offset {found[1]} {past}); rebuild the index")
        return found

    def bound(self, shard: int) -> int:
        """Shard ``shard``'s entry of :attr:`bounds`, from its record (read now if it is not yet; the C reader calls this).

        Raises:
            IndexFormatError: the shard record is damaged.
        """
        info = self._shards[shard]
        found = self.bounds[shard] = max(info.size, 1) if stores_tar(info.compression) else _UNBOUNDED
        return found

    def release(self) -> None:
        env, self._env = self._env, None
        self._blocks = {}
        if env is not None:
            env.release()

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:
            pass


_SHARD_BLOCKS_KEPT = 256  # decoded blocks of shard records a ShardList keeps (256 x 64 records, ~5 MB)


class ShardList(Sequence[ShardInfo]):
    """The shard records, read in blocks of ``SHARD_BLOCK`` on first use (a bounded number kept decoded)."""

    def __init__(self, reader: IndexReader) -> None:
        self._reader: Callable[[], IndexReader | None] = weakref.ref(reader)  # not a cycle: a reader that goes closes its environment at once
        self._own: IndexReader | None = None
        self._path, self._build = reader.path, reader.build_id
        self._n: int = reader.meta["n_shards"]
        self._per: int = reader.meta["shard_block"]
        self._blocks: dict[int, list[ShardInfo]] = {}

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, s: int) -> ShardInfo: ...
    @overload
    def __getitem__(self, s: slice) -> list[ShardInfo]: ...
    def __getitem__(self, s: int | slice) -> ShardInfo | list[ShardInfo]:
        if isinstance(s, slice):
            return [self[k] for k in range(*s.indices(self._n))]
        if s < 0:
            s += self._n
        if not 0 <= s < self._n:
            raise IndexError(f"shard {s} out of range for {self._n} shards")
        b, j = divmod(s, self._per)
        block = self._blocks.get(b)
        if block is None:
            block = self._source()._shard_block(b, min(self._per, self._n - b * self._per))
            blocks = self._blocks
            if len(blocks) >= _SHARD_BLOCKS_KEPT:  # start again (a new dict: threads reading the old one are unharmed)
                blocks = self._blocks = {}
            blocks[b] = block
        return block[j]

    def __iter__(self) -> Iterator[ShardInfo]:
        for s in range(self._n):
            yield self[s]

    def __getstate__(self) -> dict[str, Any]:  # by path: the reader it came from is opened again where it is used
        return {"path": self._path, "build": self._build, "n": self._n, "per": self._per}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._reader, self._own, self._blocks = lambda: None, None, {}
        self._path, self._build, self._n, self._per = state["path"], state["build"], state["n"], state["per"]

    def _source(self) -> IndexReader:
        reader = self._reader() or self._own
        if reader is None:  # the reader this list came from is gone: the same file, opened again
            reader = self._own = IndexReader(self._path)
            if reader.build_id != self._build:
                raise IndexChangedError(self._path, f"build {self._build} -> {reader.build_id}")
        return reader


class IndexReader:
    """A read-only view of one index file.

    The file opens lazily in each process (after ``fork`` a child opens its own, and refuses a
    different file: :class:`~tarindex.errors.IndexChangedError`). Opening reads the meta only;
    records, keys and shard records are read a block at a time as they are asked for, each read
    followed by a check that the file did not change (one ``fstat``). Pickles by path.

    Raises:
        IndexNotFoundError: the file does not exist.
        IndexFormatError: the file is not a tarindex index, has another format version, or is damaged.
        IndexChangedError: (on any later read) the file changed since it was opened.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._pid = -1
        self._handle: _Env | None = None
        self._source: BlockSource | None = None
        self._open()

    # -- process-local state -------------------------------------------------
    def _open(self) -> None:
        self._release()
        if not self.path.is_file():
            raise IndexNotFoundError(f"{self.path}: no index here (build one with 'tarindex build')")
        handle = _acquire(self.path)
        first = self.__dict__.get("meta")
        if first is not None and first["build_id"] != handle.meta["build_id"]:
            handle.release()
            raise IndexChangedError(self.path, f"build {first['build_id']} -> {handle.meta['build_id']}")
        self._handle, self._pid = handle, os.getpid()
        self.__dict__.setdefault("meta", handle.meta)

    def _release(self) -> None:
        handle, source = self.__dict__.get("_handle"), self.__dict__.get("_source")
        self._handle, self._source = None, None
        if source is not None and self._pid == os.getpid():
            source.release()
        if handle is not None and self._pid == os.getpid():
            handle.release()

    def _env(self) -> _Env:
        handle = self._handle
        if self._pid != os.getpid() or handle is None:
            self._open()
            handle = self._handle
        if handle is None:
            raise IndexFormatError(f"{self.path}: the index could not be opened")
        return handle

    def _value(self, key: bytes, where: str) -> memoryview:
        return self._env().value(key, self.path, where)

    def _optional(self, key: bytes, where: str) -> memoryview | None:
        return self._env().optional(key, self.path, where)

    def blocks(self) -> BlockSource:
        """A new :class:`BlockSource` for this process (it keeps the index open while it lives).

        Raises:
            IndexChangedError: the file at this path is no longer the index first opened.
        """
        self._env()
        return BlockSource(self)

    def _blocks(self) -> BlockSource:
        if self._source is None or self._pid != os.getpid():
            self._env()
            self._source = BlockSource(self)
        return self._source

    def close(self) -> None:
        """Release this reader's hold on the LMDB environment (reopened on next use).

        Views handed out by :meth:`blocks` stay valid: they hold the environment themselves.
        """
        self._release()
        self._pid = -1

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"])  # type: ignore[misc]

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    # -- metadata ------------------------------------------------------------
    meta: dict[str, Any]

    @property
    def build_id(self) -> str:
        """A random id made by each build: an index rewritten in place has another."""
        return str(self.meta["build_id"])

    @property
    def part(self) -> tuple[int, int] | None:
        """``(K, N)`` for an index built with ``part=(K, N)``, else ``None``."""
        part = self.meta["part"]
        return None if part is None else (part[0], part[1])

    @cached_property
    def shards(self) -> ShardList:
        """Shard records, in index order (read a block at a time)."""
        return ShardList(self)

    def _shard_block(self, b: int, expected: int) -> list[ShardInfo]:
        where = f"{self.path}: shard records block {b}"
        payload = self._value(numbered(SHARDS_PREFIX, b), where)
        try:
            raw = json.loads(bytes(payload))
            if not isinstance(raw, list) or len(raw) != expected:
                raise IndexFormatError(f"expected {expected} records")
            infos = [ShardInfo.from_json(obj) for obj in raw]
        except (ValueError, IndexFormatError) as exc:
            raise IndexFormatError(f"{where} is damaged ({exc}); rebuild the index") from exc
        return infos

    @cached_property
    def exts(self) -> list[str]:
        """Extension table."""
        return list(self.meta["exts"])

    @property
    def n_samples(self) -> int:
        return int(self.meta["n_samples"])

    @property
    def n_members(self) -> int:
        return int(self.meta["n_members"])

    @property
    def url_shards(self) -> int:
        """Shards read from URLs (from the meta: no shard record is read)."""
        return int(self.meta["url_shards"])

    @property
    def command_shards(self) -> int:
        """Shards that are commands (``pipe:``), from the meta."""
        return int(self.meta["command_shards"])

    @property
    def samples_per_frame(self) -> int:
        """Mean samples per zstd frame over the zstd shards with a frame table (rounded down, at least 1);
        1 without any (from the meta: no shard record or frame table is read)."""
        frames = int(self.meta["zstd_frames"])
        return max(1, int(self.meta["zstd_samples"]) // frames) if frames else 1

    @property
    def duplicate_keys(self) -> int:
        """Samples whose key already belongs to an earlier sample."""
        return int(self.meta["duplicate_keys"])

    def __len__(self) -> int:
        return self.n_samples

    def shard_path(self, shard: int) -> Path:
        """Absolute path of a shard."""
        return self.path.parent / self.shards[shard].path

    def shard_starts(self) -> np.ndarray:
        """uint64 ``[n_shards + 1]``: each shard's first sample number, then the sample count (cached).

        Raises:
            IndexFormatError: the table is damaged.
        """
        found = self.__dict__.get("_starts")
        if found is None:
            where = f"{self.path}: the shard start table"
            starts = np.frombuffer(self._value(START_KEY, where), "<u8")
            n = self.meta["n_shards"]
            if len(starts) != n + 1 or int(starts[0]) != 0 or int(starts[-1]) != self.n_samples or bool((np.diff(starts.astype(np.int64)) < 0).any()):
                raise IndexFormatError(f"{where} is damaged (expected {n + 1} ascending starts from 0 to {self.n_samples}); rebuild the index")
            found = self.__dict__["_starts"] = starts.copy()
        return found

    def checked_starts(self, shards: Iterable[int], counts: Sequence[object] | None = None) -> np.ndarray:
        """:meth:`shard_starts`, with the sample count of each of ``shards`` compared with its record (each is
        checked on its own; a crafted start table would shift sample numbers from one shard to another).
        ``counts``: every shard's recorded sample count, by shard number, when the caller has read the records
        already (else each of ``shards`` is decoded).

        Raises:
            IndexFormatError: the table is damaged, or disagrees with a shard's record.
        """
        starts = self.shard_starts()
        for shard in shards:
            recorded = self.shards[shard].n_samples if counts is None else counts[shard]
            if recorded != int(starts[shard + 1] - starts[shard]):
                raise IndexFormatError(
                    f"{self.path}: shard records block {shard // self.meta['shard_block']} is damaged "
                    f"(shard {shard} has {recorded} samples, the start table says otherwise); rebuild the index"
                )
        return starts

    # -- samples -------------------------------------------------------------
    def record(self, i: int) -> tuple[int, int, int, list[tuple[str, int, int]], str]:
        """Sample ``i``'s record: ``(shard, offset, size, members, key)``.

        ``members`` is ``(extension, data offset relative to the sample, size)`` per member.

        Raises:
            IndexError: ``i`` is out of range.
            IndexFormatError: the record is damaged.
        """
        n = self.n_samples
        if not -n <= i < n:
            raise IndexError(f"sample {i} out of range for {n} samples")
        shard, offset, size, members, key = self._blocks().record(i % n)
        if shard >= len(self.shards):
            raise IndexFormatError(f"{self.path}: the record of sample {i % n} names shard {shard} of {len(self.shards)}; rebuild the index")
        exts = self.exts
        return shard, offset, size, [(exts[e], o, s) for e, o, s in members], key.decode("utf-8", "surrogateescape")

    def key(self, i: int) -> str:
        """Key of sample ``i``."""
        return self.record(i)[4]

    def lookup(self, key: str) -> int:
        """Sample number of ``key``; with duplicate keys, the first sample that has it.

        Reads one bucket of the key table and the records of the samples its entries
        point at, and returns a sample only if its key is ``key``.

        Raises:
            SampleNotFoundError: no sample has this key.
            IndexFormatError: the key table is damaged.
        """
        raw_key = key.encode("utf-8", "surrogateescape")
        n, h = self.n_samples, key_hash(raw_key)
        if n:
            bucket = bucket_of(h, self.meta["n_buckets"])
            entries = self._optional(numbered(KEYS_PREFIX, bucket), f"{self.path}: key table bucket {bucket}")
            if entries is not None:
                width = 2 + self.meta["sample_bytes"]
                if len(entries) % width:
                    raise IndexFormatError(f"{self.path}: key table bucket {bucket} is damaged ({len(entries)} bytes); rebuild the index")
                rows = np.frombuffer(entries, np.uint8).reshape(-1, width)
                fp = rows[:, 0].astype(np.uint32) | (rows[:, 1].astype(np.uint32) << 8)
                source = self._blocks()
                for r in np.flatnonzero(fp == (h & 0xFFFF)).tolist():
                    sample = int.from_bytes(rows[r, 2:].tobytes(), "little")
                    if sample >= n:
                        raise IndexFormatError(f"{self.path}: key table bucket {bucket} names sample {sample} of {n}; rebuild the index")
                    if source.record(sample)[4] == raw_key:
                        return sample
        raise SampleNotFoundError(f"{self.path}: no sample with key {key[:200]!r}")

    def shard_of(self, i: int) -> int:
        """Shard number of sample ``i``."""
        return self.record(i)[0]

    def members(self, i: int) -> list[tuple[str, int, int]]:
        """``(extension, offset relative to the sample, size)`` of each member of sample ``i``."""
        return self.record(i)[3]

    def decode(self, lo: int = 0, hi: int | None = None) -> Columns:
        """Samples ``lo..hi`` (default: all) as arrays (copies), every record checked.

        Raises:
            IndexFormatError: the records are damaged.
        """
        n = self.n_samples
        hi = n if hi is None else min(hi, n)
        if lo >= hi:
            return Columns.join([])
        source, per = self._blocks(), self.meta["block_samples"]
        parts = []
        for b in range(lo // per, (hi - 1) // per + 1):
            cols = source.block(b).columns(f"{self.path}: record block {b}")
            a = max(lo - b * per, 0)
            parts.append(cols.cut(a, min(hi - b * per, len(cols))))
        cols = Columns.join(parts)
        if len(cols) and int(cols.shard.max()) >= len(self.shards):
            raise IndexFormatError(f"{self.path}: a record names shard {int(cols.shard.max())} of {len(self.shards)}; rebuild the index")
        return cols

    def shard_columns(self, shard: int) -> Columns:
        """One shard's records as arrays (extension numbers into :attr:`exts`, keys as bytes), checked.

        Raises:
            IndexFormatError: the records of the shard are damaged or name another shard.
        """
        starts = self.checked_starts([shard])
        info = self.shards[shard]
        cols = self.decode(int(starts[shard]), int(starts[shard + 1]))
        if len(cols) and bool((cols.shard != shard).any()):
            raise IndexFormatError(f"{self.path}: a record of shard {shard} names another shard; rebuild the index")
        if len(cols) and stores_tar(info.compression) and bool((cols.size > info.size).any() or (cols.offset > info.size - cols.size).any()):
            raise IndexFormatError(f"{self.path}: a record of shard {shard} lies past its {info.size} bytes; rebuild the index")
        return cols

    def shard_table(self, shard: int) -> ShardTable:
        """Cut one shard's tables out of the index (for incremental builds and merges).

        Raises:
            IndexFormatError: the records of the shard are damaged or name another shard.
        """
        cols = self.shard_columns(shard)
        exts_used, local = np.unique(cols.member_ext, return_inverse=True)
        return ShardTable(
            cols.offset,
            cols.size,
            cols.nmembers.astype(np.uint32),
            local.astype(np.uint16).reshape(-1),
            cols.member_offset,
            cols.member_size,
            [k.decode("utf-8", "surrogateescape") for k in cols.keys],
            [self.exts[e] for e in exts_used.tolist()],
            self.frame_table(shard),
            self.gzip_points(shard),
        )

    def frame_table(self, shard: int) -> np.ndarray | None:
        """A zstd shard's ``(n_frames, 4)`` frame table (a copy); ``None`` for a plain tar.

        Raises:
            IndexFormatError: the table is damaged.
        """
        where = f"{self.path}: the frame table of shard {shard}"
        table = self._optional(numbered(FRAMES_PREFIX, shard), where)
        if table is None:
            return None
        if len(table) % 32:
            raise IndexFormatError(f"{where} is damaged ({len(table)} bytes, not rows of 32); rebuild the index")
        rows = np.frombuffer(table, "<u8").reshape(-1, 4).copy()
        wrong = _frames_wrong(rows, self.shards[shard])
        if wrong:
            raise IndexFormatError(f"{where} is damaged ({wrong}); rebuild the index")
        return rows

    def gzip_points(self, shard: int) -> bytes | None:
        """A gzip shard's encoded seek-point table (:mod:`tarindex.gzip_random`, a copy); ``None`` if it has none.

        Raises:
            IndexFormatError: the value is damaged.
        """
        points = self._optional(numbered(GZIP_PREFIX, shard), f"{self.path}: the gzip seek points of shard {shard}")
        return None if points is None else bytes(points)

    def file_size(self) -> int:
        """Size of the index file in bytes."""
        return self.path.stat().st_size


def _frames_wrong(rows: np.ndarray, info: ShardInfo) -> str:
    """What is wrong with a zstd shard's frame table against its record ('' when nothing): frames in order
    inside the shard's recorded size, decompressed offsets consecutive from 0, every frame within the
    random-access bound when the record says so. (The total's bound is checked where a whole shard is
    decompressed: the zstd row's reader, :mod:`tarindex.access.codecs`.)"""
    from ..zstd import RANDOM_ACCESS_FRAME_LIMIT  # (zstandard is imported where zstd shards are read)

    if not len(rows):
        return ""
    if int(rows.max()) >= 1 << 62:
        return f"a value of {int(rows.max())}"
    c_off, c_size, d_off, d_size = (rows[:, k].astype(np.int64) for k in range(4))
    if bool((c_size <= 0).any()) or bool((c_off[1:] < c_off[:-1] + c_size[:-1]).any()) or int(c_off[-1] + c_size[-1]) > info.size:
        return f"frames out of order or past the shard's {info.size} bytes"
    if int(d_off[0]) or bool((d_off[1:] != d_off[:-1] + d_size[:-1]).any()):
        return "decompressed offsets not consecutive"
    if info.random_access and int(d_size.max()) > RANDOM_ACCESS_FRAME_LIMIT:
        return f"a frame of {int(d_size.max())} bytes in a shard recorded as read at random (at most {RANDOM_ACCESS_FRAME_LIMIT})"
    return ""
