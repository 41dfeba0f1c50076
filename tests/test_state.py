"""Crafted states: every field of a ``TarStream``, ``mix``, ``ShardSampler`` and ``MixSampler`` state set to
what a damaged or hostile checkpoint holds is one ``StateError`` naming the field, raised before anything
changes, in bounded memory and time: a child process loads every crafted state (and starts iterating it)
and reports each error, its time and the peak RSS."""

from __future__ import annotations

import base64
import copy
import json
import os
import re
import resource
import subprocess
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import make_shard_set

TESTS = Path(__file__).parent
State = dict[str, Any]


@dataclass
class Shards:
    """A synthetic dataset for the samplers: lengths only."""

    shard_sizes: Any


def _positions_bomb(size: int) -> str:
    """An encoded position list that expands to ``size`` zero bytes (a MiB at a time, never held whole)."""
    z = zlib.compressobj(9)
    raw = b"".join(z.compress(bytes(1 << 20)) for _ in range(size >> 20)) + z.flush()
    return base64.b64encode(raw).decode()


def _rows(rows: list[tuple[int, ...]], width: int) -> str:
    from tarindex._state import encode_rows

    return encode_rows(rows, width)


def _makers(root: Path) -> dict[str, tuple[Callable[[], Any], Callable[[], State]]]:
    """Per kind: a maker of a fresh object, and a maker of a genuine state taken mid-epoch."""
    import tarindex
    from tarindex import MixSampler, ShardSampler, TarStream

    if not (root / "a").exists():
        make_shard_set(root / "a", n_shards=3, per=8)
        make_shard_set(root / "b", n_shards=2, per=6)
    urls = {k: sorted(str(p) for p in (root / k).glob("*.tar")) for k in ("a", "b")}

    def stream() -> TarStream:
        return TarStream(urls["a"], shuffle=4, seed=1)

    def mixed() -> tarindex.Mix:
        return tarindex.mix([TarStream(urls[k], shuffle=4, seed=2) for k in ("a", "b")], (0.6, 0.4), seed=3, stop="all")

    def sampler() -> ShardSampler:
        return ShardSampler(Shards(np.array([30, 40, 50])), 2, 1, seed=4)

    def mix_sampler() -> MixSampler:
        return MixSampler([Shards(np.array([10, 20])), Shards(np.array([15]))], (0.7, 0.3), num_replicas=1, rank=0, seed=5)

    def taken(obj: Any, n: int) -> State:
        it = iter(obj)
        for _ in range(n):
            next(it)
        return copy.deepcopy(obj.state_dict())

    def sampler_state() -> State:
        s = sampler()
        return copy.deepcopy(s.state_dict(consumed=5))

    return {
        "TarStream": (stream, lambda: taken(stream(), 5)),
        "Mix": (mixed, lambda: taken(mixed(), 5)),
        "ShardSampler": (sampler, sampler_state),
        "MixSampler": (mix_sampler, lambda: taken(mix_sampler(), 7)),
    }


def _set(*path: Any) -> Callable[[State], None]:
    """An edit that sets the field at ``path`` (keys and indexes; the last item is the value)."""
    *keys, value = path

    def edit(state: State) -> None:
        target: Any = state
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value() if callable(value) else value

    return edit


def _drop(*path: Any) -> Callable[[State], None]:
    """An edit that removes the field (or list entry) at ``path``."""

    def edit(state: State) -> None:
        target: Any = state
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]

    return edit


def _dup(state: State) -> list[State]:
    return [state, copy.deepcopy(state)]


STREAM = "TarStream state: "
# (kind, case, edit of a genuine state (in place, or returning what to load), the message expected)
CASES: list[tuple[str, str, Callable[[State], Any], str]] = [
    ("TarStream", "queue bomb, 64 MiB", _set("queue", lambda: _positions_bomb(64 << 20)), STREAM + r"queue holds more than 5123 positions"),
    ("TarStream", "queue bomb, 256 MiB", _set("queue", lambda: _positions_bomb(256 << 20)), STREAM + r"queue: \d+ characters, more than a list of 5123"),
    ("TarStream", "buffer over the shuffle size", _set("buffer", lambda: _rows([(0, 512 * k, k) for k in range(5)], 3)), STREAM + r"buffer holds more than 4 positions"),
    ("TarStream", "queue names a missing shard", _set("queue", lambda: _rows([(7, 0, 0, 0)], 4)), STREAM + r"queue position 0 is \[7, 0, 0, 0\], expected a shard in \[0, 3\)"),
    ("TarStream", "buffer offset negative", _set("buffer", lambda: _rows([(1, -512, 1)], 3)), STREAM + r"buffer position 0 is \[1, -512, 1\]"),
    ("TarStream", "queue mode unknown", _set("queue", lambda: _rows([(1, 0, 0, 5)], 4)), STREAM + r"queue item 0 is \[1, 0, 0, 5\], not a work item"),
    ("TarStream", "queue not a string", _set("queue", [[0, 0, 0, 0]]), STREAM + r"queue is \[\[0, 0, 0, 0\]\], expected an encoded position list"),
    ("TarStream", "queue not base64", _set("queue", "%%%"), STREAM + r"queue is not an encoded position list"),
    ("TarStream", "queue not whole rows", _set("queue", lambda: base64.b64encode(zlib.compress(bytes(12))).decode()), STREAM + r"queue is not an encoded position list \(12 bytes"),
    ("TarStream", "epoch 'x'", _set("epoch", "x"), STREAM + r"epoch is 'x', expected an integer in \[-9223372036854775808, 9223372036854775807\]"),
    ("TarStream", "epoch 2**70", _set("epoch", 2**70), STREAM + r"epoch is 1180591620717411303424, expected an integer"),
    ("TarStream", "step 10**30", _set("step", 10**30), STREAM + r"step is 1000000000000000000000000000000, expected an integer in \[0, 4611686018427387904\]"),
    ("TarStream", "step 1.5", _set("step", 1.5), STREAM + r"step is 1.5, expected an integer"),
    ("TarStream", "yielded -1", _set("yielded", -1), STREAM + r"yielded is -1, expected an integer"),
    ("TarStream", "yielded True", _set("yielded", True), STREAM + r"yielded is True, expected an integer"),
    ("TarStream", "quota -1", _set("quota", -1), STREAM + r"quota is -1, expected an integer"),
    ("TarStream", "yielded over the quota", lambda st: st.update(quota=3, yielded=4), STREAM + r"yielded 4 is over its quota 3"),
    ("TarStream", "passes 'x'", _set("passes", "x"), STREAM + r"passes is 'x'"),
    ("TarStream", "done 'x'", _set("done", "x"), STREAM + r"done is 'x', expected True or False"),
    ("TarStream", "got missing", _drop("got"), r"TarStream state has no 'got'"),
    ("TarStream", "slot rank over the world", _set("slot", [5, 2, 0, 1]), STREAM + r"slot \[5, 2, 0, 1\] is not \[rank < world size"),
    ("TarStream", "slot of 3e8 ranks", _set("slot", [0, 3 * 10**8, 0, 1]), STREAM + r"slot\[1\] is 300000000, expected an integer in \[0, 1048576\]"),
    ("TarStream", "slot not a list", _set("slot", "0,1,0,1"), STREAM + r"slot is '0,1,0,1', expected a list of 4 integers"),
    ("TarStream", "a million readers named by one state", _set("slot", [0, 1 << 20, 0, 1 << 20]), r"TarStream states cover readers \[\(0, 0\)\] of 1048576 ranks x 1048576 workers"),
    ("TarStream", "two states of one reader", _dup, r"two TarStream states of rank 0 worker 0"),
    ("TarStream", "config of another stream", _set("config", "shuffle", 5), r"TarStream state is for shuffle=5, this TarStream has shuffle=4"),
    ("TarStream", "config an array", _set("config", "seed", lambda: np.array([1, 1])), r"TarStream state is for seed=array\(\[1, 1\]\), this TarStream has seed=1"),
    ("Mix", "quota -1", _set("quota", -1), r"Mix state: quota is -1, expected an integer"),
    ("Mix", "done 'x'", _set("done", "x"), r"Mix state: done is 'x', expected True or False"),
    ("Mix", "no source left, not done", _set("active", [False, False]), r"Mix state: active \[False, False\] leaves no source to draw"),
    ("Mix", "active of another length", _set("active", [True]), r"Mix state: active is \[True\], expected a list of 2 booleans"),
    ("Mix", "active 'yes'", _set("active", ["yes", True]), r"Mix state: active\[0\] is 'yes', expected True or False"),
    ("Mix", "rounds with stop='all'", _set("rounds", [1, 0]), r"Mix state: rounds \[1, 0\] has sources started again, which only stop='never' does"),
    ("Mix", "step 10**30", _set("step", 10**30), r"Mix state: step is 10{30}, expected an integer"),
    ("Mix", "yielded over the draws", lambda st: st.update(step=3, yielded=9), r"Mix state: yielded 9 is over its draws \(3\)"),
    ("Mix", "epoch 'x'", _set("epoch", "x"), r"Mix state: epoch is 'x'"),
    ("Mix", "source states of another count", _drop("sources", -1), r"malformed Mix state: 1 source states for 2 sources"),
    ("Mix", "a source's queue names a missing shard", _set("sources", 1, "queue", lambda: _rows([(9, 0, 0, 0)], 4)), STREAM + r"queue position 0 is \[9, 0, 0, 0\], expected a shard in \[0, 2\)"),
    ("Mix", "a source's step 10**30", _set("sources", 0, "step", 10**30), STREAM + r"step is 10{30}"),
    ("ShardSampler", "num_replicas 3e8", _set("num_replicas", 3 * 10**8), r"ShardSampler state: num_replicas is 300000000, expected an integer in \[1, 1048576\]"),
    ("ShardSampler", "num_replicas 0", _set("num_replicas", 0), r"ShardSampler state: num_replicas is 0"),
    ("ShardSampler", "consumed 'x'", _set("consumed", "x"), r"ShardSampler state: consumed is 'x', expected an integer"),
    ("ShardSampler", "consumed -1", _set("consumed", -1), r"ShardSampler state: consumed is -1"),
    ("ShardSampler", "consumed 10**30", _set("consumed", 10**30), r"ShardSampler state: consumed is 10{30}"),
    ("ShardSampler", "consumed past the block", _set("consumed", 61), r"ShardSampler state: consumed \[61, 61\] outside \[0, 60\]"),
    ("ShardSampler", "consumed per rank, another count", _set("consumed", [1, 2, 3]), r"ShardSampler state: consumed is \[1, 2, 3\], expected a list of 2 integers"),
    ("ShardSampler", "epoch 'x'", _set("epoch", "x"), r"ShardSampler state: epoch is 'x'"),
    ("ShardSampler", "format '1'", _set("format", "1"), r"ShardSampler state: format is '1'"),
    ("ShardSampler", "plan overlapping", _set("plan", [[0, 60], [50, 120]]), r"ShardSampler state: plan\[1\] is \[50, 120\], expected \[start, end\] with 60 <= start"),
    ("ShardSampler", "plan past the samples", _set("plan", [[0, 10**30]]), r"ShardSampler state: plan\[0\] is \[0, 10{30}\]"),
    ("ShardSampler", "plan of strings", _set("plan", [["0", "120"]]), r"ShardSampler state: plan\[0\] is \['0', '120'\]"),
    ("ShardSampler", "plan a dict", _set("plan", {}), r"ShardSampler state: plan is a dict, expected a list"),
    ("ShardSampler", "drop_last 'yes'", _set("drop_last", "yes"), r"ShardSampler state: drop_last is 'yes', expected True or False"),
    ("ShardSampler", "not a dict", lambda st: "state", r"ShardSampler state is a str, expected a dict"),
    ("MixSampler", "step 10**30", _set("step", 10**30), r"MixSampler state: step is 10{30}"),
    ("MixSampler", "yielded over the draws", lambda st: st.update(step=1, yielded=2), r"MixSampler state: yielded 2 is over its draws \(1\)"),
    ("MixSampler", "no dataset left, not done", _set("active", [False, False]), r"MixSampler state: active \[False, False\] leaves no dataset to draw"),
    ("MixSampler", "done 'x'", _set("done", "x"), r"MixSampler state: done is 'x'"),
    ("MixSampler", "samplers of another count", _drop("samplers", -1), r"MixSampler state: samplers is list of length 1, expected a list of 2 states"),
    ("MixSampler", "a sampler's num_replicas 3e8", _set("samplers", 1, "num_replicas", 3 * 10**8), r"ShardSampler state: num_replicas is 300000000"),
    ("MixSampler", "epoch 2**70", _set("epoch", 2**70), r"MixSampler state: epoch is 1180591620717411303424"),
]


def _crafted(makers: dict[str, Any], kind: str, edit: Callable[[State], Any]) -> Any:
    state = makers[kind][1]()
    out = edit(state)
    return state if out is None else out


def _load_and_start(obj: Any, state: Any) -> None:
    """``load_state_dict``, then the first sample or index (a state checked lazily would fail here)."""
    obj.load_state_dict(state)
    next(iter(obj), None)


def _errors() -> tuple[type[Exception], type[Exception]]:
    from tarindex import SamplerStateError, StateError

    return StateError, SamplerStateError


@pytest.fixture(scope="module")
def makers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _makers(tmp_path_factory.mktemp("states"))


@pytest.mark.parametrize(("kind", "case"), [(k, c) for k, c, _, _ in CASES])
def test_crafted_field_is_a_named_state_error(kind: str, case: str, impl: str, makers: dict[str, Any]) -> None:
    """Each crafted field: a ``StateError`` (``SamplerStateError`` from ``ShardSampler``) naming it, expected
    and got; the object is left as it was (a fresh epoch, as if nothing had been loaded)."""
    StateError, SamplerStateError = _errors()
    _, _, edit, message = next(c for c in CASES if c[:2] == (kind, case))
    make, _ = makers[kind]
    obj = make()
    before = obj.state_dict()
    with pytest.raises(StateError, match=message) as err:
        _load_and_start(obj, _crafted(makers, kind, edit))
    assert kind != "ShardSampler" or isinstance(err.value, SamplerStateError)
    assert isinstance(err.value, ValueError)
    if "a million readers" not in case:  # (refused at the start of the iteration, after the load)
        assert obj.state_dict() == before


def test_a_bad_source_state_loads_no_source(makers: dict[str, Any]) -> None:
    """A mix (and a MixSampler) checks every source's state before it loads any: the first source does not
    keep a position when the second one's is refused."""
    StateError, _ = _errors()
    mixed = makers["Mix"][0]()
    state = makers["Mix"][1]()
    state["sources"][1]["step"] = -1
    with pytest.raises(StateError, match=r"TarStream state: step is -1"):
        mixed.load_state_dict(state)
    assert mixed.sources[0]._pending is None and mixed._pending is None
    sampler = makers["MixSampler"][0]()
    fresh = [s.state_dict() for s in sampler.samplers]
    state = makers["MixSampler"][1]()
    state["samplers"][1]["consumed"] = -1
    with pytest.raises(StateError, match=r"ShardSampler state: consumed is -1"):
        sampler.load_state_dict(state)
    assert [s.state_dict() for s in sampler.samplers] == fresh


def test_genuine_states_still_resume(makers: dict[str, Any]) -> None:
    """The checks refuse none of the states the objects make: each kind resumes with the samples (or
    indices) an uninterrupted epoch gives after the point its state was taken."""
    for kind, (make, _) in makers.items():
        whole = [_id(x) for x in make()]
        first = make()
        it = iter(first)
        head = [_id(next(it)) for _ in range(5)]
        state = first.state_dict(consumed=5) if kind == "ShardSampler" else first.state_dict()
        again = make()
        again.load_state_dict(json.loads(json.dumps(state)))  # through JSON, as a checkpoint may go
        assert head + [_id(x) for x in again] == whole, kind


def _id(x: Any) -> Any:
    return x["__key__"] + x["__url__"] if isinstance(x, dict) else x


def test_every_crafted_state_in_bounded_memory_and_time(impl: str, tmp_path: Path) -> None:
    """One child process loads every crafted state: each is a named ``StateError`` within a second or two,
    and the peak RSS of them all stays within 64 MiB of the child's own before the first (a queue that
    expands to 256 MiB, a world of 3e8 ranks: before, gigabytes or minutes)."""
    child = subprocess.run(
        [sys.executable, "-c", f"import test_state; test_state.child({str(tmp_path)!r})"],
        cwd=TESTS,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    report = json.loads(child.stdout.strip().splitlines()[-1])
    messages = {(k, c): m for k, c, _, m in CASES}
    bad = []
    for r in report["cases"]:
        if not (r["state_error"] and re.search(messages[r["kind"], r["case"]], r["message"]) and r["seconds"] < 5):
            bad.append(r)
    assert not bad, json.dumps(bad, indent=1)
    assert len(report["cases"]) == len(CASES)
    grown = report["peak_kib"] - report["baseline_kib"]
    assert grown < 64 << 10, f"peak RSS grew by {grown} KiB over the child's {report['baseline_kib']} KiB"


def child(root: str) -> None:
    """Run in a child process: every case of :data:`CASES`, reported as one JSON line (error, message,
    seconds; RSS before the first and the peak after the last)."""
    StateError, _ = _errors()
    makers = _makers(Path(root))
    crafted = []
    for kind, case, edit, _ in CASES:  # made first: the bombs are made a MiB at a time, but not measured
        make, _ = makers[kind]
        crafted.append((kind, case, make(), _crafted(makers, kind, edit)))
    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = []
    for kind, case, obj, state in crafted:
        start = time.perf_counter()
        try:
            _load_and_start(obj, state)
            error, message = None, "no error"
        except Exception as exc:  # every outcome is reported; the parent judges it
            error, message = type(exc).__name__, str(exc)
            is_state = isinstance(exc, StateError)
        else:
            is_state = False
        out.append({"kind": kind, "case": case, "error": error, "state_error": is_state, "message": message,
                    "seconds": time.perf_counter() - start})  # fmt: skip
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"cases": out, "baseline_kib": baseline, "peak_kib": peak}))
