"""Resuming mid-epoch: TarStream through StatefulDataLoader (same and other worker counts, a fresh
process), TarStream without a DataLoader, epoch_size passes, and the map-style samplers."""

from __future__ import annotations

import json
import os
import pickle
import random
import shutil
import subprocess
import sys
import tarfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import torch.utils.data
from _servers import FaultProxy, HTTPServer
from resume_run import run_case

import tarindex
from conftest import make_shard_set, py_tar
from tarindex import CorruptFrameError, StateError, TarDataset, TarStream, build_index, compress_shard
from tarindex.zstd import seek_table_frames

TESTS = Path(__file__).parent


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """6 shards of 20 small samples."""
    return [str(p) for p in make_shard_set(tmp_path_factory.mktemp("resume") / "plain", n_shards=6, per=20)]


@pytest.fixture(scope="module")
def zstd(plain: list[str], tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The same shards as seekable .tar.zst with small frames (several per shard)."""
    root = tmp_path_factory.mktemp("resume-zstd")
    out = []
    for p in plain:
        dst = root / (Path(p).name + ".zst")
        compress_shard(p, dst, frame_size=4000)
        out.append(str(dst))
    return out


def _http(server: HTTPServer, paths: list[str], sub: str) -> list[str]:
    dest = server.root / sub
    dest.mkdir(parents=True, exist_ok=True)
    for p in paths:
        shutil.copyfile(p, dest / Path(p).name)
    return [server.url(f"{sub}/{Path(p).name}") for p in paths]


def _flat(batches: list[list[str]]) -> list[str]:
    return [k for b in batches for k in b]


def _fresh_process(cases: list[dict], tmp_path: Path) -> None:
    spec = tmp_path / "cases.json"
    spec.write_text(json.dumps(cases))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS)])}
    subprocess.run([sys.executable, "-W", "ignore", str(TESTS / "resume_run.py"), str(spec)], check=True, env=env, timeout=300)


def test_stateful_dataloader_resumes_exactly_in_a_fresh_process(
    plain: list[str], zstd: list[str], http_server: HTTPServer, tmp_path: Path
) -> None:
    """6 shards local and over nginx, plain and zstd, 0, 2 and 3 workers: stop after k batches, save the
    loader's state, resume in a new process: the rest equals the uninterrupted epoch's rest, batch for batch."""
    sources = {
        "local": plain,
        "local-zstd": zstd,
        "http": _http(http_server, plain, "resume-http"),
        "http-zstd": _http(http_server, zstd, "resume-http-zstd"),
    }
    runs = [("local", 0), ("local", 2), ("local", 3), ("local-zstd", 2), ("http", 2), ("http-zstd", 0), ("http-zstd", 3)]
    cases, expected = [], {}
    for name, workers in runs:
        urls = sources[name]
        base = {"urls": urls, "shuffle": 16, "seed": 5, "workers": workers, "batch": 4, "epoch": 1}
        full = run_case(dict(base))
        assert sorted(_flat(full)) == sorted(f"{Path(u).name}/s{s:02d}i{i:03d}" for s, u in enumerate(urls) for i in range(20))
        # before the first batch, just after the buffer's fill, midway, in the last shard
        for k in (0, 1, len(full) // 2, len(full) - 1):
            state = tmp_path / f"{name}-{workers}-{k}.json"
            if k:
                assert run_case(dict(base, stop=k, state_out=str(state))) == full[:k]
            else:
                state.write_text(json.dumps(_initial_loader_state(base)))
            cases.append(dict(base, state_in=str(state), out=str(state.with_suffix(".rest"))))
            expected[state.with_suffix(".rest")] = full[k:]
    _fresh_process(cases, tmp_path)
    for path, rest in expected.items():
        assert json.loads(path.read_text()) == rest, path.name


def _initial_loader_state(base: dict) -> dict:
    from resume_run import keys_of
    from torchdata.stateful_dataloader import StatefulDataLoader

    stream = TarStream(base["urls"], shuffle=base["shuffle"], seed=base["seed"])
    stream.set_epoch(base["epoch"])
    loader = StatefulDataLoader(stream, batch_size=base["batch"], num_workers=base["workers"], collate_fn=keys_of)
    state: dict = loader.state_dict()
    return state


@pytest.mark.parametrize(("before", "after"), [(2, 3), (3, 0), (0, 2)])
def test_other_worker_count_yields_each_remaining_sample_once(plain: list[str], zstd: list[str], before: int, after: int, tmp_path: Path) -> None:
    for urls in (plain, zstd):
        base = {"urls": urls, "shuffle": 16, "seed": 7, "batch": 4}
        everything = Counter(_flat(run_case(dict(base, workers=before))))
        for k in (1, 13):
            state = tmp_path / f"s{k}.json"
            first = run_case(dict(base, workers=before, stop=k, state_out=str(state)))
            rest = run_case(dict(base, workers=after, state_in=str(state), states=True))
            assert Counter(_flat(first + rest)) == everything, (urls[0], before, after, k)


def test_incomplete_states_for_another_layout_are_refused(plain: list[str]) -> None:
    stream = TarStream(plain, shuffle=8, rank=0, world_size=2)
    state = stream.state_dict()
    resumed = TarStream(plain, shuffle=8, rank=0, world_size=3)
    resumed.load_state_dict(state)
    with pytest.raises(StateError, match="needs the state of every reader"):
        next(iter(resumed))
    with pytest.raises(StateError, match="this TarStream has seed=0"):
        TarStream(plain, shuffle=8, seed=0).load_state_dict(dict(state, config=dict(state["config"], seed=3)))
    with pytest.raises(StateError, match="no TarStream state"):
        TarStream(plain).load_state_dict({"kind": "ShardSampler", "format": 1})


def test_other_rank_count_deals_the_rest_of_every_rank(plain: list[str]) -> None:
    def stream(rank: int, world: int) -> TarStream:
        return TarStream(plain, shuffle=8, seed=2, rank=rank, world_size=world)

    seen: list[str] = []
    states = []
    for rank in range(2):  # two ranks stop after 11 and 23 samples
        s = stream(rank, 2)
        it = iter(s)
        seen += [next(it)["__key__"] for _ in range(11 + 12 * rank)]
        states.append(s.state_dict())
    for rank in range(3):  # three ranks finish the epoch
        s = stream(rank, 3)
        s.load_state_dict(pickle.loads(pickle.dumps(states)))
        seen += [x["__key__"] for x in s]
    assert Counter(seen) == Counter(x["__key__"] for x in TarStream(plain))


def test_without_a_dataloader_from_an_index(plain: list[str], tmp_path: Path) -> None:
    index = build_index(plain, index=tmp_path / "x.tarindex").path
    full = list(TarStream(index, shuffle=10, seed=1))
    assert sorted(s["__index__"] for s in full) == list(range(120))
    for k in (0, 9, 57, 119, 120):
        stream = TarStream(index, shuffle=10, seed=1)
        it = iter(stream)
        head = [next(it) for _ in range(k)]
        state = json.loads(json.dumps(stream.state_dict()))  # plain values
        resumed = TarStream(index, shuffle=10, seed=1)
        resumed.load_state_dict(state)
        assert head + list(resumed) == full, k  # dicts equal: bytes, keys and __index__


def test_epoch_size_passes_resume(plain: list[str]) -> None:
    kw = {"shuffle": 12, "seed": 4, "epoch_size": 50}
    full = [s["__key__"] for s in TarStream(plain[:2], **kw)]  # 40 samples a pass: a second pass for 10
    assert len(full) == 50 and len(set(full[:40])) == 40
    for k in (5, 39, 40, 45):
        stream = TarStream(plain[:2], **kw)
        it = iter(stream)
        head = [next(it)["__key__"] for _ in range(k)]
        resumed = TarStream(plain[:2], **kw)
        resumed.load_state_dict(stream.state_dict())
        assert head + [s["__key__"] for s in resumed] == full, k


def test_a_changed_shard_is_an_error_not_other_samples(plain: list[str], tmp_path: Path) -> None:
    urls = [str(shutil.copy(p, tmp_path / Path(p).name)) for p in plain[:2]]
    stream = TarStream(urls)
    it = iter(stream)
    for _ in range(5):
        next(it)
    state = stream.state_dict()
    make_shard_set(tmp_path / "other", n_shards=2, per=20)
    shutil.copy(tmp_path / "other" / "train-000001.tar", urls[0])  # same name, other member sizes
    resumed = TarStream(urls)
    resumed.load_state_dict(state)
    with pytest.raises(StateError, match=r"train-000000.tar: .*sample 4 .*offset \d+.*the shard changed since the state was saved"):
        list(resumed)


@pytest.fixture(scope="module")
def big_zstd(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """One zstd shard of 286 frames (2,000 samples of 4,000 incompressible bytes, ``tarindex compress``
    with 32 KB frames), and its sample keys in order."""
    root = tmp_path_factory.mktemp("resume-frames")
    rng = random.Random(7)
    keys = [f"k{i:05d}" for i in range(2000)]
    plain = py_tar(root / "big.tar", [(f"{k}.bin", rng.randbytes(4000)) for k in keys], tarfile.GNU_FORMAT, dirs=False)
    compress_shard(plain, root / "big.tar.zst", frame_size=32_000)
    plain.unlink()
    return root / "big.tar.zst", keys


def _read_bytes() -> int:
    """Bytes this process has read through system calls so far (Linux's per-process I/O counter)."""
    return int(dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())["rchar"])


def _requested(ranges: list[str | None], size: int) -> int:
    """Bytes asked for by HTTP requests with these ``Range`` headers (none: the whole file)."""
    total = 0
    for r in ranges:
        first, _, last = (r or "bytes=0-").removeprefix("bytes=").partition("-")
        total += (int(last) + 1 if last else size) - int(first)
    return total


@pytest.mark.parametrize("where", ["local", "index", "http"])
def test_a_zstd_shard_resumes_at_the_frame_that_holds_the_position(
    big_zstd: tuple[Path, list[str]], where: str, http_server: HTTPServer, fault_proxy: Callable[..., FaultProxy], tmp_path: Path
) -> None:
    """Resuming at 10%, 50% and 90% of a zstd shard reads a few of its frames (through the seek table
    or the index's frame table), not the shard up to the position: under 5% of the shard's bytes."""
    shard, keys = big_zstd
    size = shard.stat().st_size
    proxy = None
    if where == "index":
        url: str = build_index([shard], index=tmp_path / "z.tarindex").path
    elif where == "http":
        proxy = fault_proxy(http_server.port)
        url = proxy.url(_http(http_server, [str(shard)], "resume-frames")[0].split("/", 3)[3])
    else:
        url = str(shard)
    for frac in (0.1, 0.5, 0.9, 0.5):  # the first 50% warms the process up (imports, first opens); checked too
        k = int(len(keys) * frac)
        stream = TarStream(url)
        it = iter(stream)
        for _ in range(k):
            next(it)
        state = json.loads(json.dumps(stream.state_dict()))
        del it
        resumed = TarStream(url)
        resumed.load_state_dict(state)
        rest = iter(resumed)
        before, asked = _read_bytes(), len(proxy.ranges) if proxy else 0
        first = next(rest)
        read = _requested(proxy.ranges[asked:], size) if proxy else _read_bytes() - before
        assert first["__key__"] == keys[k]
        assert read < 0.05 * size, (frac, read, size)
        assert [s["__key__"] for s in rest] == keys[k + 1 :]


def test_a_damaged_frame_after_a_zstd_resume_is_named_by_its_offset(big_zstd: tuple[Path, list[str]], tmp_path: Path) -> None:
    shard, keys = big_zstd
    data = bytearray(shard.read_bytes())
    frames = seek_table_frames(lambda off, n: bytes(data[off : off + n]), len(data), str(shard))
    assert frames is not None and len(frames) == 286
    c_off, c_size = int(frames[250, 0]), int(frames[250, 1])
    data[c_off + c_size // 2 : c_off + c_size // 2 + 64] = bytes(64)  # inside frame 250's blocks (samples 1750-1756)
    damaged = tmp_path / "damaged.tar.zst"
    damaged.write_bytes(bytes(data))
    stream = TarStream(str(damaged))
    it = iter(stream)
    for _ in range(1000):
        next(it)
    resumed = TarStream(str(damaged))
    resumed.load_state_dict(stream.state_dict())
    got = []
    with pytest.raises(CorruptFrameError, match=rf"damaged.tar.zst: corrupt zstd frame .*at offset {c_off}$") as caught:
        got.extend(s["__key__"] for s in resumed)
    assert caught.value.offset == c_off
    assert got == keys[1000:1749]  # before the damaged frame (1749 ends where 1750 starts: in it), none from it


def test_state_is_a_few_kb_per_worker(plain: list[str]) -> None:
    stream = TarStream(plain * 10, shuffle=1000, seed=3)  # a full buffer of 1,000 positions
    it = iter(stream)
    for _ in range(100):
        next(it)
    size = len(json.dumps(stream.state_dict()))
    assert size < 8000, size


# -- map-style: the samplers under StatefulDataLoader --------------------------------------------


@pytest.fixture(scope="module")
def dataset(plain: list[str], tmp_path_factory: pytest.TempPathFactory) -> TarDataset:
    return TarDataset(build_index(plain, index=tmp_path_factory.mktemp("resume-ds") / "x.tarindex").path)


def _index_batch(batch: list[dict]) -> list[int]:
    return [s["__index__"] for s in batch]


@pytest.mark.parametrize("kind", ["shard", "distributed"])
def test_stateful_dataloader_with_samplers_and_prefetch(dataset: TarDataset, kind: str) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    def loader() -> StatefulDataLoader:
        if kind == "shard":
            sampler: torch.utils.data.Sampler[int] = tarindex.ShardSampler(dataset, num_replicas=2, rank=1, seed=3)
        else:
            sampler = torch.utils.data.DistributedSampler(dataset, num_replicas=2, rank=1, seed=3)
        sampler.set_epoch(2)  # type: ignore[attr-defined]
        return StatefulDataLoader(dataset, sampler=sampler, batch_size=4, num_workers=2, prefetch_factor=4, collate_fn=_index_batch)

    full = list(loader())
    assert len(_flat(full)) == 60  # type: ignore[arg-type]
    for k in (1, 7):
        first = loader()
        got = []
        for batch in first:
            got.append(batch)
            if len(got) == k:
                state = first.state_dict()  # 8 more batches are in flight (prefetch_factor=4, 2 workers)
                break
        again = loader()
        again.load_state_dict(state)
        assert got + list(again) == full, k
