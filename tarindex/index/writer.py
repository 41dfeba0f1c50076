"""Write an index: shards streamed into record blocks, keys spilled and bucketed, then one atomic rename.

Memory is bounded whatever the number of samples: records are encoded a block at a
time as shards arrive, key hashes and frame tables go to spill files beside the
index, and the key table is built one hash range at a time from them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import resource
import shutil
import stat
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO

import lmdb
import numpy as np

from .._atomic import alive, clean_stale, commit, temp_name, write_error
from .._codecs import GZIP, HEAD_BYTES, ZSTD, looks_like_index, looks_like_shard
from ..errors import IndexFormatError, OverwriteError, TarIndexError, WriteError
from ..tables import MAX_EXTS
from .format import (
    BLOCK_PREFIX,
    BLOCK_SAMPLES,
    CONTENT_SUMMARY,
    FORMAT_VERSION,
    FRAMES_PREFIX,
    GZIP_PREFIX,
    KEYS_PREFIX,
    LATER_CONTENT,
    MAGIC,
    META_KEY,
    SHARD_BLOCK,
    SHARD_SUMMARY,
    SHARDS_PREFIX,
    START_KEY,
    ShardInfo,
    ShardTable,
    bucket_keys,
    bucket_of,
    key_hash,
)
from .pages import IndexFile, numbered, seal
from .reader import IndexReader
from .records import Columns, encode_block, parse

__all__ = ["IndexWriter", "check_output", "remove_stale_temporaries"]

_PARTITIONS = 256  # key hashes spilled by their top 8 bits: one partition in memory at a time
_SPILL_ROWS = 1 << 20  # key entries (16 bytes each) held in memory before they go to the spill files (16 MB)
_SPILL_FRAMES = 64 << 20  # bytes of frame tables held in memory before they go to a spill file
_COMMIT_BYTES = 64 << 20  # a write transaction's dirty pages live in memory: commit every this many bytes
_MAP_FIRST = 256 << 20  # address space LMDB maps for the file at first; grown as the file fills it
_MAP_SLACK = 16 << 20  # room kept beside the values: pages a commit adds (free list, branches)
_MAP_MARGIN = 64 << 20  # address space left to the rest of the process when a limit (ulimit -v) bounds the map


def remove_stale_temporaries(path: Path) -> list[Path]:
    """Remove what writers of ``path`` killed before they finished left beside it (their process is gone):
    temporary files (:func:`tarindex._atomic.clean_stale`) and spill directories. Returns the paths removed.
    """
    removed = clean_stale(path)
    pattern = re.compile(rf"\.{re.escape(path.name)}\.tmp-(\d+)\.spill")
    with contextlib.suppress(OSError):
        for entry in path.parent.iterdir():
            found = pattern.fullmatch(entry.name)
            if found is not None and entry.is_dir() and not entry.is_symlink() and not alive(int(found.group(1))):
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry)
    return removed


def check_output(path: Path) -> None:
    """Refuse to write an index over a file that is not one: the one guard of every index write (``build``,
    ``merge``, :class:`IndexWriter`), made before the work and again before the rename.

    Replaced are: nothing (no file), an empty file, a tarindex index (any format version: an LMDB file whose
    meta says so), and an LMDB file that cannot be opened (a truncated or damaged index; rebuilding it is
    the fix). Anything else is refused: a shard named by mistake (``-o d/train-000002.tar``), a text file,
    another program's LMDB database, a directory, a FIFO.

    Raises:
        OverwriteError: naming the file, what it is, and what to do.
    """
    try:
        st = os.stat(path)
    except OSError:  # nothing there (or nothing to look at: the write names the problem)
        return
    if stat.S_ISREG(st.st_mode) and st.st_size == 0:
        return
    what = _not_an_index(path, st)
    if what is not None:
        raise OverwriteError(
            f"{path}: exists and is not a tarindex index ({what}); refusing to overwrite it: remove it first, or choose another index path"
        )


def _not_an_index(path: Path, st: os.stat_result) -> str | None:
    """What the file at ``path`` is when it is not a tarindex index that may be replaced, else ``None``."""
    if stat.S_ISDIR(st.st_mode):
        return "a directory"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    try:
        with open(path, "rb") as f:
            head = f.read(HEAD_BYTES)
    except OSError as exc:
        return f"unreadable: {exc.strerror or exc}"
    if not looks_like_index(head):
        return "a tar shard" if looks_like_shard(head) else f"a file of {st.st_size} bytes"
    try:  # the pages are read with pread (index/pages.py): no map, and no LMDB environment of this process's
        file = IndexFile(path)  # own in the way (one that reads this index while a build or merge replaces it)
        try:
            raw = file.get(META_KEY)
        finally:
            file.close()
    except (IndexFormatError, OSError):  # a truncated or damaged index: the write replaces it
        return None
    meta = bytes(raw) if raw is not None else b""
    found = None
    for body in (meta[4:], meta):  # JSON behind a 4-byte checksum (format 4 on: its first byte may be "{"), or bare
        try:
            found = json.loads(body)
            break
        except ValueError:
            continue
    if not isinstance(found, dict) or found.get("magic") != MAGIC:
        return "an LMDB database without a tarindex meta"
    return None


class IndexWriter:
    """Stream shard tables into one index file.

    A context manager: the index is written to a temporary name beside
    ``path`` and renamed over ``path`` (after ``fsync`` of the file and its
    directory) only on a clean exit, so an interrupted or failed write leaves any
    previous index untouched. Shards are encoded as they are added.

    Args:
        path: the index file.
        part: ``(K, N)`` when this index holds the K-th of N slices of a shard list
            (recorded, so merges order the parts by it).
        packed: the output pattern of the pack that writes the index and its shards (recorded: a later pack of
            the same pattern may write over them, :func:`tarindex.pack`).
    """

    def __init__(self, path: str | os.PathLike[str], *, part: tuple[int, int] | None = None, packed: str | None = None) -> None:
        self.path = Path(path)
        self.part = part
        self.packed = packed
        self._infos: list[ShardInfo] = []
        self._starts: list[int] = [0]
        self._exts: dict[str, int] = {}
        self._n_members = 0
        self._summary = dict.fromkeys(SHARD_SUMMARY, 0)  # what a reader needs at open without the shard records
        self._content = dict.fromkeys((*CONTENT_SUMMARY, *LATER_CONTENT), 0)  # what `tarindex info` shows without decoding records
        self._ext_members: list[int] = []  # members per extension number
        self._pending: list[Columns] = []
        self._pending_n = 0
        self._n_blocks = 0
        self._env: Any = None
        self._txn: Any = None
        self._txn_bytes = 0
        self._map_size = 0  # address space mapped for the file now
        self._psize = 4096
        self._used = 0  # bytes of the file up to its last committed page
        self._txn_need = 0  # at most this many bytes of pages the current transaction adds
        self._tmp = temp_name(self.path)
        self._spill = self._tmp.with_name(self._tmp.name + ".spill")
        self._parts: list[BinaryIO] = []  # spill files of key entries by partition, once memory holds too many
        self._rows: list[np.ndarray] = []  # key entries (hash, sample) held in memory
        self._n_rows = 0
        # Per-shard tables (zstd frame tables, gzip seek points), written after the records:
        self._frames: BinaryIO | None = None  # spill file of them, once memory holds too many
        self._frame_list: list[tuple[bytes, bytes]] = []  # key, table bytes held in memory
        self._frame_bytes = 0
        self._frame_at: list[tuple[bytes, int, int]] = []  # key, offset in the spill file, bytes

    # -- life cycle ------------------------------------------------------------
    def __enter__(self) -> IndexWriter:
        self._start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc_type is None:
            self.write()
        else:
            self._discard()

    def _start(self) -> None:
        if self._env is not None:
            return
        check_output(self.path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            remove_stale_temporaries(self.path)
            self._map_size = self._map_for(_MAP_FIRST, 2 * _MAP_SLACK)
            self._env = lmdb.open(str(self._tmp), subdir=False, lock=False, map_size=self._map_size, max_dbs=0, sync=False, metasync=False)
            self._psize = self._env.stat()["psize"]
            self._txn = self._env.begin(write=True)
        except TarIndexError:  # the address-space limit, said by _map_for
            self._discard()
            raise
        except (OSError, lmdb.Error) as exc:
            self._discard()
            raise _write_error(self.path, exc) from exc

    def _discard(self) -> None:
        """Drop everything written so far (the previous index, if any, stays)."""
        for f in [*self._parts, *([self._frames] if self._frames else [])]:
            f.close()
        self._parts, self._frames = [], None
        with contextlib.suppress(lmdb.Error):  # an environment a failed set_mapsize left closed
            if self._txn is not None:
                self._txn.abort()
            if self._env is not None:
                self._env.close()
        self._txn = self._env = None
        if self._spill.exists():
            shutil.rmtree(self._spill, ignore_errors=True)
        for leftover in (self._tmp, Path(str(self._tmp) + "-lock")):
            with contextlib.suppress(OSError):  # absent, or a read-only directory that holds none
                leftover.unlink()

    # -- adding shards ---------------------------------------------------------
    def add(self, info: ShardInfo, table: ShardTable) -> None:
        """Append one shard (in index order); its records are encoded as blocks fill.

        Raises:
            IndexFormatError: a sample has too many members or too long a key.
            WriteError: the index cannot be written (full disk, permissions).
        """
        cols = Columns(
            np.zeros(0, np.uint64),  # the shard number is set by add_columns
            np.asarray(table.sample_offset, np.uint64),
            np.asarray(table.sample_size, np.uint64),
            np.asarray(table.sample_nmembers, np.int64),
            np.asarray(table.member_ext, np.uint16),
            np.asarray(table.member_offset, np.uint64),
            np.asarray(table.member_size, np.uint64),
            [k.encode("utf-8", "surrogateescape") for k in table.keys],
        )
        self.add_columns(info, cols, table.exts, table.frames, table.gzip_points)

    def add_columns(
        self, info: ShardInfo, cols: Columns, exts: list[str], frames: np.ndarray | None = None, gzip_points: bytes | None = None
    ) -> None:
        """Append one shard given as columns (``cols.member_ext`` numbers into ``exts``; ``cols.shard`` is ignored).

        What :meth:`add` does after encoding the keys; merges hand over decoded records this way.

        Raises:
            IndexFormatError: a sample has too many members or too long a key.
            WriteError: the index cannot be written (full disk, permissions).
        """
        self._start()
        shard, n, first = len(self._infos), len(cols), self._starts[-1]
        self._infos.append(info)
        self._starts.append(first + n)
        self._n_members += len(cols.member_ext)
        self._summary["url_shards"] += info.kind == "url"
        self._summary["command_shards"] += info.kind == "command"
        if info.compression == ZSTD.compression and frames is not None and len(frames) and n:  # samples per frame: of shards with samples
            self._summary["zstd_samples"] += n
            self._summary["zstd_frames"] += len(frames)
        remap = [self._exts.setdefault(e, len(self._exts)) for e in exts] or [0]
        if len(self._exts) > MAX_EXTS:  # numbered in 16 bits
            raise IndexFormatError(
                f"{info.path}: the index would hold {len(self._exts):,} distinct extensions with this shard; an index holds at most {MAX_EXTS:,}"
            )
        self._spill_keys(cols.keys, first)
        if frames is not None:
            self._add_frames(numbered(FRAMES_PREFIX, shard), np.ascontiguousarray(frames, "<u8").tobytes())
        if gzip_points is not None:
            self._add_frames(numbered(GZIP_PREFIX, shard), gzip_points)
        member_ext = np.array(remap, np.uint16)[cols.member_ext.astype(np.int64)] if len(cols.member_ext) else np.zeros(0, np.uint16)
        self._count(info, cols, member_ext)
        self._pending.append(dataclasses.replace(cols, shard=np.full(n, shard, np.uint64), member_ext=member_ext))
        self._pending_n += n
        if self._pending_n >= BLOCK_SAMPLES:
            self._flush(final=False)

    def _add_frames(self, key: bytes, raw: bytes) -> None:
        self._frame_list.append((key, raw))
        self._frame_bytes += len(raw)
        if self._frame_bytes < _SPILL_FRAMES:
            return
        if self._frames is None:
            self._spill.mkdir(exist_ok=True)
            self._frames = open(self._spill / "frames", "w+b")  # noqa: SIM115 - closed in _discard
        for s, data in self._frame_list:
            self._frame_at.append((s, self._frames.seek(0, os.SEEK_END), len(data)))
            self._frames.write(data)
        self._frame_list, self._frame_bytes = [], 0

    def _frame_tables(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """The per-shard tables under ``prefix``, in shard order (spilled ones first: they were added first)."""
        for key, at, size in self._frame_at:
            if self._frames is not None and key.startswith(prefix):
                self._frames.seek(at)
                yield key, self._frames.read(size)
        yield from ((key, raw) for key, raw in self._frame_list if key.startswith(prefix))

    def _spill_keys(self, keys: list[bytes], first: int) -> None:
        if not keys:
            return
        rows = np.empty((len(keys), 2), "<u8")
        rows[:, 0] = np.fromiter(map(key_hash, keys), np.uint64, count=len(keys))
        rows[:, 1] = np.arange(first, first + len(keys), dtype=np.uint64)
        self._rows.append(rows)
        self._n_rows += len(rows)
        if self._n_rows < _SPILL_ROWS:
            return
        if not self._parts:
            self._spill.mkdir(exist_ok=True)
            self._parts = [open(self._spill / f"keys-{p:03d}", "w+b") for p in range(_PARTITIONS)]  # noqa: SIM115 - closed in _discard
        for p, part in enumerate(self._partitioned()):
            self._parts[p].write(part.tobytes())
        self._rows, self._n_rows = [], 0

    def _partitioned(self) -> list[np.ndarray]:
        """The key entries held in memory, split by partition (the top 8 bits of the hash)."""
        rows = np.concatenate(self._rows) if self._rows else np.zeros((0, 2), "<u8")
        part = (rows[:, 0] >> np.uint64(56)).astype(np.int64)
        order = np.argsort(part, kind="stable")
        rows, part = rows[order], part[order]
        bounds = np.searchsorted(part, np.arange(_PARTITIONS + 1)).tolist()
        return [rows[bounds[p] : bounds[p + 1]] for p in range(_PARTITIONS)]

    def _flush(self, final: bool) -> None:
        cols = Columns.join(self._pending)
        done = 0
        while len(cols) - done >= BLOCK_SAMPLES or (final and done < len(cols)):
            block = cols.cut(done, min(done + BLOCK_SAMPLES, len(cols)))
            self._put_sealed(numbered(BLOCK_PREFIX, self._n_blocks), encode_block(block))
            self._n_blocks += 1
            done += len(block)
        rest = cols.cut(done, len(cols)) if done < len(cols) else None
        self._pending = [rest] if rest is not None else []
        self._pending_n = len(rest) if rest is not None else 0

    def _put_sealed(self, key: bytes, payload: bytes) -> None:
        self._put(key, seal(key, payload))

    def _put(self, key: bytes, value: bytes) -> None:
        try:
            need = len(key) + len(value) + self._psize + 32  # a value's pages, rounded up, and its node
            if self._used + self._txn_need + need + _MAP_SLACK > self._map_size:
                self._grow(need)
            if not self._txn.put(key, value, append=True):
                raise TarIndexError(f"{self.path}: key {key[:20]!r} written twice")
            self._txn_need += need
            self._txn_bytes += len(value) + len(key)
            if self._txn_bytes >= _COMMIT_BYTES:
                self._commit()
        except TarIndexError:
            raise
        except (OSError, lmdb.Error) as exc:  # a full disk, a read-only directory: one line naming the index
            raise _write_error(self.path, exc) from exc

    def _commit(self, *, again: bool = True) -> None:
        """Commit the write transaction and (``again``) begin the next one."""
        self._txn.commit()
        self._txn = None
        self._used = (self._env.info()["last_pgno"] + 1) * self._psize
        self._txn_bytes = self._txn_need = 0
        if again:
            self._txn = self._env.begin(write=True)

    def _grow(self, need: int) -> None:
        """Map more of the file before a value that might not fit (LMDB fails a write past its map): the map
        is sized from the work, not reserved whole (a reserve of 1 TiB fails under any ``ulimit -v``)."""
        self._commit(again=False)
        least = -(-(self._used + need + _MAP_SLACK) >> 16) << 16
        size = self._map_for(max(2 * self._map_size, self._used + 2 * (need + _COMMIT_BYTES) + _MAP_SLACK), least)
        self._env.set_mapsize(size)
        self._map_size = size
        self._txn = self._env.begin(write=True)

    def _map_for(self, wanted: int, least: int) -> int:
        """``wanted`` bytes of map, or less down to ``least`` where an address-space limit leaves less room.

        Raises:
            WriteError: the limit leaves less than ``least`` (the message names it and what is needed).
        """
        wanted = -(-wanted >> 16) << 16  # whole pages of any page size
        room = _address_room()
        if room is None:
            return wanted
        room += self._map_size - _MAP_MARGIN  # the map being replaced is released first
        if room < least:
            raise _limit_error(self.path, room, least)
        return min(wanted, room) >> 16 << 16  # whole pages of any page size

    # -- finishing ---------------------------------------------------------------
    def write(self) -> Path:
        """Finish the index and rename it over ``path``; returns the path.

        Raises:
            WriteError: the index cannot be written (full disk, permissions); the previous one stays.
        """
        self._start()
        try:
            self._finish()
            self._env.sync(True)
            self._env.close()
            self._env = None
            _fsync(self._tmp)
            self._check_written()
            check_output(self.path)  # still nothing but an index to replace
            commit(self._tmp, self.path)
        except TarIndexError:
            raise
        except (OSError, lmdb.Error) as exc:  # a full disk, a read-only directory: one line naming the index
            raise _write_error(self.path, exc) from exc
        finally:
            self._discard()
        return self.path

    def _check_written(self) -> None:
        """Open the finished file as a reader does (container, sealed meta and its schema) and compare its counts,
        shard start table and last block of shard records with what was written, before it replaces anything.

        Raises:
            IndexFormatError: the new index does not open or differs (the previous index stays).
        """
        try:
            reader = IndexReader(self._tmp)
            try:
                n = self._starts[-1]
                written = (n, len(self._infos), self._n_members, tuple(self.part) if self.part else None)
                if (reader.n_samples, len(reader.shards), reader.n_members, reader.part) != written:
                    raise IndexFormatError("its counts differ from those written")
                if reader.shard_starts().tolist() != self._starts:
                    raise IndexFormatError("its shard start table differs from the one written")
                if self._infos:  # the shard records, to the last block
                    reader.shards[len(self._infos) - 1]
            finally:
                reader.close()
        except (IndexFormatError, lmdb.Error, OSError) as exc:
            raise IndexFormatError(f"{self.path}: the new index fails its check ({exc}); the previous index is unchanged") from exc

    def _count(self, info: ShardInfo, cols: Columns, member_ext: np.ndarray) -> None:
        """Add one shard to the content totals (``CONTENT_SUMMARY``, ``LATER_CONTENT``, members per extension)."""
        self._content["data_bytes"] += int(cols.size.sum(dtype=np.uint64))
        self._content["shard_bytes"] += info.size
        self._content["zstd_shards"] += info.compression == ZSTD.compression
        self._content["gzip_shards"] += info.compression == GZIP.compression
        self._content["zstd_shards_without_random_access"] += not info.random_access
        counts = np.bincount(member_ext, minlength=len(self._exts)).tolist()
        self._ext_members += [0] * (len(counts) - len(self._ext_members))
        for e, k in enumerate(counts):
            self._ext_members[e] += k

    def _finish(self) -> None:
        if self._pending_n:
            self._flush(final=True)
        n = self._starts[-1]
        self._put_sealed(START_KEY, np.array(self._starts, "<u8").tobytes())
        for prefix in (FRAMES_PREFIX, GZIP_PREFIX):  # the order of the keys (LMDB appends)
            for key, raw in self._frame_tables(prefix):
                self._put_sealed(key, raw)
        sample_bytes = max(1, (max(n - 1, 0).bit_length() + 7) // 8)
        n_buckets = -(-n // bucket_keys(sample_bytes))
        self._commit()  # the records are readable from here on (duplicate keys are compared by their bytes)
        duplicates = self._key_table(n, n_buckets, sample_bytes)
        meta = {
            "magic": MAGIC,
            "format_version": FORMAT_VERSION,
            "build_id": uuid.uuid4().hex,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "part": list(self.part) if self.part else None,
            **({"packed": self.packed} if self.packed is not None else {}),
            "exts": list(self._exts),
            "n_samples": n,
            "n_members": self._n_members,
            "n_shards": len(self._infos),
            "duplicate_keys": duplicates,
            "block_samples": BLOCK_SAMPLES,
            "n_blocks": self._n_blocks,
            "n_buckets": n_buckets,
            "sample_bytes": sample_bytes,
            "shard_block": SHARD_BLOCK,
            **self._summary,
            **self._content,
            "ext_members": self._ext_members + [0] * (len(self._exts) - len(self._ext_members)),
        }
        self._put_sealed(META_KEY, json.dumps(meta, separators=(",", ":")).encode())
        for b in range(0, len(self._infos), SHARD_BLOCK):
            infos = [info.to_json() for info in self._infos[b : b + SHARD_BLOCK]]
            self._put_sealed(numbered(SHARDS_PREFIX, b // SHARD_BLOCK), json.dumps(infos, separators=(",", ":")).encode())
        self._txn.commit()
        self._txn = None

    def _key_table(self, n: int, n_buckets: int, sample_bytes: int) -> int:
        """Write the key buckets from the spilled hashes, partition by partition; returns the duplicate count.

        Within a bucket entries are ``(u16 hash bits, sample)`` in sample order, so a
        lookup meets the first sample with a key first; a later sample with the same key
        gets no entry.
        """
        keys = _KeyBytes(self._env, n)
        duplicates = 0
        carry = np.zeros((0, 2), "<u8")
        for rows, limit in self._key_runs(n_buckets):
            rows = np.concatenate([carry, rows])
            h, sample = rows[:, 0], rows[:, 1]
            bucket = ((h >> np.uint64(32)) * np.uint64(n_buckets)) >> np.uint64(32)
            order = np.lexsort((sample, h, bucket))
            rows, bucket = rows[order], bucket[order]
            done = int(np.searchsorted(bucket, limit))
            carry = rows[done:]
            keep = np.ones(done, bool)
            same = np.flatnonzero(rows[1:done, 0] == rows[: done - 1, 0]) + 1 if done > 1 else np.zeros(0, np.int64)
            for r in same.tolist():  # equal hashes: equal keys, or (rarely) a collision kept apart
                earlier = r - 1
                while earlier >= 0 and rows[earlier, 0] == rows[r, 0]:
                    if keep[earlier] and keys.of(int(rows[earlier, 1])) == keys.of(int(rows[r, 1])):
                        keep[r] = False
                        duplicates += 1
                        break
                    earlier -= 1
            rows, bucket = rows[:done][keep], bucket[:done][keep]
            order = np.lexsort((rows[:, 1], bucket))
            rows, bucket = rows[order], bucket[order]
            entries = np.empty((len(rows), 2 + sample_bytes), np.uint8)
            entries[:, :2] = (rows[:, 0] & np.uint64(0xFFFF)).astype("<u2").view(np.uint8).reshape(-1, 2)
            entries[:, 2:] = rows[:, 1].astype("<u8").view(np.uint8).reshape(-1, 8)[:, :sample_bytes]
            starts = np.flatnonzero(np.r_[True, bucket[1:] != bucket[:-1]]) if len(bucket) else np.zeros(0, np.int64)
            ends = np.r_[starts[1:], len(bucket)]
            for a, b in zip(starts.tolist(), ends.tolist()):
                self._put_sealed(numbered(KEYS_PREFIX, int(bucket[a])), entries[a:b].tobytes())
        return duplicates


    def _key_runs(self, n_buckets: int) -> Iterator[tuple[np.ndarray, int]]:
        """Key entries in runs of ascending hash ranges, with the first bucket past each run."""
        if not self._parts:  # nothing spilled: one run
            yield (np.concatenate(self._rows) if self._rows else np.zeros((0, 2), "<u8")), n_buckets
            return
        in_memory = self._partitioned()
        self._rows = []
        for p in range(_PARTITIONS):
            self._parts[p].seek(0)
            spilled = np.frombuffer(self._parts[p].read(), "<u8").reshape(-1, 2)
            limit = bucket_of((p + 1) << 56, n_buckets) if p + 1 < _PARTITIONS else n_buckets
            yield np.concatenate([spilled, in_memory[p]]), limit


class _KeyBytes:
    """Keys of samples already written, read back from the committed record blocks."""

    def __init__(self, env: Any, n: int) -> None:
        self._env, self._n = env, n
        self._block: tuple[int, Any] | None = None

    def of(self, sample: int) -> bytes:
        b, j = divmod(sample, BLOCK_SAMPLES)
        if self._block is None or self._block[0] != b:
            with self._env.begin() as txn:
                raw = bytes(txn.get(numbered(BLOCK_PREFIX, b)))
            n_exts = 1 << 16
            self._block = (b, parse(memoryview(raw)[4:], n_exts, min(BLOCK_SAMPLES, self._n - b * BLOCK_SAMPLES), "new block"))
        return bytes(self._block[1].record(j, "new block")[4])


def _write_error(path: Path, exc: BaseException) -> WriteError:
    """:func:`tarindex._atomic.write_error`, naming the address-space limit when LMDB could not map the file."""
    if isinstance(exc, lmdb.MemoryError) and _address_room() is not None:
        return _limit_error(path, _address_room() or 0, 0)
    return write_error(path, exc)


def _limit_error(path: Path, room: int, least: int) -> WriteError:
    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    needs = f", which needs {-(-least >> 20)} MiB; raise it to at least {-(-(soft + least - room) >> 20)} MiB" if least else "; raise it"
    return WriteError(
        str(path), f"the address-space limit (ulimit -v: {soft >> 20} MiB) leaves {max(room, 0) >> 20} MiB to map the index being written{needs}"
    )


def _address_room() -> int | None:
    """Address space this process may still map under its limit (``RLIMIT_AS``), or ``None`` without one."""
    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        with open("/proc/self/statm") as f:
            mapped = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):  # no /proc: assume the limit is all there is
        mapped = 0
    return soft - mapped


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
