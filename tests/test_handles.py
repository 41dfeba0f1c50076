"""One owner of open shards (tarindex.access.handles.HandleTable), through TarDataset's public API: close() racing readers,
more shards than the process may open, and an index rebuilt in place under forked DataLoader workers."""

from __future__ import annotations

import contextlib
import gc
import io
import os
import resource
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from conftest import make_shard_set, open_files, tarfile_members
from tarindex import TarDataset, build_index

pytestmark = pytest.mark.usefixtures("impl")  # every test on both backends


def oracle(paths: list[Path]) -> list[tuple[str, bytes]]:
    return [(n.split(".")[0], d) for p in paths for n, d in tarfile_members(p) if n.endswith(".bin")]


def test_close_racing_reading_threads(tmp_path: Path) -> None:
    """close() while 8 threads read (and evict: 3 files for 12 shards): no read gets another file's bytes,
    no descriptor is left open once every read is done."""
    paths = make_shard_set(tmp_path / "d", n_shards=12, per=5)
    ds = TarDataset(build_index(paths, workers=1).path, max_open_files=3)
    expected = oracle(paths)
    stop = threading.Event()
    wrong: list[tuple[int, str]] = []
    reads = [0] * 8

    def reader(k: int) -> None:
        rng = np.random.default_rng(k)
        while not stop.is_set():
            for i in rng.integers(0, len(ds), 64).tolist():
                s = ds[i]
                if (s["__key__"], s["bin"]) != expected[i]:
                    wrong.append((i, s["__key__"]))
                reads[k] += 1

    threads = [threading.Thread(target=reader, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    closes = 0
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        ds.close()
        closes += 1
        time.sleep(0.0005)
    stop.set()
    for t in threads:
        t.join()
    assert not wrong and min(reads) > 0 and closes > 20
    ds.close()
    assert open_files(paths) == {}


@contextlib.contextmanager
def few_descriptors(more: int) -> Iterator[None]:
    """This process may open only ``more`` more descriptors (the soft ``ulimit -n``) inside the block."""
    gc.collect()  # descriptors of earlier tests' garbage closed now, not inside the block (a free number more)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    used = {int(fd) for fd in os.listdir("/proc/self/fd")}
    limit = free = 0
    while free < more:  # the limit is on descriptor numbers: closed ones below the highest are free too
        free += limit not in used
        limit += 1
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_max_open_files_above_ulimit_evicts_and_retries(tmp_path: Path) -> None:
    paths = make_shard_set(tmp_path / "d", n_shards=40, per=2)
    ds = TarDataset(build_index(paths, workers=1).path, max_open_files=1000)
    expected = oracle(paths)
    ds[0]
    with few_descriptors(12):
        got = [(s["__key__"], s["bin"]) for s in (ds[i] for i in range(len(ds)))]
        assert 0 < len(open_files(paths)) <= 14  # shard 0, and what 12 more descriptors (and the listing's) allow
    assert got == expected
    ds.close()


def _letter_tar(path: Path, letter: str, n: int) -> Path:
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tf:
        for i in range(n):
            data = f"{letter}-{i}".encode()
            ti = tarfile.TarInfo(f"{letter}{i}.txt")
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    return path


@pytest.mark.parametrize("persistent", [False])
def test_rebuild_in_place_then_forked_workers(tmp_path: Path, persistent: bool) -> None:
    """After an incremental rebuild in place, forked workers see the new index whole: key, bytes and url of
    each sample come from one shard of one index (was: key from the new index, bytes and url from the old)."""
    from torch.utils.data import DataLoader

    a = _letter_tar(tmp_path / "t-000000.tar", "A", 6)
    b = _letter_tar(tmp_path / "t-000001.tar", "B", 6)
    index = tmp_path / "t.tarindex"
    build_index([a, b], index=index, workers=1)
    ds = TarDataset(index)
    assert ds[0]["__key__"] == "A0"  # attached in the main process
    build_index([b, a], index=index, workers=1)  # rebuilt in place: the same shards, in another order
    loader = DataLoader(ds, num_workers=2, batch_size=None, multiprocessing_context="fork", persistent_workers=persistent)
    got = [(s["__key__"], s["__url__"].rsplit("/", 1)[1], bytes(s["txt"])) for s in loader]
    assert got == [(f"{c}{i}", f"t-00000{int(c == 'B')}.tar", f"{c}-{i}".encode()) for c in "BA" for i in range(6)]
    assert [ds[i]["__key__"] for i in (0, 6)] == ["A0", "B0"]  # the main process keeps the view it had


def test_reopened_shards_need_no_record_and_a_changed_one_is_stale(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """More shards than stay open: a shard reopened after eviction, unchanged, is not looked up in the index
    again (its record block is decoded once); one that changed on disk meanwhile is a StaleIndexError."""
    import tarindex.index.reader
    import tarindex.index.writer
    from tarindex.errors import StaleIndexError
    from tarindex.index.reader import IndexReader

    paths = make_shard_set(tmp_path / "d", n_shards=8, per=5)
    monkeypatch.setattr(tarindex.index.writer, "SHARD_BLOCK", 2)  # records of 2 shards a block (the meta says so) ...
    index = build_index([str(p) for p in paths], workers=1).path
    monkeypatch.setattr(tarindex.index.reader, "_SHARD_BLOCKS_KEPT", 1)  # ... and one block kept decoded: 4 blocks go round
    blocks: list[int] = []
    decode = IndexReader._shard_block

    def counted(self: IndexReader, b: int, expected: int) -> object:
        blocks.append(b)
        return decode(self, b, expected)

    monkeypatch.setattr(IndexReader, "_shard_block", counted)
    ds = TarDataset(index, max_open_files=2)
    want = oracle(paths)
    order = np.random.default_rng(0).permutation(len(ds)).tolist() * 3
    for i in order:  # 8 shards, 2 open at once: most reads reopen a shard
        assert ds[i]["bin"] == want[i][1]
    # the records were read only when the dataset first named a shard or first checked it: not per reopen
    assert 0 < len(blocks) <= 2 * 4, len(blocks)  # each block at most twice (naming the shard, checking it)
    victim = paths[5]
    data = victim.read_bytes()
    victim.write_bytes(data + b"\0" * 512)  # another size: no longer the indexed shard
    stale = 5 * 5  # 5 samples a shard: shard 5's first
    for i in range(len(ds)):  # evict shard 5 (2 open at once), then read it again
        if i // 5 != 5:
            ds[i]
    with pytest.raises(StaleIndexError, match=str(victim.name)):
        ds[stale]


_MANY_DATASETS = """
import os, resource, sys
import tarindex
from torch.utils.data import ConcatDataset
limit, n, mixed, indexes = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "mix", sys.argv[4:]
resource.setrlimit(resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
datasets = [tarindex.TarDataset(indexes[k % len(indexes)]) for k in range(n)]
if mixed:  # the map-style mix: every dataset read in its ShardSampler order, drawn at random
    whole = ConcatDataset(datasets)
    samples = [whole[i] for i in tarindex.MixSampler(datasets, seed=1)]
else:
    samples = [ds[i] for _ in range(2) for ds in datasets for i in range(len(ds))]
others = [os.open(os.devnull, os.O_RDONLY) for _ in range(limit // 4)]  # what the rest of a job opens (pipes, checkpoints)
print(len(samples), len({(s["__url__"], s["__key__"]) for s in samples}), len(os.listdir("/proc/self/fd")) <= limit)
"""


@pytest.mark.parametrize(("limit", "n", "how", "shards"), [(64, 20, "each", 12), (1024, 16, "mix", 70)])
def test_many_datasets_share_one_bound_on_open_files(tmp_path: Path, limit: int, n: int, how: str, shards: int) -> None:
    """20 datasets under ``ulimit -n 64`` (4 indexes), 16 in a MixSampler at 1,024 (each of 70 shards, 64 files
    open each by default): the process-wide bound keeps them to half the limit, no EMFILE (was a bare OSError,
    in the reads, or in whatever the process opened next once the datasets held every descriptor)."""
    import subprocess
    import sys

    indexes = []
    for k in range(4 if how == "each" else 1):
        paths = make_shard_set(tmp_path / f"set{k}", n_shards=shards, per=2)
        indexes.append(str(build_index(paths, workers=1).path))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", _MANY_DATASETS, str(limit), str(n), how, *indexes], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    total = n * shards * 2
    assert done.stdout.split() == [str(2 * total if how == "each" else total), str(len(indexes) * shards * 2), "True"]


_NO_DESCRIPTOR_LEFT = """
import os, resource, sys
import tarindex
ds = tarindex.TarDataset(sys.argv[1])
ds.read(0)
ds.close()  # no shard file of tarindex's open in this process
held = []
resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
try:
    while True:  # every descriptor taken by something else
        held.append(os.open(os.devnull, os.O_RDONLY))
except OSError:
    pass
try:
    ds[0]
except tarindex.DescriptorLimitError as exc:
    print(type(exc).__name__, isinstance(exc, OSError), exc)
for fd in held:
    os.close(fd)
print(ds[0]["__key__"])
"""


def test_out_of_descriptors_with_nothing_to_close_is_a_named_error(tmp_path: Path) -> None:
    """No shard file of tarindex's open and the process out of descriptors: a DescriptorLimitError (an OSError)
    naming the shard and the limit, not a bare OSError; the same read works once descriptors are free."""
    import subprocess
    import sys

    paths = make_shard_set(tmp_path / "d", n_shards=2, per=2)
    index = build_index(paths, workers=1).path
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", _NO_DESCRIPTOR_LEFT, str(index)], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == [
        f"DescriptorLimitError True {paths[0]}: cannot open: the process is out of file descriptors (ulimit -n: 64) and holds no "
        "shard file tarindex could close; raise the limit (ulimit -n) or hold fewer files open elsewhere (Too many open files)",
        "s00i000",
    ]


_STREAMS_OUT_OF_DESCRIPTORS = """
import os, resource, sys
import tarindex
resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
held = []
try:
    while True:  # every descriptor taken by something else
        held.append(os.open(os.devnull, os.O_RDONLY))
except OSError:
    pass
for fd in held[-4:]:  # a few left: the first streams open their shards, the next one finds none
    os.close(fd)
try:
    sum(1 for _ in tarindex.mix([tarindex.TarStream(sys.argv[1]) for _ in range(8)]))
except tarindex.DescriptorLimitError as exc:
    print(type(exc).__name__, isinstance(exc, OSError), exc)
"""


def test_streams_out_of_descriptors_are_a_named_error(tmp_path: Path, impl: str) -> None:
    """A ``mix`` of more streams than the process has descriptors for (each stream holds its shard open while
    it reads): a DescriptorLimitError (an OSError) naming the shard and the limit, not a bare ``OSError``."""
    import subprocess
    import sys

    paths = make_shard_set(tmp_path / "d", n_shards=2, per=2)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", _STREAMS_OUT_OF_DESCRIPTORS, str(paths[0])], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == (
        f"DescriptorLimitError True {paths[0]}: cannot open: the process is out of file descriptors (ulimit -n: 64), and a "
        "stream holds its shard open; raise the limit (ulimit -n) or stream fewer shards at once (Too many open files)\n"
    )
