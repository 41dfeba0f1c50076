"""Datasets of some shards of an index (views), the index found beside a shard, paths fixed when a dataset is made."""

from __future__ import annotations

import os
import pickle
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

import tarindex
from conftest import gnu_tar, make_shard_set, tarfile_members, wds_write, write_tree
from tarindex import IndexNotFoundError, PatternError, SampleNotFoundError, ShardSampler, TarDataset, build_index
from tarindex.cli.main import main


@pytest.fixture(autouse=True)
def read_path(impl: str) -> str:
    """Every test here runs on both backends: the C reader (with its view runs) and the Python reference."""
    return impl


def _oracle(paths: list[Path]) -> list[tuple[str, str, dict[str, bytes]]]:
    """Samples by tarfile, in the order of ``paths``: (key, shard, {extension: bytes})."""
    out: list[tuple[str, str, dict[str, bytes]]] = []
    for p in paths:
        for name, data in tarfile_members(p):
            key, ext = name.split(".", 1)
            if not out or out[-1][0] != key or out[-1][1] != str(p):
                out.append((key, str(p), {}))
            out[-1][2][ext] = data
    return out


def _samples(ds: TarDataset) -> list[tuple[str, str, dict[str, bytes]]]:
    got = []
    for i in range(len(ds)):
        s = ds[i]
        assert s["__index__"] == i
        got.append((s["__key__"], s["__url__"], {k: bytes(v) for k, v in s.items() if not k.startswith("__")}))
    return got


@pytest.fixture
def three(tmp_path: Path) -> list[Path]:
    """``d/train-00000{0,1,2}.tar`` (tarfile, 10 samples each), indexed as ``d/train.tarindex``."""
    paths = make_shard_set(tmp_path / "d", n_shards=3, per=10)
    assert build_index(str(tmp_path / "d" / "train-*.tar"), workers=1).path == tmp_path / "d" / "train.tarindex"
    return paths


def test_a_pattern_reads_exactly_the_shards_it_names(three: list[Path]) -> None:
    d = three[0].parent
    ds = TarDataset(str(d / "train-{000000..000001}.tar"))
    expected = _oracle(three[:2])
    assert len(ds) == 20 and ds.index_path == d / "train.tarindex"
    assert _samples(ds) == expected
    assert list(ds.keys()) == [k for k, _, _ in expected]
    assert ds.shard_sizes == [10, 10] and sum(ds.shard_sizes) == len(ds)
    assert ds[-1]["__key__"] == expected[-1][0]
    with pytest.raises(IndexError, match="sample 20 out of range for 20 samples"):
        ds[20]
    assert ds.get("s01i004")["__index__"] == 14
    with pytest.raises(SampleNotFoundError, match=re.escape(f"the sample with key 's02i004' is in {three[2]}, not one of this dataset's 2 shards")):
        ds.get("s02i004")
    assert "shards=2" in repr(ds) and "samples=20" in repr(ds)
    whole = TarDataset(str(d / "train-*.tar"))  # the whole index, in its order: no view
    assert len(whole) == 30 and whole._map is None and _samples(whole) == _oracle(three)
    stream = list(tarindex.TarStream(str(d / "train-{000000..000001}.tar")))  # the same shards streamed
    assert [s["__key__"] for s in stream] == [k for k, _, _ in expected]


def test_shards_named_out_of_order_are_read_in_the_order_named(three: list[Path], tmp_path: Path) -> None:
    d = three[0].parent
    extra = wds_write(d / "train-000003.tar", [{"__key__": f"w{i:03d}", "txt": f"w {i}"} for i in range(7)])  # webdataset's writer
    src = tmp_path / "src"
    write_tree(src, [(f"g{i:03d}.{ext}", f"{ext} {i}".encode()) for i in range(5) for ext in ("txt", "json")])
    pax = gnu_tar(src, d / "train-000004.tar", "pax", [f"g{i:03d}.{ext}" for i in range(5) for ext in ("txt", "json")])  # GNU tar
    build_index(str(d / "train-*.tar"), workers=1)
    ds = TarDataset([str(extra), str(three[2]), str(pax), str(three[0])])
    expected = _oracle([extra, three[2], pax, three[0]])
    assert _samples(ds) == expected and ds.shard_sizes == [7, 10, 5, 10]
    for i, (key, _, _) in enumerate(expected):
        assert ds.get(key)["__index__"] == i
    with pytest.raises(SampleNotFoundError, match="s01i000"):
        ds.get("s01i000")
    with pytest.raises(PatternError, match=re.escape(f"{three[0]}: named twice; a dataset reads each shard once")):
        TarDataset([str(three[0]), str(three[1]), str(three[0])])


def test_samplers_pickling_and_workers_see_only_the_view(three: list[Path]) -> None:
    from torch.utils.data import DataLoader, DistributedSampler

    d = three[0].parent
    ds = TarDataset(str(d / "train-{000002,000000}.tar"))
    keys = [k for k, _, _ in _oracle([three[2], three[0]])]
    clone = pickle.loads(pickle.dumps(ds))
    assert len(clone) == 20 and [clone[i]["__key__"] for i in range(20)] == keys
    for make in (lambda r: ShardSampler(ds, num_replicas=2, rank=r, seed=3), lambda r: DistributedSampler(ds, num_replicas=2, rank=r, seed=3)):
        seen = sorted(i for r in range(2) for i in make(r))
        assert seen == list(range(20))  # every sample of the view once, none of shard 1
    sampler = ShardSampler(ds, num_replicas=1, rank=0, seed=1, chunk_shards=1)
    order = list(sampler)
    assert sorted(order) == list(range(20))
    assert {i // 10 for i in order[:10]} in ({0}, {1})  # a window of one shard: shards are the view's
    loader = DataLoader(ds, sampler=order, batch_size=4, num_workers=2, collate_fn=list, multiprocessing_context="fork")
    got = [s for batch in loader for s in batch]
    assert [s["__key__"] for s in got] == [keys[i] for i in order]
    assert {s["__url__"] for s in got} == {str(three[2]), str(three[0])}


def test_a_pattern_naming_a_shard_the_index_lacks_is_an_error(three: list[Path]) -> None:
    d = three[0].parent
    make_shard_set(d, n_shards=5, per=10)  # train-000003 and -000004 now exist, not indexed
    message = (
        f"{d / 'train.tarindex'}: this index (3 shards) does not hold 2 of the 5 shards named: "
        f"{d / 'train-000003.tar'}, {d / 'train-000004.tar'}; add them with 'tarindex build' over the whole set"
    )
    with pytest.raises(IndexNotFoundError, match=re.escape(message)):
        TarDataset(str(d / "train-*.tar"))
    result = CliRunner().invoke(main, ["ls", str(d / "train-000004.tar")])
    assert result.exit_code == 1 and result.stderr.count("\n") == 1
    assert result.stderr.startswith(f"tarindex: error: {d / 'train.tarindex'}: this index (3 shards) does not hold the shard named: ")


def test_one_shard_finds_the_index_of_its_set(three: list[Path]) -> None:
    d = three[0].parent
    runner = CliRunner()
    info = runner.invoke(main, ["info", str(three[1])])  # first: info reads the meta with its own LMDB handle
    assert info.exit_code == 0 and f"index:          {d / 'train.tarindex'} (format" in info.stdout, info.output
    verified = runner.invoke(main, ["verify", str(three[1])])
    assert verified.exit_code == 0, verified.output
    ds = TarDataset(str(three[1]))
    assert ds.index_path == d / "train.tarindex" and _samples(ds) == _oracle([three[1]])
    listed = runner.invoke(main, ["ls", str(three[1])])
    assert listed.exit_code == 0, listed.output
    rows = [line.split("\t") for line in listed.stdout.splitlines()]
    assert [r[0] for r in rows] == [str(i) for i in range(10)] and {r[2] for r in rows} == {"train-000001.tar"}
    assert [r[1] for r in rows] == [k for k, _, _ in _oracle([three[1]])]
    got = runner.invoke(main, ["get", str(three[1]), "s01i003", "--ext", "txt"])
    assert got.exit_code == 0 and got.stdout_bytes == b"text 1 3"
    outside = runner.invoke(main, ["get", str(three[1]), "s00i003", "--ext", "txt"])
    assert outside.exit_code == 1 and "not one of this dataset's 1 shard\n" in outside.stderr


def test_another_index_beside_the_shards_is_found_when_it_holds_them(three: list[Path]) -> None:
    d = three[0].parent
    (d / "train.tarindex").rename(d / "all.tarindex")
    assert TarDataset(str(three[0])).index_path == d / "all.tarindex"
    build_index([str(three[2])], index=d / "val.tarindex")
    build_index([str(p) for p in three[:2]], index=d / "train.tarindex")
    assert TarDataset(str(three[2])).index_path == d / "all.tarindex"  # the first by name that holds it
    (d / "all.tarindex").unlink()
    ds = TarDataset(str(three[2]))
    assert ds.index_path == d / "val.tarindex" and _samples(ds) == _oracle([three[2]])
    message = (
        f"{d / 'train.tarindex'}: this index (2 shards) does not hold 1 of the 2 shards named: {three[2]} "
        "(nor does any other index beside it: val.tarindex)"
    )
    with pytest.raises(IndexNotFoundError, match=re.escape(message)):  # none holds both: never fewer samples
        TarDataset([str(three[1]), str(three[2])])


def test_no_index_beside_the_shards_says_what_was_looked_for(tmp_path: Path) -> None:
    paths = make_shard_set(tmp_path / "d", n_shards=2, per=2)
    with pytest.raises(IndexNotFoundError, match=re.escape(
        f"{tmp_path / 'd'}: no index beside these shards (looked for train-000000.tarindex, train.tarindex, shards.tarindex "
        "and any other *.tarindex); build one with 'tarindex build'"
    )):  # fmt: skip
        TarDataset(str(paths[0]))
    result = CliRunner().invoke(main, ["info", str(paths[0])])
    assert result.exit_code == 1 and "no index beside these shards (looked for train-000000.tarindex" in result.stderr


def test_a_view_is_mapped_again_after_a_rebuild_in_place(three: list[Path]) -> None:
    d = three[0].parent
    ds = TarDataset([str(three[1]), str(three[2])])
    before = _samples(ds)
    extra = make_shard_set(d / "x", n_shards=1, per=4)[0]
    moved = shutil.move(extra, d / "train-000000a.tar")  # sorts between shards 0 and 1: their numbers change
    build_index(str(d / "train-*.tar"), workers=1)
    assert TarDataset(str(d / "train-*.tar")).shard_sizes == [10, 4, 10, 10]
    worker = pickle.loads(pickle.dumps(ds))  # a DataLoader worker made after the rebuild attaches to the new index
    assert _samples(worker) == before and worker.shard_sizes == [10, 10]
    os.unlink(moved)
    os.unlink(three[2])
    build_index(str(d / "train-*.tar"), workers=1, drop_unlisted=True)
    with pytest.raises(IndexNotFoundError, match=re.escape(f"{d / 'train.tarindex'}: the index was rebuilt and no longer holds 1 of this dataset's shards (first {three[2]})")):
        pickle.loads(pickle.dumps(ds))[0]


def test_relative_paths_are_resolved_when_the_dataset_is_made(three: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    by_index = TarDataset("d/train.tarindex")
    by_pattern = TarDataset("d/train-{000001..000002}.tar")
    stream = tarindex.TarStream("d/train-*.tar")
    indexed = tarindex.TarStream("d/train.tarindex")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # as Hydra does after the dataset is made
    assert _samples(by_index) == _oracle(three)
    assert _samples(by_pattern) == _oracle(three[1:])
    assert [s["__key__"] for s in stream] == [s["__key__"] for s in indexed] == [k for k, _, _ in _oracle(three)]
    assert by_index.index_path == tmp_path / "d" / "train.tarindex"


def test_a_broad_glob_leaves_indexes_out(three: list[Path], tmp_path: Path) -> None:
    d = three[0].parent
    (d / "notes.txt").write_text("not a shard, not an index")
    first = build_index(str(d / "*.tar*"), index=d / "shards.tarindex", workers=1)
    again = build_index(str(d / "*.tar*"), index=d / "shards.tarindex", workers=1)  # train.tarindex and shards.tarindex left out
    assert first.scanned == [str(p) for p in three] and again.scanned == [] and len(again.reused) == 3
    assert [s["__key__"] for s in tarindex.TarStream(str(d / "*.tar*"))] == [k for k, _, _ in _oracle(three)]
    result = CliRunner().invoke(main, ["build", str(d / "*.tar*"), "-q"])
    assert result.exit_code == 0, result.output
    named = CliRunner().invoke(main, ["build", str(d / "train.tarindex"), "-o", str(tmp_path / "x.tarindex"), "-q"])
    assert named.exit_code == 1 and "train.tarindex" in named.stderr  # named by the user: tried as a shard, and refused
    only = d / "only"
    only.mkdir()
    build_index([str(three[0])], index=only / "a.idx")
    with pytest.raises(tarindex.ShardNotFoundError, match=re.escape(f"{only / '*'}: no shard matches this pattern (only the tarindex index {only / 'a.idx'})")):
        build_index(str(only / "*"), index=tmp_path / "y.tarindex")
