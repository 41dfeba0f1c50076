"""CLI round trip with click's CliRunner, and the one-line error contract."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import on_terminal
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
    assert code == 0 and "1 shard scanned, 3 unchanged" in out


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


def test_shell_completion_completes_commands_and_options() -> None:
    """docs/cli.md's completion scripts: bash asks the program itself (the lazy group lists every command)."""
    run = [sys.executable, "-c", "from tarindex.cli.main import main; main(prog_name='tarindex')"]
    source = subprocess.run(run, env={**os.environ, "_TARINDEX_COMPLETE": "bash_source"}, capture_output=True, text=True)
    assert source.returncode == 0 and "_tarindex_completion()" in source.stdout
    for words, cword, expected in [("tarindex b", "1", "plain,build"), ("tarindex build --part", "2", "plain,--part")]:
        env = {**os.environ, "_TARINDEX_COMPLETE": "bash_complete", "COMP_WORDS": words, "COMP_CWORD": cword}
        done = subprocess.run(run, env=env, capture_output=True, text=True)
        assert done.returncode == 0 and done.stdout.split() == [expected], done.stdout + done.stderr


# -- on a terminal, into a closed pipe -------------------------------------------------------------
def _last_draw(shown: bytes, label: bytes) -> str:
    """The last state of the progress line that starts with ``label``."""
    draws = [d for d in shown.replace(b"\n", b"\r").split(b"\r") if d.startswith(label)]
    assert draws, shown
    return draws[-1].decode().strip()


def test_progress_shows_counts_rate_and_eta_for_every_long_command(tmp_path: Path) -> None:
    import re

    _make_shards(tmp_path, n=3)
    pattern = str(tmp_path / "train-*.tar")
    code, out, shown = on_terminal("build", pattern, "-w", "1")
    assert code == 0 and out == f"{tmp_path / 'train.tarindex'}: 3 shards scanned, 0 unchanged\n".encode(), shown
    assert re.fullmatch(r"writing index  \[#{24}\]  3/3 shards  [0-9.,]+ MB/s  in \d+:\d\d", _last_draw(shown, b"writing index")), shown
    assert re.search(rb"scanning  \[[#.]{24}\]  [0-3]/3 shards  .*ETA (\d+:\d\d|--)", shown), shown
    index = str(tmp_path / "train.tarindex")
    for args, label, line in [
        (["verify", index], b"verifying", r"verifying  \[#{24}\]  3/3 shards  in \d+:\d\d"),  # fingerprints: no MB read in full
        (["verify", "--deep", index], b"verifying", r"verifying  \[#{24}\]  3/3 shards  [0-9.,]+ MB/s  in \d+:\d\d"),
        (["merge", index, "-o", str(tmp_path / "m.tarindex")], b"merging", r"merging  \[#{24}\]  3/3 shards  [0-9.,]+ MB/s  in \d+:\d\d"),
        (["compress", pattern, str(tmp_path / "z"), "-p", "-w", "2"], b"compressing", r"compressing  \[#{24}\]  3/3 files  [0-9.,]+ MB/s  in \d+:\d\d"),
        (["compress", pattern, str(tmp_path / "z1"), "-p", "-w", "1"], b"compressing", r"compressing  \[#{24}\]  3/3 files  [0-9.,]+ MB/s  in \d+:\d\d"),
    ]:
        code, _, shown = on_terminal(*args)
        assert code == 0, shown
        assert re.fullmatch(line, _last_draw(shown, label)), shown
        assert b"ETA" in shown, shown  # while it ran
    code, _, shown = on_terminal("verify", "-q", index)
    assert code == 0 and shown == b""  # -q: no bar, no summary


def test_a_closed_pipe_is_a_quiet_exit_0(tmp_path: Path) -> None:
    """``tarindex ls IDX | head -1``: the reader stops early, which is no error."""
    paths = _make_shards(tmp_path, n=1, per=1)
    with tarfile.open(paths[0], "w", format=tarfile.GNU_FORMAT) as tf:  # 3,000 samples: more lines than a pipe holds
        for i in range(3000):
            ti = tarfile.TarInfo(f"{i:08d}.bin")
            ti.size = 4 if i else 200_000  # the first sample: more bytes than a pipe holds
            tf.addfile(ti, io.BytesIO(os.urandom(ti.size)))
    assert _run("build", str(paths[0]), "-q")[0] == 0
    index = str(tmp_path / "train-000000.tarindex")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    for args in (["ls", index], ["get", index, "00000000", "-o", "-"], ["info", "--json", index]):
        proc = subprocess.Popen([sys.executable, "-m", "tarindex.cli.main", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        assert proc.stdout is not None and proc.stderr is not None
        first = proc.stdout.read(10)  # as head: a little, then the pipe is closed
        proc.stdout.close()
        err = proc.stderr.read()
        proc.stderr.close()
        assert proc.wait(60) == 0 and err == b"", (args, err)
        assert first
    proc = subprocess.run([sys.executable, "-m", "tarindex.cli.main", "ls", index], capture_output=True, env=env)  # read to the end: all of it
    assert proc.returncode == 0 and len(proc.stdout.splitlines()) == 3000


def test_get_takes_any_case_and_refuses_binary_on_a_terminal(tmp_path: Path) -> None:
    shard = tmp_path / "photos.tar"
    jpeg = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + os.urandom(300)
    with tarfile.open(shard, "w", format=tarfile.PAX_FORMAT) as tf:
        for name, data in [("IMG_0001.JPG", jpeg), ("IMG_0001.Txt", b"a caption\n")]:
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    with tarfile.open(shard) as tf:  # the bytes as tarfile extracts them
        expected = {m.name: tf.extractfile(m).read() for m in tf}  # type: ignore[union-attr]
    index = str(tmp_path / "photos.tarindex")
    assert _run("build", str(shard), "-q")[0] == 0
    for ext in ("JPG", "jpg", ".JPG", "Jpg"):  # stored as .JPG, read back as jpg (extensions are lower-cased)
        code, out, err = _run("get", index, "IMG_0001", "--ext", ext)
        assert code == 0, err
    result = CliRunner().invoke(main, ["get", index, "IMG_0001", "--ext", "JPG"])
    assert result.stdout_bytes == expected["IMG_0001.JPG"]
    code, _, err = _run("get", index, "IMG_0001", "--ext", "png")
    assert code == 1 and "has no 'png' (has jpg, txt)" in err
    # a terminal: binary refused (exit 2, nothing written), text shown, -o - writes anyway
    code, _, shown = on_terminal("get", index, "IMG_0001", "--ext", "JPG", stdout_tty=True)
    assert code == 2 and b"JFIF" not in shown, shown
    assert b"the 'jpg' member (311 bytes) is binary; not written to a terminal: write it to a file with -o FILE" in shown.replace(b"\r\n", b" ").replace(b"  ", b" ")
    code, _, shown = on_terminal("get", index, "IMG_0001", "--ext", "txt", stdout_tty=True)
    assert code == 0 and shown.replace(b"\r\n", b"\n") == expected["IMG_0001.Txt"]
    code, _, shown = on_terminal("get", index, "IMG_0001", "--ext", "jpg", "-o", "-", stdout_tty=True)
    assert code == 0 and b"JFIF" in shown
    code, out, _ = on_terminal("get", index, "IMG_0001", "--ext", "jpg")  # stdout a pipe: written
    assert code == 0 and out == expected["IMG_0001.JPG"]
    out_file = tmp_path / "one.jpg"
    code, _, shown = on_terminal("get", index, "IMG_0001", "--ext", "jpg", "-o", str(out_file), stdout_tty=True)
    assert code == 0 and out_file.read_bytes() == expected["IMG_0001.JPG"]


def test_compress_several_files_into_a_directory_in_parallel(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    shards = _make_shards(tmp_path / "d", n=3)
    gz = tmp_path / "d" / "extra.tgz"
    subprocess.run(["sh", "-c", f"gzip -c {shards[0]} > {gz}"], check=True)
    out = tmp_path / "out"
    code, _, err = _run("compress", str(tmp_path / "d" / "train-*.tar"), str(gz), str(out))
    assert code == 2 and f"{out}: directory does not exist; create it, or pass -p (--parents)" in err and not out.exists()
    code, stdout, err = _run("compress", str(tmp_path / "d" / "train-*.tar"), str(gz), str(out), "-p", "-w", "2")
    assert code == 0, err
    assert re.fullmatch(r"\S*out: 4 files compressed, [0-9.]+ KiB -> [0-9.]+ (KiB|B) \([0-9.]+%\) in [0-9.]+ s\n", stdout), stdout
    assert sorted(p.name for p in out.iterdir()) == ["extra.tar.zst", "train-000000.tar.zst", "train-000001.tar.zst", "train-000002.tar.zst"]
    for src, dst in [*((s, out / (s.name + ".zst")) for s in shards), (shards[0], out / "extra.tar.zst")]:
        assert subprocess.run(["zstd", "-dc", str(dst)], capture_output=True, check=True).stdout == src.read_bytes()  # the tar back
    # one file into an existing directory: NAME.tar.zst there; a pattern of one match: a directory too
    code, _, err = _run("compress", str(shards[1]), str(tmp_path / "d"))
    assert code == 0 and (tmp_path / "d" / "train-000001.tar.zst").is_file(), err
    code, _, err = _run("compress", str(tmp_path / "d" / "train-000002.t?r"), str(tmp_path / "single"))
    assert code == 2 and "single: directory does not exist" in err
    # two inputs that would be one output: refused before anything is written
    (tmp_path / "e").mkdir()
    twin = tmp_path / "e" / "train-000000.tar"
    twin.write_bytes(shards[0].read_bytes())
    code, _, err = _run("compress", str(shards[0]), str(twin), str(tmp_path / "twins"), "-p")
    assert code == 2 and f"{shards[0]} and {twin} would both be written to" in err and not list((tmp_path / "twins").iterdir())
    code, _, err = _run("compress", str(shards[0]))
    assert code == 2 and "expected IN... OUT" in err


def test_compress_never_overwrites_another_file_unless_forced(tmp_path: Path, impl: str) -> None:
    """``compress d/a.tar d/b.tar`` (a typo for in place) or any existing file as OUT is refused in one line,
    the file unchanged, as ``zstd`` refuses; so is an output in a directory that exists, before any file is
    written. In place (OUT is IN) and ``-f`` replace."""
    shards = _make_shards(tmp_path, n=3)
    notes = tmp_path / "notes.txt"
    notes.write_text("notes\n")
    for out in (shards[1], notes):
        before = out.read_bytes()
        code, _, err = _run("compress", str(shards[0]), str(out))
        assert code == 1 and err == f"tarindex: error: {out}: exists; refusing to overwrite it with {shards[0]}: pass -f (--force) to replace it, or choose another output\n"
        assert out.read_bytes() == before
    (tmp_path / "z").mkdir()
    taken = tmp_path / "z" / "train-000002.tar.zst"
    taken.write_bytes(b"mine")
    code, _, err = _run("compress", str(tmp_path / "train-*.tar"), str(tmp_path / "z"), "-w", "1")
    assert code == 1 and f"{taken}: exists; refusing" in err and sorted(os.listdir(tmp_path / "z")) == ["train-000002.tar.zst"]
    code, _, err = _run("compress", str(tmp_path / "train-*.tar"), str(tmp_path / "z"), "-f", "-q")
    assert code == 0, err
    assert subprocess.run(["zstd", "-dc", str(taken)], capture_output=True, check=True).stdout == shards[2].read_bytes()
    plain = shards[0].read_bytes()
    code, _, err = _run("compress", str(shards[0]), str(shards[0]), "-q")  # in place
    assert code == 0 and subprocess.run(["zstd", "-dc", str(shards[0])], capture_output=True, check=True).stdout == plain, err


def test_outputs_into_a_missing_directory_are_refused_unless_parents(tmp_path: Path) -> None:
    shards = _make_shards(tmp_path, n=2)
    pattern = str(tmp_path / "train-*.tar")
    for args, out in [
        (["build", pattern, "-o"], tmp_path / "typo" / "i.tarindex"),
        (["compress", str(shards[0])], tmp_path / "typo1" / "a.tar.zst"),
    ]:
        code, _, err = _run(*args, str(out))
        assert code == 2 and f"Error: {out}: directory '{out.parent}' does not exist; create it, or pass -p (--parents) to have it made" in err
        assert not out.parent.exists()
        code, _, err = _run(*args, str(out), "-p")
        assert code == 0 and out.is_file(), err
    assert _run("build", pattern, "-q")[0] == 0
    merged = tmp_path / "typo2" / "m.tarindex"
    code, _, err = _run("merge", str(tmp_path / "train.tarindex"), "-o", str(merged))
    assert code == 2 and "typo2' does not exist" in err
    assert _run("merge", str(tmp_path / "train.tarindex"), "-o", str(merged), "--parents")[0] == 0 and merged.is_file()


def test_summaries_name_paths_alike_and_count_in_the_singular(tmp_path: Path) -> None:
    """Every summary names a path relative to the working directory (absolute outside it), and says 1 shard."""
    (tmp_path / "d").mkdir()
    _make_shards(tmp_path / "d", n=1)
    code, out, _ = on_terminal("build", str(tmp_path / "d" / "train-*.tar"), cwd=tmp_path)  # absolute shards, index beside them
    assert code == 0 and out == b"d/train-000000.tarindex: 1 shard scanned, 0 unchanged\n"
    code, out, _ = on_terminal("info", "d/train-000000.tarindex", cwd=tmp_path)
    assert code == 0 and out.startswith(b"index:          d/train-000000.tarindex (format ")
    code, out, _ = on_terminal("info", "--json", str(tmp_path / "d" / "train-000000.tarindex"), cwd=tmp_path)
    assert code == 0 and b'"index": "d/train-000000.tarindex"' in out
    code, out, _ = on_terminal("verify", "train-000000.tarindex", cwd=tmp_path / "d")
    assert code == 0 and out == b"train-000000.tarindex: 1 shard ok\n"
    code, out, _ = on_terminal("merge", "d/train-000000.tarindex", "-o", "m.tarindex", cwd=tmp_path)
    assert code == 0 and out == b"m.tarindex: merged 1 index, 1 shard\n"
    code, out, _ = on_terminal("verify", str(tmp_path / "m.tarindex"), cwd=tmp_path / "d")  # outside: absolute
    assert code == 0 and out == f"{tmp_path / 'm.tarindex'}: 1 shard ok\n".encode()


def test_help_lists_every_exit_code() -> None:
    code, out, _ = _run("--help")
    assert code == 0
    text = " ".join(out.split())
    assert "Exit codes: 0 ok" in text and "1 bad or stale data, 2 usage, 130 interrupted (Ctrl-C" in text
