"""TarDataset over real indexed shards: bytes, decoding, workers, staleness, builds."""

from __future__ import annotations

import io
import json
import os
import pickle
import re
import tarfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import tarindex
from conftest import make_shard_set, open_files, py_tar, tarfile_members
from tarindex import TarDataset, build_index, merge_indexes
from tarindex.tables import ShardInfo, ShardTable


def _pattern(paths: list[Path]) -> str:
    return str(paths[0].parent / "train-*.tar")


def _oracle(paths: list[Path]) -> list[dict]:
    """Samples by tarfile: key, url and bytes per extension, in shard order."""
    out: list[dict] = []
    for p in paths:
        for name, data in tarfile_members(p):
            key, ext = name.split(".", 1)
            if not out or out[-1]["__key__"] != key or out[-1]["__url__"] != str(p):
                out.append({"__key__": key, "__url__": str(p)})
            out[-1][ext] = data
    return out


@pytest.fixture(autouse=True)
def read_path(impl: str) -> str:
    """Every test here runs on both backends: the C read path (built by the install) and the Python reference."""
    return impl


def test_read_paths_agree(built: tuple[list[Path], TarDataset], read_path: str) -> None:
    _, ds = built
    ds.read(0)
    assert (ds._fast is not None) == (read_path == "c")
    assert [ds.read(i) for i in range(len(ds))] == [ds._read_py(i) for i in range(len(ds))]


@pytest.mark.parametrize("zstd", [False, True])
def test_a_shards_first_read_is_the_read_paths_own(tmp_path: Path, read_path: str, zstd: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The C reader reads a shard's first sample itself (its handle's open resolves the shard's name), by
    ``ds[i]`` and in a batch: no read is handed to the Python path, and the bytes are tarfile's."""
    plain = make_shard_set(tmp_path / "data", n_shards=3, per=5)
    shards = [p.with_suffix(".tar.zst") for p in plain] if zstd else plain
    for p, z in zip(plain, shards):
        if zstd:
            tarindex.compress_shard(p, z, frame_size=1024)
    expected = [{**e, "__url__": str(shards[k // 5])} for k, e in enumerate(_oracle(plain))]
    ds = TarDataset(build_index([str(p) for p in shards], index=tmp_path / "i.tarindex", workers=1).path)
    handed: list[int] = []
    real = TarDataset._read_py

    def counted(self: TarDataset, i: int) -> dict:
        handed.append(i)
        return real(self, i)

    monkeypatch.setattr(TarDataset, "_read_py", counted)
    got = [ds[7], ds[0], *ds.__getitems__([12, 1, 8])]  # shards 1 and 0 first read by ds[i], shard 2 in a batch
    assert [_strip(s) for s in got] == [expected[i] for i in (7, 0, 12, 1, 8)]
    if read_path == "c":
        assert handed == []
    else:  # the reference reads each ds[i] (a batch of local shards: its ranges read together, zstd's sample by sample)
        assert handed == ([7, 0, 12, 1, 8] if zstd else [7, 0])


def _strip(sample: dict) -> dict:
    return {k: v for k, v in sample.items() if k != "__index__"}


@pytest.fixture
def built(tmp_path: Path) -> tuple[list[Path], TarDataset]:
    paths = make_shard_set(tmp_path / "data", n_shards=4, per=6)
    report = build_index(_pattern(paths), workers=2)
    return paths, TarDataset(report.path)


def test_bytes_equal_tarfile(built: tuple[list[Path], TarDataset]) -> None:
    paths, ds = built
    expected = _oracle(paths)
    assert len(ds) == len(expected) == 24
    for i, exp in enumerate(expected):
        s = ds[i]
        assert s["__index__"] == i
        assert _strip(s) == exp
        assert all(isinstance(v, bytes) for k, v in s.items() if not k.startswith("__"))
    assert [_strip(s) for s in ds] == expected
    assert list(ds.keys()) == [e["__key__"] for e in expected]
    assert _strip(ds[-1]) == expected[-1]
    with pytest.raises(IndexError):
        ds[len(ds)]


def test_get_by_key(built: tuple[list[Path], TarDataset]) -> None:
    paths, ds = built
    expected = _oracle(paths)
    s = ds.get("s02i003")
    assert _strip(s) == expected[2 * 6 + 3]
    assert s["__index__"] == 15
    with pytest.raises(tarindex.SampleNotFoundError):
        ds.get("no-such-key")


def test_keys_are_a_sized_view(built: tuple[list[Path], TarDataset]) -> None:
    paths, ds = built
    expected = [s["__key__"] for s in _oracle(paths)]
    keys = ds.keys()
    assert len(keys) == len(ds) == 24
    assert list(keys) == expected and keys[0] == expected[0] and keys[-1] == expected[-1] and keys[3:6] == expected[3:6]
    assert "s02i003" in keys and "no-such-key" not in keys and 7 not in keys
    with pytest.raises(IndexError, match="key 24 out of range for 24 samples"):
        keys[24]
    some = TarDataset(paths[1:3])  # some shards of the index: their keys only
    assert len(some.keys()) == 12 and list(some.keys()) == expected[6:18]
    some_keys = some.keys()
    assert "s01i000" in some_keys and "s00i000" not in some_keys
    assert len(TarDataset(paths[3]).keys()) == 6 and repr(keys).startswith("<keys of TarDataset(")
    one = TarDataset(build_index(make_shard_set(paths[0].parent.parent / "one", n_shards=1, per=1)).path)
    with pytest.raises(IndexError, match=r"sample 1 out of range for 1 sample$"):
        one[1]


def test_default_index_beside_shards(built: tuple[list[Path], TarDataset]) -> None:
    paths, ds = built
    assert ds.index_path == paths[0].parent / "train.tarindex"
    ds2 = TarDataset(_pattern(paths))
    assert len(ds2) == len(ds)


def _image_shard(tmp_path: Path) -> tuple[Path, np.ndarray]:
    from PIL import Image

    rng = np.random.default_rng(0)
    arr = rng.integers(0, 256, (12, 16, 3), dtype=np.uint8)
    png, jpg, gray = io.BytesIO(), io.BytesIO(), io.BytesIO()
    Image.fromarray(arr).save(png, format="PNG")
    Image.fromarray(arr).save(jpg, format="JPEG")
    Image.fromarray(arr[:, :, 0]).save(gray, format="PNG")
    npy = io.BytesIO()
    np.save(npy, np.arange(6, dtype=np.float32).reshape(2, 3))
    specs = [
        ("img0.png", png.getvalue()),
        ("img0.jpg", jpg.getvalue()),
        ("img0.seg.png", gray.getvalue()),
        ("img0.json", json.dumps({"label": "cat", "n": 3}).encode()),
        ("img0.cls", b" 4\n"),
        ("img0.txt", "héllo".encode()),
        ("img0.npy", npy.getvalue()),
        ("img0.raw", b"\x01\x02"),
    ]
    return py_tar(tmp_path / "img-000000.tar", specs, tarfile.PAX_FORMAT, dirs=False), arr


@pytest.fixture
def image_index(tmp_path: Path) -> tuple[Path, np.ndarray]:
    shard, arr = _image_shard(tmp_path)
    return build_index(str(shard), workers=2).path, arr


def _check_common(s: dict) -> None:
    assert s["json"] == {"label": "cat", "n": 3}
    assert s["cls"] == 4
    assert s["txt"] == "héllo"
    np.testing.assert_array_equal(s["npy"], np.arange(6, dtype=np.float32).reshape(2, 3))
    assert s["raw"] == b"\x01\x02"


def test_decode_none_keeps_bytes(image_index: tuple[Path, np.ndarray]) -> None:
    s = TarDataset(image_index[0])[0]
    assert all(isinstance(s[k], bytes) for k in ("png", "jpg", "json", "cls", "txt", "npy"))


def test_decode_pil(image_index: tuple[Path, np.ndarray]) -> None:
    from PIL import Image

    path, arr = image_index
    s = TarDataset(path, decode="pil")[0]
    assert isinstance(s["png"], Image.Image) and isinstance(s["jpg"], Image.Image)
    np.testing.assert_array_equal(np.asarray(s["png"]), arr)
    assert s["jpg"].size == (16, 12)
    assert s["seg.png"].mode == "RGB"  # webdataset's "pil" is RGB; "pill" is gray
    assert TarDataset(path, decode="pill")[0]["seg.png"].mode == "L"
    _check_common(s)


def test_decode_numpy(image_index: tuple[Path, np.ndarray]) -> None:
    path, arr = image_index
    s = TarDataset(path, decode="numpy")[0]
    assert s["png"].dtype == np.uint8
    np.testing.assert_array_equal(s["png"], arr)
    assert s["jpg"].shape == (12, 16, 3)
    assert s["seg.png"].shape == (12, 16, 1)
    np.testing.assert_array_equal(s["seg.png"][:, :, 0], arr[:, :, 0])
    _check_common(s)


def test_decode_torchrgb8(image_index: tuple[Path, np.ndarray]) -> None:
    import torch

    path, arr = image_index
    s = TarDataset(path, decode="torchrgb8")[0]
    assert isinstance(s["png"], torch.Tensor) and s["png"].dtype == torch.uint8
    assert tuple(s["png"].shape) == (3, 12, 16)
    np.testing.assert_array_equal(s["png"].permute(1, 2, 0).numpy(), arr)
    assert tuple(s["jpg"].shape) == (3, 12, 16)
    assert tuple(s["seg.png"].shape) == (3, 12, 16)  # webdataset's torchrgb8: gray repeated
    np.testing.assert_array_equal(s["seg.png"][1].numpy(), arr[:, :, 0])
    own = TarDataset(path, decode=tarindex.decode.Image(output="tensor", mode=None))[0]
    assert tuple(own["seg.png"].shape) == (1, 12, 16)  # the image's own channels
    _check_common(s)


def test_decode_torch_is_refused_with_both_spellings(image_index: tuple[Path, np.ndarray]) -> None:
    with pytest.raises(ValueError, match=r"'torch' is ambiguous.*'torchrgb'.*'torchrgb8'"):
        TarDataset(image_index[0], decode="torch")  # type: ignore[arg-type]


def test_bad_decode_mode(image_index: tuple[Path, np.ndarray]) -> None:
    with pytest.raises(ValueError, match="decode"):
        TarDataset(image_index[0], decode="cv2")  # type: ignore[arg-type]


def test_custom_decoders_and_transform(image_index: tuple[Path, np.ndarray]) -> None:
    path, _ = image_index
    ds = TarDataset(
        path,
        decoders={"raw": lambda b: list(b), "seg.png": len, "txt": lambda b: b.upper()},
        transform=lambda s: (s["__key__"], s["raw"], s["seg.png"], s["txt"], s["cls"]),
    )
    key, raw, seg, txt, cls = ds[0]
    assert key == "img0"
    assert raw == [1, 2]
    assert isinstance(seg, int) and seg > 0
    assert txt == "héllo".encode().upper()
    assert cls == 4  # built-in decoders apply once decoders are given


def test_pickle_round_trip(built: tuple[list[Path], TarDataset]) -> None:
    _, ds = built
    ds[3]  # attach and open a shard in this process first
    clone = pickle.loads(pickle.dumps(ds))
    assert len(clone) == len(ds)
    assert [_strip(clone[i]) for i in range(len(ds))] == [_strip(ds[i]) for i in range(len(ds))]
    decoded = TarDataset(ds.index_path, decode="numpy", transform=_key_of)
    assert pickle.loads(pickle.dumps(decoded))[5] == ds[5]["__key__"]


def _key_of(sample: dict) -> str:
    return sample["__key__"]


def test_dataloader_workers_each_sample_once(built: tuple[list[Path], TarDataset]) -> None:
    from torch.utils.data import DataLoader

    paths, ds = built
    expected = _oracle(paths)
    ds.read(0)  # attached here first: the forked workers inherit this process's reader and must attach anew
    got = list(DataLoader(ds, num_workers=2, batch_size=None, multiprocessing_context="fork"))
    assert sorted(int(s["__index__"]) for s in got) == list(range(len(ds)))
    assert all(_strip(s) == expected[s["__index__"]] for s in got)


def test_distributed_sampler_disjoint_and_complete(built: tuple[list[Path], TarDataset]) -> None:
    from torch.utils.data import DistributedSampler

    _, ds = built
    assert len(ds) % 2 == 0
    parts = []
    for rank in (0, 1):
        sampler = DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=7)
        sampler.set_epoch(0)
        parts.append({ds[i]["__index__"] for i in sampler})
    assert parts[0].isdisjoint(parts[1])
    assert parts[0] | parts[1] == set(range(len(ds)))
    assert len(parts[0]) == len(parts[1]) == len(ds) // 2


def test_max_open_files_lru(tmp_path: Path) -> None:
    paths = make_shard_set(tmp_path / "lru", n_shards=5, per=3)
    report = build_index(_pattern(paths), workers=2)
    ds = TarDataset(report.path, max_open_files=2)
    expected = _oracle(paths)
    order = list(range(len(ds)))
    order = order[::2] + order[1::2] + order[::-1]  # jump between shards
    for i in order:
        assert _strip(ds[i]) == expected[i]
        assert len(open_files(paths)) <= 2
    ds.close()
    assert open_files(paths) == {}


def test_threads_share_a_dataset_with_few_open_files(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    paths = make_shard_set(tmp_path / "threads", n_shards=6, per=4)
    ds = TarDataset(build_index(_pattern(paths), workers=1).path, max_open_files=2)
    expected = _oracle(paths)
    order = [int(i) for i in np.random.default_rng(0).integers(0, len(ds), 4000)]
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(ds.__getitem__, order))
    assert [_strip(s) for s in got] == [expected[i] for i in order]
    assert len(open_files(paths)) <= 2
    ds.close()
    assert open_files(paths) == {}


def test_stale_shard_appended(built: tuple[list[Path], TarDataset]) -> None:
    paths, _ = built
    with open(paths[1], "ab") as f:
        f.write(b"\0" * 512)
    ds = TarDataset(_pattern(paths))
    assert ds[0]["__key__"] == "s00i000"  # other shards still fine
    with pytest.raises(tarindex.StaleIndexError, match=str(paths[1])) as info:
        ds[6]
    assert info.value.path == str(paths[1])


def test_stale_shard_mtime(built: tuple[list[Path], TarDataset]) -> None:
    paths, _ = built
    st = paths[2].stat()
    os.utime(paths[2], ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    ds = TarDataset(_pattern(paths))
    assert ds[12]["__key__"] == "s02i000"  # a new mtime alone: the fingerprint says it is the same shard
    buf = bytearray(paths[3].read_bytes())
    buf[512] ^= 1  # the first member's data: same size, other content, new mtime
    paths[3].write_bytes(bytes(buf))
    with pytest.raises(tarindex.StaleIndexError, match=f"{paths[3]}: .*content fingerprint differs"):
        ds[18]


def test_missing_shard(built: tuple[list[Path], TarDataset]) -> None:
    paths, ds = built
    index = ds.index_path
    del ds
    paths[3].unlink()
    ds = TarDataset(index)
    assert ds[0]["__key__"] == "s00i000"
    with pytest.raises(tarindex.ShardNotFoundError, match=str(paths[3])):
        ds[len(ds) - 1]


def test_not_an_index(tmp_path: Path) -> None:
    junk = tmp_path / "junk.tarindex"
    junk.write_bytes(b"this is not an lmdb file" * 100)
    with pytest.raises(tarindex.IndexFormatError):
        TarDataset(junk)
    other = tmp_path / "other.bin"
    other.write_bytes(os.urandom(8192))
    with pytest.raises(tarindex.IndexFormatError):
        TarDataset(other)


def test_missing_index(tmp_path: Path) -> None:
    with pytest.raises(tarindex.IndexNotFoundError):
        TarDataset(tmp_path / "nothing.tarindex")


def test_failed_build_keeps_previous_index(tmp_path: Path) -> None:
    paths = make_shard_set(tmp_path / "data", n_shards=3, per=4)
    report = build_index(_pattern(paths), workers=2)
    before = report.path.read_bytes()
    listing = sorted(os.listdir(report.path.parent))
    buf = bytearray(paths[1].read_bytes())
    buf[2 * 512 + 5] ^= 0xFF  # the name of the second member's header: checksum now wrong
    st = paths[1].stat()
    paths[1].write_bytes(bytes(buf))
    os.utime(paths[1], ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))  # surely seen as changed
    with pytest.raises(tarindex.CorruptArchiveError, match=str(paths[1])):
        build_index(_pattern(paths), workers=2)
    assert report.path.read_bytes() == before
    assert sorted(os.listdir(report.path.parent)) == listing
    ds = TarDataset(report.path)
    assert ds[0]["__key__"] == "s00i000"


def test_incremental_rebuild(tmp_path: Path) -> None:
    paths = make_shard_set(tmp_path / "data", n_shards=4, per=3)
    first = build_index(_pattern(paths), workers=2)
    assert sorted(first.scanned) == sorted(map(str, paths)) and first.reused == []
    again = build_index(_pattern(paths), workers=2)
    assert again.scanned == [] and sorted(again.reused) == sorted(map(str, paths))
    buf = bytearray(paths[2].read_bytes())
    buf[512] ^= 1  # the first member's data: same size, other content
    paths[2].write_bytes(bytes(buf))
    third = build_index(_pattern(paths), workers=2)
    assert third.scanned == [str(paths[2])]
    assert sorted(third.reused) == sorted(str(p) for p in paths if p != paths[2])
    ds = TarDataset(third.path)
    assert [_strip(s) for s in ds] == _oracle(paths)


def test_part_builds_merge_equal_full_build(tmp_path: Path) -> None:
    paths = make_shard_set(tmp_path / "data", n_shards=5, per=4)
    pattern = _pattern(paths)
    full = TarDataset(build_index(pattern, index=tmp_path / "full.tarindex", workers=2).path)
    p1 = build_index(pattern, index=tmp_path / "p1.tarindex", part=(1, 2), workers=2)
    p2 = build_index(pattern, index=tmp_path / "p2.tarindex", part=(2, 2), workers=2)
    assert set(p1.scanned).isdisjoint(p2.scanned)
    assert sorted(p1.scanned + p2.scanned) == sorted(map(str, paths))
    out = merge_indexes([p1.path, p2.path], tmp_path / "all.tarindex")
    merged = TarDataset(out)
    assert len(merged) == len(full) == 20
    for i in range(len(full)):
        assert merged[i] == full[i]
    assert merged.get("s04i002") == full.get("s04i002")
    with pytest.raises(tarindex.TarIndexError):
        merge_indexes([p1.path, p1.path], tmp_path / "dup.tarindex")


def _damaged_index(tmp_path: Path, damage: Callable[[ShardTable, ShardInfo], None]) -> tuple[Path, TarDataset, int]:
    """A one-shard index that ``damage`` edited before writing: the shard, the dataset and the shard's size."""
    from tarindex.index.writer import IndexWriter
    from tarindex.scan import scan_shard

    paths = make_shard_set(tmp_path / "short", n_shards=1, per=3)
    info, table = scan_shard(str(paths[0]))
    damage(table, info)
    with IndexWriter(tmp_path / "short" / "bad.tarindex") as w:
        w.add(type(info)(paths[0].name, info.size, info.mtime_ns, info.fingerprint, info.n_samples, info.n_members), table)
    return paths[0], TarDataset(tmp_path / "short" / "bad.tarindex"), info.size


def test_index_past_the_end_of_a_shard_is_a_damaged_index(tmp_path: Path) -> None:
    def damage(table: ShardTable, info: ShardInfo) -> None:
        table.sample_offset[-1] = info.size - 100  # the index now says the last sample runs past the end

    _, ds, size = _damaged_index(tmp_path, damage)
    assert _strip(ds[0])["__key__"] == "s00i000"
    past = rf"the record of sample 2 is damaged \(\d+ bytes at offset {size - 100} past the {size} bytes of shard 0\)"
    with pytest.raises(tarindex.IndexFormatError, match=rf"{re.escape(str(ds.index_path))}: {past}"):
        ds[2]  # checked against the shard's record before anything is read or allocated


def test_out_of_range_member_in_a_record_is_a_damaged_index(tmp_path: Path) -> None:
    def damage(table: ShardTable, info: ShardInfo) -> None:
        table.member_size[0] = table.sample_size[0]  # the first member now runs past its sample's range

    _, ds, _ = _damaged_index(tmp_path, damage)
    assert _strip(ds[1])["__key__"] == "s00i001"
    with pytest.raises(tarindex.IndexFormatError, match=rf"{re.escape(str(ds.index_path))}: the record of sample 0 is damaged \(a member at"):
        ds[0]


def test_a_method_taken_before_the_first_read_stays_cheap(built: tuple[list[Path], TarDataset]) -> None:
    paths, ds = built
    fresh = TarDataset(ds.index_path)
    read = fresh.read  # the class's method: it attaches once, then hands over to the attached reader
    first = [read(i) for i in range(len(fresh))]
    reader, files = fresh.__dict__["read"], open_files(paths)
    assert [read(i) for i in range(len(fresh))] == first == [fresh[i] for i in range(len(fresh))]
    assert fresh.__dict__["read"] is reader and open_files(paths) == files  # no new reader, no new file handles
    assert "read" not in fresh.__getstate__()


def test_batched_fetch_keeps_the_sampler_order(built: tuple[list[Path], TarDataset]) -> None:
    import torch

    paths, ds = built
    expected = _oracle(paths)
    order = list(range(len(ds)))[::-1][::2] + list(range(len(ds)))[::2]
    loader = torch.utils.data.DataLoader(ds, sampler=order, batch_size=5, collate_fn=list)
    got = [s for batch in loader for s in batch]
    assert [s["__index__"] for s in got] == order
    assert [_strip(s) for s in got] == [expected[i] for i in order]


def test_datasets_are_freed_with_their_files(built: tuple[list[Path], TarDataset]) -> None:
    import gc
    import weakref

    paths, ds = built
    before = open_files(paths)
    fresh = TarDataset(ds.index_path)
    fresh[0], fresh[len(fresh) - 1]
    fds = [fd for fd in open_files(paths) if fd not in before]
    assert len(fds) == 2
    ref = weakref.ref(fresh)
    del fresh
    gc.collect()
    assert ref() is None, "the dataset was not freed (a reference cycle the collector cannot see?)"
    for fd in fds:
        with pytest.raises(OSError):
            os.fstat(fd)  # closed with the dataset
