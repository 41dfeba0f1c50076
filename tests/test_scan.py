"""Scanning a zstd shard reads it with pread: a shard truncated while ``build`` scans it is a
``CorruptFrameError`` naming it, never a ``SIGBUS`` (a map of the shard faulted on the pages past its new end)."""

from __future__ import annotations

import io
import os
import random
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

_BUILD_WHILE_CUT = """
import os, sys, threading, time
import tarindex
import tarindex.build, tarindex.dataset, tarindex.scan  # imported first: their files are not read during the scan
from tarindex.errors import TarIndexError
path = sys.argv[1]
size = os.path.getsize(path)

def read_bytes():
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("rchar:")).split()[1])

def cut():
    start = read_bytes()
    while read_bytes() - start < 2 << 20:
        time.sleep(0.0005)
    os.truncate(path, size // 2)

threading.Thread(target=cut, daemon=True).start()
try:
    report = tarindex.build_index([path], workers=1)
    print("built", len(tarindex.TarDataset(report.path)))
except TarIndexError as exc:
    print(type(exc).__name__, exc)
"""


def _big_tar(out: Path) -> Path:
    """~70 MB of tar that zstd shrinks to ~24 MB (hex digits), 3,400 samples."""
    rng = random.Random(0)
    with tarfile.open(out, "w", format=tarfile.GNU_FORMAT) as tf:
        for i in range(3400):
            data = rng.randbytes(10_000).hex().encode()
            info = tarfile.TarInfo(f"s{i:05d}.txt")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return out


@pytest.mark.parametrize("writer", ["zstd", "tarindex compress"])
def test_a_zstd_shard_truncated_during_build_is_corrupt_frame_error_naming_it(tmp_path: Path, impl: str, writer: str) -> None:
    tar = _big_tar(tmp_path / "big.tar")
    shard = tmp_path / "big.tar.zst"
    if writer == "zstd":  # one frame: the frame walk
        subprocess.run(["zstd", "-q", "-1", str(tar), "-o", str(shard)], check=True)
    else:  # a seek table: frames decompressed where it puts them
        from tarindex import compress_shard

        compress_shard(tar, shard, level=1, frame_size=1 << 20)
    tar.unlink()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", _BUILD_WHILE_CUT, str(shard)], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, f"died with {out.returncode}: {out.stderr[-2000:]}"  # SIGBUS: -7
    assert out.stdout.startswith("CorruptFrameError"), out.stdout
    assert f"{shard}: the shard was truncated while it was read" in out.stdout
    assert os.path.getsize(shard) < 24 << 20  # it was cut under the scan
