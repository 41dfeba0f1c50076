"""Real servers on 127.0.0.1 for the network tests: nginx, a connection-dropping HTTP server, moto's S3,
and a fault-injecting HTTP proxy to put between a client and any of them.

Imported by conftest.py so the fixtures are visible to every test module.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import shutil
import socket
import socketserver
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

__all__ = [
    "AzureServer", "DropServer", "FaultProxy", "FramingServer", "HTTPServer", "SchemeServer", "azure_server", "drop_server",
    "fault_proxy", "framing_server", "http_server", "python_http_server", "s3_server", "scheme_server", "tls_certificate",
]  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, proc: subprocess.Popen[bytes] | None = None, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.05)
    return False


@dataclass
class HTTPServer:
    """A static file server over ``root``: nginx when it starts, else Python's ``http.server``."""

    root: Path
    port: int
    kind: str

    def url(self, name: str | Path) -> str:
        return f"http://127.0.0.1:{self.port}/{Path(name).relative_to(self.root).as_posix() if Path(name).is_absolute() else name}"


_NGINX_CONF = """
{user}
worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log;
events {{ worker_connections 256; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    sendfile on;
    tcp_nopush off;  # on: a 65-131 KB answer on loopback waits 20-40 ms for its last partial segment (measured)
    keepalive_requests 1000000;  # as object stores do: a kept-alive connection serves many requests
    types {{ application/x-tar tar; }}
    default_type application/octet-stream;
    server {{
        listen 127.0.0.1:{port};
        root {root};
        location / {{ }}
        location /gated/ {{  # as a gated Hugging Face dataset: a token in Authorization, else 401
            if ($http_authorization != "Bearer hf_test") {{ return 401; }}
        }}
        location /moved/ {{  # as the Hub's resolve URLs: the token checked, then a redirect to another host (a CDN)
            if ($http_authorization != "Bearer hf_test") {{ return 401; }}
            rewrite ^/moved/(.*)$ http://localhost:{port}/cdn/$1 redirect;
        }}
        location /cdn/ {{  # the CDN: a request that carries the token is refused (credentials never follow a redirect)
            if ($http_authorization) {{ return 400; }}
            alias {root}/;
        }}
    }}
}}
"""


def start_nginx(root: Path, tmp: Path) -> tuple[subprocess.Popen[bytes], int] | None:
    """nginx as a foreground child process with a generated config; ``None`` if it cannot start."""
    exe = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
    if exe is None:
        return None
    for _ in range(3):  # the free port may be taken between our probe and nginx's bind
        port = free_port()
        user = "user root;" if os.geteuid() == 0 else ""  # workers must read pytest's 0700 tmp dirs
        conf = tmp / "nginx.conf"
        conf.write_text(_NGINX_CONF.format(user=user, tmp=tmp, port=port, root=root))
        proc = subprocess.Popen(
            [exe, "-p", str(tmp), "-c", str(conf), "-e", str(tmp / "error.log")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        if wait_for_port(port, proc):
            return proc, port
        stop(proc)
    return None


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="session")
def http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HTTPServer]:
    """nginx on a free loopback port serving a temporary root; Python's http.server if nginx cannot start."""
    root = tmp_path_factory.mktemp("www")
    tmp = tmp_path_factory.mktemp("nginx")
    started = start_nginx(root, tmp)
    if started is not None:
        proc, port = started
        sys.stderr.write(f"\nHTTP test server: nginx on 127.0.0.1:{port}\n")
        yield HTTPServer(root, port, "nginx")
        stop(proc)
        return
    handler = lambda *a: _QuietHandler(*a, directory=str(root))  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    sys.stderr.write(f"\nHTTP test server: Python http.server on 127.0.0.1:{server.server_port} (nginx did not start)\n")
    yield HTTPServer(root, server.server_port, "http.server")
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="session")
def python_http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HTTPServer]:
    """``python -m http.server`` (no ``Range`` support: a ranged request gets the whole file) as a child
    process on a free loopback port, serving a temporary root: the server a user starts first."""
    root = tmp_path_factory.mktemp("plain-www")
    for _ in range(3):  # the free port may be taken between our probe and the server's bind
        port = free_port()
        cmd = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(root)]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if wait_for_port(port, proc):
            yield HTTPServer(root, port, "python -m http.server")
            stop(proc)
            return
        stop(proc)
    raise RuntimeError("python -m http.server did not start")


@dataclass
class DropServer:
    """Serves one file with Range support, but cuts the connection when the stream reaches byte ``drop_at``.

    ``mode="once"``: only the first request is cut; ``"always"``: every request is cut there.
    ``ranges=False`` ignores ``Range``; ``change_etag=True`` serves a new ``ETag`` after the first request;
    ``stall=S`` keeps the connection open S seconds before cutting it.
    """

    data: bytes
    drop_at: int
    mode: str = "once"
    port: int = 0
    ranges: bool = True
    change_etag: bool = False
    stall: float = 0.0
    requests: list[str | None] = field(default_factory=list)
    etag: str = '"v1"'

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/shard.tar"


def _drop_handler(state: DropServer) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            rng = self.headers.get("Range")
            state.requests.append(rng)
            data = state.data
            if state.change_etag and len(state.requests) > 1:
                state.etag = '"v2"'
            ranged = bool(rng) and state.ranges and self.headers.get("If-Range", state.etag) == state.etag
            start, last = 0, len(data) - 1
            if ranged:
                first, _, end = rng.split("=")[1].partition("-")
                start, last = int(first), min(int(end), last) if end else last
                data = data[: last + 1]
            self.send_response(206 if ranged else 200)
            self.send_header("Content-Length", str(len(data) - start))
            self.send_header("ETag", state.etag)
            if ranged:
                self.send_header("Content-Range", f"bytes {start}-{last}/{len(state.data)}")
            self.end_headers()
            cut = state.mode == "always" or len(state.requests) == 1
            end = min(max(start, state.drop_at), len(data)) if cut else len(data)
            self.wfile.write(data[start:end])
            self.wfile.flush()
            if end < len(data):
                if state.stall:  # a server that stops sending but keeps the connection
                    time.sleep(state.stall)
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)

    return Handler


class _QuietServer(http.server.ThreadingHTTPServer):
    request_queue_size = 128  # clients open connections in bursts (5, the default, drops SYNs: 1 s waits)

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # clients that hang up mid-body are what these tests are about


@pytest.fixture
def drop_server() -> Iterator[Callable[..., DropServer]]:
    """Factory: ``drop_server(data, drop_at, mode)`` starts a :class:`DropServer` on 127.0.0.1."""
    servers: list[_QuietServer] = []

    def start(data: bytes, drop_at: int, mode: str = "once", **options: float) -> DropServer:
        state = DropServer(data, drop_at, mode, **options)
        state.port = _serve(servers, _drop_handler(state))
        return state

    yield start
    _shut(servers)


def _serve(servers: list[_QuietServer], handler: type[http.server.BaseHTTPRequestHandler]) -> int:
    """Serve ``handler`` on a free loopback port in a thread (kept in ``servers``); the port."""
    server = _QuietServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    servers.append(server)
    return int(server.server_port)


def _shut(servers: list[_QuietServer]) -> None:
    for server in servers:
        server.shutdown()
        server.server_close()


@dataclass
class FramingServer:
    """Serves ``data`` with ranges, in the framings an HTTP/1.1 client must read: ``chunked`` bodies,
    ``close`` (``Connection: close`` on every answer), ``http10`` (HTTP/1.0 answers, no keep-alive),
    ``split_head`` (seconds between the status line and the rest of the head), ``drop_idle`` (the
    connection closed after each answer without a word, as a kept-alive connection that timed out while
    idle). Counts requests."""

    data: bytes
    chunked: bool = False
    close: bool = False
    drop_idle: bool = False
    http10: bool = False
    split_head: float = 0.0
    port: int = 0
    requests: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/shard.bin"


def _framing_handler(state: FramingServer) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0" if state.http10 else "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            state.requests += 1
            first, _, last = self.headers["Range"].split("=")[1].partition("-")
            start, end = int(first), min(int(last), len(state.data) - 1)
            body = state.data[start : end + 1]
            head = [f"{self.protocol_version} 206 Partial Content", 'ETag: "e1"', f"Content-Range: bytes {start}-{end}/{len(state.data)}"]
            head.append("Transfer-Encoding: chunked" if state.chunked else f"Content-Length: {len(body)}")
            if state.close:
                head.append("Connection: close")
                self.close_connection = True
            text = ("\r\n".join(head) + "\r\n\r\n").encode()
            cut = text.index(b"\r\n") + 2
            self.wfile.write(text[:cut])
            self.wfile.flush()
            time.sleep(state.split_head)
            self.wfile.write(text[cut:])
            if state.chunked:
                for k in range(0, len(body), 7000):
                    piece = body[k : k + 7000]
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                self.wfile.write(b"0\r\n\r\n")
            else:
                self.wfile.write(body)
            self.wfile.flush()
            if state.drop_idle:
                self.close_connection = True

    return Handler


@pytest.fixture
def framing_server() -> Iterator[Callable[..., FramingServer]]:
    """Factory: ``framing_server(data, chunked=..., close=..., http10=..., split_head=...)`` starts a
    :class:`FramingServer` on 127.0.0.1."""
    servers: list[_QuietServer] = []

    def start(data: bytes, **options: Any) -> FramingServer:
        state = FramingServer(data, **options)
        state.port = _serve(servers, _framing_handler(state))
        return state

    yield start
    _shut(servers)


@dataclass
class S3Server:
    endpoint: str
    bucket: str

    def storage_options(self) -> dict[str, object]:
        return {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": self.endpoint, "region_name": "us-east-1"}}


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """moto's S3 server as a subprocess on a free loopback port, with one bucket; skipped if moto is absent."""
    pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    import boto3

    port = free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], stdout=out, stderr=subprocess.STDOUT
        )
    try:
        if not wait_for_port(port, proc):
            raise RuntimeError(f"moto server did not start: {log.read_text()[-2000:]}")
        endpoint = f"http://127.0.0.1:{port}"
        client = boto3.client(
            "s3", endpoint_url=endpoint, aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1"
        )
        client.create_bucket(Bucket="shards")
        yield S3Server(endpoint, "shards")
    finally:
        stop(proc)


AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
"""The account key every Azurite has (``devstoreaccount1``): public, documented by Microsoft."""


@dataclass
class AzureServer:
    """Azurite's blob service on 127.0.0.1, with one container; reached through obstore's emulator
    settings (``use_emulator`` and ``AZURITE_BLOB_STORAGE_URL``, the standard environment)."""

    endpoint: str
    container: str


def _azurite() -> str | None:
    """Azurite's blob service: the repository's ``node_modules`` (``npm ci``, as .ci/run does), else PATH."""
    local = Path(__file__).resolve().parent.parent / "node_modules" / ".bin" / "azurite-blob"
    return str(local) if local.exists() else shutil.which("azurite-blob")


def _azure_create_container(port: int, container: str) -> None:
    """``PUT ?restype=container`` signed with the account key (obstore does not create containers)."""
    import base64
    import email.utils
    import hashlib
    import hmac
    import http.client

    date = email.utils.formatdate(usegmt=True)
    resource = f"/devstoreaccount1/devstoreaccount1/{container}\nrestype:container"
    to_sign = "PUT" + "\n" * 12 + f"x-ms-date:{date}\nx-ms-version:2021-08-06\n" + resource
    signature = base64.b64encode(hmac.new(base64.b64decode(AZURITE_KEY), to_sign.encode(), hashlib.sha256).digest()).decode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"x-ms-date": date, "x-ms-version": "2021-08-06", "Authorization": f"SharedKey devstoreaccount1:{signature}", "Content-Length": "0"}
    conn.request("PUT", f"/devstoreaccount1/{container}?restype=container", headers=headers)
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    if resp.status != 201:
        raise RuntimeError(f"Azurite did not create the container: HTTP {resp.status} {body[:300]!r}")


@pytest.fixture(scope="session")
def azure_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AzureServer]:
    """Azurite's blob service on a free loopback port (``npm ci`` installs it from package.json)."""
    exe = _azurite()
    if exe is None:
        pytest.skip("Azurite is not installed (npm ci in the repository, as .ci/run does)")
    tmp = tmp_path_factory.mktemp("azurite")
    port = free_port()
    log = tmp / "azurite.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [exe, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location", str(tmp), "--skipApiVersionCheck", "--loose"],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        if not wait_for_port(port, proc, timeout=60):
            raise RuntimeError(f"Azurite did not start: {log.read_text()[-2000:]}")
        _azure_create_container(port, "shards")
        yield AzureServer(f"http://127.0.0.1:{port}", "shards")
    finally:
        stop(proc)


@dataclass
class FaultProxy:
    """An HTTP/1.1 relay on 127.0.0.1 in front of ``upstream`` (``host:port``) that injects faults.

    Each request (keep-alive connections too) is relayed after ``delay`` seconds. Faults, each for the
    first N requests that reach the proxy after it is set (then the proxy relays faithfully):
    ``fail_503``: answer 503 with ``Retry-After: retry_after`` instead of relaying; ``drop_mid_body``:
    relay half the response body, then close the connection; ``stall``: hold the request ``stall_s``
    seconds without an answer, then close. ``requests`` counts requests seen, ``ranges`` and
    ``authorizations`` record their ``Range`` and ``Authorization`` headers; ``peak`` is the most
    requests held in their ``delay`` at once (the requests a client had in flight together).
    """

    upstream: tuple[str, int]
    port: int = 0
    delay: float = 0.0
    fail_503: int = 0
    retry_after: str | None = None
    drop_mid_body: int = 0
    stall: int = 0
    stall_s: float = 0.0
    requests: int = 0
    waiting: int = 0
    peak: int = 0
    ranges: list[str | None] = field(default_factory=list)
    authorizations: list[str | None] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, path: str) -> str:
        return f"{self.endpoint}/{path.lstrip('/')}"

    def take(self, fault: str) -> bool:
        """Whether this request gets ``fault`` (counts one down)."""
        with self.lock:
            left = getattr(self, fault)
            if left > 0:
                setattr(self, fault, left - 1)
                return True
            return False


def _read_head(f: Any) -> tuple[bytes, dict[str, str]] | None:
    """An HTTP message head (start line and headers, raw) and its headers by lower-case name; None at EOF."""
    lines = []
    while True:
        line = f.readline(65537)
        if not line:
            return None
        lines.append(line)
        if line in (b"\r\n", b"\n"):
            break
    headers = {}
    for raw in lines[1:-1]:
        name, _, value = raw.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return b"".join(lines), headers


def _relay_body(src: Any, dst: socket.socket, headers: dict[str, str], limit: int | None = None) -> bool:
    """Relay a body of ``Content-Length`` bytes (or up to EOF without one), ``limit`` bytes at most;
    whether all of it went through."""
    length = headers.get("content-length")
    left = int(length) if length is not None else None
    sent = 0
    while left is None or left > 0:
        want = 1 << 16 if left is None else min(1 << 16, left)
        if limit is not None:
            want = min(want, limit - sent)
            if want <= 0:
                return False
        chunk = src.read1(want) if hasattr(src, "read1") else src.read(want)
        if not chunk:
            return left is None
        dst.sendall(chunk)
        sent += len(chunk)
        if left is not None:
            left -= len(chunk)
    return True


def _proxy_handler(state: FaultProxy) -> type[socketserver.BaseRequestHandler]:
    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            client: socket.socket = self.request
            cin = client.makefile("rb")
            upstream = socket.create_connection(state.upstream)
            uin = upstream.makefile("rb")
            try:
                while self._one(client, cin, upstream, uin):
                    pass
            except OSError:
                pass
            finally:
                uin.close()
                cin.close()
                upstream.close()

        def _one(self, client: socket.socket, cin: Any, upstream: socket.socket, uin: Any) -> bool:
            got = _read_head(cin)
            if got is None:
                return False
            head, headers = got
            body = cin.read(int(headers.get("content-length", "0") or 0))
            with state.lock:
                state.requests += 1
                state.ranges.append(headers.get("range"))
                state.authorizations.append(headers.get("authorization"))
            if state.delay:
                with state.lock:
                    state.waiting += 1
                    state.peak = max(state.peak, state.waiting)
                time.sleep(state.delay)
                with state.lock:
                    state.waiting -= 1
            if state.take("stall"):
                time.sleep(state.stall_s)
                return False
            if state.take("fail_503"):
                extra = f"Retry-After: {state.retry_after}\r\n" if state.retry_after is not None else ""
                client.sendall(f"HTTP/1.1 503 Slow Down\r\nContent-Length: 0\r\n{extra}\r\n".encode())
                return True
            upstream.sendall(head + body)
            got = _read_head(uin)
            if got is None:
                return False
            rhead, rheaders = got
            client.sendall(rhead)
            if head.startswith(b"HEAD "):
                return True
            if state.take("drop_mid_body"):
                _relay_body(uin, client, rheaders, limit=max(1, int(rheaders.get("content-length", "2") or 2) // 2))
                client.shutdown(socket.SHUT_RDWR)
                return False
            complete = _relay_body(uin, client, rheaders)
            return complete and "content-length" in rheaders and rheaders.get("connection", "").lower() != "close"

    return Handler


class _ThreadingTCPServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256  # many clients connect at once: a short backlog drops SYNs (1 s retransmits)

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # clients that hang up are what these tests are about


@pytest.fixture
def fault_proxy() -> Iterator[Callable[..., FaultProxy]]:
    """Factory: ``fault_proxy(upstream_port, delay=..., fail_503=...)`` starts a :class:`FaultProxy` on 127.0.0.1."""
    servers: list[_ThreadingTCPServer] = []

    def start(upstream_port: int, **faults: Any) -> FaultProxy:
        state = FaultProxy(("127.0.0.1", upstream_port), **faults)
        server = _ThreadingTCPServer(("127.0.0.1", 0), _proxy_handler(state))
        state.port = server.server_address[1]
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(server)
        return state

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="session")
def tls_certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for ``127.0.0.1`` and ``localhost`` (``openssl req``), and its key: a client
    trusts it with ``SSL_CERT_FILE`` (read by OpenSSL whenever a default context is made)."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed")
    where = tmp_path_factory.mktemp("tls")
    cert, key = where / "cert.pem", where / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


@dataclass
class SchemeServer:
    """One loopback port that speaks HTTP and HTTPS (a connection whose first byte is a TLS handshake's,
    0x16, is wrapped in TLS with :func:`tls_certificate`'s certificate), so that a redirect can change the
    scheme and nothing else. ``/files/PATH`` serves ``root/PATH`` with ranges and an ``ETag``;
    ``/to-http/PATH`` and ``/to-https/PATH`` redirect (302) to ``/files/PATH`` on this port over that
    scheme. ``seen`` records each request's ``(scheme, path, Authorization)``."""

    root: Path
    port: int = 0
    seen: list[tuple[str, str, str | None]] = field(default_factory=list)

    def url(self, scheme: str, path: str) -> str:
        return f"{scheme}://127.0.0.1:{self.port}/{path.lstrip('/')}"

    def authorizations(self, scheme: str) -> list[str | None]:
        """The ``Authorization`` of every request seen over ``scheme``."""
        return [auth for sch, _, auth in self.seen if sch == scheme]


class _Answering(http.server.BaseHTTPRequestHandler):
    """A quiet HTTP/1.1 handler with ``_answer`` (status, body, headers) and ``_ranged`` (a file's bytes,
    206 for a ``Range`` of one span, else 200; ``ETag: "v1"``)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _answer(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for k, v in {"Content-Length": str(len(body)), **(headers or {})}.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _ranged(self, data: bytes) -> None:
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if m is None:
            return self._answer(200, data, {"ETag": '"v1"'})
        start, end = int(m.group(1)), min(int(m.group(2) or len(data) - 1), len(data) - 1)
        return self._answer(206, data[start : end + 1], {"ETag": '"v1"', "Content-Range": f"bytes {start}-{end}/{len(data)}"})


def _scheme_handler(state: SchemeServer) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(_Answering):
        def do_GET(self) -> None:
            scheme = "https" if isinstance(self.connection, ssl.SSLSocket) else "http"
            path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
            state.seen.append((scheme, path, self.headers.get("Authorization")))
            top, _, rest = path.lstrip("/").partition("/")
            if top in ("to-http", "to-https"):
                return self._answer(302, headers={"Location": f"{top[3:]}://127.0.0.1:{state.port}/files/{rest}"})
            file = state.root / rest
            if top != "files" or not file.is_file():
                return self._answer(404)
            return self._ranged(file.read_bytes())

    return Handler


class _EitherScheme(_QuietServer):
    """Each connection is HTTPS if it starts with a TLS handshake, else plain HTTP."""

    tls: ssl.SSLContext

    def finish_request(self, request: Any, client_address: Any) -> None:
        try:
            request.settimeout(10)
            if request.recv(1, socket.MSG_PEEK) == b"\x16":
                request = self.tls.wrap_socket(request, server_side=True)
        except OSError:
            return
        try:
            super().finish_request(request, client_address)
        finally:
            if isinstance(request, ssl.SSLSocket):  # (the plain socket it was made from is detached, closed by the caller)
                request.close()


@pytest.fixture
def scheme_server(tls_certificate: tuple[Path, Path], tmp_path: Path) -> Iterator[SchemeServer]:
    """A :class:`SchemeServer` over a fresh directory (its ``root``)."""
    state = SchemeServer(tmp_path / "scheme-root")
    state.root.mkdir()
    server = _EitherScheme(("127.0.0.1", 0), _scheme_handler(state))
    server.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.tls.load_cert_chain(*tls_certificate)
    state.port = int(server.server_port)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield state
    _shut([server])


HUB_TOKEN = "hf_hub_test_token"


@dataclass
class HubServer:
    """The Hugging Face Hub's two endpoints tarindex uses, on 127.0.0.1: the tree API (JSON, two entries a
    page, the next page in ``Link``) and resolve URLs answered with a redirect to a CDN (nginx's ``/cdn/``,
    under another host name, refusing any ``Authorization``), both requiring ``Bearer HUB_TOKEN``.
    Repositories are directories ``root/{datasets,spaces,models}/ORG/NAME``; only the revision ``main`` exists."""

    root: Path
    cdn_port: int
    port: int = 0
    requests: int = 0
    resolves: int = 0
    signed: bool = False
    """Redirect to this server's own ``/signed/`` CDN (under the host name ``localhost``), whose URLs carry
    ``sig=signature`` and answer 403 once ``signature`` changed (a presigned URL that expired)."""
    signature: int = 1
    pages_elsewhere: bool = False
    """Every listing's next page (``Link``) names another host (``localhost``), which serves the tree API
    without a token and answers 400 to a request that carries one."""

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _hub_handler(state: HubServer) -> type[http.server.BaseHTTPRequestHandler]:
    tree = re.compile(r"^/api/(datasets|models|spaces)/([^/]+/[^/]+)/tree/([^/]+)/?(.*)$")
    resolve = re.compile(r"^/(datasets/|spaces/)?([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")

    class Handler(_Answering):
        def _signed(self, url: urllib.parse.SplitResult, path: str) -> None:
            """The signed CDN: no Authorization, a current signature, one byte range (206)."""
            if self.headers.get("Authorization"):
                return self._answer(400, b"credentials sent to the CDN")
            if urllib.parse.parse_qs(url.query).get("sig") != [str(state.signature)]:
                return self._answer(403, b"signature expired")
            return self._ranged((state.root / path[len("/signed/") :]).read_bytes())

        def do_GET(self) -> None:
            state.requests += 1
            url = urllib.parse.urlsplit(self.path)
            path = urllib.parse.unquote(url.path)
            if path.startswith("/signed/"):
                return self._signed(url, path)
            elsewhere = state.pages_elsewhere and self.headers.get("Host", "").startswith("localhost:")
            if elsewhere and self.headers.get("Authorization"):
                return self._answer(400, b"credentials sent to another host")
            if self.headers.get("Authorization") != f"Bearer {HUB_TOKEN}" and not (elsewhere and tree.match(path)):
                return self._answer(401, b'{"error":"Invalid credentials"}')
            if m := tree.match(path):
                kind, repo, rev, sub = m.groups()
                base = state.root / kind / repo
                if rev != "main" or not (base / sub).is_dir():
                    return self._answer(404, b'{"error":"not found"}')
                entries = [
                    {"type": "directory" if p.is_dir() else "file", "path": p.relative_to(base).as_posix(), "size": 0 if p.is_dir() else p.stat().st_size}
                    for p in sorted((base / sub).rglob("*"))
                ]
                cursor = int(urllib.parse.parse_qs(url.query).get("cursor", ["0"])[0])
                page, headers = entries[cursor : cursor + 2], {"Content-Type": "application/json"}
                if cursor + 2 < len(entries):
                    base = f"http://localhost:{state.port}" if state.pages_elsewhere else state.endpoint
                    headers["Link"] = f'<{base}{url.path}?recursive=true&cursor={cursor + 2}>; rel="next"'
                return self._answer(200, json.dumps(page).encode(), headers)
            if m := resolve.match(path):
                kind, repo, rev, name = m.groups()
                kind = kind or "models/"
                if rev != "main" or not (state.root / kind / repo / name).is_file():
                    return self._answer(404, b'{"error":"Entry not found"}')
                state.resolves += 1
                if state.signed:
                    where = f"http://localhost:{state.port}/signed/{kind}{repo}/{name}?sig={state.signature}"
                else:
                    where = f"http://localhost:{state.cdn_port}/cdn/hub/{kind}{repo}/{name}"
                return self._answer(302, headers={"Location": where})
            return self._answer(404)

    return Handler


@pytest.fixture
def hub_server(http_server: HTTPServer) -> Iterator[HubServer]:
    """A :class:`HubServer` whose files nginx serves as the CDN (skipped without nginx)."""
    if http_server.kind != "nginx":
        pytest.skip("the CDN's location is nginx's")
    state = HubServer(http_server.root / "hub", http_server.port)
    state.root.mkdir(exist_ok=True)
    servers: list[_QuietServer] = []
    state.port = _serve(servers, _hub_handler(state))
    yield state
    _shut(servers)
