"""Caches own only what they made (tarindex._filecache), with the zstd decompressed-shard cache as the user."""

from __future__ import annotations

import multiprocessing
import os
import tarfile
from pathlib import Path

import pytest
from test_zstd import zstd_cli

import tarindex
from conftest import py_tar, tarfile_members
from tarindex._filecache import FileCache
from tarindex.errors import TarIndexError

ENTRY = r"[0-9a-f]{4}\.bin"


def test_eviction_is_least_recent_first_and_only_of_own_entries(tmp_path: Path) -> None:
    cache = FileCache(tmp_path, "t", ENTRY, 2000)
    (tmp_path / "user.bin").write_bytes(bytes(5000))
    (cache.dir / "user.tar").write_bytes(bytes(5000))  # a stranger inside the subdirectory: not ours either
    for k, name in enumerate(["000a.bin", "000b.bin", "000c.bin"]):
        os.close(cache.add(name, 1000, lambda f: f.write(bytes(1000))))
        os.utime(cache.dir / name, ns=(k, k))
    assert sorted(p.name for p in cache.dir.iterdir()) == [".lock", ".tarindex-cache", "000b.bin", "000c.bin", "user.tar"]
    assert (tmp_path / "user.bin").stat().st_size == 5000
    with pytest.raises(ValueError, match="not a t cache entry name"):
        cache.path("../000a.bin")


def test_foreign_subdirectory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "tarindex-t").mkdir()
    (tmp_path / "tarindex-t" / "mine.txt").write_text("user data")
    with pytest.raises(TarIndexError, match=r"tarindex-t: exists and is not a tarindex cache"):
        FileCache(tmp_path, "t", ENTRY, 2000)
    assert (tmp_path / "tarindex-t" / "mine.txt").read_text() == "user data"


def _add_slowly(root: str, name: str, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    cache = FileCache(root, "t", ENTRY, 10_000)
    calls = []

    def fill(f: object) -> None:
        calls.append(1)
        import time

        time.sleep(0.3)
        f.write(bytes(100))  # type: ignore[attr-defined]

    os.close(cache.add(name, 100, fill))
    out.put(len(calls))


def test_processes_fill_an_entry_once(tmp_path: Path) -> None:
    """The lock: two processes asking for one entry at once; one fills it, the other finds it."""
    ctx = multiprocessing.get_context("fork")
    out: multiprocessing.Queue = ctx.Queue()  # type: ignore[type-arg]
    procs = [ctx.Process(target=_add_slowly, args=(str(tmp_path), "00ff.bin", out)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    assert sorted(out.get(timeout=5) for _ in procs) == [0, 1]


def test_zstd_cache_keeps_user_tars(tmp_path: Path) -> None:
    """The issue's reproduction: the cache pointed at a data directory holding the user's shards."""
    data = tmp_path / "data"
    data.mkdir()
    specs = [(f"x{i:04d}.txt", f"sample {i} ".encode() * 2000) for i in range(1000)]
    tar = py_tar(data / "one.tar", specs, tarfile.GNU_FORMAT, dirs=False)  # 20 MB: one frame over the 16 MiB limit
    shard = zstd_cli(tar, data / "one.tar.zst", "-1")
    user = [py_tar(data / f"user-{k}.tar", specs[:3], tarfile.GNU_FORMAT, dirs=False) for k in range(3)]
    index = tarindex.build_index([shard]).path
    ds = tarindex.TarDataset(index, zstd_cache_dir=data, zstd_cache_bytes=64 << 20)
    oracle = dict(tarfile_members(tar))
    assert ds[7]["txt"] == oracle["x0007.txt"]
    # a second index's shard does not fit beside the first: the first copy is evicted, the user's tars stay
    other = zstd_cli(py_tar(tmp_path / "two.tar", specs[::-1], tarfile.GNU_FORMAT, dirs=False), tmp_path / "two.tar.zst", "-1")
    ds2 = tarindex.TarDataset(tarindex.build_index([other]).path, zstd_cache_dir=data, zstd_cache_bytes=30 << 20)
    assert ds2[0]["__key__"] == "x0999"
    assert [p.exists() for p in user] == [True, True, True] and tar.exists()
    assert len(list((data / "tarindex-zstd").glob("*.tar"))) == 1
