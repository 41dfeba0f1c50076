"""Shard arguments (paths, globs, brace patterns), default index paths, fingerprints.

Names are data: a scheme (``pipe:``, ``-``, ``scheme://``) means something only in a name the caller
wrote. A name that came from a glob, a directory listing or an index is a path; :func:`as_path` makes
sure it reads as one (``pipe:rm -rf x.tar`` matched by ``*.tar`` becomes ``./pipe:rm -rf x.tar``).
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from .errors import IndexNotFoundError, ShardNotFoundError

__all__ = [
    "FINGERPRINT_SPAN",
    "INDEX_SUFFIX",
    "ShardKind",
    "as_path",
    "default_index_path",
    "expand_braces",
    "expand_shards",
    "fingerprint",
    "fingerprint_stream",
    "is_fingerprint",
    "resolve_index",
    "shard_kind",
]

ShardKind = Literal["file", "url", "command"]
"""How a shard is opened: a local ``file``, a ``url`` (``scheme://``), or a ``command`` (``pipe:CMD``, ``-``)."""

INDEX_SUFFIX = ".tarindex"
_RANGE = re.compile(r"\{(-?\d+)\.\.(-?\d+)\}")
FINGERPRINT_SPAN = 64 << 10


def expand_braces(pattern: str) -> list[str]:
    """Expand ``{000..099}`` ranges (zero padding kept) and ``{a,b}`` lists, left to right."""
    m = re.search(r"\{([^{}]*)\}", pattern)
    if m is None:
        return [pattern]
    head, body, tail = pattern[: m.start()], m.group(1), pattern[m.end() :]
    rng = _RANGE.fullmatch(m.group(0))
    if rng is not None:
        lo, hi = rng.group(1), rng.group(2)
        width = len(lo) if lo.lstrip("-").startswith("0") or len(lo) == len(hi) else 0
        step = 1 if int(hi) >= int(lo) else -1
        items = [f"{v:0{width}d}" for v in range(int(lo), int(hi) + step, step)]
    elif "," in body:
        items = body.split(",")
    else:
        return [head + "{" + body + "}" + t for t in expand_braces(tail)]
    return [head + item + rest for item in items for rest in expand_braces(tail)]


def shard_kind(name: str) -> ShardKind:
    """What a name the caller wrote means: ``command`` (``pipe:CMD``, ``-``), ``url`` (``scheme://``) or ``file``."""
    if name.startswith("pipe:") or name == "-":
        return "command"
    return "url" if "://" in name else "file"


def as_path(name: str) -> str:
    """A name from a listing (glob, directory, index) as a path that cannot read as a URL or command."""
    return name if shard_kind(name) == "file" else os.path.join(os.curdir, name)


def is_fingerprint(value: object) -> bool:
    """Whether ``value`` has the form :func:`fingerprint` gives (32 lower-case hex digits): safe in a file name."""
    return isinstance(value, str) and re.fullmatch(r"[0-9a-f]{32}", value) is not None


def expand_shards(specs: str | os.PathLike[str] | Iterable[str | os.PathLike[str]], *, must_exist: bool = True) -> list[str]:
    """Turn paths, globs and brace patterns into a list of shard paths, in order.

    A scheme is honoured in the names given, never in the names a glob matches (see :func:`as_path`).

    Raises:
        ShardNotFoundError: a path does not exist, or a glob matches nothing.
    """
    items = [specs] if isinstance(specs, (str, os.PathLike)) else list(specs)
    out: list[str] = []
    for spec in items:
        for s in expand_braces(os.fspath(spec)):
            if shard_kind(s) != "file":
                out.append(s)
            elif glob.has_magic(s):
                matches = sorted(glob.glob(s))
                if not matches and must_exist:
                    raise ShardNotFoundError(f"{s}: no shard matches this pattern")
                out.extend(as_path(m) for m in matches)
            else:
                if must_exist and not os.path.isfile(s):
                    raise ShardNotFoundError(f"{s}: no such shard")
                out.append(s)
    return out


def default_index_path(shards: list[str]) -> Path:
    """The sidecar index of a shard set: ``<dir>/<common name prefix>.tarindex``.

    ``data/train-000000.tar`` ... ``data/train-000099.tar`` -> ``data/train.tarindex``.
    """
    if not shards:
        raise ShardNotFoundError("no shards given")
    paths = [Path(s).absolute() for s in shards]
    directory = Path(os.path.commonpath([str(p.parent) for p in paths]))
    names = [p.name for p in paths]
    stem = os.path.commonprefix(names) if len(names) > 1 else names[0].split(".", 1)[0]  # noqa: RUF071 - a common name prefix, not a path
    stem = stem.split(".", 1)[0]
    if len(names) > 1:
        stem = stem.rstrip("0123456789")
    stem = stem.rstrip("-_.") or "shards"
    return directory / (stem + INDEX_SUFFIX)


def fingerprint(fd: int, size: int) -> str:
    """Hex digest of a shard's size and its first and last 64 KiB."""
    head = os.pread(fd, FINGERPRINT_SPAN, 0)
    tail = os.pread(fd, FINGERPRINT_SPAN, max(FINGERPRINT_SPAN, size - FINGERPRINT_SPAN)) if size > FINGERPRINT_SPAN else b""
    return fingerprint_stream(size, head, tail)


def fingerprint_stream(size: int, head: bytes, tail: bytes) -> str:
    """:func:`fingerprint` of a shard read as a stream: ``head`` its first bytes, ``tail`` its last 128 KiB (or all)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(size.to_bytes(8, "little"))
    h.update(head[:FINGERPRINT_SPAN])
    if size > FINGERPRINT_SPAN:
        n = size - max(FINGERPRINT_SPAN, size - FINGERPRINT_SPAN)
        h.update(tail[len(tail) - n :])
    return h.hexdigest()


def resolve_index(source: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> Path:
    """An index given as its file, or as the shards (list, glob, brace pattern) it sits beside.

    Raises:
        IndexNotFoundError: shards were given and no index sits beside them.
        ShardNotFoundError: a shard pattern matches nothing.
    """
    if isinstance(source, (str, os.PathLike)):
        p = Path(source)
        if p.suffix == INDEX_SUFFIX or (p.is_file() and not str(p).endswith((".tar", ".tar.zst", ".tzst"))):
            return p
    index = default_index_path(expand_shards(source))
    if not index.is_file():
        raise IndexNotFoundError(f"{index}: no index beside these shards (build one with 'tarindex build')")
    return index
