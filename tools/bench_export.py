"""``tarindex export`` of a 1M-sample index (``tools/bench.py --only export``; also part of ``--only pack``).

The command as a user runs it (a new process: imports included), in alternated rounds with its physical limit
in the same run: ``cp`` of the files it writes (the same bytes written, no index read). Per contender the best
and median wall time over the rounds and the child's CPU time (user + system); the ratio is export / ``cp``
per round (median), which a loaded machine slows alike; the same export with ``TARINDEX_PURE_PYTHON=1`` (the
lines made by the Python reference, ``export._dali_lines``) is the fourth contender. ``--wids`` writes one line per shard: its row is the
command's fixed cost (start, imports, the index's shard table).
"""

from __future__ import annotations

import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import tarindex

Row = tuple[str, float, str]


def _timed(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds (user + system) of one child process."""
    before, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env=env)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def bench_export(index: Path, work: Path, rounds: int = 5) -> list[Row]:
    """``export --dali`` and ``export --wids`` of ``index`` through the CLI, beside ``cp`` of the DALI files."""
    cli = [sys.executable, "-m", "tarindex.cli.main"] if not shutil.which("tarindex") else [str(shutil.which("tarindex"))]
    dali, copy, wids = work / "dali", work / "dali-copy", work / "export.json"
    n = len(tarindex.IndexReader(index))
    got: dict[str, list[tuple[float, float]]] = {"dali": [], "cp": [], "wids": [], "dali-python": []}
    commands = {
        "dali": [*cli, "export", "-q", "--dali", str(dali), str(index)],
        "cp": ["cp", "-r", str(dali), str(copy)],
        "wids": [*cli, "export", "-q", "--wids", str(wids), str(index)],
        "dali-python": [*cli, "export", "-q", "--dali", str(dali), str(index)],
    }
    env = {k: v for k, v in os.environ.items() if k != "TARINDEX_PURE_PYTHON"}
    envs = {name: env for name in commands} | {"dali-python": {**env, "TARINDEX_PURE_PYTHON": "1"}}
    subprocess.run(commands["dali"], check=True)  # warm: the index in the page cache, the files there for cp
    for r in range(rounds):
        for name in ("dali", "cp", "wids", "dali-python") if r % 2 == 0 else ("dali-python", "wids", "cp", "dali"):
            shutil.rmtree(copy, ignore_errors=True)
            got[name].append(_timed(commands[name], envs[name]))
    size = sum(p.stat().st_size for p in dali.iterdir())
    shutil.rmtree(dali, ignore_errors=True)
    shutil.rmtree(copy, ignore_errors=True)
    wids.unlink(missing_ok=True)

    def summary(name: str) -> tuple[float, float, float]:
        walls = [w for w, _ in got[name]]
        return min(walls), statistics.median(walls), min(c for _, c in got[name])

    quotient = statistics.median(d[0] / c[0] for d, c in zip(got["dali"], got["cp"]))
    d_best, d_med, d_cpu = summary("dali")
    c_best, c_med, _ = summary("cp")
    w_best, w_med, w_cpu = summary("wids")
    p_best, p_med, p_cpu = summary("dali-python")
    python = statistics.median(p[0] / d[0] for d, p in zip(got["dali"], got["dali-python"]))
    load = os.getloadavg()[0]
    return [
        (f"tarindex export --dali of a {n:,}-sample index, the command (s, best of {rounds})", d_best,
         f"target < 2 s; median {d_med:.2f} s; {d_cpu:.2f} s of CPU; {quotient:.1f}x cp of its {size / 1e6:,.0f} MB of files "
         f"({c_best:.2f} s, median {c_med:.2f}); load average {load:.1f}"),
        (f"the same with TARINDEX_PURE_PYTHON=1 (the lines made by the Python reference) (s, best of {rounds})", p_best,
         f"median {p_med:.2f} s; {p_cpu:.2f} s of CPU; {python:.2f}x the C formatter's wall time (median of the rounds' quotients)"),
        (f"tarindex export --wids of the same index, the command (s, best of {rounds})", w_best, f"median {w_med:.2f} s; {w_cpu:.2f} s of CPU"),
    ]  # fmt: skip
