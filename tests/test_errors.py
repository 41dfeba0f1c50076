"""Errors: every class re-exported from the front door, pickled and re-raised across processes with type and message."""

from __future__ import annotations

import inspect
import pickle
import warnings
from pathlib import Path

import pytest

import tarindex
from conftest import make_shard_set
from tarindex import errors
from tarindex.build import build_index
from tarindex.dataset import TarDataset

ERRORS = [getattr(errors, name) for name in errors.__all__ if issubclass(getattr(errors, name), BaseException)]
ARGUMENTS = {"path": "data/shard-000003.tar", "url": "http://host/shard-000003.tar", "offset": 10752}


def test_every_error_and_warning_is_in_the_front_door() -> None:
    for name in errors.__all__:
        assert name in tarindex.__all__, name
        assert getattr(tarindex, name) is getattr(errors, name)
    assert issubclass(tarindex.StreamWarning, tarindex.TarIndexWarning)


def _example(cls: type[BaseException]) -> BaseException:
    """An instance made through the class's own constructor, with its fields filled in."""
    try:
        signature = inspect.signature(cls)
    except ValueError:  # a builtin constructor (the warnings): one message
        signature = inspect.Signature()
    params = [p for p in signature.parameters.values() if p.kind is p.POSITIONAL_OR_KEYWORD]
    if not params:
        return cls(f"{ARGUMENTS['path']}: something went wrong")
    return cls(*(ARGUMENTS.get(p.name, f"{p.name} of {cls.__name__}") for p in params))


@pytest.mark.parametrize("cls", ERRORS, ids=lambda c: c.__name__)
def test_pickle_keeps_type_message_and_fields(cls: type[BaseException]) -> None:
    error = _example(cls)
    clone = pickle.loads(pickle.dumps(error))
    assert type(clone) is cls
    assert str(clone) == str(error)
    assert "shard-000003.tar" in str(clone)
    assert vars(clone) == vars(error)
    if isinstance(error, errors.TarIndexError):
        assert isinstance(clone, errors.TarIndexError)


@pytest.mark.parametrize("cls", [c for c in ERRORS if issubclass(c, errors.TarIndexError)], ids=lambda c: c.__name__)
def test_made_from_its_message_alone(cls: type[errors.TarIndexError]) -> None:
    """torch's DataLoader re-raises a worker's error as type(error)(message=...)."""
    error = cls(message="Caught it in DataLoader worker process 0")
    assert str(error) == "Caught it in DataLoader worker process 0"
    assert error.message == str(error)


def test_fields_and_messages() -> None:
    error = errors.CorruptArchiveError("a.tar", 1024, "bad header checksum")
    assert (error.path, error.offset, error.what) == ("a.tar", 1024, "bad header checksum")
    assert str(error) == "a.tar: bad header checksum at offset 1024"
    assert str(errors.DecodeError("a.tar", 512, "bad JPEG")) == "a.tar: bad JPEG (sample at offset 512)"
    source = errors.SourceError("http://h/a.tar", 7, "connection reset")
    assert str(source) == "http://h/a.tar: connection reset at byte offset 7"
    assert isinstance(source, OSError) and source.errno is None
    stale = errors.StaleIndexError(Path("a.tar"), "size 1 -> 2")
    assert (stale.path, stale.changed) == ("a.tar", "size 1 -> 2")
    assert str(stale) == "a.tar: shard changed since it was indexed (size 1 -> 2); rebuild the index"
    assert str(errors.SampleNotFoundError("a.tarindex: no sample with key 'x'")) == "a.tarindex: no sample with key 'x'"


def test_warning_is_a_tarindex_warning() -> None:
    with pytest.warns(tarindex.TarIndexWarning, match="fewer shards"), warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn(tarindex.StreamWarning("fewer shards than workers"), stacklevel=1)


def test_type_survives_a_dataloader_worker(tmp_path: Path) -> None:
    from torch.utils.data import DataLoader

    paths = make_shard_set(tmp_path / "data", n_shards=2, per=3)
    ds = TarDataset(build_index([str(p) for p in paths], workers=1).path)
    with open(paths[1], "ab") as f:  # the second shard grows after indexing
        f.write(b"\0" * 512)
    loader = DataLoader(ds, num_workers=1, batch_size=None, multiprocessing_context="fork")
    with pytest.raises(tarindex.StaleIndexError, match=f"DataLoader worker(.|\n)*{paths[1]}: shard changed"):
        list(loader)
