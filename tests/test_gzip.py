"""gzip shards: streamed and indexed by content, made by GNU ``tar czf``, ``pigz``, ``tarfile`` (``w:gz``),
webdataset's writer and concatenated members (as ``bgzip`` writes); every sample compared with what
``tarfile`` extracts; damaged deflate named by shard and compressed offset.
"""

from __future__ import annotations

import gzip as gzip_module
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_zstd import expected_samples

import tarindex
from conftest import file_specs, gnu_tar, make_shard_set, py_tar, write_tree
from tarindex.cli.main import main
from tarindex.errors import CorruptDeflateError, RandomAccessError
from tarindex.gzip import decompress_gzip
from tarindex.scan import scan_shard


def _gnu_czf(tar: Path, src: Path, out: Path) -> Path:
    names = [n for n, _ in file_specs("gnu")]
    subprocess.run(["tar", "--format=gnu", "--no-recursion", "-C", str(src), "-czf", str(out), *names], check=True)
    return out


def _pigz(tar: Path, src: Path, out: Path) -> Path:
    if shutil.which("pigz") is None:
        pytest.skip("pigz is not installed")  # .ci/run installs it
    with open(out, "wb") as f:
        subprocess.run(["pigz", "-c", "-p", "2", "-b", "32", str(tar)], stdout=f, check=True)
    return out


def _tarfile_gz(tar: Path, src: Path, out: Path) -> Path:
    with tarfile.open(out, "w:gz", format=tarfile.PAX_FORMAT) as tf:
        for name, _ in file_specs("pax"):
            tf.add(src / name, arcname=name, recursive=False)
    return out


def _members(tar: Path, src: Path, out: Path) -> Path:
    """Many gzip members of 20 KB of the tar each, concatenated (what bgzip and ``cat a.gz b.gz`` make)."""
    data = tar.read_bytes()
    out.write_bytes(b"".join(gzip_module.compress(data[i : i + 20_000]) for i in range(0, len(data), 20_000)))
    return out


def _webdataset(tar: Path, src: Path, out: Path) -> Path:
    import webdataset as wds

    with wds.TarWriter(str(out)) as w:  # a name ending in .gz: gzip
        for i in range(30):
            w.write({"__key__": f"w{i:03d}", "txt": f"text {i}", "bin": os.urandom(i * 101)})
    return out


MAKERS = {"tar-czf": _gnu_czf, "pigz": _pigz, "tarfile-w:gz": _tarfile_gz, "members": _members, "webdataset": _webdataset}


@pytest.fixture
def made(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, Path]:
    """(gzip shard, the plain tar it decompresses to, per ``gzip -dc``)."""
    src = tmp_path / "src"
    write_tree(src, file_specs("gnu"))
    tar = gnu_tar(src, tmp_path / "plain.tar", "gnu", [n for n, _ in file_specs("gnu")])
    shard = MAKERS[request.param](tar, src, tmp_path / "x.tar.gz")
    plain = tmp_path / "restored.tar"
    with open(plain, "wb") as f:
        subprocess.run(["gzip", "-dc", str(shard)], stdout=f, check=True)
    return shard, plain


@pytest.mark.parametrize("made", list(MAKERS), indirect=True)
def test_stream_and_build_equal_tarfile(made: tuple[Path, Path], tmp_path: Path) -> None:
    shard, plain = made
    oracle = expected_samples(plain)
    got = {s["__key__"]: {k: v for k, v in s.items() if not k.startswith("__")} for s in tarindex.TarStream([str(shard)])}
    assert got == oracle
    info, table = scan_shard(str(shard))
    _, plain_table = scan_shard(str(plain))
    assert info.compression == "gzip" and not info.random_access
    assert table.keys == plain_table.keys and (table.sample_offset == plain_table.sample_offset).all()
    assert (table.member_size == plain_table.member_size).all()
    disguised = tmp_path / "looks-plain.tar"  # by content, not by name
    shutil.copy(shard, disguised)
    assert scan_shard(str(disguised))[1].keys == table.keys


def test_dataset_refuses_gzip_with_the_conversion_command(tmp_path: Path) -> None:
    (plain,) = make_shard_set(tmp_path / "d", n_shards=1, per=5)
    shard = tmp_path / "d" / "g.tar.gz"
    shard.write_bytes(gzip_module.compress(plain.read_bytes()))
    index = tarindex.build_index([shard], index=tmp_path / "g.tarindex", workers=1).path
    ds = tarindex.TarDataset(index)
    with pytest.raises(RandomAccessError, match=r"g\.tar\.gz: gzip shards are not read at random yet; .*tarindex compress"):
        ds[0]
    zst = tmp_path / "d" / "g.tar.zst"
    result = CliRunner().invoke(main, ["compress", str(shard), str(zst)])  # compress accepts gzip input
    assert result.exit_code == 0, result.output
    ds = tarindex.TarDataset(tarindex.build_index([zst], index=tmp_path / "z.tarindex", workers=1).path)
    oracle = expected_samples(plain)
    assert {ds[i]["__key__"]: ds[i]["bin"] for i in range(len(ds))} == {k: v["bin"] for k, v in oracle.items()}


def test_stream_of_a_single_gzip_file_is_not_taken_for_an_index(tmp_path: Path) -> None:
    (plain,) = make_shard_set(tmp_path / "d", n_shards=1, per=5)
    shard = tmp_path / "d" / "one.tgz"
    shard.write_bytes(gzip_module.compress(plain.read_bytes()))
    assert len(list(tarindex.TarStream(str(shard)))) == 5


@pytest.mark.parametrize("damage", ["flip", "truncate", "crc", "garbage"])
def test_damaged_gzip_is_named_with_its_compressed_offset(damage: str, tmp_path: Path) -> None:
    specs = [(f"s{i:03d}.bin", os.urandom(3000)) for i in range(50)]
    tar = py_tar(tmp_path / "p.tar", specs, tarfile.GNU_FORMAT, dirs=False)
    first = gzip_module.compress(tar.read_bytes()[:60_000])
    second = bytearray(gzip_module.compress(tar.read_bytes()[60_000:]))
    if damage == "flip":
        second[len(second) // 2] ^= 0xFF
    elif damage == "truncate":
        del second[len(second) // 2 :]
    elif damage == "crc":
        second[-6] ^= 0x01  # the CRC-32 of the second member
    else:
        second += b"not gzip"
    shard = tmp_path / "d.tar.gz"
    shard.write_bytes(first + bytes(second))
    at = len(first) + (len(second) - 8 if damage == "garbage" else 0)
    expected = rf"d\.tar\.gz: .*gzip.* at offset {at}$"
    with pytest.raises(CorruptDeflateError, match=expected):
        scan_shard(str(shard))
    with pytest.raises(CorruptDeflateError, match=expected):
        list(tarindex.TarStream([str(shard)]))


def test_trailing_zeros_after_the_members_are_padding(tmp_path: Path) -> None:
    data = b"".join(bytes([i]) * 1000 for i in range(50))
    stream = gzip_module.compress(data) + bytes(4096)
    assert b"".join(decompress_gzip([stream[i : i + 777] for i in range(0, len(stream), 777)], "z.gz")) == data
