"""The one atomic writer (tarindex._atomic): durable renames, stale temporary files cleaned, and a full disk or a
read-only directory reported in one line naming the file (index, shard, cache entry)."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

import tarindex
from conftest import make_shard_set
from tarindex._atomic import atomic_write, clean_stale, replaced
from tarindex.cli.main import main
from tarindex.errors import WriteError


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_stale_temporaries_of_dead_writers_are_removed(tmp_path: Path) -> None:
    target = tmp_path / "x.tarindex"
    dead = tmp_path / f".x.tarindex.tmp-{dead_pid()}"
    dead_lock = tmp_path / f".x.tarindex.tmp-{dead_pid()}-lock"
    with subprocess.Popen(["sleep", "30"]) as live_proc:
        live = tmp_path / f".x.tarindex.tmp-{live_proc.pid}"
        other = tmp_path / f".y.tarindex.tmp-{dead_pid()}"  # another file's: not ours to judge
        for p in (dead, dead_lock, live, other):
            p.write_bytes(b"partial")
        assert sorted(clean_stale(target)) == sorted([dead, dead_lock])
        assert live.exists() and other.exists()
        live_proc.kill()
    shards = make_shard_set(tmp_path / "d", 1)
    (tmp_path / "d" / f".train-000000.tarindex.tmp-{dead_pid()}").write_bytes(b"partial")
    tarindex.build_index(shards)
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["train-000000.tar", "train-000000.tarindex"]


def test_atomic_write_keeps_the_old_file_on_error(tmp_path: Path) -> None:
    target = tmp_path / "f.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic_write(target) as f:
        f.write(b"new, partial")
        raise RuntimeError("interrupted")
    assert target.read_bytes() == b"old" and os.listdir(tmp_path) == ["f.bin"]
    with atomic_write(target) as f:
        f.write(b"new")
    assert target.read_bytes() == b"new" and os.listdir(tmp_path) == ["f.bin"]


@contextlib.contextmanager
def mounted(tmp_path: Path, options: str) -> Iterator[Path]:
    """A small tmpfs (root only: the tests below fall back to limits any user can set)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mnt)], check=True, capture_output=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True)


@contextlib.contextmanager
def full_disk(tmp_path: Path) -> Iterator[tuple[Path, str, Callable[[], None]]]:
    """A directory, the error a write there will give, and a function that leaves it almost no space: a 1 MiB tmpfs
    filled but for 16 KiB when root (``No space left on device``), else a file-size limit on this process
    (``File too large``)."""
    if os.geteuid() == 0:
        with mounted(tmp_path, "size=1m") as mnt:

            def fill() -> None:
                st = os.statvfs(mnt)
                (mnt / "filler").write_bytes(bytes(max(0, st.f_bavail * st.f_frsize - (16 << 10))))

            yield mnt, "No space left on device", fill
        return
    old = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    (tmp_path / "lim").mkdir()
    try:
        yield tmp_path / "lim", "File too large", lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (16 << 10, old[1]))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old)
        signal.signal(signal.SIGXFSZ, handler)


@contextlib.contextmanager
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory nothing can be written to: a read-only tmpfs when root (root ignores modes), else mode 0555."""
    if os.geteuid() == 0:
        with mounted(tmp_path, "ro,size=1m") as mnt:
            yield mnt
        return
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    try:
        yield ro
    finally:
        ro.chmod(0o755)


def test_full_disk_while_writing_an_index(tmp_path: Path) -> None:
    shards = make_shard_set(tmp_path / "d", n_shards=4, per=200)
    with full_disk(tmp_path) as (where, cause, fill):
        index = where / "x.tarindex"
        result = CliRunner().invoke(main, ["build", "-q", "-o", str(index), str(shards[0])])
        assert result.exit_code == 0, result.output
        before = index.read_bytes()
        fill()
        result = CliRunner().invoke(main, ["build", "-q", "-o", str(index), *map(str, shards)])
        assert result.exit_code == 1
        assert result.output.startswith(f"tarindex: error: {index}: cannot write (") and result.output.count("\n") == 1
        assert cause in result.output or "the disk is full" in result.output, result.output  # LMDB: a short write is EIO
        assert index.read_bytes() == before and sorted(os.listdir(where)) == sorted({"x.tarindex", "filler"} & {*os.listdir(where)})
        assert "x.tarindex" in os.listdir(where) and len(tarindex.TarDataset(index)) == 200


def test_full_disk_while_writing_shards(tmp_path: Path) -> None:
    with full_disk(tmp_path) as (where, cause, fill):
        fill()
        with pytest.raises(WriteError, match=rf"^{where}/s-000000\.tar: cannot write \({cause}\)$"):  # noqa: SIM117
            with tarindex.ShardWriter(str(where / "s-%06d.tar")) as w:
                for i in range(2000):
                    w.write({"__key__": f"k{i:05d}", "bin": os.urandom(1000)})
        assert [p for p in os.listdir(where) if p != "filler"] == []


def test_read_only_directory(tmp_path: Path) -> None:
    shards = make_shard_set(tmp_path / "d", 1)
    with read_only_dir(tmp_path) as ro:
        result = CliRunner().invoke(main, ["build", "-q", "-o", str(ro / "x.tarindex"), str(shards[0])])
        assert result.exit_code == 1
        assert result.output == f"tarindex: error: {ro / 'x.tarindex'}: cannot write (Read-only file system)\n" or (
            os.geteuid() != 0 and result.output == f"tarindex: error: {ro / 'x.tarindex'}: cannot write (Permission denied)\n"
        )
        with pytest.raises(WriteError, match=r"s-000000\.tar: cannot write"):  # noqa: SIM117
            with tarindex.ShardWriter(str(ro / "s-%06d.tar")) as w:
                w.write({"__key__": "a", "txt": "x"})


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_kill_9_during_build_keeps_the_previous_index(tmp_path: Path) -> None:
    """``kill -9`` of ``tarindex build --workers 2`` at 10 seeded random moments: the index is always the previous
    one or the complete new one, never damaged; the next build removes what the killed ones left."""
    import random
    import shutil
    import sys
    import time

    shards = make_shard_set(tmp_path / "d", n_shards=8, per=300)
    index = tmp_path / "d" / "x.tarindex"
    old = tarindex.build_index(shards[:4], index=index, workers=1).path
    previous = old.read_bytes()
    shutil.copy(old, tmp_path / "previous.tarindex")
    cmd = [sys.executable, "-m", "tarindex.cli.main", "build", "-q", "-w", "2", "-o", str(index), *map(str, shards)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    start = time.monotonic()
    subprocess.run(cmd, check=True, env=env)
    full = time.monotonic() - start
    rng = random.Random(11)
    outcomes = []
    for _ in range(10):
        shutil.copy(tmp_path / "previous.tarindex", tmp_path / "restore.tarindex")
        os.replace(tmp_path / "restore.tarindex", index)  # the previous index again
        with subprocess.Popen(cmd, env=env, start_new_session=True) as proc:
            time.sleep(rng.uniform(0.02, full))
            proc.kill()
            proc.wait()
            deadline = time.monotonic() + 10  # the build's pool workers end with it (no orphan keeps running)
            while _group_alive(proc.pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not _group_alive(proc.pid), "scan workers outlived the killed build"
        ds = tarindex.TarDataset(index)  # valid: opens, and its first and last samples read back
        assert len(ds) in (1200, 2400)
        assert ds[0]["__key__"] == "s00i000" and ds[len(ds) - 1]["__key__"] == f"s0{len(ds) // 300 - 1}i299"
        if len(ds) == 1200:
            assert index.read_bytes() == previous
        outcomes.append(len(ds))
        ds.close()
        time.sleep(0.2)  # the pool's workers see their parent gone and exit
    assert 1200 in outcomes  # at least one kill came before the new index was complete
    subprocess.run(cmd, check=True, env=env)
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == sorted([*(p.name for p in shards), "x.tarindex"])


def test_replaced_names_exactly_the_targets_whose_file_is_the_one_written(tmp_path: Path) -> None:
    """What an interrupted command says rests on this: a target renamed over by this process is named while its
    file is the one written, and not once another file took its place (or before anything was written)."""
    target = tmp_path / "x.tarindex"
    target.write_bytes(b"old")
    assert target not in replaced()
    with atomic_write(target) as f:
        f.write(b"new")
    assert target in replaced()
    other = tmp_path / "other"
    other.write_bytes(b"someone else's")
    os.replace(other, target)
    assert target not in replaced()


def test_a_write_into_a_file_system_without_blocks_is_not_called_a_full_disk(tmp_path: Path) -> None:
    """``get -o /proc/x``: /proc has no blocks (0 free, 0 in all), so the cause is the write's own, not "the
    disk is full (0 bytes free)"."""
    shards = make_shard_set(tmp_path, n_shards=1, per=2)
    index = tarindex.build_index(shards, workers=1).path
    assert os.statvfs("/proc").f_blocks == 0
    key = tarindex.TarDataset(index)[0]["__key__"]
    result = CliRunner().invoke(main, ["get", str(index), key, "--ext", "bin", "-o", "/proc/x"])
    assert result.exit_code == 1 and result.output.startswith("tarindex: error: /proc/x: cannot write (")
    assert "disk is full" not in result.output and result.output.count("\n") == 1, result.output
