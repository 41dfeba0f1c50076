"""The tar walk of two source trees side by side: ``python tools/bench.py --only walk --trees A,B``.

One child process per tree (``PYTHONPATH=tree``) stays up, its walks ready; the parent asks them in turn
for one timed pass of one walk of one set, A then B, then B then A, for every walk and set, ``rounds``
times (each child warms the page cache and its imports first), so a change of the machine's load falls
on both trees alike; it keeps the best pass per tree and prints B's speed as a ratio of A's (> 1: B is
faster). The walks, one per cursor of the C walk: ``TarStream`` over local files (the file read with
``pread``), over ``pipe:cat`` (the pipe read with ``read``), the index tables of every shard
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
    """Serve timed passes: a line ``set walk`` on stdin, its seconds on stdout; ``ready`` once warm."""
    import tarindex

    _ = tarindex.TarStream  # imports torch before anything is timed
    walks = {name: _walks(paths) for name, paths in sets.items()}
    for by_walk in walks.values():
        for fn in by_walk.values():
            fn()  # warm
    print("ready", flush=True)
    for line in sys.stdin:
        name, walk = line.rstrip("\n").split(" ", 1)
        t0 = time.perf_counter()
        walks[name][walk]()
        print(time.perf_counter() - t0, flush=True)


def compare(trees: list[str], sets: dict[str, list[str]], rounds: int) -> list[tuple[str, float, str]]:
    """Rows ``(label, MB/s of the last tree, ratio to the first)``, best of ``rounds`` passes asked in turn."""
    procs = {
        tree: subprocess.Popen(
            [sys.executable, __file__, "--child", json.dumps(sets)],
            env={**os.environ, "PYTHONPATH": tree},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for tree in trees
    }
    best: dict[tuple[str, str, str], float] = {}
    try:
        for p in procs.values():
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        for r in range(rounds):
            for name in sets:
                for walk in WALKS:
                    for tree in trees if r % 2 == 0 else trees[::-1]:
                        p = procs[tree]
                        assert p.stdin is not None and p.stdout is not None
                        p.stdin.write(f"{name} {walk}\n")
                        p.stdin.flush()
                        seconds = float(p.stdout.readline())
                        best[tree, name, walk] = min(best.get((tree, name, walk), float("inf")), seconds)
    finally:
        for p in procs.values():
            if p.stdin is not None:
                p.stdin.close()
            p.wait()
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
