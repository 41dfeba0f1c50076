"""``tarindex export``: DALI's webdataset index files (compared byte for byte with what DALI's own ``wds2idx`` tool
wrote for the same tars) and wids shard lists (read by the real ``wids`` package), from an index, without reading
a shard; and ``build`` from a wids shard list."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner

import tarindex
from conftest import make_shard_set, wds_write
from tarindex import ExportError, IndexReader, ListError
from tarindex.cli.main import main

DATA = Path(__file__).resolve().parent / "data" / "dali"
ROOT = Path(__file__).resolve().parent.parent


def dali_tars(root: Path) -> dict[str, Path]:
    """Two tars made the same way every time (tarfile, GNU format, fixed metadata): ``uniform`` (every sample has
    the same extensions; a directory entry, a symbolic link, a long directory name, sizes around block
    boundaries) and ``mixed`` (samples of different extensions). ``tests/data/dali/*.idx`` are what DALI's
    ``tools/wds2idx.py`` (v1.2) wrote for them."""
    root.mkdir(parents=True, exist_ok=True)

    def add(tf: tarfile.TarFile, name: str, data: bytes | None = None, kind: bytes = tarfile.REGTYPE) -> None:
        info = tarfile.TarInfo(name)
        info.mtime, info.uid, info.gid, info.uname, info.gname, info.mode = 1_700_000_000, 1000, 1000, "user", "user", 0o644
        info.type = kind
        if kind == tarfile.SYMTYPE:
            info.linkname = "s000.jpg"
        info.size = len(data) if data is not None else 0
        tf.addfile(info, io.BytesIO(data) if data is not None else None)

    sizes = [0, 1, 511, 512, 513, 1024, 70_000]
    out = {}
    with tarfile.open(root / "uniform.tar", "w", format=tarfile.GNU_FORMAT) as tf:
        add(tf, "d", kind=tarfile.DIRTYPE)
        for i, size in enumerate(sizes):
            prefix = ("d" * 120 + "/") if i == 3 else ""
            add(tf, f"{prefix}s{i:03d}.jpg", bytes([i]) * size)
            add(tf, f"{prefix}s{i:03d}.cls", str(i).encode())
            if i == 1:
                add(tf, "link.jpg", kind=tarfile.SYMTYPE)
    out["uniform"] = root / "uniform.tar"
    with tarfile.open(root / "mixed.tar", "w", format=tarfile.GNU_FORMAT) as tf:
        for i in range(5):
            for ext in ("jpg", "seg.png", "json")[: 1 + i % 3]:
                add(tf, f"sub/m{i:02d}.{ext}", bytes([65 + i]) * (100 * i + len(ext)))
    out["mixed"] = root / "mixed.tar"
    return out


def test_dali_index_files_are_the_bytes_wds2idx_writes(tmp_path: Path, impl: str) -> None:
    tars = dali_tars(tmp_path / "d")
    index = tarindex.build_index(list(tars.values()), index=tmp_path / "d" / "all.tarindex").path
    written = tarindex.export_dali(index, tmp_path / "dali")
    assert written == [tmp_path / "dali" / "uniform.idx", tmp_path / "dali" / "mixed.idx"]
    for name in tars:
        assert (tmp_path / "dali" / f"{name}.idx").read_bytes() == (DATA / f"{name}.idx").read_bytes(), name


def test_dali_offsets_are_data_offsets_also_under_pax_headers(tmp_path: Path) -> None:
    """webdataset's TarWriter puts a PAX header before every member; each (offset, size) of the export reads
    the member's bytes (wds2idx reads GNU tar's block numbers, which point past PAX headers, and is off there)."""
    shard = wds_write(tmp_path / "w.tar", [{"__key__": f"k{i}", "txt": "x" * i, "bin": os.urandom(700 * i)} for i in range(6)])
    index = tarindex.build_index(shard).path
    (path,) = tarindex.export_dali(index, tmp_path / "dali")
    lines = path.read_text().splitlines()
    assert lines[0] == "v1.2 6" and len(lines) == 7
    data = shard.read_bytes()
    with tarfile.open(shard) as tf:
        members = {m.name: tf.extractfile(m).read() for m in tf if m.isreg()}  # type: ignore[union-attr]
    seen = 0
    for line in lines[1:]:
        fields = line.split(" ")
        for k in range(0, len(fields), 4):
            ext, offset, size, name = fields[k], int(fields[k + 1]), int(fields[k + 2]), fields[k + 3]
            assert offset % 512 == 0 and name.endswith("." + ext)
            assert data[offset : offset + size] == members[name]
            seen += 1
    assert seen == len(members) == 12


def test_dali_export_refuses_what_its_format_cannot_hold(tmp_path: Path) -> None:
    paths = make_shard_set(tmp_path / "z", n_shards=1, per=2)
    tarindex.compress_shard(paths[0], tmp_path / "z" / "c.tar.zst")
    index = tarindex.build_index(tmp_path / "z" / "c.tar.zst").path
    with pytest.raises(ExportError, match=r"c\.tar\.zst: is a zstd shard; DALI reads plain tar files"):
        tarindex.export_dali(index, tmp_path / "dali")
    with pytest.raises(ExportError, match=r"c\.tar\.zst: is a zstd shard; wids reads plain tar files"):
        tarindex.export_wids(index, tmp_path / "w.json")
    (tmp_path / "s").mkdir()
    spaced = wds_write(tmp_path / "s" / "s.tar", [{"__key__": "a key", "txt": "x"}])
    with pytest.raises(ExportError, match=r"s\.tar: key 'a key' holds white space"):
        tarindex.export_dali(tarindex.build_index(spaced).path, tmp_path / "dali")
    empty = tmp_path / "e" / "e.tar"
    empty.parent.mkdir()
    with tarfile.open(empty, "w") as tf:
        info = tarfile.TarInfo("README")
        tf.addfile(info, io.BytesIO(b""))
    with pytest.raises(ExportError, match=r"e\.tar: has no samples"):
        tarindex.export_dali(tarindex.build_index(empty).path, tmp_path / "dali")
    assert not (tmp_path / "dali").exists() or not list((tmp_path / "dali").iterdir())


def test_a_wids_list_reads_in_wids_and_builds_the_same_index(tmp_path: Path, impl: str) -> None:
    wids = pytest.importorskip("wids")  # the test extra installs it
    paths = make_shard_set(tmp_path / "data", n_shards=3, per=4)
    index = tarindex.build_index(paths).path
    listed = tarindex.export_wids(index, tmp_path / "lists" / "train.json")
    desc = json.loads(listed.read_text())
    assert desc["__kind__"] == "wids-shard-index-v1" and desc["wids_version"] == 1 and desc["name"] == "train"
    assert [s["url"] for s in desc["shardlist"]] == [f"../data/train-{k:06d}.tar" for k in range(3)]
    assert [s["nsamples"] for s in desc["shardlist"]] == [4, 4, 4]
    assert [s["filesize"] for s in desc["shardlist"]] == [p.stat().st_size for p in paths]
    ours = tarindex.TarDataset(index)
    theirs = wids.ShardListDataset(str(listed), cache_dir=str(tmp_path / "cache"), transformations=[])
    assert len(theirs) == len(ours) == 12
    for i in range(12):
        mine, got = ours.read(i), theirs[i]
        assert got["__key__"] == mine["__key__"]
        assert {k.lstrip("."): v.read() for k, v in got.items() if not k.startswith("__")} == {k: v for k, v in mine.items() if not k.startswith("__")}
    rebuilt = tarindex.build_index(str(listed), index=tmp_path / "rebuilt.tarindex").path
    a, b = IndexReader(index), IndexReader(rebuilt)
    assert [os.path.normpath(a.shard_path(i)) for i in range(3)] == [os.path.normpath(b.shard_path(i)) for i in range(3)]
    assert a.decode().keys == b.decode().keys


def test_wids_lists_resolve_names_as_wids_does_and_run_nothing(tmp_path: Path) -> None:
    from tarindex.shards import expand_shards

    paths = make_shard_set(tmp_path / "data", n_shards=2, per=2)
    (tmp_path / "a.json").write_text(json.dumps({"wids_version": 1, "base": "data", "shardlist": [{"url": "train-000000.tar", "nsamples": 2}],
                                                 "datasets": [{"shardlist": [{"url": "data/train-000001.tar", "nsamples": 2}], "base": "."}]}))
    assert expand_shards(str(tmp_path / "a.json")) == [str(p) for p in paths]
    (tmp_path / "u.json").write_text(json.dumps({"wids_version": 1, "base": "https://host/x/y/", "shardlist": [{"url": "s-0.tar", "nsamples": 1}, {"url": "/abs/s-1.tar", "nsamples": 1}, {"url": "s3://b/s-2.tar", "nsamples": 1}]}))
    assert expand_shards(str(tmp_path / "u.json")) == ["https://host/x/y/s-0.tar", "https://host/abs/s-1.tar", "s3://b/s-2.tar"]
    for body, message in [
        ({"wids_version": 1, "shardlist": [{"url": "pipe:rm -rf /", "nsamples": 1}]}, r"shardlist\[0\]: 'pipe:rm -rf /' is a command"),
        ({"shardlist": []}, r"not a wids shard list"),
        ({"wids_version": 1, "shardlist": [{"nsamples": 1}]}, r"shardlist\[0\]: expected an object with a string \"url\""),
        ({"wids_version": 1, "datasets": [{"source_url": "http://x/y.json"}]}, r"a \"source_url\" is not followed"),
    ]:
        (tmp_path / "bad.json").write_text(json.dumps(body))
        with pytest.raises(ListError, match=message):
            expand_shards(str(tmp_path / "bad.json"))


def test_the_export_command(tmp_path: Path) -> None:
    paths = make_shard_set(tmp_path / "data", n_shards=2, per=3)
    index = tarindex.build_index(paths).path
    result = CliRunner().invoke(main, ["export", str(index), "--dali", str(tmp_path / "dali"), "--wids", str(tmp_path / "w.json")])
    assert result.exit_code == 0, result.output
    assert f"{tmp_path / 'dali'}: 2 DALI index files" in result.output
    assert sorted(os.listdir(tmp_path / "dali")) == ["train-000000.idx", "train-000001.idx"]
    assert json.loads((tmp_path / "w.json").read_text())["shardlist"][1]["url"] == "data/train-000001.tar"
    usage = CliRunner().invoke(main, ["export", str(index)])
    assert usage.exit_code == 2 and "give --dali DIR and/or --wids FILE" in usage.output
    proc = subprocess.run(
        [sys.executable, "-m", "tarindex.cli.main", "export", str(tmp_path / "nosuch.tarindex"), "--wids", str(tmp_path / "x.json")],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert proc.returncode == 1 and proc.stderr.startswith("tarindex: error: ") and proc.stderr.count("\n") == 1


def test_an_export_never_overwrites_a_file_it_did_not_write(tmp_path: Path, impl: str) -> None:
    """``--wids`` naming a shard, the index or any other file (a typo) is refused in one line and the file is
    unchanged; so is a DALI index file's name taken by another file, before any index file is written. An
    earlier export's files (and empty files) are replaced: running an export again works."""
    paths = make_shard_set(tmp_path, n_shards=2, per=3)
    index = tarindex.build_index(paths).path
    notes = tmp_path / "notes.txt"
    notes.write_text("notes\n")
    for target in (paths[1], index, notes):
        before = target.read_bytes()
        result = CliRunner().invoke(main, ["export", str(index), "--wids", str(target)])
        assert result.exit_code == 1, result.output
        assert result.output == f"tarindex: error: {target}: exists and is not a wids shard list; refusing to overwrite it: remove it first, or choose another path\n"
        assert target.read_bytes() == before
    listing = tmp_path / "w.json"
    for _ in range(2):
        assert CliRunner().invoke(main, ["export", str(index), "--wids", str(listing)]).exit_code == 0
    assert json.loads(listing.read_text())["shardlist"][0]["nsamples"] == 3
    dali = tmp_path / "dali"
    dali.mkdir()
    (dali / "train-000001.idx").write_bytes(b"mine\n")
    with pytest.raises(tarindex.OverwriteError, match=r"train-000001\.idx: exists and is not a DALI index file"):
        tarindex.export_dali(index, dali)
    assert os.listdir(dali) == ["train-000001.idx"] and (dali / "train-000001.idx").read_bytes() == b"mine\n"
    (dali / "train-000001.idx").unlink()
    for _ in range(2):
        assert len(tarindex.export_dali(index, dali)) == 2
