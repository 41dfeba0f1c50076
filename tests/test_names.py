"""Names are data: a scheme is honoured only in a name the caller wrote, never in one from a glob or an index."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lmdb
import pytest
from click.testing import CliRunner

import tarindex
from conftest import make_shard_set, package_lines, tarfile_members
from tarindex.cli.main import main
from tarindex.errors import CommandNotAllowedError, IndexFormatError, RandomAccessError, ShardNotFoundError
from tarindex.index.format import META_KEY, SHARDS_PREFIX
from tarindex.index.pages import numbered, seal
from tarindex.naming import ShardRef, as_path
from tarindex.shards import expand_shards


def edit_meta(index: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    """Rewrite an index's meta and shard records in place (sealed again), as a hostile or careless tool would.

    ``edit`` gets the meta with the shard records as ``meta["shards"]``.
    """
    env = lmdb.open(str(index), subdir=False, lock=False)
    try:
        with env.begin(write=True) as txn:
            meta = json.loads(bytes(txn.get(META_KEY))[4:])
            per = meta["shard_block"]
            keys = [numbered(SHARDS_PREFIX, b) for b in range(-(-meta["n_shards"] // per))]
            meta["shards"] = [info for key in keys for info in json.loads(bytes(txn.get(key))[4:])]
            edit(meta)
            shards = meta.pop("shards")
            txn.put(META_KEY, seal(META_KEY, json.dumps(meta).encode()))
            for b, key in enumerate(keys):
                txn.put(key, seal(key, json.dumps(shards[b * per : (b + 1) * per]).encode()))
    finally:
        env.close()


def all_streamed(stream: tarindex.TarStream) -> list[tuple[str, bytes]]:
    return [(s["__key__"], s["txt"]) for s in stream]


def test_kinds_and_listed_names() -> None:
    assert [ShardRef.of(n).stored for n in ("a.tar", "pipe:cat a", "-", "http://h/a.tar", "s3://b/a.tar")] == [
        "file", "command", "command", "url", "url"]  # fmt: skip
    assert as_path("pipe:x.tar") == "./pipe:x.tar" and as_path("-") == "./-" and as_path("a.tar") == "a.tar"
    assert as_path("s3://b/k.tar") == "./s3://b/k.tar" and ShardRef.of(as_path("s3://b/k.tar")).local


REFS = {  # name -> (kind, scheme, path, stored kind)
    "data/a.tar": ("file", "", "data/a.tar", "file"),
    "./pipe:x.tar": ("file", "", "./pipe:x.tar", "file"),
    "-": ("stdin", "", "-", "command"),
    "pipe:cat a.tar": ("pipe", "", "cat a.tar", "command"),
    "http://h:8/a.tar": ("http", "http", "h:8/a.tar", "url"),
    "HTTPS://h/a.tar": ("http", "https", "h/a.tar", "url"),
    "s3://b/k/a.tar": ("object", "s3", "b/k/a.tar", "url"),
    "s3a://b/a.tar": ("object", "s3a", "b/a.tar", "url"),
    "gcs://b/a.tar": ("object", "gcs", "b/a.tar", "url"),
    "abfss://c/a.tar": ("object", "abfss", "c/a.tar", "url"),
    "hf://datasets/o/n/a.tar": ("hub", "hf", "datasets/o/n/a.tar", "url"),
    "file:///d/a.tar": ("file-url", "file", "/d/a.tar", "url"),
    "memory://x/a.tar": ("fsspec", "memory", "x/a.tar", "url"),
}


@pytest.mark.parametrize("name", list(REFS))
def test_a_shard_reference_reads_a_name_once(name: str) -> None:
    ref = ShardRef.of(name)
    assert (ref.kind, ref.scheme, ref.path, ref.stored) == REFS[name]
    assert ref.name == name and ref.prefix + ref.path == name
    assert ref.local == (ref.kind == "file") and ref.url == (ref.stored == "url")
    assert ref.ranged == (ref.kind == "http") and ref.listable == (ref.url and ref.kind != "http")
    assert ref.store == {"s3": "s3", "s3a": "s3", "gcs": "gs", "abfss": "az"}.get(ref.scheme)
    assert (ref.secure, ref.cleartext) == (ref.scheme == "https", ref.scheme == "http")


SCHEME_TEST = re.compile(
    r"""["']://["']"""  # "://" in name, name.split("://"), name.partition("://")
    r"""|\.startswith\(\s*["'](?:pipe:|[\w.+-]+://)"""  # name.startswith("pipe:"), url.startswith("http://")
    r"""|\bscheme\w*(?:\.lower\(\))?\s*(?:[=!]=|(?:not\s+)?in\b)\s*[("'\[{A-Z_]"""  # scheme == "s3", scheme in ("http", ...)
    r"""|\b(?:url|name|spec|path|shard)\s*[=!]=\s*["']-["']"""  # a shard name compared with "-"
    r"""|\b(?:is_url|is_hub_url|is_object_url|shard_kind|OBJECT_SCHEMES)\b"""  # the classifiers the reference replaced
)
"""A shard name's look read outside :mod:`tarindex.naming` (a scheme compared, ``://`` looked for)."""


def test_the_scheme_pattern_finds_the_tests_it_forbids() -> None:
    for line in ('if "://" in url:', "scheme = url.split('://', 1)[0]", 'if url.startswith("pipe:"):', 'if name == "-":',
                 'url.lower().startswith("file://")', 'if scheme in ("http", "https"):', "if parts.scheme.lower() != 'http':",
                 "if scheme in OBJECT_SCHEMES:", "kind = shard_kind(name)"):  # fmt: skip
        assert SCHEME_TEST.search(line), line
    for line in ('f"{ref.scheme}://{host}"', 'if ref.kind == "http":', 'if output != "-":', "if ra.scheme == rb.scheme:"):
        assert not SCHEME_TEST.search(line), line


def test_no_module_but_naming_reads_a_names_scheme() -> None:
    assert package_lines(SCHEME_TEST, {"naming.py"}) == []


def test_glob_match_named_like_a_command_is_indexed_as_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "d"
    shards = make_shard_set(root, 2)
    hostile = root / "pipe:touch PWNED; cat train-000000.tar #.tar"
    shutil.copy(shards[1], hostile)
    monkeypatch.chdir(root)
    assert expand_shards("*.tar")[0] == "./pipe:touch PWNED; cat train-000000.tar #.tar"
    result = CliRunner().invoke(main, ["build", "*.tar", "-q", "-w", "1"])
    assert result.exit_code == 0, result.output
    index = root / "shards.tarindex"
    ix = tarindex.IndexReader(index)
    assert (ix.shards[0].path, ix.shards[0].kind) == (hostile.name, "file")
    result = CliRunner().invoke(main, ["verify", str(index)])
    assert result.exit_code == 0, result.output
    streamed = all_streamed(tarindex.TarStream(index))
    ds = tarindex.TarDataset(index)
    read = [(ds[i]["__key__"], ds[i]["txt"]) for i in range(len(ds))]
    expected = [(n.split(".")[0], d) for p in (hostile, *shards) for n, d in tarfile_members(p) if n.endswith(".txt")]
    assert streamed == read == expected
    assert ds[0]["__url__"] == str(hostile)
    assert not (root / "PWNED").exists()


def test_glob_match_named_dash_is_not_stdin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "d"
    shards = make_shard_set(root, 1)
    shutil.copy(shards[0], root / "-")
    monkeypatch.chdir(root)
    assert expand_shards("?") == ["./-"]
    assert len(all_streamed(tarindex.TarStream("?"))) == 6


@pytest.fixture
def command_index(tmp_path: Path) -> tuple[Path, Path]:
    """An index built from a ``pipe:`` shard the caller named (which ran then, and only then)."""
    root = tmp_path / "c"
    shard = make_shard_set(root, 1)[0]
    index = root / "cmd.tarindex"
    tarindex.build_index([f"pipe:touch {root}/RAN; cat {shard}"], index=index)
    (root / "RAN").unlink()
    return index, root / "RAN"


def test_index_with_command_shard_runs_nothing_unless_allowed(command_index: tuple[Path, Path]) -> None:
    index, marker = command_index
    assert tarindex.IndexReader(index).shards[0].kind == "command"
    with pytest.raises(CommandNotAllowedError, match=r"cmd\.tarindex: shard 'pipe:touch .* is a command.*allow_commands=True"):
        tarindex.TarStream(index)
    result = CliRunner().invoke(main, ["verify", str(index)])
    assert result.exit_code == 1 and "is a command" in result.output and "--allow-commands" in result.output
    ds = tarindex.TarDataset(index)
    with pytest.raises(RandomAccessError, match="a command's output cannot be read at random"):
        ds[0]
    assert not marker.exists()
    assert len(all_streamed(tarindex.TarStream(index, allow_commands=True))) == 6
    assert marker.exists()
    marker.unlink()
    result = CliRunner().invoke(main, ["verify", "--allow-commands", str(index)])
    assert result.exit_code == 0, result.output
    assert marker.exists()


@pytest.mark.parametrize("kind", [None, "file", "url"])
def test_index_meta_naming_a_command(command_index: tuple[Path, Path], kind: str | None) -> None:
    """An edited meta: without a kind (an older index) the name's look decides (a command: refused); a
    ``file`` kind makes it a path; a kind that does not fit the name is a damaged index."""
    index, marker = command_index

    def edit(meta: dict[str, Any]) -> None:
        meta["shards"][0]["path"] = f"pipe:touch {marker}"
        del meta["shards"][0]["kind"]
        if kind is not None:
            meta["shards"][0]["kind"] = kind

    edit_meta(index, edit)
    expected = {None: CommandNotAllowedError, "file": ShardNotFoundError, "url": IndexFormatError}[kind]
    with pytest.raises(expected):
        all_streamed(tarindex.TarStream(index))
    result = CliRunner().invoke(main, ["verify", str(index)])
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    with pytest.raises((expected, RandomAccessError)):
        tarindex.TarDataset(index)[0]
    assert not marker.exists()


@pytest.mark.parametrize("path", ["../outside.tar", "sub/../../outside.tar", "/etc/passwd"])
def test_index_paths_that_leave_its_directory(tmp_path: Path, path: str) -> None:
    shards = make_shard_set(tmp_path / "d", 1)
    shutil.copy(shards[0], tmp_path / "outside.tar")
    index = tarindex.build_index(shards).path
    edit_meta(index, lambda meta: meta["shards"][0].update(path=path))
    pattern = "leaves the index's directory, and the index was not built so"
    ds = tarindex.TarDataset(index)  # a shard's record is read when a sample of it is first read
    with pytest.raises(IndexFormatError, match=pattern):
        ds[0]
    with pytest.raises(IndexFormatError, match=pattern):
        tarindex.TarStream(index)
    result = CliRunner().invoke(main, ["verify", str(index)])
    assert result.exit_code == 1 and pattern in result.output


def test_index_built_outside_its_shards_directory(tmp_path: Path) -> None:
    shards = make_shard_set(tmp_path / "d", 2)
    index = tarindex.build_index(shards, index=tmp_path / "elsewhere" / "x.tarindex").path
    assert [(s.path, s.outside) for s in tarindex.IndexReader(index).shards] == [
        ("../d/train-000000.tar", True), ("../d/train-000001.tar", True)]  # fmt: skip
    assert len(list(tarindex.TarDataset(index))) == len(all_streamed(tarindex.TarStream(index))) == 12
    assert CliRunner().invoke(main, ["verify", str(index)]).exit_code == 0


def test_hostile_fingerprint_writes_nothing_outside_the_cache(tmp_path: Path) -> None:
    import subprocess

    tar = make_shard_set(tmp_path / "d", 1)[0]
    shard = tmp_path / "d" / "one.tar.zst"
    subprocess.run(["zstd", "-q", "--no-check", "-19", str(tar), "-o", str(shard)], check=True)
    tar.unlink()
    index = tarindex.build_index([shard]).path
    assert tarindex.IndexReader(index).shards[0].compression == "zstd"
    edit_meta(index, lambda meta: meta["shards"][0].update(fingerprint="../OUTSIDE_CACHE", random_access=False))
    cache = tmp_path / "cache"
    before = sorted(tmp_path.rglob("*"))
    with pytest.raises(IndexFormatError, match=r"fingerprint '\.\./OUTSIDE_CACHE'.*is damaged"):
        tarindex.TarDataset(index, zstd_cache_dir=cache)[0]
    assert sorted(p for p in tmp_path.rglob("*") if p != cache) == before


# -- names in messages, errors of user code --------------------------------------------------


def test_a_huge_key_makes_a_short_error_line(tmp_path: Path) -> None:
    import io
    import tarfile

    shard = tmp_path / "l-000000.tar"
    with tarfile.open(shard, "w", format=tarfile.PAX_FORMAT) as tf:
        for name in ["a.txt", "k" * 100_000 + ".txt"]:
            ti = tarfile.TarInfo(name)
            ti.size = 1
            tf.addfile(ti, io.BytesIO(b"x"))
    result = CliRunner().invoke(main, ["build", str(shard)])
    assert result.exit_code == 1 and result.output.count("\n") == 1 and len(result.output) < 400, result.output[:500]
    assert "'kkkkkkkkkk" in result.output and "(100000 characters)" in result.output


@pytest.mark.parametrize("stage", ["decoder", "transform"])
def test_dataset_decode_errors_name_shard_and_offset(tmp_path: Path, stage: str) -> None:
    """TarDataset raises what TarStream raises for a member its decoder (or the transform) cannot take."""
    from tarindex.errors import DecodeError

    shards = make_shard_set(tmp_path / "d", 2)

    def bad(value: Any) -> Any:
        raise ValueError("not what I expected")

    kw: dict[str, Any] = {"decoders": {"cls": bad}} if stage == "decoder" else {"transform": bad}
    ds = tarindex.TarDataset(tarindex.build_index(shards).path, **kw)
    offset = ds.index.record(7)[1]
    member = "member 'cls': " if stage == "decoder" else ""  # a decoder's failure names the member it decoded
    seen = r" \(the member: 1 byte, starting b'1'\)" if stage == "decoder" else ""  # its size and first bytes
    pattern = rf"train-000001\.tar: sample 's01i001': {member}ValueError: not what I expected{seen} \(sample at offset {offset}\)"
    with pytest.raises(DecodeError, match=pattern):
        ds[7]
    with pytest.raises(DecodeError, match=rf"train-000001\.tar: sample 's01i000': {member}ValueError: .* \(sample at offset 0\)"):
        next(iter(tarindex.TarStream(shards[1], **kw)))


@pytest.mark.usefixtures("impl")
@pytest.mark.parametrize("ext", ["__key__", "__url__", "__index__", "__KEY__"])
@pytest.mark.parametrize("first", [False, True])
def test_members_named_like_reserved_fields_are_refused(tmp_path: Path, ext: str, first: bool) -> None:
    """``x.__key__`` would replace the sample's ``__key__`` (silently, before): refused as webdataset refuses it,
    a DuplicateMemberError naming the member and its header's offset; the samples before it stream."""
    import io
    import tarfile

    from tarindex.errors import DuplicateMemberError

    shard = tmp_path / "r-000000.tar"
    names = ["a.txt", f"b.{ext}", "b.txt", "c.txt"] if first else ["a.txt", "b.txt", f"b.{ext}", "c.txt"]
    with tarfile.open(shard, "w", format=tarfile.GNU_FORMAT) as tf:
        for name in names:
            ti = tarfile.TarInfo(name)
            ti.size = 3
            tf.addfile(ti, io.BytesIO(b"xyz"))
    offset = 1024 * names.index(f"b.{ext}")
    pattern = rf"r-000000\.tar: member 'b\.{ext}' would replace the reserved field '{ext.lower()}' of sample 'b' at offset {offset}"
    with pytest.raises(DuplicateMemberError, match=pattern):
        tarindex.build_index([shard], workers=1)
    got = []
    with pytest.raises(DuplicateMemberError, match=pattern):
        for sample in tarindex.TarStream(shard):
            got.append(sample["__key__"])
    assert got == ["a"]
