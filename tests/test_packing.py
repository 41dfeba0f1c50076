"""``tarindex.pack`` / ``tarindex pack``: folders, file lists and shards into indexed shards, checked against
``tarfile``'s view of the shards, GNU tar's listing, and the index ``tarindex build`` makes of the same shards."""

from __future__ import annotations

import csv
import glob
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import tarindex
from conftest import gnu_tar, make_shard_set, tarfile_members, wds_write, write_tree
from tarindex import IndexReader, ListError, PackError
from tarindex._tarwrite import _info, member_header
from tarindex.cli.main import main

ROOT = Path(__file__).resolve().parent.parent


# -- helpers ---------------------------------------------------------------------------------


def _tree(root: Path) -> dict[str, bytes]:
    """A folder of samples: nested directories, several extensions, a long and a non-ASCII name, an empty file,
    and files that belong to no sample (no extension, hidden)."""
    rng = np.random.default_rng(7)
    files: dict[str, bytes] = {}
    for c, cls in enumerate(["dog", "cat", "bird"]):
        for i in range(7):
            key = f"{cls}/{i:03d}"
            files[f"{key}.jpg"] = rng.integers(0, 255, int(rng.integers(0, 5000)), dtype=np.uint8).tobytes()
            files[f"{key}.json"] = json.dumps({"c": c, "i": i}).encode()
    files["cat/" + "x" * 120 + ".txt"] = b"a long name"
    files["bird/ünïcødé.txt"] = b"unicode"
    files["bird/empty.bin"] = b""
    files["bird/sub/deeper/007.seg.png"] = b"\x89PNG" * 300
    write_tree(root, list(files.items()))
    (root / "README").write_bytes(b"no extension: no sample")
    (root / ".hidden.txt").write_bytes(b"hidden")
    (root / "cat" / ".DS_Store").write_bytes(b"hidden")
    return files


def _shard_files(paths: list[str]) -> dict[str, bytes]:
    """Every member of the shards, by tarfile (the oracle)."""
    out: dict[str, bytes] = {}
    for p in paths:
        for name, data in tarfile_members(Path(p)):
            assert name not in out, name
            out[name] = data
    return out


def _same_index(a: Path, b: Path, *, same_files: bool = True) -> None:
    """Two indexes agree: shard records (but the path, relative to each index) and every column; with
    ``same_files``, of the same shard files (else of copies: their paths and mtimes differ)."""
    x, y = IndexReader(a), IndexReader(b)
    fields = ("size", "fingerprint", "n_samples", "n_members", "compression", "random_access", "kind") + (("mtime_ns",) if same_files else ())
    assert [[getattr(s, f) for f in fields] for s in x.shards] == [[getattr(s, f) for f in fields] for s in y.shards]
    if same_files:
        assert [os.path.normpath(x.shard_path(i)) for i in range(len(x.shards))] == [os.path.normpath(y.shard_path(i)) for i in range(len(y.shards))]
    cx, cy = x.decode(), y.decode()
    for name in ("shard", "offset", "size", "nmembers", "member_offset", "member_size"):
        assert np.array_equal(getattr(cx, name), getattr(cy, name)), name
    assert [x.exts[e] for e in cx.member_ext] == [y.exts[e] for e in cy.member_ext]
    assert cx.keys == cy.keys
    for i in range(len(x.shards)):
        fx, fy = x.frame_table(i), y.frame_table(i)
        assert (fx is None and fy is None) or np.array_equal(fx, fy), i


def _digests(paths: list[str]) -> list[str]:
    return [hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in paths]


def _samples(index: Path) -> list[tuple[str, dict[str, bytes]]]:
    ds = tarindex.TarDataset(index)
    out = [(s["__key__"], {k: v for k, v in s.items() if not k.startswith("__")}) for s in (ds.read(i) for i in range(len(ds)))]
    ds.close()
    return out


# -- headers -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a.jpg", "x" * 96 + ".jpg", "x" * 97 + ".jpg", "dir/ü.txt", "k.seg.png", "a b.txt"])
@pytest.mark.parametrize("size", [0, 1, 511, 512, 70_000, 8**11 - 1, 8**11])
def test_headers_are_tarfiles_pax_headers_with_fixed_metadata(name: str, size: int) -> None:
    assert member_header(name, size) == _info(name, size).tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


# -- folders ---------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".tar", ".tar.zst"])
def test_a_folder_packs_into_shards_whose_index_is_the_one_build_makes(tmp_path: Path, impl: str, suffix: str) -> None:
    files = _tree(tmp_path / "src")
    report = tarindex.pack(tmp_path / "src", str(tmp_path / "out" / f"train-%04d{suffix}"), maxcount=4, workers=2)
    shards = sorted(glob.glob(str(tmp_path / "out" / f"train-*{suffix}")))
    assert report.shards == shards and report.written == shards and not report.kept
    assert report.index == tmp_path / "out" / "train.tarindex"
    assert report.samples == 25 and len(shards) == 7
    if suffix == ".tar":
        got = _shard_files(shards)
    else:
        plain = []
        for s in shards:
            out = tmp_path / "plain" / Path(s).name.removesuffix(".zst")
            out.parent.mkdir(exist_ok=True)
            subprocess.run(["zstd", "-dq", s, "-o", str(out)], check=True)
            plain.append(str(out))
        got = _shard_files(plain)
    assert got == {name: data for name, data in files.items()}  # every file, byte for byte; nothing else
    names = [n for s in shards for n in subprocess.run(["tar", "-tf", s], capture_output=True, text=True, check=True).stdout.split("\n") if n]
    keys = [n.split(".", 1)[0] for n in names]
    assert keys == sorted(keys)  # samples in key order, members together
    built = tarindex.build_index(shards, index=tmp_path / "built.tarindex", workers=1).path
    _same_index(report.index, built)


def test_the_same_folder_makes_the_same_bytes_whatever_the_workers(tmp_path: Path) -> None:
    _tree(tmp_path / "src")
    one = tarindex.pack(tmp_path / "src", str(tmp_path / "a" / "s-%03d.tar.zst"), maxcount=5, workers=1)
    two = tarindex.pack(tmp_path / "src", str(tmp_path / "b" / "s-%03d.tar.zst"), maxcount=5, workers=2)
    assert _digests(one.shards) == _digests(two.shards)
    mixed = tarindex.pack(tmp_path / "src", str(tmp_path / "c" / "s-%03d.tar"), maxcount=5, shuffle=True, seed=3)
    again = tarindex.pack(tmp_path / "src", str(tmp_path / "d" / "s-%03d.tar"), maxcount=5, shuffle=True, seed=3, workers=1)
    other = tarindex.pack(tmp_path / "src", str(tmp_path / "e" / "s-%03d.tar"), maxcount=5, shuffle=True, seed=4)
    assert _digests(mixed.shards) == _digests(again.shards)
    order = [k for k, _ in _samples(mixed.index)]
    assert sorted(order) == [k for k, _ in _samples(one.index)] and order != sorted(order)
    assert order != [k for k, _ in _samples(other.index)]


def test_shards_are_cut_by_count_and_size(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_tree(src, [(f"{i:03d}.bin", bytes(1000 * (i % 4))) for i in range(20)] + [("big.bin", bytes(50_000))])
    report = tarindex.pack(src, str(tmp_path / "o" / "x-%02d.tar"), maxcount=6, maxsize=5000, workers=1)
    reader = IndexReader(report.index)
    starts = reader.shard_starts()
    counts = np.diff(starts)
    assert counts.max() <= 6 and counts.sum() == 21
    for i in range(len(reader.shards)):
        table = reader.shard_table(i)
        total = int(table.sample_size.sum())
        assert total <= 5000 or table.n_samples == 1  # a larger sample makes a shard of its own
        assert os.path.getsize(reader.shard_path(i)) == total + 1024  # the tar is its samples and the end marker
    assert any(reader.shard_table(i).keys == ["big"] for i in range(len(reader.shards)))


def test_labels_number_the_top_directories_in_sorted_order(tmp_path: Path) -> None:
    _tree(tmp_path / "src")
    report = tarindex.pack(tmp_path / "src", str(tmp_path / "o" / "l-%02d.tar"), label=True, workers=1)
    assert report.classes == ["bird", "cat", "dog"]
    for key, sample in _samples(report.index):
        assert sample["cls"] == str(report.classes.index(key.split("/")[0])).encode()
    with pytest.raises(PackError, match=r"src/top: is not in a class directory"):
        (tmp_path / "src" / "top.jpg").write_bytes(b"x")
        tarindex.pack(tmp_path / "src", str(tmp_path / "o2" / "l-%02d.tar"), label=True)
    assert not (tmp_path / "o2").exists() or not list((tmp_path / "o2").iterdir())


def test_files_that_would_be_one_member_are_refused(tmp_path: Path) -> None:
    write_tree(tmp_path / "src", [("a.JPG", b"1"), ("a.jpg", b"2")])
    with pytest.raises(PackError, match=r"a\.jpg: would be the same member 'a\.jpg' as .*a\.JPG"):
        tarindex.pack(tmp_path / "src", str(tmp_path / "o" / "x-%d.tar"))


def test_exts_and_keys_select_members_and_samples(tmp_path: Path) -> None:
    files = _tree(tmp_path / "src")
    report = tarindex.pack(tmp_path / "src", str(tmp_path / "o" / "x-%d.tar"), exts=["JSON"], keys=lambda k: k.startswith("cat/"), workers=1)
    got = _samples(report.index)
    assert [k for k, _ in got] == [f"cat/{i:03d}" for i in range(7)]
    assert all(list(s) == ["json"] and s["json"] == files[f"{k}.json"] for k, s in got)


def test_a_file_that_changes_while_it_is_packed_is_named(tmp_path: Path) -> None:
    _tree(tmp_path / "src")
    victim = tmp_path / "src" / "dog" / "003.json"

    def shrink(key: str) -> bool:  # runs after the listing, before the shards are written
        victim.write_bytes(b"{}")
        return True

    with pytest.raises(PackError, match=rf"{victim}: changed while it was packed \(\d+ bytes when listed, 2 now\)"):
        tarindex.pack(tmp_path / "src", str(tmp_path / "o" / "x-%d.tar"), keys=shrink, workers=1)
    assert not [p for p in os.listdir(tmp_path / "o") if "x-0" in p]  # the shard in progress is gone, temporary file too


def test_outputs_never_name_an_input(tmp_path: Path) -> None:
    _tree(tmp_path / "src")
    with pytest.raises(PackError, match=r"is inside the input directory"):
        tarindex.pack(tmp_path / "src", str(tmp_path / "src" / "shards" / "x-%d.tar"))
    paths = make_shard_set(tmp_path / "d", n_shards=2, per=3)
    before = _digests([str(p) for p in paths])
    with pytest.raises(PackError, match=r"train-000000\.tar: names an input of this pack"):
        tarindex.pack(str(tmp_path / "d" / "train-*.tar"), str(tmp_path / "d" / "train-%06d.tar"))
    os.symlink(tmp_path / "d", tmp_path / "alias")  # the same directory by another name
    with pytest.raises(PackError, match=r"names an input of this pack"):
        tarindex.pack(str(tmp_path / "d" / "train-*.tar"), str(tmp_path / "alias" / "train-%06d.tar"))
    assert _digests([str(p) for p in paths]) == before


def test_bad_options_are_value_errors(tmp_path: Path) -> None:
    _tree(tmp_path / "src")
    for pattern, what in [("o/x.tar", "one %d-style number"), ("o/x-%d.zip", r"end in \.tar"), ("o/x-%s-%d.tar", "one %d-style number")]:
        with pytest.raises(ValueError, match=what):
            tarindex.pack(tmp_path / "src", str(tmp_path / pattern))
    make_shard_set(tmp_path / "d", n_shards=1, per=2)
    with pytest.raises(ValueError, match="cannot be packed together"):
        tarindex.pack([str(tmp_path / "src"), str(tmp_path / "d" / "train-000000.tar")], str(tmp_path / "o" / "x-%d.tar"))
    with pytest.raises(ValueError, match="label=True"):
        tarindex.pack(str(tmp_path / "d" / "train-000000.tar"), str(tmp_path / "o" / "x-%d.tar"), label=True)


# -- lists -----------------------------------------------------------------------------------


def test_lists_name_files_and_inline_text(tmp_path: Path) -> None:
    write_tree(tmp_path / "files", [("a.jpg", b"A" * 700), ("b.jpg", b"B" * 10), ("c.png", b"C")])
    (tmp_path / "paths.txt").write_text("# images\nfiles/a.jpg\n\nfiles/b.jpg\nfiles/c.png\n")
    with open(tmp_path / "rows.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["__key__", "jpg", "txt:text", "cls:text"])
        w.writerow(["first", "files/a.jpg", "a caption, with a comma", "1"])
        w.writerow(["second", "files/b.jpg", "", "2"])
    (tmp_path / "rows.jsonl").write_text(
        json.dumps({"jpg": "files/c.png", "txt:text": "ünï", "json": {"w": 3}, "cls": 7, "skip": None}) + "\n\n"
        + json.dumps({"__key__": "k/x", "txt": str(tmp_path / "files" / "a.jpg")}) + "\n"
    )
    text = tarindex.pack(tmp_path / "paths.txt", str(tmp_path / "o1" / "x-%d.tar"))
    assert _samples(text.index) == [("files/a", {"jpg": b"A" * 700}), ("files/b", {"jpg": b"B" * 10}), ("files/c", {"png": b"C"})]
    rows = tarindex.pack([tmp_path / "rows.csv", tmp_path / "rows.jsonl"], str(tmp_path / "o2" / "x-%d.tar.zst"), workers=1)
    assert _samples(rows.index) == [
        ("first", {"jpg": b"A" * 700, "txt": b"a caption, with a comma", "cls": b"1"}),
        ("second", {"jpg": b"B" * 10, "cls": b"2"}),
        ("000000002", {"jpg": b"C", "txt": "ünï".encode(), "json": b'{"w": 3}', "cls": b"7"}),  # rows are numbered on across lists
        ("k/x", {"txt": b"A" * 700}),
    ]
    _same_index(rows.index, tarindex.build_index(rows.shards, index=tmp_path / "b.tarindex").path)


@pytest.mark.parametrize(
    ("name", "text", "error", "message"),
    [
        ("l.txt", "ok.jpg\n../up.jpg\n", ListError, r"l\.txt: line 2: '\.\./up\.jpg' is outside the list's directory"),
        ("l.txt", "ok.jpg\nnoext\n", ListError, r"l\.txt: line 2: 'noext' has no extension"),
        ("l.txt", "ok.jpg\nmissing.jpg\n", PackError, r"missing\.jpg: cannot read \(No such file or directory; listed in .*l\.txt line 2\)"),
        ("l.csv", "__key__,jpg\na,ok.jpg,extra\n", ListError, r"l\.csv: line 2: 3 cells, the header names 2 columns"),
        ("l.csv", "__key__,txt:text\na.b,x\n", ListError, r"l\.csv: line 2: key 'a\.b' and extension 'txt' would not read back"),
        ("l.jsonl", '{"jpg": "ok.jpg"}\n[1]\n', ListError, r"l\.jsonl: line 2: expected a JSON object, got list"),
        ("l.jsonl", '{"jpg": "ok.jpg"}\n{"jpg": \n', ListError, r"l\.jsonl: line 2: not JSON"),
        ("l.jsonl", '{"__key__": "a"}\n', ListError, r"l\.jsonl: line 1: sample 'a' has no member"),
    ],
)
def test_a_bad_list_names_the_list_and_the_line(tmp_path: Path, name: str, text: str, error: type, message: str) -> None:
    (tmp_path / "ok.jpg").write_bytes(b"ok")
    (tmp_path / name).write_text(text)
    with pytest.raises(error, match=message):
        tarindex.pack(tmp_path / name, str(tmp_path / "o" / "x-%d.tar"))


# -- shards ----------------------------------------------------------------------------------


def _input_sets(root: Path) -> list[str]:
    """Shards written by tarfile (GNU format), by GNU tar (pax format) and by webdataset's TarWriter."""
    paths = [str(p) for p in make_shard_set(root / "py", n_shards=3, per=5)]
    specs = [(f"g{i:03d}.{ext}", os.urandom(100 + 37 * i)) for i in range(6) for ext in ("jpg", "json")]
    write_tree(root / "g", specs)
    paths.append(str(gnu_tar(root / "g", root / "gnu.tar", "pax", [n for n, _ in specs])))
    paths.append(str(wds_write(root / "wds.tar", [{"__key__": f"w{i:03d}", "txt": f"t{i}", "bin": os.urandom(i * 300)} for i in range(7)])))
    return paths


def _expected(paths: list[str]) -> list[tuple[str, dict[str, bytes]]]:
    """The samples of the input shards, by tarfile, in order."""
    out: list[tuple[str, dict[str, bytes]]] = []
    for p in paths:
        for name, data in tarfile_members(Path(p)):
            key, ext = name.split(".", 1)
            if not out or out[-1][0] != key:
                out.append((key, {}))
            out[-1][1][ext] = data
    return out


@pytest.mark.parametrize("suffix", [".tar", ".tar.zst"])
def test_shards_are_resharded_with_every_sample_as_tarfile_reads_it(tmp_path: Path, impl: str, suffix: str) -> None:
    paths = _input_sets(tmp_path / "in")
    expected = _expected(paths)
    report = tarindex.pack(paths, str(tmp_path / "out" / f"r-%03d{suffix}"), maxcount=8, workers=2)
    assert [len(tarindex.IndexReader(report.index).shard_table(i).keys) for i in range(len(report.shards))] == [8, 8, 8, 4]
    assert _samples(report.index) == expected
    _same_index(report.index, tarindex.build_index(report.shards, index=tmp_path / "b.tarindex", workers=1).path)
    back = tarindex.pack(report.shards, str(tmp_path / "back" / "p-%03d.tar"), maxcount=1000, workers=1)  # zstd -> plain too
    assert _samples(back.index) == expected and len(back.shards) == 1
    direct = tarindex.pack(paths, str(tmp_path / "direct" / "p-%03d.tar"), maxcount=1000, workers=1)
    assert _digests(back.shards) == _digests(direct.shards)  # resharding twice makes the bytes of resharding once


def test_gzip_and_url_shards_are_read_as_they_are_indexed(tmp_path: Path, impl: str, http_server) -> None:
    paths = [str(p) for p in make_shard_set(tmp_path / "in", n_shards=3, per=4)]
    expected = _expected(paths)
    gz = []
    for p in paths:
        subprocess.run(["gzip", "-k", p], check=True)
        gz.append(p + ".gz")
    plain = tarindex.pack(gz, str(tmp_path / "a" / "x-%d.tar"), workers=1)
    assert _samples(plain.index) == expected
    # output shards that start inside an input shard: each gzip shard decompressed from its start, the samples found
    cut = tarindex.pack(gz, str(tmp_path / "c" / "x-%d.tar"), maxcount=3, exts={"txt", "bin"}, keys=lambda k: k != "s01i002", workers=2)
    same = tarindex.pack(paths, str(tmp_path / "d" / "x-%d.tar"), maxcount=3, exts={"txt", "bin"}, keys=lambda k: k != "s01i002", workers=1)
    assert _digests(cut.shards) == _digests(same.shards) and len(cut.shards) == 4
    index = tarindex.build_index(gz, index=tmp_path / "gz.tarindex").path
    with open(gz[2], "ab") as f:
        f.write(b"\0" * 512)
    with pytest.raises(tarindex.StaleIndexError, match=r"train-000002\.tar\.gz: shard changed since it was indexed"):
        tarindex.pack(index, str(tmp_path / "e" / "x-%d.tar"), workers=1)
    served = http_server.root / f"pack-{os.getpid()}-{impl}"
    served.mkdir()
    for p in paths:
        (served / Path(p).name).write_bytes(Path(p).read_bytes())
    urls = [http_server.url(served / Path(p).name) for p in paths]
    remote = tarindex.pack(urls, str(tmp_path / "b" / "x-%d.tar"), workers=2)
    assert _digests(remote.shards) == _digests(plain.shards)
    assert not [p for p in os.listdir(tmp_path / "b") if p.startswith(".")]  # the index of the inputs is gone


def test_object_store_shards_are_packed_in_threads(tmp_path: Path, impl: str, s3_server, monkeypatch: pytest.MonkeyPatch) -> None:
    import boto3

    for name, value in [("AWS_ENDPOINT_URL", s3_server.endpoint), ("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"), ("AWS_REGION", "us-east-1")]:
        monkeypatch.setenv(name, value)
    paths = [str(p) for p in make_shard_set(tmp_path / "in", n_shards=3, per=4)]
    client = boto3.client("s3", endpoint_url=s3_server.endpoint, aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1")
    prefix = f"pack-{os.getpid()}-{impl}"
    for p in paths:
        client.upload_file(p, s3_server.bucket, f"{prefix}/{Path(p).name}")
    local = tarindex.pack(paths, str(tmp_path / "a" / "x-%d.tar"), maxcount=5, workers=1)
    remote = tarindex.pack(
        f"s3://{s3_server.bucket}/{prefix}/train-*.tar", str(tmp_path / "b" / "x-%d.tar"), maxcount=5, workers=2,
        options=tarindex.SourceOptions(retries=2), shuffle=False,
    )  # fmt: skip
    assert _digests(remote.shards) == _digests(local.shards) and len(remote.shards) == 3


def test_an_index_given_as_the_source_and_filters(tmp_path: Path, impl: str) -> None:
    paths = [str(p) for p in make_shard_set(tmp_path / "in", n_shards=3, per=4)]
    index = tarindex.build_index(paths).path
    report = tarindex.pack(index, str(tmp_path / "o" / "x-%d.tar"), exts={"txt", "cls"}, keys={"s00i001", "s02i003", "nope"}, maxcount=1)
    assert _samples(report.index) == [(k, {e: v for e, v in s.items() if e in ("txt", "cls")}) for k, s in _expected(paths) if k in ("s00i001", "s02i003")]
    assert len(report.shards) == 2


def test_an_input_that_changed_since_its_index_is_stale(tmp_path: Path) -> None:
    paths = [str(p) for p in make_shard_set(tmp_path / "in", n_shards=2, per=3)]
    index = tarindex.build_index(paths).path
    with open(paths[1], "ab") as f:
        f.write(bytes(1024))
    with pytest.raises(tarindex.StaleIndexError, match=r"train-000001\.tar: shard changed since it was indexed"):
        tarindex.pack(index, str(tmp_path / "o" / "x-%d.tar"), workers=1)
    report = tarindex.pack(paths, str(tmp_path / "p" / "x-%d.tar"), workers=1)  # the shards themselves: indexed anew
    assert _samples(report.index) == _expected(paths)


def test_a_damaged_input_shard_is_named(tmp_path: Path) -> None:
    paths = [str(p) for p in make_shard_set(tmp_path / "in", n_shards=2, per=3)]
    data = bytearray(Path(paths[1]).read_bytes())
    data[1034:1044] = b"garbage!!!"  # in the second member's header
    Path(paths[1]).write_bytes(bytes(data))
    with pytest.raises(tarindex.CorruptArchiveError, match=r"train-000001\.tar: .* at offset 1024"):
        tarindex.pack(paths, str(tmp_path / "o" / "x-%d.tar"), workers=1)


@pytest.mark.parametrize("suffix", [".tar", ".tar.zst"])
def test_the_external_shuffle_is_a_seeded_permutation_whatever_its_memory(tmp_path: Path, impl: str, suffix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = _input_sets(tmp_path / "in")
    expected = _expected(paths)
    small = tarindex.pack(paths, str(tmp_path / "a" / f"s-%02d{suffix}"), shuffle=True, seed=5, memory=2000, maxcount=6, workers=2)
    large = tarindex.pack(paths, str(tmp_path / "b" / f"s-%02d{suffix}"), shuffle=True, seed=5, memory=1 << 30, maxcount=6, workers=1)
    monkeypatch.setattr(tarindex.packing, "_SCATTER_JOBS", 1)  # the 5 input shards read by 2 jobs (2 x workers)
    grouped = tarindex.pack(paths, str(tmp_path / "g" / f"s-%02d{suffix}"), shuffle=True, seed=5, memory=3000, maxcount=6, workers=1)
    assert _digests(grouped.shards) == _digests(large.shards)
    other = tarindex.pack(paths, str(tmp_path / "c" / f"s-%02d{suffix}"), shuffle=True, seed=6, maxcount=6)
    got = _samples(small.index)
    assert sorted(got) == sorted(expected) and got != expected
    assert _digests(small.shards) == _digests(large.shards)
    assert [k for k, _ in _samples(other.index)] != [k for k, _ in got]
    _same_index(small.index, tarindex.build_index(small.shards, index=tmp_path / "x.tarindex").path)
    assert not [p for p in os.listdir(tmp_path / "a") if "shuffle" in p]  # the bucket files are gone


_RSS_SCRIPT = """
import sys, tarindex, tarindex.packing, tarindex.dataset, tarindex.index.writer, tarindex.scan

def high_water():  # this process's peak resident memory (VmHWM starts anew at exec; ru_maxrss does not)
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))

base = high_water()
tarindex.pack(sys.argv[1], sys.argv[2], shuffle=True, memory=int(sys.argv[3]), workers=1, maxcount=100000)
print(base, high_water())
"""


def test_the_external_shuffle_holds_its_memory_bound(tmp_path: Path) -> None:
    """60 MB of samples shuffled with 8 MB of memory: the process grows by less than twice the bound (it would
    grow by the whole set if it held it; with 1 GB of memory it does, which shows the measure sees it)."""
    rng = np.random.default_rng(0)
    for s in range(6):
        with tarfile.open(tmp_path / f"in-{s}.tar", "w") as tf:
            for i in range(100):
                data = rng.integers(0, 255, 100_000, dtype=np.uint8).tobytes()
                info = tarfile.TarInfo(f"{s}{i:04d}.bin")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def growth(memory: int, out: str) -> int:
        done = subprocess.run(
            [sys.executable, "-c", _RSS_SCRIPT, str(tmp_path / "in-*.tar"), str(tmp_path / out / "x-%d.tar"), str(memory)],
            env=env, capture_output=True, text=True, check=True, timeout=300,
        )  # fmt: skip
        base, peak = (int(v) for v in done.stdout.split())
        return peak - base

    bounded = growth(8 << 20, "o")
    assert bounded < 2 * (8 << 20), bounded
    assert len(IndexReader(tmp_path / "o" / "x.tarindex")) == 600
    assert growth(1 << 30, "p") > 50 << 20  # one bucket: the whole set in memory at once


# -- resume ----------------------------------------------------------------------------------

_KILLED = """
import sys, tarindex
tarindex.pack(sys.argv[1], sys.argv[2], maxcount=2, level=19, workers=1)
"""


def test_a_killed_pack_resumes_from_its_last_complete_shard(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    write_tree(tmp_path / "src", [(f"{i:03d}.bin", rng.integers(0, 16, 600_000, dtype=np.uint8).tobytes()) for i in range(16)])
    pattern = str(tmp_path / "out" / "x-%02d.tar.zst")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", _KILLED, str(tmp_path / "src"), pattern], env=env)
    deadline = time.monotonic() + 120
    partial: list[str] = []
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            partial = glob.glob(str(tmp_path / "out" / ".x-0[2-6].tar.zst.tmp-*"))
            if partial:
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.005)
    finally:
        proc.wait()
    assert partial and proc.returncode == -signal.SIGKILL, "the pack ended before it could be killed in a shard"
    assert [p for p in partial if os.path.exists(p)], "a partial shard was left by the killed pack"
    complete = sorted(glob.glob(str(tmp_path / "out" / "x-*.tar.zst")))
    assert complete and not (tmp_path / "out" / "x.tarindex").exists()
    mtimes = {p: os.stat(p).st_mtime_ns for p in complete}
    report = tarindex.pack(tmp_path / "src", pattern, maxcount=2, level=19, workers=1)
    assert report.kept == complete and len(report.shards) == 8
    assert {p: os.stat(p).st_mtime_ns for p in complete} == mtimes  # kept, not written again
    assert not glob.glob(str(tmp_path / "out" / ".x-*"))  # the partial shard is gone
    fresh = tarindex.pack(tmp_path / "src", str(tmp_path / "fresh" / "x-%02d.tar.zst"), maxcount=2, level=19, workers=2)
    assert _digests(report.shards) == _digests(fresh.shards)
    _same_index(report.index, tarindex.build_index(report.shards, index=tmp_path / "b.tarindex").path)


def test_a_shard_that_is_not_what_the_pack_writes_is_written_again(tmp_path: Path) -> None:
    _tree(tmp_path / "src")
    pattern = str(tmp_path / "o" / "x-%d.tar")
    first = tarindex.pack(tmp_path / "src", pattern, maxcount=10, workers=1)
    Path(first.shards[1]).write_bytes(Path(first.shards[1]).read_bytes()[:-2048])  # truncated
    foreign = make_shard_set(tmp_path / "f", n_shards=1, per=3)[0]
    Path(first.shards[2]).write_bytes(foreign.read_bytes())  # another pack's shard, newer than the inputs
    again = tarindex.pack(tmp_path / "src", pattern, maxcount=10, workers=2)
    assert again.kept == [first.shards[0]] and again.written == first.shards[1:]
    assert _samples(again.index) == _samples(tarindex.pack(tmp_path / "src", str(tmp_path / "p" / "x-%d.tar"), maxcount=10).index)
    (tmp_path / "src" / "cat" / "003.jpg").write_bytes(b"new")  # an input newer than the shards
    third = tarindex.pack(tmp_path / "src", pattern, maxcount=10, workers=1)
    assert third.written == [first.shards[1]]  # the shard that holds it
    none = tarindex.pack(tmp_path / "src", pattern, maxcount=10, resume=False)
    assert none.written == none.shards


def _bytes_of(paths: list[Path]) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in paths}


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_pack_never_writes_over_files_it_did_not_write(tmp_path: Path, shuffle: bool) -> None:
    _tree(tmp_path / "src")
    theirs = make_shard_set(tmp_path / "d", n_shards=3, per=4)  # train-00000{0..2}.tar, indexed by build
    index = tarindex.build_index([str(p) for p in theirs]).path
    before = _bytes_of([*theirs, Path(index)])
    pattern = str(tmp_path / "d" / "train-%06d.tar")
    sources: list[str] | Path = [str(p) for p in make_shard_set(tmp_path / "in", n_shards=2, per=5)] if shuffle else tmp_path / "src"
    with pytest.raises(PackError, match=r"train\.tarindex: exists and is not the index of an earlier pack of"):
        tarindex.pack(sources, pattern, maxcount=10, shuffle=shuffle)
    assert _bytes_of(list(before)) == before
    notes = tmp_path / "n" / "notes-000000.tar"  # no index there: a file at an output name
    notes.parent.mkdir()
    notes.write_bytes(b"my notes")
    with pytest.raises(PackError, match=r"notes-000000\.tar: exists and is not a shard an earlier pack of this output pattern wrote"):
        tarindex.pack(sources, str(tmp_path / "n" / "notes-%06d.tar"), maxcount=10, shuffle=shuffle)
    assert notes.read_bytes() == b"my notes"
    with pytest.raises(PackError, match="is not the index of an earlier pack"):  # an index another pattern's pack wrote
        tarindex.pack(sources, str(tmp_path / "d" / "other-%06d.tar"), index=index, maxcount=10, shuffle=shuffle)
    assert _bytes_of(list(before)) == before
    forced = tarindex.pack(sources, pattern, maxcount=10, shuffle=shuffle, force=True)
    assert forced.written == forced.shards and _samples(forced.index) == _samples(
        tarindex.pack(sources, str(tmp_path / "p" / "x-%d.tar"), maxcount=10, shuffle=shuffle).index
    )
    again = tarindex.pack(sources, pattern, maxcount=10, shuffle=shuffle, resume=False)  # its own index now says so
    assert again.written == again.shards


def test_the_command_refuses_a_file_it_did_not_write_in_one_line_and_force_replaces_it(tmp_path: Path) -> None:
    _tree(tmp_path / "src")
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "x-0.tar").write_bytes(b"not mine")
    argv = [sys.executable, "-m", "tarindex.cli.main", "pack", str(tmp_path / "src"), "-o", str(tmp_path / "o" / "x-%d.tar"), "-q"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"tarindex: error: {tmp_path / 'o' / 'x-0.tar'}: exists and is not a shard")
    assert (tmp_path / "o" / "x-0.tar").read_bytes() == b"not mine"
    forced = subprocess.run([*argv, "--force"], capture_output=True, text=True, env=env)
    assert forced.returncode == 0, forced.stderr
    assert tarfile_members(tmp_path / "o" / "x-0.tar")


def test_a_shuffle_resumes_too(tmp_path: Path) -> None:
    paths = [str(p) for p in make_shard_set(tmp_path / "in", n_shards=3, per=6)]
    pattern = str(tmp_path / "o" / "s-%d.tar")
    first = tarindex.pack(paths, pattern, shuffle=True, maxcount=5, memory=3000)
    os.unlink(first.shards[2])
    again = tarindex.pack(paths, pattern, shuffle=True, maxcount=5, memory=3000)
    assert again.written == [first.shards[2]] and again.kept == [s for s in first.shards if s != first.shards[2]]
    Path(first.shards[0]).write_bytes(make_shard_set(tmp_path / "f", n_shards=1, per=2)[0].read_bytes())
    third = tarindex.pack(paths, pattern, shuffle=True, maxcount=5, memory=3000)
    assert third.written == third.shards  # a foreign shard: the gather starts over, writing every shard
    assert _digests(third.shards) == _digests(tarindex.pack(paths, str(tmp_path / "p" / "s-%d.tar"), shuffle=True, maxcount=5).shards)


# -- executors -------------------------------------------------------------------------------


def test_a_dask_cluster_writes_the_same_shards(tmp_path: Path) -> None:
    pytest.importorskip("distributed")  # the test extra installs dask[distributed]
    _tree(tmp_path / "src")
    local = tarindex.pack(tmp_path / "src", str(tmp_path / "a" / "x-%d.tar"), maxcount=5, workers=1)
    code = textwrap.dedent(
        """
        import sys, distributed, tarindex
        if __name__ == '__main__':
            cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None)
            with cluster, distributed.Client(cluster) as client:
                report = tarindex.pack(sys.argv[1], sys.argv[2], maxcount=5, executor=client)
            assert len(report.written) == 5, report
        """
    )
    script = tmp_path / "dask_pack.py"
    script.write_text(code)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "src"), str(tmp_path / "b" / "x-%d.tar")], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _digests(local.shards) == _digests(sorted(glob.glob(str(tmp_path / "b" / "x-*.tar"))))
    _same_index(local.index, tmp_path / "b" / "x.tarindex", same_files=False)


# -- command line ------------------------------------------------------------------------------


def test_the_command_packs_and_says_what_it_did(tmp_path: Path) -> None:
    _tree(tmp_path / "src")
    result = CliRunner().invoke(main, ["pack", str(tmp_path / "src"), "-o", str(tmp_path / "o" / "x-%03d.tar"), "--maxcount", "10", "--label", "--select", "jpg,.cls"])
    assert result.exit_code == 0, result.output
    assert "o/x.tarindex: 3 shards (3 written), 21 samples" in result.output
    assert "classes: 0=bird, 1=cat, 2=dog" in result.output
    assert {tuple(sorted(s)) for _, s in _samples(tmp_path / "o" / "x.tarindex")} == {("cls", "jpg")}
    again = CliRunner().invoke(main, ["pack", str(tmp_path / "src"), "-o", str(tmp_path / "o" / "x-%03d.tar"), "--maxcount", "10", "--label", "--select", "jpg,cls"])
    assert "3 shards (0 written, 3 kept from an earlier run)" in again.output


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["pack", "{src}", "-o", "{out}/x.tar"], 2, "one %d-style number"),
        (["pack", "{src}", "-o", "{out}/x-%d.tar", "--maxsize", "lots"], 2, "is not a size"),
        (["pack", "{src}/nosuch.csv", "-o", "{out}/x-%d.tar"], 1, "nosuch.csv: cannot read (No such file or directory)"),
        (["pack", "{src}", "-o", "{src}/x-%d.tar"], 1, "is inside the input directory"),
    ],
)
def test_the_command_fails_in_one_line(tmp_path: Path, args: list[str], code: int, message: str) -> None:
    _tree(tmp_path / "src")
    argv = [a.format(src=tmp_path / "src", out=tmp_path / "o") for a in args]
    proc = subprocess.run([sys.executable, "-m", "tarindex.cli.main", *argv], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == code, proc.stderr
    assert message in proc.stderr
    if code == 1:
        assert proc.stderr.startswith("tarindex: error: ") and proc.stderr.count("\n") == 1
