"""One identity rule for reads, verify and incremental builds (tarindex.identity)."""

from __future__ import annotations

import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

import tarindex
from conftest import make_shard_set
from tarindex.cli.main import main
from tarindex.errors import StaleIndexError, iso_time


def read_all(index: Path, **kw: object) -> list[bytes]:
    ds = tarindex.TarDataset(index, **kw)  # type: ignore[arg-type]
    return [ds[i]["bin"] for i in range(len(ds))]


def test_copied_dataset_stays_readable(tmp_path: Path) -> None:
    """``cp -r`` (bytes identical, mtimes new): verify, reads and an incremental build all accept it."""
    make_shard_set(tmp_path / "a", 3)
    index = tarindex.build_index(str(tmp_path / "a" / "*.tar")).path
    expected = read_all(index)
    shutil.copytree(tmp_path / "a", tmp_path / "b", copy_function=shutil.copyfile)  # new mtimes
    copy = tmp_path / "b" / index.name
    assert os.stat(tmp_path / "b" / "train-000000.tar").st_mtime_ns != os.stat(tmp_path / "a" / "train-000000.tar").st_mtime_ns
    assert CliRunner().invoke(main, ["verify", str(copy)]).exit_code == 0
    assert read_all(copy) == expected
    report = tarindex.build_index(str(tmp_path / "b" / "*.tar"))
    assert (len(report.scanned), len(report.reused)) == (0, 3)
    mtimes = [s.mtime_ns for s in tarindex.IndexReader(copy).shards]
    assert mtimes == [os.stat(tmp_path / "b" / f"train-{k:06d}.tar").st_mtime_ns for k in range(3)]


def test_same_size_other_content_is_stale_everywhere(tmp_path: Path) -> None:
    shard = make_shard_set(tmp_path / "a", 1)[0]
    index = tarindex.build_index([shard]).path
    data = bytearray(shard.read_bytes())
    data[600] ^= 0xFF  # inside the first member's data
    shard.write_bytes(bytes(data))
    os.utime(shard, ns=(0, 1_700_000_000_123_456_789))  # a time with nanoseconds, shown to the nanosecond
    reader = tarindex.IndexReader(index)
    indexed = reader.shards[0].mtime_ns
    reader.close()
    times = rf"{re.escape(iso_time(indexed))} -> {re.escape(iso_time(1_700_000_000_123_456_789))}"
    assert re.fullmatch(r"2023-11-1[45]T\d\d:\d\d:20\.123456789([+-]\d\d:\d\d|Z)", iso_time(1_700_000_000_123_456_789))
    with pytest.raises(StaleIndexError, match=rf"train-000000\.tar: shard changed .*\(mtime {times}, content fingerprint differs\)") as caught:
        read_all(index)
    assert caught.value.mtime_ns == (indexed, 1_700_000_000_123_456_789)  # the times in nanoseconds, as they were
    assert pickle.loads(pickle.dumps(caught.value)).mtime_ns == caught.value.mtime_ns
    result = CliRunner().invoke(main, ["verify", str(index)])
    assert result.exit_code == 1 and "content fingerprint differs" in result.output
    assert tarindex.build_index([shard]).scanned == [str(shard)]


def test_size_change_is_named(tmp_path: Path) -> None:
    shard = make_shard_set(tmp_path / "a", 1)[0]
    index = tarindex.build_index([shard]).path
    size = shard.stat().st_size
    with open(shard, "ab") as f:
        f.write(bytes(512))
    with pytest.raises(StaleIndexError, match=f"size {size} -> {size + 512}"):
        read_all(index)


def test_rewrite_keeping_size_and_mtime(tmp_path: Path) -> None:
    """``touch -r`` after a rewrite: the stat rule cannot see it; verify="fingerprint" and verify do."""
    shard = make_shard_set(tmp_path / "a", 1)[0]
    index = tarindex.build_index([shard]).path
    st = shard.stat()
    data = bytearray(shard.read_bytes())
    data[600] ^= 0xFF
    shard.write_bytes(bytes(data))
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert len(read_all(index)) == 6  # documented: only a fingerprint or a rescan can tell
    with pytest.raises(StaleIndexError, match=r"\(content fingerprint differs\)"):
        read_all(index, verify="fingerprint")
    assert CliRunner().invoke(main, ["verify", str(index)]).exit_code == 1
    with pytest.raises(ValueError, match="verify must be"):
        tarindex.TarDataset(index, verify="deep")  # type: ignore[arg-type]


def _fd_flags(fd: int) -> int:
    with open(f"/proc/self/fdinfo/{fd}") as f:
        return int(next(line.split()[1] for line in f if line.startswith("flags:")), 8)


@pytest.mark.skipif(not hasattr(os, "O_NOATIME"), reason="O_NOATIME is Linux's")
def test_random_reads_leave_access_times(tmp_path: Path) -> None:
    """Shards opened for random reads skip the access-time update (O_NOATIME, the owner's files): a shard's
    atime stays where it was, where a plain read of the same file moves it (relatime: atime older than mtime)."""
    shard = make_shard_set(tmp_path, 1)[0]
    index = tarindex.build_index(str(shard)).path
    st = os.stat(shard)
    old = st.st_mtime_ns - 10**9 * 86400 * 3
    os.utime(shard, ns=(old, st.st_mtime_ns))
    ds = tarindex.TarDataset(index)
    assert [s["__key__"] for s in (ds[i] for i in range(len(ds)))]
    fd = ds._opener.fds[0]
    assert fd >= 0 and _fd_flags(fd) & os.O_NOATIME
    assert os.stat(shard).st_atime_ns == old
    with open(shard, "rb") as f:  # the control: this file system does update access times
        f.read()
    assert os.stat(shard).st_atime_ns != old


@pytest.mark.skipif(not hasattr(os, "O_NOATIME") or os.geteuid() != 0, reason="needs O_NOATIME and another user to read as")
def test_shards_of_another_user_open_without_noatime() -> None:
    """The system refuses O_NOATIME on a file the reader does not own (EPERM): the shard opens plainly and reads."""
    root = Path(tempfile.mkdtemp(dir="/tmp"))  # pytest's own directories are closed to other users
    try:
        _read_as_nobody(root)
    finally:
        shutil.rmtree(root)


def _read_as_nobody(root: Path) -> None:
    root.chmod(0o755)
    shard = make_shard_set(root, 1)[0]
    index = tarindex.build_index(str(shard)).path
    expected = read_all(index)
    script = (
        "import os, sys, tarindex\n"
        "ds = tarindex.TarDataset(sys.argv[1])\n"  # modules imported as root: this user may not read the interpreter's tree
        "ds.index.record(0)\n"
        "os.setgid(65534); os.setuid(65534)\n"
        "print(repr([ds[i]['bin'] for i in range(len(ds))]))\n"
        "fd = ds._opener.fds[0]\n"
        "flags = next(int(l.split()[1], 8) for l in open(f'/proc/self/fdinfo/{fd}') if l.startswith('flags:'))\n"
        "print(bool(flags & os.O_NOATIME))\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(index)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    out = done.stdout.split("\n")
    assert out[0] == repr(expected)
    assert out[1] == "False"
