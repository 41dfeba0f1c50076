"""wids shard lists (the JSON files ``wids.ShardListDataset`` reads) as shard names, and back.

A list is ``{"wids_version": 1, "shardlist": [{"url": ..., "nsamples": ..., "filesize": ...}, ...]}``, optionally
with ``"base"`` (a directory or URL the relative ``url``\\ s are resolved against; default: the list's own
directory) and ``"datasets"`` (further lists given inline, each with its ``shardlist`` and optional ``base``).
Names are data: a ``url`` with a scheme (``https://``, ``s3://``) is a URL, a relative one a path from the base,
and a command (``pipe:``) is refused.
"""

from __future__ import annotations

import json
import os
import posixpath
import urllib.parse
from typing import Any

from .errors import ListError
from .naming import ShardRef, as_path

__all__: list[str] = []  # internal module: its names serve the package, the public API is tarindex.__all__

KIND = "wids-shard-index-v1"
"""The ``__kind__`` of the lists ``wids`` writes (``widsindex create``)."""


def is_wids_list(name: str) -> bool:
    """Whether a shard argument names a wids shard list (a local ``.json`` file)."""
    return name.lower().endswith(".json") and ShardRef.of(name).local and os.path.isfile(name)


def wids_shards(path: str) -> list[str]:
    """The shard names of the wids list at ``path``, in order.

    Raises:
        ListError: not JSON, not a wids list (version 1), an entry without a string ``url``, a command, or a
            dataset that is only a reference (``source_url``) to another list.
    """
    try:
        with open(path, encoding="utf-8") as f:
            desc = json.load(f)
    except (OSError, ValueError) as exc:
        raise ListError(path, f"not a readable JSON shard list ({exc})") from exc
    if not isinstance(desc, dict) or desc.get("wids_version") != 1:
        raise ListError(path, "not a wids shard list (expected a JSON object with \"wids_version\": 1)")
    out = _shard_list(path, desc, _base(path, desc.get("base")), "")
    for i, part in enumerate(desc.get("datasets", [])):
        where = f"datasets[{i}]"
        if not isinstance(part, dict) or "source_url" in part:
            raise ListError(path, f"{where}: only datasets given inline (a \"shardlist\") are read; a \"source_url\" is not followed")
        out += _shard_list(path, part, _base(path, part.get("base", desc.get("base"))), where + ".")
    if not out:
        raise ListError(path, "the list names no shard")
    return out


def _base(path: str, base: Any) -> str:
    if base is None:
        return os.path.dirname(path)
    if not isinstance(base, str):
        raise ListError(path, f"\"base\" must be a string, got {base!r}")
    return base if ShardRef.of(base).url else os.path.join(os.path.dirname(path), base)


def _shard_list(path: str, desc: dict[str, Any], base: str, where: str) -> list[str]:
    entries = desc.get("shardlist", [])
    if not isinstance(entries, list):
        raise ListError(path, f"{where}shardlist must be a list")
    out = []
    for i, entry in enumerate(entries):
        url = entry.get("url") if isinstance(entry, dict) else None
        if not isinstance(url, str) or not url:
            raise ListError(path, f"{where}shardlist[{i}]: expected an object with a string \"url\"")
        ref = ShardRef.of(url)
        if ref.stored == "command":
            raise ListError(path, f"{where}shardlist[{i}]: {url!r} is a command; a list's names are not run")
        if ref.url:
            out.append(url)
        elif ShardRef.of(base).url:  # as wids merges them: the base's scheme and host, the paths joined
            parts = urllib.parse.urlsplit(base)
            joined = url if url.startswith("/") else posixpath.normpath(posixpath.join(parts.path or "/", url))
            out.append(urllib.parse.urlunsplit(parts._replace(path=joined, query="", fragment="")))
        else:
            out.append(as_path(os.path.normpath(os.path.join(base, url))))
    return out
