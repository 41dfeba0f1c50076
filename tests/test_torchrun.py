"""Two real ranks under ``torchrun --standalone --nproc_per_node=2`` (gloo on CPU), DataLoader workers,
a real TarDataset: DistributedSampler and ShardSampler split the data exactly; an interrupted and resumed
ShardSampler epoch (separate processes) equals an uninterrupted one; the state also resumes on one rank."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import tarindex
from tarindex import ShardSampler, TarDataset

SCRIPT = Path(__file__).with_name("torchrun_sampling.py")


def torchrun(index: Path, out: Path, mode: str) -> list[dict[str, Any]]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    result = subprocess.run(
        [*cmd, str(SCRIPT), str(index), str(out), mode],
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return [json.loads((out / f"{mode}-rank{r}.json").read_text()) for r in range(2)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]], list[dict[str, Any]]]:
    from conftest import make_shard_set

    root = tmp_path_factory.mktemp("torchrun")
    paths = make_shard_set(root / "data", n_shards=8, per=12)  # 96 samples, 48 per rank, 12 batches of 4
    index = tarindex.build_index([str(p) for p in paths]).path
    out = root / "out"
    out.mkdir()
    full = torchrun(index, out, "full")
    rest = torchrun(index, out, "resume")
    return out, full, rest


def test_ranks_disjoint_and_complete(runs: tuple[Path, list[dict[str, Any]], list[dict[str, Any]]]) -> None:
    out, full, _ = runs
    all_keys = sorted(TarDataset(next(out.parent.glob("data/*.tarindex"))).keys())
    assert [r["rank"] for r in full] == [0, 1] and {r["world"] for r in full} == {2}
    for sampler in ("distributed", "shard"):
        a, b = (r[sampler] for r in full)
        assert len(a) == len(b) == 48
        assert not set(a) & set(b)
        assert sorted(a + b) == all_keys
    assert [r["shard_len"] for r in full] == [48, 48]
    assert full[0]["all_lengths"] == full[1]["all_lengths"]  # gathered over gloo


def test_interrupted_and_resumed_equals_uninterrupted(
    runs: tuple[Path, list[dict[str, Any]], list[dict[str, Any]]],
) -> None:
    _, full, rest = runs
    for f, r in zip(full, rest):
        assert len(f["shard_first"]) == 12
        assert f["handed_out"] > 12  # the DataLoader fetched ahead of the loop: count what the loop consumed
        assert f["shard_first"] + r["shard_rest"] == f["shard"]


def test_two_rank_state_resumes_on_one_rank(runs: tuple[Path, list[dict[str, Any]], list[dict[str, Any]]]) -> None:
    out, full, _ = runs
    ds = TarDataset(next(out.parent.glob("data/*.tarindex")))
    sampler = ShardSampler(ds, 1, 0, seed=5)
    sampler.load_state_dict(json.loads((out / "state-rank0.json").read_text()))
    rest = [ds.index.key(i) for i in sampler]
    first = full[0]["shard_first"] + full[1]["shard_first"]
    assert len(rest) == 96 - 24
    assert sorted(first + rest) == sorted(ds.keys())


def test_stream_resumes_under_torchrun(runs: tuple[Path, list[dict[str, Any]], list[dict[str, Any]]]) -> None:
    """A shuffled TarStream through StatefulDataLoader(num_workers=2) on 2 ranks, stopped after 3 batches and
    resumed in fresh processes: each rank's rest equals its uninterrupted epoch's; the ranks cover every
    sample once. Both ranks' states also finish the epoch on one rank (another world size)."""
    out, full, rest = runs
    ds = TarDataset(next(out.parent.glob("data/*.tarindex")))
    for f, r in zip(full, rest):
        assert len(f["stream_first"]) == 12
        assert f["stream_first"] + r["stream_rest"] == f["stream"]
    assert sorted(full[0]["stream"] + full[1]["stream"]) == sorted(ds.keys())
    states = tarindex.stream_states([json.loads((out / f"stream-rank{r}.json").read_text()) for r in range(2)])
    assert len(states) == 4  # 2 ranks x 2 workers
    one = tarindex.TarStream(ds.index_path, shuffle=8, seed=5, rank=0, world_size=1)
    one.load_state_dict(states)
    finished = [s["__key__"] for s in one]
    assert sorted(full[0]["stream_first"] + full[1]["stream_first"] + finished) == sorted(ds.keys())
