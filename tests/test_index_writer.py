"""The index writer under an address-space limit (``ulimit -v``): the LMDB map is sized from the work and grown
as the file fills it, so a build works under a limit; a limit too small for the index is one error naming it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tarindex
from conftest import make_shard_set
from tarindex.index import writer
from tarindex.index.reader import IndexReader

ROOT = Path(__file__).resolve().parent.parent

_BUILD_UNDER_LIMIT = """
import resource, sys
import tarindex, tarindex.build, tarindex.dataset  # imported (mapped) before the limit: the limit is for the build
limit = int(sys.argv[1])
if limit < 0:  # that many bytes above what the process maps now
    with open("/proc/self/statm") as f:
        limit = int(f.read().split()[0]) * resource.getpagesize() - limit
resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))
try:
    report = tarindex.build_index(sys.argv[3:], index=sys.argv[2], workers=1)
    ds = tarindex.TarDataset(report.path)
    print("built", len(ds), ds[len(ds) - 1]["__key__"], "torch" in sys.modules)
except tarindex.TarIndexError as exc:
    print(type(exc).__name__, exc)
"""


def _build_under(limit: int, shards: list[Path], index: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OPENBLAS_NUM_THREADS": "1"}
    args = [sys.executable, "-c", _BUILD_UNDER_LIMIT, str(limit), str(index), *map(str, shards)]
    out = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def test_a_build_works_under_ulimit_v_8g(tmp_path: Path, impl: str) -> None:
    shards = make_shard_set(tmp_path / "d", n_shards=3, per=50)
    out = _build_under(8 << 30, shards, tmp_path / "d" / "train.tarindex")
    assert out == "built 150 s02i049 False", out  # (no torch imported by the build)


def test_a_limit_too_small_for_the_map_names_it(tmp_path: Path) -> None:
    shards = make_shard_set(tmp_path / "d", n_shards=1, per=5)
    index = tmp_path / "d" / "train.tarindex"
    out = _build_under(-(8 << 20), shards, index)  # 8 MiB more than the interpreter maps: too little for any map
    assert out.startswith(f"WriteError {index}: cannot write (the address-space limit (ulimit -v: "), out
    assert "MiB to map the index being written, which needs" in out and "raise it to at least" in out
    assert not index.exists() and not list(index.parent.glob(".train.tarindex*"))


def test_the_map_grows_as_the_index_fills_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shards = [str(p) for p in make_shard_set(tmp_path / "d", n_shards=6, per=2000)]
    whole = tarindex.build_index(shards, index=tmp_path / "d" / "whole.tarindex", workers=1).path
    monkeypatch.setattr(writer, "_MAP_FIRST", 64 << 10)  # a map far smaller than the index: grown several times
    monkeypatch.setattr(writer, "_MAP_SLACK", 16 << 10)
    monkeypatch.setattr(writer, "_COMMIT_BYTES", 16 << 10)
    sizes: list[int] = []
    grow = writer.IndexWriter._grow

    def counted(self: writer.IndexWriter, need: int) -> None:
        grow(self, need)
        sizes.append(self._map_size)

    monkeypatch.setattr(writer.IndexWriter, "_grow", counted)
    grown = tarindex.build_index(shards, index=tmp_path / "d" / "grown.tarindex", workers=1).path
    assert len(sizes) >= 2 and sizes == sorted(sizes) and sizes[-1] < whole.stat().st_size * 4
    x, y = IndexReader(whole).decode(), IndexReader(grown).decode()
    for name in ("shard", "offset", "size", "nmembers", "member_offset", "member_size"):
        assert np.array_equal(getattr(x, name), getattr(y, name)), name
    assert x.keys == y.keys
    ds = tarindex.TarDataset(grown)
    assert ds.get("s05i1999")["__index__"] == 11999 and ds[0]["__key__"] == "s00i000"
