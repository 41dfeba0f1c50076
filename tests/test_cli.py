"""CLI round trip with click's CliRunner, and the one-line error contract."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from tarindex.cli.main import main


def _make_shards(root: Path, n: int = 4, per: int = 6) -> list[Path]:
    paths = []
    for s in range(n):
        p = root / f"train-{s:06d}.tar"
        with tarfile.open(p, "w", format=tarfile.GNU_FORMAT) as tf:
            for i in range(per):
                for ext in ("jpg", "cls"):
                    data = f"{ext}-{s}-{i}".encode() * (i + 1)
                    ti = tarfile.TarInfo(f"{s:02d}{i:04d}.{ext}")
                    ti.size = len(data)
                    tf.addfile(ti, io.BytesIO(data))
        paths.append(p)
    return paths


def _run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_round_trip(tmp_path: Path) -> None:
    _make_shards(tmp_path)
    pattern = str(tmp_path / "train-{000000..000003}.tar")
    code, out, _ = _run("build", pattern, "--workers", "2")
    assert code == 0, out
    index = tmp_path / "train.tarindex"
    assert index.is_file()
    code, out, _ = _run("info", str(index))
    assert code == 0 and "samples:        24" in out and "jpg 24" in out
    code, out, _ = _run("ls", str(index))
    lines = out.splitlines()
    assert len(lines) == 24 and lines[0].split("\t")[1] == "000000"
    code, out, _ = _run("get", str(index), "020003", "--ext", "cls")
    assert code == 0 and out == "cls-2-3" * 4
    code, out, _ = _run("get", str(index), "-n", "7", "--ext", "jpg")
    assert code == 0 and out == "jpg-1-1" * 2
    code, out, _ = _run("verify", "--deep", str(index))
    assert code == 0 and "4 shards ok" in out


def test_merge_equals_full_build(tmp_path: Path) -> None:
    _make_shards(tmp_path)
    pattern = str(tmp_path / "train-*.tar")
    full, p1, p2, merged = (str(tmp_path / n) for n in ("full.tarindex", "p1.tarindex", "p2.tarindex", "m.tarindex"))
    assert _run("build", pattern, "-o", full)[0] == 0
    assert _run("build", pattern, "--part", "1/2", "-o", p1)[0] == 0
    assert _run("build", pattern, "--part", "2/2", "-o", p2)[0] == 0
    assert _run("merge", p1, p2, "-o", merged)[0] == 0
    assert _run("ls", full)[1] == _run("ls", merged)[1]


def test_incremental_rebuild_scans_only_changed_shard(tmp_path: Path) -> None:
    shards = _make_shards(tmp_path)
    pattern = str(tmp_path / "train-*.tar")
    assert _run("build", pattern)[0] == 0
    os.utime(shards[2], ns=(1, 1))  # a new mtime alone: the fingerprint says it is the same shard
    code, out, _ = _run("build", pattern)
    assert code == 0 and "0 shards scanned, 4 unchanged" in out
    with tarfile.open(shards[2], "a") as tf:  # new content
        tf.addfile(tarfile.TarInfo("extra.txt"))
    code, out, _ = _run("build", pattern)
    assert code == 0 and "1 shards scanned, 3 unchanged" in out


@pytest.mark.parametrize("kind", ["truncated", "empty", "garbage", "checksum"])
def test_bad_shard_exits_1_with_one_line_and_keeps_index(tmp_path: Path, kind: str) -> None:
    shards = _make_shards(tmp_path, n=2)
    pattern = str(tmp_path / "train-*.tar")
    assert _run("build", pattern)[0] == 0
    index = tmp_path / "train.tarindex"
    before = index.read_bytes()
    data = shards[1].read_bytes()
    bad = {
        "truncated": data[:1500],
        "empty": b"",
        "garbage": os.urandom(4096),
        "checksum": data[:10] + b"X" + data[11:],
    }[kind]
    shards[1].write_bytes(bad)
    code, _, err = _run("build", pattern)
    assert code == 1
    assert len(err.strip().splitlines()) == 1
    assert str(shards[1]) in err and "offset" in err and "Traceback" not in err
    assert index.read_bytes() == before


def test_stale_and_missing(tmp_path: Path) -> None:
    shards = _make_shards(tmp_path, n=2)
    assert _run("build", str(tmp_path / "train-*.tar"))[0] == 0
    index = str(tmp_path / "train.tarindex")
    with open(shards[0], "ab") as f:
        f.write(bytes(512))
    code, _, err = _run("verify", index)
    assert code == 1 and str(shards[0]) in err and "changed" in err
    shards[0].unlink()
    code, _, err = _run("get", index, "-n", "0", "--ext", "cls")
    assert code == 1 and "missing" in err


def test_not_an_index(tmp_path: Path) -> None:
    bogus = tmp_path / "x.tarindex"
    bogus.write_bytes(os.urandom(8192))
    code, _, err = _run("info", str(bogus))
    assert code == 1 and str(bogus) in err and "not a tarindex index" in err


def test_usage_error_exits_2() -> None:
    assert _run("build")[0] == 2


def test_help_does_not_import_torch() -> None:
    code = "import sys; from tarindex.cli.main import main; sys.argv=['tarindex','--help']\n" \
           "try:\n    main()\nexcept SystemExit:\n    pass\nassert 'torch' not in sys.modules, 'torch imported'"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "build" in proc.stdout
