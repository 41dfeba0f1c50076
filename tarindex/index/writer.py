"""Write an index: every column at once into a temporary LMDB file, then rename."""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from types import TracebackType

import lmdb
import numpy as np

from .._atomic import clean_stale, commit, temp_name, write_error
from .format import (
    COL_PREFIX,
    FORMAT_VERSION,
    FRAMES_PREFIX,
    KEY_PREFIX,
    MAGIC,
    META_KEY,
    ShardInfo,
    ShardTable,
)
from .records import encode

__all__ = ["IndexWriter"]


class IndexWriter:
    """Collect shard tables and write them as one index file.

    A context manager: the index is written to a temporary name beside
    ``path`` and renamed over ``path`` only on a clean exit, so an interrupted
    or failed write leaves any previous index untouched.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._shards: list[tuple[ShardInfo, ShardTable]] = []

    def add(self, info: ShardInfo, table: ShardTable) -> None:
        """Append one shard (in index order)."""
        self._shards.append((info, table))

    def __enter__(self) -> IndexWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.write()

    def _columns(self) -> tuple[dict[str, np.ndarray], list[str], list[bytes], int, int]:
        """The columns, the extension table, every sample's encoded key, the member count and the record stride."""
        exts: dict[str, int] = {}
        tables = [table for _, table in self._shards]
        counts = np.zeros(len(tables) + 1, np.uint64)
        np.cumsum([t.n_samples for t in tables], out=counts[1:])

        def joined(name: str, dtype: str) -> np.ndarray:
            parts = [getattr(t, name) for t in tables]
            return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)

        remapped = [
            np.array([exts.setdefault(e, len(exts)) for e in t.exts] or [0], np.uint16)[t.member_ext] for t in tables
        ]
        encoded = [key.encode("utf-8", "surrogateescape") for t in tables for key in t.keys]
        record_offset, records, stride = encode(
            np.repeat(np.arange(len(tables), dtype=np.uint32), [t.n_samples for t in tables]),
            joined("sample_offset", "<u8"),
            joined("sample_size", "<u8"),
            joined("sample_nmembers", "<u4"),
            np.concatenate(remapped) if remapped else np.zeros(0, np.uint16),
            joined("member_offset", "<u8"),
            joined("member_size", "<u8"),
            encoded,
        )
        cols = {"shard_start": counts, "record_offset": record_offset, "records": records}
        return cols, list(exts), encoded, sum(t.n_members for t in tables), stride

    def _meta(self, exts: list[str], n_samples: int, n_members: int, duplicates: int, stride: int) -> bytes:
        meta = {
            "magic": MAGIC,
            "format_version": FORMAT_VERSION,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "exts": exts,
            "n_samples": n_samples,
            "n_members": n_members,
            "duplicate_keys": duplicates,
            "record_stride": stride,
            "shards": [info.to_json() for info, _ in self._shards],
        }
        return json.dumps(meta, separators=(",", ":")).encode()

    def write(self) -> Path:
        """Write the index atomically and return its path."""
        cols, exts, encoded, n_members, stride = self._columns()
        n_samples = len(encoded)
        keys = self._key_entries(encoded)
        data_bytes = sum(c.nbytes for c in cols.values()) + sum(len(k) + 16 for k, _ in keys)
        data_bytes += sum(t.frames.nbytes + 64 for _, t in self._shards if t.frames is not None)
        tmp = temp_name(self.path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            clean_stale(self.path)
            env = lmdb.open(
                str(tmp),
                subdir=False,
                lock=False,
                map_size=max(2 * data_bytes + (64 << 20), 1 << 26),
                max_dbs=0,
                sync=True,
            )
            try:
                with env.begin(write=True) as txn:
                    for name, arr in cols.items():
                        txn.put(COL_PREFIX + name.encode(), arr.tobytes())
                    for shard, (_, table) in enumerate(self._shards):  # "frames/..." sorts before "key/..."
                        if table.frames is not None:
                            txn.put(FRAMES_PREFIX + str(shard).encode(), table.frames.astype("<u8").tobytes())
                    with txn.cursor() as cur:  # "key/..." sorts after every "col/..." key
                        _, added = cur.putmulti(keys, dupdata=False, overwrite=False, append=True)
                    if added != len(keys):
                        raise RuntimeError(f"{self.path}: wrote {added} of {len(keys)} key entries")
                    duplicates = n_samples - len(keys)
                    txn.put(META_KEY, self._meta(exts, n_samples, n_members, duplicates, stride))
            finally:
                env.close()
            commit(tmp, self.path)  # LMDB synced the file at commit (sync=True): rename, then sync the directory
        except (lmdb.Error, OSError) as exc:  # a full disk, a read-only directory: one line naming the index
            raise write_error(self.path, exc) from exc
        finally:
            for leftover in (tmp, Path(str(tmp) + "-lock")):
                with contextlib.suppress(OSError):  # absent, or a read-only directory that holds none
                    leftover.unlink()
        return self.path

    @staticmethod
    def _key_entries(encoded: list[bytes]) -> list[tuple[bytes, bytes]]:
        """Sorted, de-duplicated ``key/<key> -> sample`` entries; the first sample wins."""
        first = dict(zip(reversed(encoded), range(len(encoded) - 1, -1, -1)))  # earlier samples assigned last
        return [(KEY_PREFIX + k, v.to_bytes(8, "little")) for k, v in sorted(first.items())]
