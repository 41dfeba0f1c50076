"""Hostile index values: counts in the meta, records, extension tables and zstd frame tables rewritten with
their checksums recomputed (crafted, not damaged: a checksum detects damage, not tampering). Each is an
``IndexFormatError`` (or a named build error), the same in C and Python, found before anything is
allocated by it: the peak memory of a process reading such an index stays small."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

import lmdb
import numpy as np
import pytest

import tarindex
from conftest import make_shard_set
from tarindex.errors import IndexFormatError
from tarindex.index.format import BLOCK_PREFIX, FRAMES_PREFIX, META_KEY, SHARDS_PREFIX
from tarindex.index.pages import numbered, seal, unseal
from tarindex.index.records import Columns, encode_block, parse

ROOT = Path(__file__).resolve().parent.parent


Edit = tuple[bytes, Callable[[bytes], bytes]]
"""A value's key and how its payload is rewritten."""


def reseal(index: Path, out: Path, *edits: Edit) -> Path:
    """A copy of ``index`` whose value under each edit's key went through its ``edit`` and was sealed again."""
    shutil.copyfile(index, out)
    env = lmdb.open(str(out), subdir=False, lock=False, map_size=1 << 30)
    with env.begin(write=True) as txn:
        for key, edit in edits:
            txn.put(key, seal(key, edit(bytes(unseal(txn.get(key), key, str(out))))))
    env.close()
    return out


def meta(**values: object) -> tuple[bytes, Callable[[bytes], bytes]]:
    def edit(payload: bytes) -> bytes:
        return json.dumps({**json.loads(payload), **values}).encode()

    return META_KEY, edit


def exts(change: Callable[[list[str]], list[str]]) -> tuple[bytes, Callable[[bytes], bytes]]:
    def edit(payload: bytes) -> bytes:
        m = json.loads(payload)
        return json.dumps({**m, "exts": change(m["exts"])}).encode()

    return META_KEY, edit


def record(change: Callable[[Columns], Columns]) -> tuple[bytes, Callable[[bytes], bytes]]:
    """Block 0's records decoded, changed and encoded again."""

    def edit(payload: bytes) -> bytes:
        cols = parse(memoryview(payload), 1 << 16, int.from_bytes(payload[:4], "little"), "block").columns("block")
        return encode_block(change(cols))

    return numbered(BLOCK_PREFIX, 0), edit


def sample3(field: str, value: int) -> Callable[[Columns], Columns]:
    def change(cols: Columns) -> Columns:
        column = getattr(cols, field).copy()
        column[3] = value
        return dataclasses.replace(cols, **{field: column})

    return change


def read_whole(payload: bytes) -> bytes:
    """Shard block 0's first record made to say its frames are too large to read at random."""
    records = json.loads(payload)
    records[0]["random_access"] = False
    return json.dumps(records).encode()


def frames(row: int, column: int, value: int) -> tuple[bytes, Callable[[bytes], bytes]]:
    def edit(payload: bytes) -> bytes:
        table = np.frombuffer(payload, "<u8").reshape(-1, 4).copy()
        table[row, column] = value
        return table.tobytes()

    return numbered(FRAMES_PREFIX, 0), edit


def _pattern_twice(cols: Columns) -> Columns:
    """Sample 0's members all given the first extension: a sample dict would keep one of them."""
    ext = cols.member_ext.copy()
    ext[: int(cols.nmembers[0])] = 0
    return dataclasses.replace(cols, member_ext=ext)


@pytest.fixture(scope="module")
def indexes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("values")
    shards = make_shard_set(root, n_shards=2, per=5)
    plain = tarindex.build_index([str(p) for p in shards], workers=1).path
    zst = root / "z-000000.tar.zst"
    subprocess.run(["zstd", "-q", str(shards[0]), "-o", str(zst)], check=True)
    return {"plain": plain, "zstd": tarindex.build_index([str(zst)], index=root / "z.tarindex", workers=1).path}


N40 = 1 << 40
CASES: dict[str, tuple[str, Edit | list[Edit], str]] = {
    "n_buckets=2**70": ("plain", meta(n_buckets=1 << 70), r"bad n_buckets"),
    "n_buckets=2**63": ("plain", meta(n_buckets=1 << 63), r"bad n_buckets"),
    "n_buckets=2": ("plain", meta(n_buckets=2), r"bad n_buckets"),  # in range (10 samples: 1 bucket), but lookups would miss theirs
    "block_samples=2**70": ("plain", meta(block_samples=1 << 70), r"bad block_samples"),
    "block_samples=0": ("plain", meta(block_samples=0), r"bad block_samples"),  # no division by it before the check
    "block_samples=1, n_samples=2**40": (
        "plain", meta(block_samples=1, n_samples=N40, n_blocks=N40, sample_bytes=5, n_buckets=-(-N40 // 182)),
        r"bad n_blocks: 1099511627776 record blocks of 1 samples for 1099511627776 samples, the file holds another number",
    ),
    "n_shards=50,000,000": ("plain", meta(n_shards=50_000_000), r"bad n_shards: 50000000, the shard start table holds 3 entries"),
    "n_shards=2**40": ("plain", meta(n_shards=N40), r"bad n_shards: 1099511627776, the shard start table holds 3 entries"),
    "exts with __key__": ("plain", exts(lambda e: ["__key__", *e[1:]]), r"bad exts"),
    "exts with __url__": ("plain", exts(lambda e: [*e[:-1], "__url__"]), r"bad exts"),
    "exts with a duplicate": ("plain", exts(lambda e: [e[0], e[0], *e[2:]]), r"bad exts"),
    "a pattern naming one extension twice": ("plain", record(_pattern_twice), r"record block 0 is damaged \(a member pattern names one extension twice\)"),
    "record size 2**40": ("plain", record(sample3("size", N40)), r"the record of sample 3 is damaged \(1099511627776 bytes at offset \d+ past the \d+ bytes of shard 0\)"),
    "record size 2**62": ("plain", record(sample3("size", 1 << 62)), r"the record of sample 3 is damaged \(4611686018427387904 bytes at offset"),
    "record offset 2**63 + 5": ("plain", record(sample3("offset", (1 << 63) + 5)), r"the record of sample 3 is damaged \(\d+ bytes at offset 9223372036854775813 past"),
    "frame past the shard": ("zstd", frames(0, 1, 10**12), r"the frame table of shard 0 is damaged \(frames out of order or past the shard's \d+ bytes\)"),
    "frame of 2**40 bytes": ("zstd", frames(0, 3, N40), r"the frame table of shard 0 is damaged \(a frame of 1099511627776 bytes in a shard recorded as read at random \(at most 16777216\)\)"),
    "frame of 2**40 bytes, read whole": (
        "zstd", [(numbered(SHARDS_PREFIX, 0), read_whole), frames(0, 3, N40)],
        r"the frame table of shard 0 is damaged \(1099511627776 bytes decompressed from \d+, more than the 67108864 the scan allows\)",
    ),
    "frame at 2**62": ("zstd", frames(0, 0, 1 << 62), r"the frame table of shard 0 is damaged \(a value of 4611686018427387904\)"),
}

_PROBE = """
import json, resource, sys
import numpy, tarindex, tarindex.dataset
from tarindex.errors import TarIndexError
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    ds = tarindex.TarDataset(sys.argv[1])
    keys = [ds[i]["__key__"] for i in range(len(ds))]
    ds.get(keys[0])
    outcome = "read"
except TarIndexError as exc:
    outcome = f"{type(exc).__name__}: {exc}"
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(json.dumps([outcome, grown * 1024]))
"""


@pytest.mark.parametrize("case", list(CASES))
def test_a_hostile_value_is_index_format_error_before_any_allocation(indexes: dict[str, Path], tmp_path: Path, impl: str, case: str) -> None:
    which, edits, message = CASES[case]
    hostile = reseal(indexes[which], indexes[which].with_name(f"hostile-{tmp_path.name}.tarindex"), *(edits if isinstance(edits, list) else [edits]))
    try:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        out = subprocess.run([sys.executable, "-c", _PROBE, str(hostile)], capture_output=True, text=True, env=env, timeout=120)
    finally:
        hostile.unlink()
    assert out.returncode == 0, out.stderr[-2000:]
    outcome, grown = json.loads(out.stdout)
    assert outcome.startswith(f"IndexFormatError: {hostile}: "), outcome
    assert __import__("re").search(message, outcome), outcome
    assert outcome.endswith("rebuild the index"), outcome
    assert grown < 32 << 20, f"peak memory grew by {grown} bytes"


def _tar_of_extensions(out: Path, first: int, count: int) -> Path:
    """One empty member per distinct extension ``e<first>`` .. , two members a sample."""
    with tarfile.open(out, "w", format=tarfile.USTAR_FORMAT) as tf:
        for e in range(first, first + count):
            info = tarfile.TarInfo(f"s{e // 2:06d}.e{e:06d}")
            tf.addfile(info, io.BytesIO(b""))
    return out


@pytest.fixture(scope="module")
def many_extensions(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tar_of_extensions(tmp_path_factory.mktemp("exts") / "many.tar", 0, (1 << 16) + 2)


def test_more_than_65536_extensions_in_one_shard_is_a_named_build_error(many_extensions: Path, impl: str) -> None:
    with pytest.raises(IndexFormatError, match=rf"{many_extensions}: more than 65,536 distinct extensions in one shard; an index holds at most 65,536"):
        tarindex.build_index([str(many_extensions)], workers=1)
    assert not many_extensions.with_name("many.tarindex").exists()


def test_a_shard_of_more_than_65536_extensions_streams_in_both_lanes(many_extensions: Path, impl: str) -> None:
    samples = list(tarindex.TarStream(str(many_extensions)))
    assert len(samples) == (1 << 15) + 1
    assert samples[-1] == {"__key__": "s032768", "__url__": str(many_extensions), "e065536": b"", "e065537": b""}
    assert sum(len(s) - 2 for s in samples) == (1 << 16) + 2


def test_more_than_65536_extensions_over_an_index_is_a_named_build_error(tmp_path: Path, impl: str) -> None:
    first = _tar_of_extensions(tmp_path / "a-000000.tar", 0, 40_000)
    second = _tar_of_extensions(tmp_path / "a-000001.tar", 40_000, 30_000)
    with pytest.raises(IndexFormatError, match=r"a-000001.tar: the index would hold 70,000 distinct extensions with this shard; an index holds at most 65,536"):
        tarindex.build_index([str(first), str(second)], workers=1)


def test_a_start_table_that_disagrees_with_the_shard_records_is_index_format_error(indexes: dict[str, Path], impl: str) -> None:
    """A start table rewritten (checksum recomputed) to move shard 1's start from 5 to 7, still ascending: the
    view of one shard read shard 1's last 3 samples as all of it, and a stream of the index numbered shard
    1's samples 7.. (``__index__`` not TarDataset's). Both compare the counts with the shard records first."""
    from tarindex.index.format import START_KEY

    plain = indexes["plain"]
    hostile = plain.with_name("train.tarindex")
    assert hostile == plain  # the index beside the shards: the one a pattern opens
    original = plain.read_bytes()

    def shifted(payload: bytes) -> bytes:
        starts = np.frombuffer(payload, "<u8").copy()
        starts[1] += 2
        return starts.tobytes()

    try:
        reseal(plain, plain.with_name("shifted.tarindex"), (START_KEY, shifted)).replace(plain)
        message = rf"^{plain}: shard records block 0 is damaged \(shard \d has 5 samples, the start table says otherwise\); rebuild the index$"
        with pytest.raises(IndexFormatError, match=message):
            tarindex.TarDataset(str(plain.with_name("train-000001.tar")))
        with pytest.raises(IndexFormatError, match=message):
            tarindex.TarStream(plain)
    finally:
        plain.write_bytes(original)
    assert [s["__key__"] for s in tarindex.TarDataset(str(plain.with_name("train-000001.tar")))] == [
        s["__key__"] for s in tarindex.TarStream(plain.with_name("train-000001.tar"))
    ]
