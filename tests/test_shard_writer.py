"""ShardWriter and compress_shard: real shards read back by tarfile, zstd -d, webdataset and TarDataset."""

from __future__ import annotations

import gc
import io
import json
import os
import shutil
import subprocess
import warnings
from pathlib import Path

import pytest

import tarindex
from conftest import gnu_tar, tarfile_members, write_tree
from tarindex.shard_writer import ShardWriter, compress_shard

HAVE_ZSTD = shutil.which("zstd") is not None


def samples(n: int) -> list[dict]:
    return [
        {"__key__": f"dir/s{i:05d}", "txt": f"text {i}", "cls": i % 7, "json": {"i": i}, "seg.bin": os.urandom(i * 13 % 3000)}
        for i in range(n)
    ]


def encoded(s: dict) -> dict[str, bytes]:
    out = {}
    for k, v in s.items():
        if k.startswith("__"):
            continue
        out[k] = v if isinstance(v, bytes) else json.dumps(v).encode() if isinstance(v, dict) else str(v).encode()
    return out


def restored_tar(shard: Path, tmp_path: Path) -> Path:
    if shard.suffix != ".zst":
        return shard
    out = tmp_path / (shard.name + ".restored.tar")
    subprocess.run(["zstd", "-q", "-d", "-f", str(shard), "-o", str(out)], check=True)
    return out


@pytest.mark.parametrize("compress", [None, "zstd"])
def test_shard_writer_round_trip(compress: str | None, tmp_path: Path) -> None:
    if compress and not HAVE_ZSTD:
        pytest.skip("zstd CLI")  # .ci/run installs it
    suffix = ".tar.zst" if compress else ".tar"
    data = samples(250)
    with ShardWriter(tmp_path / f"out-%04d{suffix}", maxcount=100, compress=compress, frame_size=4096) as w:
        for s in data:
            w.write(s)
    assert w.shards == [str(tmp_path / f"out-{k:04d}{suffix}") for k in range(3)]
    members: list[tuple[str, bytes]] = []
    for shard in w.shards:
        members += tarfile_members(restored_tar(Path(shard), tmp_path))
    want = [(f"{s['__key__']}.{ext}", v) for s in data for ext, v in encoded(s).items()]
    assert members == want
    report = tarindex.build_index(w.shards, index=tmp_path / "out.tarindex", workers=1)
    ds = tarindex.TarDataset(report.path)
    assert len(ds) == 250
    for i in (0, 99, 100, 137, 249):
        got = ds[i]
        assert got["__key__"] == data[i]["__key__"]
        assert {k: v for k, v in got.items() if not k.startswith("__")} == encoded(data[i])
    if compress:
        assert all(s.compression == "zstd" and s.random_access for s in ds.index.shards)
        frames = ds.index.frame_table(0)
        assert len(frames) > 10
        table = ds.index.shard_table(0)
        boundaries = set(table.sample_offset.tolist()) | {0, int(table.sample_offset[-1] + table.sample_size[-1])}
        assert set(frames[:, 2].tolist()) <= boundaries  # every frame starts on a sample boundary (or the end marker)
        assert all(int(d) >= 4096 for d in frames[:-1, 3])


def test_plain_shards_read_by_webdataset(tmp_path: Path) -> None:
    import webdataset as wds

    data = samples(30)
    with ShardWriter(tmp_path / "w-%02d.tar", maxcount=1000) as w:
        for s in data:
            w.write(s)
    with warnings.catch_warnings():  # webdataset leaves its shard files to the garbage collector
        warnings.simplefilter("ignore", ResourceWarning)
        ds = wds.WebDataset(w.shards, shardshuffle=False, empty_check=False)
        got = list(ds)
        del ds
        gc.collect()
    assert [g["__key__"] for g in got] == [s["__key__"] for s in data]
    assert got[7]["seg.bin"] == data[7]["seg.bin"]


def test_maxsize_starts_new_shards(tmp_path: Path) -> None:
    with ShardWriter(tmp_path / "m-%d.tar", maxsize=20_000) as w:
        for i in range(20):
            w.write({"__key__": f"k{i}", "bin": bytes(3000)})
    sizes = [Path(p).stat().st_size for p in w.shards]
    assert len(sizes) > 3 and all(s <= 20_000 + 1024 for s in sizes)


def test_exception_discards_shard_in_progress(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="stop"), ShardWriter(tmp_path / "e-%d.tar.zst", maxcount=5, compress="zstd") as w:
        for i in range(8):
            w.write({"__key__": f"k{i}", "txt": "x"})
        raise RuntimeError("stop")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e-0.tar.zst"]  # complete shard kept, no temporaries


def test_bad_samples(tmp_path: Path) -> None:
    with ShardWriter(tmp_path / "b-%d.tar") as w:
        with pytest.raises(ValueError, match="no string '__key__'"):
            w.write({"txt": "x"})
        with pytest.raises(ValueError, match="dot in its base name"):
            w.write({"__key__": "a.b", "txt": "x"})
        with pytest.raises(TypeError, match="cannot write 'obj' of type object"):
            w.write({"__key__": "a", "obj": object()})
        with pytest.raises(ValueError, match="has no members"):
            w.write({"__key__": "a"})
        w.write({"__key__": "ok", "txt": "fine"})
    assert tarfile_members(Path(w.shards[0])) == [("ok.txt", b"fine")]
    with pytest.raises(ValueError, match="compress must be"):
        ShardWriter(tmp_path / "x-%d.tar", compress="gzip")  # type: ignore[arg-type]


@pytest.mark.skipif(not HAVE_ZSTD, reason="zstd CLI")
def test_compress_gnu_tar_round_trip(tmp_path: Path) -> None:
    src = tmp_path / "src"
    specs = [(f"d/{i:03d}.{ext}", os.urandom(i * 50) if ext == "bin" else b"%d" % i) for i in range(60) for ext in ("bin", "cls")]
    write_tree(src, specs)
    tar = gnu_tar(src, tmp_path / "g.tar", "pax", [n for n, _ in specs])
    out = tmp_path / "g.tar.zst"
    sizes = compress_shard(tar, out, frame_size=2000)
    assert len(sizes) > 5
    assert restored_tar(out, tmp_path).read_bytes() == tar.read_bytes()


@pytest.mark.skipif(not HAVE_ZSTD, reason="zstd CLI")
def test_compress_from_zstd_and_in_place(tmp_path: Path) -> None:
    with ShardWriter(tmp_path / "p-%d.tar") as w:
        for s in samples(40):
            w.write(s)
    tar = Path(w.shards[0])
    single = tmp_path / "single.tar.zst"
    subprocess.run(["zstd", "-q", "-19", str(tar), "-o", str(single)], check=True)
    compress_shard(single, single, frame_size=1000)
    assert restored_tar(single, tmp_path).read_bytes() == tar.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p-0.tar", "single.tar.zst", "single.tar.zst.restored.tar"]


def test_compress_errors(tmp_path: Path) -> None:
    with pytest.raises(tarindex.ShardNotFoundError, match=r"nope\.tar: no such shard"):
        compress_shard(tmp_path / "nope.tar", tmp_path / "x.tar.zst")
    bad = tmp_path / "bad.tar"
    bad.write_bytes(b"x" * 2048)
    with pytest.raises(tarindex.CorruptArchiveError, match=r"bad\.tar: bad header checksum"):
        compress_shard(bad, tmp_path / "x.tar.zst")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.tar"]




def test_compress_progress_adds_up_to_the_input_size(tmp_path: Path) -> None:
    """``progress`` is called with bytes of the input as the tar is compressed (every 8 MiB, the rest at the end):
    for a plain tar its bytes, for a zstd input the share of its tar done; the sum is the input's size."""
    import tarfile

    src = tmp_path / "big.tar"
    with tarfile.open(src, "w", format=tarfile.GNU_FORMAT) as tf:  # 20 MiB in 1 MiB samples: two calls on the way
        for i in range(20):
            data = os.urandom(1 << 20)
            ti = tarfile.TarInfo(f"s{i:03d}.bin")
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    calls: list[int] = []
    compress_shard(src, tmp_path / "a.tar.zst", progress=calls.append)
    assert sum(calls) == src.stat().st_size and len(calls) == 3 and calls[0] >= 8 << 20
    zst = tmp_path / "a.tar.zst"
    calls.clear()
    compress_shard(zst, tmp_path / "b.tar.zst", progress=calls.append)
    assert sum(calls) == zst.stat().st_size and len(calls) == 3
    assert subprocess.run(["zstd", "-dc", str(tmp_path / "b.tar.zst")], capture_output=True, check=True).stdout == src.read_bytes()
