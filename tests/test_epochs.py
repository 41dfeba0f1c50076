"""Epochs of TarStream and the samplers: epoch_size with a shuffle buffer, set_epoch under persistent workers."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

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
