"""Run under torchrun (gloo, CPU) by tests/test_torchrun.py: each rank reads a real TarDataset through
``DataLoader(num_workers=2)`` with DistributedSampler and with ShardSampler, and writes the keys it saw.

Usage: torchrun --standalone --nproc_per_node=2 tests/torchrun_sampling.py INDEX OUT_DIR full|resume

``full``: an uninterrupted epoch with each sampler, then a ShardSampler epoch that stops after
``STOP_BATCHES`` batches and saves its state (the process then exits: the interruption); the same with a
shuffled ``TarStream`` of the index's shards through ``StatefulDataLoader`` (its state saved).
``resume``: a fresh process loads those states and finishes the epochs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

from tarindex import ShardSampler, TarDataset, TarStream

__all__: list[str] = []

EPOCH, SEED, BATCH, STOP_BATCHES = 1, 5, 4, 3


def key_of(sample: dict[str, Any]) -> str:
    return str(sample["__key__"])


def keys(ds: TarDataset, sampler: Any, stop: int | None = None) -> list[str]:
    loader = DataLoader(ds, sampler=sampler, batch_size=BATCH, num_workers=2, collate_fn=list)
    out: list[str] = []
    for step, batch in enumerate(loader):
        if stop is not None and step == stop:
            break
        out += batch
    return out


def stream_keys(index: str, state: Path, mode: str) -> list[str]:
    """A shuffled TarStream epoch through StatefulDataLoader(num_workers=2): whole ("full"), its first
    ``STOP_BATCHES`` batches with the loader state saved ("first"), or the rest from that state ("resume")."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    stream = TarStream(index, shuffle=8, seed=SEED).map(key_of)
    stream.set_epoch(EPOCH)
    loader = StatefulDataLoader(stream, batch_size=BATCH, num_workers=2, collate_fn=list)
    if mode == "resume":
        loader.load_state_dict(json.loads(state.read_text()))
    out: list[str] = []
    for step, batch in enumerate(loader):
        out += batch
        if mode == "first" and step + 1 == STOP_BATCHES:
            state.write_text(json.dumps(loader.state_dict()))
            break
    return out


def main() -> None:
    index, out_dir, mode = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ds = TarDataset(index, transform=key_of)
    result: dict[str, Any] = {"rank": rank, "world": world}
    state_file = out_dir / f"state-rank{rank}.json"
    if mode == "full":
        dsamp = DistributedSampler(ds, shuffle=True, seed=SEED)
        dsamp.set_epoch(EPOCH)
        result["distributed"] = keys(ds, dsamp)
        ssamp = ShardSampler(ds, seed=SEED)  # rank and world size from torch.distributed
        ssamp.set_epoch(EPOCH)
        result["shard_len"] = len(ssamp)
        result["shard"] = keys(ds, ssamp)
        first = ShardSampler(ds, seed=SEED)
        first.set_epoch(EPOCH)
        result["shard_first"] = keys(ds, first, stop=STOP_BATCHES)
        result["handed_out"] = first.state_dict()["consumed"]  # ahead of the loop: DataLoader prefetch
        state_file.write_text(json.dumps(first.state_dict(consumed=len(result["shard_first"]))))
        result["stream"] = stream_keys(index, out_dir / f"stream-rank{rank}.json", "full")
        result["stream_first"] = stream_keys(index, out_dir / f"stream-rank{rank}.json", "first")
    else:
        resumed = ShardSampler(ds, seed=SEED)
        resumed.load_state_dict(json.loads(state_file.read_text()))
        resumed.set_epoch(EPOCH)
        result["shard_rest"] = keys(ds, resumed)
        result["stream_rest"] = stream_keys(index, out_dir / f"stream-rank{rank}.json", "resume")
    lengths: list[Any] = [None] * world
    dist.all_gather_object(lengths, {k: len(v) for k, v in result.items() if isinstance(v, list)})
    result["all_lengths"] = lengths
    (out_dir / f"{mode}-rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
