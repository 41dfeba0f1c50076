"""Grouping members into samples exactly like webdataset's reader."""

from __future__ import annotations

import gc
import io
import re
import tarfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tarindex
from conftest import PY_FORMATS, py_tar, require_c_extension, tarfile_members, use_pure_python, wds_write
from tarindex.grouping import group_members, split_key
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


# -- the C packer against the reference ----------------------------------------------------

PACK_WAYS = ["c-walk", "c-file", "c-chunks", "c-add", "c-entries", "python"]
"""How a shard is indexed: the C packer walking plain headers itself (a whole buffer, a file read
with pread, 700-byte chunks so headers straddle them), the C packer fed by the Python walker
alone, the C packer fed entries, and the pure-Python reference."""


class _AddOnlyPackers:
    """The C extension with its ``Packer`` wrapped in :class:`AddOnly` (no C walk): set as the one switch."""

    def __init__(self, speedups: Any) -> None:
        self._speedups = speedups

    def __getattr__(self, name: str) -> Any:
        return getattr(self._speedups, name)

    def Packer(self, *args: Any) -> Any:  # the C type's name
        return AddOnly(self._speedups.Packer(*args))


def _table(path: Path, way: str, monkeypatch: pytest.MonkeyPatch) -> dict:
    import dataclasses
    import os

    import tarindex._native
    import tarindex.grouping
    import tarindex.tar
    from tarindex.scan import table_from_chunks, table_from_entries, table_from_file

    buf = path.read_bytes()
    with monkeypatch.context() as m:
        if way == "c-add":  # the C packer without its walks: every member through add()
            m.setattr(tarindex._native, "SPEEDUPS", _AddOnlyPackers(tarindex._native.SPEEDUPS))
        if way == "python":
            use_pure_python(m)
        if way == "c-file":
            fd = os.open(path, os.O_RDONLY)
            try:
                table = table_from_file(fd, str(path))
            finally:
                os.close(fd)
        elif way == "c-chunks":
            table = table_from_chunks((buf[i : i + 700] for i in range(0, len(buf), 700)), str(path))
        elif way == "c-entries":
            table = table_from_entries(iter_tar((buf,), str(path)), str(path))
        else:
            table = table_from_chunks((buf,), str(path))
    return {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in dataclasses.asdict(table).items()}


def _outcome(path: Path, way: str, monkeypatch: pytest.MonkeyPatch) -> object:
    """The table, or the error's type and message."""
    try:
        return _table(path, way, monkeypatch)
    except tarindex.TarIndexError as exc:
        return type(exc).__name__, str(exc)


def _all_ways_agree(path: Path, monkeypatch: pytest.MonkeyPatch) -> object:
    require_c_extension()
    reference = _outcome(path, "python", monkeypatch)
    for way in PACK_WAYS[:-1]:
        assert _outcome(path, way, monkeypatch) == reference, (path, way)
    return reference


ODD_NAMES = [
    ("nodot", b"no extension, skipped"),
    (".top.txt", b"a top-level name starting with a dot"),
    ("x/.hidden.txt", b"webdataset's quirk: key x/"),
    ("x/.hidden.cls", b"same key x/, another extension"),
    ("x/y", b"no dot in the base name"),
    ("__key__", b"meta"),
    ("__key__.txt", b"not meta: key __key__"),
    ("__dir__/k.txt", b"meta dir"),
    ("__notmeta.txt", b"a key with a leading __"),
    ("_k.txt", b"one leading underscore"),
    ("a.seg.png", b"multi-dot"),
    ("a.SEG.PNG2", b"multi-dot upper case"),
    ("a.cls", b"1"),
    ("d.x/b.txt", b"dot in a directory"),
    ("d.x/b.ÄBC", b"non-ASCII extension, lower-cased"),
    ("k.", b"empty extension"),
    ("k.j", b"same key"),
    ("ünï/样本.TXT", b"unicode"),
    ("L" * 120 + ".txt", b"GNU long name"),
    ("L" * 120 + ".cls", b"its second member"),
    ("m.txt", b""),
    ("a.txt", b"key a again, not consecutive: a new sample"),
]


@pytest.mark.parametrize("fmt", ["gnu", "pax"])
def test_c_packer_equals_the_reference_on_odd_names(fmt: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = py_tar(tmp_path / f"odd-{fmt}.tar", ODD_NAMES, PY_FORMATS[fmt])  # with a directory and a symlink
    table = _all_ways_agree(path, monkeypatch)
    assert isinstance(table, dict)
    assert table["keys"] == ["x/", "__key__", "__notmeta", "_k", "a", "d.x/b", "k", "ünï/样本", "L" * 120, "m", "a"]
    assert table["exts"] == ["hidden.txt", "hidden.cls", "txt", "seg.png", "seg.png2", "cls", "äbc", "", "j"]


def test_c_packer_equals_the_reference_on_real_shards(
    gnu_tar_shard: Path, py_tar_shard: Path, wds_shard: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mixed_case = py_tar(tmp_path / "case.tar", [("a.JPG", b"1"), ("a.cls", b"2"), ("b.jpg", b"3"), ("b.Cls", b"4")], tarfile.GNU_FORMAT, dirs=False)
    for path in (gnu_tar_shard, py_tar_shard, wds_shard, mixed_case):
        table = _all_ways_agree(path, monkeypatch)
        assert isinstance(table, dict) and table["keys"], path  # samples were found
    assert _table(mixed_case, "c-walk", monkeypatch)["exts"] == ["jpg", "cls"]


def test_c_packer_many_extension_spellings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    specs = [(f"k{i:03d}.{'E' if i % 2 else 'e'}{i % 90}", b"x") for i in range(300)]  # 90 extensions, 180 spellings
    specs += [(f"z.e{i}", b"y") for i in range(90, 100)]
    path = py_tar(tmp_path / "spell.tar", specs, tarfile.GNU_FORMAT, dirs=False)
    table = _all_ways_agree(path, monkeypatch)
    assert isinstance(table, dict) and len(table["exts"]) == 100 and len(table["keys"]) == 301


def test_duplicate_extension_is_raised_after_the_walk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dup = py_tar(tmp_path / "dup2.tar", [("a.txt", b"1"), ("k.txt", b"x"), ("k.TXT", b"y"), ("k.cls", b"z")], tarfile.GNU_FORMAT, dirs=False)
    assert _all_ways_agree(dup, monkeypatch) == (
        "DuplicateMemberError",
        f"{dup}: duplicate extension 'txt' in sample 'k' (member 'k.TXT') at offset 2048",
    )
    odd = py_tar(tmp_path / "dup3.tar", [("x/.h.txt", b"x"), ("x/.h.txt", b"y")], tarfile.GNU_FORMAT, dirs=False)
    assert _all_ways_agree(odd, monkeypatch)[0] == "DuplicateMemberError"  # type: ignore[index]
    # a damaged header after the duplicate: the walk's error wins, as when grouping after the walk
    buf = bytearray(dup.read_bytes())
    buf[3 * 1024 + 148 : 3 * 1024 + 156] = b"0000000\x00"
    damaged = tmp_path / "dup-damaged.tar"
    damaged.write_bytes(bytes(buf))
    kind, message = _all_ways_agree(damaged, monkeypatch)  # type: ignore[misc]
    assert kind == "CorruptArchiveError" and "bad header checksum" in message and "offset 3072" in message
    with pytest.raises(tarindex.DuplicateMemberError, match=r"dup2\.tar.*at offset 2048"):
        tarindex.build_index(str(dup), index=tmp_path / "dup.tarindex", workers=1)


_NAME = st.text(alphabet="ab._/A\u00e9_", min_size=0, max_size=12)


@settings(max_examples=60, deadline=None)
@given(
    names=st.lists(st.tuples(_NAME, st.integers(0, 1500)), min_size=1, max_size=25),
    fmt=st.sampled_from(["gnu", "pax"]),
)
def test_c_packer_equals_the_reference_property(names: list[tuple[str, int]], fmt: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    specs = [(n.strip("/") or "x", bytes(size)) for n, size in names]  # tarfile keeps names; empty ones need a character
    path = py_tar(tmp_path_factory.mktemp("prop") / "p.tar", specs, PY_FORMATS[fmt], dirs=False)
    with pytest.MonkeyPatch.context() as monkeypatch:
        _all_ways_agree(path, monkeypatch)


def test_c_packer_api(tmp_path: Path) -> None:
    require_c_extension()
    from tarindex._speedups import Packer
    from tarindex.grouping import sample_key

    p = Packer(sample_key, lambda *a: tarindex.DuplicateMemberError("x", a[0], repr(a)))
    p.add("d/k.a.b", 0, 512, 5)
    p.add("d/k.c", 1024, 1536, 600)
    p.add("__meta__", 2560, 3072, 1)
    p.add("m.A.B", 3584, 4096, 0)
    s_off, s_size, s_n, m_ext, m_off, m_size, keys, exts = p.finish()
    assert keys == ["d/k", "m"] and exts == ["a.b", "c"]
    assert list(np.frombuffer(s_off, np.uint64)) == [0, 3584] and list(np.frombuffer(s_size, np.uint64)) == [2560, 512]
    assert list(np.frombuffer(s_n, np.uint32)) == [2, 1] and list(np.frombuffer(m_ext, np.uint16)) == [0, 1, 0]
    assert list(np.frombuffer(m_off, np.uint64)) == [512, 1536, 512] and list(np.frombuffer(m_size, np.uint64)) == [5, 600, 0]
    with pytest.raises(RuntimeError, match="finished"):
        p.finish()
    q = Packer(sample_key, lambda *a: tarindex.DuplicateMemberError("x.tar", a[0], f"dup {a[1:]}"))
    q.add("k.txt", 0, 512, 1)
    q.add("k.TXT", 1024, 1536, 1)
    with pytest.raises(tarindex.DuplicateMemberError, match=r"x\.tar: dup \('txt', 'k', 'k.TXT'\) at offset 1024"):
        q.finish()


def test_sample_batches_hold_nothing_the_cyclic_gc_tracks(tmp_path: Path) -> None:
    """Completed samples come out as (offsets, dicts), no tuple per sample: a tuple holding a dict stays
    tracked, and a 16 MiB batch of small samples then filled the collector's old generation."""
    require_c_extension()
    import os

    from tarindex._speedups import Packer
    from tarindex.grouping import iter_samples, sample_key

    p = Packer(sample_key, lambda *a: tarindex.DuplicateMemberError("x", a[0], repr(a)), "u.tar", 7)
    p.add("k.a", 0, 512, 1, b"x")
    p.add("j.a", 1024, 1536, 1, b"y")
    p.finish()
    offsets, samples = p.take()
    assert offsets == [0, 1024]
    assert samples == [{"__key__": "k", "__url__": "u.tar", "__index__": 7, "a": b"x"}, {"__key__": "j", "__url__": "u.tar", "__index__": 8, "a": b"y"}]
    assert not any(gc.is_tracked(s) for s in samples)
    assert p.take() == ([], [])
    path = py_tar(tmp_path / "s.tar", [(f"{i:05d}.{ext}", b"v" * 10) for i in range(3000) for ext in ("a", "b")], tarfile.GNU_FORMAT, dirs=False)
    fd = os.open(path, os.O_RDONLY)
    try:
        got = list(iter_samples(fd, str(path)))
    finally:
        os.close(fd)
    assert len(got) == 3000 and not any(gc.is_tracked(s) for _, s in got)


# -- samples with data (TarStream): the fused C walk against the reference ---------------------

SAMPLE_WAYS = ["c-file", "c-chunks", "c-add", "c-file-batches", "c-chunks-batches", "python"]
"""The C packer reading the file with pread, over 700-byte chunks, fed by the Python walker alone,
the first two again with tiny batches (3,000 bytes, 5 headers); the reference."""


class AddOnly:
    """A sink with ``add``, ``take`` and ``finish`` only (no walk of its own), around a packer."""

    def __init__(self, packer: Any) -> None:
        self.packer = packer

    def add(self, *member: Any) -> None:
        self.packer.add(*member)

    def take(self) -> Any:
        return self.packer.take()

    def finish(self) -> Any:
        return self.packer.finish()


def _samples_outcome(path: Path, way: str, monkeypatch: pytest.MonkeyPatch) -> tuple[list, object]:
    """The samples (offset, dict) yielded, and the error after them (type and message) or None."""
    import os

    import tarindex._native
    import tarindex.grouping
    import tarindex.tar
    from tarindex.grouping import iter_samples

    buf = path.read_bytes()
    got: list = []
    with monkeypatch.context() as m:
        if way == "c-add":  # the C packer without its walks: every member through add()
            m.setattr(tarindex._native, "SPEEDUPS", _AddOnlyPackers(tarindex._native.SPEEDUPS))
        if way == "python":
            use_pure_python(m)
        if way.endswith("-batches"):
            m.setattr(tarindex.tar, "_BATCH_BYTES", 3000)
            m.setattr(tarindex.tar, "_DIRECT_BATCH_BYTES", 3000)
            m.setattr(tarindex.tar, "_BATCH_HEADERS", 5)
        fd = os.open(path, os.O_RDONLY)
        try:
            source = fd if way.startswith(("c-file", "python")) else (buf[i : i + 700] for i in range(0, len(buf), 700))
            for item in iter_samples(source, str(path), index=7):
                got.append(item)
        except tarindex.TarIndexError as exc:
            return got, (type(exc).__name__, str(exc))
        finally:
            os.close(fd)
    return got, None


def _samples_agree(path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list, object]:
    """Every way gives the reference's samples and error: before an error, every sample completed
    before the failing header (each header is verified before it is used)."""
    require_c_extension()
    reference = _samples_outcome(path, "python", monkeypatch)
    for way in SAMPLE_WAYS[:-1]:
        samples, error = _samples_outcome(path, way, monkeypatch)
        assert error == reference[1], (path, way)
        assert samples == reference[0], (path, way)
    return reference


def test_c_samples_equal_the_reference(
    gnu_tar_shard: Path, py_tar_shard: Path, wds_shard: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    odd = py_tar(tmp_path / "odd.tar", ODD_NAMES, tarfile.PAX_FORMAT)
    for path in (gnu_tar_shard, py_tar_shard, wds_shard, odd):
        samples, error = _samples_agree(path, monkeypatch)
        assert error is None and samples, path
        assert [s["__index__"] for _, s in samples] == list(range(7, 7 + len(samples)))
        assert all(list(s)[:3] == ["__key__", "__url__", "__index__"] for _, s in samples)
    expected = _wds_samples(wds_shard)
    assert [{k: v for k, v in s.items() if k not in ("__url__", "__index__")} for _, s in _samples_agree(wds_shard, monkeypatch)[0]] == expected


def test_c_samples_large_members_and_windows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Members larger than the reader's windows (4 and 64 KiB), straddling them, and small ones between."""
    import os

    rng = np.random.default_rng(3)
    specs = []
    for i in range(30):
        big = int(rng.integers(0, 200_000)) if i % 3 else int(rng.integers(60_000, 70_000))
        specs += [(f"k{i:03d}.jpg", os.urandom(big)), (f"k{i:03d}.cls", str(i).encode()), (f"k{i:03d}.json", b"{}" * int(rng.integers(0, 3000)))]
    path = py_tar(tmp_path / "big.tar", specs, tarfile.GNU_FORMAT, dirs=False)
    samples, error = _samples_agree(path, monkeypatch)
    assert error is None and len(samples) == 30
    members = dict(tarfile_members(path))
    for _, s in samples:
        for ext in ("jpg", "cls", "json"):
            assert s[ext] == members[f"{s['__key__']}.{ext}"]


def test_c_samples_errors_equal_the_reference(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    specs = [(f"k{i}.{ext}", bytes(700 * i)) for i in range(6) for ext in ("bin", "cls")]
    good = py_tar(tmp_path / "good.tar", specs, tarfile.GNU_FORMAT, dirs=False).read_bytes()
    dup = py_tar(tmp_path / "dup.tar", [("a.txt", b"1"), ("b.txt", b"2"), ("b.TXT", b"3"), ("c.txt", b"4")], tarfile.GNU_FORMAT, dirs=False)
    samples, error = _samples_agree(dup, monkeypatch)
    assert [s["__key__"] for _, s in samples] == ["a"]  # the samples before the duplicate come out first
    assert error == ("DuplicateMemberError", f"{dup}: duplicate extension 'txt' in sample 'b' (member 'b.TXT') at offset 2048")
    with tarfile.open(tmp_path / "good.tar") as tf:
        at = tf.getmembers()[6].offset  # k3.bin's header
    cases = {
        "truncated-data": good[: len(good) // 2 + 100],
        "truncated-header": good[:5 * 1024 + 100],
        "truncated-padding": good[: at + 512 + 2100 + 100],  # k3.bin: 2,100 bytes of data, cut in its padding
        "no-end": good[: good.rindex(b"k5.cls") + 1024],
        "bad-checksum": good[:4096] + good[4096:4244] + b"1234567\0" + good[4252:],
        "garbage": good[:at] + bytes(range(256)) * 2 + good[at + 512 :],
    }
    whole = [{k: v for k, v in s.items() if k != "__url__"} for _, s in _samples_outcome(tmp_path / "good.tar", "python", monkeypatch)[0]]
    for name, data in cases.items():
        path = tmp_path / f"{name}.tar"
        path.write_bytes(data)
        _, error = _samples_agree(path, monkeypatch)
        assert isinstance(error, tuple) and error[0] == "CorruptArchiveError" and f"{name}.tar" in error[1], (name, error)
        assert re.search(r"at offset \d+", error[1]), error
        for way in SAMPLE_WAYS:  # what comes out before the error is the shard's own samples, complete
            before = [{k: v for k, v in s.items() if k != "__url__"} for _, s in _samples_outcome(path, way, monkeypatch)[0]]
            assert before == whole[: len(before)] and len(before) < len(whole), (name, way)


@settings(max_examples=40, deadline=None)
@given(
    names=st.lists(st.tuples(_NAME, st.integers(0, 9000)), min_size=1, max_size=20),
    fmt=st.sampled_from(["gnu", "pax"]),
)
def test_c_samples_equal_the_reference_property(names: list[tuple[str, int]], fmt: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    specs = [(n.strip("/") or "x", bytes(size)) for n, size in names]
    path = py_tar(tmp_path_factory.mktemp("sprop") / "p.tar", specs, PY_FORMATS[fmt], dirs=False)
    with pytest.MonkeyPatch.context() as monkeypatch:
        _samples_agree(path, monkeypatch)
