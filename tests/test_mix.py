"""tarindex.mix: weighted mixing of TarStreams (proportions, stop rules, splitting, resume)."""

from __future__ import annotations

import gc
import itertools
import json
import math
from collections import Counter
from pathlib import Path

import pytest
import torch.utils.data

import tarindex
from conftest import make_shard_set, open_files
from tarindex import StateError, TarStream
from tarindex._epochs import Draws, pick, stream_key


@pytest.fixture(scope="module")
def sets(tmp_path_factory: pytest.TempPathFactory) -> list[list[str]]:
    """Three datasets: 4 shards x 30, 2 x 20, 1 x 10 samples."""
    root = tmp_path_factory.mktemp("mix")
    return [
        [str(p) for p in make_shard_set(root / name, n_shards=n, per=per)]
        for name, n, per in (("a", 4, 30), ("b", 2, 20), ("c", 1, 10))
    ]


def _source(sample: dict) -> str:
    return Path(sample["__url__"]).parent.name + "/" + sample["__key__"]


def _mix(sets: list[list[str]], **kw: object) -> tarindex.Mix:
    weights = kw.pop("weights", (0.5, 0.3, 0.2))
    return tarindex.mix([TarStream(urls, shuffle=8, seed=1) for urls in sets], weights, **kw)  # type: ignore[arg-type]


def test_proportions_within_a_binomial_bound(sets: list[list[str]]) -> None:
    n = 100_000
    weights = (0.5, 0.3, 0.2)
    got = Counter(s["__url__"].split("/")[-2] for s in itertools.islice(_mix(sets, weights=weights, seed=3, stop="never", epoch_size=n), n))
    for name, p in zip("abc", weights):
        assert abs(got[name] - n * p) <= 5 * math.sqrt(n * p * (1 - p)), (name, got)


def test_deterministic_for_a_seed(sets: list[list[str]]) -> None:
    first = [_source(s) for s in _mix(sets, seed=2, stop="all")]
    assert first == [_source(s) for s in _mix(sets, seed=2, stop="all")]
    assert first != [_source(s) for s in _mix(sets, seed=5, stop="all")]


def test_stop_rules(sets: list[list[str]]) -> None:
    everything = Counter(_source(s) for urls in sets for s in TarStream(urls))
    assert Counter(_source(s) for s in _mix(sets, stop="all")) == everything  # every sample once
    first = Counter(_source(s).split("/")[0] for s in _mix(sets, stop="first"))
    assert max(first["a"] / 120, first["b"] / 40, first["c"] / 10) == 1.0  # stopped when one source ran out
    assert sum(first.values()) < 170
    never = [_source(s) for s in itertools.islice(_mix(sets, stop="never", epoch_size=600), 600)]
    assert Counter(x.split("/")[0] for x in never)["c"] > 10  # the small source repeats
    assert len(list(_mix(sets, stop="never", epoch_size=77))) == 77


def test_splits_over_ranks_and_workers_like_its_sources(sets: list[list[str]], tmp_path: Path) -> None:
    both = [sets[0], [str(p) for p in make_shard_set(tmp_path / "d", n_shards=4, per=10)]]  # a shard per reader
    seen: list[str] = []
    for rank in range(2):
        streams = [TarStream(urls, shuffle=8, seed=1, rank=rank, world_size=2) for urls in both]
        mixed = tarindex.mix(streams, (2, 1), stop="all")
        seen += list(torch.utils.data.DataLoader(mixed, batch_size=None, num_workers=2, collate_fn=_source))
    assert Counter(seen) == Counter(_source(s) for urls in both for s in TarStream(urls))


@pytest.mark.parametrize("stop", ["all", "never"])
def test_resume_exactly(sets: list[list[str]], stop: str) -> None:
    kw = {"seed": 4, "stop": stop, "epoch_size": 200 if stop == "never" else None}
    full = [_source(s) for s in _mix(sets, **kw)]
    for k in (0, 7, 95, len(full) - 1):
        mixed = _mix(sets, **kw)
        it = iter(mixed)
        head = [_source(next(it)) for _ in range(k)]
        state = json.loads(json.dumps(mixed.state_dict()))
        resumed = _mix(sets, **kw)
        resumed.load_state_dict(state)
        assert head + [_source(s) for s in resumed] == full, k


def test_a_mix_closes_its_sources_files(sets: list[list[str]]) -> None:
    """The mix pulls its sources' epochs directly: it closes their files itself, at its end and when
    it is dropped, also those a resumed source opened to read buffered samples again."""
    paths = [p for urls in sets for p in urls]
    mixed = _mix(sets, seed=4, stop="all")
    it = iter(mixed)
    head = [_source(next(it)) for _ in range(40)]
    state = json.loads(json.dumps(mixed.state_dict()))
    assert open_files(paths)
    del it
    gc.collect()
    assert open_files(paths) == {}
    assert json.loads(json.dumps(mixed.state_dict())) == state  # the position outlives the iterator
    resumed = _mix(sets, seed=4, stop="all")
    resumed.load_state_dict(state)
    rest = [_source(s) for s in resumed]
    assert open_files(paths) == {}
    assert sorted(head + rest) == sorted(_source(s) for s in _mix(sets, seed=4, stop="all"))


def _one_draw_at_a_time(sets: list[list[str]], seed: int, stop: str, epoch_size: int | None) -> tuple[list[str], list[int]]:
    """The definition of the mix, one draw and one sample at a time: the samples, and the draws made
    after each of them."""
    weights = (0.5, 0.3, 0.2)
    sources = [TarStream(urls, shuffle=8, seed=1) for urls in sets]
    draws = Draws(stream_key("tarindex-mix", seed, 0, 0, 0))
    iterators = [iter(s) for s in sources]
    active = [True] * len(sources)
    step, out, steps = 0, [], []
    while epoch_size is None or len(out) < epoch_size:
        cumulative = list(itertools.accumulate(w if a else 0.0 for w, a in zip(weights, active)))
        if cumulative[-1] <= 0:
            break
        k = pick(draws, step, cumulative)
        step += 1
        sample = next(iterators[k], None)
        if sample is None:
            if stop == "first":
                break
            if stop == "all":
                active[k] = False
                continue
            iterators[k] = iter(sources[k])
            sample = next(iterators[k])
        out.append(_source(sample))
        steps.append(step)
    return out, steps


@pytest.mark.parametrize(("stop", "epoch_size"), [("first", None), ("all", None), ("never", 300), ("all", 100)])
def test_blocks_of_draws_give_the_one_at_a_time_sequence(sets: list[list[str]], stop: str, epoch_size: int | None) -> None:
    """Draws in blocks, samples pulled in C: the same samples, and at every sample the same state,
    as one draw at a time; a state taken where a source ran out resumes exactly."""
    expected, steps = _one_draw_at_a_time(sets, 9, stop, epoch_size)
    mixed = _mix(sets, seed=9, stop=stop, epoch_size=epoch_size)
    got, states = [], []
    for sample in mixed:
        got.append(_source(sample))
        state = mixed.state_dict()
        states.append(state)
        assert (state["step"], state["yielded"]) == (steps[len(got) - 1], len(got))
    assert got == expected
    assert states[-1]["done"] is False and mixed.state_dict()["done"] is True
    ran_out = [i for i in range(1, len(steps)) if steps[i] - steps[i - 1] > 1 or expected[i] in expected[:i]]
    if stop != "first":
        assert ran_out  # a source ran out inside a block of draws
    for i in [*ran_out[:3], len(got) - 1]:
        resumed = _mix(sets, seed=9, stop=stop, epoch_size=epoch_size)
        resumed.load_state_dict(json.loads(json.dumps(states[i])))
        assert [_source(s) for s in resumed] == expected[i + 1 :], i


def test_resume_through_stateful_dataloader(sets: list[list[str]]) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    def loader() -> StatefulDataLoader:
        return StatefulDataLoader(_mix(sets[:2], seed=6, stop="all", weights=(3, 1)), batch_size=4, num_workers=2, collate_fn=_batch)

    full = list(loader())
    first = loader()
    got = []
    for batch in first:
        got.append(batch)
        if len(got) == 9:
            state = first.state_dict()
            break
    again = loader()
    again.load_state_dict(state)
    assert got + list(again) == full


def test_bad_arguments_and_states(sets: list[list[str]]) -> None:
    with pytest.raises(ValueError, match="2 weights for 3 sources"):
        _mix(sets, weights=(1, 2))
    with pytest.raises(ValueError, match="not all 0"):
        _mix(sets, weights=(0, 0, 0))
    with pytest.raises(ValueError, match="stop must be one of"):
        _mix(sets, stop="sometimes")
    state = _mix(sets, seed=1).state_dict()
    with pytest.raises(StateError, match="this Mix has seed=2"):
        _mix(sets, seed=2).load_state_dict(state)


def _batch(batch: list[dict]) -> list[str]:
    return [_source(s) for s in batch]


# -- the map-style counterpart: MixSampler over a ConcatDataset ---------------------------------


@pytest.fixture(scope="module")
def datasets(sets: list[list[str]], tmp_path_factory: pytest.TempPathFactory) -> list[tarindex.TarDataset]:
    root = tmp_path_factory.mktemp("mix-ds")
    return [tarindex.TarDataset(tarindex.build_index(urls, index=root / f"{k}.tarindex").path) for k, urls in enumerate(sets)]


def test_mix_sampler_proportions_and_stop_rules(datasets: list[tarindex.TarDataset]) -> None:
    n, weights = 100_000, (0.5, 0.3, 0.2)
    sampler = tarindex.MixSampler(datasets, weights, num_samples=n, stop="never", num_replicas=1, rank=0, seed=3)
    got = Counter(0 if i < 120 else 1 if i < 160 else 2 for i in sampler)
    for k, p in enumerate(weights):
        assert abs(got[k] - n * p) <= 5 * math.sqrt(n * p * (1 - p)), got
    every = list(tarindex.MixSampler(datasets, weights, num_replicas=1, rank=0, seed=3))
    assert sorted(every) == list(range(170))  # stop="all": each index once
    assert every != sorted(every)
    ranks = [list(tarindex.MixSampler(datasets[:2], (1, 1), num_replicas=2, rank=r, seed=1)) for r in range(2)]
    assert sorted(ranks[0] + ranks[1]) == list(range(160)) and len(ranks[0]) == len(ranks[1]) == 80
    first = list(tarindex.MixSampler(datasets, weights, stop="first", num_replicas=1, rank=0, seed=3))
    assert len(first) < 170 and len(set(first)) == len(first)


def test_mix_sampler_resumes(datasets: list[tarindex.TarDataset]) -> None:
    def make() -> tarindex.MixSampler:
        return tarindex.MixSampler(datasets, (3, 2, 1), num_samples=300, stop="never", num_replicas=1, rank=0, seed=8)

    full = list(make())
    for k in (0, 50, 299):
        s = make()
        it = iter(s)
        head = [next(it) for _ in range(k)]
        again = make()
        again.load_state_dict(json.loads(json.dumps(s.state_dict())))
        assert head + list(again) == full, k


def test_mix_sampler_with_stateful_dataloader_and_prefetch(datasets: list[tarindex.TarDataset]) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    concat = torch.utils.data.ConcatDataset(datasets)

    def loader() -> StatefulDataLoader:
        sampler = tarindex.MixSampler(datasets, (1, 1, 1), num_replicas=1, rank=0, seed=2)
        return StatefulDataLoader(concat, sampler=sampler, batch_size=4, num_workers=2, prefetch_factor=4, collate_fn=_batch)

    full = list(loader())
    first = loader()
    got = []
    for batch in first:
        got.append(batch)
        if len(got) == 5:
            state = first.state_dict()
            break
    again = loader()
    again.load_state_dict(state)
    assert got + list(again) == full
