"""Local shards on storage with latency read in blocks (``tarindex._localreads``): ``TarStream`` and ``build``
over a FUSE mount read 1 MiB blocks several at a time, and give exactly what tarfile extracts.

Where the storage is comes from the mount table: the latency mount (``tests/_latencyfs.py``) is slow
storage, the test's own directory is not. Through the mount, with and without its page cache and with the
cache dropped before each pass, ``TarStream`` and ``build_index`` give the samples and the index that the
local files give, in C and in Python, with reads in flight together; a shard cut short fails as it fails on
the local disk, naming the shard and offset.
"""

from __future__ import annotations

import os
import random
import re
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest
from _latencyfs import LatencyMount, drop_cache

import tarindex
from conftest import py_tar, tarfile_members
from tarindex._localreads import block_chunks, fs_type, slow_storage
from tarindex.errors import CorruptArchiveError

Mount = Callable[..., LatencyMount]


def _shard(root: Path, name: str = "a.tar", n: int = 300) -> Path:
    """Samples from empty members to 300 KiB ones, over several 1 MiB blocks."""
    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(3)
    specs = []
    for i in range(n):
        specs += [(f"k{i:04d}.txt", f"sample {i}".encode()), (f"k{i:04d}.bin", os.urandom(rng.choice([0, 100, 5000, 300 << 10])))]
    return py_tar(root / name, specs, tarfile.PAX_FORMAT, dirs=False)


def _samples_as_members(samples: list[dict[str, object]]) -> list[tuple[str, bytes]]:
    """The samples' members as ``(name, bytes)``, in the order tarfile lists them (``.txt`` before ``.bin``)."""
    out = []
    for s in samples:
        for ext in ("txt", "bin"):
            data = s[ext]
            assert isinstance(data, bytes)
            out.append((f"{s['__key__']}.{ext}", data))
        assert set(s) == {"__key__", "__url__", "__index__", "txt", "bin"} - ({"__index__"} if "__index__" not in s else set())
    return out


def test_the_mount_is_slow_storage_and_the_local_disk_is_not(tmp_path: Path, latency_mount: Mount) -> None:
    local = _shard(tmp_path / "src", n=3)
    mnt = latency_mount(tmp_path / "src")
    fd, mfd = os.open(local, os.O_RDONLY), os.open(mnt.path(local), os.O_RDONLY)
    try:
        assert fs_type(os.fstat(mfd).st_dev) == "fuse.latencyfs"
        assert slow_storage(mfd)
        assert not slow_storage(fd)
    finally:
        os.close(fd)
        os.close(mfd)


@pytest.mark.parametrize("size", [0, 1, (1 << 20) - 1, 1 << 20, 3 * (1 << 20) + 17])
def test_block_chunks_are_the_file(tmp_path: Path, size: int) -> None:
    data = os.urandom(size)
    path = tmp_path / "f"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = list(block_chunks(fd, size, block=1 << 20, ahead=3))
        assert b"".join(chunks) == data
        assert all(len(c) == 1 << 20 for c in chunks[:-1])
        assert b"".join(block_chunks(fd, size + 5000, block=4096)) == data  # the file ends before the size given
        early = block_chunks(fd, size, block=4096, ahead=8)
        first = next(early, b"")
        early.close()  # the reads in flight are waited for before the caller closes the file
        assert first == data[:4096]
    finally:
        os.close(fd)


@pytest.mark.parametrize("direct_io", [False, True], ids=["page-cache", "direct-io"])
def test_stream_through_the_mount_is_tarfile_with_blocks_in_flight(impl: str, tmp_path: Path, latency_mount: Mount, direct_io: bool) -> None:
    local = _shard(tmp_path / "src")
    want = tarfile_members(local)
    mnt = latency_mount(tmp_path / "src", delay=0.002, direct_io=direct_io)
    shard = str(mnt.path(local))
    for _ in range(2):
        drop_cache([shard])
        mnt.reset_stats()
        got = list(tarindex.TarStream([shard]))
        assert _samples_as_members(got) == want
        assert {s["__url__"] for s in got} == {shard}
        stats = mnt.stats()
        assert stats.peak_in_flight > 1, stats  # blocks read together, not one read after the other
        if direct_io:
            assert stats.max_read > 512 << 10, stats  # 1 MiB blocks (the kernel's largest request is a few pages less)


def test_build_through_the_mount_is_the_local_index(impl: str, tmp_path: Path, latency_mount: Mount) -> None:
    locals_ = [_shard(tmp_path / "src", f"s{k}.tar", n=120) for k in range(2)]
    want = [m for p in locals_ for m in tarfile_members(p)]
    mnt = latency_mount(tmp_path / "src", delay=0.002, direct_io=True)
    shards = mnt.paths(locals_)
    drop_cache(shards)
    mnt.reset_stats()
    index = tarindex.build_index(shards, index=tmp_path / "m.tarindex", workers=1).path
    assert mnt.stats().peak_in_flight > 1
    ds = tarindex.TarDataset(index)
    got = [ds[i] for i in range(len(ds))]
    assert _samples_as_members(got) == want
    local_ds = tarindex.TarDataset(tarindex.build_index(locals_, index=tmp_path / "l.tarindex", workers=1).path)
    assert [(s["__key__"], s["__index__"]) for s in got] == [(local_ds[i]["__key__"], i) for i in range(len(local_ds))]


def test_a_shard_cut_short_fails_through_the_mount_as_on_the_disk(impl: str, tmp_path: Path, latency_mount: Mount) -> None:
    local = _shard(tmp_path / "src", n=40)
    os.truncate(local, os.path.getsize(local) // 2 + 100)
    mnt = latency_mount(tmp_path / "src", delay=0.001)
    shard = str(mnt.path(local))
    errors = []
    for path in (str(local), shard):
        with pytest.raises(CorruptArchiveError) as info:
            list(tarindex.TarStream([path]))
        errors.append(str(info.value))
    assert errors[1].startswith(shard)
    assert re.sub(r"^\S+", "", errors[0]) == re.sub(r"^\S+", "", errors[1])  # the same offset and words
    with pytest.raises(CorruptArchiveError, match=re.escape(shard)):
        tarindex.build_index([shard], index=tmp_path / "m.tarindex", workers=1)
