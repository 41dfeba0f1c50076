"""TarStream over local files, pipes, stdin and a real HTTP server: samples, splitting, shuffling, errors, builds."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch.utils.data
from _servers import HTTPServer

import tarindex
from conftest import make_shard_set, tarfile_members, wds_write
from tarindex import TarDataset, TarStream, build_index
from tarindex.errors import CorruptArchiveError, DecodeError, SourceError, StreamWarning
from tarindex.index.reader import IndexReader
from tarindex.options import SourceOptions


def _oracle(paths: list[Path], urls: list[str] | None = None) -> list[dict]:
    """Samples by tarfile, webdataset's grouping of consecutive keys."""
    out: list[dict] = []
    for p, url in zip(paths, urls or [str(p) for p in paths]):
        for name, data in tarfile_members(p):
            key, ext = name.split(".", 1)
            if not out or out[-1]["__key__"] != key or out[-1]["__url__"] != url:
                out.append({"__key__": key, "__url__": url})
            out[-1][ext] = data
    return out


def _keys(samples: list[dict]) -> list[str]:
    return [s["__key__"] for s in samples]


def _publish(server: HTTPServer, paths: list[Path], sub: str) -> list[str]:
    dest = server.root / sub
    dest.mkdir(parents=True, exist_ok=True)
    for p in paths:
        shutil.copyfile(p, dest / p.name)
    return [server.url(f"{sub}/{p.name}") for p in paths]


@pytest.fixture
def shards(tmp_path: Path) -> list[Path]:
    return make_shard_set(tmp_path / "data", n_shards=5, per=7)


def test_local_equals_tarfile_and_tardataset(impl: str, shards: list[Path]) -> None:
    expected = _oracle(shards)
    assert list(TarStream([str(p) for p in shards])) == expected
    assert list(TarStream(str(shards[0].parent / "train-{000000..000004}.tar"))) == expected  # brace pattern
    report = build_index([str(p) for p in shards])
    ds = TarDataset(report.path)
    from_index = list(TarStream(report.path))  # an index: its shards, with TarDataset's __index__
    assert from_index == list(ds)
    assert [s["__index__"] for s in from_index] == list(range(len(ds)))


def test_same_samples_as_webdataset(shards: list[Path], http_server: HTTPServer, tmp_path: Path) -> None:
    import warnings

    import webdataset as wds

    urls = [str(p) for p in shards] + _publish(http_server, shards[:1], tmp_path.name + "-wds")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # webdataset's own deprecation notices
        expected = [{k: v for k, v in s.items() if k != "__local_path__"} for s in wds.WebDataset(urls, shardshuffle=False)]
    assert list(TarStream(urls)) == expected


def test_tar_flavours_equal_tarfile(impl: str, gnu_tar_shard: Path, py_tar_shard: Path, wds_shard: Path) -> None:
    for p in (gnu_tar_shard, py_tar_shard, wds_shard):
        assert list(TarStream([str(p)])) == _oracle([p])


def test_http_nginx_equals_local(impl: str, http_server: HTTPServer, shards: list[Path], tmp_path: Path) -> None:
    urls = _publish(http_server, shards, tmp_path.name)
    stream = TarStream(urls, block_size=1 << 16)
    assert list(stream) == _oracle(shards, urls)


def test_pipe_and_stdin(impl: str, shards: list[Path]) -> None:
    urls = [f"pipe:cat {p}" for p in shards]
    assert list(TarStream(urls)) == _oracle(shards, urls)
    code = (
        "import json, sys, tarindex\n"
        "print(json.dumps([[s['__key__'], s['txt'].decode()] for s in tarindex.TarStream('-')]))\n"
    )
    with open(shards[1], "rb") as f:
        out = subprocess.run([sys.executable, "-c", code], stdin=f, capture_output=True, check=True, timeout=120)
    assert json.loads(out.stdout) == [[s["__key__"], s["txt"].decode()] for s in _oracle([shards[1]])]


def test_zstd_over_http(http_server: HTTPServer, shards: list[Path], tmp_path: Path) -> None:
    zst = []
    for p in shards[:2]:
        out = tmp_path / (p.name + ".zst")
        subprocess.run(["zstd", "-q", "-19", str(p), "-o", str(out)], check=True)
        zst.append(out)
    urls = _publish(http_server, zst, tmp_path.name + "-zst")
    assert list(TarStream(urls)) == _oracle(shards[:2], urls)


def test_decode_as_tardataset(tmp_path: Path) -> None:
    samples = [{"__key__": f"k{i:03d}", "json": {"i": i}, "cls": i % 3, "txt": f"t{i}"} for i in range(9)]
    shard = wds_write(tmp_path / "w-000000.tar", samples)
    report = build_index([str(shard)])
    streamed = list(TarStream(report.path, decode="pil"))
    assert streamed == [TarDataset(report.path, decode="pil")[i] for i in range(9)]
    assert streamed[4]["json"] == {"i": 4} and streamed[4]["cls"] == 1 and streamed[4]["txt"] == "t4"
    with_transform = list(TarStream([str(shard)], decode="pil", transform=lambda s: (s["__key__"], s["cls"])))
    assert with_transform == [(f"k{i:03d}", i % 3) for i in range(9)]


def _epoch(stream: TarStream, rank: int, world: int, workers: int) -> list[str]:
    stream.rank, stream.world_size = rank, world
    loader = torch.utils.data.DataLoader(stream, batch_size=None, num_workers=workers)
    return [s["__key__"] for s in loader]


def test_two_workers_two_ranks_cover_every_sample_once(shards: list[Path]) -> None:
    all_keys = _keys(_oracle(shards))
    stream = TarStream([str(p) for p in shards], shuffle=4, seed=3)
    seen = _epoch(stream, 0, 2, 2) + _epoch(stream, 1, 2, 2)
    assert Counter(seen) == Counter(all_keys)
    assert seen != all_keys  # shuffled


def test_ranks_from_environment(shards: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    urls = [str(p) for p in shards]
    seen = []
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        loader = torch.utils.data.DataLoader(TarStream(urls), batch_size=None, num_workers=2)
        seen += [s["__key__"] for s in loader]
    assert Counter(seen) == Counter(_keys(_oracle(shards)))
    stream = TarStream(urls)
    assert (stream.slot().rank, stream.slot().world_size) == (1, 2)


def test_shuffle_is_deterministic(shards: list[Path]) -> None:
    urls = [str(p) for p in shards]

    def run(seed: int, epoch: int) -> list[str]:
        s = TarStream(urls, shuffle=10, seed=seed)
        s.set_epoch(epoch)
        return [x["__key__"] for x in s]

    a = run(0, 0)
    assert a == run(0, 0)
    assert a != run(0, 1) and a != run(1, 0)
    assert sorted(a) == sorted(run(0, 1)) == sorted(_keys(_oracle(shards)))
    s = TarStream(urls, shuffle=10)
    slot = s.slot()
    assert s.shards_for(slot, 0) != s.shards_for(slot, 1)  # shard order changes per epoch
    assert sorted(s.shards_for(slot, 0)) == list(range(5))
    assert TarStream(urls).shards_for(slot, 0) == list(range(5))  # not shuffled: archive order


def test_shuffle_true_is_a_buffer_of_a_thousand(impl: str, tmp_path: Path) -> None:
    """``shuffle=True`` (and ``.shuffle()``, ``.shuffle(True)``) is webdataset's default buffer of 1,000 samples,
    not a buffer of one (archive order): in one shard of 300 samples, some sample comes out more than 100
    places before its place in the archive, which a buffer of ``B`` allows only for ``B`` > 100."""
    shard = make_shard_set(tmp_path / "one", n_shards=1, per=300)[0]
    archive = _keys(_oracle([shard]))
    for stream in (TarStream([str(shard)], shuffle=True), TarStream([str(shard)]).shuffle(), TarStream([str(shard)]).shuffle(True)):
        assert stream.shuffle_size == tarindex.stream.DEFAULT_SHUFFLE == 1000 and stream.shuffle_shards
        got = [s["__key__"] for s in stream]
        assert sorted(got) == sorted(archive) and got != archive
        assert max(archive.index(k) - i for i, k in enumerate(got)) > 100
    off = TarStream([str(shard)], shuffle=False)
    assert off.shuffle_size == 0 and not off.shuffle_shards and _keys(list(off)) == archive


@pytest.mark.parametrize("value", ["100", 100.0, None, b"1", [10]])
def test_shuffle_that_is_not_a_size_is_refused(value: object, shards: list[Path]) -> None:
    """A shuffle that is neither an integer nor a bool is a ``TypeError`` of ours naming it, from the
    constructor and from ``.shuffle()``; a negative size a ``ValueError`` of ours; so is a
    ``shuffle_shards`` that is not a bool."""
    from tarindex.errors import OptionError, OptionTypeError

    urls = [str(p) for p in shards]
    with pytest.raises(OptionTypeError, match=rf"^shuffle must be a buffer size \(int\) or True/False, not {type(value).__name__} "):
        TarStream(urls, shuffle=value)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="shuffle must be"):
        TarStream(urls).shuffle(value)  # type: ignore[arg-type]
    with pytest.raises(OptionError, match=r"^shuffle must be >= 0 \(a buffer size\) or True/False, not -1$") as err:
        TarStream(urls, shuffle=-1)
    assert isinstance(err.value, ValueError) and not isinstance(err.value, TypeError)
    with pytest.raises(OptionError, match="not -5"):
        TarStream(urls).shuffle(-5)
    with pytest.raises(OptionTypeError, match=r"^shuffle_shards must be True, False or None, not str 'no'$"):
        TarStream(urls, shuffle_shards="no")  # type: ignore[arg-type]
    assert TarStream(urls, shuffle=np.int64(7)).shuffle_size == 7  # any integer type


def test_epoch_size_equal_for_every_rank(shards: list[Path]) -> None:
    urls = [str(p) for p in shards]  # 5 shards of 7 over 2 ranks: 21 and 14 samples
    for rank in (0, 1):
        stream = TarStream(urls, epoch_size=20, rank=rank, world_size=2)
        assert len(stream) == 20
        assert len(_epoch(stream, rank, 2, 2)) == 20
        assert len(list(stream)) == 20


def test_fewer_shards_than_readers_warns(shards: list[Path]) -> None:
    urls = [str(p) for p in shards[:2]]
    seen = []
    for rank in range(3):
        stream = TarStream(urls, rank=rank, world_size=3)
        if rank == 0:
            with pytest.warns(StreamWarning, match="2 shards for 3 ranks x 1 worker: 1 reader has no shard of its own, it yields nothing"):
                seen += _keys(list(stream))
        else:
            seen += _keys(list(stream))
    assert Counter(seen) == Counter(_keys(_oracle(shards[:2])))
    with pytest.warns(StreamWarning, match="1 reader has no shard of its own, it reads one shard again"):
        assert len(list(TarStream(urls, rank=0, world_size=3, epoch_size=5))) == 5
    assert len(list(TarStream(urls, rank=2, world_size=3, epoch_size=5))) == 5


def _truncated(src: Path, dest: Path, size: int) -> Path:
    dest.write_bytes(src.read_bytes()[:size])
    return dest


def test_truncated_shard_is_an_error_never_a_short_epoch(impl: str, shards: list[Path], tmp_path: Path) -> None:
    bad = _truncated(shards[1], tmp_path / "bad-000001.tar", 5000)
    urls = [str(shards[0]), str(bad), str(shards[2])]
    with pytest.raises(CorruptArchiveError, match=r"bad-000001\.tar: truncated archive.* at offset \d+"):
        list(TarStream(urls))
    with pytest.raises(CorruptArchiveError, match=r"truncated archive"):
        list(TarStream([f"pipe:head -c 5000 {shards[1]}"]))
    with pytest.warns(StreamWarning, match=r"bad-000001\.tar: truncated archive.*; skipping the rest of the shard"):
        got = _keys(list(TarStream(urls, handler="warn")))
    assert got[:7] == _keys(_oracle([shards[0]])) and got[-7:] == _keys(_oracle([shards[2]]))
    errors: list[Exception] = []
    got = _keys(list(TarStream(urls, handler=lambda e: errors.append(e) is None)))  # webdataset style: True goes on
    assert len(errors) == 1 and isinstance(errors[0], CorruptArchiveError) and len(got) >= 14
    import webdataset as wds

    assert _keys(list(TarStream(urls, handler=wds.ignore_and_continue))) == got  # webdataset's handlers as is
    with pytest.raises(CorruptArchiveError):
        list(TarStream(urls, handler=wds.reraise_exception))


def test_failing_pipe_command_is_an_error(shards: list[Path]) -> None:
    with pytest.raises(SourceError, match=r"pipe:cat .*; exit 2: command exited with status 2 at byte offset \d+"):
        list(TarStream([f"pipe:cat {shards[0]}; exit 2"]))


def test_decode_error_policies(tmp_path: Path) -> None:
    shard = tmp_path / "j-000000.tar"
    with tarfile.open(shard, "w") as tf:
        for i, payload in enumerate([b'{"a": 1}', b"{not json", b'{"a": 3}']):
            ti = tarfile.TarInfo(f"s{i}.json")
            ti.size = len(payload)
            tf.addfile(ti, io.BytesIO(payload))
    with pytest.raises(DecodeError, match=r"j-000000\.tar: sample 's1': member 'json': JSONDecodeError.*\(sample at offset 1024\)"):
        list(TarStream([str(shard)], decode="pil"))
    with pytest.warns(StreamWarning, match="sample 's1'.*; skipping the sample"):
        assert _keys(list(TarStream([str(shard)], decode="pil", handler="warn"))) == ["s0", "s2"]
    with pytest.warns(StreamWarning, match="skipping the rest of the shard"):
        assert _keys(list(TarStream([str(shard)], decode="pil", handler="skip_shard"))) == ["s0"]


def test_http_drop_once_resumes_and_always_drop_fails(drop_server, shards: list[Path]) -> None:  # type: ignore[no-untyped-def]
    data = shards[0].read_bytes()
    once = drop_server(data, drop_at=len(data) // 2 + 3, mode="once")
    assert list(TarStream([once.url], backoff=0.01)) == _oracle([shards[0]], [once.url])
    assert once.requests == [None, f"bytes={len(data) // 2 + 3}-"]
    always = drop_server(data, drop_at=len(data) // 2 + 3, mode="always")
    got: list[dict] = []
    with pytest.raises(SourceError, match=rf"{always.url}: read failed after 2 retries .* at byte offset {len(data) // 2 + 3}"):
        for s in TarStream([always.url], retries=2, backoff=0.01):
            got.append(s)
    assert len(got) < 7  # what came before the error, never reported as a whole epoch


def _large_member_shard(path: Path) -> list[tarfile.TarInfo]:
    """Members past the C walk's 64 KiB window beside small ones, sizes on and off the 512-byte
    grid, and two PAX headers (long names) that the Python walker takes in the middle."""
    sizes = [300_001, 3, 70_000, 511, 512, 513, 1, 200_000, 0, 65_536, 4_000, 130_000]
    rng = np.random.default_rng(7)
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tf:
        for i, size in enumerate(sizes):
            key = f"s{i:03d}" if i not in (4, 9) else f"{'d' * 120}/s{i:03d}"
            for ext, data in (("bin", rng.integers(0, 256, size, dtype=np.uint8).tobytes()), ("cls", str(i).encode())):
                ti = tarfile.TarInfo(f"{key}.{ext}")
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
    with tarfile.open(path) as tf:
        return tf.getmembers()


class _CountingHTTPSource(tarindex.sources.HTTPSource):
    """An HTTPSource that counts the bytes the C walk read from its socket itself."""

    direct_bytes = 0

    def advance(self, n: int, timed_out: bool = False) -> None:
        type(self).direct_bytes += n
        super().advance(n, timed_out)


class _CountingPipeSource(tarindex.sources.PipeSource):
    """A PipeSource that counts the bytes the C walk read from its pipe itself."""

    direct_bytes = 0

    def advance(self, n: int, timed_out: bool = False) -> None:
        type(self).direct_bytes += n
        super().advance(n, timed_out)


def _stream_direct(url: str, **options: float) -> list[dict]:
    from tarindex.grouping import iter_samples
    from tarindex.tar import DirectArchive

    cls = _CountingPipeSource if url.startswith("pipe:") else _CountingHTTPSource
    cls.direct_bytes = 0
    source = _CountingPipeSource(url) if cls is _CountingPipeSource else cls(url, SourceOptions(**options))
    try:
        first = source.read(64 << 10)
        got = [s for _, s in iter_samples(DirectArchive(source, first), url)]
        while source.read(1 << 20):  # to the end: a pipe's exit status is checked there
            pass
        return got
    finally:
        source.close()


def test_http_socket_read_by_the_c_walk(impl: str, http_server: HTTPServer, tmp_path: Path) -> None:
    shard = tmp_path / "big.tar"
    _large_member_shard(shard)
    (url,) = _publish(http_server, [shard], tmp_path.name + "-direct")
    expected = _oracle([shard], [url])
    assert list(TarStream([url])) == expected
    assert _stream_direct(url) == expected
    if impl == "c":
        assert _CountingHTTPSource.direct_bytes > shard.stat().st_size // 2  # most bytes never went through Python


def test_pipe_read_by_the_c_walk(impl: str, tmp_path: Path) -> None:
    shard = tmp_path / "big.tar"
    big = {m.name: m for m in _large_member_shard(shard)}["s007.bin"]
    url = f"pipe:cat {shard}"
    assert list(TarStream([url])) == _oracle([shard], [url])
    assert _stream_direct(url) == _oracle([shard], [url])
    direct_bytes = _CountingPipeSource.direct_bytes
    cut = big.offset_data + 1000
    with pytest.raises(CorruptArchiveError, match=rf"truncated archive: member data needs {big.size} bytes.*offset {big.offset}"):
        _stream_direct(f"pipe:head -c {cut} {shard}")
    with pytest.raises(SourceError, match=rf"head -c {cut} .*; exit 3: command exited with status 3"):
        _stream_direct(f"pipe:head -c {cut} {shard}; exit 3")
    with pytest.raises(SourceError, match="command exited with status 3"):
        list(TarStream([f"pipe:cat {shard}; exit 3"]))  # a complete archive, then a failure
    if impl == "c":
        assert direct_bytes > shard.stat().st_size // 2
    code = "import sys, tarindex\nfor s in tarindex.TarStream('-'): print(s['__key__'], len(s['bin']))\n"
    with open(shard, "rb") as f:
        out = subprocess.run([sys.executable, "-c", code], stdin=f, capture_output=True, check=True, timeout=120)
    assert out.stdout.decode().split("\n")[:-1] == [f"{s['__key__']} {len(s['bin'])}" for s in _oracle([shard])]


@pytest.mark.parametrize("where", ["header", "at_header", "data", "padding", "small", "pax"])
def test_http_drop_anywhere_in_a_socket_read_resumes(impl: str, drop_server, tmp_path: Path, where: str) -> None:  # type: ignore[no-untyped-def]
    shard = tmp_path / "big.tar"
    members = {m.name.rsplit("/", 1)[-1]: m for m in _large_member_shard(shard)}
    big, small, pax = members["s007.bin"], members["s001.cls"], members["s009.bin"]
    drop_at = {
        "header": big.offset + 100,
        "at_header": big.offset,
        "data": big.offset_data + 150_000,
        "padding": big.offset_data + big.size + 7,
        "small": small.offset_data + 1,
        "pax": pax.offset + 300,  # inside the extended header, before the member's own
    }[where]
    data = shard.read_bytes()
    once = drop_server(data, drop_at=drop_at, mode="once")
    expected = _oracle([shard], [once.url])
    assert _stream_direct(once.url, backoff=0.01) == expected
    assert once.requests == [None, f"bytes={drop_at}-"]
    always = drop_server(data, drop_at=drop_at, mode="always")
    with pytest.raises(SourceError, match=rf"{always.url}: read failed after 2 retries .* at byte offset {drop_at}\b"):
        list(TarStream([always.url], retries=2, backoff=0.01))


def test_http_body_shorter_than_its_archive_is_an_error(drop_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    shard = tmp_path / "big.tar"
    big = {m.name: m for m in _large_member_shard(shard)}["s007.bin"]
    cut = shard.read_bytes()[: big.offset_data + 1000]  # the server's whole file ends inside a member
    server = drop_server(cut, drop_at=len(cut), mode="once")
    with pytest.raises(CorruptArchiveError, match=rf"{server.url}: truncated archive: member data needs {big.size} bytes.*offset {big.offset}"):
        list(TarStream([server.url]))


def test_http_chunked_body_goes_through_http_client(shards: list[Path]) -> None:
    """A body without Content-Length (chunked) is not read from the socket directly, and streams the same."""
    import http.server
    import threading

    data = shards[0].read_bytes()

    class Chunked(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(0, len(data), 1000):
                piece = data[i : i + 1000]
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.write(b"0\r\n\r\n")

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Chunked)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/chunked.tar"
        assert list(TarStream([url])) == _oracle([shards[0]], [url])
        assert _stream_direct(url) == _oracle([shards[0]], [url])
        assert _CountingHTTPSource.direct_bytes == 0
    finally:
        server.shutdown()
        server.server_close()


def test_build_index_from_http_and_pipe(http_server: HTTPServer, shards: list[Path], tmp_path: Path) -> None:
    urls = _publish(http_server, shards[:2], tmp_path.name + "-build")
    local = build_index([str(p) for p in shards[:2]], index=tmp_path / "local.tarindex")
    remote = build_index([*urls, f"pipe:cat {shards[2]}"], index=tmp_path / "remote.tarindex")
    a, b = IndexReader(local.path), IndexReader(remote.path)
    assert [s.path for s in b.shards] == [*urls, f"pipe:cat {shards[2]}"]
    for i in range(2):
        assert (b.shards[i].size, b.shards[i].fingerprint) == (a.shards[i].size, a.shards[i].fingerprint)
        assert b.shard_table(i).n_samples == a.shard_table(i).n_samples == 7
    for i in range(2):
        ta, tb = a.shard_table(i), b.shard_table(i)
        for col in ("sample_offset", "sample_size", "sample_nmembers", "member_offset", "member_size", "keys"):
            assert np.array_equal(getattr(ta, col), getattr(tb, col)), col
    with pytest.raises(tarindex.errors.CommandNotAllowedError, match="is a command"):
        TarStream(remote.path)  # an index is data: its commands run only when allowed
    streamed = list(TarStream(remote.path, allow_commands=True))  # an index of URLs streams its URLs
    assert [s["__index__"] for s in streamed] == list(range(21))
    assert [s["__url__"] for s in streamed][:7] == [urls[0]] * 7
    with pytest.raises(tarindex.TarIndexError, match="URL shards need an index path"):
        build_index(urls)


def test_cli_build_over_http(http_server: HTTPServer, shards: list[Path], tmp_path: Path) -> None:
    from click.testing import CliRunner

    from tarindex.cli.main import main

    urls = _publish(http_server, shards[:1], tmp_path.name + "-cli")
    out = tmp_path / "cli.tarindex"
    result = CliRunner().invoke(main, ["build", *urls, "-o", str(out), "-q"])
    assert result.exit_code == 0, result.output
    assert IndexReader(out).n_samples == 7
    result = CliRunner().invoke(main, ["verify", str(out), "--deep"])
    assert result.exit_code == 0 and "1 shard ok (deep)" in result.output, result.output
    served = http_server.root / f"{tmp_path.name}-cli" / shards[0].name
    data = bytearray(served.read_bytes())
    data[600] ^= 1  # same size, one byte of the first member's data changed (within the first 64 KiB)
    served.write_bytes(bytes(data))
    result = CliRunner().invoke(main, ["verify", str(out)])
    assert result.exit_code == 1 and f"{urls[0]}: shard changed since it was indexed (content fingerprint differs)" in result.output
    result = CliRunner().invoke(main, ["build", urls[0].replace(".tar", "-missing.tar"), "-o", str(tmp_path / "missing.tarindex"), "-q"])
    assert result.exit_code == 1 and "no such shard (HTTP 404)" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_tardataset_over_an_index_of_urls(http_server: HTTPServer, shards: list[Path], tmp_path: Path) -> None:
    if http_server.kind != "nginx":
        pytest.skip("Python's http.server (the fallback) does not answer Range requests")
    urls = _publish(http_server, shards[:2], tmp_path.name + "-ranged")
    remote = TarDataset(build_index(urls, index=tmp_path / "ranged.tarindex").path)
    local = TarDataset(build_index([str(p) for p in shards[:2]], index=tmp_path / "plain.tarindex").path)
    assert remote.urls == urls
    assert len(remote) == len(local) == 14
    for i in [13, 0, 7, 6, 1]:  # random access: one Range request per sample on a kept-alive connection
        assert {**remote[i], "__url__": None} == {**local[i], "__url__": None}
    assert remote[8]["__url__"] == urls[1]
    # the shard changes on the server: the next process that opens it says the index is stale
    (http_server.root / f"{tmp_path.name}-ranged" / shards[1].name).write_bytes(shards[1].read_bytes() + bytes(512))
    fresh = TarDataset(remote.index_path)
    with pytest.raises(tarindex.StaleIndexError, match=rf"{urls[1]}: shard changed since it was indexed \(size"):
        fresh[8]


def test_url_shard_without_range_support(drop_server, shards: list[Path], tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from tarindex.sources import RangeReader

    data = shards[0].read_bytes()
    server = drop_server(data, drop_at=len(data), mode="once", ranges=False)
    reader = RangeReader(server.url, SourceOptions(backoff=0.01))
    assert reader.size == len(data) and reader.ranges is False
    with pytest.raises(SourceError, match=rf"{server.url}: the server does not answer Range requests \(.*python -m RangeHTTPServer.*\) at byte offset 1024"):
        reader.read_at(1024, 100)
    ranged = drop_server(data, drop_at=len(data), mode="once")
    reader = RangeReader(ranged.url, SourceOptions(backoff=0.01))
    assert reader.ranges is True
    assert reader.read_at(1024, 100) == data[1024:1124]
    assert reader.read_at(len(data) - 10, 100) == data[-10:]
    assert ranged.requests == ["bytes=0-0", "bytes=1024-1123", f"bytes={len(data) - 10}-{len(data) + 89}"]
    reader.close()


def test_s3_through_fsspec_against_moto(s3_server, shards: list[Path], tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import fsspec

    options = s3_server.storage_options()
    fs = fsspec.filesystem("s3", **options)
    prefix = f"{s3_server.bucket}/{tmp_path.name}"
    for p in shards[:2]:
        fs.put(str(p), f"{prefix}/{p.name}")
    urls = [f"s3://{prefix}/{p.name}" for p in shards[:2]]
    assert list(TarStream(urls, storage_options=options, block_size=1 << 16)) == _oracle(shards[:2], urls)
    brace = f"s3://{prefix}/train-{{000000..000001}}.tar"
    assert _keys(list(TarStream(brace, storage_options=options))) == _keys(_oracle(shards[:2]))
    with pytest.raises(tarindex.ShardNotFoundError, match="no such shard"):
        list(TarStream([f"s3://{prefix}/missing.tar"], storage_options=options))


def test_stopping_early_on_a_stalled_server_returns_at_once(drop_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import time

    from tarindex.tar import iter_tar

    shard = make_shard_set(tmp_path / "big", n_shards=1, per=800)[0]
    data = shard.read_bytes()
    stall_at = [h for _, h, _, _, _ in iter_tar([data], "x")][1100]  # well inside the shard
    server = drop_server(data, drop_at=stall_at, mode="always", stall=30)
    t0 = time.monotonic()
    it = iter(TarStream([server.url], block_size=1 << 16))
    assert next(it)["__key__"] == "s00i000"  # the samples before the stall do not wait for it
    it.close()
    assert time.monotonic() - t0 < 10
    zst = tmp_path / "big.tar.zst"  # zstd goes through the reader thread: blocked in a read the server never answers
    tarindex.compress_shard(shard, zst)  # frames: samples come out before the stall
    packed = zst.read_bytes()
    server = drop_server(packed, drop_at=len(packed) * 3 // 4, mode="always", stall=30)
    t0 = time.monotonic()
    it = iter(TarStream([server.url], block_size=1 << 12))
    assert next(it)["__key__"] == "s00i000"
    it.close()
    assert time.monotonic() - t0 < 10


def test_samples_before_a_stalled_pipe_do_not_wait_for_it(tmp_path: Path) -> None:
    import time

    from tarindex.tar import iter_tar

    shard = make_shard_set(tmp_path / "big", n_shards=1, per=800)[0]
    stall_at = [h for _, h, _, _, _ in iter_tar([shard.read_bytes()], "x")][1100]
    t0 = time.monotonic()
    it = iter(TarStream([f"pipe:head -c {stall_at} {shard}; sleep 30; cat {shard}"]))
    assert next(it)["__key__"] == "s00i000"
    it.close()  # ends the command's whole process group
    assert time.monotonic() - t0 < 10


def test_a_stall_times_out_once_not_twice(drop_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The C walk's wait for bytes counts as the read's timeout: Python does not wait a second time."""
    import time

    shard = tmp_path / "big.tar"
    big = {m.name: m for m in _large_member_shard(shard)}["s007.bin"]
    server = drop_server(shard.read_bytes(), drop_at=big.offset_data + 50_000, mode="always", stall=30)
    t0 = time.monotonic()
    with pytest.raises(SourceError, match=rf"read failed after 0 retries \(TimeoutError: .*at byte offset {big.offset_data + 50_000}"):
        list(TarStream([server.url], timeout=2.0, retries=0))
    assert 2.0 <= time.monotonic() - t0 < 3.8  # one wait of 2 s, not two


def test_webdataset_fluent_pipeline_drop_in(shards: list[Path], tmp_path: Path) -> None:
    import warnings

    import webdataset as wds

    samples = [{"__key__": f"k{i:03d}", "json": {"i": i}, "cls": i % 3, "txt": f"t{i}"} for i in range(12)]
    urls = [str(wds_write(tmp_path / f"w-{k:06d}.tar", samples[k * 6 : k * 6 + 6])) for k in range(2)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # webdataset's own deprecation notices
        expected = list(wds.WebDataset(urls, shardshuffle=False).decode("pil").to_tuple("txt", "cls;missing", "json"))
    ours = TarStream(urls).decode("pil").to_tuple("txt", "cls;missing", "json")
    assert list(ours) == expected == [(f"t{i}", i % 3, {"i": i}) for i in range(12)]
    assert list(TarStream(urls).decode("pil").map(lambda s: s["cls"]).map(lambda c: c * 10)) == [i % 3 * 10 for i in range(12)]
    shuffled = TarStream(urls).shuffle(5).to_tuple("__key__")
    assert sorted(shuffled) == [(f"k{i:03d}",) for i in range(12)] and list(shuffled) != sorted(shuffled)
    with pytest.raises(DecodeError, match=r"w-000000\.tar: sample 'k000': KeyError: .*none of \['jpg', 'png'\]"):
        list(TarStream(urls).to_tuple("jpg;png"))


def _tenfold(x: int) -> int:
    return x * 10


def test_batched_and_map_tuple_as_webdataset(tmp_path: Path) -> None:
    import warnings

    import webdataset as wds

    from tarindex.collate import collate

    samples = [{"__key__": f"k{i:03d}", "cls": i % 3, "txt": f"t{i}", "npy": np.full((2, 3), i, np.int16)} for i in range(11)]
    urls = [str(wds_write(tmp_path / f"b-{k:06d}.tar", samples[k * 6 : k * 6 + 6])) for k in range(2)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # webdataset's own deprecation notices
        theirs = list(wds.WebDataset(urls, shardshuffle=False).decode().to_tuple("txt", "cls", "npy").map_tuple(None, _tenfold, None).batched(4))
    ours = list(TarStream(urls).decode("numpy").to_tuple("txt", "cls", "npy").map_tuple(None, _tenfold, None).batched(4))
    assert [len(b[0]) for b in ours] == [4, 4, 3]
    for a, b in zip(ours, theirs, strict=True):
        assert a[0] == b[0] and np.array_equal(a[1], b[1]) and np.array_equal(a[2], b[2])
    assert ours[2][1].tolist() == [i % 3 * 10 for i in (8, 9, 10)] and ours[0][2].shape == (4, 2, 3)
    full = list(TarStream(urls).batched(4, partial=False))
    assert [b["__key__"] for b in full] == [[f"k{i:03d}" for i in range(j, j + 4)] for j in (0, 4)]
    assert list(TarStream(urls).batched(5, collation_fn=None))[2] == list(TarStream(urls))[10:]  # plain lists
    tensors = collate([{"x": torch.ones(2)}, {"x": torch.zeros(2)}])
    assert torch.equal(tensors["x"], torch.tensor([[1.0, 1.0], [0.0, 0.0]]))
    with pytest.raises(ValueError, match=r"different keys: \['a'\] and \['b'\]"):
        collate([{"a": 1}, {"b": 2}])
    with pytest.raises(ValueError, match=r"field 1: cannot stack shapes \[\(2,\), \(3,\)\]"):
        collate([(0, np.zeros(2)), (1, np.zeros(3))])
    with pytest.raises(ValueError, match="map_tuple has 2 functions for a sample of 3 fields"):
        list(TarStream(urls).to_tuple("txt", "cls", "npy").map_tuple(None, None))
    with pytest.raises(TypeError, match="batched TarStream has no length"):
        len(TarStream(urls, epoch_size=8).batched(4))
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        TarStream(urls).batched(0)


def test_batched_in_dataloader_workers_covers_every_sample_once(shards: list[Path]) -> None:
    stream = TarStream([str(p) for p in shards]).to_tuple("__key__", "cls").batched(3)
    loader = torch.utils.data.DataLoader(stream, batch_size=None, num_workers=2)
    batches = list(loader)
    keys = [k for b in batches for k in b[0]]
    assert Counter(keys) == Counter(s["__key__"] for s in _oracle(shards)) and len(keys) == 35
    assert all(1 <= len(b[0]) <= 3 for b in batches) and sum(len(b[0]) < 3 for b in batches) <= 2  # one short batch per worker


def _reader_threads(sample: dict) -> int:
    import threading

    return sum(t.name == "tarindex-read-ahead" for t in threading.enumerate())


def _policy(sample: dict) -> int | None:
    from tarindex._shardwalk import read_ahead_for
    from tarindex.naming import ShardRef

    return read_ahead_for(ShardRef.of(sample["__url__"]), None)


def test_read_ahead_thread_policy(shards: list[Path]) -> None:
    local = [str(shards[0])]
    assert set(TarStream(local, transform=_reader_threads, read_ahead=0)) == {0}  # no thread at all
    assert set(TarStream(local, transform=_policy)) == {None}  # main process: the reader thread (8 ahead)
    in_worker = torch.utils.data.DataLoader(TarStream(local, transform=_policy), batch_size=None, num_workers=1)
    assert set(in_worker) == {0}  # local files in DataLoader workers: no thread, the workers use the cores
    piped = TarStream([f"pipe:cat {shards[0]}"], transform=_policy)
    assert set(torch.utils.data.DataLoader(piped, batch_size=None, num_workers=1)) == {None}  # I/O waits overlap


def test_a_single_file_is_an_index_or_a_shard_by_content(shards: list[Path], tmp_path: Path) -> None:
    odd = tmp_path / "train-0.shard"  # a tar under a name that is neither .tar nor .tar.zst
    shutil.copyfile(shards[0], odd)
    assert list(TarStream(odd)) == _oracle([odd])
    index = build_index([str(p) for p in shards[:2]], index=tmp_path / "train.idx").path  # an index, not named .tarindex
    assert [s["__index__"] for s in TarStream(index)] == list(range(14))
    gz = tmp_path / "train-0.tar.gz"
    gz.write_bytes(b"\x1f\x8b\x08\x00" + bytes(60))
    assert TarStream(gz).urls == [str(gz)]  # a shard (gzip by content), never "not a tarindex index"
    zst = tmp_path / "train-0.data"
    subprocess.run(["zstd", "-q", str(shards[1]), "-o", str(zst)], check=True)
    assert list(TarStream(zst)) == [{**s, "__url__": str(zst)} for s in _oracle([shards[1]])]
    v7 = tmp_path / "train-0.v7"  # no "ustar" magic: told by its header checksum
    subprocess.run(["tar", "--format=v7", "-C", str(shards[2].parent), "-cf", str(v7), shards[2].name], check=True)
    assert TarStream(v7).urls == [str(v7)]
    junk = tmp_path / "train.idx.bak"  # neither an index nor a shard: taken by its name, for an index
    junk.write_bytes(os.urandom(4096))
    with pytest.raises(tarindex.IndexFormatError, match="not a tarindex index"):
        TarStream(junk)


def test_a_directory_names_no_shard(shards: list[Path]) -> None:
    directory = shards[0].parent
    with pytest.raises(tarindex.ShardNotFoundError, match=rf"{directory}: is a directory, not a shard; name its shards, for example '{directory}/\*\.tar'"):
        TarStream(directory)
    with pytest.raises(tarindex.ShardNotFoundError, match="is a directory, not a shard"):
        build_index(str(directory))


def test_stream_from_an_index_notices_a_changed_shard(shards: list[Path], tmp_path: Path) -> None:
    index = build_index([str(p) for p in shards[:2]], index=tmp_path / "two.tarindex").path
    assert [s["__index__"] for s in TarStream(index)] == list(range(14))
    with tarfile.open(shards[0], "a") as tf:  # one more sample in the first shard: later numbers would shift
        ti = tarfile.TarInfo("appended.txt")
        ti.size = 3
        tf.addfile(ti, io.BytesIO(b"new"))
    with pytest.raises(tarindex.StaleIndexError, match=rf"{shards[0]}: shard changed since it was indexed"):
        list(TarStream(index))
    assert len(list(TarStream([str(p) for p in shards[:2]]))) == 15  # without the index: the shards as they are


def test_tardataset_over_pipe_shards_says_random_access_is_unsupported(shards: list[Path], tmp_path: Path) -> None:
    command = f"pipe:cat {shards[0]}"
    index = build_index([command], index=tmp_path / "piped.tarindex").path
    ds = TarDataset(index)
    assert len(ds) == 7
    with pytest.raises(tarindex.RandomAccessError, match=rf"{command}: a command's output cannot be read at random; stream the index with TarStream"):
        ds[0]
    assert [s["__index__"] for s in TarStream(index, allow_commands=True)] == list(range(7))  # streaming it works



def test_streaming_and_mixing_work_without_torch(tmp_path: Path) -> None:
    """A process where torch cannot be imported streams, mixes and batches (torch is optional)."""
    shards = [str(p) for p in make_shard_set(tmp_path / "d", n_shards=2, per=3)]
    code = f"""
import sys
sys.modules["torch"] = None  # import torch raises ModuleNotFoundError, as where it is not installed
import tarindex
shards = {shards!r}
stream = tarindex.TarStream(shards, shuffle=4, seed=1)
keys = sorted(s["__key__"] for s in stream)
mixed = list(tarindex.mix([tarindex.TarStream(shards[:1]), tarindex.TarStream(shards[1:])], stop="all"))
batches = list(tarindex.TarStream(shards).batched(4))
assert "torch" not in [m.split(".")[0] for m in sys.modules if sys.modules[m] is not None]
print(len(keys), len(set(keys)), len(mixed), [len(b["__key__"]) for b in batches])
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["6", "6", "6", "[4,", "2]"]
