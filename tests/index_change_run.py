"""Read an index while it is changed in place, for tests/test_index_change.py (run in a process of its own,
so a signal shows as the process dying of it).

``python index_change_run.py MODE CHANGE INDEX OTHER``: MODE ``thread`` (a reader thread beside the main
thread, which changes the file) or ``loader`` (torch DataLoader workers read; the main process changes
the file between batches); CHANGE ``truncate`` (to half its size), ``empty`` (to 0 bytes), ``cp`` (``cp
OTHER INDEX``), ``rsync`` (``rsync --inplace -I OTHER INDEX``) or ``touch`` (a new modification time, the
same bytes). Reads first stay in the first record block (blocks held before the change), then go
anywhere (blocks read for the first time after it); one in ten is a lookup by key. Each read is checked
against the shards as tarfile reads them and against the key sample ``i`` had when the index was opened.
Prints one JSON object: the outcomes before the change, after it, and those that began more than
``LATE`` seconds after it ended, less each process's first ``CHECK_EVERY`` of them (by then every
process checked the file again: it reads the clock every ``CHECK_EVERY`` reads).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tarfile
import threading
import time
from collections import Counter
from pathlib import Path

import tarindex
from tarindex.errors import IndexChangedError
from tarindex.index.reader import CHECK_EVERY, CHECK_SECONDS

LATE = 2 * CHECK_SECONDS + 0.1
FIRST_BLOCK = 4096


def oracle(shards: list[Path]) -> dict[tuple[str, str], dict[str, bytes]]:
    """``(shard name, key) -> {extension: bytes}`` as tarfile reads the shards."""
    out: dict[tuple[str, str], dict[str, bytes]] = {}
    for path in shards:
        with tarfile.open(path) as tf:
            for m in tf:
                if m.isfile():
                    key, ext = m.name.split(".", 1)
                    data = tf.extractfile(m)
                    assert data is not None
                    out.setdefault((path.name, key), {})[ext] = data.read()
    return out


class Probe:
    """One read of sample ``i`` (or of its key), judged: ``exact``, ``changed`` or what went wrong."""

    def __init__(self, ds: tarindex.TarDataset, keys: list[str], truth: dict[tuple[str, str], dict[str, bytes]]) -> None:
        self.ds, self.keys, self.truth = ds, keys, truth

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, i: int) -> tuple[float, str, int]:
        start, pid = time.monotonic(), os.getpid()
        try:
            s = self.ds.get(self.keys[i]) if i % 10 == 0 else self.ds[i]
        except IndexChangedError:
            return start, "changed", pid
        except Exception as exc:  # reported, and failed by the test
            return start, f"{type(exc).__name__}: {exc}", pid
        members = {k: v for k, v in s.items() if not k.startswith("__")}
        expected = self.truth.get((s["__url__"].rsplit("/", 1)[-1], s["__key__"]))
        if s["__key__"] != self.keys[i] or members != expected:
            return start, f"WRONG sample {i}: key {s['__key__']} (expected {self.keys[i]})", pid
        return start, "exact", pid


def change(kind: str, index: Path, other: Path) -> None:
    if kind == "truncate":
        os.truncate(index, index.stat().st_size // 2)
    elif kind == "empty":
        os.truncate(index, 0)
    elif kind == "cp":
        subprocess.run(["cp", str(other), str(index)], check=True)
    elif kind == "rsync":
        subprocess.run(["rsync", "--inplace", "-I", str(other), str(index)], check=True)
    elif kind == "touch":
        os.utime(index, ns=(time.time_ns(), time.time_ns()))
    else:
        raise ValueError(kind)


def order(rng: random.Random, n: int, before: int, after: int) -> list[int]:
    return [rng.randrange(min(n, FIRST_BLOCK)) for _ in range(before)] + [rng.randrange(n) for _ in range(after)]


Outcome = tuple[float, str, int]  # when the read began, what came of it, the process that read


def run_thread(probe: Probe, kind: str, index: Path, other: Path) -> tuple[list[Outcome], float, float]:
    outcomes: list[Outcome] = []
    anywhere = threading.Event()
    stop = threading.Event()

    def reader() -> None:
        rng = random.Random(0)
        n = len(probe)
        while not stop.is_set():
            outcomes.append(probe[rng.randrange(n if anywhere.is_set() else min(n, FIRST_BLOCK))])

    thread = threading.Thread(target=reader)
    thread.start()
    time.sleep(0.3)
    began = time.monotonic()
    change(kind, index, other)
    ended = time.monotonic()
    anywhere.set()
    time.sleep(LATE + 0.3)
    stop.set()
    thread.join()
    return outcomes, began, ended


def run_loader(probe: Probe, kind: str, index: Path, other: Path) -> tuple[list[Outcome], float, float]:
    from torch.utils.data import DataLoader

    indices = order(random.Random(0), len(probe), 640, 2000)
    loader = DataLoader(probe, sampler=indices, batch_size=16, num_workers=2, collate_fn=list, multiprocessing_context="fork")
    outcomes: list[Outcome] = []
    began = ended = 0.0
    for b, batch in enumerate(loader):
        outcomes += batch
        if b == 20:  # the workers have read (and prefetched) from the first block
            began = time.monotonic()
            change(kind, index, other)
            ended = time.monotonic()
        if b == 60:  # later reads: after every held block was due for a check
            time.sleep(LATE)
    return outcomes, began, ended


def main(argv: list[str]) -> None:
    mode, kind, index, other = argv[0], argv[1], Path(argv[2]), Path(argv[3])
    ds = tarindex.TarDataset(index)
    keys = [ds.index.key(i) for i in range(len(ds))]
    truth = oracle(sorted({ds.index.shard_path(s) for s in range(len(ds.index.shards))}))
    outcomes, began, ended = (run_thread if mode == "thread" else run_loader)(Probe(ds, keys, truth), kind, index, other)
    late: dict[int, list[str]] = {}
    for t, o, pid in sorted(outcomes):
        if t > ended + LATE:
            late.setdefault(pid, []).append(o)
    print(json.dumps({
        "before": Counter(o for t, o, _ in outcomes if t < began),
        "after": Counter(o for t, o, _ in outcomes if t >= began),
        "late": Counter(o for reads in late.values() for o in reads[CHECK_EVERY:]),
        "wrong": [o for _, o, _ in outcomes if o not in ("exact", "changed")][:5],
    }))  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1:])
