"""The storage-latency harness (tests/_latencyfs.py), and today's read paths through it.

The harness: bytes through the mount are the bytes on disk; every read that reaches the FUSE process waits
the delay; reads from many threads overlap; the cold-cache helpers drop pages and count them as ``fincore``
does. Then ``build_index``, ``TarDataset[i]``, ``__getitems__`` and ``TarStream`` over shards on a 1 ms
mount give exactly what they give on the disk, in C and in Python, with and without the kernel's page
cache: the cases a read path made for slow storage must keep.
"""

from __future__ import annotations

import errno
import os
import random
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from _latencyfs import LatencyMount, drop_cache, mount, mount_type, readahead, resident_pages

import tarindex
from conftest import file_specs, gnu_tar, make_shard_set, tarfile_members, wds_write, write_tree
from tarindex.errors import ShardNotFoundError

Mount = Callable[..., LatencyMount]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="FUSE through /dev/fuse: Linux")
def test_fuse_is_here() -> None:
    """On Linux (here, CI) the harness has what it needs, so its fixture can never skip unnoticed."""
    assert os.path.exists("/dev/fuse"), "/dev/fuse is missing: the latency tests would skip"
    assert shutil.which("fusermount3"), "fusermount3 is missing (Debian's fuse3 package; .ci/run installs it)"
    import mfusepy  # libfuse 3 loaded through ctypes

    assert mfusepy.fuse_version_major == 3


def _source(tmp_path: Path, data: bytes, name: str = "data") -> Path:
    """A directory to mount, holding one file."""
    src = tmp_path / "src"
    src.mkdir()
    (src / name).write_bytes(data)
    return src


def _tree_bytes(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("direct_io", [False, True], ids=["page-cache", "direct-io"])
def test_bytes_through_the_mount(latency_mount: Mount, gnu_tar_shard: Path, direct_io: bool) -> None:
    src = gnu_tar_shard.parent
    mnt = latency_mount(src, direct_io=direct_io)
    shard = mnt.path(gnu_tar_shard)
    assert shard.read_bytes() == gnu_tar_shard.read_bytes()
    assert tarfile_members(shard) == tarfile_members(gnu_tar_shard)
    assert _tree_bytes(mnt.mountpoint) == _tree_bytes(src)  # listing, subdirectories, every file
    a, b = os.stat(shard), os.stat(gnu_tar_shard)
    assert (a.st_size, a.st_mtime_ns) == (b.st_size, b.st_mtime_ns)
    assert os.readlink(mnt.path("src/link.txt")) == "sample000.txt"
    with pytest.raises(OSError) as info:
        os.open(shard, os.O_RDWR)
    assert info.value.errno == errno.EROFS
    stats = mnt.stats()
    assert stats.reads > 0 and stats.read_bytes >= sum(p.stat().st_size for p in src.rglob("*") if p.is_file() and not p.is_symlink())


def test_every_read_waits_the_delay(latency_mount: Mount, tmp_path: Path) -> None:
    """One thread, direct I/O (each pread is one FUSE read): N reads take at least N delays, and each is counted."""
    src = _source(tmp_path, os.urandom(1 << 20))
    delay, n = 0.005, 20
    mnt = latency_mount(src, delay=delay, direct_io=True)
    fd = os.open(mnt.path("data"), os.O_RDONLY)
    try:
        mnt.reset_stats()
        t0 = time.perf_counter()
        for k in range(n):
            os.pread(fd, 1000, k * 50_000)
        elapsed = time.perf_counter() - t0
    finally:
        os.close(fd)
    assert elapsed >= n * delay
    stats = mnt.stats()
    assert (stats.reads, stats.read_bytes, stats.max_read) == (n, n * 1000, 1000)


def test_open_and_getattr_delays(latency_mount: Mount, tmp_path: Path) -> None:
    src = _source(tmp_path, b"x", "a")
    mnt = latency_mount(src, delay=0.0, open_delay=0.05, getattr_delay=0.05)
    t0 = time.perf_counter()
    fd = os.open(mnt.path("a"), os.O_RDONLY)
    elapsed = time.perf_counter() - t0
    os.close(fd)
    assert elapsed >= 0.05 + 0.05  # the lookup's getattr, then the open
    stats = mnt.stats()
    assert stats.opens == 1 and stats.getattrs >= 1


def test_parallel_reads_overlap(latency_mount: Mount, tmp_path: Path) -> None:
    """32 threads each reading once take a few delays, not 32: the FUSE loop serves them at once."""
    src = _source(tmp_path, os.urandom(1 << 20))
    delay, threads = 0.02, 32
    mnt = latency_mount(src, delay=delay, direct_io=True)
    fd = os.open(mnt.path("data"), os.O_RDONLY)
    got: list[bytes] = [b""] * threads
    start = threading.Barrier(threads + 1)

    def read(k: int) -> None:
        start.wait()
        got[k] = os.pread(fd, 4096, k * 8192)

    workers = [threading.Thread(target=read, args=(k,)) for k in range(threads)]
    for w in workers:
        w.start()
    mnt.reset_stats()
    start.wait()
    t0 = time.perf_counter()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - t0
    os.close(fd)
    data = (src / "data").read_bytes()
    assert got == [data[k * 8192 : k * 8192 + 4096] for k in range(threads)]
    stats = mnt.stats()
    assert stats.reads == threads
    assert stats.peak_in_flight >= threads // 2
    assert elapsed < threads * delay / 4, f"{threads} reads of {delay * 1e3:g} ms in {elapsed * 1e3:.0f} ms"


def _fincore_pages(path: Path) -> int:
    out = subprocess.run(["fincore", "--noheadings", "--output", "PAGES", str(path)], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[0])


def test_cold_cache_local_file(tmp_path: Path) -> None:
    """``drop_cache`` empties the page cache of a local file; ``resident_pages`` counts as util-linux's fincore."""
    path = tmp_path / "shard.tar"
    path.write_bytes(os.urandom(4 << 20))
    path.read_bytes()
    resident, pages = resident_pages(path)
    assert pages == (4 << 20) // os.sysconf("SC_PAGE_SIZE")
    assert resident == pages == _fincore_pages(path)
    drop_cache([path])
    assert resident_pages(path) == (0, pages)
    assert _fincore_pages(path) == 0
    with open(path, "rb") as f:
        f.seek(1 << 20)
        f.read(8192)
    assert 2 <= resident_pages(path)[0] == _fincore_pages(path) < pages  # what was read, and its readahead


def test_cold_cache_through_the_mount(latency_mount: Mount, tmp_path: Path) -> None:
    """With the page cache, a second pass costs no FUSE read; after ``drop_cache`` every page is read again."""
    data = os.urandom(2 << 20)
    src = _source(tmp_path, data)
    mnt = latency_mount(src)
    path = mnt.path("data")
    assert path.read_bytes() == data
    first = mnt.stats()
    assert first.read_bytes >= len(data)
    assert resident_pages(path) == (len(data) // os.sysconf("SC_PAGE_SIZE"),) * 2  # kept across opens (auto_cache)
    assert path.read_bytes() == data
    assert mnt.stats().reads == first.reads
    drop_cache([path])
    assert resident_pages(path)[0] == 0
    assert path.read_bytes() == data
    assert mnt.stats().read_bytes >= 2 * len(data)


def test_readahead_and_request_size(latency_mount: Mount, tmp_path: Path) -> None:
    """The kernel's side as asked: readahead off reads a page per request, ``max_read`` caps a request."""
    data = os.urandom(1 << 20)
    src = _source(tmp_path, data)
    off = latency_mount(src, delay=0.0, max_readahead=0)
    assert readahead(off.mountpoint) == 0
    assert off.path("data").read_bytes() == data
    assert off.stats().max_read == os.sysconf("SC_PAGE_SIZE")
    capped = latency_mount(src, delay=0.0, max_read=32 << 10, max_readahead=1 << 20)
    assert readahead(capped.mountpoint) == 1 << 20
    assert capped.path("data").read_bytes() == data
    stats = capped.stats()
    assert stats.max_read == 32 << 10 and stats.reads >= 32


def test_unmount_of_a_busy_mount(tmp_path: Path) -> None:
    """A file still open (a test that failed midway) does not keep the mount: it goes lazily, its process ends."""
    src = _source(tmp_path, b"abc")
    (tmp_path / "mnt").mkdir()
    mnt = mount(src, tmp_path / "mnt", delay=0.0, direct_io=True)  # every read asks the FUSE process
    assert mount_type(str(mnt.mountpoint)) == "fuse.latencyfs"
    fd = os.open(mnt.path("data"), os.O_RDONLY)
    try:
        assert os.pread(fd, 3, 0) == b"abc"
        mnt.unmount()
        assert mount_type(str(mnt.mountpoint)) is None
        assert mnt.process.returncode is not None
        with pytest.raises(OSError) as info:
            os.pread(fd, 3, 0)
        assert info.value.errno == errno.ENOTCONN
    finally:
        os.close(fd)
    mnt.unmount()  # a second time: nothing left to do


def test_a_failed_mount_names_its_cause(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="latencyfs exited with status"):
        mount(tmp_path / "missing", tmp_path / "also-missing", timeout=10)


# -- today's read paths through a 1 ms mount ------------------------------------------------------------


def _shards(root: Path) -> list[Path]:
    """Shards of three writers: tarfile (GNU format), webdataset's TarWriter, GNU tar (pax, long and unicode names)."""
    shards = make_shard_set(root, n_shards=3, per=8)
    shards.append(wds_write(root / "wds-000000.tar", [{"__key__": f"w{i:03d}", "txt": f"t{i}", "bin": os.urandom(i * 300)} for i in range(10)]))
    tree = root.parent / "tree"
    specs = file_specs("pax")
    write_tree(tree, specs)
    shards.append(gnu_tar(tree, root / "gnu-000000.tar", "pax", [name for name, _ in specs]))
    return shards


def _on_disk(sample: dict[str, object], mnt: LatencyMount) -> dict[str, object]:
    """A sample read through the mount, its ``__url__`` named as on the disk."""
    url = Path(os.path.normpath(str(sample["__url__"])))
    return {**sample, "__url__": str(mnt.source / url.relative_to(mnt.mountpoint))}


@pytest.mark.parametrize("direct_io", [False, True], ids=["page-cache", "direct-io"])
def test_tarindex_through_the_mount(impl: str, latency_mount: Mount, tmp_path: Path, direct_io: bool) -> None:
    src = tmp_path / "shards"
    shards = _shards(src)
    mnt = latency_mount(src, delay=0.001, direct_io=direct_io)
    far = mnt.paths(shards)

    here = tarindex.TarDataset(tarindex.build_index([str(p) for p in shards], index=tmp_path / "disk.tarindex", workers=1).path)
    there = tarindex.TarDataset(tarindex.build_index(far, index=tmp_path / "mount.tarindex").path)
    assert mnt.stats().reads > 0
    a, b = here.index.decode(), there.index.decode()
    for column in ("shard", "offset", "size"):
        assert getattr(a, column).tolist() == getattr(b, column).tolist()
    assert list(here.keys()) == list(there.keys())
    n = len(here)
    assert n == len(there) == 3 * 8 + 10 + len({name.split(".")[0] for name, _ in file_specs("pax")})

    expected = [here[i] for i in range(n)]
    assert [_on_disk(there[i], mnt) for i in range(n)] == expected
    order = list(range(n)) * 2
    random.Random(0).shuffle(order)
    assert [_on_disk(s, mnt) for s in there.__getitems__(order)] == [expected[i] for i in order]

    streamed = list(tarindex.TarStream(far))
    assert [_on_disk(s, mnt) for s in streamed] == list(tarindex.TarStream([str(p) for p in shards]))
    members = {f"{s['__key__']}.{ext}": data for s in streamed for ext, data in s.items() if not ext.startswith("__")}
    assert members == {name: data for p in shards for name, data in tarfile_members(p)}  # the oracle: tarfile's bytes


def test_a_shard_gone_from_the_mount_is_named(impl: str, latency_mount: Mount, tmp_path: Path) -> None:
    src = tmp_path / "shards"
    shards = make_shard_set(src, n_shards=3, per=4)
    mnt = latency_mount(src, delay=0.001)
    ds = tarindex.TarDataset(tarindex.build_index(mnt.paths(shards), index=tmp_path / "mount.tarindex").path)
    assert ds[0]["__key__"] == "s00i000"
    shards[1].unlink()
    with pytest.raises(ShardNotFoundError, match=r"train-000001\.tar"):
        ds.__getitems__([0, 8, 4, 1])


def test_tarfile_reads_through_the_mount_as_from_disk(latency_mount: Mount, tmp_path: Path) -> None:
    """The oracle itself is unchanged by the mount (tarfile's own reads are small and many: 1 ms each)."""
    src = tmp_path / "shards"
    (shard,) = make_shard_set(src, n_shards=1, per=5)
    mnt = latency_mount(src, direct_io=True)
    with tarfile.open(mnt.path(shard)) as far, tarfile.open(shard) as near:
        assert [(m.name, m.size, m.offset_data) for m in far] == [(m.name, m.size, m.offset_data) for m in near]
    assert mnt.stats().reads > 1
