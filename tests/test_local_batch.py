"""Batches from local shards read together (``TarDataset.__getitems__``: the C reader's ``read_batch`` over
``_batchio.c``, and ``tarindex._localbatch`` in Python).

Exact bytes, compared with what tarfile extracts, on the local disk (page cache warm and dropped) and
through the latency mount (``tests/_latencyfs.py``, with and without its page cache): small samples read into
one buffer, large ones straight into their members, repeated and negative indices, samples in the order
asked. The mount counts what reached it: reads overlap up to ``max_in_flight`` and no further, neighbours
within ``coalesce_gap`` are one read. A shard missing when the batch opens it is an error that names it,
and the next batch is whole; a shard cut short under an open handle names the shard and offset.
"""

from __future__ import annotations

import os
import random
import tarfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from _latencyfs import LatencyMount, drop_cache

import tarindex
from conftest import py_tar, tarfile_members
from tarindex.errors import CorruptArchiveError, ShardNotFoundError
from tarindex.options import SourceOptions

Mount = Callable[..., LatencyMount]


def _shards(root: Path, n_shards: int = 4, per: int = 24) -> list[Path]:
    """Shards whose samples range from empty members to 200 KiB ones (read straight into their members)."""
    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(7)
    paths = []
    for s in range(n_shards):
        specs = []
        for i in range(per):
            key = f"s{s}i{i:03d}"
            big = rng.choice([0, 1 << 10, 3000, 70 << 10, 200 << 10])
            specs += [(f"{key}.txt", f"sample {s} {i}".encode()), (f"{key}.bin", os.urandom(big)), (f"{key}.cls", b"")]
        paths.append(py_tar(root / f"part-{s:04d}.tar", specs, tarfile.PAX_FORMAT if s % 2 else tarfile.GNU_FORMAT, dirs=False))
    return paths


def _oracle(paths: list[Path]) -> dict[str, dict[str, bytes]]:
    """Every sample's members by tarfile: ``{key: {ext: bytes}}``."""
    out: dict[str, dict[str, bytes]] = {}
    for p in paths:
        for name, data in tarfile_members(p):
            key, ext = name.split(".", 1)
            out.setdefault(key, {})[ext] = data
    return out


def _check(batch: list[dict[str, object]], asked: list[int], n: int, oracle: dict[str, dict[str, bytes]]) -> None:
    assert len(batch) == len(asked)
    for got, i in zip(batch, asked):
        assert got["__index__"] == i % n
        key = got["__key__"]
        assert isinstance(key, str)
        assert {k: v for k, v in got.items() if not k.startswith("__")} == oracle[key]


def _asked(n: int, count: int = 150, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    asked = [rng.randrange(n) for _ in range(count)]
    return [*asked, asked[0], asked[0], -1, -n, 0, n - 1]  # repeats, negative, both ends


@pytest.mark.parametrize("cold", [False, True], ids=["warm", "cold"])
def test_local_batch_is_tarfile(impl: str, tmp_path: Path, cold: bool) -> None:
    paths = _shards(tmp_path / "d")
    oracle = _oracle(paths)
    ds = tarindex.TarDataset(tarindex.build_index(paths).path)
    asked = _asked(len(ds))
    for _ in range(2):  # the second pass with each shard's read mode learnt
        if cold:
            drop_cache(paths)
        _check(ds.__getitems__(asked), asked, len(ds), oracle)
    numpy_asked = list(np.array(asked[:20], dtype=np.int64))
    _check(ds.__getitems__(numpy_asked), asked[:20], len(ds), oracle)
    assert ds.__getitems__([]) == []


def test_a_batch_larger_than_a_read_batch_call_is_whole_and_in_order(impl: str, tmp_path: Path) -> None:
    paths = _shards(tmp_path / "d", n_shards=2, per=10)
    oracle = _oracle(paths)
    ds = tarindex.TarDataset(tarindex.build_index(paths).path)
    asked = _asked(len(ds), 2600, seed=4)  # the C reader takes 1,024 a call
    _check(ds.__getitems__(asked), asked, len(ds), oracle)


@pytest.mark.parametrize("direct_io", [False, True], ids=["page-cache", "direct-io"])
def test_batch_through_the_mount_is_tarfile(impl: str, tmp_path: Path, latency_mount: Mount, direct_io: bool) -> None:
    local = _shards(tmp_path / "src")
    oracle = _oracle(local)
    mnt = latency_mount(tmp_path / "src", delay=0.002, direct_io=direct_io)
    paths = mnt.paths(local)
    ds = tarindex.TarDataset(tarindex.build_index(paths, index=tmp_path / "m.tarindex").path)
    asked = _asked(len(ds), 60)
    drop_cache(paths)
    _check(ds.__getitems__(asked), asked, len(ds), oracle)
    _check(ds.__getitems__(asked), asked, len(ds), oracle)  # again: from the mount's page cache, where it keeps one


def _spread_batch(ds: tarindex.TarDataset, count: int) -> list[int]:
    """Samples of one shard no two of which are neighbours (no read serves two)."""
    return list(range(0, 2 * count, 2))


def test_reads_in_flight_up_to_max_in_flight(impl: str, tmp_path: Path, latency_mount: Mount) -> None:
    local = _shards(tmp_path / "src", n_shards=1, per=80)
    oracle = _oracle(local)
    mnt = latency_mount(tmp_path / "src", delay=0.02, direct_io=True)
    paths = mnt.paths(local)
    index = tarindex.build_index(paths, index=tmp_path / "m.tarindex").path
    asked = _spread_batch(tarindex.TarDataset(index), 32)
    peaks = {}
    for limit in (1, 8):
        ds = tarindex.TarDataset(index, options=SourceOptions(max_in_flight=limit))
        ds[1]  # the shard opened and its mode learnt outside the counted batch
        mnt.reset_stats()
        _check(ds.__getitems__(asked), asked, len(ds), oracle)
        peaks[limit] = mnt.stats().peak_in_flight
        ds.close()
    assert peaks[1] == 1
    assert 4 <= peaks[8] <= 8, peaks


def test_neighbours_within_the_gap_are_one_read(impl: str, tmp_path: Path, latency_mount: Mount) -> None:
    (tmp_path / "src").mkdir()
    local = [py_tar(tmp_path / "src" / "a.tar", [(f"k{i:03d}.txt", b"x" * 100) for i in range(64)], tarfile.GNU_FORMAT, dirs=False)]
    oracle = _oracle(local)
    mnt = latency_mount(tmp_path / "src", delay=0.001, direct_io=True)
    paths = mnt.paths(local)
    index = tarindex.build_index(paths, index=tmp_path / "m.tarindex").path
    asked = list(range(0, 64, 2))  # every other 1 KiB sample: 1 KiB apart
    reads = {}
    for gap in (-1, 4 << 10):
        ds = tarindex.TarDataset(index, options=SourceOptions(coalesce_gap=gap))
        ds[1]
        mnt.reset_stats()
        _check(ds.__getitems__(asked), asked, len(ds), oracle)
        reads[gap] = mnt.stats().reads
        ds.close()
    assert reads[-1] == len(asked)
    assert reads[4 << 10] == 1


def test_a_shard_missing_mid_batch_is_named_and_the_next_batch_is_whole(impl: str, tmp_path: Path) -> None:
    paths = _shards(tmp_path / "d")
    oracle = _oracle(paths)
    ds = tarindex.TarDataset(tarindex.build_index(paths).path, max_open_files=1)
    per = len(ds) // 4
    asked = [3 * per + 1, 0, 2 * per + 5, per + 2, 1]  # every shard, shard 2 opened after others
    _check(ds.__getitems__(asked), asked, len(ds), oracle)
    ds.close()
    moved = paths[2].with_suffix(".gone")
    paths[2].rename(moved)
    with pytest.raises(ShardNotFoundError, match=str(paths[2])):
        ds.__getitems__(asked)
    if impl == "c":
        assert not any(ds._opener.busy), "a read is still counted on a shard"
    rest = [k for k in asked if not 2 * per <= k < 3 * per]
    _check(ds.__getitems__(rest), rest, len(ds), oracle)
    moved.rename(paths[2])
    _check(ds.__getitems__(asked), asked, len(ds), oracle)


def test_a_shard_cut_short_under_an_open_handle_names_shard_and_offset(impl: str, tmp_path: Path) -> None:
    paths = _shards(tmp_path / "d", n_shards=2)
    ds = tarindex.TarDataset(tarindex.build_index(paths).path)
    per = len(ds) // 2
    ds[0], ds[per]  # both shards open
    last = ds.index.decode()
    offset = int(last.offset[per - 1])
    os.truncate(paths[0], offset + 10)
    with pytest.raises(CorruptArchiveError, match=rf"{paths[0]}.*offset"):
        ds.__getitems__([per, per - 1, 0])


def _identity(batch: list[dict[str, object]]) -> list[dict[str, object]]:
    return batch


def test_dataloader_workers_forked_after_a_batch_read_their_own(impl: str, tmp_path: Path) -> None:
    """The parent's read pool (its threads, a batch's state) is not the children's: each forked worker reads
    its batches with a pool of its own."""
    import torch.utils.data as torch_data  # the test extra installs torch
    paths = _shards(tmp_path / "d")
    oracle = _oracle(paths)
    ds = tarindex.TarDataset(tarindex.build_index(paths).path)
    rng = random.Random(5)
    batches = [[rng.randrange(len(ds)) for _ in range(40)] for _ in range(6)]
    drop_cache(paths)
    _check(ds.__getitems__(batches[0]), batches[0], len(ds), oracle)  # the parent's pool started
    drop_cache(paths)
    loader = torch_data.DataLoader(ds, batch_sampler=batches, num_workers=2, collate_fn=_identity, multiprocessing_context="fork")
    got = list(loader)
    assert len(got) == len(batches)
    for batch, asked in zip(got, batches):
        _check(batch, asked, len(ds), oracle)
