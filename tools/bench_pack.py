"""Making shards (``tools/bench.py --only pack``): ``tarindex pack`` beside the physical limit and the peers, in one run.

- a folder of the JPEG set's files (20,000 samples of .jpg/.cls/.json, ~1 GB, extracted once from the set's
  shards) packed into 20 plain shards with their index, beside ``tar -cf`` of the same folder (one sequential
  copy: the physical limit), litdata's ``optimize`` and Mosaic's ``MDSWriter`` writing the same files, in
  alternated rounds (best of ``--rounds``); litdata and Mosaic run where they are installed. They are not in the
  ``bench`` extra: mosaicml-streaming pins numpy below 2.2 and both pull a torchvision whose wheel is a CUDA build
  that does not load beside the CPU torch (and ``import streaming`` imports torchvision). The figures in
  docs/performance.md come from a separate virtual environment over this one's packages (a ``.pth`` naming them),
  ``pip install -c constraints.txt litdata mosaicml-streaming`` there, torchvision replaced by an empty stand-in
  package (``MDSWriter`` does not use it);
- the JPEG set's 20 shards resharded into 7 seekable zstd shards, beside ``tarindex compress`` of the same 20
  shards, both in one process and with a process per core;
- the 1 KB set (200,000 samples) shuffled into shards with 64 MB of memory: peak resident memory of the process;
- ``export --dali`` of a 1M-sample index (tools/bench_export.py).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from bench_export import bench_export

import tarindex

Row = tuple[str, float, str]


def folder_of(shards: list[str], root: Path) -> Path:
    """The shards' files extracted into one folder (made once)."""
    if root.is_dir():
        return root
    tmp = root.with_name(root.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for shard in shards:
        subprocess.run(["tar", "-xf", shard, "-C", str(tmp)], check=True)
    tmp.rename(root)
    return root


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _keys(folder: Path) -> list[str]:
    return sorted({name.split(".", 1)[0] for name in os.listdir(folder)})


def _litdata_sample(item: tuple[str, str]) -> dict[str, object]:
    folder, key = item
    base = os.path.join(folder, key)
    with open(base + ".jpg", "rb") as f:
        jpg = f.read()
    with open(base + ".cls", "rb") as f:
        cls = f.read()
    with open(base + ".json", "rb") as f:
        meta = f.read()
    return {"key": key, "jpg": jpg, "cls": cls, "json": meta}


def _litdata(folder: Path, out: Path, workers: int) -> Callable[[], None] | None:
    try:
        import litdata
    except ImportError:
        return None
    items = [(str(folder), k) for k in _keys(folder)]

    def run() -> None:
        litdata.optimize(fn=_litdata_sample, inputs=items, output_dir=str(out), chunk_bytes="64MB", num_workers=workers, mode="overwrite")

    return run


def _mosaic(folder: Path, out: Path) -> Callable[[], None] | None:
    try:
        from streaming import MDSWriter
    except ImportError:
        return None
    keys = _keys(folder)

    def run() -> None:
        with MDSWriter(out=str(out), columns={"key": "str", "jpg": "bytes", "cls": "bytes", "json": "bytes"}, size_limit="64mb") as writer:
            for key in keys:
                writer.write(_litdata_sample((str(folder), key)))

    return run


def bench_pack_folder(shards: list[str], work: Path, rounds: int) -> list[Row]:
    folder = folder_of(shards, work.parent / "jpeg-folder")
    n_samples = len(_keys(folder))
    out = work / "pack-folder"
    workers = os.cpu_count() or 1
    contenders: dict[str, Callable[[], object] | None] = {
        "tar -cf": lambda: subprocess.run(["tar", "-cf", str(out / "all.tar"), "-C", str(folder), "."], check=True),
        "tarindex pack": lambda: tarindex.pack(folder, str(out / "train-%06d.tar"), maxcount=math.ceil(n_samples / 20)),
        "litdata optimize": _litdata(folder, out, workers),
        "Mosaic MDSWriter": _mosaic(folder, out),
    }
    best: dict[str, float] = {}
    sizes: dict[str, int] = {}
    for _ in range(rounds):
        for name, run in contenders.items():
            if run is None:
                continue
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir(parents=True)
            t0 = time.perf_counter()
            run()
            best[name] = min(best.get(name, math.inf), time.perf_counter() - t0)
            sizes[name] = _du(out)
    shutil.rmtree(out, ignore_errors=True)
    t_tar, t_pack = best["tar -cf"], best["tarindex pack"]
    mb = sizes["tar -cf"] / 1e6
    rows: list[Row] = [
        (f"pack: folder of {n_samples:,} samples ({mb:,.0f} MB) -> 20 plain shards + index (s)", t_pack,
         f"{t_tar / t_pack:.2f}x the speed of tar -cf ({t_tar:.2f} s, the physical limit); target >= 0.5x"),
        ("pack: tar -cf of the same folder, one archive (s)", t_tar, f"{mb / t_tar:,.0f} MB/s"),
    ]  # fmt: skip
    for peer in ("litdata optimize", "Mosaic MDSWriter"):
        if peer in best:
            rows.append((f"pack: {peer} of the same files (s)", best[peer], f"tarindex pack {best[peer] / t_pack:.1f}x faster; target >= 5x; {sizes[peer] / 1e6:,.0f} MB written"))
        else:
            rows.append((f"pack: {peer} (not installed)", float("nan"), "install the bench extra to compare"))
    return rows


def _compress_all(shards: list[str], out: Path, workers: int) -> None:
    dsts = [str(out / (Path(s).name + ".zst")) for s in shards]
    if workers == 1:
        for s, d in zip(shards, dsts):
            tarindex.compress_shard(s, d)
        return
    with ProcessPoolExecutor(workers) as pool:
        list(pool.map(tarindex.compress_shard, shards, dsts))


def bench_reshard(shards: list[str], index: Path, work: Path, rounds: int) -> list[Row]:
    """``index``: the shards' index (pack reads them through it, as beside shards that have one)."""
    out = work / "reshard"
    n = len(tarindex.IndexReader(index))
    nbytes = sum(os.path.getsize(s) for s in shards)
    best: dict[str, float] = {}
    workers = os.cpu_count() or 1
    for _ in range(rounds):
        for w in (1, workers):
            for name, run in (
                (f"pack {w}", lambda w=w: tarindex.pack(index, str(out / "r-%06d.tar.zst"), maxcount=math.ceil(n / 7), workers=w)),
                (f"compress {w}", lambda w=w: _compress_all(shards, out, w)),
            ):
                shutil.rmtree(out, ignore_errors=True)
                out.mkdir(parents=True)
                t0 = time.perf_counter()
                run()
                best[name] = min(best.get(name, math.inf), time.perf_counter() - t0)
    shutil.rmtree(out, ignore_errors=True)
    rows: list[Row] = []
    for w in sorted({1, workers}):
        p, c = best[f"pack {w}"], best[f"compress {w}"]
        rows.append((
            f"reshard {len(shards)} shards ({nbytes / 1e6:,.0f} MB) -> 7 seekable zstd shards, {w} process(es) (s)", p,
            f"{c / p:.2f}x the speed of tarindex compress of the same shards ({c:.2f} s); target >= 0.7x",
        ))  # fmt: skip
    return rows


_SHUFFLE = """
import json, sys, time, tarindex, tarindex.packing

def high_water():  # peak resident memory of this process (VmHWM starts anew at exec; ru_maxrss does not)
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))

base = high_water()
t0 = time.perf_counter()
report = tarindex.pack(sys.argv[1:-2], sys.argv[-2], shuffle=True, memory=int(sys.argv[-1]), workers=1, maxcount=10000)
print(json.dumps({"seconds": time.perf_counter() - t0, "base": base, "peak": high_water(), "samples": report.samples, "bytes": report.bytes}))
"""


def bench_shuffle(shards: list[str], work: Path, memory: int = 64 << 20) -> list[Row]:
    out = work / "shuffle"
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", _SHUFFLE, *shards, str(out / "s-%06d.tar"), str(memory)], env=env, check=True, capture_output=True, text=True)
    got = json.loads(done.stdout.strip().splitlines()[-1])
    shutil.rmtree(out, ignore_errors=True)
    peak = got["peak"] / 2**20
    return [
        (f"external shuffle of {got['samples']:,} samples ({got['bytes'] / 1e6:,.0f} MB), memory={memory >> 20} MiB: peak RSS (MiB)", peak,
         f"{peak / (memory >> 20):.2f}x the bound (the interpreter and imports alone: {got['base'] / 2**20:.0f} MiB); target <= 2x; {got['seconds']:.1f} s"),
    ]  # fmt: skip


def bench_pack(jpeg: list[str], small: list[str], jpeg_index: Path, scaled_index: Path, work: Path, rounds: int = 3) -> Iterator[Row]:
    """Every measurement of this module (see its docstring), each part's rows as soon as they are measured."""
    for shard in jpeg[:1]:
        with tarfile.open(shard) as tf:
            assert {m.name.split(".", 1)[1] for m in tf} == {"jpg", "cls", "json"}
    yield from bench_export(scaled_index, work)
    yield from bench_shuffle(small, work)
    yield from bench_reshard(jpeg, jpeg_index, work, rounds)
    yield from bench_pack_folder(jpeg, work, rounds)
