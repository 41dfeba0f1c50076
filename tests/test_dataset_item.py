"""``ds[i]``: the reader's own read when nothing decodes or transforms; numpy integers in both read paths."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from conftest import make_shard_set
from tarindex import TarDataset, build_index


@pytest.fixture
def ds(impl: str, tmp_path: Path) -> TarDataset:
    """Both read paths: ``impl`` turns every use of the extension off for ``"python"``."""
    paths = make_shard_set(tmp_path / "data", n_shards=2, per=5)
    return TarDataset(build_index(str(paths[0].parent / "train-*.tar")).path)


def test_raw_item_is_the_read(ds: TarDataset) -> None:
    assert ds[3] == ds.read(3)
    assert type(ds).__dict__["__getitem__"].fget(ds) == ds.read  # no Python frame of ours per sample
    assert [ds[i] for i in range(len(ds))] == [ds.read(i) for i in range(len(ds))]


def test_numpy_integers(ds: TarDataset) -> None:
    assert ds[np.int64(4)] == ds[4] == ds.read(np.int32(4))  # type: ignore[arg-type]
    assert ds[np.int64(-1)] == ds[len(ds) - 1]
    assert ds[np.uint16(0)]["__index__"] == 0
    with pytest.raises(IndexError, match=r"sample 10 out of range for 10 samples"):
        ds[np.int64(10)]
    with pytest.raises(TypeError):
        ds[1.0]  # type: ignore[index]


def test_transform_and_decoder_set_later_apply(ds: TarDataset) -> None:
    raw = ds[2]
    ds.transform = lambda s: s["__key__"]
    assert ds[2] == raw["__key__"] and ds[np.int64(2)] == raw["__key__"]
    ds.transform = None
    assert ds[2] == raw
    clone = pickle.loads(pickle.dumps(ds))
    assert clone[2] == raw and clone[np.int64(-10)] == ds[0]
