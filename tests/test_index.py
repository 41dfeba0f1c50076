"""The index file (format 5): cold start, damage, truncation, close, rebuild under a forked reader, merge, executors."""

from __future__ import annotations

import ctypes
import json
import mmap
import multiprocessing
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tarindex
from conftest import make_shard_set
from tarindex.errors import IndexChangedError, IndexFormatError, ShardNotFoundError, StaleIndexError, TarIndexError
from tarindex.index.format import META_KEY, ShardInfo, ShardTable, bucket_keys
from tarindex.index.pages import seal
from tarindex.index.reader import IndexReader
from tarindex.index.writer import IndexWriter
from tarindex.scan import scan_shard

ROOT = Path(__file__).resolve().parent.parent


def _strip(sample: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in sample.items() if k != "__url__"}


@pytest.fixture
def built(tmp_path: Path) -> tuple[list[Path], Path]:
    paths = make_shard_set(tmp_path / "data", n_shards=3, per=7)
    report = tarindex.build_index([str(p) for p in paths], workers=1)
    return paths, report.path


# -- format 3 and other files ----------------------------------------------------------------------
def test_a_format_3_index_asks_for_a_rebuild_and_build_over_it_rebuilds(built: tuple[list[Path], Path]) -> None:
    import lmdb

    paths, index = built
    index.unlink()
    env = lmdb.open(str(index), subdir=False, lock=False, map_size=1 << 20)
    with env.begin(write=True) as txn:
        txn.put(META_KEY, json.dumps({"magic": "tarindex", "format_version": 3, "shards": []}).encode())
    env.close()
    with pytest.raises(IndexFormatError, match=r"index format version 3, this tarindex reads version 5; rebuild the index"):
        IndexReader(index)
    report = tarindex.build_index([str(p) for p in paths], workers=1)
    assert len(report.scanned) == 3 and len(tarindex.TarDataset(index)) == 21


# -- truncation: never SIGBUS ----------------------------------------------------------------------
_PROBE = """
import sys, tarindex
from tarindex.errors import TarIndexError
for path in sys.argv[1:]:
    try:
        ds = tarindex.TarDataset(path)
        [ds[i] for i in range(len(ds))]
        [ds.get(k) for k in ds.keys()]
        print("ok")
    except TarIndexError as exc:
        print(type(exc).__name__, str(exc).replace(chr(10), " "))
"""


@pytest.mark.parametrize("pure", [False, True], ids=["c", "python"])
def test_truncated_index_files_are_errors_not_sigbus(built: tuple[list[Path], Path], pure: bool) -> None:
    _, index = built
    raw = index.read_bytes()
    cuts = sorted({0, 1, 100, 4096, 8191, 8192, len(raw) // 2, len(raw) - 4096, len(raw) - 1})
    copies = []
    for cut in cuts:
        copy = index.with_name(f"cut-{cut}.tarindex")
        copy.write_bytes(raw[:cut])
        copies.append(str(copy))
    env = {**os.environ, "PYTHONPATH": str(ROOT), **({"TARINDEX_PURE_PYTHON": "1"} if pure else {})}
    out = subprocess.run([sys.executable, "-c", _PROBE, *copies], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert len(lines) == len(cuts)
    for cut, line in zip(cuts, lines):
        assert line.startswith("IndexFormatError"), (cut, line)
        assert f"cut-{cut}.tarindex" in line
    assert any("truncated (expected at least" in line for line in lines)


def test_the_cli_says_truncated_in_one_line(built: tuple[list[Path], Path]) -> None:
    _, index = built
    index.write_bytes(index.read_bytes()[: index.stat().st_size // 2])
    out = subprocess.run([sys.executable, "-m", "tarindex.cli.main", "info", str(index)], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)  # fmt: skip
    assert out.returncode == 1 and out.stderr.count("\n") == 1 and "the index is truncated" in out.stderr


# -- seeded mutation fuzz ------------------------------------------------------------------------
_FUZZ = """
import json, sys
import tarindex
from tarindex.errors import TarIndexError
expected = json.load(open(sys.argv[1]))
for path in sys.argv[2:]:
    outcomes = []
    try:
        ds = tarindex.TarDataset(path)
        for i in range(len(ds)):
            try:
                s = ds[i]
                exp = expected.get(s["__key__"])
                same = exp is not None and {k: v.hex() for k, v in s.items() if k not in ("__key__", "__url__", "__index__")} == exp
                outcomes.append("same" if same else "WRONG " + s["__key__"])
            except TarIndexError as exc:
                outcomes.append(type(exc).__name__)
        for key in expected:
            try:
                s = ds.get(key)
                outcomes.append("same" if s["__key__"] == key else "WRONG get " + key)
            except TarIndexError as exc:
                outcomes.append(type(exc).__name__)
    except TarIndexError as exc:
        outcomes.append(type(exc).__name__)
    print(json.dumps(outcomes))
"""


def _mutations(raw: bytes, rng: random.Random, n: int) -> list[bytes]:
    out = []
    for k in range(n):
        data = bytearray(raw)
        kind = k % 3
        if kind == 0:  # flip 1-8 bits anywhere
            for _ in range(rng.randint(1, 8)):
                at = rng.randrange(len(data))
                data[at] ^= 1 << rng.randrange(8)
        elif kind == 1:  # overwrite a run of bytes
            at = rng.randrange(len(data))
            data[at : at + rng.randint(1, 16)] = bytes(rng.randrange(256) for _ in range(16))[: len(data) - at]
        else:  # truncate
            data = data[: rng.randrange(len(data))]
        out.append(bytes(data))
    return out


@pytest.mark.parametrize("pure", [False, True], ids=["c", "python"])
def test_seeded_mutation_fuzz_of_index_files(built: tuple[list[Path], Path], tmp_path: Path, pure: bool) -> None:
    """Every damaged index: the same samples, or a named error; never a crash, other exceptions or wrong bytes."""
    _, index = built
    ds = tarindex.TarDataset(index)
    expected = {s["__key__"]: {k: v.hex() for k, v in s.items() if not k.startswith("__")} for s in ds}
    (tmp_path / "expected.json").write_text(json.dumps(expected))
    raw = index.read_bytes()
    files = []
    for k, data in enumerate(_mutations(raw, random.Random(1234), 120)):
        f = index.with_name(f"m{k:03d}.tarindex")
        f.write_bytes(data)
        files.append(str(f))
    env = {**os.environ, "PYTHONPATH": str(ROOT), **({"TARINDEX_PURE_PYTHON": "1"} if pure else {})}
    out = subprocess.run([sys.executable, "-c", _FUZZ, str(tmp_path / "expected.json"), *files], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    results = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(results) == len(files)
    outcomes = [o for r in results for o in r]
    assert not [o for o in outcomes if o.startswith("WRONG")]
    assert {o for o in outcomes} <= {"same", "IndexFormatError", "SampleNotFoundError", "CorruptArchiveError", "StaleIndexError"}
    assert sum(1 for r in results if "IndexFormatError" in r) > 60  # most mutations hit something the index reads


def _edited(index: Path, out: Path, edit: Any) -> Path:
    """A copy of ``index`` whose meta went through ``edit`` and was sealed again (a crafted, not a damaged, file)."""
    import lmdb

    out.write_bytes(index.read_bytes())
    env = lmdb.open(str(out), subdir=False, lock=False, map_size=1 << 30)
    with env.begin(write=True) as txn:
        meta = json.loads(bytes(txn.get(META_KEY))[4:])
        edit(meta)
        txn.put(META_KEY, seal(META_KEY, json.dumps(meta).encode()))
    env.close()
    return out


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("n_samples", 5000, "bad n_blocks"),  # two blocks of 4096, the meta says one
        ("n_samples", 22, "shard start table is damaged"),
        ("n_samples", 20, "shard start table is damaged"),
        ("n_samples", -1, "bad n_samples"),
        ("n_shards", 2, "bad n_shards: 2, the shard start table holds 4 entries, expected n_shards \\+ 1"),
        ("format_version", 4, "index format version 4, this tarindex reads version 5; rebuild the index"),
        ("url_shards", 4, "bad url_shards"),
        ("command_shards", -1, "bad command_shards"),
        ("zstd_frames", 3, "bad zstd_samples"),
        ("zstd_samples", 5, "bad zstd_samples"),
        ("n_buckets", 0, "bad n_buckets"),
        ("sample_bytes", 9, "bad sample_bytes"),
        ("exts", ["txt", 5], "bad exts"),
        ("exts", ["txt"], "bad ext_members"),  # the members per extension no longer match the table
        ("ext_members", [1, 2, 3], "bad ext_members"),
        ("ext_members", None, "bad ext_members"),
        ("data_bytes", -5, "bad data_bytes"),
        ("zstd_shards", "2", "bad zstd_shards"),
        ("gzip_shards", 999, "bad gzip_shards"),  # more than the index's shards
        ("block_samples", 7, "bad n_blocks"),
        ("part", [3, 2], "bad part"),
        ("build_id", None, "bad build_id"),
        ("packed", 5, "bad packed"),
    ],
)
def test_edited_meta_is_refused(built: tuple[list[Path], Path], tmp_path: Path, field: str, value: Any, message: str) -> None:
    _, index = built
    bad = _edited(index, tmp_path / "edited.tarindex", lambda m: m.__setitem__(field, value))
    with pytest.raises(IndexFormatError, match=message):
        ds = tarindex.TarDataset(bad)
        ds.shard_sizes  # noqa: B018 - reads the shard start table
        for i in range(len(ds)):
            ds[i]


def test_offsets_beyond_the_shard_are_an_error_not_other_bytes(tmp_path: Path) -> None:
    paths = make_shard_set(tmp_path / "d", n_shards=2, per=3)
    info, table = scan_shard(str(paths[0]))
    table.sample_offset[1] = info.size + 4096  # a crafted record: the sample lies past the end of its shard
    with IndexWriter(tmp_path / "d" / "x.tarindex") as w:
        w.add(ShardInfo(paths[0].name, info.size, info.mtime_ns, info.fingerprint, info.n_samples, info.n_members), table)
        other, other_table = scan_shard(str(paths[1]))
        w.add(ShardInfo(paths[1].name, other.size, other.mtime_ns, other.fingerprint, other.n_samples, other.n_members), other_table)
    ds = tarindex.TarDataset(tmp_path / "d" / "x.tarindex")
    with pytest.raises(IndexFormatError, match=rf"the record of sample 1 is damaged \(\d+ bytes at offset {info.size + 4096} past the {info.size} bytes of shard 0\)"):
        ds[1]


# -- the LMDB environment outlives views; a rebuilt file is refused after fork -----------------------
def test_closing_the_index_under_a_live_dataset_keeps_its_reads_valid(built: tuple[list[Path], Path]) -> None:
    _, index = built
    ds = tarindex.TarDataset(index)
    first = _strip(ds[0])
    ds.index.close()
    assert _strip(ds[0]) == first and ds[20]["__key__"] == "s02i006"
    assert ds.get("s01i003")["__key__"] == "s01i003"  # the reader reopens on use
    ds.index.close()
    del ds
    import gc

    gc.collect()
    assert tarindex.TarDataset(index)[1]["__key__"] == "s00i001"


def _child_read(ix: IndexReader, q: Any) -> None:
    try:
        q.put(("ok", ix.key(0)))
    except StaleIndexError as exc:
        q.put((type(exc).__name__, str(exc)))


def test_a_forked_reader_refuses_an_index_rebuilt_in_place(built: tuple[list[Path], Path]) -> None:
    """An IndexReader inherited through fork opens the file again: another build there is refused, never mixed in.

    (A TarDataset reloads its per-index state instead: tests/test_dataset.py.)
    """
    paths, index = built
    ix = IndexReader(index)
    assert ix.key(0) == "s00i000"
    tarindex.build_index([str(p) for p in paths[1:]], index=index, workers=1, drop_unlisted=True)  # the same path, other shards
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    child = ctx.Process(target=_child_read, args=(ix, q))
    child.start()
    kind, message = q.get(timeout=60)
    child.join(60)
    assert kind == "IndexChangedError" and f"{index}: the index file changed since it was opened" in message
    assert issubclass(IndexChangedError, StaleIndexError)
    assert ix.key(0) == "s00i000"  # this process keeps the file it opened


# -- merge ---------------------------------------------------------------------------------------
def _same_index(a: Path, b: Path) -> None:
    x, y = IndexReader(a), IndexReader(b)
    assert [(s.path, s.size, s.n_samples) for s in x.shards] == [(s.path, s.size, s.n_samples) for s in y.shards]
    cx, cy = x.decode(), y.decode()
    for name in ("shard", "offset", "size", "nmembers", "member_offset", "member_size"):
        assert np.array_equal(getattr(cx, name), getattr(cy, name)), name
    assert [x.exts[e] for e in cx.member_ext] == [y.exts[e] for e in cy.member_ext]
    assert cx.keys == cy.keys and x.duplicate_keys == y.duplicate_keys


def test_merge_of_parts_equals_one_build_in_any_order(tmp_path: Path) -> None:
    paths = [str(p) for p in make_shard_set(tmp_path / "d", n_shards=11, per=3)]
    whole = tarindex.build_index(paths, index=tmp_path / "d" / "whole.tarindex", workers=1).path
    parts = [tarindex.build_index(paths, part=(k, 11), workers=1).path for k in range(1, 12)]
    assert parts[0].name == "train.part-01-of-11.tarindex"
    random.Random(0).shuffle(parts)
    merged = tarindex.merge_indexes(parts, tmp_path / "d" / "merged.tarindex")
    _same_index(whole, merged)
    with pytest.raises(TarIndexError, match=r"part 5/11 is missing \(10 of 11 parts given\)"):
        tarindex.merge_indexes([p for p in parts if "part-05" not in p.name], tmp_path / "d" / "m2.tarindex")
    twice = next(p for p in parts if "part-03" in p.name)
    copy = twice.with_name("copy.tarindex")
    copy.write_bytes(twice.read_bytes())
    with pytest.raises(TarIndexError, match=r"part 3/11 is given twice"):
        tarindex.merge_indexes([*parts, copy], tmp_path / "d" / "m3.tarindex")
    assert not (tmp_path / "d" / "m2.tarindex").exists() and not (tmp_path / "d" / "m3.tarindex").exists()


def test_an_interrupted_merge_leaves_the_previous_index(tmp_path: Path) -> None:
    paths = [str(p) for p in make_shard_set(tmp_path / "d", n_shards=4, per=3)]
    a = tarindex.build_index(paths[:2], index=tmp_path / "d" / "a.tarindex", workers=1).path
    b = tarindex.build_index(paths[2:], index=tmp_path / "d" / "b.tarindex", workers=1).path
    out = tarindex.merge_indexes([a, b], tmp_path / "d" / "out.tarindex")
    before = out.read_bytes()
    raw = bytearray(b.read_bytes())
    reader = IndexReader(b)
    n = len(raw)
    reader.close()
    damaged = tmp_path / "d" / "damaged.tarindex"
    for at in range(n - 1, 0, -1):  # damage the last record block of b: the merge fails midway
        raw2 = bytearray(raw)
        raw2[at] ^= 0xFF
        damaged.write_bytes(raw2)
        try:
            IndexReader(damaged).decode()
        except IndexFormatError:
            break
    with pytest.raises(IndexFormatError):
        tarindex.merge_indexes([a, damaged], out)
    assert out.read_bytes() == before and len(tarindex.TarDataset(out)) == 12
    assert sorted(p.name for p in out.parent.iterdir() if ".tmp-" in p.name) == []


def test_stale_temporaries_of_killed_writers_are_removed(built: tuple[list[Path], Path]) -> None:
    paths, index = built
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout.strip()
    leftovers = [index.with_name(f".{index.name}.tmp-{dead}"), index.with_name(f".{index.name}.tmp-{dead}-lock")]
    spill = index.with_name(f".{index.name}.tmp-{dead}.spill")
    spill.mkdir()
    (spill / "keys-000").write_bytes(b"x")
    for f in leftovers:
        f.write_bytes(b"partial")
    mine = index.with_name(f".{index.name}.tmp-{os.getpid()}-other")  # not a name a writer makes: kept
    mine.write_bytes(b"x")
    os.utime(paths[0])
    tarindex.build_index([str(p) for p in paths], workers=1)
    assert not any(f.exists() for f in [*leftovers, spill]) and mine.exists()


# -- executors -------------------------------------------------------------------------------------
def test_a_process_pool_executor_builds_the_same_index(tmp_path: Path) -> None:
    from concurrent.futures import ProcessPoolExecutor

    paths = [str(p) for p in make_shard_set(tmp_path / "d", n_shards=5, per=4)]
    local = tarindex.build_index(paths, index=tmp_path / "local.tarindex", workers=1).path
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        pooled = tarindex.build_index(paths, index=tmp_path / "pool.tarindex", executor=pool).path
    _same_index(local, pooled)


def test_a_dask_local_cluster_builds_the_same_index(tmp_path: Path) -> None:
    pytest.importorskip("distributed")  # the test extra installs dask[distributed]

    paths = [str(p) for p in make_shard_set(tmp_path / "d", n_shards=6, per=4)]
    local = tarindex.build_index(paths, index=tmp_path / "local.tarindex", workers=1).path
    # a fresh process: the cluster's workers and the client start from a clean interpreter, as in a user's job
    code = (
        "import sys, distributed, tarindex\n"
        "if __name__ == '__main__':\n"
        "    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None)\n"
        "    with cluster, distributed.Client(cluster) as client:\n"
        "        assert len(client.scheduler_info()['workers']) == 2\n"
        "        report = tarindex.build_index(sys.argv[2:], index=sys.argv[1], executor=client.get_executor())\n"
        "    assert report.scanned == sys.argv[2:], report\n"
    )
    script = tmp_path / "dask_build.py"
    script.write_text(code)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "dask.tarindex"), *paths], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    _same_index(local, tmp_path / "dask.tarindex")


# -- cold start --------------------------------------------------------------------------------------
def _resident_pages(path: Path) -> int:
    """Pages of ``path`` in the page cache (mincore over a fresh mapping of it)."""
    size = path.stat().st_size
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)  # private and writable: ctypes can take its address
        try:
            pages = -(-size // mmap.PAGESIZE)
            vec = ctypes.create_string_buffer(pages)
            buf = (ctypes.c_char * size).from_buffer(m)  # type: ignore[arg-type]
            addr = ctypes.addressof(buf)
            if libc.mincore(ctypes.c_void_p(addr), size, vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore")
            del buf
            return sum(b & 1 for b in vec.raw)
        finally:
            m.close()


def _evict(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _renamed_copy(shard: Path, out: Path, prefix: str) -> None:
    """A copy of ``shard`` whose members are named ``prefix`` + their name, headers and data where they were."""
    import tarfile

    data = bytearray(shard.read_bytes())
    with tarfile.open(shard) as tf:
        for member in tf:
            h = member.offset
            data[h : h + 100] = (prefix + member.name).encode().ljust(100, b"\x00")
            data[h + 148 : h + 156] = b" " * 8
            data[h + 148 : h + 156] = b"%06o\x00 " % sum(data[h : h + 512])
    out.write_bytes(data)


def synthetic_index(out: Path, shard: Path, n_shards: int, linked: Any = None, renamed: Any = ()) -> tuple[int, list[str]]:
    """An index of ``n_shards`` copies of ``shard``, written directly from its table; keys made unique.

    The copies are hard links, made for the shard numbers in ``linked`` (default: all); those in ``renamed``
    are real copies whose members carry the unique keys, so samples can be read from them (a read checks
    the members' names against the index).
    """
    info, table = scan_shard(str(shard))
    keys = []
    with IndexWriter(out) as w:
        for s in range(n_shards):
            link = shard.with_name(f"copy-{s:05d}.tar")
            if s in renamed:
                _renamed_copy(shard, link, f"{s:05d}")
            elif (linked is None or s in linked) and not link.exists():
                os.link(shard, link)
            names = [f"{s:05d}{i:06d}" for i in range(table.n_samples)]
            keys.append(names[len(names) // 2])
            copy = scan_shard(str(link))[0] if s in renamed else info
            w.add(ShardInfo(link.name, copy.size, copy.mtime_ns, copy.fingerprint, info.n_samples, info.n_members),
                  ShardTable(table.sample_offset, table.sample_size, table.sample_nmembers, table.member_ext,
                             table.member_offset, table.member_size, names, table.exts))  # fmt: skip
    return n_shards * table.n_samples, keys


def test_cold_open_and_first_sample_touch_a_few_pages_of_a_million_sample_index(tmp_path: Path) -> None:
    from conftest import py_tar

    shard = py_tar(tmp_path / "base.tar", [(f"{i:06d}.bin", bytes([i % 256]) * 24) for i in range(10_000)], 1, dirs=False)
    index = tmp_path / "big.tarindex"
    n, keys = synthetic_index(index, shard, 100, renamed={65})
    assert n == 1_000_000
    _evict(index)
    before = _resident_pages(index)
    ds = tarindex.TarDataset(index)
    sample = ds[654_321]
    touched = _resident_pages(index) - before
    assert sample["__key__"] == "00065004321" and sample["bin"] == bytes([4321 % 256]) * 24
    assert touched <= 48, f"{touched} pages of {index.stat().st_size // mmap.PAGESIZE} read for one sample"
    _evict(index)
    before = _resident_pages(index)
    assert IndexReader(index).lookup(keys[77]) == 77 * 10_000 + 5_000
    assert _resident_pages(index) - before <= 48
    assert index.stat().st_size / n <= 16  # bytes per sample, keys and key table included


def test_opening_an_index_of_many_shards_reads_no_shard_table(tmp_path: Path) -> None:
    """Shard records are read by block when a sample of that shard is first read: 20,000 shards cost what 100 do."""
    from conftest import py_tar

    shard = py_tar(tmp_path / "base.tar", [(f"{i:06d}.bin", bytes([i % 256]) * 24) for i in range(50)], 1, dirs=False)
    index = tmp_path / "many.tarindex"
    n, _ = synthetic_index(index, shard, 20_000, linked={13_093}, renamed={13_093})
    assert n == 1_000_000
    _evict(index)
    before = _resident_pages(index)
    ds = tarindex.TarDataset(index)
    assert len(ds) == n and ds.samples_per_frame == 1
    sample = ds[654_651]  # shard 13,093
    touched = _resident_pages(index) - before
    assert sample["__key__"] == "13093000001" and sample["bin"] == bytes([1]) * 24
    assert sample["__url__"] == str(tmp_path / "copy-13093.tar")
    records = json.dumps([ShardInfo("copy-00000.tar", 1, 1, "f" * 64, 50, 50).to_json()] * 20_000)
    assert touched <= 40, f"{touched} pages read for one sample (the shard records alone are {len(records) // mmap.PAGESIZE} pages)"
    assert ds.shard_sizes[13_093] == 50 and len(ds.urls) == 20_000
    assert ds.urls.names.count(None) == 20_000 - 1  # only the shard read from has its record decoded
    with pytest.raises(ShardNotFoundError, match=r"copy-13094\.tar"):
        ds[654_700]
    records = ds.index.shards  # every record, in blocks of 64, a bounded number of blocks kept decoded
    assert [info.path for info in records] == [f"copy-{s:05d}.tar" for s in range(20_000)]
    assert 0 < len(records._blocks) <= 256 and records[-1].path == "copy-19999.tar"


def test_key_hashes_spilled_to_files_give_the_same_key_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer past its in-memory bound of key entries spills them by partition; the table is the same."""
    import lmdb

    import tarindex.index.writer as writer_module
    from conftest import py_tar

    shard = py_tar(tmp_path / "base.tar", [(f"{i:06d}.bin", bytes([i % 256]) * 3) for i in range(300)], 1, dirs=False)
    kept, spilled = tmp_path / "kept.tarindex", tmp_path / "spilled.tarindex"
    _, keys = synthetic_index(kept, shard, 20)
    monkeypatch.setattr(writer_module, "_SPILL_ROWS", 1000)  # 6,000 samples: spilled six times
    synthetic_index(spilled, shard, 20)
    _same_index(kept, spilled)
    tables = []
    for index in (kept, spilled):
        env = lmdb.open(str(index), subdir=False, readonly=True, lock=False)
        with env.begin() as txn:
            tables.append([(bytes(k), bytes(v)) for k, v in txn.cursor() if bytes(k).startswith(b"k/")])
        env.close()
    assert tables[0] == tables[1] and len(tables[0]) == -(-6000 // bucket_keys(2))  # 6,000 samples: 2-byte sample numbers
    assert [IndexReader(spilled).lookup(k) for k in keys] == [s * 300 + 150 for s in range(20)]


def test_no_temp_names_are_left_by_a_failed_write(tmp_path: Path) -> None:
    paths = make_shard_set(tmp_path / "d", n_shards=1, per=2)
    info, table = scan_shard(str(paths[0]))
    table.keys[0] = "x" * 70_000  # too long a key: the write fails
    with pytest.raises(IndexFormatError, match="at most 65535"), IndexWriter(tmp_path / "d" / "x.tarindex") as w:
        w.add(info, table)
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["train-000000.tar"]



def test_kill_9_during_builds_leaves_a_valid_index_and_the_next_build_cleans_up(tmp_path: Path) -> None:
    import signal
    import time

    paths = [str(p) for p in make_shard_set(tmp_path / "d", n_shards=12, per=40)]
    index = tarindex.build_index(paths, workers=1).path
    expected = [_strip(s) for s in tarindex.TarDataset(index)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    rng = random.Random(7)
    for _ in range(10):
        for p in paths:
            os.utime(p)  # every shard looks changed: the build rescans and rewrites
        proc = subprocess.Popen([sys.executable, "-m", "tarindex.cli.main", "build", *paths, "-q", "--workers", "2"], env=env)
        time.sleep(rng.uniform(0.3, 2.5))
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        ds = tarindex.TarDataset(index)  # the previous index, or the new one if the rename came first: whole either way
        assert [_strip(s) for s in ds] == expected
    tarindex.build_index(paths, workers=1)
    assert [p.name for p in index.parent.iterdir() if ".tmp-" in p.name] == []
