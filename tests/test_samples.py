"""Grouping members into samples exactly like webdataset's reader."""

from __future__ import annotations

import gc
import io
import tarfile
import warnings
from pathlib import Path

import numpy as np
import pytest

import tarindex
from conftest import py_tar, require_c_extension, wds_write
from tarindex.samples import group_members, split_key
from tarindex.tar import iter_tar


def _wds_samples(path: Path) -> list[dict]:
    from webdataset.tariterators import group_by_keys, tar_file_expander

    with open(path, "rb") as f:
        stream = [{"stream": f, "url": str(path)}]
        return [
            {k: v for k, v in s.items() if not k.startswith("__") or k == "__key__"}
            for s in group_by_keys(tar_file_expander(stream))
        ]


def _our_samples(path: Path) -> list[dict]:
    buf = path.read_bytes()
    out = []
    for rec in group_members(iter_tar((buf,), str(path)), str(path)):
        s = {"__key__": rec.key}
        for ext, off, size in rec.members:
            s[ext] = buf[off : off + size]
        assert rec.offset <= min(off for _, off, _ in rec.members)
        out.append(s)
    return out


def _index_samples(path: Path, tmp_path: Path) -> list[dict]:
    report = tarindex.build_index(str(path), index=tmp_path / "cmp.tarindex", workers=1)
    ds = tarindex.TarDataset(report.path)
    return [{k: v for k, v in ds[i].items() if k not in ("__url__", "__index__")} for i in range(len(ds))]


def _check(path: Path, tmp_path: Path) -> None:
    expected = _wds_samples(path)
    assert expected, "oracle found no samples"
    ours = _our_samples(path)
    assert [s["__key__"] for s in ours] == [s["__key__"] for s in expected]
    assert [set(s) for s in ours] == [set(s) for s in expected]
    assert ours == expected
    assert _index_samples(path, tmp_path) == expected


def test_gnu_tar_shards_group_like_webdataset(gnu_tar_shard: Path, tmp_path: Path) -> None:
    _check(gnu_tar_shard, tmp_path)


def test_python_tar_shards_group_like_webdataset(py_tar_shard: Path, tmp_path: Path) -> None:
    _check(py_tar_shard, tmp_path)


def test_webdataset_writer_shard(wds_shard: Path, tmp_path: Path) -> None:
    _check(wds_shard, tmp_path)


def test_edge_names_group_like_webdataset(tmp_path: Path) -> None:
    specs = [
        ("__meta__", b"top-level meta, skipped"),
        ("__dir__/x.txt", b"meta dir, skipped"),
        ("nodot", b"no extension, skipped"),
        ("a.TXT", b"upper-case extension"),
        ("a.seg.png", b"multi-dot"),
        ("d.x/b.txt", b"dot in directory"),
        ("d.x/b.cls", b"1"),
        ("c.txt", b"c1"),
        ("a.json", b"{}"),  # same key again, not consecutive: a new sample
    ]
    p = py_tar(tmp_path / "edge.tar", specs, tarfile.GNU_FORMAT, dirs=False)
    _check(p, tmp_path)
    assert [s["__key__"] for s in _our_samples(p)] == ["a", "d.x/b", "c", "a"]


def test_webdataset_dataset_iteration_matches(tmp_path: Path) -> None:
    import webdataset as wds

    paths = [
        wds_write(tmp_path / f"w-{k:06d}.tar", [{"__key__": f"k{k}-{i}", "txt": f"{k}/{i}", "bin": bytes(i)} for i in range(5)])
        for k in range(3)
    ]
    url = str(tmp_path / "w-{000000..000002}.tar")
    with warnings.catch_warnings():  # webdataset leaves its shard files to the garbage collector
        warnings.simplefilter("ignore", ResourceWarning)
        ds = wds.WebDataset(url, shardshuffle=False, empty_check=False)
        expected = [{k: v for k, v in s.items() if k in ("__key__", "txt", "bin")} for s in ds]
        del ds
        gc.collect()
    report = tarindex.build_index(url, index=tmp_path / "w.tarindex", workers=2)
    ours = tarindex.TarDataset(report.path)
    got = [{k: v for k, v in s.items() if k in ("__key__", "txt", "bin")} for s in ours]
    assert got == expected
    assert {s["__url__"] for s in ours} == {str(p) for p in paths}


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("a.b", ("a", "b")),
        ("dir/x.seg.PNG", ("dir/x", "seg.png")),
        ("d.x/y.z", ("d.x/y", "z")),
        ("nodot", None),
        ("d.x/nodot", None),
    ],
)
def test_split_key(name: str, expected: tuple[str, str] | None) -> None:
    assert split_key(name) == expected


@pytest.mark.parametrize("name", ["x/.hidden.txt", ".top.txt", "a/b.c/d", "k.", "a.b.C", "d/e/f.g.h", "__k__.x"])
def test_split_key_matches_webdataset(name: str) -> None:
    from webdataset.tariterators import base_plus_ext

    key, ext = base_plus_ext(name)
    assert split_key(name) == (None if key is None else (key, ext.lower()))


def test_duplicate_extension_raises(tmp_path: Path) -> None:
    bio = io.BytesIO()
    with tarfile.open(fileobj=bio, mode="w", format=tarfile.GNU_FORMAT) as tf:
        for name in ("k.txt", "k.TXT"):
            ti = tarfile.TarInfo(name)
            ti.size = 1
            tf.addfile(ti, io.BytesIO(b"x"))
    buf = bio.getvalue()
    with pytest.raises(tarindex.DuplicateMemberError, match=r"dup\.tar.*at offset 1024"):
        list(group_members(iter_tar((buf,), "dup.tar"), "dup.tar"))


def _tables_both_ways(path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[object, object]:
    import dataclasses

    import tarindex.index.format as fmt

    buf = path.read_bytes()
    fast = fmt.ShardTable.from_entries(iter_tar((buf,), str(path)), str(path))
    with monkeypatch.context() as m:
        m.setattr(fmt, "_pack_members", None)
        slow = fmt.ShardTable.from_entries(iter_tar((buf,), str(path)), str(path))

    def plain(t: object) -> dict:
        return {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in dataclasses.asdict(t).items()}  # type: ignore[call-overload]

    return plain(fast), plain(slow)


def test_c_packing_equals_the_reference(
    gnu_tar_shard: Path, py_tar_shard: Path, wds_shard: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:

    require_c_extension()
    mixed_case = py_tar(tmp_path / "case.tar", [("a.JPG", b"1"), ("a.cls", b"2"), ("b.jpg", b"3"), ("b.Cls", b"4")], tarfile.GNU_FORMAT, dirs=False)
    for path in (gnu_tar_shard, py_tar_shard, wds_shard, mixed_case):
        fast, slow = _tables_both_ways(path, monkeypatch)
        assert fast == slow, path
        assert fast["keys"], path  # samples were found
    assert _tables_both_ways(mixed_case, monkeypatch)[0]["exts"] == ["jpg", "cls"]


def test_c_packing_hands_unusual_names_and_errors_to_the_reference(tmp_path: Path) -> None:
    from tarindex._speedups import pack_members

    assert pack_members([("x/.hidden.txt", 0, 512, 1, None)]) is None  # webdataset's quirk: the regex decides
    assert pack_members([("__key__.txt", 0, 512, 1, None)]) is None  # metadata names
    assert pack_members([("k.txt", 0, 512, 1, None), ("k.TXT", 1024, 1536, 1, None)]) is None  # the error is Python's
    got = pack_members([("d/k.a.b", 0, 512, 5, None), ("d/k.c", 1024, 1536, 600, None), ("m.a.b", 2560, 3072, 0, None)])
    assert got is not None
    s_off, s_size, s_n, m_ext, m_off, m_size, keys, exts = got
    assert keys == ["d/k", "m"] and exts == ["a.b", "c"]
    assert list(np.frombuffer(s_off, np.uint64)) == [0, 2560] and list(np.frombuffer(s_size, np.uint64)) == [2560, 512]
    assert list(np.frombuffer(s_n, np.uint32)) == [2, 1] and list(np.frombuffer(m_ext, np.uint16)) == [0, 1, 0]
    assert list(np.frombuffer(m_off, np.uint64)) == [512, 1536, 512] and list(np.frombuffer(m_size, np.uint64)) == [5, 600, 0]
    dup = py_tar(tmp_path / "dup2.tar", [("k.txt", b"x"), ("k.TXT", b"y")], tarfile.GNU_FORMAT, dirs=False)
    with pytest.raises(tarindex.DuplicateMemberError, match=r"dup2\.tar.*at offset 1024"):
        tarindex.build_index(str(dup), index=tmp_path / "dup.tarindex", workers=1)
