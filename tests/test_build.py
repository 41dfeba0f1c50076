"""build_index: parts, shards dropped from the list, rebuilds with nothing changed."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

import tarindex
import tarindex.scan
from conftest import gnu_tar, make_shard_set, on_terminal
from tarindex import CorruptArchiveError, OverwriteError, build_index
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


def test_a_shard_left_out_of_the_list_is_dropped_only_when_asked_with_a_warning(
    shards: list[Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    index = tmp_path / "train.tarindex"
    build_index([str(p) for p in shards], index=index)
    before = index.read_bytes()
    with pytest.raises(OverwriteError, match=re.escape(
        f"{index}: holds 1 shard this build was not given (data/train-000003.tar); building would drop it from the index. "
        f"To index only the shards given, write another index (-o, e.g. -o {tmp_path / 'val.tarindex'}); "
        "to drop it, pass --drop-unlisted (drop_unlisted=True)"
    )):  # fmt: skip
        build_index([str(p) for p in shards[:3]], index=index)
    assert index.read_bytes() == before
    with caplog.at_level(logging.WARNING, logger="tarindex"):
        report = build_index([str(p) for p in shards[:3]], index=index, drop_unlisted=True)
    assert report.scanned == [] and len(report.reused) == 3
    assert _shard_paths(index) == [f"data/{p.name}" for p in shards[:3]]
    assert [r.getMessage() for r in caplog.records] == [
        f"{index}: shard data/train-000003.tar is no longer in the shard list; dropped from the index"
    ]
    caplog.clear()
    bad = tmp_path / "bad.tar"
    bad.write_bytes(b"not a tar archive" * 64)
    with caplog.at_level(logging.WARNING, logger="tarindex"), pytest.raises(CorruptArchiveError):
        build_index([str(bad)], index=index, drop_unlisted=True)  # a failed build keeps the index, and drops nothing
    assert caplog.records == [] and len(_shard_paths(index)) == 3
    refused = CliRunner().invoke(main, ["build", str(shards[0]), "-o", str(index), "-q"])
    assert refused.exit_code == 1 and refused.stderr.count("\n") == 1, refused.output
    assert refused.stderr.startswith(f"tarindex: error: {index}: holds 2 shards this build was not given (data/train-000001.tar, ")
    assert "pass --drop-unlisted" in refused.stderr and len(_shard_paths(index)) == 3
    result = CliRunner().invoke(main, ["build", str(shards[0]), "-o", str(index), "-q", "--drop-unlisted"])
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
    code, out, shown = on_terminal("build", str(shards[0].parent / "train-*.tar"), "-o", str(tmp_path / "t.tarindex"), "-w", "1")
    assert code == 0, shown
    assert b"scanning" in shown and b"writing index" in shown, shown
    assert b"4 shards scanned, 0 unchanged" in out


def test_a_url_build_without_an_index_path_is_a_usage_error(shards: list[Path]) -> None:
    result = CliRunner().invoke(main, ["build", f"pipe:cat {shards[0]}"])
    assert result.exit_code == 2
    assert f"Error: pipe:cat {shards[0]}: URL shards need an index path: add -o INDEX" in result.stderr


def _sigint_default() -> None:
    """In a CLI child: SIGINT's default action, as a terminal's foreground job has it (a suite started in the
    background, ``pytest &``, hands its children SIGINT ignored, and the build would never see the Ctrl-C)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_exits_130_and_keeps_the_previous_index(shards: list[Path], tmp_path: Path) -> None:
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
        stderr=subprocess.PIPE, env=env, start_new_session=True, preexec_fn=_sigint_default,
    )
    deadline = time.monotonic() + 60
    while not started.exists() and time.monotonic() < deadline:  # the build is under way
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)  # as Ctrl-C does: the whole foreground process group
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert b"tarindex: interrupted; any previous index is unchanged" in err
    assert index.read_bytes() == before


# -- what a build may replace ---------------------------------------------------------------------
def _one_line(result: object, start: str) -> str:
    err = result.stderr  # type: ignore[attr-defined]
    assert result.exit_code == 1 and err.count("\n") == 1 and err.startswith(f"tarindex: error: {start}"), err  # type: ignore[attr-defined]
    return str(err)


def test_an_output_that_is_not_an_index_is_never_overwritten(shards: list[Path], tmp_path: Path) -> None:
    """``-o`` naming a shard (a typo), a text file, another program's LMDB database, a directory: refused in one
    line, the file untouched; by build and merge, from the CLI and the API alike."""
    import lmdb

    from tarindex import merge_indexes

    runner = CliRunner()
    d = shards[0].parent
    shard = shards[2]
    kept = shard.read_bytes()
    err = _one_line(runner.invoke(main, ["build", str(d / "train-00000[01].tar"), "-o", str(shard)]), f"{shard}: ")
    assert "is one of the shards to index" not in err and "exists and is not a tarindex index (a tar shard); refusing to overwrite it" in err
    err = _one_line(runner.invoke(main, ["build", str(d / "train-00000[012].tar"), "-o", str(shard)]), f"{shard}: ")
    assert "is one of the shards to index; refusing to write the index over it" in err
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes")
    _one_line(runner.invoke(main, ["build", str(shards[0]), "-o", str(notes)]), f"{notes}: exists and is not a tarindex index (a file of 8 bytes)")
    part = build_index([str(shards[0])], index=tmp_path / "a.tarindex").path
    _one_line(runner.invoke(main, ["merge", str(part), "-o", str(shard)]), f"{shard}: exists and is not a tarindex index (a tar shard)")
    _one_line(runner.invoke(main, ["merge", str(part), "-o", str(notes)]), f"{notes}: exists and is not a tarindex index")
    other = tmp_path / "other.mdb"
    env = lmdb.open(str(other), subdir=False)
    with env.begin(write=True) as txn:
        txn.put(b"meta", b'{"magic": "something else"}')
    env.close()
    with pytest.raises(OverwriteError, match=re.escape(f"{other}: exists and is not a tarindex index (an LMDB database without a tarindex meta)")):
        build_index([str(shards[0])], index=other)
    with pytest.raises(OverwriteError, match=re.escape(f"{tmp_path}: exists and is not a tarindex index (a directory)")):
        merge_indexes([part], tmp_path)
    assert shard.read_bytes() == kept and notes.read_text() == "my notes" and IndexReader(part).n_samples == 5
    empty = tmp_path / "empty.tarindex"
    empty.touch()  # nothing to lose: written
    assert build_index([str(shards[0])], index=empty).path == empty and IndexReader(empty).n_samples == 5
    truncated = tmp_path / "truncated.tarindex"
    truncated.write_bytes(empty.read_bytes()[:4096])  # a damaged index: rebuilding it is the fix
    assert IndexReader(build_index([str(shards[0])], index=truncated).path).n_samples == 5


def test_building_a_subset_never_replaces_the_sets_index(shards: list[Path], tmp_path: Path) -> None:
    """``build 'd/train-{000002..000003}.tar'`` beside ``d/train.tarindex`` of 4 shards: refused, naming the count and
    the flags; with ``-o`` another index; a grown list adds; a shard deleted from disk needs ``--drop-unlisted``."""
    runner = CliRunner()
    d = shards[0].parent
    index = build_index(str(d / "train-*.tar")).path
    before = index.read_bytes()
    err = _one_line(runner.invoke(main, ["build", str(d / "train-{000002..000003}.tar"), "-q"]), f"{index}: holds 2 shards this build was not given ")
    assert f"(train-000000.tar, train-000001.tar); building would drop them from the index. To index only the shards given, write another index (-o, e.g. -o {d / 'val.tarindex'}); to drop them, pass --drop-unlisted (drop_unlisted=True)" in err
    assert index.read_bytes() == before
    val = runner.invoke(main, ["build", str(d / "train-{000002..000003}.tar"), "-o", str(d / "val.tarindex"), "-q"])
    assert val.exit_code == 0 and index.read_bytes() == before and _shard_paths(d / "val.tarindex") == ["train-000002.tar", "train-000003.tar"]
    grown = make_shard_set(tmp_path / "more", n_shards=5, per=5)[4]
    os.rename(grown, d / "train-000004.tar")
    report = build_index(str(d / "train-*.tar"))
    assert report.scanned == [str(d / "train-000004.tar")] and len(report.reused) == 4
    before = index.read_bytes()
    shards[1].unlink()  # deleted from disk: the glob no longer matches it
    with pytest.raises(OverwriteError, match=re.escape(f"{index}: holds 1 shard this build was not given (train-000001.tar; it no longer exists)")):
        build_index(str(d / "train-*.tar"))
    assert index.read_bytes() == before
    dropped = runner.invoke(main, ["build", str(d / "train-*.tar"), "--drop-unlisted", "-q"])
    assert dropped.exit_code == 0 and _shard_paths(index) == [f"train-00000{k}.tar" for k in (0, 2, 3, 4)]


def test_parts_of_a_grown_list_move_shards_between_parts_freely(tmp_path: Path) -> None:
    """``--part K/N`` compares with the whole list: a shard that moved to another part is not a drop; the parts
    merge into the index a whole build makes."""
    paths = make_shard_set(tmp_path / "d", n_shards=6, per=3)
    first = [str(p) for p in paths[:4]]
    assert _shard_paths(build_index(first, part="2/2").path) == ["train-000002.tar", "train-000003.tar"]
    parts = [build_index([str(p) for p in paths], part=f"{k}/2").path for k in (1, 2)]  # part 2 is now 3, 4, 5
    assert _shard_paths(parts[1]) == ["train-000003.tar", "train-000004.tar", "train-000005.tar"]
    with pytest.raises(OverwriteError, match="holds 1 shard this build was not given"):
        build_index([str(p) for p in paths[:5]], part="2/2")  # shard 5 left the list altogether
    merged = tarindex.merge_indexes(parts, tmp_path / "d" / "merged.tarindex")
    assert _shard_paths(merged) == [f"train-00000{k}.tar" for k in range(6)]


def test_an_empty_part_is_written_and_merged(tmp_path: Path) -> None:
    """Two shards in three parts (the per-machine recipe with more machines than shards): part 1 holds none and
    is written all the same, an empty index; the merge of the three is the whole build."""
    paths = make_shard_set(tmp_path / "d", n_shards=2, per=4)
    runner = CliRunner()
    for k in (1, 2, 3):
        result = runner.invoke(main, ["build", *map(str, paths), "--part", f"{k}/3", "-q"])
        assert result.exit_code == 0, result.output
    parts = sorted((tmp_path / "d").glob("train.part-*-of-3.tarindex"))
    assert [p.name for p in parts] == [f"train.part-{k}-of-3.tarindex" for k in (1, 2, 3)]
    empty = IndexReader(parts[0])
    assert (empty.n_samples, len(empty.shards), empty.part) == (0, 0, (1, 3))
    empty.close()
    merged = runner.invoke(main, ["merge", *map(str, parts), "-o", str(tmp_path / "d" / "all.tarindex")])
    assert merged.exit_code == 0, merged.output
    assert [s["__key__"] for s in tarindex.TarDataset(tmp_path / "d" / "all.tarindex")] == [f"s0{s}i00{i}" for s in (0, 1) for i in range(4)]
    again = build_index([str(p) for p in paths], part="1/3")  # nothing changed: the empty part stands
    assert again.scanned == again.reused == []


def test_a_zstd_shard_without_samples_is_indexed_and_a_failed_check_keeps_the_old_index(tmp_path: Path) -> None:
    """A valid zstd shard with no samples (a member without an extension; an empty archive) is indexed; an index
    whose meta the reader refuses is never renamed into place (was: renamed, then unreadable)."""
    import subprocess

    from tarindex.index.writer import IndexWriter

    src = tmp_path / "src"
    src.mkdir()
    (src / "README").write_bytes(b"no extension: no sample")
    plain = gnu_tar(src, tmp_path / "noext.tar", "gnu", ["README"])
    subprocess.run(["zstd", "-q", str(plain), "-o", str(tmp_path / "noext.tar.zst")], check=True)
    empty = tmp_path / "empty.tar"
    subprocess.run(["tar", "cf", str(empty), "--files-from", "/dev/null"], check=True)
    subprocess.run(["zstd", "-q", str(empty), "-o", str(tmp_path / "empty.tar.zst")], check=True)
    index = tmp_path / "i.tarindex"
    good = make_shard_set(tmp_path / "d", n_shards=1, per=3)[0]
    build_index([str(good)], index=index)
    before = index.read_bytes()
    report = build_index([str(good), str(tmp_path / "noext.tar.zst"), str(tmp_path / "empty.tar.zst"), str(empty)], index=index)
    reader = IndexReader(index)
    assert len(report.scanned) == 3 and reader.n_samples == 3 and [s.n_samples for s in reader.shards] == [3, 0, 0, 0]
    assert reader.shards[1].compression == "zstd" and reader.samples_per_frame == 1
    reader.close()
    before = index.read_bytes()
    failed = re.escape(f"{index}: the new index fails its check (") + ".*bad part.*" + re.escape("; the previous index is unchanged")
    with pytest.raises(tarindex.IndexFormatError, match=failed), IndexWriter(index, part=(3, 2)) as writer:  # K > N: refused by the reader
        writer.add(*tarindex.scan.scan_shard(str(good)))
    assert index.read_bytes() == before and not list(tmp_path.glob(".i.tarindex.tmp-*"))


_SAMPLES_PER_SHARD = 8_000


def _slow_shards(root: Path, n: int) -> list[Path]:
    """Shards of many small members (GNU tar): a build with 2 workers takes a while to interrupt."""
    root.mkdir()
    src = root / "src"
    src.mkdir()
    names = []
    for i in range(_SAMPLES_PER_SHARD):
        name = f"k{i:06d}.txt"
        (src / name).write_bytes(b"x" * (i % 200))
        names.append(name)
    listing = root / "names"
    listing.write_text("\n".join(names))
    out = []
    for s in range(n):
        path = root / f"b-{s:06d}.tar"
        subprocess.run(["tar", "--format=gnu", "-C", str(src), "-cf", str(path), "-T", str(listing)], check=True)
        out.append(path)
    return out


def test_repeated_ctrl_c_during_a_parallel_build_ends_at_once_in_one_line(tmp_path: Path) -> None:
    """Ctrl-C (1-3 SIGINTs to the process group, as a terminal sends) at random moments of ``build -w 2``: never a
    hang, never a worker's traceback: one line and exit 130 (or the build had finished: exit 0), the previous
    index intact or the new one whole, no temporary file, no process left."""
    import random
    import sys
    import time

    shards = _slow_shards(tmp_path / "s", 4)
    index = tmp_path / "b.tarindex"
    build_index([str(p) for p in shards], index=index, workers=2)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    command = [sys.executable, "-m", "tarindex.cli.main", "build", str(tmp_path / "s" / "b-*.tar"), "-o", str(index), "-w", "2", "-q"]

    def start(shard: Path) -> subprocess.Popen[bytes]:
        os.utime(shard)  # a changed mtime: the build rewrites the index
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True, preexec_fn=_sigint_default)
        tmp = tmp_path / f".b.tarindex.tmp-{proc.pid}"
        deadline = time.monotonic() + 60
        while not tmp.exists() and proc.poll() is None and time.monotonic() < deadline:  # the build is under way
            time.sleep(0.002)
        return proc

    timed = start(shards[3])
    started = time.monotonic()
    timed.communicate(timeout=120)
    took = time.monotonic() - started  # the signals land within about the command's build: scans, writing, the rename
    rng = random.Random(20260)
    outcomes: dict[int, int] = {}
    for attempt in range(10):
        before = index.read_bytes()
        proc = start(shards[attempt % 4])
        time.sleep(rng.uniform(0, 1.2 * took))
        for _ in range(rng.choice([1, 1, 2, 3])):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGINT)
            time.sleep(rng.uniform(0, 0.05))
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            pytest.fail(f"attempt {attempt}: the build hangs after Ctrl-C")
        code = proc.returncode
        outcomes[code] = outcomes.get(code, 0) + 1
        # 130 after the one line; -SIGINT where the interpreter ends by the signal (the shell's 130 too)
        whole = f"tarindex: interrupted; {index} was already written whole\n".encode()
        if err == b"tarindex: interrupted; any previous index is unchanged\n":
            assert code in (130, -signal.SIGINT), code
            assert index.read_bytes() == before
        else:  # done before the signal (0, no line), or the signal came after the rename (the line says so)
            assert err in (b"", whole) and code in (0, 130, -signal.SIGINT), (code, err.decode())
            assert code != 130 or err == whole
            reader = IndexReader(index)
            assert reader.n_samples == 4 * _SAMPLES_PER_SHARD
            reader.close()
        assert not list(tmp_path.glob(".b.tarindex.tmp-*"))
        time.sleep(0.1)
        with pytest.raises(ProcessLookupError):  # the workers went with their build
            os.killpg(proc.pid, 0)
    assert outcomes.get(130, 0) + outcomes.get(-signal.SIGINT, 0) >= 4, outcomes  # most attempts stop a build under way


# -- URL shards: a server that does not answer Range requests is named at build --------------------
def _served(server: object, paths: list[Path], sub: str) -> list[str]:
    """``paths`` copied under the server's root, as URLs."""
    import shutil

    root: Path = server.root  # type: ignore[attr-defined]
    (root / sub).mkdir(parents=True, exist_ok=True)
    for p in paths:
        shutil.copyfile(p, root / sub / p.name)
    return [server.url(f"{sub}/{p.name}") for p in paths]  # type: ignore[attr-defined]


def test_a_server_without_range_requests_is_named_once_and_the_index_streams(  # type: ignore[no-untyped-def]
    python_http_server, http_server, shards: list[Path], tmp_path: Path, caplog: pytest.LogCaptureFixture, impl: str
) -> None:
    import urllib.request

    from conftest import tarfile_members
    from tarindex import SourceError, TarDataset, TarStream

    assert http_server.kind == "nginx"  # the server that answers ranges
    plain = _served(python_http_server, shards[:2], tmp_path.name)
    ranged = _served(http_server, shards[2:], tmp_path.name)
    with urllib.request.urlopen(urllib.request.Request(plain[0], headers={"Range": "bytes=0-0"})) as answer:  # as the user's server is
        assert answer.status == 200 and len(answer.read()) == shards[0].stat().st_size
    server = f"http://127.0.0.1:{python_http_server.port}"
    with caplog.at_level(logging.WARNING, logger="tarindex"):
        report = build_index(plain + ranged, index=tmp_path / "mixed.tarindex", workers=1)
    assert report.no_ranges == [server]  # nginx answers ranges: not named
    said = [r.getMessage() for r in caplog.records if r.name.startswith("tarindex")]
    assert said == [  # once per server, with what to use instead
        f"{server}: asked for byte 0 of {plain[0]}, got the whole file: the server does not answer Range requests (TarDataset "
        "needs them to read at random, TarStream streams without them; serve the shards with one that answers ranges: "
        "nginx, Apache, caddy, python -m RangeHTTPServer, an object store)"
    ]
    assert f"no_ranges=['{server}']" in repr(report)
    # the index is written, and it streams: every sample's bytes as tarfile extracts them
    streamed = [(s["__key__"], s["__index__"], s["bin"]) for s in TarStream(report.path)]
    expected = [(name[: -len(".bin")], data) for p in shards for name, data in tarfile_members(p) if name.endswith(".bin")]
    assert [(k, b) for k, _, b in streamed] == expected and [i for _, i, _ in streamed] == list(range(len(expected)))
    ds = TarDataset(report.path)
    assert ds[len(ds) - 1]["bin"] == expected[-1][1]  # a shard of nginx reads at random
    with pytest.raises(SourceError, match=rf"{re.escape(plain[0])}: the server does not answer Range requests \(.*python -m RangeHTTPServer.*\) at byte offset 0"):
        ds[0]
    # the CLI: the warning as one line on stderr, the index written, exit 0
    result = CliRunner().invoke(main, ["build", *plain, "-o", str(tmp_path / "cli.tarindex"), "-q"])
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == [f"tarindex: warning: {said[0]}"]
    assert (tmp_path / "cli.tarindex").is_file()


def test_servers_that_answer_ranges_cost_one_request_each_and_no_warning(  # type: ignore[no-untyped-def]
    drop_server, shards: list[Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = shards[0].read_bytes()
    server = drop_server(data, drop_at=len(data) + 1)  # answers ranges, never drops
    with caplog.at_level(logging.WARNING, logger="tarindex"):
        report = build_index([server.url], index=tmp_path / "one.tarindex", workers=1)
    assert report.no_ranges == [] and not [r for r in caplog.records if r.name.startswith("tarindex")]
    assert server.requests == ["bytes=0-0", None]  # the check (one byte), then the scan's one read of the whole shard
    unranged = drop_server(data, drop_at=len(data) + 1, ranges=False)
    report = build_index([unranged.url], index=tmp_path / "two.tarindex", workers=1)
    assert report.no_ranges == [f"http://127.0.0.1:{unranged.port}"]
    assert unranged.requests == ["bytes=0-0", None]  # the check: one request, its answer (the whole file) dropped unread


def test_report_repr_shows_lists_and_progress_counts_bytes(shards: list[Path], tmp_path: Path) -> None:
    calls: list[tuple[int, int]] = []
    report = build_index([str(p) for p in shards], index=tmp_path / "i.tarindex", workers=1, progress=lambda n, b: calls.append((n, b)))
    assert calls == [(1, p.stat().st_size) for p in shards]  # each shard as scanned, with its bytes
    assert report.scanned == [str(p) for p in shards] and report.reused == [] and report.no_ranges == []
    names = ", ".join(repr(str(p)) for p in shards[:3])
    assert repr(report) == f"BuildReport(path={str(tmp_path / 'i.tarindex')!r}, scanned=[{names}, ... 1 more] (4 shards), reused=[])"
    with open(shards[1], "ab") as f:  # one shard changed: the three others are found unchanged, not scanned
        f.write(bytes(1024))
    calls.clear()
    report = build_index([str(p) for p in shards], index=tmp_path / "i.tarindex", workers=1, progress=lambda n, b: calls.append((n, b)))
    assert calls == [(3, 0), (1, shards[1].stat().st_size)]
    reused = [str(p) for p in (shards[0], shards[2], shards[3])]  # three: shown in full
    assert repr(report) == f"BuildReport(path={str(tmp_path / 'i.tarindex')!r}, scanned={[str(shards[1])]!r}, reused={reused!r})"
    parts = [build_index([str(p) for p in shards], part=f"{k}/2", index=tmp_path / f"p{k}.tarindex") for k in (1, 2)]
    calls.clear()
    tarindex.merge_indexes([p.path for p in parts], tmp_path / "m.tarindex", progress=lambda n, b: calls.append((n, b)))
    assert calls == [(1, 0), (1, 0), (0, parts[0].path.stat().st_size), (1, 0), (1, 0), (0, parts[1].path.stat().st_size)]


def test_an_index_whose_meta_checksum_starts_with_a_brace_is_rebuilt(tmp_path: Path) -> None:
    """The meta is its CRC-32 (little-endian) then JSON: in one index of 256 the checksum's first byte is ``{``.
    Such an index is still an index to replace, not "an LMDB database without a tarindex meta"."""
    import json
    import zlib

    import lmdb

    from tarindex.index.format import META_KEY
    from tarindex.index.pages import seal, unseal

    shards = make_shard_set(tmp_path / "d", n_shards=2, per=3)
    index = build_index([str(s) for s in shards], workers=1).path
    env = lmdb.open(str(index), subdir=False, lock=False)
    with env.begin(write=True) as txn:
        meta = json.loads(bytes(unseal(txn.get(META_KEY), META_KEY, "meta")))
        for n in range(100_000):  # another build id until the checksum's low byte is "{" (1 in 256)
            meta["build_id"] = f"{n:032x}"
            payload = json.dumps(meta, separators=(",", ":")).encode()
            if zlib.crc32(payload, zlib.crc32(META_KEY)) & 0xFF == ord("{"):
                break
        sealed = seal(META_KEY, payload)
        assert sealed[:1] == b"{"
        txn.put(META_KEY, sealed)
    env.close()
    assert IndexReader(index).n_samples == 6  # a valid index
    for s in shards:
        os.utime(s)  # changed mtimes: the build rescans and writes over it
    assert build_index([str(s) for s in shards], workers=1).path == index
    assert IndexReader(index).n_samples == 6


def test_a_failed_parallel_build_leaves_no_pool_thread_behind(tmp_path: Path, impl: str) -> None:
    """A shard that fails in a worker of ``workers=2``: the error names it, and the pool's manager thread has
    ended when it reaches the caller. Left running, it closes its wake-up pipe while the interpreter's exit
    hook of ``concurrent.futures`` writes to it: now and then a traceback of ``OSError: [Errno 9]`` after the
    CLI's one line (seen in about 1 of 30 runs of ``tarindex build -w 2`` over a truncated shard)."""
    import concurrent.futures.process as pool_module
    import threading

    shards = make_shard_set(tmp_path, n_shards=3, per=4)
    shards[1].write_bytes(shards[1].read_bytes()[:1000])
    for _ in range(3):
        with pytest.raises(CorruptArchiveError, match=re.escape(f"{shards[1]}: truncated archive")):
            build_index([str(p) for p in shards], index=tmp_path / "x.tarindex", workers=2)
        managers = [t for t in threading.enumerate() if isinstance(t, pool_module._ExecutorManagerThread)]
        assert managers == [], managers
    assert not (tmp_path / "x.tarindex").exists()
