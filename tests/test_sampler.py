"""ShardSampler: exactly once, equal lengths, determinism, locality, resumption (hypothesis), scale, DataLoader."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tracemalloc
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tarindex
import tarindex.sampler as sampler_module
from tarindex import SamplerStateError, ShardSampler, TarDataset
from tarindex.sampler import _ROUNDS, _Feistel

SETTINGS = settings(max_examples=120, deadline=None)


@dataclass
class Shards:
    """A synthetic dataset: lengths only."""

    shard_sizes: Any


shard_lists = st.lists(st.one_of(st.integers(0, 12), st.sampled_from([0, 1])), max_size=14)
worlds = st.integers(1, 5)
seeds = st.integers(-(2**63), 2**64)
epochs = st.integers(0, 10**6)
chunks = st.integers(1, 5)
blocks = st.integers(1, 4)  # block_samples: 1 shuffles single samples


def rank_streams(sizes: list[int], world: int, **kw: Any) -> list[list[int]]:
    epoch = kw.pop("epoch", 0)
    out = []
    for r in range(world):
        s = ShardSampler(Shards(sizes), world, r, **kw)
        s.set_epoch(epoch)
        out.append(list(s))
    return out


def expected_len(n: int, world: int, drop_last: bool) -> int:
    return n // world if drop_last else math.ceil(n / world)


def max_open_shards(shards: list[int]) -> int:
    """Most shards 'open' at once: first read <= position <= last read."""
    if not shards:
        return 0
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for p, k in enumerate(shards):
        first.setdefault(k, p)
        last[k] = p
    delta = np.zeros(len(shards) + 1, dtype=np.int64)
    for k, p in first.items():
        delta[p] += 1
        delta[last[k] + 1] -= 1
    return int(np.cumsum(delta).max())


# windows up to _TABLE_MAX samples use a numpy permutation table, larger ones the Feistel network:
# with 0 every window takes the Feistel path
WINDOW_PATHS = pytest.mark.parametrize("table_max", [sampler_module._TABLE_MAX, 0], ids=["table", "feistel"])


@WINDOW_PATHS
@SETTINGS
@given(shard_lists, worlds, seeds, epochs, chunks, blocks, st.booleans(), st.booleans())
def test_exactly_once_equal_lengths_padding(
    table_max: int,
    sizes: list[int],
    world: int,
    seed: int,
    epoch: int,
    chunk: int,
    block: int,
    shuffle: bool,
    drop_last: bool,
) -> None:
    n = sum(sizes)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sampler_module, "_TABLE_MAX", table_max)
        streams = rank_streams(
            sizes,
            world,
            seed=seed,
            epoch=epoch,
            chunk_shards=chunk,
            block_samples=block,
            shuffle=shuffle,
            drop_last=drop_last,
        )
    length = expected_len(n, world, drop_last)
    assert [len(s) for s in streams] == [length] * world
    assert [len(ShardSampler(Shards(sizes), world, r, drop_last=drop_last)) for r in range(world)] == [length] * world
    flat = [i for s in streams for i in s]
    counts = Counter(flat)
    if drop_last:
        assert max(counts.values(), default=1) == 1
        assert set(counts) <= set(range(n)) and len(counts) == length * world
    else:
        assert set(counts) == set(range(n))
        pad = length * world - n
        assert flat[n:] == (flat[:n] * (pad // max(n, 1) + 1))[:pad]  # DistributedSampler's padding


@SETTINGS
@given(shard_lists, worlds, seeds, epochs, chunks, blocks, st.booleans())
def test_each_rank_reads_few_shards_at_once(
    sizes: list[int], world: int, seed: int, epoch: int, chunk: int, block: int, drop_last: bool
) -> None:
    shard_of = np.repeat(np.arange(len(sizes)), sizes)
    n = sum(sizes)
    streams = rank_streams(
        sizes, world, seed=seed, epoch=epoch, chunk_shards=chunk, block_samples=block, drop_last=drop_last
    )
    length = expected_len(n, world, drop_last)
    for r, stream in enumerate(streams):
        real = max(0, min(length, n - r * length))  # positions before any padding
        assert max_open_shards(shard_of[stream[:real]].tolist()) <= chunk


@SETTINGS
@given(shard_lists, worlds, seeds, epochs, chunks)
def test_deterministic_and_epoch_changes_order(sizes: list[int], world: int, seed: int, epoch: int, chunk: int) -> None:
    a = rank_streams(sizes, world, seed=seed, epoch=epoch, chunk_shards=chunk)
    assert a == rank_streams(sizes, world, seed=seed, epoch=epoch, chunk_shards=chunk)
    if sum(sizes) >= 20:  # two orders of >= 20 samples coincide with negligible probability
        assert a != rank_streams(sizes, world, seed=seed, epoch=epoch + 1, chunk_shards=chunk)
        assert a != rank_streams(sizes, world, seed=seed + 1, epoch=epoch, chunk_shards=chunk)


@SETTINGS
@given(shard_lists, chunks)
def test_no_shuffle_is_index_order(sizes: list[int], chunk: int) -> None:
    assert rank_streams(sizes, 1, shuffle=False, chunk_shards=chunk) == [list(range(sum(sizes)))]


@WINDOW_PATHS
@SETTINGS
@given(shard_lists, worlds, seeds, epochs, st.tuples(chunks, blocks), st.booleans(), st.floats(0, 1), st.booleans())
def test_resume_equals_uninterrupted(
    table_max: int,
    sizes: list[int],
    world: int,
    seed: int,
    epoch: int,
    chunk: tuple[int, int],
    drop_last: bool,
    frac: float,
    explicit: bool,
) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sampler_module, "_TABLE_MAX", table_max)
        kw = {"seed": seed, "chunk_shards": chunk[0], "block_samples": chunk[1], "drop_last": drop_last}
        for r in range(world):
            full = ShardSampler(Shards(sizes), world, r, **kw)
            full.set_epoch(epoch)
            whole = list(full)
            k = int(frac * len(whole))
            run = ShardSampler(Shards(sizes), world, r, **kw)
            run.set_epoch(epoch)
            if explicit:  # the training loop's own count
                state = run.state_dict(consumed=k)
            else:  # the sampler's count of what it handed out
                it = iter(run)
                for _ in range(k):
                    next(it)
                state = run.state_dict()
            state = json.loads(json.dumps(state))
            resumed = ShardSampler(Shards(sizes), world, r, **kw)
            resumed.load_state_dict(state)
            resumed.set_epoch(epoch)  # what a training loop does next: keeps the position
            assert len(resumed) == len(whole) - k
            assert list(resumed) == whole[k:]
            resumed.set_epoch(epoch + 1)  # another epoch starts from the beginning
            assert len(resumed) == len(whole)


@SETTINGS
@given(
    shard_lists,
    st.lists(st.tuples(worlds, st.floats(0, 1)), min_size=1, max_size=3),
    worlds,
    seeds,
    chunks,
    blocks,
    st.booleans(),
)
def test_resume_with_other_world_sizes_sees_rest_once(
    sizes: list[int],
    phases: list[tuple[int, float]],
    last_world: int,
    seed: int,
    chunk: int,
    block: int,
    drop_last: bool,
) -> None:
    n = sum(sizes)
    kw = {"seed": seed, "chunk_shards": chunk, "block_samples": block, "drop_last": drop_last}
    seen: list[int] = []
    state: dict[str, Any] | None = None
    slack = 0  # padding may repeat, drop_last may drop, fewer than `world` samples per phase
    for world, frac in [*phases, (last_world, 1.0)]:
        samplers = [ShardSampler(Shards(sizes), world, r, **kw) for r in range(world)]
        for s in samplers:
            s.set_epoch(3)
            if state is not None:
                s.load_state_dict(state)
        lengths = {len(s) for s in samplers}
        assert len(lengths) == 1  # all ranks equal
        k = int(frac * lengths.pop())
        for s in samplers:
            it = iter(s)
            seen += [next(it) for _ in range(k)]
        state = json.loads(json.dumps(samplers[0].state_dict()))
        slack += world - 1
    counts = Counter(seen)
    if drop_last:
        assert max(counts.values(), default=1) == 1 and set(counts) <= set(range(n))
        assert len(counts) >= n - slack
    else:
        assert set(counts) == set(range(n))
        assert len(seen) - n <= slack


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 3000), st.lists(st.integers(0, 2**64 - 1), min_size=_ROUNDS, max_size=_ROUNDS))
def test_feistel_is_a_bijection(n: int, keys: list[int]) -> None:
    perm = _Feistel(n, np.array(keys, dtype=np.uint64))(np.arange(n, dtype=np.uint64))
    assert sorted(perm.tolist()) == list(range(n))


def test_feistel_bijection_past_table_size() -> None:
    n = sampler_module._TABLE_MAX * 2 + 3  # 22 bits: 11-bit halves, cycle walking from 2**22
    keys = np.random.SeedSequence(5).generate_state(_ROUNDS, np.uint64).astype(np.uint64)
    perm = _Feistel(n, keys)(np.arange(n, dtype=np.uint64))
    assert np.array_equal(np.sort(perm), np.arange(n, dtype=np.uint64))
    assert abs(np.corrcoef(perm[:-1].astype(np.float64), perm[1:].astype(np.float64))[0, 1]) < 0.01


@pytest.mark.parametrize("table_max", [sampler_module._TABLE_MAX, 0], ids=["table", "feistel"])
def test_window_shuffle_is_uniform(table_max: int) -> None:
    """Which of 10 samples comes first, over 2,000 seeds: chi-square within 5 sigma of its 9 degrees of freedom."""
    n, seeds = 10, 2000
    first = np.zeros(n)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sampler_module, "_TABLE_MAX", table_max)
        for seed in range(seeds):
            first[next(iter(ShardSampler(Shards([n]), 1, 0, seed=seed)))] += 1
    chi2 = float(((first - seeds / n) ** 2 / (seeds / n)).sum())
    assert chi2 < 9 + 5 * math.sqrt(18), first


@pytest.mark.parametrize("table_max", [sampler_module._TABLE_MAX, 0], ids=["table", "feistel"])
def test_block_samples_keep_runs_in_order(table_max: int) -> None:
    """A window of 14 samples, runs of 4: three whole runs in some order, each in order; the partial run last."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sampler_module, "_TABLE_MAX", table_max)
        orders = {tuple(ShardSampler(Shards([14]), 1, 0, seed=s, block_samples=4)) for s in range(40)}
    runs = {(0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11)}
    for order in orders:
        assert {order[0:4], order[4:8], order[8:12]} == runs and order[12:] == (12, 13)
    assert len(orders) == 6  # all 3! orders of the runs occur


def test_resume_other_world_size_exact_example() -> None:
    """24 samples, 2 ranks consume 5 each, 3 ranks finish: the 14 others, once, in the old blocks' order."""
    data = Shards([6, 0, 1, 6, 5, 6])
    old = [ShardSampler(data, 2, r, seed=9) for r in range(2)]
    streams = [list(s) for s in old]
    state = old[0].state_dict(consumed=5)
    new = [ShardSampler(data, 3, r, seed=9) for r in range(3)]
    for s in new:
        s.load_state_dict(state)
    assert [len(s) for s in new] == [5, 5, 5]  # 14 left, padded to 15
    rest = [i for s in new for i in s]
    assert rest[:14] == streams[0][5:] + streams[1][5:]
    assert rest[14] == rest[0]  # the padding repeats the plan's first sample


def test_state_round_trip_and_errors() -> None:
    data = Shards([3, 4, 5])
    s = ShardSampler(data, 2, 1, seed=4)
    state = s.state_dict(consumed=2)
    assert state["consumed"] == 2 and state["num_replicas"] == 2 and state["epoch"] == 0
    with pytest.raises(ValueError, match=r"consumed must be in \[0, 6\], got 7"):
        s.state_dict(consumed=7)
    with pytest.raises(SamplerStateError, match="seed=4, this ShardSampler has seed=5"):
        ShardSampler(data, 2, 1, seed=5).load_state_dict(state)
    with pytest.raises(SamplerStateError, match="total_samples=12, this ShardSampler has total_samples=13"):
        ShardSampler(Shards([3, 4, 6]), 2, 1, seed=4).load_state_dict(state)
    with pytest.raises(SamplerStateError, match="ShardSampler state has no 'epoch'"):
        ShardSampler(data, 2, 1, seed=4).load_state_dict({"format": 1})
    with pytest.raises(SamplerStateError, match="format 99 is not supported"):
        ShardSampler(data, 2, 1, seed=4).load_state_dict({**state, "format": 99})
    with pytest.raises(SamplerStateError, match=r"consumed \[9, 9\] outside \[0, 6\]"):
        ShardSampler(data, 2, 1, seed=4).load_state_dict({**state, "consumed": 9})
    with pytest.raises(SamplerStateError, match=r"plan\[0\] is \[0, 99\], expected \[start, end\] with 0 <= start < end <= 12"):
        ShardSampler(data, 2, 1, seed=4).load_state_dict({**state, "plan": [[0, 99]]})
    with pytest.raises(ValueError, match=r"rank must be in \[0, 1\], got 2"):
        ShardSampler(data, 2, 2)
    with pytest.raises(ValueError, match="chunk_shards must be >= 1"):
        ShardSampler(data, 1, 0, chunk_shards=0)
    with pytest.raises(ValueError, match="block_samples must be >= 1, got 0"):
        ShardSampler(data, 1, 0, block_samples=0)
    with pytest.raises(SamplerStateError, match="block_samples=1, this ShardSampler has block_samples=2"):
        ShardSampler(data, 2, 1, seed=4, block_samples=2).load_state_dict(state)
    with pytest.raises(ValueError, match="shard sizes must be >= 0, got -1 for shard 1"):
        ShardSampler(Shards([2, -1]), 1, 0)


def test_state_layout_is_the_saved_one_and_older_states_load() -> None:
    """A ShardSampler state keeps its layout (format and the config's fields at the top level, no kind), so
    the states saved before load, one without ``elastic`` (saved before the option existed) too."""
    data = Shards([3, 4, 5])
    s = ShardSampler(data, 2, 1, seed=4)
    rest = list(s)
    saved = {
        "format": 1, "epoch": 0, "seed": 4, "shuffle": True, "chunk_shards": 4, "block_samples": 1, "drop_last": False,
        "total_samples": 12, "num_shards": 3, "num_replicas": 2, "rank": 1, "plan": [[0, 12]], "consumed": 2,
    }  # fmt: skip
    assert s.state_dict(consumed=2) == {**saved, "elastic": False}
    for state in (saved, {**saved, "elastic": False}):
        resumed = ShardSampler(data, 2, 1, seed=4)
        resumed.load_state_dict(state)
        assert list(resumed) == rest[2:]
    with pytest.raises(SamplerStateError, match="ShardSampler state is for elastic=False, this ShardSampler has elastic=True"):
        ShardSampler(data, 2, 1, seed=4, elastic=True).load_state_dict(saved)
    with pytest.raises(SamplerStateError, match="ShardSampler state has no 'seed'"):
        ShardSampler(data, 2, 1, seed=4).load_state_dict({k: v for k, v in saved.items() if k != "seed"})


def test_per_rank_counts_list() -> None:
    """Ranks that consumed different counts: pass them all; with a new world size each rest is seen once."""
    data = Shards([7, 7, 7, 7])
    old = [list(ShardSampler(data, 2, r, seed=1, chunk_shards=2)) for r in range(2)]
    state = ShardSampler(data, 2, 0, seed=1, chunk_shards=2).state_dict(consumed=3)
    state["consumed"] = [3, 10]
    new = ShardSampler(data, 1, 0, seed=1, chunk_shards=2)
    new.load_state_dict(state)
    assert list(new) == old[0][3:] + old[1][10:]


def test_default_world_from_torch_distributed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    s = ShardSampler(Shards([2, 2]))
    assert (s.num_replicas, s.rank) == (1, 0)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match=r"torch\.distributed is not initialised"):
        ShardSampler(Shards([2, 2]))
    assert ShardSampler(Shards([2, 2]), 2, 1).rank == 1  # explicit rank and world size need no torch


def test_sampler_needs_no_torch() -> None:
    code = (
        "import sys, tarindex\n"
        "class D: shard_sizes = [3, 0, 5]\n"
        "s = tarindex.ShardSampler(D(), 2, 1)\n"
        "s.set_epoch(1); out = list(s); s.load_state_dict(s.state_dict(consumed=1))\n"
        "assert len(out) == 4, out\n"
        "assert 'torch' not in sys.modules\n"
        "print('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", code], check=False, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "ok\n"


def test_five_billion_samples_in_o_shards_memory() -> None:
    """5e9 samples over 500,000 shards: the sampler holds a few arrays of 500,000 numbers."""
    data = Shards(np.full(500_000, 10_000, dtype=np.int64))
    tracemalloc.start()
    try:
        s = ShardSampler(data, 8, 5, seed=3)
        s.set_epoch(7)
        it = iter(s)
        head = [next(it) for _ in range(50_000)]
        state = s.state_dict()
        resumed = ShardSampler(data, 6, 2, seed=3)
        resumed.load_state_dict(state)  # another world size: the rest of 8 blocks, dealt to 6 ranks
        tail = [next(iter(resumed)) for _ in range(1)]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 100 * 2**20, f"{peak / 2**20:.1f} MiB"
    assert len(s) == 625_000_000 and len(resumed) == math.ceil((5_000_000_000 - 8 * 50_000) / 6)
    assert len(set(head)) == len(head) and min(head) >= 0 and max(head) < 5_000_000_000
    shards = {i // 10_000 for i in head}
    assert len(shards) <= 4 * (50_000 // 40_000 + 2)  # a few windows of 4 shards
    assert tail[0] not in set(head)


# -- with a real TarDataset and DataLoader workers --------------------------------------------------------


def worker_and_shard(sample: dict[str, Any]) -> tuple[int, str, str]:
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    return (info.id if info is not None else -1, sample["__url__"], sample["__key__"])


@pytest.fixture
def dataset(tmp_path: Path) -> TarDataset:
    from conftest import make_shard_set

    paths = make_shard_set(tmp_path / "data", n_shards=10, per=9)
    index = tarindex.build_index([str(p) for p in paths]).path
    return TarDataset(index, transform=worker_and_shard)


def test_dataloader_workers_read_locally(dataset: TarDataset) -> None:
    from torch.utils.data import DataLoader

    keys = list(dataset.keys())
    seen: list[str] = []
    for rank in range(2):
        sampler = ShardSampler(dataset, 2, rank, seed=11, chunk_shards=2)
        sampler.set_epoch(1)
        loader = DataLoader(dataset, sampler=sampler, batch_size=3, num_workers=2, collate_fn=list)
        per_worker: dict[int, list[str]] = {}
        for batch in loader:
            for worker, url, key in batch:
                per_worker.setdefault(worker, []).append(url)
                seen.append(key)
        assert set(per_worker) == {0, 1}
        for urls in per_worker.values():  # each worker's reads: a subsequence of the rank's window-local stream
            assert max_open_shards(urls) <= 2
    assert sorted(seen) == sorted(keys)  # 90 samples, 2 ranks: no padding


def test_sampler_over_tardataset_matches_shard_sizes(dataset: TarDataset) -> None:
    sampler = ShardSampler(dataset, 1, 0, seed=2)
    order = list(sampler)
    assert sorted(order) == list(range(len(dataset)))
    starts = np.cumsum([0, *dataset.shard_sizes])
    for i in order[:20]:
        shard = int(np.searchsorted(starts, i, side="right")) - 1
        assert dataset[i][1] == dataset.urls[shard]


def test_sampler_over_zstd_shards(tmp_path: Path) -> None:
    """zstd shards (sample-aligned frames): the same shard sizes, every sample once, bytes as in the plain tar."""
    from conftest import make_shard_set

    plain = make_shard_set(tmp_path / "plain", n_shards=5, per=7)
    zstd = [tmp_path / f"{p.name}.zst" for p in plain]
    for src, dst in zip(plain, zstd):
        tarindex.compress_shard(src, dst, frame_size=2048)
    zds = TarDataset(tarindex.build_index([str(p) for p in zstd], index=tmp_path / "z.tarindex").path)
    pds = TarDataset(tarindex.build_index([str(p) for p in plain], index=tmp_path / "p.tarindex").path)
    assert zds.shard_sizes == pds.shard_sizes == [7] * 5
    frames = zds.index.frame_table(0)
    assert frames is not None and len(frames) > 1  # really zstd, several frames per shard
    seen = []
    for rank in range(3):
        for i in ShardSampler(zds, 3, rank, seed=1, chunk_shards=2, block_samples=3):
            z, p = zds.read(i), pds.read(i)
            assert z["__key__"] == p["__key__"] and bytes(z["bin"]) == bytes(p["bin"])
            seen.append(i)
    assert sorted(set(seen)) == list(range(35)) and len(seen) == 36  # 3 ranks x 12, one padded


def test_default_block_follows_the_zstd_frames(tmp_path: Path, dataset: TarDataset) -> None:
    """Plain tar: single samples; zstd shards of several samples per frame: runs of about one frame."""
    from conftest import make_shard_set

    assert dataset.samples_per_frame == 1
    assert ShardSampler(dataset, 1, 0).block_samples == 1
    plain = make_shard_set(tmp_path / "framed", n_shards=3, per=40)
    zstd = [tmp_path / f"{p.name}.zst" for p in plain]
    for src, dst in zip(plain, zstd):
        tarindex.compress_shard(src, dst, frame_size=16 << 10)
    zds = TarDataset(tarindex.build_index([str(p) for p in zstd], index=tmp_path / "f.tarindex").path)
    frames = sum(len(zds.index.frame_table(k)) for k in range(3))
    assert zds.samples_per_frame == 120 // frames > 1
    sampler = ShardSampler(zds, 2, 1, seed=3)
    assert sampler.block_samples == zds.samples_per_frame
    assert ShardSampler(zds, 2, 1, seed=3, block_samples=1).block_samples == 1  # an explicit value wins
    order = list(sampler)
    assert len(set(order)) == len(order)
    runs = sum(1 for a, b in zip(order, order[1:]) if b == a + 1)
    assert runs >= len(order) // 2  # consecutive samples come in runs


def test_elastic_same_global_sequence_for_any_world_size() -> None:
    sizes = Shards(np.array([37, 0, 50, 23, 41, 9, 60]))  # 220 samples
    batch_total = 20  # world x per-rank batch, kept constant

    def global_batches(world: int) -> list[list[int]]:
        per = batch_total // world
        ranks = [list(ShardSampler(sizes, world, r, seed=3, drop_last=True, elastic=True)) for r in range(world)]
        steps = min(len(x) for x in ranks) // per
        return [sorted(i for r in range(world) for i in ranks[r][j * per : (j + 1) * per]) for j in range(steps)]

    one = global_batches(1)
    assert len(one) == 11 and sorted(i for b in one for i in b) == list(range(220))
    for world in (2, 4, 5):
        assert global_batches(world) == one, world


def test_elastic_resumes_on_another_world_size() -> None:
    sizes = Shards(np.array([30, 30, 30, 30]))
    full = list(ShardSampler(sizes, 1, 0, seed=1, elastic=True))
    old = [ShardSampler(sizes, 2, r, seed=1, elastic=True) for r in range(2)]
    seen = []
    for s in old:  # two ranks in lockstep, 13 samples each
        it = iter(s)
        seen += [next(it) for _ in range(13)]
    state = old[0].state_dict()
    assert state["consumed"] == 26
    new = [ShardSampler(sizes, 3, r, seed=1, elastic=True) for r in range(3)]
    for s in new:
        s.load_state_dict(state)
    rest = [list(s) for s in new]
    assert sorted(seen) == sorted(full[:26])
    assert len(rest[0]) == len(rest[1]) == len(rest[2]) == 32  # ceil(94 / 3): two padding samples
    interleaved = [rest[j % 3][j // 3] for j in range(94)]
    assert [x for pair in zip(seen[:13], seen[13:]) for x in pair] == full[:26]
    assert interleaved == full[26:]  # the same global order after the resume
