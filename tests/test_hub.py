"""``hf://`` shards against a local server speaking the Hub's tree and resolve endpoints (tests/_servers.py):
the user's token from HF_TOKEN or the token file, the redirect to a CDN that never sees it, build by glob,
random reads, batches and streaming equal to tarfile's bytes."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from _servers import HUB_TOKEN, HubServer, SchemeServer

from conftest import make_shard_set
from tarindex import TarDataset, TarStream, build_index
from tarindex.errors import ShardNotFoundError, SourceError
from tarindex.shards import expand_shards

pytestmark = pytest.mark.usefixtures("impl")


@pytest.fixture
def repo(hub_server: HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, list[Path]]:
    """A dataset repository ``org/<test>`` with 5 shards under ``data/``; HF_ENDPOINT and HF_TOKEN set."""
    name = f"set-{tmp_path.name}"
    paths = make_shard_set(hub_server.root / "datasets" / "org" / name / "data", 5, 4)
    (hub_server.root / "datasets" / "org" / name / "README.md").write_text("not a shard")
    monkeypatch.setenv("HF_ENDPOINT", hub_server.endpoint)
    monkeypatch.setenv("HF_TOKEN", HUB_TOKEN)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # no token file but the test's
    return f"hf://datasets/org/{name}", paths


def test_build_by_glob_then_random_reads_batches_and_streams(repo: tuple[str, list[Path]], tmp_path: Path) -> None:
    url, paths = repo
    names = [f"{url}/data/{p.name}" for p in paths]
    assert expand_shards(f"{url}/data/train-*.tar") == names  # the tree API, paged two entries at a time
    assert expand_shards(f"{url}/**.tar") == names
    index = build_index(f"{url}/data/train-*.tar", index=tmp_path / "hub.tarindex", workers=2).path
    assert HUB_TOKEN.encode() not in index.read_bytes()
    local = TarDataset(build_index([str(p) for p in paths], index=tmp_path / "local.tarindex", workers=1).path)
    ds = TarDataset(index)
    assert [s.path for s in ds.index.shards] == names and len(ds) == len(local)
    order = list(range(len(ds)))
    random.Random(0).shuffle(order)

    def strip(sample: dict) -> dict:
        return {k: v for k, v in sample.items() if k == "__key__" or not k.startswith("__")}

    assert [strip(ds[i]) for i in order] == [strip(local[i]) for i in order]
    assert [strip(s) for s in ds.__getitems__(order[:9])] == [strip(local[i]) for i in order[:9]]
    streamed = [strip(s) for s in TarStream(names, decode=None)]
    assert streamed == [strip(local[i]) for i in range(len(local))]


def test_the_token_file_is_read_and_a_wrong_token_is_one_named_error(repo: tuple[str, list[Path]], tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    url, paths = repo
    shard = f"{url}/data/{paths[0].name}"
    monkeypatch.delenv("HF_TOKEN")
    home = tmp_path / "hf-home"
    home.mkdir()
    (home / "token").write_text(HUB_TOKEN + "\n")  # what `huggingface-cli login` writes
    assert len(build_index(shard, index=tmp_path / "file-token.tarindex", workers=1).scanned) == 1
    (home / "token").write_text("hf_wrong")
    with pytest.raises(SourceError, match=r"HTTP 401 .*access denied") as err:
        build_index(shard, index=tmp_path / "wrong.tarindex", workers=1)
    assert "hf_wrong" not in str(err.value) and "/resolve/main/data/" in str(err.value)
    with pytest.raises(SourceError, match="HTTP 401"):
        expand_shards(f"{url}/data/*.tar")
    monkeypatch.setenv("HF_TOKEN", HUB_TOKEN)  # the environment wins over the file
    ds = TarDataset(tmp_path / "file-token.tarindex")
    assert ds[3]["__key__"] == "s00i003"
    with pytest.raises(ShardNotFoundError):
        build_index(f"{url}/data/nothing.tar", index=tmp_path / "none.tarindex", workers=1)


def test_an_expired_redirect_is_asked_for_again(repo: tuple[str, list[Path]], hub_server: HubServer, tmp_path: Path) -> None:
    """The Hub's redirects are presigned and expire: a 403 from the URL a redirect named sends the reader
    back to the resolve URL for a new one, on single reads and batches alike (nothing fails, nothing is wrong)."""
    url, paths = repo
    hub_server.signed = True
    names = [f"{url}/data/{p.name}" for p in paths]
    index = build_index(names, index=tmp_path / "signed.tarindex", workers=1).path
    local = TarDataset(build_index([str(p) for p in paths], index=tmp_path / "local.tarindex", workers=1).path)
    ds = TarDataset(index)
    order = list(range(len(ds)))
    random.Random(2).shuffle(order)
    assert [ds[i]["bin"] for i in order[:6]] == [local[i]["bin"] for i in order[:6]]
    before = hub_server.resolves
    hub_server.signature += 1  # every URL handed out so far now answers 403
    assert [ds[i]["bin"] for i in order[6:12]] == [local[i]["bin"] for i in order[6:12]]
    hub_server.signature += 1
    assert [s["bin"] for s in ds.__getitems__(order)] == [local[i]["bin"] for i in order]
    assert hub_server.resolves > before  # asked again, not served from somewhere stale


def test_a_next_page_on_another_host_gets_no_token(repo: tuple[str, list[Path]], hub_server: HubServer) -> None:
    """A listing's ``Link: rel="next"`` naming another host is followed without the token (that host answers
    400 to a request that carries one, and serves the pages without): the listing is whole."""
    url, paths = repo
    hub_server.pages_elsewhere = True
    before = hub_server.requests
    assert expand_shards(f"{url}/data/train-*.tar") == [f"{url}/data/{p.name}" for p in paths]
    assert hub_server.requests - before >= 3  # five files (and the README) at two a page: pages on the other host


def test_the_hub_token_does_not_follow_https_to_http(
    scheme_server: SchemeServer, tls_certificate: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ``https`` Hub whose resolve URL redirects to ``http`` on the same host and port: the token from
    HF_TOKEN reaches the ``https`` requests only; build, random reads, a batch and the stream read
    tarfile's bytes."""
    monkeypatch.setenv("SSL_CERT_FILE", str(tls_certificate[0]))
    monkeypatch.setenv("HF_ENDPOINT", scheme_server.url("https", "to-http"))  # resolve URLs: /to-http/datasets/...
    monkeypatch.setenv("HF_TOKEN", HUB_TOKEN)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    paths = make_shard_set(scheme_server.root / "datasets" / "org" / "set" / "resolve" / "main", 2, 4)
    names = [f"hf://datasets/org/set/{p.name}" for p in paths]
    index = build_index(names, index=tmp_path / "hub.tarindex", workers=1).path
    local = TarDataset(build_index([str(p) for p in paths], index=tmp_path / "local.tarindex", workers=1).path)
    ds = TarDataset(index)
    bins = [local[i]["bin"] for i in range(len(local))]
    assert [ds[i]["bin"] for i in reversed(range(len(ds)))] == bins[::-1]
    assert [s["bin"] for s in ds.__getitems__(list(range(len(ds))))] == bins
    assert [s["bin"] for s in TarStream(names)] == bins
    assert set(scheme_server.authorizations("https")) == {f"Bearer {HUB_TOKEN}"}
    assert len(scheme_server.authorizations("http")) > 4 and set(scheme_server.authorizations("http")) == {None}
