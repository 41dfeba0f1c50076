"""Real servers on 127.0.0.1 for the streaming tests: nginx, a connection-dropping HTTP server, moto's S3.

Imported by conftest.py so the fixtures are visible to every test module.
"""

from __future__ import annotations

import http.server
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

__all__ = ["DropServer", "HTTPServer", "drop_server", "http_server", "s3_server"]


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
    tcp_nopush on;
    types {{ application/x-tar tar; }}
    default_type application/octet-stream;
    server {{
        listen 127.0.0.1:{port};
        root {root};
        location / {{ }}
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


@dataclass
class DropServer:
    """Serves one file with Range support, but cuts the connection when the stream reaches byte ``drop_at``.

    ``mode="once"``: only the first request is cut; ``"always"``: every request is cut there.
    ``ranges=False`` ignores ``Range``; ``change_etag=True`` serves a new ``ETag`` after the first request.
    """

    data: bytes
    drop_at: int
    mode: str = "once"
    port: int = 0
    ranges: bool = True
    change_etag: bool = False
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
            start = int(rng.split("=")[1].split("-")[0]) if rng and state.ranges else 0
            if rng and self.headers.get("If-Range", state.etag) != state.etag:
                start = 0
            self.send_response(206 if start else 200)
            self.send_header("Content-Length", str(len(data) - start))
            self.send_header("ETag", state.etag)
            if start:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.end_headers()
            cut = state.mode == "always" or len(state.requests) == 1
            end = min(max(start, state.drop_at), len(data)) if cut else len(data)
            self.wfile.write(data[start:end])
            self.wfile.flush()
            if end < len(data):
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)

    return Handler


class _QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        pass  # clients that hang up mid-body are what these tests are about


@pytest.fixture
def drop_server() -> Iterator[Callable[..., DropServer]]:
    """Factory: ``drop_server(data, drop_at, mode)`` starts a :class:`DropServer` on 127.0.0.1."""
    servers: list[_QuietServer] = []

    def start(data: bytes, drop_at: int, mode: str = "once", **options: bool) -> DropServer:
        state = DropServer(data, drop_at, mode, **options)
        server = _QuietServer(("127.0.0.1", 0), _drop_handler(state))
        state.port = server.server_port
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(server)
        return state

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


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
