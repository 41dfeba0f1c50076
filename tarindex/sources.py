"""Where bytes come from: a URL opened as a sequential source of large chunks.

``open_source(url)`` accepts a local path, ``-`` (standard input),
``pipe:COMMAND`` (a shell command whose standard output is the shard, as in
webdataset), ``http://`` and ``https://`` (the standard library's
:mod:`http.client`; retries with backoff, resumed with a ``Range`` request at
the byte reached) and any other ``scheme://`` that :mod:`fsspec` knows
(``s3://``, ``gs://``, ...; ``pip install 'tarindex[s3]'``).

A source is iterated once and yields consecutive ``bytes`` chunks of the raw
stream, blocks of ``block_size`` bytes (never one read per member), read by a
thread that keeps ``prefetch`` blocks ahead so that reading (which releases
the GIL) overlaps parsing.
:func:`iter_archive` adds zstd detection by content and decompression.
"""

from __future__ import annotations

import email.utils
import http.client
import itertools
import os
import queue
import signal
import socket
import ssl
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, BinaryIO
from urllib.parse import urljoin, urlsplit

from .errors import ShardNotFoundError, SourceError, StaleIndexError, TarIndexError
from .zstd import is_zstd, iter_decompressed

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "FileSource",
    "FsspecSource",
    "HTTPSource",
    "PipeSource",
    "RangeReader",
    "Source",
    "is_url",
    "iter_archive",
    "open_source",
]

DEFAULT_BLOCK_SIZE = 1 << 20
_RETRYABLE_STATUS = frozenset((408, 425, 429, 500, 502, 503, 504))
_REDIRECTS = frozenset((301, 302, 303, 307, 308))
_MAX_REDIRECTS = 5


def is_url(spec: str) -> bool:
    """Whether a shard name is a stream (URL, ``pipe:``, ``-``) rather than a local path."""
    return "://" in spec or spec.startswith("pipe:") or spec == "-"


class Source:
    """A sequential byte stream; iterate once for its chunks, then ``close()``.

    Attributes:
        url: the name the source was opened with (used in every message).
        position: bytes delivered so far.
        size: total size when known in advance (file size, ``Content-Length``), else ``None``.
        mtime_ns: modification time when known (file, ``Last-Modified``), else 0.
    """

    def __init__(self, url: str, *, block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        self.url = url
        self.block_size = max(1 << 16, block_size)
        self.position = 0
        self.size: int | None = None
        self.mtime_ns = 0
        self._reader: Iterator[bytes] | None = None

    prefetch = 8
    """Blocks a reader thread keeps ready ahead of the parser (0: read in the caller's thread)."""

    walks_direct = False
    """Whether the C walk may read this source's descriptor itself: :meth:`read`, :meth:`direct`
    and :meth:`advance` (a :class:`tarindex.tar.DirectSource`), in the caller's thread."""

    def read(self, n: int) -> bytes:
        """Up to ``n`` more bytes (``b""`` at the end), for sources that :attr:`walks_direct`."""
        raise NotImplementedError(f"{type(self).__name__} is read in blocks")

    def direct(self) -> tuple[int, int, int] | None:
        """``(fd, bytes left or -1, timeout in ms or -1)`` when every byte read so far came out of
        :meth:`read` (nothing is buffered in Python), else ``None``."""
        return None

    def advance(self, n: int) -> None:
        """``n`` bytes were read from the :meth:`direct` descriptor."""
        self.position += n

    def __iter__(self) -> Iterator[Any]:
        return self._run(self._chunks())

    def archive(
        self,
        tap: Callable[[Iterator[bytes]], Iterator[bytes]] | None = None,
        *,
        frames: list[Any] | None = None,
        first: bytes = b"",
    ) -> Iterator[bytes]:
        """The uncompressed tar stream (see :func:`iter_archive`), decompressed in the reader thread too.

        ``tap`` wraps the raw chunks before decompression (it runs in the reader thread); ``frames``
        collects a zstd stream's frame table; ``first``: bytes already read from the source.
        """
        raw = self._chunks()
        if first:
            raw = itertools.chain((first,), raw)
        return self._run(iter_archive(tap(raw) if tap is not None else raw, self.url, frames=frames))

    def _run(self, chunks: Iterator[bytes]) -> Iterator[bytes]:
        if self.prefetch <= 0:
            return chunks
        self._reader = _read_ahead(chunks, self.prefetch, self._interrupt)
        return self._reader

    def _chunks(self) -> Iterator[bytes]:
        raise NotImplementedError

    def _interrupt(self) -> None:
        """Release the connection or process, so that a read in progress returns (any thread)."""

    def close(self) -> None:
        """Stop reading and release the file, connection or process (safe to call twice)."""
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.close()  # type: ignore[attr-defined]  # a generator: stops and joins the reader thread
        self._interrupt()

    def __enter__(self) -> Source:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _blocks(self, read: Callable[[int], bytes]) -> Iterator[bytes]:
        """``block_size`` reads until an empty one (buffered readers fill each block; no extra copy)."""
        size = self.block_size
        while True:
            block = read(size)
            if not block:
                return
            self.position += len(block)
            yield block


class _Raised:
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


_END = object()


def _read_ahead(chunks: Iterator[bytes], depth: int, interrupt: Callable[[], None]) -> Iterator[bytes]:
    """Iterate ``chunks`` in a thread, ``depth`` blocks ahead: reads (no GIL) overlap the parser.

    Stopping early calls ``interrupt`` (closes the connection or ends the
    command) so that a read in progress returns, then waits for the thread.
    """
    q: queue.Queue[Any] = queue.Queue(depth)
    stop = threading.Event()

    def run() -> None:
        try:
            for chunk in chunks:
                if stop.is_set():
                    chunks.close()  # type: ignore[attr-defined]  # a generator: runs its cleanup here
                    return
                q.put(chunk)
            q.put(_END)
        except BaseException as exc:  # handed to the consumer's thread, whatever it is
            q.put(_Raised(exc))

    thread = threading.Thread(target=run, name="tarindex-read-ahead", daemon=True)
    thread.start()
    finished = False
    try:
        while True:
            item = q.get()
            if item is _END:
                finished = True
                return
            if isinstance(item, _Raised):
                finished = True
                raise item.exc
            yield item
    finally:
        if not finished:
            stop.set()
            interrupt()
            while thread.is_alive():  # let a blocked put() through
                try:
                    q.get(timeout=0.05)
                except queue.Empty:
                    pass
        thread.join()


class FileSource(Source):
    """A local file, read in blocks by the reader thread.

    Measured against one memory map per shard (``tools/bench.py``): reads in
    a thread overlap the parser and avoid page faults, and were faster.
    """

    def __init__(self, url: str, *, block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        super().__init__(url, block_size=block_size)
        try:
            self._fd = os.open(url, os.O_RDONLY)
        except FileNotFoundError as exc:
            raise ShardNotFoundError(f"{url}: no such shard") from exc
        except IsADirectoryError as exc:
            raise ShardNotFoundError(f"{url}: is a directory, not a shard") from exc
        st = os.fstat(self._fd)
        if stat.S_ISREG(st.st_mode):
            self.size = st.st_size
            self.mtime_ns = st.st_mtime_ns

    def _chunks(self) -> Iterator[bytes]:
        with open(self._fd, "rb", closefd=False) as f:
            yield from self._blocks(f.read)

    def fileno(self) -> int:
        """The open file's descriptor (for ``os.pread``; it stays ours, closed by :meth:`close`)."""
        return self._fd

    def close(self) -> None:
        super().close()  # the reader thread first: the descriptor is closed after its last read
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class StdinSource(Source):
    """Standard input (``-``); never closed by us. The C walk may read the descriptor itself once
    the bytes Python buffered (if anything read it before) are out."""

    walks_direct = True

    def __init__(self, url: str, *, block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        super().__init__(url, block_size=block_size)
        self._fresh = True

    def read(self, n: int) -> bytes:
        if self._fresh:  # what the buffered reader holds first, then the descriptor itself
            self._fresh = False
            buffer = sys.stdin.buffer
            read1 = getattr(buffer, "read1", None)  # a BufferedReader's: what it holds, or one read
            data: bytes = read1(n) if read1 is not None else buffer.read(n)
        else:
            data = os.read(sys.stdin.buffer.fileno(), n)
        self.position += len(data)
        return data

    def direct(self) -> tuple[int, int, int] | None:
        return None if self._fresh else (sys.stdin.buffer.fileno(), -1, -1)

    def _chunks(self) -> Iterator[bytes]:
        return _full_blocks(self.read, self.block_size)


def _full_blocks(read: Callable[[int], bytes], size: int) -> Iterator[bytes]:
    """``size``-byte blocks (the last one shorter) from a ``read`` that may return less."""
    while True:
        parts: list[bytes] = []
        got = 0
        while got < size and (data := read(size - got)):
            parts.append(data)
            got += len(data)
        if not parts:
            return
        yield parts[0] if len(parts) == 1 else b"".join(parts)
        if got < size:
            return


class PipeSource(Source):
    """``pipe:COMMAND``: the command's standard output; a non-zero exit status is an error.

    The pipe is unbuffered in Python, so the C walk may read its descriptor itself."""

    walks_direct = True

    def __init__(self, url: str, *, block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        super().__init__(url, block_size=block_size)
        self.command = url[len("pipe:") :]
        self._proc: subprocess.Popen[bytes] | None = None
        self._started = False

    def _start(self) -> subprocess.Popen[bytes]:
        self._started = True
        try:  # a 1 MiB pipe (the default maximum) instead of 64 KiB: fewer context switches
            proc = subprocess.Popen(
                self.command, shell=True, stdout=subprocess.PIPE, bufsize=0, pipesize=1 << 20, start_new_session=True
            )
        except PermissionError:  # over the unprivileged pipe-max-size
            proc = subprocess.Popen(self.command, shell=True, stdout=subprocess.PIPE, bufsize=0, start_new_session=True)
        self._proc = proc
        return proc

    def read(self, n: int) -> bytes:
        proc = self._proc
        if proc is None:
            if self._started:  # ended, or stopped by the consumer
                return b""
            proc = self._start()
        stdout = proc.stdout
        data = stdout.read(n) if stdout is not None else b""  # unbuffered: one read(); None never (blocking)
        if data:
            self.position += len(data)
            return data
        self._finish(proc)
        return b""

    def _finish(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.stdout is not None:
            proc.stdout.close()
        status = proc.wait()
        if self._proc is None:  # closed by the consumer: the status is not ours to report
            return
        self._proc = None
        if status != 0:
            raise SourceError(self.url, self.position, f"command exited with status {status}")

    def direct(self) -> tuple[int, int, int] | None:
        proc = self._proc
        return (proc.stdout.fileno(), -1, -1) if proc is not None and proc.stdout is not None else None

    def _chunks(self) -> Iterator[bytes]:
        return _full_blocks(self.read, self.block_size)

    def _interrupt(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:  # stopped early: the rest of the output is not wanted
            try:  # the whole process group: a shell's children hold the pipe open too
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()


class _Retrying(Source):
    """Shared retry loop: reconnect at ``position`` after a failure, with exponential backoff."""

    def __init__(
        self, url: str, *, block_size: int = DEFAULT_BLOCK_SIZE, retries: int = 5, backoff: float = 0.5, timeout: float = 60.0
    ) -> None:
        super().__init__(url, block_size=block_size)
        self.retries = max(0, retries)
        self.backoff = backoff
        self.timeout = timeout
        self._stream: Any = None
        self._closed = False
        self._ended = False
        self._failures = 0
        self._failed_at = -1

    def _open_at(self, start: int) -> Any:
        """A readable object (``read(n)``, ``close()``) positioned at byte ``start``."""
        raise NotImplementedError

    def _finished(self) -> None:
        """Called at the end of a stream; raise ``OSError`` if it ended before ``size``."""
        if self.size is not None and self.position < self.size:
            raise ConnectionError(f"stream ended at byte {self.position} of {self.size}")

    def _retryable(self, exc: Exception) -> bool:
        return isinstance(exc, (OSError, http.client.HTTPException))

    def read(self, n: int) -> bytes:
        """Up to ``n`` bytes from ``position`` (``b""`` at the end, or once closed), reconnecting at
        ``position`` after a failure, with backoff.

        Raises:
            SourceError: ``retries`` failures in a row without progress.
            ShardNotFoundError, StaleIndexError: not found or changed on the server (never retried).
        """
        while not self._closed and not self._ended:
            try:
                if self._stream is None:
                    self._stream = self._open_at(self.position)
                data: bytes = self._stream.read(n)
                if data:
                    self.position += len(data)
                    return data
                self._finished()
                self._drop()
                self._ended = True
            except TarIndexError:  # not found, changed on the server: retrying cannot help
                self._drop()
                raise
            except Exception as exc:
                self._drop()
                if self._closed:  # the consumer stopped: the failure is our own doing
                    break
                if not self._retryable(exc):
                    raise
                self._failed(exc)
        return b""

    def _failed(self, exc: Exception) -> None:
        """Count a failure (a fresh budget after progress) and wait before the next try."""
        if self.position != self._failed_at:
            self._failures, self._failed_at = 0, self.position
        self._failures += 1
        if self._failures > self.retries:
            raise SourceError(
                self.url, self.position, f"read failed after {self.retries} retries ({type(exc).__name__}: {exc})"
            ) from exc
        time.sleep(min(self.backoff * 2 ** (self._failures - 1), 30.0))

    def _chunks(self) -> Iterator[bytes]:
        return _full_blocks(self.read, self.block_size)

    def _drop(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()

    def _interrupt(self) -> None:
        self._closed = True
        self._drop()


class _HTTPBody:
    """A response body with its connection; ``read`` flags a body cut short.

    A plain-HTTP body of known length is read from the socket itself once
    http.client's buffered bytes are out, so that the C walk can read it too
    (:meth:`direct`); HTTPS and chunked bodies go through http.client.
    """

    def __init__(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse) -> None:
        self.conn = conn
        self.resp = resp
        sock = conn.sock
        plain = sock is not None and not isinstance(sock, ssl.SSLSocket) and not resp.chunked and resp.length
        self.sock: socket.socket | None = sock if plain else None
        self.left = resp.length or 0  # with sock: bytes still to come
        self.fresh = True  # with sock: http.client may hold bytes it read with the headers

    def read(self, n: int) -> bytes:
        if self.sock is None:
            data = self.resp.read(n)
            if not data and self.resp.length:  # http.client returns b"" when Content-Length is not met
                raise http.client.IncompleteRead(b"", self.resp.length)
            return data
        if not self.left:
            return b""
        if self.fresh:  # first what http.client buffered (or one read), then the socket itself
            self.fresh = False
            data = self.resp.fp.read1(min(n, self.left))
        else:
            data = self.sock.recv(min(n, self.left))
        if not data:
            raise http.client.IncompleteRead(b"", self.left)
        self.left -= len(data)
        return data

    def direct(self) -> tuple[int, int, int] | None:
        """``(fd, bytes left, timeout in ms or -1)`` for reads that bypass Python (report them with
        :meth:`advance`), or ``None``: HTTPS, chunked, or before the first :meth:`read`."""
        if self.sock is None or self.fresh:
            return None
        timeout = self.sock.gettimeout()
        return self.sock.fileno(), self.left, -1 if timeout is None else int(timeout * 1000)

    def advance(self, n: int) -> None:
        self.left -= n

    def close(self) -> None:
        sock = self.conn.sock
        if sock is not None:  # wakes a read blocked in another thread (closing alone does not)
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.resp.close()
        self.conn.close()


def _http_connect(url: str, timeout: float, rcvbuf: int) -> tuple[http.client.HTTPConnection, str]:
    """A connected ``HTTP(S)Connection`` for ``url`` and the request target (path and query)."""
    parts = urlsplit(url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.hostname or "localhost", parts.port, timeout=timeout)
    try:
        conn.connect()
        # a large receive window: measured 1.6 -> 2.3 GB/s from loopback nginx
        conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    except BaseException:
        conn.close()
        raise
    return conn, (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


def _http_get(
    url: str, headers: dict[str, str], timeout: float, rcvbuf: int, offset: int, method: str = "GET"
) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse, str]:
    """Send a request, following redirects; return the connection, the response and the final URL.

    Raises:
        SourceError: more than 5 redirects.
        OSError, http.client.HTTPException: connection failures (the caller retries).
    """
    headers = {"User-Agent": "tarindex", "Accept-Encoding": "identity", **headers}
    for _ in range(_MAX_REDIRECTS + 1):
        conn, target = _http_connect(url, timeout, rcvbuf)
        try:
            conn.request(method, target, headers=headers)
            resp = conn.getresponse()
        except BaseException:
            conn.close()
            raise
        if resp.status in _REDIRECTS and resp.getheader("Location"):
            url = urljoin(url, resp.getheader("Location", ""))
            resp.close()
            conn.close()
            continue
        return conn, resp, url
    raise SourceError(url, offset, f"more than {_MAX_REDIRECTS} redirects")


class HTTPSource(_Retrying):
    """``http://`` / ``https://`` with retries and ``Range`` resume at the byte reached.

    A plain-HTTP body of known length is read by the C walk from the socket itself (:meth:`direct`).

    A resumed request carries ``If-Range`` with the first response's ``ETag``
    (or ``Last-Modified``), so a shard that changed on the server is an error,
    never a spliced stream. A server that ignores ``Range`` is read again from
    the start and the bytes already delivered are skipped.
    """

    walks_direct = True

    def __init__(
        self, url: str, *, block_size: int = DEFAULT_BLOCK_SIZE, retries: int = 5, backoff: float = 0.5, timeout: float = 60.0
    ) -> None:
        super().__init__(url, block_size=block_size, retries=retries, backoff=backoff, timeout=timeout)
        self._validator: str | None = None

    def _open_at(self, start: int) -> _HTTPBody:
        headers = {}
        if start:
            headers["Range"] = f"bytes={start}-"
            if self._validator:
                headers["If-Range"] = self._validator
        conn, resp, _ = _http_get(self.url, headers, self.timeout, max(8 << 20, 4 * self.block_size), start)
        try:
            return self._accept(conn, resp, start)
        except BaseException:
            resp.close()
            conn.close()
            raise

    def _accept(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse, start: int) -> _HTTPBody:
        status = resp.status
        if status in (404, 410):
            raise ShardNotFoundError(f"{self.url}: no such shard (HTTP {status})")
        if status in _RETRYABLE_STATUS:
            raise ConnectionError(f"HTTP {status} {resp.reason}")
        body = _HTTPBody(conn, resp)
        if status == 200:
            if start == 0:
                self._first_response(resp)
            elif self._validator and (resp.getheader("ETag") or resp.getheader("Last-Modified")) != self._validator:
                raise SourceError(self.url, start, "shard changed on the server while it was being read")
            else:  # Range not supported: read again and skip what we have
                self._skip(body, start)
            return body
        if status == 206 and start:
            got = resp.getheader("Content-Range", "")
            if not got.startswith(f"bytes {start}-"):
                raise SourceError(self.url, start, f"server answered Range bytes={start}- with Content-Range {got!r}")
            return body
        raise SourceError(self.url, start, f"HTTP {status} {resp.reason}")

    def direct(self) -> tuple[int, int, int] | None:
        """The current body's socket for the C walk (see :meth:`_HTTPBody.direct`), or ``None``
        (not connected, HTTPS, chunked); what it reads is reported with :meth:`advance`."""
        body = self._stream
        if body is None or self._closed:
            return None
        got: tuple[int, int, int] | None = body.direct()
        return got

    def advance(self, n: int) -> None:
        """``n`` bytes of the body were read from the socket directly."""
        self._stream.advance(n)
        self.position += n

    def _first_response(self, resp: http.client.HTTPResponse) -> None:
        length = resp.getheader("Content-Length")
        self.size = int(length) if length and length.isdigit() else None
        self._validator = resp.getheader("ETag") or resp.getheader("Last-Modified")
        self.mtime_ns = _http_mtime(resp)

    def _skip(self, body: _HTTPBody, n: int) -> None:
        while n:
            got = len(body.read(min(n, self.block_size)))
            if not got:
                raise ConnectionError(f"stream ended {n} bytes before the resume point")
            n -= got


class RangeReader:
    """Random reads of an HTTP(S) shard: ``read_at(offset, size)`` with ``Range`` requests.

    One kept-alive connection per reader (per process), reconnected and
    retried with backoff on failure. Every request carries ``If-Range`` with
    the shard's ``ETag`` (or ``Last-Modified``), so a shard that changed on
    the server is a :class:`~tarindex.errors.StaleIndexError`, never bytes of
    another version.

    Raises:
        ShardNotFoundError: HTTP 404 or 410.
        SourceError: the server does not answer with ranges, or fails after the retries.
    """

    def __init__(self, url: str, *, retries: int = 5, backoff: float = 0.5, timeout: float = 60.0) -> None:
        self.url = url
        self.retries = retries
        self.backoff = backoff
        self.timeout = timeout
        self._conn: http.client.HTTPConnection | None = None
        self._target = ""
        self._final = url
        self._validator: str | None = None
        self.size = -1
        self.mtime_ns = 0
        first = self._request("GET", {"Range": "bytes=0-0"}, 0)  # GET, not HEAD: presigned URLs allow GET only
        if first.status == 206:
            total = first.getheader("Content-Range", "").rpartition("/")[2]
            self.size = int(total) if total.isdigit() else -1
            first.read()
        elif first.status == 200:  # no Range support: read_at will say so; the body is not wanted
            length = first.getheader("Content-Length")
            self.size = int(length) if length and length.isdigit() else -1
            self.close()
        else:
            first.read()
            raise SourceError(url, 0, f"HTTP {first.status} {first.reason}")
        self._validator = first.getheader("ETag") or first.getheader("Last-Modified")
        self.mtime_ns = _http_mtime(first)

    def _request(self, method: str, headers: dict[str, str], offset: int) -> http.client.HTTPResponse:
        failures = 0
        while True:
            try:
                if self._conn is None:
                    self._conn, resp, self._final = _http_get(self._final, headers, self.timeout, 1 << 20, offset, method)
                    self._target = urlsplit(self._final).path or "/"
                    if urlsplit(self._final).query:
                        self._target += "?" + urlsplit(self._final).query
                else:
                    self._conn.request(method, self._target, headers={"User-Agent": "tarindex", **headers})
                    resp = self._conn.getresponse()
                if resp.status in (404, 410):
                    resp.read()
                    raise ShardNotFoundError(f"{self.url}: no such shard (HTTP {resp.status})")
                if resp.status in _RETRYABLE_STATUS:
                    resp.read()
                    raise ConnectionError(f"HTTP {resp.status} {resp.reason}")
                return resp
            except TarIndexError:
                raise
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                failures += 1
                if failures > self.retries:
                    raise SourceError(
                        self.url, offset, f"read failed after {self.retries} retries ({type(exc).__name__}: {exc})"
                    ) from exc
                if failures > 1:  # a kept-alive connection the server closed is retried at once
                    time.sleep(min(self.backoff * 2 ** (failures - 2), 30.0))

    def read_at(self, offset: int, size: int) -> bytes:
        """``size`` bytes at ``offset`` (fewer at the end of the shard).

        Raises:
            StaleIndexError: the shard changed on the server since this reader opened it.
            SourceError: no ``Range`` support, or failures after the retries.
        """
        if size <= 0:
            return b""
        headers = {"Range": f"bytes={offset}-{offset + size - 1}"}
        if self._validator:
            headers["If-Range"] = self._validator
        failures = 0
        while True:
            resp = self._request("GET", headers, offset)
            try:
                data = resp.read()
            except (OSError, http.client.HTTPException) as exc:  # cut short: once more, on a new connection
                self.close()
                failures += 1
                if failures > self.retries:
                    raise SourceError(self.url, offset, f"read failed after {self.retries} retries ({exc})") from exc
                continue
            if resp.status == 206:
                return data
            if resp.status == 416:
                return b""
            self.close()  # a whole body follows, or an error: not a connection to keep
            if resp.status == 200:
                if self._validator and (resp.getheader("ETag") or resp.getheader("Last-Modified")) != self._validator:
                    raise StaleIndexError(self.url, "the server has a new version (ETag or Last-Modified)")
                raise SourceError(self.url, offset, "the server does not answer Range requests")
            raise SourceError(self.url, offset, f"HTTP {resp.status} {resp.reason}")

    def close(self) -> None:
        """Close the connection (it reopens on the next read)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def __getstate__(self) -> dict[str, Any]:  # a connection does not cross processes
        return {**self.__dict__, "_conn": None}


def _http_mtime(resp: http.client.HTTPResponse) -> int:
    modified = resp.getheader("Last-Modified")
    if not modified:
        return 0
    try:
        return int(email.utils.parsedate_to_datetime(modified).timestamp()) * 1_000_000_000
    except (TypeError, ValueError):
        return 0


class FsspecSource(_Retrying):
    """Any other ``scheme://`` through :mod:`fsspec` (``s3://``, ``gs://``, ...), reopened at the byte reached."""

    def __init__(
        self,
        url: str,
        *,
        block_size: int = DEFAULT_BLOCK_SIZE,
        retries: int = 5,
        backoff: float = 0.5,
        timeout: float = 60.0,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(url, block_size=block_size, retries=retries, backoff=backoff, timeout=timeout)
        self.storage_options = dict(storage_options or {})

    def _open_at(self, start: int) -> BinaryIO:
        try:
            import fsspec  # type: ignore[import-untyped]  # optional, no stubs
        except ImportError as exc:
            raise SourceError(self.url, 0, "fsspec is not installed: pip install 'tarindex[s3]'") from exc
        try:
            fs, path = fsspec.core.url_to_fs(self.url, **self.storage_options)
        except (ImportError, ValueError) as exc:
            raise SourceError(self.url, 0, f"no fsspec filesystem for this URL ({exc})") from exc
        try:
            if start == 0:
                info = fs.info(path)
                self.size = info.get("size")
                modified = info.get("LastModified") or info.get("mtime")
                if hasattr(modified, "timestamp"):
                    self.mtime_ns = int(modified.timestamp() * 1e9)
            f: BinaryIO = fs.open(path, "rb", block_size=self.block_size)
        except FileNotFoundError as exc:
            raise ShardNotFoundError(f"{self.url}: no such shard") from exc
        if start:
            f.seek(start)
        return f


def open_source(
    url: str,
    *,
    block_size: int = DEFAULT_BLOCK_SIZE,
    retries: int = 5,
    backoff: float = 0.5,
    timeout: float = 60.0,
    storage_options: dict[str, Any] | None = None,
    read_ahead: int | None = None,
) -> Source:
    """Open a shard name as a sequential :class:`Source` (see the module docstring).

    Args:
        url: local path, ``-``, ``pipe:COMMAND``, ``http(s)://...`` or an fsspec URL.
        block_size: bytes per read (default 1 MiB).
        retries: network reconnections allowed without progress before giving up.
        backoff: seconds before the first retry; doubled on each further one (at most 30).
        timeout: socket timeout in seconds (HTTP).
        storage_options: keyword arguments for the fsspec filesystem (credentials, ``endpoint_url``...).
        read_ahead: blocks a reader thread keeps ready (0: no thread); default :attr:`Source.prefetch` (8).

    Raises:
        ShardNotFoundError: a local shard does not exist (remote ones fail on first read).
    """
    source = _open(url, block_size, retries, backoff, timeout, storage_options)
    if read_ahead is not None:
        source.prefetch = read_ahead
    return source


def _open(
    url: str, block_size: int, retries: int, backoff: float, timeout: float, storage_options: dict[str, Any] | None
) -> Source:
    if url == "-":
        return StdinSource(url, block_size=block_size)
    if url.startswith("pipe:"):
        return PipeSource(url, block_size=block_size)
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme in ("http", "https"):
        return HTTPSource(url, block_size=block_size, retries=retries, backoff=backoff, timeout=timeout)
    if scheme == "file":
        return FileSource(url[len("file://") :], block_size=block_size)
    if scheme:
        return FsspecSource(
            url, block_size=block_size, retries=retries, backoff=backoff, timeout=timeout, storage_options=storage_options
        )
    return FileSource(url, block_size=block_size)


def iter_archive(chunks: Iterable[Any], url: str, *, frames: list[Any] | None = None) -> Iterator[bytes]:
    """The uncompressed tar stream of a source's chunks: zstd is detected by its first bytes and decompressed.

    ``frames``, when given, receives the frame table of a zstd stream (see
    :func:`tarindex.zstd.iter_decompressed`) and stays empty for a plain tar.

    Raises:
        CorruptArchiveError: bad zstd data.
    """
    chunks = iter(chunks)
    first = next(chunks, None)
    if first is None:
        return
    if is_zstd(bytes(first[:4])):
        yield from iter_decompressed(itertools.chain((first,), chunks), url, frames=frames)
    else:
        yield first
        yield from chunks
