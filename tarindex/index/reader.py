"""Read an index: lazy per-process LMDB, zero-copy sample records, key lookup.

Importing this module, or opening an index, never imports torch.
"""

from __future__ import annotations

import json
import os
from functools import cached_property
from pathlib import Path
from typing import Any

import lmdb
import numpy as np

from ..errors import IndexFormatError, IndexNotFoundError, SampleNotFoundError
from .format import (
    COL_PREFIX,
    COLUMNS,
    FORMAT_VERSION,
    FRAMES_PREFIX,
    KEY_PREFIX,
    MAGIC,
    META_KEY,
    ShardInfo,
    ShardTable,
)
from .records import Decoded, decode, unpack

__all__ = ["IndexReader"]

_MV_FORMAT = {"<u8": "Q", "<u4": "I", "<u2": "H", "u1": "B"}


class _Env:
    """One LMDB environment and read transaction per index file per process.

    LMDB forbids opening one environment twice in a process, so readers of the
    same file share it (reference counted). Keyed by inode: a rebuilt index
    (a new file renamed over the old) gets a new environment.
    """

    def __init__(self, key: tuple[int, int], path: Path) -> None:
        try:
            self.env = lmdb.open(str(path), subdir=False, readonly=True, lock=False, max_dbs=0, readahead=False)
        except lmdb.Error as exc:
            raise IndexFormatError(f"{path}: not a tarindex index ({exc})") from exc
        self.key, self.refs = key, 0
        self.txn = self.env.begin(buffers=True)
        try:
            self.meta = _check_meta(path, self.txn.get(META_KEY))
        except IndexFormatError:
            self.close()
            raise

    def release(self) -> None:
        self.refs -= 1
        if self.refs <= 0:
            _ENVS.pop(self.key, None)
            self.close()

    def close(self) -> None:
        self.txn.abort()
        self.env.close()


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
    if found is None:
        found = _ENVS[key] = _Env(key, path)
    found.refs += 1
    return found


def _check_meta(path: Path, raw: Any) -> dict[str, Any]:
    try:
        meta = json.loads(bytes(raw)) if raw is not None else None
    except ValueError:
        meta = None
    if not isinstance(meta, dict) or meta.get("magic") != MAGIC:
        raise IndexFormatError(f"{path}: an LMDB file, but not a tarindex index")
    if meta.get("format_version") != FORMAT_VERSION:
        raise IndexFormatError(
            f"{path}: index format version {meta.get('format_version')}, "
            f"this tarindex reads version {FORMAT_VERSION}; rebuild the index"
        )
    return meta


class IndexReader:
    """A read-only view of one index file.

    The LMDB environment opens lazily in each process (after ``fork`` a child
    opens its own) and keeps one read transaction, so columns are memoryviews
    over LMDB's memory map: opening costs the same for any number of samples.
    Pickles by path.

    Raises:
        IndexNotFoundError: the file does not exist.
        IndexFormatError: the file is not a tarindex index or has another format version.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._pid = -1
        self._handle: _Env | None = None
        self._txn: Any = None
        self._cols: dict[str, memoryview] = {}
        self._open()

    # -- process-local state -------------------------------------------------
    def _open(self) -> None:
        self._release()
        if not self.path.is_file():
            raise IndexNotFoundError(f"{self.path}: no index here (build one with 'tarindex build')")
        handle = _acquire(self.path)
        meta = handle.meta
        self._handle, self._txn, self._pid = handle, handle.txn, os.getpid()
        self._cols = {}
        self.__dict__.setdefault("meta", meta)

    def _release(self) -> None:
        handle = self.__dict__.get("_handle")
        self._handle = None
        self._cols = {}
        self._txn = None
        if handle is not None and self._pid == os.getpid():
            handle.release()

    def _txn_here(self) -> Any:
        if self._pid != os.getpid():
            self._open()
        return self._txn

    def column(self, name: str) -> memoryview:
        """One column as a typed memoryview over the LMDB map (no copy)."""
        txn = self._txn_here()
        col = self._cols.get(name)
        if col is None:
            raw = txn.get(COL_PREFIX + name.encode())
            if raw is None:
                raise IndexFormatError(f"{self.path}: index has no column {name!r}")
            col = self._cols[name] = raw.cast(_MV_FORMAT[COLUMNS[name]])
        return col

    def array(self, name: str) -> np.ndarray:
        """One column as a read-only numpy array (no copy)."""
        return np.frombuffer(self.column(name), COLUMNS[name])

    def close(self) -> None:
        """Release the LMDB environment of this process (reopened on next use)."""
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

    @cached_property
    def shards(self) -> list[ShardInfo]:
        """Shard records, in index order."""
        return [ShardInfo.from_json(s) for s in self.meta["shards"]]

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
    def duplicate_keys(self) -> int:
        """Samples whose key already belongs to an earlier sample."""
        return int(self.meta["duplicate_keys"])

    def __len__(self) -> int:
        return self.n_samples

    def shard_path(self, shard: int) -> Path:
        """Absolute path of a shard."""
        return self.path.parent / self.shards[shard].path

    # -- samples -------------------------------------------------------------
    def record(self, i: int) -> tuple[int, int, int, list[tuple[str, int, int]], str]:
        """Sample ``i``'s record: ``(shard, offset, size, members, key)``.

        ``members`` is ``(extension, data offset relative to the sample, size)`` per member.
        """
        offset, size, shard, spans, key = unpack(self.column("records"), self.record_start(i), i)
        nm = len(spans) // 3
        exts = self.exts
        members = [(exts[spans[2 * nm + j]], spans[2 * j], spans[2 * j + 1]) for j in range(nm)]
        return shard, offset, size, members, key

    @property
    def record_stride(self) -> int:
        """Bytes from one sample record to the next, or 0 when ``col/record_offset`` says where each starts."""
        return int(self.meta["record_stride"])

    def record_start(self, i: int) -> int:
        """Byte offset of sample ``i``'s record in ``col/records``."""
        stride = self.record_stride
        return i * stride if stride else int(self.column("record_offset")[i])

    def key(self, i: int) -> str:
        """Key of sample ``i``."""
        return self.record(i)[4]

    def lookup(self, key: str) -> int:
        """Sample number of ``key``; with duplicate keys, the first sample that has it.

        Raises:
            SampleNotFoundError: no sample has this key.
        """
        raw = self._txn_here().get(KEY_PREFIX + key.encode("utf-8", "surrogateescape"))
        if raw is None:
            raise SampleNotFoundError(f"{self.path}: no sample with key {key!r}")
        return int.from_bytes(raw, "little")

    def shard_of(self, i: int) -> int:
        """Shard number of sample ``i``."""
        return self.record(i)[0]

    def members(self, i: int) -> list[tuple[str, int, int]]:
        """``(extension, offset relative to the sample, size)`` of each member of sample ``i``."""
        return self.record(i)[3]

    def decode(self, lo: int = 0, hi: int | None = None) -> Decoded:
        """Samples ``lo..hi`` (default: all) as arrays: shard, offset, size, members (copies).

        Raises:
            IndexFormatError: the records are damaged.
        """
        try:
            records, starts, stride = self.array("records"), self.array("record_offset"), self.record_stride
            return decode(records, starts, stride, lo, self.n_samples if hi is None else hi)
        except IndexFormatError as exc:
            raise IndexFormatError(f"{self.path}: {exc}") from exc

    def shard_table(self, shard: int) -> ShardTable:
        """Cut one shard's tables out of the index (for incremental builds and merges)."""
        starts = self.array("shard_start")
        dec = self.decode(int(starts[shard]), int(starts[shard + 1]))
        exts_used, local = np.unique(dec.member_ext, return_inverse=True)
        return ShardTable(
            dec.offset,
            dec.size,
            dec.nmembers,
            local.astype(np.uint16).reshape(-1),
            dec.member_offset,
            dec.member_size,
            dec.keys(self.array("records")),
            [self.exts[e] for e in exts_used.tolist()],
            self.frame_table(shard),
        )

    def frame_table(self, shard: int) -> np.ndarray | None:
        """A zstd shard's ``(n_frames, 4)`` frame table (a copy); ``None`` for a plain tar."""
        raw = self._txn_here().get(FRAMES_PREFIX + str(shard).encode())
        if raw is None:
            return None
        return np.frombuffer(raw, "<u8").reshape(-1, 4).copy()

    def file_size(self) -> int:
        """Size of the index file in bytes."""
        return self.path.stat().st_size
