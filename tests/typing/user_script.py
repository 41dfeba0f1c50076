"""A user's program, type-checked by mypy --strict in tests/test_import.py (never run).

It imports only the front door, as a user would; every name must come out with its real type
(not ``Any`` or ``object``), so that editors complete it and mypy checks calls against it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, assert_type

import tarindex


def build(shards: list[Path], out: Path) -> Path:
    report = tarindex.build_index(shards, index=out, workers=2)
    assert_type(report, tarindex.BuildReport)
    return tarindex.merge_indexes([report.path], out.with_suffix(".merged.tarindex"))


def first_label(index: Path) -> bytes:
    ds = tarindex.TarDataset(index, decode="numpy")
    assert_type(ds, tarindex.TarDataset)
    sampler = tarindex.ShardSampler(ds, num_replicas=2, rank=0, seed=1)
    sampler.set_epoch(3)
    state: dict[str, Any] = sampler.state_dict()
    sampler.load_state_dict(state)
    first = next(iter(sampler))
    sample = ds.read(int(first))
    label = sample["cls"]
    assert isinstance(label, bytes)
    return label


def stream(urls: list[str]) -> Iterator[Any]:
    ds = tarindex.TarStream(urls, shuffle=100, epoch_size=1000, handler="warn")
    assert_type(ds, tarindex.TarStream)
    staged = ds.decode("pil").to_tuple("jpg", "cls").batched(16)
    assert_type(staged, tarindex.TarStream)
    staged.set_epoch(1)
    yield from staged


def write(out: str) -> None:
    with tarindex.ShardWriter(out + "-%06d.tar", maxcount=1000, compress="zstd") as sink:
        sink.write({"__key__": "a", "txt": b"x"})


def handled(index: Path) -> str:
    try:
        tarindex.IndexReader(index)
    except tarindex.IndexNotFoundError as exc:
        assert_type(exc, tarindex.IndexNotFoundError)
        return str(exc)
    except tarindex.CorruptArchiveError as exc:
        return f"{exc.path} {exc.offset}"
    except tarindex.TarIndexError as exc:
        return str(exc)
    return tarindex.__version__
