"""Batches from local shards, two checkouts A/B: ``__getitems__`` on a 1 ms-per-read mount, from a cold local
disk through ``DataLoader``, and on a warm page cache (issue: shards on storage with latency).

Run: python tools/bench_batch.py A_TREE B_TREE [--dir bench-data] [--rounds 5] [--delay 0.001]

The 1 KB set's first 4 shards (``bench.py``'s ``small``), indexed once on the local disk and once through
``tests/_latencyfs.py`` (page cache on, ``delay`` per read). Each round runs, per tree (A then B, B then A in
odd rounds), one process per case; a case alternates its own passes with the physical limit measured in the
same process, and reports its best pass of each:

- ``mount``: 4 batches of ``ds.__getitems__(256 random)`` against the same ranges read by 64 threads with a
  bare ``os.pread``, the mount's page cache dropped before each pass (samples/s).
- ``cold``: ``DataLoader(batch_size=256, num_workers=2)`` over 16 random batches of the local shards, their
  page cache dropped before each pass, against 64 threads' ``pread`` of the same ranges (samples/s).
- ``warm``: 20,000 random samples on a warm cache: a ``ds[i]`` loop, 256-sample ``__getitems__`` and a bare
  one-thread ``os.pread`` loop over the same ranges (ns per sample).
- ``seq``: ``TarStream`` of one shard through the mount and ``build_index(workers=1)`` of it, against 8
  threads reading it in 1 MiB blocks, the mount's page cache dropped before each pass (MB/s).
- ``warmseq``: the same on the local disk with a warm cache (MB/s).

The table gives per tree the median over rounds, and B/A as the median of the per-round quotients.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
TESTS = TOOLS.parent / "tests"
CHILD = r"""
import json, os, random, sys, time
from concurrent.futures import ThreadPoolExecutor
spec = json.loads(sys.argv[1])
sys.path.append(spec["tests"])
from _latencyfs import drop_cache
import tarindex

def ranges(ds, order, fds):
    rec = ds.index.decode()
    shard, offset, size = rec.shard.tolist(), rec.offset.tolist(), rec.size.tolist()
    return [(fds[shard[i]], size[i], offset[i]) for i in order]

def threaded(pool, rs, threads=64):
    def run(part):
        for fd, n, off in part:
            os.pread(fd, n, off)
    list(pool.map(run, [rs[k::threads] for k in range(threads)]))

def best(cases, rounds, cold):
    out = {}
    for _ in range(rounds):
        for name, fn in cases.items():
            if cold:
                drop_cache(cold)
            t0 = time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
            out[name] = min(out.get(name, dt), dt)
    return out

def identity(batch):
    return batch

ds = tarindex.TarDataset(spec["index"])
urls = list(ds.urls)
fds = [os.open(u, os.O_RDONLY) for u in urls]
rng = random.Random(0)
n = len(ds)
pool = ThreadPoolExecutor(64)
ds[0]
case = spec["case"]
if case == "mount" or case == "cold":
    nb = 4 if case == "mount" else 16
    batches = [[rng.randrange(n) for _ in range(256)] for _ in range(nb)]
    rs = [ranges(ds, b, fds) for b in batches]
    def getitems():
        for b in batches:
            ds.__getitems__(b)
    def loader():
        import torch.utils.data
        got = torch.utils.data.DataLoader(ds, batch_sampler=batches, num_workers=2, collate_fn=identity)
        assert sum(len(b) for b in got) == 256 * nb
    def threads():
        for r in rs:
            threaded(pool, r)
    if case == "cold":
        import torch.utils.data  # imported before anything is timed
    t = best({"batch": getitems if case == "mount" else loader, "threads": threads}, 2, urls)
    res = {k: 256 * nb / v for k, v in t.items()}
elif case in ("seq", "warmseq"):
    shard = urls[0]
    size = os.path.getsize(shard)
    out = os.path.join(spec["work"], "batch-seq.tarindex")
    def stream():
        for _ in tarindex.TarStream([shard]):
            pass
    def build():
        if os.path.exists(out):
            os.unlink(out)
        tarindex.build_index([shard], index=out, workers=1)
    def blocks():
        offs = list(range(0, size, 1 << 20))
        list(pool.map(lambda part: [os.pread(fds[0], 1 << 20, o) for o in part], [offs[k::8] for k in range(8)]))
    t = best({"stream": stream, "build": build, "blocks": blocks}, 3 if case == "seq" else 5, [shard] if case == "seq" else None)
    res = {k: size / v / 1e6 for k, v in t.items()}
else:
    order = [rng.randrange(n) for _ in range(20000)]
    rs = ranges(ds, order, fds)
    batches = [order[k:k + 256] for k in range(0, len(order), 256)]
    item = ds.__getitem__
    def items():
        for i in order:
            item(i)
    def getitems():
        for b in batches:
            ds.__getitems__(b)
    def preads():
        p = os.pread
        for fd, n_, off in rs:
            p(fd, n_, off)
    t = best({"item": items, "batch": getitems, "pread": preads}, 5, None)
    res = {k: v / len(order) * 1e9 for k, v in t.items()}
res["tree"] = tarindex.__file__
print(json.dumps(res))
"""


def _child(tree: str, spec: dict[str, str]) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=tree, OPENBLAS_NUM_THREADS="1")
    env.pop("TARINDEX_PURE_PYTHON", None)
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec)], env=env, cwd=tree, capture_output=True, text=True, check=True)
    got: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    where = got.pop("tree")
    if not Path(str(where)).resolve().is_relative_to(Path(tree).resolve()):
        raise RuntimeError(f"the child for {tree} imported {where}")
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--dir", default="bench-data", type=Path)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--delay", type=float, default=0.001)
    ap.add_argument("--cases", default="mount,cold,warm,seq,warmseq")
    args = ap.parse_args()
    sys.path.insert(0, str(TOOLS))
    sys.path.insert(0, str(TESTS))
    from _latencyfs import mount
    from bench import SPECS, make_set

    import tarindex

    n_shards, per, size = SPECS["small"]
    paths = make_set(args.dir / "small", "small", n_shards, per, size)[:4]
    work = (args.dir / "work").resolve()
    work.mkdir(parents=True, exist_ok=True)
    local = str(tarindex.build_index(paths, index=work / "batch-local.tarindex").path)
    mnt_dir = work / "batch-mnt"
    mnt_dir.mkdir(exist_ok=True)
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    print(f"load average {os.getloadavg()[0]:.2f}; A {args.a}; B {args.b}", flush=True)
    with mount(Path(paths[0]).resolve().parent, mnt_dir, delay=args.delay) as mnt:
        remote = str(tarindex.build_index(mnt.paths(paths), index=work / "batch-mnt.tarindex").path)
        specs = {"mount": remote, "cold": local, "warm": local, "seq": remote, "warmseq": local}
        for r in range(args.rounds):
            for case in args.cases.split(","):
                for tree in (args.a, args.b) if r % 2 == 0 else (args.b, args.a):
                    got = _child(tree, {"case": case, "index": specs[case], "tests": str(TESTS), "work": str(work)})
                    results.setdefault((case, tree), []).append(got)
    print("| case | A | B | B/A | B vs limit |\n|---|---|---|---|---|")
    limit = {"mount": "threads", "cold": "threads", "warm": "pread", "seq": "blocks", "warmseq": "blocks"}
    for case in args.cases.split(","):
        a, b = results[(case, args.a)], results[(case, args.b)]
        for key in a[0]:
            if key == limit[case]:
                continue
            med_a, med_b = statistics.median(x[key] for x in a), statistics.median(x[key] for x in b)
            quot = statistics.median(y[key] / x[key] for x, y in zip(a, b))
            vs = statistics.median(y[key] / y[limit[case]] for y in b)
            unit = {"warm": "ns/sample", "seq": "MB/s", "warmseq": "MB/s"}.get(case, "samples/s")
            print(f"| {case}: {key} ({unit}) | {med_a:,.1f} | {med_b:,.1f} | {quot:.3f} | {vs:.3f}x {limit[case]} |", flush=True)


if __name__ == "__main__":
    main()
