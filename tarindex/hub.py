"""Hugging Face Hub URLs: ``hf://`` shards read through the Hub's own HTTP endpoints with the user's token.

``hf://datasets/ORG/NAME[@REVISION]/PATH`` (and ``hf://spaces/...``, ``hf://ORG/NAME/...`` for a model
repository) is the file's *resolve* URL, ``{HF_ENDPOINT}/datasets/ORG/NAME/resolve/REVISION/PATH``
(``HF_ENDPOINT`` defaults to ``https://huggingface.co``, the revision to ``main``): an ordinary HTTP(S)
object with ranges, read by :class:`tarindex.sources.RangeReader` and ``HTTPSource`` like any other.
The Hub answers a resolve URL of a large file with a redirect to its CDN; the token goes to the Hub's
host only (:mod:`tarindex._http` never sends credentials to another host or scheme).

The token is the one the Hub's own tools use: ``HF_TOKEN``, else the file ``HF_TOKEN_PATH``, else
``$HF_HOME/token`` (``~/.cache/huggingface/token``: what ``huggingface-cli login`` writes); an
``Authorization`` header the caller gives wins. It is sent as ``Authorization: Bearer``, never written
into an index or an error message. A glob (``hf://datasets/org/name/train-*.tar``) lists the repository
with the Hub's tree API (``/api/datasets/ORG/NAME/tree/REVISION/DIR``, pages followed by ``Link``; a next
page on another host or scheme is asked for without the token, as a redirect there would be).

Why not fsspec's ``HfFileSystem``: it needs ``huggingface_hub`` (not a dependency), and its reads go
through another HTTP stack than the one measured and fault-tested here (raw sockets, batches, retries).
"""

from __future__ import annotations

import functools
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urljoin

from ._http import _http_get, credentials_follow, http_status_error, without_credentials
from .errors import SourceError
from .naming import ShardRef
from .options import SourceOptions

__all__: list[str] = []  # internal module: sources and objstore use these names

_KINDS = {"datasets": "datasets/", "spaces": "spaces/"}  # anything else names a model repository
_LINK_NEXT = re.compile(r'<([^>]+)>\s*;\s*rel="?next"?')


@dataclass(frozen=True, slots=True)
class HubPath:
    """A file (or a glob) in a Hub repository."""

    kind: str
    """``datasets/``, ``spaces/`` or ``""`` (a model): the URL prefix of the repository type."""
    repo: str
    """``ORG/NAME``."""
    revision: str
    """A branch, tag or commit (``main`` unless the URL names one with ``@``)."""
    path: str
    """The file's path in the repository."""


def parse(url: str) -> HubPath:
    """The parts of ``hf://[datasets/|spaces/]ORG/NAME[@REVISION]/PATH``.

    Raises:
        SourceError: not of that form.
    """
    parts = ShardRef.of(url).path.split("/")
    kind = _KINDS.get(parts[0], "")
    if kind:
        parts = parts[1:]
    if len(parts) < 3 or not all(parts[:3]):
        raise SourceError(url, 0, "expected hf://datasets/ORG/NAME[@REVISION]/PATH (or hf://ORG/NAME/PATH for a model)")
    name, _, revision = parts[1].partition("@")
    return HubPath(kind, f"{parts[0]}/{name}", revision or "main", "/".join(parts[2:]))


def endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def token() -> str | None:
    """The user's Hub token (see the module docstring), or ``None``."""
    found = os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN")
    if found:
        return found.strip()
    home = Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface")
    path = Path(os.environ.get("HF_TOKEN_PATH") or home / "token")
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def with_token(options: SourceOptions) -> SourceOptions:
    """``options`` with ``Authorization: Bearer <token>`` added, unless they carry one or there is no token."""
    if any(k.lower() == "authorization" for k in options.headers):
        return options
    found = token()
    return options if found is None else options.with_(headers={**options.headers, "Authorization": f"Bearer {found}"})


def resolve(url: str, options: SourceOptions) -> tuple[str, SourceOptions]:
    """The resolve URL of an ``hf://`` file and the options (with the token) to read it with.

    Raises:
        SourceError: not an ``hf://`` file URL.
    """
    p = parse(url)
    target = f"{endpoint()}/{p.kind}{p.repo}/resolve/{quote(p.revision, safe='')}/{quote(p.path)}"
    return target, with_token(options)


def files(url: str, directory: str, options: SourceOptions) -> list[str]:
    """The paths of every file of ``url``'s repository under ``directory`` (recursively), from the Hub's
    tree API with the user's token; the caller matches its glob.

    Raises:
        SourceError: the repository cannot be listed (no access: 401/403; unreachable after the retries).
        ShardNotFoundError: no such repository or revision.
    """
    p = parse(url)
    where = quote(directory.rstrip("/"))
    listing = f"{endpoint()}/api/{p.kind or 'models/'}{p.repo}/tree/{quote(p.revision, safe='')}/{where}?recursive=true"
    return _files(listing, with_token(options))


def _files(listing: str, options: SourceOptions) -> list[str]:
    """Every file path of a tree listing, its pages followed. The token goes to the pages of the listing's
    own scheme and host only: from the first page (or redirect) elsewhere on, every request goes without it
    (a ``Link`` is a redirect the server chose)."""
    found: list[str] = []
    url: str | None = listing
    headers = dict(options.headers)
    while url is not None:
        entries, final, url, kept = options.retry.call(functools.partial(_page, url, headers, options), listing)
        if not kept or (url is not None and not credentials_follow(final, url)):
            headers = without_credentials(headers)
        for e in entries:
            path = e.get("path") if isinstance(e, dict) else None
            if isinstance(path, str) and e.get("type") == "file":
                found.append(path)
    return found


def _page(url: str, headers: dict[str, str], options: SourceOptions) -> tuple[list[dict[str, object]], str, str | None, bool]:
    """One page of a listing: its entries, the URL that answered (after redirects), the next page's URL
    (``Link: <...>; rel="next"``, relative to the page) and whether the credentials reached the page."""
    conn, resp, final, _, kept = _http_get(url, headers, options.timeout, 1 << 20, 0)
    try:
        body = resp.read()
        if resp.status != 200:
            raise http_status_error(url, resp.status, resp.reason, resp.getheader("Retry-After"), 0)
        try:
            entries = json.loads(body)
        except ValueError as exc:
            raise SourceError(url, 0, f"the Hub's listing is not JSON ({exc})") from exc
        if not isinstance(entries, list):
            raise SourceError(url, 0, "the Hub's listing is not a list")
        link = _LINK_NEXT.search(resp.getheader("Link") or "")
        return entries, final, urljoin(final, link.group(1)) if link else None, kept
    finally:
        conn.close()
