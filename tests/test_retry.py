"""The one retry policy (full jitter, Retry-After) and HTTP range reads under injected faults."""

from __future__ import annotations

import os
import random
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from _servers import FaultProxy, FramingServer, HTTPServer, SchemeServer

from tarindex._http import credentials_follow
from tarindex._retry import RetryPolicy, Transient, parse_retry_after
from tarindex.errors import ShardNotFoundError, SourceError
from tarindex.options import SourceOptions
from tarindex.sources import RangeReader, open_source


def test_full_jitter_stays_within_the_doubling_bound() -> None:
    policy = RetryPolicy(retries=8, backoff=0.1, max_backoff=1.0)
    random.seed(3)
    for attempt in range(1, 9):
        ceiling = min(1.0, 0.1 * 2 ** (attempt - 1))
        waits = [policy.delay(attempt) for _ in range(400)]
        assert min(waits) >= 0.0 and max(waits) <= ceiling
        assert max(waits) > 0.8 * ceiling and min(waits) < 0.2 * ceiling  # spread over the whole range: jitter


def test_retry_after_is_a_floor() -> None:
    policy = RetryPolicy(backoff=0.01)
    assert policy.delay(1, Transient("HTTP 503", 2.0)) >= 2.0
    assert policy.delay(1, Transient("HTTP 503", 10_000.0)) == 300.0  # a server asking for hours is not obeyed
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after("garbage") is None
    assert parse_retry_after(None) is None
    assert 50 < (parse_retry_after(time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 60))) or 0) <= 60


def test_policy_gives_up_naming_url_and_range() -> None:
    calls = []

    def failing() -> bytes:
        calls.append(1)
        raise ConnectionResetError("reset by peer")

    with pytest.raises(SourceError, match=r"^http://h/x.tar: bytes 100-149: read failed after 2 retries \(ConnectionResetError: reset by peer\) at byte offset 100$"):
        RetryPolicy(retries=2, backoff=0.001).call(failing, "http://h/x.tar", 100, 50)
    assert len(calls) == 3


def test_not_found_and_bugs_are_not_retried() -> None:
    calls = []

    def gone() -> bytes:
        calls.append(1)
        raise ShardNotFoundError("x: no such shard")

    with pytest.raises(ShardNotFoundError):
        RetryPolicy(backoff=0.001).call(gone, "u")
    with pytest.raises(TypeError):
        RetryPolicy(backoff=0.001).call(lambda: (calls.append(1), int("x", None))[1], "u")  # type: ignore[call-overload]
    assert len(calls) == 2


@pytest.fixture
def served(http_server: HTTPServer, tmp_path: Path) -> tuple[HTTPServer, str, bytes]:
    """A 1 MiB random file served by the HTTP test server."""
    data = os.urandom(1 << 20)
    name = f"retry-{os.getpid()}-{tmp_path.name}.bin"
    (http_server.root / name).write_bytes(data)
    return http_server, name, data


def _ranges(n: int, size: int, total: int) -> list[tuple[int, int]]:
    rng = random.Random(n)
    return [(rng.randrange(0, total - size), size) for _ in range(n)]


def test_503_burst_is_retried_with_retry_after(served: tuple[HTTPServer, str, bytes], fault_proxy: Callable[..., FaultProxy]) -> None:
    server, name, data = served
    proxy = fault_proxy(server.port)
    reader = RangeReader(proxy.url(name), SourceOptions(backoff=0.001))
    proxy.fail_503, proxy.retry_after = 3, "1"
    start = time.monotonic()
    assert reader.read_at(1000, 500) == data[1000:1500]
    assert time.monotonic() - start >= 3.0  # each of the 3 answers asked for 1 s
    tight = RangeReader(proxy.url(name), SourceOptions(retries=2, backoff=0.001))
    proxy.fail_503, proxy.retry_after = 10, None
    with pytest.raises(SourceError, match=rf"{proxy.url(name)}: bytes 7-9: read failed after 2 retries \(Transient: HTTP 503 Slow Down\)"):
        tight.read_at(7, 3)


@pytest.mark.parametrize("fault", ["drop_mid_body", "stall", "fail_503"])
def test_a_batch_under_faults_is_exact_or_a_named_error(
    served: tuple[HTTPServer, str, bytes], fault_proxy: Callable[..., FaultProxy], fault: str
) -> None:
    server, name, data = served
    proxy = fault_proxy(server.port, stall_s=1.0)
    reader = RangeReader(proxy.url(name), SourceOptions(backoff=0.001, timeout=0.3))
    setattr(proxy, fault, 5)
    wanted = _ranges(64, 20_000, len(data))
    got = RangeReader.fetch_many([(reader, o, n) for o, n in wanted], 8)
    assert got == [data[o : o + n] for o, n in wanted]
    assert getattr(proxy, fault) == 0  # every fault was met, and recovered from
    tight = RangeReader(proxy.url(name), SourceOptions(retries=1, backoff=0.001, timeout=0.3))
    setattr(proxy, fault, 10_000)  # now it never recovers: the named error, never a short sample
    with pytest.raises(SourceError, match=rf"{proxy.url(name)}: bytes \d+-\d+: read failed after 1 retries"):
        RangeReader.fetch_many([(tight, o, n) for o, n in wanted[:4]], 4)


def test_concurrent_ranges_hide_the_latency(served: tuple[HTTPServer, str, bytes], fault_proxy: Callable[..., FaultProxy]) -> None:
    """Requests overlap, up to the bound: measured at the server (requests held in the delay at once),
    not by the wall clock of a loaded machine."""
    server, name, data = served
    proxy = fault_proxy(server.port, delay=0.2)
    reader = RangeReader(proxy.url(name))
    wanted = _ranges(64, 1000, len(data))
    got = RangeReader.fetch_many([(reader, o, n) for o, n in wanted], 32)
    assert got == [data[o : o + n] for o, n in wanted]
    assert 16 <= proxy.peak <= 32  # one at a time: 1
    proxy.peak = 0
    assert RangeReader.fetch_many([(reader, o, n) for o, n in wanted[:8]], 1) == [data[o : o + n] for o, n in wanted[:8]]
    assert proxy.peak == 1


@pytest.mark.parametrize("framing", ["chunked", "close", "http10", "split_head", "drop_idle"])
def test_range_reads_in_every_framing(framing_server: Callable[..., FramingServer], framing: str) -> None:
    """Plain-HTTP ranged reads (a raw socket path, http.client for what it does not read) give the exact
    bytes whatever the answers' framing; a chunked answer costs one request more, once per reader."""
    data = os.urandom(300_000)
    server = framing_server(data, **{framing: 0.05 if framing == "split_head" else True})
    reader = RangeReader(server.url, SourceOptions(backoff=0.001))
    assert reader.read_at(123, 70_000) == data[123:70_123]
    wanted = [*_ranges(40, 9_000, len(data)), (len(data) - 100, 100)]
    assert RangeReader.fetch_many([(reader, o, n) for o, n in wanted], 8) == [data[o : o + n] for o, n in wanted]
    assert reader.read_at(len(data) - 10, 500) == data[-10:]  # past the end: what there is
    assert server.requests - (1 + 1 + len(wanted) + 1) == (1 if framing == "chunked" else 0)


def test_refused_connection_is_one_line_and_fast() -> None:
    start = time.monotonic()
    with pytest.raises(SourceError, match=r"^http://127.0.0.1:9/x.tar: connection refused \(is the server running.*at byte offset 0$"):
        RangeReader("http://127.0.0.1:9/x.tar", SourceOptions(backoff=5.0))
    assert time.monotonic() - start < 5.0  # retried, it would wait U(0, 5) + U(0, 10) + ... s: < 5 s with p < 1e-4


def test_headers_and_proxy_from_the_environment(
    served: tuple[HTTPServer, str, bytes], fault_proxy: Callable[..., FaultProxy], monkeypatch: pytest.MonkeyPatch
) -> None:
    """HTTP_PROXY routes requests through the proxy (absolute URL as the target); NO_PROXY exempts hosts."""
    server, name, data = served
    proxy = fault_proxy(server.port)
    unreachable = f"http://tarindex-test.invalid:{server.port}/{name}"  # resolvable only by the proxy's relay
    monkeypatch.setenv("HTTP_PROXY", proxy.endpoint)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    reader = RangeReader(unreachable, SourceOptions(headers={"Authorization": "Bearer t0ken"}))
    assert reader.read_at(10, 20) == data[10:30]
    with open_source(unreachable, headers={"Authorization": "Bearer other"}) as src:
        assert b"".join(src) == data
    assert proxy.requests == 3 and proxy.ranges[:2] == ["bytes=0-0", "bytes=10-29"]
    assert proxy.authorizations == ["Bearer t0ken", "Bearer t0ken", "Bearer other"]
    monkeypatch.setenv("NO_PROXY", "tarindex-test.invalid")
    with pytest.raises(SourceError, match="host not found"):
        RangeReader(unreachable)


def test_headers_open_a_gated_path_on_every_read_path(http_server: HTTPServer, tmp_path: Path) -> None:
    """A token in ``headers`` reaches the server on each path (a probe, ``read_at`` and a batch on raw
    sockets, a stream through http.client); without it, a one-line access error."""
    if http_server.kind != "nginx":
        pytest.skip("the gated location is nginx's (Python's http.server has none)")
    data = os.urandom(200_000)
    (http_server.root / "gated").mkdir(exist_ok=True)
    (http_server.root / "gated" / f"{tmp_path.name}.bin").write_bytes(data)
    url = http_server.url(f"gated/{tmp_path.name}.bin")
    with pytest.raises(SourceError, match=rf"^{url}: HTTP 401 Unauthorized: access denied \(check the credentials or headers=\)"):
        RangeReader(url)
    reader = RangeReader(url, SourceOptions(headers={"Authorization": "Bearer hf_test"}))
    assert reader.read_at(5, 70_000) == data[5:70_005]
    wanted = _ranges(30, 5_000, len(data))
    assert RangeReader.fetch_many([(reader, o, n) for o, n in wanted], 8) == [data[o : o + n] for o, n in wanted]
    with open_source(url, headers={"Authorization": "Bearer hf_test"}) as src:
        assert b"".join(src) == data


def test_nginx_is_the_upstream_when_installed(http_server: HTTPServer) -> None:
    if shutil.which("nginx") is None and not os.path.exists("/usr/sbin/nginx"):
        pytest.skip("nginx is not installed")
    assert http_server.kind == "nginx"


def test_build_sends_the_headers_a_gated_server_requires(http_server: HTTPServer, tmp_path: Path) -> None:
    """``build_index(headers=)`` and ``tarindex build -H``: the token reaches every scan (in worker processes
    too); without it, exit 1 with one line naming the URL and the 401; the token is not in the index."""
    if http_server.kind != "nginx":
        pytest.skip("the gated location is nginx's (Python's http.server has none)")
    from click.testing import CliRunner

    from conftest import make_shard_set
    from tarindex import TarDataset, build_index
    from tarindex.cli.main import main

    paths = make_shard_set(http_server.root / "gated" / tmp_path.name, 3, 5)
    urls = [http_server.url(f"gated/{tmp_path.name}/{p.name}") for p in paths]
    token = {"Authorization": "Bearer hf_test"}
    index = build_index(urls, index=tmp_path / "gated.tarindex", workers=2, headers=token).path
    local = TarDataset(build_index([str(p) for p in paths], index=tmp_path / "local.tarindex", workers=1).path)
    ds = TarDataset(index, headers=token)
    assert len(ds) == len(local) and all(ds[i] == {**local[i], "__url__": ds[i]["__url__"]} for i in range(len(ds)))
    assert b"hf_test" not in index.read_bytes()
    runner = CliRunner()
    out = runner.invoke(main, ["build", *urls, "-o", str(tmp_path / "cli.tarindex"), "-q", "-H", "Authorization: Bearer hf_test"])
    assert out.exit_code == 0, out.output
    out = runner.invoke(main, ["build", *urls, "-o", str(tmp_path / "denied.tarindex"), "-q"])
    assert out.exit_code == 1 and len(out.output.strip().splitlines()) == 1 and "401" in out.output and urls[0] in out.output, out.output
    out = runner.invoke(main, ["build", *urls, "-o", str(tmp_path / "bad.tarindex"), "-H", "no colon"])
    assert out.exit_code == 2 and "expected 'NAME: VALUE'" in out.output


def test_credentials_do_not_follow_a_redirect_to_another_host(http_server: HTTPServer, tmp_path: Path) -> None:
    """A token given for one host is not sent to another one a redirect names (the Hub's resolve URLs answer
    with a CDN's): the CDN here refuses any request with Authorization, on every read path."""
    if http_server.kind != "nginx":
        pytest.skip("the redirecting locations are nginx's")
    data = os.urandom(300_000)
    (http_server.root / f"{tmp_path.name}.bin").write_bytes(data)
    url = http_server.url(f"moved/{tmp_path.name}.bin")
    token = SourceOptions(headers={"Authorization": "Bearer hf_test"})
    with pytest.raises(SourceError, match="401"):
        RangeReader(url)
    reader = RangeReader(url, token)
    assert reader.read_at(7, 90_000) == data[7:90_007]
    wanted = _ranges(20, 9_000, len(data))
    assert RangeReader.fetch_many([(reader, o, n) for o, n in wanted], 4) == [data[o : o + n] for o, n in wanted]
    with open_source(url, headers={"Authorization": "Bearer hf_test"}) as src:
        assert b"".join(src) == data
    cdn = http_server.url(f"cdn/{tmp_path.name}.bin").replace("127.0.0.1", "localhost")
    with pytest.raises(SourceError, match="400"):  # the CDN does refuse a request that carries the token
        RangeReader(cdn, token)


@pytest.mark.parametrize(("first", "then"), [("https", "http"), ("http", "https")])
def test_credentials_do_not_follow_a_change_of_scheme(
    first: str, then: str, scheme_server: SchemeServer, tls_certificate: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A redirect that changes the scheme alone (same host, same port: one server speaks both) drops the
    caller's ``Authorization``: https to http would send it in the clear, and http to https on a port
    other than the defaults is another origin. Every read path: the probe (http.client), single reads
    and a batch (raw sockets after https -> http, http.client after http -> https), the stream; the
    first scheme's requests do carry it."""
    monkeypatch.setenv("SSL_CERT_FILE", str(tls_certificate[0]))  # trusts the server's self-signed certificate
    data = os.urandom(300_000)
    (scheme_server.root / "x.bin").write_bytes(data)
    url = scheme_server.url(first, f"to-{then}/x.bin")
    token = {"Authorization": "Bearer s3cret"}
    reader = RangeReader(url, SourceOptions(headers=token))
    assert reader.read_at(7, 90_000) == data[7:90_007]
    wanted = _ranges(20, 9_000, len(data))
    assert RangeReader.fetch_many([(reader, o, n) for o, n in wanted], 4) == [data[o : o + n] for o, n in wanted]
    with open_source(url, headers=token) as src:
        assert b"".join(src) == data
    assert scheme_server.authorizations(first) == ["Bearer s3cret"] * 2  # the probe's and the stream's first request
    assert len(scheme_server.authorizations(then)) >= 23 and set(scheme_server.authorizations(then)) == {None}


@pytest.mark.parametrize(
    ("given_for", "url", "follow"),
    [
        ("https://h.example/a", "https://h.example/b?x=1", True),
        ("https://h.example/a", "https://H.EXAMPLE:443/b", True),  # a default port written or not, any case
        ("http://h.example:8080/a", "http://h.example:8080/b", True),
        ("https://h.example/a", "http://h.example/a", False),  # in the clear
        ("https://h.example:8443/a", "http://h.example:8443/a", False),
        ("http://h.example/a", "https://h.example/a", True),  # requests' exception: 80 -> 443, the same host
        ("http://h.example:80/a", "https://h.example:443/a", True),
        ("http://h.example:8080/a", "https://h.example:8080/a", False),  # not the default ports: another origin
        ("http://h.example/a", "https://h.example:8443/a", False),
        ("https://h.example/a", "https://cdn.example/a", False),
        ("https://h.example:1/a", "https://h.example:2/a", False),
        ("https://h.example/a", "https://h.example:bad/a", False),
        ("https://h.example/a", "ftp://h.example/a", False),
    ],
)
def test_the_credentials_rule_is_requests_one(given_for: str, url: str, follow: bool) -> None:
    assert credentials_follow(given_for, url) is follow
