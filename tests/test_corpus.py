"""Tar archives of other projects' test suites through build, TarDataset and TarStream, in both lanes.

Each archive comes out as :mod:`tarfile`'s samples (its regular members grouped by webdataset's own
``group_by_keys``), or as a named error every entry point raises; never fewer samples without an
error. The archives are CPython's ``testtar.tar`` and ``recursion.tar`` (read from the running
interpreter's test package) and the cases of :mod:`_corpus`, which mirror Go's ``archive/tar``
testdata, libarchive's and ratarmount's test archives.

Where tarindex reads an archive by other rules than tarfile, on purpose, the oracle says so: a GNU
sparse member (its data is not stored contiguously) is skipped with a logged warning, and a member
whose old GNU header (magic ``ustar  \\0``) has bytes where ustar keeps its prefix is named as GNU
tar names it (those bytes are its atime and ctime; tarfile takes them for a prefix).
"""

from __future__ import annotations

import io
import logging
import re
import tarfile
from pathlib import Path

import pytest
from _corpus import CASES, Error

from tarindex import TarDataset, TarStream, build_index
from tarindex.errors import CorruptArchiveError, UnsupportedCompressionError
from tarindex.tar import iter_tar

try:
    import test as _cpython_tests
except ImportError:  # an interpreter built without its test package
    _cpython_tests = None
_TESTS = Path(_cpython_tests.__file__).parent if _cpython_tests is not None else None
CPYTHON: dict[str, tuple[Error | None, int]] = {
    # every header type, GNU and PAX long names, v7 and signed checksums, a directory with a size, and
    # four GNU sparse members (old format with extension blocks, PAX 0.0, 0.1 and 1.0)
    "testtar.tar": (None, 4),
    # a global PAX header whose record says length 0: tarfile refuses it too
    "recursion.tar": (Error(CorruptArchiveError, "malformed PAX extended header record at byte 0 of its data at offset 0"), 0),
    "testtar.tar.xz": (Error(UnsupportedCompressionError, r"xz-compressed, which tarindex does not read; convert it to a plain tar \('xz -dc "), 0),
}


def _gnu_name(buf: bytes, m: tarfile.TarInfo) -> str:
    """``m``'s name as GNU tar reads it: an old GNU header's atime and ctime are no ustar prefix."""
    hdr = buf[m.offset_data - 512 : m.offset_data]
    if hdr[257:263] == b"ustar\x00" or not hdr[345]:
        return m.name
    prefix, field = (tarfile.nts(hdr[a:b], "utf-8", "surrogateescape") for a, b in ((345, 500), (0, 100)))
    return field if m.name == f"{prefix}/{field}" else m.name


def tarfile_members(path: Path) -> tuple[list[tuple[str, bytes]], int]:
    """Every regular member tarfile reads but the GNU sparse ones, ``(name, bytes)``, and how many sparse ones it read."""
    buf = path.read_bytes()
    out, sparse = [], 0
    with tarfile.open(fileobj=io.BytesIO(buf), mode="r:", encoding="utf-8") as tf:
        for m in tf:
            if m.issparse():
                sparse += 1
            elif m.isreg():
                f = tf.extractfile(m)
                assert f is not None
                out.append((_gnu_name(buf, m), f.read()))
    return out, sparse


def oracle(path: Path) -> tuple[list[tuple[str, bytes]], list[dict[str, object]], int]:
    """tarfile's members, their samples as webdataset groups them (metadata files left out as its
    ``tar_file_iterator`` leaves them), and the count of sparse members."""
    from webdataset.tariterators import group_by_keys

    members, sparse = tarfile_members(path)
    files = [
        {"fname": name, "data": data, "__url__": str(path)}
        for name, data in members
        if not ("/" not in name and name.startswith("__") and name.endswith("__")) and not re.match(r"__[^/]*__($|/)", name)
    ]
    samples = [{k: v for k, v in s.items() if k != "__url__"} for s in group_by_keys(iter(files))]
    return members, samples, sparse


def _plain(samples: object) -> list[dict[str, object]]:
    return [{k: v for k, v in s.items() if not k.startswith("__") or k == "__key__"} for s in samples]  # type: ignore[attr-defined]


def _sparse_warnings(caplog: pytest.LogCaptureFixture, where: str) -> int:
    """The warnings of skipped sparse members of the shard named ``where``."""
    return sum(1 for r in caplog.records if r.name == "tarindex.tar" and r.getMessage().startswith(f"{where}: skipping GNU sparse member"))


def _check(path: Path, expect: Error | None, sparse: int, allow_missing_end: bool, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """One archive through the member walk, build + TarDataset, TarStream over the file, a pipe and the index."""
    opts = {"allow_missing_end": True} if allow_missing_end else {}
    streams = {"file": [str(path)], "pipe": [f"pipe:cat {path}"]}
    if expect is not None:
        with pytest.raises(expect.cls, match=rf"^{re.escape(str(path))}: {expect.pattern}"):
            build_index([path], index=tmp_path / "x.tarindex", workers=1, **opts)
        assert not (tmp_path / "x.tarindex").exists()
        for urls in streams.values():
            with pytest.raises(expect.cls, match=rf"^{re.escape(urls[0])}: {expect.pattern}"):
                list(TarStream(urls, **opts))
        return
    members, samples, sparse_read = oracle(path)
    assert sparse_read == sparse  # the case is what it says: tarfile reads that many sparse members
    caplog.set_level(logging.WARNING, logger="tarindex.tar")

    def warned(result: object, where: str) -> object:  # each walk warns once per sparse member it skips
        assert _sparse_warnings(caplog, where) == sparse, where
        caplog.clear()
        return result

    assert warned([(e[0], e[4]) for e in iter_tar((path.read_bytes(),), str(path), with_data=True, **opts)], str(path)) == members
    index = warned(build_index([path], index=tmp_path / "x.tarindex", workers=1, **opts).path, str(path))
    ds = TarDataset(index)
    assert _plain(ds[i] for i in range(len(ds))) == samples
    for urls in streams.values():
        assert warned(_plain(TarStream(urls, **opts)), urls[0]) == samples
    from_index = TarStream(index, **opts)
    assert warned(_plain(from_index), from_index.urls[0]) == samples  # the shard as the index names it


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every case of :mod:`_corpus`, made once: name -> archive."""
    root = tmp_path_factory.mktemp("corpus")
    out = {}
    for name, c in CASES.items():
        work = root / "work" / name
        work.mkdir(parents=True)
        out[name] = root / f"{name}.tar"
        out[name].write_bytes(c.make(work))
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_mirrored_archive(name: str, impl: str, corpus: dict[str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    c = CASES[name]
    _check(corpus[name], c.expect, c.sparse, c.allow_missing_end, tmp_path, caplog)


@pytest.mark.parametrize("name", list(CPYTHON))
def test_cpython_test_archive(name: str, impl: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    expect, sparse = CPYTHON[name]
    if _TESTS is None or not (_TESTS / name).is_file():
        pytest.skip(f"this interpreter ships without its test package's {name}")
    path = tmp_path / name  # a copy: the interpreter's directory may be read-only, and the build writes beside nothing there
    path.write_bytes((_TESTS / name).read_bytes())
    _check(path, expect, sparse, False, tmp_path, caplog)


def test_the_corpus_has_samples_and_every_outcome(corpus: dict[str, Path]) -> None:
    """The oracle is not vacuous: most cases have samples, and the cases cover every expected outcome."""
    with_samples = [n for n, c in CASES.items() if c.expect is None and oracle(corpus[n])[1]]
    assert len(with_samples) >= 35, with_samples
    kinds = {c.expect.cls.__name__ if c.expect else "samples" for c in CASES.values()}
    assert kinds == {"samples", "CorruptArchiveError", "DuplicateMemberError", "UnsupportedCompressionError"}
    assert sum(c.sparse for c in CASES.values()) >= 20
