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
