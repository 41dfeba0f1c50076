"""The tar walk of two source trees side by side: ``python tools/bench.py --only walk --trees A,B``.

Each round runs one child process per tree (``PYTHONPATH=tree``), alternating A, B, A, B, ...; a child
times every walk of every set once (after one untimed pass that warms the page cache and imports) and
prints its seconds; the parent keeps the best of the rounds per tree and prints B's speed as a ratio of
A's (> 1: B is faster). The walks, one per cursor of the C walk: ``TarStream`` over local files (the file
read with ``pread``), over ``pipe:cat`` (the pipe read with ``read``), the index tables of every shard
(``scan_shard``: the packer over a buffer), and ``iter_tar`` over each shard's bytes in memory (entries).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

WALKS = ("stream file", "stream pipe", "index tables", "entries")


def _walks(paths: list[str]) -> dict[str, Callable[[], object]]:
    import tarindex
    from tarindex.scan import scan_shard
    from tarindex.tar import iter_tar

    blobs = [Path(p).read_bytes() for p in paths]

    def entries() -> None:
        for p, blob in zip(paths, blobs, strict=True):
            for _ in iter_tar((blob,), p):
                pass

    return {
        "stream file": lambda: sum(1 for _ in tarindex.TarStream(paths)),
        "stream pipe": lambda: sum(1 for _ in tarindex.TarStream([f"pipe:cat {p}" for p in paths])),
        "index tables": lambda: [scan_shard(p) for p in paths],
        "entries": entries,
    }


def child(sets: dict[str, list[str]]) -> None:
    """One pass of every walk of every set, timed: a JSON object {set: {walk: seconds}} on stdout."""
    import tarindex

    _ = tarindex.TarStream  # imports torch before anything is timed
    out: dict[str, dict[str, float]] = {}
    for name, paths in sets.items():
        walks = _walks(paths)
        for fn in walks.values():
            fn()  # warm
        out[name] = {}
        for walk, fn in walks.items():
            t0 = time.perf_counter()
            fn()
            out[name][walk] = time.perf_counter() - t0
    print(json.dumps(out))


def compare(trees: list[str], sets: dict[str, list[str]], rounds: int) -> list[tuple[str, float, str]]:
    """Rows ``(label, MB/s of the last tree, ratio to the first)`` from ``rounds`` alternated rounds."""
    best: dict[tuple[str, str, str], float] = {}
    for _ in range(rounds):
        for tree in trees:
            env = {**os.environ, "PYTHONPATH": tree}
            got = subprocess.run(
                [sys.executable, __file__, "--child", json.dumps(sets)],
                env=env,
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            for name, times in json.loads(got.splitlines()[-1]).items():
                for walk, seconds in times.items():
                    key = (tree, name, walk)
                    best[key] = min(best.get(key, float("inf")), seconds)
    first, last = trees[0], trees[-1]
    rows = []
    for name, paths in sets.items():
        mb = sum(os.path.getsize(p) for p in paths) / 1e6
        for walk in WALKS:
            a, b = best[first, name, walk], best[last, name, walk]
            rows.append(
                (
                    f"{name}: {walk}, {Path(last).name} vs {Path(first).name} (MB/s, best of {rounds})",
                    mb / b,
                    f"{a / b:.3f}x ({mb / a:,.0f} MB/s before)",
                )
            )
    return rows


if __name__ == "__main__" and sys.argv[1:2] == ["--child"]:
    child(json.loads(sys.argv[2]))
