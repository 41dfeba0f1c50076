"""An index file changed in place under running readers (``truncate``, ``cp`` of another index, ``rsync
--inplace`` of a rebuilt one): every read is the sample as the index said when opened, or
``IndexChangedError``; never a signal, never another sample's bytes. Reader threads and DataLoader
workers, in both lanes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tarindex
from conftest import make_shard_set
from tarindex.errors import IndexChangedError
from tarindex.index.reader import IndexReader

ROOT = Path(__file__).resolve().parent.parent
RUN = Path(__file__).resolve().parent / "index_change_run.py"


@pytest.fixture(scope="module")
def indexes(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """``train.tarindex`` over 3 shards of 1,500 samples (2 record blocks), and ``other.tarindex`` beside it: the
    same directory rebuilt with a fourth shard first (every sample at another position)."""
    root = tmp_path_factory.mktemp("change")
    shards = make_shard_set(root, n_shards=4, per=1500)
    first = tarindex.build_index([str(p) for p in shards[1:]], index=root / "train.tarindex", workers=1).path
    other = tarindex.build_index([str(p) for p in shards], index=root / "other.tarindex", workers=1).path
    return first, other


def _run(mode: str, kind: str, indexes: tuple[Path, Path], tmp_path: Path) -> dict[str, dict[str, int]]:
    original, other = indexes
    index = original.with_name(f"run-{tmp_path.name}.tarindex")  # beside the shards: the index names them relatively
    index.write_bytes(original.read_bytes())
    try:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        out = subprocess.run([sys.executable, str(RUN), mode, kind, str(index), str(other)], capture_output=True, text=True, env=env, timeout=300)
    finally:
        index.unlink()
    assert out.returncode == 0, f"died with {out.returncode}: {out.stderr[-3000:]}"  # a signal: a negative code
    result: dict[str, dict[str, int]] = json.loads(out.stdout)
    return result


@pytest.mark.parametrize("kind", ["truncate", "empty", "cp", "rsync"])
@pytest.mark.parametrize("mode", ["thread", "loader"])
def test_a_file_changed_under_readers_is_index_changed_error_never_a_signal_or_other_bytes(
    indexes: tuple[Path, Path], tmp_path: Path, impl: str, mode: str, kind: str
) -> None:
    result = _run(mode, kind, indexes, tmp_path)
    assert result["wrong"] == [], result
    assert set(result["before"]) == {"exact"} and result["before"]["exact"] >= 20, result
    assert set(result["after"]) <= {"exact", "changed"} and result["after"].get("changed", 0) > 0, result
    assert set(result["late"]) == {"changed"}, result  # blocks held before the change too, once checked again


@pytest.mark.parametrize("mode", ["thread", "loader"])
def test_touch_is_not_a_change(indexes: tuple[Path, Path], tmp_path: Path, impl: str, mode: str) -> None:
    """A new modification time over the same bytes (the same build): reads go on."""
    result = _run(mode, "touch", indexes, tmp_path)
    assert result["wrong"] == [] and set(result["after"]) == {"exact"} and set(result["late"]) == {"exact"}, result


def _copy(original: Path, tmp_path: Path) -> Path:
    index = original.with_name(f"in-{tmp_path.name}.tarindex")
    index.write_bytes(original.read_bytes())
    return index


def test_the_error_names_the_file_and_what_changed(indexes: tuple[Path, Path], tmp_path: Path, impl: str) -> None:
    original, other = indexes
    index = _copy(original, tmp_path)
    try:
        ix = IndexReader(index)
        first = ix.build_id
        assert ix.key(0) == "s01i000"
        index.write_bytes(other.read_bytes())  # the same inode, another build
        with pytest.raises(IndexChangedError, match=rf"{index}: the index file changed since it was opened \(size \d+ -> \d+ bytes; build {first} -> \w+\); open it again") as info:
            ix.key(4096)  # a record block not read before
        assert info.value.path == str(index)
        with pytest.raises(IndexChangedError):  # from then on, for every read
            ix.lookup("s01i000")
        ds = tarindex.TarDataset(index)  # opened again: the new file
        assert len(ds) == 6000 and ds[0]["__key__"] == "s00i000" and ds.get("s00i001")["__index__"] == 1
        os.truncate(index, index.stat().st_size // 3)
        with pytest.raises(IndexChangedError, match=r"size \d+ -> \d+ bytes\); open it again"):
            ds[5000]
    finally:
        index.unlink()


def test_a_reader_holding_every_block_notices_the_change_within_the_check_interval(
    indexes: tuple[Path, Path], tmp_path: Path, impl: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    import tarindex.index.reader

    monkeypatch.setattr(tarindex.index.reader, "CHECK_SECONDS", 1.0)  # long enough to read before the next check, loaded or not
    original, other = indexes
    index = _copy(original, tmp_path)
    try:
        ds = tarindex.TarDataset(index)
        expected = [ds[i]["__key__"] for i in (0, 4096)]  # both record blocks held
        index.write_bytes(other.read_bytes())
        assert ds[0]["__key__"] == expected[0]  # before the next check: the index as opened, exactly
        time.sleep(1.2)
        reads = []
        with pytest.raises(IndexChangedError):  # at the first read after the interval that reads the clock
            for _ in range(tarindex.index.reader.CHECK_EVERY + 1):
                reads.append(ds[4096]["__key__"])
        assert set(reads) <= {expected[1]}
        with pytest.raises(IndexChangedError):  # and from then on, every read
            ds[0]
    finally:
        index.unlink()
