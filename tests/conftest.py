"""Shared fixtures: real tar shards made with GNU tar, Python tarfile and webdataset."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

LONG_DIR = "d" * 60 + "/" + "e" * 60  # 121 chars: needs ustar prefix, GNU L or PAX path


def file_specs(fmt: str) -> list[tuple[str, bytes]]:
    """(name, data) pairs covering the awkward cases; ustar-safe when fmt == 'ustar'."""
    long_base = "f" * 110 if fmt != "ustar" else "short"
    specs = [
        ("sample000.txt", b"hello"),
        ("sample000.json", b'{"a": 1}'),
        ("sample001.seg.png", bytes(range(256)) * 3),  # 768 bytes, not a multiple of 512
        ("sample001.cls", b"7"),
        ("sample002.empty", b""),
        ("sample002.bin", os.urandom(1000)),
        ("sub/dir/sample003.txt", b"in a subdirectory"),
        ("sub/dir/sample003.a.b.c", b"x" * 513),
        (f"{LONG_DIR}/{long_base}.txt", b"long name" * 100),
        (f"{LONG_DIR}/{long_base}.cls", b"3"),
        ("ünïcødé/样本004.txt", "unicode ✓".encode()),
        ("ünïcødé/样本004.dat", b"\x00" * 512),
        ("sample005.big", os.urandom(70_000)),
    ]
    return specs


def write_tree(root: Path, specs: list[tuple[str, bytes]]) -> None:
    for name, data in specs:
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)


def gnu_tar(src: Path, out: Path, fmt: str, names: list[str]) -> Path:
    """Make ``out`` with GNU tar from ``names`` (relative to ``src``), in this order."""
    subprocess.run(
        ["tar", f"--format={fmt}", "--no-recursion", "-C", str(src), "-cf", str(out), *names],
        check=True,
        capture_output=True,
    )
    return out


def py_tar(out: Path, specs: list[tuple[str, bytes]], fmt: int, dirs: bool = True) -> Path:
    with tarfile.open(out, "w", format=fmt, encoding="utf-8") as tf:
        if dirs:
            ti = tarfile.TarInfo("somedir")
            ti.type = tarfile.DIRTYPE
            tf.addfile(ti)
            ln = tarfile.TarInfo("somelink.txt")
            ln.type = tarfile.SYMTYPE
            ln.linkname = "sample000.txt"
            tf.addfile(ln)
        for name, data in specs:
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    return out


@pytest.fixture(params=["gnu", "pax", "ustar"])
def gnu_tar_shard(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """One shard made by GNU tar in the given format, with dirs, long/unicode names."""
    fmt = request.param
    specs = file_specs(fmt)
    src = tmp_path / "src"
    write_tree(src, specs)
    os.symlink("sample000.txt", src / "link.txt")
    names = []
    for name, _ in specs:
        parent = name.rsplit("/", 1)[0] if "/" in name else None
        if parent and parent not in names:
            names.append(parent)  # directory entries, skipped by the scanner
        names.append(name)
    names.append("link.txt")
    return gnu_tar(src, tmp_path / f"shard-{fmt}.tar", fmt, names)


PY_FORMATS = {"gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT, "ustar": tarfile.USTAR_FORMAT}


@pytest.fixture(params=list(PY_FORMATS))
def py_tar_shard(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    fmt = request.param
    return py_tar(tmp_path / f"py-{fmt}.tar", file_specs(fmt), PY_FORMATS[fmt])


def wds_write(out: Path, samples: list[dict]) -> Path:
    import webdataset as wds

    with open(out, "wb") as f, wds.TarWriter(f) as w:
        for s in samples:
            w.write(s)
    return out


@pytest.fixture
def wds_shard(tmp_path: Path) -> Path:
    samples = [
        {"__key__": f"s{i:04d}", "txt": f"text {i}", "cls": i % 5, "json": {"i": i}, "seg.bin": os.urandom(i * 37)}
        for i in range(20)
    ]
    return wds_write(tmp_path / "wds-000000.tar", samples)


def make_shard_set(root: Path, n_shards: int = 4, per: int = 6, fmt: int = tarfile.GNU_FORMAT) -> list[Path]:
    """``root/train-00000{k}.tar``: ``per`` samples each with txt/cls/bin members."""
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for s in range(n_shards):
        specs = []
        for i in range(per):
            key = f"s{s:02d}i{i:03d}"
            specs += [
                (f"{key}.txt", f"text {s} {i}".encode()),
                (f"{key}.cls", str(i).encode()),
                (f"{key}.bin", os.urandom((s * 131 + i * 97) % 2000)),
            ]
        paths.append(py_tar(root / f"train-{s:06d}.tar", specs, fmt, dirs=False))
    return paths


@pytest.fixture
def shard_set(tmp_path: Path) -> Callable[..., list[Path]]:
    def make(n_shards: int = 4, per: int = 6, name: str = "data") -> list[Path]:
        return make_shard_set(tmp_path / name, n_shards, per)

    return make


@pytest.fixture(params=["c", "python"])
def impl(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The backend a test runs on: ``"c"`` (the compiled extension, which must be built) or ``"python"`` (every
    pure-Python reference path).

    ``"python"`` flips the one switch (``tarindex._native.SPEEDUPS`` becomes ``None``, as
    ``TARINDEX_PURE_PYTHON=1`` makes it at import), and that variable is set for processes the test starts.
    """
    if request.param == "c":
        require_c_extension()
    else:
        use_pure_python(monkeypatch)
    return str(request.param)


def use_pure_python(monkeypatch: pytest.MonkeyPatch) -> None:
    """Turn the C extension off for one test (see :func:`impl`): the one switch, ``tarindex._native.SPEEDUPS``,
    which every module reads when it chooses a path (tests/test_native.py checks that no other module keeps a
    reference to the extension), restored after the test."""
    from tarindex import _native

    monkeypatch.setattr(_native, "SPEEDUPS", None)
    monkeypatch.setenv("TARINDEX_PURE_PYTHON", "1")


def require_c_extension() -> None:
    """For tests of the C fast paths: they must be built, unless the run turned them off on purpose."""
    from tarindex._native import SPEEDUPS

    if os.environ.get("TARINDEX_PURE_PYTHON"):
        pytest.skip("TARINDEX_PURE_PYTHON is set: the C extension is off for this run")
    assert SPEEDUPS is not None, "the C extension was not built (pip install -e . compiles it)"


def package_lines(pattern: re.Pattern[str], allowed: set[str]) -> list[str]:
    """``module:line: text`` of every line of the package's code (comments left out) that ``pattern`` finds,
    outside the modules ``allowed`` (paths relative to the package)."""
    import tarindex

    package = Path(tarindex.__file__).parent
    modules = sorted(package.rglob("*.py"))
    assert len(modules) > 50  # the package was walked
    found = []
    for path in modules:
        name = path.relative_to(package).as_posix()
        if name in allowed:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if pattern.search(line.split("#", 1)[0]):
                found.append(f"{name}:{number}: {line.strip()}")
    return found


def tarfile_members(path: Path) -> list[tuple[str, bytes]]:
    """The oracle: every regular member's name and bytes, by tarfile."""
    out = []
    with tarfile.open(path, encoding="utf-8") as tf:
        for m in tf:
            if m.isreg():
                out.append((m.name, tf.extractfile(m).read()))
    return out


from _latencyfs import latency_mount  # noqa: E402,F401 - shards on a FUSE mount with a delay per read
from _servers import (  # noqa: E402,F401 - fixtures for the network tests
    azure_server,
    drop_server,
    fault_proxy,
    framing_server,
    http_server,
    hub_server,
    python_http_server,
    s3_server,
    scheme_server,
    tls_certificate,
)


def open_files(paths: list[Path] | list[str]) -> dict[int, str]:
    """This process's descriptors open on any of ``paths`` (from /proc/self/fd): descriptor -> path."""
    wanted = {os.path.realpath(p) for p in paths}
    out = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # closed meanwhile (the listing's own descriptor)
            continue
        if target in wanted:
            out[int(name)] = target
    return out


def on_terminal(*args: str, cwd: Path | None = None, stdout_tty: bool = False) -> tuple[int, bytes, bytes]:
    """``tarindex ARGS`` as a process with stderr (and with ``stdout_tty`` stdout too) on a terminal (a pty):
    its exit code, what went to a plain stdout, and what the terminal showed."""
    import pty
    import threading

    primary, secondary = pty.openpty()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "COLUMNS": "150"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tarindex.cli.main", *args], stdin=subprocess.DEVNULL, cwd=cwd, env=env,
        stdout=secondary if stdout_tty else subprocess.PIPE, stderr=secondary,
    )  # fmt: skip
    os.close(secondary)
    out: list[bytes] = []
    reader = threading.Thread(target=lambda: out.append(proc.stdout.read() if proc.stdout else b""))
    reader.start()  # stdout drained meanwhile: neither side waits on a full pipe
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
    reader.join(300)
    if proc.stdout is not None:
        proc.stdout.close()
    return proc.wait(300), out[0] if out else b"", shown
