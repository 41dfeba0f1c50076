"""Run part of a TarStream epoch through torchdata's StatefulDataLoader, for the resume tests.

``python resume_run.py SPEC.json``: SPEC lists cases ``{"urls", "shuffle", "seed", "epoch",
"workers", "batch", "state_in" (a saved loader state, or a list of stream states with
"states": true), "stop" (batches, or null for the whole epoch), "state_out", "out"}``; each case
writes the keys of its batches (a JSON list of lists) to ``out`` and, when it stops early, the
loader's state to ``state_out``. Also imported by the tests, which run cases in their own process.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from torchdata.stateful_dataloader import StatefulDataLoader

import tarindex
from tarindex import TarStream


def keys_of(batch: list[dict[str, Any]]) -> list[str]:
    """The collation of these tests: the samples' keys (and shard names), nothing to pickle but strings."""
    return [f"{s['__url__'].rsplit('/', 1)[-1]}/{s['__key__']}" for s in batch]


def run_case(case: dict[str, Any]) -> list[list[str]]:
    stream = TarStream(case["urls"], shuffle=case.get("shuffle", 0), seed=case.get("seed", 0), epoch_size=case.get("epoch_size"))
    stream.set_epoch(case.get("epoch", 0))
    workers = case.get("workers", 0)
    loader = StatefulDataLoader(stream, batch_size=case.get("batch", 4), num_workers=workers, collate_fn=keys_of)
    state_in = case.get("state_in")
    if state_in is not None:
        with open(state_in) as f:
            saved = json.load(f)
        if case.get("states"):  # another number of workers: the stream takes every reader's state
            stream.load_state_dict(tarindex.stream_states(saved))
        else:
            loader.load_state_dict(saved)
    got: list[list[str]] = []
    stop = case.get("stop")
    for batch in loader:
        got.append(batch)
        if stop is not None and len(got) == stop:
            with open(case["state_out"], "w") as f:
                json.dump(loader.state_dict(), f)
            break
    if case.get("out"):
        with open(case["out"], "w") as f:
            json.dump(got, f)
    return got


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        for c in json.load(f):
            run_case(c)
