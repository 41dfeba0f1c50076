"""Constructor arguments checked by one helper module (tarindex._args): our error classes, a sentence that says
what to pass, and nothing read or started before the check."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tarindex
from conftest import make_shard_set
from tarindex import OptionError, OptionTypeError, TarDataset, TarStream, build_index


@pytest.fixture
def index(tmp_path: Path) -> Path:
    return build_index(make_shard_set(tmp_path / "d", n_shards=2, per=3)).path


def test_decoders_must_be_a_mapping_of_functions(impl: str, index: Path) -> None:
    said = (
        r"decoders must be a mapping of extension to a function of the member's bytes, e\.g\. \{'jpg': my_decoder\}, "
        r"not list \['jpg'\]; to decode the known extensions with the built-in decoders, pass decode= instead \(e\.g\. decode='pil'\)"
    )
    for make in (lambda: TarDataset(index, decoders=["jpg"]), lambda: TarStream(index, decoders=["jpg"]), lambda: tarindex.decode.Decoder(decoders=["jpg"])):  # type: ignore[arg-type,dict-item]
        with pytest.raises(OptionTypeError, match=said) as caught:
            make()
        assert isinstance(caught.value, TypeError) and isinstance(caught.value, tarindex.TarIndexError)
    with pytest.raises(OptionTypeError, match=r"decoders\['cls'\] must be a function of the member's bytes, not str 'int'"):
        TarDataset(index, decoders={"cls": "int"})  # type: ignore[dict-item]
    with pytest.raises(OptionTypeError, match=r"decoders: a key must be an extension \(str\) such as 'jpg', not int 3"):
        TarStream(index, decoders={3: int})  # type: ignore[dict-item]
    ds = TarDataset(index, decoders={"cls": int})  # a mapping of functions: taken, and used
    assert ds[4]["cls"] == 1


def test_max_open_files_is_a_count_of_at_least_one(impl: str, index: Path) -> None:
    with pytest.raises(OptionError, match=r"max_open_files must be an integer >= 1 \(shard files kept open per process\), not 0$"):
        TarDataset(index, max_open_files=0)
    with pytest.raises(OptionTypeError, match=r"max_open_files must be an integer >= 1 .*, not str '8'$"):
        TarDataset(index, max_open_files="8")  # type: ignore[arg-type]
    with pytest.raises(OptionTypeError, match=r"not bool True$"):
        TarDataset(index, max_open_files=True)
    ds = TarDataset(index, max_open_files=np.int64(1))  # any integer type
    assert ds.max_open_files == 1 and type(ds.max_open_files) is int
    assert [ds[i]["__key__"] for i in (0, 5, 0)] == ["s00i000", "s01i002", "s00i000"]  # one file open at a time


def test_epoch_size_zero_is_refused_not_an_empty_epoch(impl: str, index: Path) -> None:
    said = r"epoch_size must be an integer >= 1 \(samples per rank per epoch\) or None \(each shard once\), not 0$"
    with pytest.raises(OptionError, match=said) as caught:
        TarStream(index, epoch_size=0)
    assert isinstance(caught.value, ValueError)
    with pytest.raises(OptionTypeError, match=r"epoch_size must be .*, not float 10\.0$"):
        TarStream(index, epoch_size=10.0)  # type: ignore[arg-type]
    with pytest.raises(OptionError, match=r"epoch_size must be an integer >= 1 \(samples per rank per epoch\) or None \(as stop says\), not 0$"):
        tarindex.mix([TarStream(index)], epoch_size=0)
    assert len(list(TarStream(index, epoch_size=4))) == 4 and len(list(TarStream(index))) == 6


def test_a_dataset_or_a_number_is_not_a_shard_list(impl: str, index: Path) -> None:
    ds = TarDataset(index)
    with pytest.raises(OptionTypeError, match=rf"TarStream takes shard names or an index, not a TarDataset; to stream the dataset's index, pass its path: TarStream\('{index}'\)$"):
        TarStream(ds)  # type: ignore[arg-type]
    assert ds._gen == -1  # refused before it was iterated: not one sample read
    for bad, shown in [(123, "int 123"), (b"x.tar", "bytes b'x.tar'"), ({"a": 1}, "dict {'a': 1}")]:
        with pytest.raises(OptionTypeError, match=rf"urls must be shard names: a path, URL or pattern \(str\), or a list of them, e\.g\. .*, not {shown}$"):
            TarStream(bad)  # type: ignore[arg-type]
    assert len(list(TarStream(str(index)))) == len(list(TarStream(ds.index))) == 6  # what the message says to pass works


def test_every_public_constructor_refuses_a_number_for_shards(impl: str, index: Path, tmp_path: Path) -> None:
    for call, make in [
        ("TarDataset", lambda: TarDataset(123)),  # type: ignore[arg-type]
        ("build_index", lambda: build_index(123)),  # type: ignore[arg-type]
        ("TarStream", lambda: TarStream(123)),  # type: ignore[arg-type]
    ]:
        with pytest.raises(OptionTypeError, match=rf"must be shard names: a path, URL or pattern \(str\), or a list of them, e\.g\. {call}\('data/train-\{{000000\.\.000099\}}\.tar'\), not int 123$"):
            make()
    with pytest.raises(OptionError, match=r"^TarStream: urls is empty: no shards to read$"):
        TarStream([])
    with pytest.raises(OptionError, match=r"^TarDataset: source is empty: no shards to read$"):
        TarDataset([])


def test_a_sample_index_and_a_key_are_told_apart(impl: str, index: Path) -> None:
    ds = TarDataset(index)
    key = ds.keys()[1]
    with pytest.raises(OptionTypeError, match=rf"a sample index must be an integer from 0 to len\(ds\) - 1, not str '{key}'; to read the sample with key '{key}', use ds\.get\('{key}'\)$") as caught:
        ds[key]  # type: ignore[index]
    assert isinstance(caught.value, TypeError)
    with pytest.raises(OptionTypeError, match=r"a sample index must be an integer from 0 to len\(ds\) - 1, not float 1\.0$"):
        ds[1.0]  # type: ignore[index]
    with pytest.raises(OptionTypeError, match=r"a sample key must be a string \(the member names' stem, e\.g\. '000123'\), not int 1; to read sample number 1, use ds\[1\]$"):
        ds.get(1)  # type: ignore[arg-type]
    assert ds.get(key)["__key__"] == ds[1]["__key__"] == ds[np.int64(1)]["__key__"] == key  # what the messages say to write works
    assert ds[1]["__key__"] == key  # the refusal left the reader as it was


def test_a_sampler_is_given_a_dataset_not_a_stream(index: Path) -> None:
    with pytest.raises(OptionTypeError, match=r"ShardSampler samples a map-style dataset \(a TarDataset, or a ConcatDataset of them\), not a TarStream: a stream splits"):
        tarindex.ShardSampler(TarStream(index), num_replicas=1, rank=0)  # type: ignore[arg-type]
    with pytest.raises(OptionTypeError, match=r"ShardSampler needs a dataset with shard_sizes \(a TarDataset\), not list \[1, 2\]$"):
        tarindex.ShardSampler([1, 2], num_replicas=1, rank=0)  # type: ignore[arg-type]
    assert len(tarindex.ShardSampler(TarDataset(index), num_replicas=1, rank=0)) == 6


def test_shard_writer_pattern_must_number_the_shards(tmp_path: Path) -> None:
    with pytest.raises(OptionError, match=r"ShardWriter pattern '.*/out\.tar' must hold one %-format for the shard number, e\.g\. 'out/train-%06d\.tar' \(a literal % is written %%\)"):
        tarindex.ShardWriter(str(tmp_path / "out.tar"))
    with pytest.raises(OptionError, match=r"ShardWriter pattern 'a-%d-%d\.tar' must hold one %-format"):
        tarindex.ShardWriter("a-%d-%d.tar")
    with pytest.raises(OptionTypeError, match=r"ShardWriter pattern must be a path with a %-format for the shard number, e\.g\. 'out/train-%06d\.tar', not int 5$"):
        tarindex.ShardWriter(5)  # type: ignore[arg-type]
    assert not list(tmp_path.iterdir())  # refused before anything was written
    with tarindex.ShardWriter(str(tmp_path / "ok-%06d.tar")) as sink:
        sink.write({"__key__": "a", "txt": b"x"})
    assert [p.name for p in tmp_path.iterdir()] == ["ok-000000.tar"]


def test_mix_takes_streams_and_an_end(index: Path) -> None:
    with pytest.raises(OptionTypeError, match=rf"mix: source 0 is a path, not a TarStream; to mix shards by name, wrap them: tarindex\.TarStream\('{index}'\)$"):
        tarindex.mix([str(index), TarStream(index)])
    with pytest.raises(OptionTypeError, match=r"mix: source 1 must be a TarStream, not int 3$"):
        tarindex.mix([TarStream(index), 3])  # type: ignore[list-item]
    with pytest.raises(OptionError, match=r"mix: stop='never' needs epoch_size \(samples per rank per epoch\)"):
        tarindex.mix([TarStream(index)], stop="never")
    assert len(list(tarindex.mix([TarStream(index)], stop="never", epoch_size=9))) == 9


def test_build_and_merge_refuse_what_the_cli_refuses(index: Path, tmp_path: Path) -> None:
    shards = sorted(str(p) for p in index.parent.glob("*.tar"))
    with pytest.raises(OptionError, match=r"workers must be an integer >= 1 \(local scan processes\) or None \(one per CPU\), not 0$"):
        build_index(shards, index=tmp_path / "w.tarindex", workers=0)
    with pytest.raises(OptionError, match=r"^merge_indexes: parts is empty: no indexes to merge$"):
        tarindex.merge_indexes([], tmp_path / "m.tarindex")
    with pytest.raises(OptionTypeError, match=r"merge_indexes: parts must be a list of index paths"):
        tarindex.merge_indexes(str(index), tmp_path / "m.tarindex")  # type: ignore[arg-type]
    assert not (tmp_path / "m.tarindex").exists() and not (tmp_path / "w.tarindex").exists()
    assert build_index(shards, index=tmp_path / "w.tarindex", workers=1).path.is_file()
