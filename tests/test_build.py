"""build_index: parts, shards dropped from the list, rebuilds with nothing changed."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import make_shard_set
from tarindex import CorruptArchiveError, build_index
from tarindex.build import parse_part
from tarindex.cli.main import main
from tarindex.index.reader import IndexReader


@pytest.fixture
def shards(tmp_path: Path) -> list[Path]:
    return make_shard_set(tmp_path / "data", n_shards=4, per=5)


def _shard_paths(index: Path) -> list[str]:
    reader = IndexReader(index)
    try:
        return [info.path for info in reader.shards]
    finally:
        reader.close()


def test_part_as_a_string_or_a_pair(shards: list[Path], tmp_path: Path) -> None:
    pattern = str(shards[0].parent / "train-*.tar")
    a = build_index(pattern, part="2/2", index=tmp_path / "a.tarindex")
    b = build_index(pattern, part=(2, 2), index=tmp_path / "b.tarindex")
    assert _shard_paths(a.path) == _shard_paths(b.path) == ["data/train-000002.tar", "data/train-000003.tar"]
    default = build_index(pattern, part="1/2")
    assert default.path == shards[0].parent / "train.part-1-of-2.tarindex"
    assert parse_part(" 3 / 4 ") == (3, 4)
    for bad, message in [("1-2", r"part '1-2': expected K/N, for example 1/4"), ("3/2", "part 3/2: K must be between 1 and N"),
                         ((0, 2), "part 0/2: K must be between 1 and N"), ((1.5, 2), r"expected \(K, N\) or 'K/N'")]:
        with pytest.raises(ValueError, match=message):
            build_index(pattern, part=bad, index=tmp_path / "bad.tarindex")  # type: ignore[arg-type]
    assert not (tmp_path / "bad.tarindex").exists()


def test_a_shard_left_out_of_the_list_is_dropped_with_a_warning(
    shards: list[Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    index = tmp_path / "train.tarindex"
    build_index([str(p) for p in shards], index=index)
    with caplog.at_level(logging.WARNING, logger="tarindex"):
        report = build_index([str(p) for p in shards[:3]], index=index)
    assert report.scanned == [] and len(report.reused) == 3
    assert _shard_paths(index) == [f"data/{p.name}" for p in shards[:3]]
    assert [r.getMessage() for r in caplog.records] == [
        f"{index}: shard data/train-000003.tar is no longer in the shard list; dropped from the index"
    ]
    caplog.clear()
    bad = tmp_path / "bad.tar"
    bad.write_bytes(b"not a tar archive" * 64)
    with caplog.at_level(logging.WARNING, logger="tarindex"), pytest.raises(CorruptArchiveError):
        build_index([str(bad)], index=index)  # a failed build keeps the index, and drops nothing
    assert caplog.records == [] and len(_shard_paths(index)) == 3
    result = CliRunner().invoke(main, ["build", str(shards[0]), "-o", str(index), "-q"])
    assert result.exit_code == 0, result.output
    assert f"tarindex: warning: {index}: shard data/train-000001.tar is no longer in the shard list" in result.stderr


def test_a_rebuild_with_nothing_changed_leaves_the_index_as_it_is(shards: list[Path], tmp_path: Path) -> None:
    index = tmp_path / "train.tarindex"
    paths = [str(p) for p in shards]
    build_index(paths, index=index)
    before = os.stat(index)
    report = build_index(paths, index=index)
    assert report.scanned == [] and report.reused == paths
    after = os.stat(index)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)  # not rewritten
    report = build_index(paths[::-1], index=index)  # the same shards in another order: a new index
    assert report.scanned == [] and _shard_paths(index) == [f"data/{p.name}" for p in shards[::-1]]
    assert os.stat(index).st_ino != before.st_ino
    build_index(paths, index=index)  # back to the first order
    rewritten = os.stat(index).st_ino
    mtime = os.stat(shards[1]).st_mtime_ns + 10**9
    os.utime(shards[1], ns=(mtime, mtime))  # the same bytes, a new mtime (a copy): not rescanned, recorded anew
    assert build_index(paths, index=index).scanned == []
    assert os.stat(index).st_ino != rewritten
    reader = IndexReader(index)
    assert reader.shards[1].mtime_ns == mtime
    reader.close()
    with open(shards[2], "r+b") as f:  # other bytes: rescanned
        f.seek(600)
        f.write(b"X")
    assert build_index(paths, index=index).scanned == [paths[2]]


def test_incremental_rebuild_reopening_the_previous_index_equals_a_fresh_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An incremental rebuild reopens the existing index as it takes shards from it (bounded memory at any
    size): with a reopening every 7 samples, the rebuilt index holds what a fresh build of the same shards holds."""
    import tarindex.build

    paths = make_shard_set(tmp_path / "data", n_shards=6, per=5)
    index = tmp_path / "data" / "i.tarindex"
    build_index([str(p) for p in paths], index=index, workers=1)
    with open(paths[3], "r+b") as f:  # other bytes in one shard: rescanned, the five others reused
        f.seek(600)
        f.write(b"X")
    monkeypatch.setattr(tarindex.build, "_REOPEN_SAMPLES", 7)
    report = build_index([str(p) for p in paths], index=index, workers=1)
    assert report.scanned == [str(paths[3])] and len(report.reused) == 5
    fresh = build_index([str(p) for p in paths], index=tmp_path / "data" / "fresh.tarindex", workers=1).path
    got, want = IndexReader(index), IndexReader(fresh)
    try:
        assert [i.path for i in got.shards] == [i.path for i in want.shards]
        a, b = got.decode(), want.decode()
        for field in ("shard", "offset", "size", "nmembers", "member_offset", "member_size"):
            assert getattr(a, field).tolist() == getattr(b, field).tolist(), field
        assert [got.exts[e] for e in a.member_ext] == [want.exts[e] for e in b.member_ext]
        assert [got.lookup(k) for k in ("s00i000", "s03i004", "s05i002")] == [want.lookup(k) for k in ("s00i000", "s03i004", "s05i002")]
    finally:
        got.close()
        want.close()


def test_progress_bar_on_a_terminal_shows_the_write_phase(shards: list[Path], tmp_path: Path) -> None:
    import pty
    import subprocess
    import sys

    primary, secondary = pty.openpty()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "COLUMNS": "100"}
    cmd = [sys.executable, "-m", "tarindex.cli.main", "build", str(shards[0].parent / "train-*.tar"), "-o", str(tmp_path / "t.tarindex"), "-w", "1"]
    proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=secondary, env=env, timeout=120)
    os.close(secondary)
    shown = b""
    while True:
        try:
            chunk = os.read(primary, 1 << 16)
        except OSError:  # the terminal's other end is closed and drained
            break
        if not chunk:
            break
        shown += chunk
    os.close(primary)
    assert proc.returncode == 0, shown
    assert b"scanning" in shown and b"writing index" in shown, shown
    assert b"4 shards scanned, 0 unchanged" in proc.stdout


def test_a_url_build_without_an_index_path_is_a_usage_error(shards: list[Path]) -> None:
    result = CliRunner().invoke(main, ["build", f"pipe:cat {shards[0]}"])
    assert result.exit_code == 2
    assert f"Error: pipe:cat {shards[0]}: URL shards need an index path: add -o INDEX" in result.stderr


def test_ctrl_c_exits_130_and_keeps_the_previous_index(shards: list[Path], tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys
    import time

    index = tmp_path / "train.tarindex"
    build_index([str(p) for p in shards], index=index)
    before = index.read_bytes()
    started = tmp_path / "started"
    slow = f"pipe:touch {started}; sleep 30; cat {shards[0]}"  # a shard that takes long to arrive
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tarindex.cli.main", "build", *map(str, shards), slow, "-o", str(index), "-w", "1"],
        stderr=subprocess.PIPE, env=env, start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while not started.exists() and time.monotonic() < deadline:  # the build is under way
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)  # as Ctrl-C does: the whole foreground process group
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert b"tarindex: interrupted; any previous index is unchanged" in err
    assert index.read_bytes() == before
