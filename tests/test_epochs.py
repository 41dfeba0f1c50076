"""Epochs of TarStream and the samplers: epoch_size with a shuffle buffer, set_epoch under persistent workers."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch.utils.data

from conftest import make_shard_set
from tarindex import TarStream


@pytest.fixture(scope="module")
def shards320(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """8 shards of 40 samples: 320, the count of the report."""
    root = tmp_path_factory.mktemp("epochs")
    return [str(p) for p in make_shard_set(root / "data", n_shards=8, per=40)]


def _keys(stream: TarStream, workers: int = 0) -> list[str]:
    loader = torch.utils.data.DataLoader(stream, batch_size=None, num_workers=workers)
    return [s["__key__"] for s in loader]


@pytest.mark.parametrize("shuffle", [50, 1000])
@pytest.mark.parametrize(("world", "workers"), [(1, 0), (2, 2)])
def test_epoch_size_total_over_world_holds_every_sample_once(shards320: list[str], shuffle: int, world: int, workers: int) -> None:
    n = 320 // world  # the N docs/streaming.md recommends: total / world size
    seen: list[str] = []
    for rank in range(world):
        stream = TarStream(shards320, shuffle=shuffle, seed=1, epoch_size=n, rank=rank, world_size=world)
        got = _keys(stream, workers)
        assert len(got) == n
        assert len(set(got)) == n, f"rank {rank}: {n - len(set(got))} samples twice"
        seen += got
    assert Counter(seen) == Counter(s["__key__"] for s in TarStream(shards320))


def test_epoch_size_beyond_a_pass_finishes_the_pass_first(shards320: list[str]) -> None:
    got = _keys(TarStream(shards320[:2], shuffle=1000, seed=2, epoch_size=130))  # 80 samples, then 50 of a second pass
    assert len(set(got[:80])) == 80  # the whole first pass comes out before any sample again
    assert len(set(got[80:])) == 50 and set(got[80:]) <= set(got[:80])


def _orders(loader: torch.utils.data.DataLoader, epochs: int, set_epoch: object) -> list[list]:  # type: ignore[type-arg]
    out = []
    for epoch in range(epochs):
        set_epoch(epoch)  # type: ignore[operator]
        out.append([x for batch in loader for x in batch])
    return out


def test_set_epoch_reaches_persistent_workers(shards320: list[str]) -> None:
    def loader(persistent: bool) -> tuple[torch.utils.data.DataLoader, TarStream]:  # type: ignore[type-arg]
        stream = TarStream(shards320[:4], shuffle=20, seed=9).map(_key)
        return torch.utils.data.DataLoader(stream, batch_size=8, num_workers=2, persistent_workers=persistent), stream

    persistent, stream = loader(True)
    got = _orders(persistent, 3, stream.set_epoch)
    fresh, stream2 = loader(False)
    assert got == _orders(fresh, 3, stream2.set_epoch)  # what new workers each epoch would yield
    assert got[0] != got[1] != got[2] != got[0]
    assert all(sorted(o) == sorted(got[0]) for o in got)


def test_sampler_set_epoch_with_persistent_workers(tmp_path: Path, shards320: list[str]) -> None:
    from tarindex import ShardSampler, TarDataset, build_index

    ds = TarDataset(build_index(shards320[:3], index=tmp_path / "x.tarindex").path)

    def loader(persistent: bool) -> tuple[torch.utils.data.DataLoader, ShardSampler]:  # type: ignore[type-arg]
        sampler = ShardSampler(ds, num_replicas=1, rank=0, seed=4)
        return torch.utils.data.DataLoader(ds, sampler=sampler, batch_size=8, num_workers=2, persistent_workers=persistent, collate_fn=_keys_of), sampler

    persistent, sampler = loader(True)
    got = _orders(persistent, 3, sampler.set_epoch)
    fresh, sampler2 = loader(False)
    assert got == _orders(fresh, 3, sampler2.set_epoch)
    assert got[0] != got[1] != got[2] != got[0]


def _key(sample: dict) -> str:
    return str(sample["__key__"])


def _keys_of(batch: list[dict]) -> list[str]:
    return [s["__key__"] for s in batch]


def test_counter_based_draws_match_the_reference() -> None:
    from tarindex._epochs import Draws, _bits

    draws = Draws(0xDEADBEEF12345678)
    for step in (0, 1, 4095, 4096, 4097, 10_000, 3):  # block edges, and back to an earlier block
        assert draws.at(step) == _bits(0xDEADBEEF12345678, step)


@pytest.mark.parametrize(
    "cumulative",
    [
        [0.5, 0.5, 0.8, 1.7],  # a zero weight in the middle (four sources: the comparisons)
        [3.0],  # one source
        [0.0, 2.0],  # a source that left the draw
        [1.0, 1.0 + 1e-300],  # a weight too small to be drawn next to the other
        [1.0, 2.0, 2.0],  # a zero weight last
        [0.1, 0.3, 0.6, 1.0, 1.5, 2.1],  # six sources: the search
        [1e-300, 2e-300, 3e-300],  # tiny weights
    ],
)
def test_vectorised_picks_match_the_scalar_ones(cumulative: list[float]) -> None:
    from tarindex._epochs import Draws, pick

    draws = Draws(12345)
    want = [pick(draws, s, cumulative) for s in range(100, 5100)]
    assert Draws(12345).picks(100, 5000, cumulative).tolist() == want
    assert set(want) == {k for k, w in enumerate(np.diff([0.0, *cumulative])) if w > 0}  # every source with a weight is drawn
