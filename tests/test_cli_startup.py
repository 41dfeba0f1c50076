"""The command line starts at once: ``--help``, a command's ``--help`` and usage errors import neither
numpy nor lmdb nor torch (nor the zstd codec)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tarindex.cli.main import COMMANDS

HEAVY = ("numpy", "lmdb", "torch", "zstandard")

_PROBE = """
import json, sys
from tarindex.cli.main import main
sys.argv = ["tarindex", *json.loads(sys.argv[1])]
try:
    main()
    code = 0
except SystemExit as exc:
    code = exc.code
sys.stdout.flush()
print("\\n" + json.dumps({"code": code, "modules": sorted({m.split(".")[0] for m in sys.modules})}))
"""


def _start(*args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (os.path.dirname(os.path.dirname(os.path.abspath(__file__))), os.environ.get("PYTHONPATH")) if p)}
    out = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(list(args))], capture_output=True, text=True, env=env, check=True, timeout=60)
    return dict(json.loads(out.stdout.rstrip().rsplit("\n", 1)[-1]), stdout=out.stdout, stderr=out.stderr)


@pytest.mark.parametrize(
    ("args", "code"),
    [(("--help",), 0), (("-h",), 0), (("--version",), 0), (("nosuch",), 2), (("build",), 2), (("info",), 2), (("get", "x"), 2)]
    + [((name, "--help"), 0) for name in COMMANDS],
)
def test_start_up_imports_nothing_heavy(args: tuple[str, ...], code: int) -> None:
    got = _start(*args)
    assert got["code"] == code, got
    assert not set(HEAVY) & set(got["modules"]), (args, set(HEAVY) & set(got["modules"]))


def test_help_lists_every_command_with_its_own_help() -> None:
    """The listing comes from the command objects: each command's first docstring line, one copy."""
    import importlib

    out = _start("--help")["stdout"]
    for name in COMMANDS:
        cmd = importlib.import_module(f"tarindex.cli.{name}_cmd").command
        first = cmd.get_short_help_str(limit=30).rstrip(".")
        line = next(ln for ln in out.splitlines() if ln.strip().startswith(name + " "))
        assert first.split("...")[0][:25] in line, (name, line)


def test_import_tarindex_is_light() -> None:
    code = "import sys, tarindex; print(sorted({m.split('.')[0] for m in sys.modules}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60).stdout
    assert not set(HEAVY[:3]) & set(eval(out)), out  # our own output


def test_compress_defaults_are_the_writers() -> None:
    from tarindex import shard_writer
    from tarindex.cli import compress_cmd

    assert (compress_cmd.DEFAULT_LEVEL, compress_cmd.DEFAULT_FRAME_SIZE) == (shard_writer.DEFAULT_LEVEL, shard_writer.DEFAULT_FRAME_SIZE)


def _totals_from_records(index: str) -> dict:
    """What ``info`` shows, counted from every record (the reference for the totals the meta keeps)."""
    import numpy as np

    from tarindex.index.reader import IndexReader

    ix = IndexReader(index)
    samples = ix.decode()
    counts = np.bincount(samples.member_ext, minlength=len(ix.exts)).tolist()
    found = {
        "samples": ix.n_samples,
        "members": ix.n_members,
        "shards": len(ix.shards),
        "sample_bytes": int(samples.size.sum()),
        "shard_bytes": sum(s.size for s in ix.shards),
        "zstd_shards": sum(s.compression == "zstd" for s in ix.shards),
        "gzip_shards": sum(s.compression == "gzip" for s in ix.shards),
        "extensions": {e: n for e, n in zip(ix.exts, counts) if n},
    }
    ix.close()
    return found


def _info(index: str) -> dict:
    got = _start("info", "--json", index)
    assert got["code"] == 0, got
    assert not {"numpy", "torch"} & set(got["modules"]), set(got["modules"]) & {"numpy", "torch"}
    out = json.loads(got["stdout"].rstrip().rsplit("\n", 1)[0])
    return {k: out[k] for k in ("samples", "members", "shards", "sample_bytes", "shard_bytes", "zstd_shards", "gzip_shards", "extensions")}


def test_info_reads_only_the_meta_and_its_totals_match_the_records(shard_set) -> None:
    """``info`` shows totals the meta keeps (no record decoded, numpy not imported), equal to counting every
    record: after a build, a merge of parts, and an incremental rebuild that replaced one shard."""
    import gzip
    import io
    import shutil
    import tarfile

    import tarindex

    shards = shard_set(n_shards=4, per=5)
    root = shards[0].parent
    tarindex.compress_shard(shards[2], shards[2].with_suffix(".tar.zst"))
    with open(shards[3], "rb") as src, gzip.open(shards[3].with_suffix(".tar.gz"), "wb") as dst:
        shutil.copyfileobj(src, dst)
    shards = [shards[0], shards[1], shards[2].with_suffix(".tar.zst"), shards[3].with_suffix(".tar.gz")]  # plain, zstd, gzip
    whole = tarindex.build_index([str(s) for s in shards], index=root / "whole.tarindex", workers=1).path
    assert _info(str(whole)) == _totals_from_records(str(whole))
    assert {k: _info(str(whole))[k] for k in ("shards", "zstd_shards", "gzip_shards")} == {"shards": 4, "zstd_shards": 1, "gzip_shards": 1}
    text = _start("info", str(whole))["stdout"]
    assert "zstd shards:    1\n" in text and "gzip shards:    1\n" in text, text
    parts = [tarindex.build_index([str(s) for s in shards], index=root / f"p{k}.tarindex", part=(k, 2), workers=1).path for k in (1, 2)]
    merged = tarindex.merge_indexes(parts, root / "merged.tarindex")
    assert _info(str(merged)) == _totals_from_records(str(merged)) == _totals_from_records(str(whole))
    with tarfile.open(shards[1], "w") as tf:  # one shard replaced: other members, another extension
        for i in range(3):
            data = b"x" * (100 + i)
            info = tarfile.TarInfo(f"new{i:03d}.npy")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    report = tarindex.build_index([str(s) for s in shards], index=whole, workers=1)
    assert len(report.scanned) == 1
    got = _info(str(whole))
    assert got == _totals_from_records(str(whole)) and got["extensions"]["npy"] == 3 and got["samples"] == 3 * 5 + 3


@pytest.mark.parametrize("dropped", ["every total", "gzip_shards"])
def test_info_counts_the_records_of_an_index_whose_meta_keeps_no_totals(shard_set, dropped: str) -> None:
    """An index written before the meta kept the totals (all of them, or the later ``gzip_shards``): ``info``
    counts them from the records, the same figures."""
    import lmdb

    import tarindex
    from tarindex.index.format import CONTENT_SUMMARY, LATER_CONTENT, META_KEY
    from tarindex.index.pages import seal, unseal

    shards = shard_set(n_shards=3, per=4)
    index = tarindex.build_index([str(s) for s in shards], index=shards[0].parent / "old.tarindex", workers=1).path
    kept = _info(str(index))
    env = lmdb.open(str(index), subdir=False, lock=False)
    with env.begin(write=True) as txn:
        meta = json.loads(bytes(unseal(txn.get(META_KEY), META_KEY, "meta")))
        for k in (*CONTENT_SUMMARY, "ext_members") if dropped == "every total" else LATER_CONTENT:
            del meta[k]
        txn.put(META_KEY, seal(META_KEY, json.dumps(meta).encode()))
    env.close()
    got = _start("info", "--json", str(index))
    assert got["code"] == 0 and "numpy" in got["modules"], got  # the records were decoded
    out = json.loads(got["stdout"].rstrip().rsplit("\n", 1)[0])
    assert {k: out[k] for k in kept} == kept == _totals_from_records(str(index))
