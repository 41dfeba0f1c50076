"""verify_index: sizes, fingerprints and (deep) tables of every shard against its index."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

import tarindex
from conftest import make_shard_set
from tarindex import VerifyReport, build_index, verify_index


def _built(tmp_path: Path) -> tuple[list[Path], Path]:
    paths = make_shard_set(tmp_path / "data", n_shards=3, per=4)
    return paths, build_index([str(p) for p in paths], workers=1).path


def test_unchanged_shards_pass(tmp_path: Path) -> None:
    paths, index = _built(tmp_path)
    report = verify_index(index)
    assert report == VerifyReport(index, tuple(str(p) for p in paths), False)
    assert str(report) == f"{index}: 3 shards ok"
    assert str(verify_index(str(index), deep=True)) == f"{index}: 3 shards ok (deep)"


def test_grown_shard_is_stale(tmp_path: Path) -> None:
    paths, index = _built(tmp_path)
    with open(paths[2], "ab") as f:
        f.write(bytes(512))
    size = paths[2].stat().st_size
    with pytest.raises(tarindex.StaleIndexError, match=f"{paths[2]}: .*size {size - 512} -> {size}") as info:
        verify_index(index)
    assert info.value.path == str(paths[2])


def test_same_size_other_content_is_stale(tmp_path: Path) -> None:
    paths, index = _built(tmp_path)
    data = bytearray(paths[0].read_bytes())
    data[600] ^= 1  # inside the first member's data, within the fingerprinted head
    paths[0].write_bytes(bytes(data))
    with pytest.raises(tarindex.StaleIndexError, match=f"{paths[0]}: .*content fingerprint differs"):
        verify_index(index)


def test_missing_shard(tmp_path: Path) -> None:
    paths, index = _built(tmp_path)
    paths[1].unlink()
    with pytest.raises(tarindex.ShardNotFoundError, match=f"{paths[1]}: shard named by {index} is missing"):
        verify_index(index)


def _tar(path: Path, middle: str) -> Path:
    """Large first and last members (the fingerprinted head and tail) around a small member named ``middle``."""
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tf:
        for name, data in [("a.bin", bytes(80_000)), (middle, b"m"), ("z.bin", bytes(80_000))]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def test_deep_finds_changed_tables_that_the_fingerprint_misses(tmp_path: Path) -> None:
    shard = _tar(tmp_path / "one.tar", "k1.txt")
    index = build_index([str(shard)], workers=1).path
    before = shard.read_bytes()
    _tar(shard, "k2.txt")  # same size, same head and tail: only the middle header differs
    assert len(shard.read_bytes()) == len(before) and shard.read_bytes() != before
    assert verify_index(index).shards == (str(shard),)
    with pytest.raises(tarindex.StaleIndexError, match=rf"{shard}: .*a rescan differs from the index: sample 1 \('k1'\) at offset 80896: key 'k2' in the shard, 'k1' in the index"):
        verify_index(index, deep=True)


def test_not_an_index(tmp_path: Path) -> None:
    with pytest.raises(tarindex.IndexNotFoundError, match="no index here"):
        verify_index(tmp_path / "none.tarindex")


def test_progress_counts_each_shard_and_the_bytes_read_in_full(tmp_path: Path) -> None:
    shards = make_shard_set(tmp_path, 3)
    index = build_index([str(p) for p in shards]).path
    calls: list[tuple[int, int]] = []
    verify_index(index, progress=lambda n, b: calls.append((n, b)))
    assert calls == [(1, 0)] * 3  # fingerprints: no shard read in full
    calls.clear()
    verify_index(index, deep=True, progress=lambda n, b: calls.append((n, b)))
    assert calls == [(1, p.stat().st_size) for p in shards]  # rescanned: each shard's bytes
    assert str(verify_index(index, deep=True)) == f"{index}: 3 shards ok (deep)"
    one = build_index([str(shards[0])], index=tmp_path / "one.tarindex").path
    assert str(verify_index(one)) == f"{one}: 1 shard ok"


def test_the_command_checks_the_shards_named_and_only_them(tmp_path: Path, impl: str) -> None:
    """``tarindex verify d/train-000002.tar`` checks that shard (and says 1 shard), not every shard of the
    index beside it: a damaged shard not named does not fail it; naming it, or the index, does."""
    from click.testing import CliRunner

    from tarindex.cli.main import main

    paths = make_shard_set(tmp_path, n_shards=3, per=4)
    build_index(paths, workers=1)
    paths[0].write_bytes(paths[0].read_bytes()[:2048])
    for deep in ([], ["--deep"]):
        result = CliRunner().invoke(main, ["verify", str(paths[2]), *deep])
        assert result.exit_code == 0 and result.output.endswith(": 1 shard ok" + (" (deep)\n" if deep else "\n")), result.output
        result = CliRunner().invoke(main, ["verify", str(tmp_path / "train-{000001..000002}.tar"), *deep])
        assert result.exit_code == 0 and result.output.endswith(": 2 shards ok" + (" (deep)\n" if deep else "\n")), result.output
        for named in (str(tmp_path / "train-*.tar"), str(tmp_path / "train.tarindex")):
            result = CliRunner().invoke(main, ["verify", named, *deep])
            assert result.exit_code == 1 and f"{paths[0]}: shard changed since it was indexed (size" in result.output, result.output
