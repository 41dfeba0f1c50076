"""Byte sources against real servers on 127.0.0.1: nginx, a connection-dropping server, moto's S3."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _servers import HTTPServer

from conftest import make_shard_set
from tarindex.errors import NotRegularFileError, ShardNotFoundError, SourceError
from tarindex.naming import ShardRef
from tarindex.scan import iter_archive
from tarindex.sources import FileSource, HTTPSource, PipeSource, StdinSource, open_source


def _read(url: str, **options: object) -> bytes:
    with open_source(url, **options) as src:  # type: ignore[arg-type]
        return b"".join(bytes(c) for c in src)


def _publish(server: HTTPServer, path: Path, name: str) -> str:
    dest = server.root / name
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(path, dest)
    return server.url(name)


@pytest.fixture
def shard(tmp_path: Path) -> Path:
    return make_shard_set(tmp_path / "d", n_shards=1, per=40)[0]


def test_each_kind_of_name_opens_its_source(shard: Path) -> None:
    assert isinstance(open_source(str(shard)), FileSource)
    with open_source(f"file://{shard}") as local:
        assert isinstance(local, FileSource) and local.url == str(shard)
    assert isinstance(open_source(f"pipe:cat {shard}"), PipeSource)
    assert isinstance(open_source("-"), StdinSource)
    assert isinstance(open_source("http://127.0.0.1:1/x.tar"), HTTPSource)
    assert [ShardRef.of(u).local for u in ("-", "pipe:cat x", "s3://b/k", "data/x.tar")] == [False, False, False, True]
    for name, kind in ((f"file://{shard}", FileSource), (f"pipe:cat {shard}", PipeSource)):  # a ShardRef opens as its name
        with open_source(ShardRef.of(name)) as src:
            assert isinstance(src, kind) and b"".join(bytes(c) for c in src) == shard.read_bytes()


def test_file_source_reads_large_blocks(shard: Path) -> None:
    with open_source(str(shard), block_size=1 << 16) as src:
        chunks = list(src)
        assert b"".join(chunks) == shard.read_bytes()
        assert all(len(c) == 1 << 16 for c in chunks[:-1]) and len(chunks) > 1
        assert src.size == src.position == shard.stat().st_size
    with pytest.raises(ShardNotFoundError, match=r"nope\.tar: no such shard"):
        open_source(str(shard.parent / "nope.tar"))


def test_pipe_blocks_and_exit_status(shard: Path) -> None:
    data = shard.read_bytes()
    with open_source(f"pipe:cat {shard}", block_size=1 << 16) as src:
        chunks = list(src)
    assert b"".join(chunks) == data
    assert all(len(c) == 1 << 16 for c in chunks[:-1]) and len(chunks) > 1  # large blocks, not pipe-sized reads
    with pytest.raises(SourceError, match=rf"pipe:cat {shard}; exit 3: command exited with status 3 at byte offset {len(data)}"):
        _read(f"pipe:cat {shard}; exit 3")


def test_pipe_closed_early_ends_the_command(shard: Path) -> None:
    src = open_source(f"pipe:cat {shard} {shard} {shard}; sleep 30", block_size=1 << 16)
    it = iter(src)
    next(it)
    proc = src._proc  # the command we started
    assert proc is not None and proc.poll() is None
    t0 = time.monotonic()
    src.close()  # stops the reader thread and ends the command (the shell and its children), without waiting
    assert time.monotonic() - t0 < 10  # not the 30 s of the sleep that holds the pipe open
    assert proc.poll() is not None and proc.stdout is not None and proc.stdout.closed


def test_http_nginx_bytes_size_and_mtime(http_server: HTTPServer, shard: Path) -> None:
    url = _publish(http_server, shard, "src/a.tar")
    with open_source(url, block_size=1 << 16) as src:
        data = b"".join(src)
        assert src.size == len(data) == shard.stat().st_size
        if http_server.kind == "nginx":
            assert abs(src.mtime_ns - (http_server.root / "src/a.tar").stat().st_mtime_ns) < 2e9
    assert data == shard.read_bytes()
    with pytest.raises(ShardNotFoundError, match=r"/src/missing.tar: no such shard \(HTTP 404\)"):
        _read(http_server.url("src/missing.tar"))


def test_http_server_is_nginx_when_installed(http_server: HTTPServer) -> None:
    """Says which server the HTTP tests used; with nginx installed (as .ci/run does) it must be nginx."""
    if shutil.which("nginx") is None and not os.path.exists("/usr/sbin/nginx"):
        pytest.skip("nginx is not installed: the HTTP tests used Python's http.server")
    assert http_server.kind == "nginx"


def test_connection_refused_fails_at_once_in_one_line() -> None:
    start = time.monotonic()
    with pytest.raises(SourceError, match=r"^http://127.0.0.1:9/x.tar: connection refused \(is the server running.*\) at byte offset 0$"):
        _read("http://127.0.0.1:9/x.tar", retries=5, backoff=2.0)
    # no backoff: retrying a refused connection cannot help. Five retries would wait U(0, 2) + U(0, 4) + ...
    # seconds (full jitter): under 5 s with probability < 0.001, so 5 s tells a retry from a loaded machine
    assert time.monotonic() - start < 5.0


def test_drop_once_resumes_with_range(drop_server, shard: Path) -> None:  # type: ignore[no-untyped-def]
    data = shard.read_bytes()
    server = drop_server(data, drop_at=70_000, mode="once")
    assert _read(server.url, block_size=1 << 15, backoff=0.01) == data
    assert server.requests == [None, "bytes=70000-"]  # resumed at the byte reached


def test_drop_always_fails_naming_url_and_offset(drop_server, shard: Path) -> None:  # type: ignore[no-untyped-def]
    server = drop_server(shard.read_bytes(), drop_at=70_000, mode="always")
    with pytest.raises(SourceError, match=rf"{server.url}: read failed after 3 retries .* at byte offset 70000"):
        _read(server.url, block_size=1 << 15, retries=3, backoff=0.01)
    assert len(server.requests) == 1 + 3  # the first request, then 3 retries that made no progress


def test_resume_without_range_support_skips_what_was_read(drop_server, shard: Path) -> None:  # type: ignore[no-untyped-def]
    data = shard.read_bytes()
    server = drop_server(data, drop_at=70_000, mode="once", ranges=False)
    assert _read(server.url, block_size=1 << 15, backoff=0.01) == data
    assert server.requests[1] is not None  # a Range was asked for, and ignored


def test_shard_changed_during_read_is_an_error(drop_server, shard: Path) -> None:  # type: ignore[no-untyped-def]
    server = drop_server(shard.read_bytes(), drop_at=70_000, mode="once", change_etag=True)
    with pytest.raises(SourceError, match=r"shard changed on the server while it was being read at byte offset 70000"):
        _read(server.url, block_size=1 << 15, backoff=0.01)


def test_zstd_detected_by_content(tmp_path: Path, shard: Path) -> None:
    zst = tmp_path / "a.tar.zst"
    subprocess.run(["zstd", "-q", "-3", str(shard), "-o", str(zst)], check=True)
    plain = tmp_path / "renamed.bin"  # detection by content, not by name
    shutil.copyfile(zst, plain)
    with open_source(str(plain)) as src:
        assert b"".join(bytes(c) for c in iter_archive(src, str(plain))) == shard.read_bytes()
    with open_source(str(shard)) as src:
        assert b"".join(bytes(c) for c in iter_archive(src, str(shard))) == shard.read_bytes()


def test_fsspec_s3_against_moto(s3_server, shard: Path) -> None:  # type: ignore[no-untyped-def]
    import fsspec

    fs = fsspec.filesystem("s3", **s3_server.storage_options())
    fs.put(str(shard), f"{s3_server.bucket}/src/a.tar")
    url = f"s3://{s3_server.bucket}/src/a.tar"
    with open_source(url, storage_options=s3_server.storage_options(), block_size=1 << 16) as src:
        data = b"".join(src)
        assert src.size == len(data)
    assert data == shard.read_bytes()
    with pytest.raises(ShardNotFoundError, match="no such shard"):
        _read(f"s3://{s3_server.bucket}/src/missing.tar", storage_options=s3_server.storage_options())


@contextlib.contextmanager
def _bounded(seconds: int) -> Iterator[None]:
    """Fail instead of hanging: an ``open`` of a FIFO without the fix blocks until SIGALRM interrupts it."""

    def expired(signum: int, frame: object) -> None:
        raise TimeoutError(f"blocked for {seconds} s (an open of a FIFO?)")

    before = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, before)


def test_a_fifo_in_a_shards_place_is_refused_not_waited_on(tmp_path: Path, impl: str) -> None:
    """A FIFO named by an index record, by a glob or by name: TarDataset, verify, build and TarStream refuse it
    with a NotRegularFileError that names it; nothing blocks in open()."""
    from click.testing import CliRunner

    import tarindex
    import tarindex.stream  # loaded before the time bound: what it bounds is the opens, not an import of torch
    from tarindex.cli.main import main

    paths = make_shard_set(tmp_path / "d", n_shards=3, per=4)
    ds = tarindex.TarDataset(tarindex.build_index(paths, workers=1).path)
    paths[1].unlink()
    os.mkfifo(paths[1])
    message = f"{paths[1]}: is a FIFO (named pipe), not a regular file; a shard must be a regular file"
    with _bounded(20):
        assert ds[0]["__key__"] == "s00i000"
        with pytest.raises(NotRegularFileError, match=re.escape(message)):
            ds[4]  # shard 1's first sample: named by the index record
        with pytest.raises(NotRegularFileError, match=re.escape(message)):
            tarindex.verify_index(ds.index_path)
        result = CliRunner().invoke(main, ["verify", str(ds.index_path)])
        assert result.exit_code == 1 and result.stderr == f"tarindex: error: {message} (to stream a pipe, name it as 'pipe:cat {paths[1]}')\n"
        with pytest.raises(NotRegularFileError, match=re.escape(message)):
            tarindex.build_index(str(tmp_path / "d" / "train-*.tar"), index=tmp_path / "new.tarindex", workers=2)  # by a glob
        with pytest.raises(NotRegularFileError, match=re.escape(message)):
            tarindex.build_index(str(tmp_path / "d" / "train-*.tar"), workers=1)  # an incremental rebuild over it
        with pytest.raises(NotRegularFileError, match=re.escape(message)):
            list(tarindex.TarStream(str(tmp_path / "d" / "train-*.tar")))
        with pytest.raises(NotRegularFileError, match=re.escape(f"{paths[1]}: not a regular file (a FIFO, socket or device)")):
            tarindex.TarDataset([str(paths[0]), str(paths[1])])  # named: refused before anything opens it
    assert not (tmp_path / "new.tarindex").exists()
