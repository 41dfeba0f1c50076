"""HTTP(S): sequential sources with retries and ``Range`` resume, random reads of URL shards, batches of ranges.

Every failure goes through the one retry policy (:mod:`tarindex._retry`); every option comes from one
:class:`~tarindex.options.SourceOptions`. HTTP(S) honours ``HTTP_PROXY``/``HTTPS_PROXY``/``NO_PROXY``
and the caller's ``headers``. Re-exported by :mod:`tarindex.sources`; every name here is reached through it.
"""

from __future__ import annotations

import atexit
import base64
import email.utils
import http.client
import selectors
import socket
import ssl
import struct
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import unquote, urljoin, urlsplit

from ._process import FORK
from ._ranges import ReadAt
from ._retry import RETRYABLE_STATUS, Transient, parse_retry_after
from ._sourcebase import Source, _reads
from .errors import NO_RANGES, ShardNotFoundError, SourceError, StaleIndexError, TarIndexError
from .naming import ShardRef
from .options import SourceOptions

__all__ = ["HTTPSource", "RangeReader", "credentials_follow", "http_status_error", "without_credentials"]

_REDIRECTS = frozenset((301, 302, 303, 307, 308))
_MAX_REDIRECTS = 5


class _Retrying(Source):
    """Shared retry loop: reconnect at ``position`` after a failure, under the one retry policy."""

    def __init__(self, url: str, options: SourceOptions | None = None) -> None:
        self.options = options or SourceOptions()
        super().__init__(url, block_size=self.options.block_size)
        self.policy = self.options.retry
        self.timeout = self.options.timeout
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
            except Exception as exc:
                self._drop()
                if self._closed and not isinstance(exc, TarIndexError):  # the consumer stopped: our own doing
                    break
                self._failed(exc)
        return b""

    def _failed(self, exc: Exception) -> None:
        """Count a failure (a fresh budget after progress) and wait before the next try.

        Raises:
            TarIndexError: not found, changed on the server, a refused connection, or the retries spent.
        """
        if self.position != self._failed_at:
            self._failures, self._failed_at = 0, self.position
        self._failures += 1
        self.policy.check(exc, self._failures, self.url, self.position)
        time.sleep(self.policy.delay(self._failures, exc))

    def _chunks(self) -> Iterator[bytes]:
        return _reads(self.read, self.block_size)

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
        self.fresh = True  # with sock: http.client may hold bytes it read with the headers ...
        self.head = b""  # ... which the first read takes out, all of them
        self.timed_out = False  # with sock: the C walk's wait for bytes timed out

    def read(self, n: int) -> bytes:
        if self.sock is None:
            data = self.resp.read(n)
            if not data and self.resp.length:  # http.client returns b"" when Content-Length is not met
                raise http.client.IncompleteRead(b"", self.resp.length)
            return data
        if self.fresh:  # all that http.client's reader holds (or one read of it), then the socket itself
            self.fresh = False
            fp = self.resp.fp
            self.head = fp.read1(len(fp.peek())) if fp is not None and self.left else b""
            self.left -= len(self.head)
        if self.head:
            data, self.head = self.head[:n], self.head[n:]
            return data
        if not self.left:
            return b""
        if self.timed_out:  # the C walk already waited the socket's timeout for these bytes
            raise TimeoutError(f"no data for {self.sock.gettimeout()} s")
        data = self.sock.recv(min(n, self.left))
        if not data:
            raise http.client.IncompleteRead(b"", self.left)
        self.left -= len(data)
        return data

    def direct(self) -> tuple[int, int, int] | None:
        """``(fd, bytes left, timeout in ms or -1)`` for reads that bypass Python (report them with
        :meth:`advance`), or ``None``: HTTPS, chunked, until :meth:`read` has returned every byte
        http.client buffered, or after a timed-out wait (the next :meth:`read` raises)."""
        if self.sock is None or self.fresh or self.head or self.timed_out:
            return None
        timeout = self.sock.gettimeout()
        return self.sock.fileno(), self.left, -1 if timeout is None else int(timeout * 1000)

    def advance(self, n: int, timed_out: bool = False) -> None:
        self.left -= n
        self.timed_out = timed_out

    def close(self) -> None:
        sock = self.conn.sock
        if sock is not None:  # wakes a read blocked in another thread (closing alone does not)
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.resp.close()
        self.conn.close()


class _ProxiedConnection(http.client.HTTPConnection):
    """A connection to a plain-HTTP proxy, with the proxy's credentials sent on every request."""

    proxy_headers: dict[str, str]


def _proxy_for(scheme: str, host: str) -> str | None:
    """The proxy URL for ``scheme://host`` from ``HTTP_PROXY``/``HTTPS_PROXY`` (any case), unless ``NO_PROXY`` exempts it."""
    import urllib.request  # only when a URL is opened: it costs milliseconds at import

    proxy = urllib.request.getproxies_environment().get(scheme)
    if not proxy or urllib.request.proxy_bypass(host):
        return None
    return proxy if ShardRef.of(proxy).url else "http://" + proxy


def _http_connect(url: str, timeout: float, rcvbuf: int) -> tuple[http.client.HTTPConnection, str]:
    """A connected ``HTTP(S)Connection`` for ``url`` and the request target (path and query; the whole URL
    through an HTTP proxy), through the environment's proxy if any (HTTPS: a ``CONNECT`` tunnel)."""
    parts = urlsplit(url)
    host = parts.hostname or "localhost"
    https = ShardRef.of(url).secure
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    proxy = _proxy_for(parts.scheme, host)
    if proxy is None:
        cls = http.client.HTTPSConnection if https else http.client.HTTPConnection
        conn = cls(host, parts.port, timeout=timeout)
    else:
        via = urlsplit(proxy)
        auth = {}
        if via.username:
            token = base64.b64encode(f"{unquote(via.username)}:{unquote(via.password or '')}".encode()).decode()
            auth["Proxy-Authorization"] = f"Basic {token}"
        if https:
            conn = http.client.HTTPSConnection(via.hostname or "localhost", via.port, timeout=timeout)
            conn.set_tunnel(host, parts.port, headers=auth)
        else:
            conn = _ProxiedConnection(via.hostname or "localhost", via.port, timeout=timeout)
            conn.proxy_headers = auth
            target = url  # an HTTP proxy takes the absolute URL
    try:
        conn.connect()
        # a large receive window: measured 1.6 -> 2.3 GB/s from loopback nginx
        conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    except BaseException:
        conn.close()
        raise
    return conn, target


def http_status_error(url: str, status: int, reason: str, retry_after: str | None, offset: int) -> Exception:
    """The error of a failed HTTP answer: 404/410 -> :class:`ShardNotFoundError`, 401/403 -> a
    :class:`SourceError` about credentials, a retryable status -> :class:`~tarindex._retry.Transient`."""
    if status in (404, 410):
        return ShardNotFoundError(f"{url}: no such shard (HTTP {status})")
    if status in (401, 403):
        return SourceError(url, offset, f"HTTP {status} {reason}: access denied (check the credentials or headers=)")
    if status in RETRYABLE_STATUS:
        return Transient(f"HTTP {status} {reason}", parse_retry_after(retry_after))
    return SourceError(url, offset, f"HTTP {status} {reason}")


def _http_get(
    url: str, headers: dict[str, str], timeout: float, rcvbuf: int, offset: int, method: str = "GET"
) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse, str, str, bool]:
    """Send a request, following redirects; return the connection, the response, the final URL, the
    request target of that URL on this connection, and whether the caller's credentials went to the final
    URL (``headers`` are for ``url``; each redirect that :func:`credentials_follow` refuses drops them, for
    every later hop too, as requests does).

    Raises:
        SourceError: more than 5 redirects.
        OSError, http.client.HTTPException: connection failures (the caller retries).
    """
    kept = True
    for _ in range(_MAX_REDIRECTS + 1):
        conn, target = _http_connect(url, timeout, rcvbuf)
        try:
            conn.request(method, target, headers=_request_headers(conn, headers if kept else without_credentials(headers)))
            resp = conn.getresponse()
        except BaseException:
            conn.close()
            raise
        if resp.status in _REDIRECTS and resp.getheader("Location"):
            after = urljoin(url, resp.getheader("Location", ""))
            kept = kept and credentials_follow(url, after)
            url = after
            resp.close()
            conn.close()
            continue
        return conn, resp, url, target, kept
    raise SourceError(url, offset, f"more than {_MAX_REDIRECTS} redirects")


_CREDENTIALS = ("authorization", "cookie")
_DEFAULT_PORTS = {"http": 80, "https": 443}


def credentials_follow(given_for: str, url: str) -> bool:
    """Whether credentials (``Authorization``, ``Cookie``) given for ``given_for`` may go to ``url``, the
    target of a redirect from it or the next page of its listing: only on the same scheme, host and
    port (a default port written or not), as requests' ``should_strip_auth`` decides, never to
    another host (a Hugging Face file's CDN, a presigned store URL) or scheme (an ``https`` URL
    redirected to ``http`` would send them in the clear). The one exception is requests' too: ``http``
    on port 80 to ``https`` on port 443 of the same host, an upgrade that sends nothing in the clear
    that the first request did not."""
    a, b = urlsplit(given_for), urlsplit(url)
    ra, rb = ShardRef.of(given_for), ShardRef.of(url)
    try:
        ports = (a.port or _DEFAULT_PORTS.get(ra.scheme)), (b.port or _DEFAULT_PORTS.get(rb.scheme))
    except ValueError:  # a port that is not a number: not the same place
        return False
    if a.hostname is None or a.hostname != b.hostname:  # (hostname is in lower case)
        return False
    return (ra.scheme == rb.scheme and ports[0] == ports[1]) or (ra.cleartext and rb.secure and ports == (80, 443))


def without_credentials(headers: Mapping[str, str]) -> dict[str, str]:
    """``headers`` without ``Authorization`` and ``Cookie`` (any case)."""
    return {k: v for k, v in headers.items() if k.lower() not in _CREDENTIALS}


def _request_headers(conn: http.client.HTTPConnection | None, headers: dict[str, str]) -> dict[str, str]:
    """Our defaults, the caller's headers, and a plain-HTTP proxy's credentials."""
    extra = conn.proxy_headers if isinstance(conn, _ProxiedConnection) else {}
    return {"User-Agent": "tarindex", "Accept-Encoding": "identity", **headers, **extra}


class HTTPSource(_Retrying):
    """``http://`` / ``https://`` with retries and ``Range`` resume at the byte reached.

    A plain-HTTP body of known length is read by the C walk from the socket itself (:meth:`direct`).

    A resumed request carries ``If-Range`` with the first response's ``ETag``
    (or ``Last-Modified``), so a shard that changed on the server is an error,
    never a spliced stream. A server that ignores ``Range`` is read again from
    the start and the bytes already delivered are skipped.
    """

    walks_direct = True

    def __init__(self, url: str, options: SourceOptions | None = None) -> None:
        super().__init__(url, options)
        self._validator: str | None = None
        self.etag: str | None = None

    def _open_at(self, start: int) -> _HTTPBody:
        headers = dict(self.options.headers)
        if start:
            headers["Range"] = f"bytes={start}-"
            if self._validator:
                headers["If-Range"] = self._validator
        conn, resp, *_ = _http_get(self.url, headers, self.timeout, max(8 << 20, 4 * self.block_size), start)
        try:
            return self._accept(conn, resp, start)
        except BaseException:
            resp.close()
            conn.close()
            raise

    def _accept(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse, start: int) -> _HTTPBody:
        status = resp.status
        if status not in (200, 206):
            raise http_status_error(self.url, status, resp.reason, resp.getheader("Retry-After"), start)
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
        raise SourceError(self.url, start, f"HTTP {status} {resp.reason} to a request from byte 0")

    def direct(self) -> tuple[int, int, int] | None:
        """The current body's socket for the C walk (see :meth:`_HTTPBody.direct`), or ``None``
        (not connected, HTTPS, chunked); what it reads is reported with :meth:`advance`."""
        body = self._stream
        if body is None or self._closed:
            return None
        got: tuple[int, int, int] | None = body.direct()
        return got

    def advance(self, n: int, timed_out: bool = False) -> None:
        """``n`` bytes of the body were read from the socket directly; ``timed_out``: then the wait
        for more timed out, and the next :meth:`read` retries at once (no second wait)."""
        self._stream.advance(n, timed_out)
        self.position += n

    def _first_response(self, resp: http.client.HTTPResponse) -> None:
        length = resp.getheader("Content-Length")
        self.size = int(length) if length and length.isdigit() else None
        self._validator = resp.getheader("ETag") or resp.getheader("Last-Modified")
        self.etag = resp.getheader("ETag")
        self.mtime_ns = _http_mtime(resp)

    def _skip(self, body: _HTTPBody, n: int) -> None:
        while n:
            got = len(body.read(min(n, self.block_size)))
            if not got:
                raise ConnectionError(f"stream ended {n} bytes before the resume point")
            n -= got


_MAX_HEAD = 64 << 10  # an answer's status line and headers, at most
_RAW = sys.platform != "win32" and hasattr(socket, "MSG_WAITALL")  # where the raw path below is used


class _NotPlain(Exception):
    """An answer the raw path does not read (no ``Content-Length``, or a transfer coding): use http.client."""


class _RawConnection:
    """A kept-alive plain-HTTP connection spoken to directly, for ranged ``GET`` requests.

    A request is written with one ``send``; the answer's head is peeked, parsed and taken off the
    socket; the body (a ``Content-Length``) comes in one ``recv(n, MSG_WAITALL)``, a single copy into
    the returned ``bytes``. The socket is blocking with ``SO_RCVTIMEO``/``SO_SNDTIMEO`` set to the
    timeout, so a wait that long without a byte fails (and is retried). HTTPS, proxies and chunked
    answers go through http.client.
    """

    def __init__(self, host: str, port: int, timeout: float) -> None:
        sock = socket.create_connection((host, port), timeout=timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(None)  # blocking: MSG_WAITALL waits in the kernel, bounded by SO_RCVTIMEO
            whole = int(timeout)
            tv = struct.pack("ll", whole, int((timeout - whole) * 1_000_000))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
        except BaseException:
            sock.close()
            raise
        self.sock = sock

    def exchange(self, request: bytes) -> tuple[int, str, dict[str, str], bool]:
        """Send ``request``; its :meth:`answer`.

        Raises:
            OSError, http.client.HTTPException: the connection failed or the answer is not HTTP.
        """
        self.sock.sendall(request)
        return self.answer()

    def answer(self) -> tuple[int, str, dict[str, str], bool]:
        """The next answer's status, reason, headers (names in lower case) and whether the connection
        stays open after its body, which is next on the socket (1xx answers skipped).

        Raises:
            OSError, http.client.HTTPException: the connection failed or the answer is not HTTP.
        """
        while True:
            lines = self._head().decode("latin-1").split("\r\n")
            version, _, rest = lines[0].partition(" ")
            code, _, reason = rest.partition(" ")
            if not version.startswith("HTTP/") or not code.isdigit():
                raise http.client.BadStatusLine(lines[0])
            status = int(code)
            if 100 <= status < 200:
                continue
            headers: dict[str, str] = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            connection = headers.get("connection", "").lower()
            keep = "close" not in connection if version != "HTTP/1.0" else "keep-alive" in connection
            return status, reason, headers, keep

    def _recv(self, n: int, flags: int = 0) -> bytes:
        try:
            return self.sock.recv(n, flags)
        except BlockingIOError as exc:  # SO_RCVTIMEO ran out without a byte
            raise TimeoutError("no data within the timeout") from exc

    def _head(self) -> bytes:
        """The next answer's status line and headers, taken off the socket (the body stays)."""
        peek = b""
        while True:
            if peek and len(self._recv(len(peek) + 1, socket.MSG_PEEK | socket.MSG_WAITALL)) <= len(peek):
                raise ConnectionError("connection closed in an answer's head")  # (a timeout raised already)
            peek = self._recv(_MAX_HEAD, socket.MSG_PEEK)  # all that has come, nothing taken yet
            if not peek:
                raise ConnectionError("connection closed before an answer")
            end = peek.find(b"\r\n\r\n")
            if end >= 0:
                want = end + 4
                while want:  # taken off the socket (they are there: one call, in practice)
                    got = len(self.sock.recv(want))
                    if not got:
                        raise ConnectionError("connection closed in an answer's head")
                    want -= got
                return peek[:end]
            if len(peek) >= _MAX_HEAD:
                raise http.client.LineTooLong(f"answer's head over {_MAX_HEAD} bytes")

    def body(self, length: int) -> bytes:
        """The next ``length`` bytes (the body).

        Raises:
            http.client.IncompleteRead: the connection ended first.
            TimeoutError: no byte for the timeout.
        """
        data = self._recv(length, socket.MSG_WAITALL)
        if len(data) == length:
            return data
        parts, got = [data], len(data)
        while got < length:  # cut by a signal, the timeout after some progress, or the end of the connection
            more = self._recv(length - got, socket.MSG_WAITALL)
            if not more:
                raise http.client.IncompleteRead(b"".join(parts), length - got)
            parts.append(more)
            got += len(more)
        return b"".join(parts)

    def close(self) -> None:
        self.sock.close()


def _range_line(offset: int, size: int) -> bytes:
    return f"Range: bytes={offset}-{offset + size - 1}\r\n\r\n".encode()


def _raw_batch(requests: Sequence[tuple[Any, int, int]], todo: list[int], max_in_flight: int, out: list[bytes | None]) -> None:
    """Read ``requests[k]`` for each ``k`` in ``todo`` (readers on the raw path) into ``out[k]``, with up to
    ``max_in_flight`` raw connections each carrying one request, driven from this thread by a selector.

    A fast path, not the last word: a request that fails or is not answered by a plain ``206`` (an error
    status, a refused connection, a timeout, a connection cut) is left ``None`` in ``out``, for
    :meth:`RangeReader.read_at` to read again under the retry policy and raise the error it names.
    """
    waiting = todo[::-1]  # taken from the end: in the order given
    timeout = max(requests[k][0].options.timeout for k in todo)
    sel = selectors.DefaultSelector()

    def start(conn: _RawConnection | None, origin: str) -> None:
        """Send the next waiting request, on ``conn`` if it is one to the same server."""
        while waiting:
            k = waiting.pop()
            reader, offset, size = requests[k]
            if conn is not None and origin != reader._final:
                _return_connection(origin, conn, raw=True)
                conn = None
            try:
                if conn is None:
                    host, port = reader._address
                    conn = _take_connection(reader._final, raw=True) or _RawConnection(host, port, reader.options.timeout)
                conn.sock.sendall(reader._raw + _range_line(offset, size))
            except (OSError, http.client.HTTPException):
                if conn is not None:
                    conn.close()
                conn = None
                continue  # left to read_at
            sel.register(conn.sock, selectors.EVENT_READ, (conn, k))
            return
        if conn is not None:
            _return_connection(origin, conn, raw=True)

    try:
        for _ in range(min(max_in_flight, len(todo))):
            start(None, "")
        while sel.get_map():
            ready = sel.select(timeout)
            if not ready:  # nothing for the timeout: every request in flight is left to read_at
                break
            for key, _ in ready:
                conn, k = key.data
                sel.unregister(conn.sock)
                reader, offset, _ = requests[k]
                keep = False
                try:
                    status, _, headers, keep = conn.answer()
                    length = headers.get("content-length", "")
                    if status == 206 and length.isdigit() and "transfer-encoding" not in headers:
                        data = conn.body(int(length))
                        if headers.get("content-range", "").startswith(f"bytes {offset}-"):
                            out[k] = data
                        else:
                            keep = False  # read_at raises the error naming the range
                    else:
                        keep = False  # nothing of the body read
                except (OSError, http.client.HTTPException):
                    keep = False
                if not keep:
                    conn.close()
                start(conn if keep else None, reader._final)
    finally:
        for key in list(sel.get_map().values()):
            key.data[0].close()
        sel.close()


def _raw_head(url: str, headers: dict[str, str]) -> bytes | None:
    """The fixed part of a ranged ``GET`` of ``url`` on a :class:`_RawConnection` (the ``Range`` line and the
    blank line follow), or ``None`` where the raw path does not apply: HTTPS, a proxy, a header with a line break."""
    parts = urlsplit(url)
    if not _RAW or not ShardRef.of(url).cleartext or _proxy_for("http", parts.hostname or "localhost") is not None:
        return None
    fields = {"Host": parts.netloc.rpartition("@")[2], **_request_headers(None, headers)}
    if any(c in k + v for k, v in fields.items() for c in "\r\n\0"):
        return None  # http.client refuses such a header with its own error
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    try:
        return (f"GET {target} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields.items())).encode("latin-1")
    except UnicodeEncodeError:  # http.client refuses it with its own error
        return None


class RangeReader:
    """Random reads of an HTTP(S) shard: ``read_at(offset, size)`` with ``Range`` requests.

    Kept-alive connections are shared by every reader of the same server in a process (a pool per
    origin, made anew after ``fork``): a request takes an idle connection or opens one, and gives it
    back when its answer is read, so connections number the requests in flight, not shards times
    threads. Failures are retried under the one retry policy. Every request carries ``If-Range`` with
    the shard's ``ETag`` (or ``Last-Modified``), so a shard that changed on the server is a
    :class:`~tarindex.errors.StaleIndexError`, never bytes of another version. :meth:`read_many`
    reads many ranges at once, ``max_in_flight`` requests in flight. Plain HTTP without a proxy is
    spoken on raw sockets (:class:`_RawConnection`; a batch from one thread through a selector); HTTPS,
    proxies and answers without ``Content-Length`` through http.client (a batch in threads).

    Raises:
        ShardNotFoundError: HTTP 404 or 410.
        SourceError: the server does not answer with ranges, or fails after the retries.
    """

    def __init__(self, url: str, options: SourceOptions | None = None) -> None:
        self.url = url
        self.options = options or SourceOptions()
        self.policy = self.options.retry
        self._final = url
        self._target = ""
        self._credentials = True  # whether the caller's credentials go to _final (no redirect took them away)
        self._validator: str | None = None
        self.size = -1
        self.mtime_ns = 0
        self.etag: str | None = None
        self.ranges = False
        """Whether the server answered the first request's ``Range`` with that range (``206``)."""
        first = self.policy.call(self._probe, url, 0)  # GET, not HEAD: presigned URLs allow GET only
        self._validator = first.getheader("ETag") or first.getheader("Last-Modified")
        self.etag = first.getheader("ETag")
        self.mtime_ns = _http_mtime(first)
        self._raw: bytes | None = None
        self._address = ("localhost", 80)
        self._go_raw()

    def _go_raw(self) -> None:
        """Plain HTTP without a proxy: ranged reads on raw kept-alive sockets (docs/performance.md: several
        times cheaper per request than http.client) to the URL the probe's redirects, if any, led to."""
        ours = {k: v for k, v in self._headers().items() if k.lower() not in ("range", "if-range")}
        self._raw = _raw_head(self._final, {**ours, **({"If-Range": self._validator} if self._validator else {})})
        final = urlsplit(self._final)
        self._address = (final.hostname or "localhost", final.port or 80)

    def _expired(self, status: int) -> bool:
        """A 401 or 403 from the URL a redirect named (a presigned or CDN URL, as the Hub's, that expired):
        the original URL is asked again now and its new redirect taken; the caller then tries again
        (``Transient``). ``False`` when there was no redirect (the error stands)."""
        if status not in (401, 403) or self._final == self.url:
            return False
        self._final, self._target, self._credentials = self.url, "", True
        self._probe()
        self._go_raw()
        return True

    def _probe(self) -> http.client.HTTPResponse:
        conn, first = self._request({"Range": "bytes=0-0"}, 0)
        if first.status == 206:
            first.read()
            got = first.getheader("Content-Range", "")
            total = got.rpartition("/")[2]
            self.size = int(total) if total.isdigit() else -1
            self.ranges = got.startswith("bytes 0-")
            self._give_back(conn, first)
        elif first.status == 200:  # no Range support: read_at will say so; the body (the whole shard) is not read
            length = first.getheader("Content-Length")
            self.size = int(length) if length and length.isdigit() else -1
            first.close()  # the response holds the socket too: both closed, or it outlives the connection
            conn.close()
        else:
            first.close()
            conn.close()
            raise http_status_error(self.url, first.status, first.reason, first.getheader("Retry-After"), 0)
        return first

    def _request(self, headers: dict[str, str], offset: int) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """One request, on an idle pooled connection to the server or a new one, with the caller's
        headers from the options; not retried here (but a pooled connection the server closed is
        replaced once)."""
        headers = {**self._headers(), **headers}
        conn = _take_connection(self._final) if self._target else None
        if conn is not None:
            try:
                conn.request("GET", self._target, headers=_request_headers(conn, headers))
                return conn, conn.getresponse()
            except (OSError, http.client.HTTPException):  # closed by the server while idle: a new one
                conn.close()
        conn, resp, self._final, self._target, kept = _http_get(self._final, headers, self.options.timeout, 1 << 20, offset)
        self._credentials = self._credentials and kept
        return conn, resp

    def _headers(self) -> dict[str, str]:
        """The caller's headers for a request to the URL the redirects led to: without credentials once a
        redirect went to another scheme or host (:func:`credentials_follow`)."""
        return dict(self.options.headers) if self._credentials else without_credentials(self.options.headers)

    def _give_back(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse) -> None:
        if resp.will_close:
            conn.close()
        else:
            _return_connection(self._final, conn)

    def _read_raw(self, head: bytes, offset: int, size: int) -> bytes:
        """:meth:`_read_once` on a raw connection (:class:`_RawConnection`).

        Raises:
            _NotPlain: the answer has no ``Content-Length`` (http.client reads it).
        """
        request = head + _range_line(offset, size)
        conn = _take_connection(self._final, raw=True)
        if conn is not None:
            try:
                status, reason, headers, keep = conn.exchange(request)
            except (OSError, http.client.HTTPException):  # closed by the server while idle: a new one
                conn.close()
                conn = None
        if conn is None:
            conn = _RawConnection(*self._address, self.options.timeout)
            try:
                status, reason, headers, keep = conn.exchange(request)
            except BaseException:
                conn.close()
                raise
        length = headers.get("content-length", "")
        if status != 206 or not length.isdigit() or "transfer-encoding" in headers:
            conn.close()  # nothing of the body read: not a connection to keep
            if status == 206:
                raise _NotPlain(f"206 without Content-Length ({headers.get('transfer-encoding')})")
            if status == 416:
                return b""
            if status == 200:
                if self._validator and (headers.get("etag") or headers.get("last-modified")) != self._validator:
                    raise StaleIndexError(self.url, "the server has a new version (ETag or Last-Modified)")
                raise SourceError(self.url, offset, NO_RANGES)
            if self._expired(status):
                raise Transient(f"HTTP {status} from the redirected URL: redirected again")
            raise http_status_error(self.url, status, reason, headers.get("retry-after"), offset)
        try:
            data: bytes = conn.body(int(length))
        except BaseException:
            conn.close()
            raise
        if keep:
            _return_connection(self._final, conn, raw=True)
        else:
            conn.close()
        got = headers.get("content-range", "")
        if not got.startswith(f"bytes {offset}-"):
            raise SourceError(self.url, offset, f"asked for bytes {offset}-{offset + size - 1}, got Content-Range {got!r}")
        return data

    def _read_once(self, offset: int, size: int) -> bytes:
        if self._raw is not None:
            try:
                return self._read_raw(self._raw, offset, size)
            except _NotPlain:
                self._raw = None  # this server's answers are for http.client
        headers = {"Range": f"bytes={offset}-{offset + size - 1}"}
        if self._validator:
            headers["If-Range"] = self._validator
        conn, resp = self._request(headers, offset)
        try:
            data = resp.read()
        except BaseException:
            resp.close()
            conn.close()
            raise
        if resp.status == 206:
            self._give_back(conn, resp)
            got = resp.getheader("Content-Range", "")
            if not got.startswith(f"bytes {offset}-"):
                raise SourceError(self.url, offset, f"asked for bytes {offset}-{offset + size - 1}, got Content-Range {got!r}")
            return data
        conn.close()  # a whole body, or an error: not a connection to keep
        if resp.status == 416:
            return b""
        if resp.status == 200:
            if self._validator and (resp.getheader("ETag") or resp.getheader("Last-Modified")) != self._validator:
                raise StaleIndexError(self.url, "the server has a new version (ETag or Last-Modified)")
            raise SourceError(self.url, offset, NO_RANGES)
        if self._expired(resp.status):
            raise Transient(f"HTTP {resp.status} from the redirected URL: redirected again")
        raise http_status_error(self.url, resp.status, resp.reason, resp.getheader("Retry-After"), offset)

    def read_at(self, offset: int, size: int) -> bytes:
        """``size`` bytes at ``offset`` (fewer at the end of the shard): one request.

        Raises:
            StaleIndexError: the shard changed on the server since it was indexed or opened.
            ShardNotFoundError: the shard is gone (HTTP 404 or 410).
            SourceError: no ``Range`` support, a refused connection, or failures after the retries.
        """
        if size <= 0:
            return b""
        return self.policy.call(lambda: self._read_once(offset, size), self.url, offset, size)

    def read_many(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """Every ``(offset, size)``, in order, as :func:`tarindex.objstore.read_many` reads a batch: neighbours
        in one request, ``options.max_in_flight`` requests at once.

        Raises:
            StaleIndexError, ShardNotFoundError, SourceError: as :meth:`read_at`, the first one met.
        """
        from .objstore import read_many  # the batch reader of every remote reader (it imports this module)

        return read_many([(self, offset, size) for offset, size in ranges], self.options)

    @staticmethod
    def fetch_many(requests: Sequence[tuple[ReadAt, int, int]], max_in_flight: int) -> list[bytes]:
        """``read_at`` of every ``(reader, offset, size)``, at most ``max_in_flight`` at once, in order.

        Raises:
            StaleIndexError, ShardNotFoundError, SourceError: as :meth:`read_at`, the first one met.
        """
        if len(requests) <= 1 or max_in_flight <= 1:
            return [r.read_at(o, n) for r, o, n in requests]
        out: list[bytes | None] = [None] * len(requests)
        raw = [k for k, (r, _, n) in enumerate(requests) if isinstance(r, RangeReader) and r._raw is not None and n > 0]
        if raw:  # plain HTTP: one thread, a selector over raw connections (measured in docs/performance.md)
            _raw_batch(requests, raw, max_in_flight, out)
        left = [k for k, data in enumerate(out) if data is None]
        if len(left) == 1:
            reader, offset, size = requests[left[0]]
            out[left[0]] = reader.read_at(offset, size)
        elif left:  # HTTPS, proxies, fsspec readers, and whatever the raw path left: threads, under the retry policy
            pool = _pool(max_in_flight)
            futures = [(k, pool.submit(requests[k][0].read_at, requests[k][1], requests[k][2])) for k in left]
            for k, future in futures:
                out[k] = future.result()
        return [data if data is not None else b"" for data in out]

    def fileno(self) -> None:
        """``None``: no descriptor's positional reads give these bytes (:class:`tarindex.access.reader.RandomReader`)."""
        return None

    def close(self) -> None:
        """Nothing to close: connections belong to the process's pool of the server."""


_IDLE: dict[tuple[int, str], list[Any]] = {}  # http.client connections, and _RawConnection ones under "raw:" origins
_IDLE_LOCK = threading.Lock()
_MAX_IDLE = 256  # per server: more than any batch keeps in flight


@atexit.register
def _close_idle() -> None:
    """Close the kept-alive connections at exit (quietly, not by the garbage collector)."""
    with _IDLE_LOCK:
        for idle in _IDLE.values():
            for conn in idle:
                conn.close()
        _IDLE.clear()


def _origin(url: str, raw: bool) -> tuple[int, str]:
    parts = urlsplit(url)
    return FORK[0], f"{'raw:' if raw else ''}{parts.scheme}://{parts.netloc}"


def _take_connection(url: str, *, raw: bool = False) -> Any:
    """An idle kept-alive connection of this process to ``url``'s server (a :class:`_RawConnection` with
    ``raw``, else an http.client one), or ``None``."""
    with _IDLE_LOCK:
        idle = _IDLE.get(_origin(url, raw))
        return idle.pop() if idle else None


def _return_connection(url: str, conn: Any, *, raw: bool = False) -> None:
    """Keep ``conn`` for the next request to ``url``'s server (closed if the pool is full)."""
    with _IDLE_LOCK:
        idle = _IDLE.setdefault(_origin(url, raw), [])
        if len(idle) < _MAX_IDLE:
            idle.append(conn)
            return
    conn.close()


_POOLS: dict[tuple[int, int], ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()


def _pool(workers: int) -> ThreadPoolExecutor:
    """This process's thread pool of ``workers`` threads for concurrent range requests (made anew after fork)."""
    key = (FORK[0], workers)
    with _POOLS_LOCK:
        pool = _POOLS.get(key)
        if pool is None:
            pool = _POOLS[key] = ThreadPoolExecutor(workers, thread_name_prefix="tarindex-range")
        return pool


def _http_mtime(resp: http.client.HTTPResponse) -> int:
    modified = resp.getheader("Last-Modified")
    if not modified:
        return 0
    try:
        return int(email.utils.parsedate_to_datetime(modified).timestamp()) * 1_000_000_000
    except (TypeError, ValueError):
        return 0
