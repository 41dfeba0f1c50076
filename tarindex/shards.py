"""Shard arguments (paths, globs, brace patterns), default index paths, fingerprints.

Names are data (:mod:`tarindex.naming`): a scheme means something only in a name the caller wrote; a name
a glob matched is a path (:func:`tarindex.naming.as_path`).
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ._codecs import HEAD_BYTES, SUFFIXES, looks_like_index, looks_like_shard, sniff_file
from .errors import NotRegularFileError, PatternError, ShardNotFoundError
from .naming import ShardRef, as_path

__all__: list[str] = []  # internal module: its names serve the package, the public API is tarindex.__all__

INDEX_SUFFIX = ".tarindex"
FINGERPRINT_SPAN = 64 << 10
PATTERN_SEPARATOR = "::"
_ENV = re.compile(r"\$\{(\w+)\}")
_ESCAPED = {"{": "\x00(", "}": "\x00)"}  # stand-ins for escaped braces (no name holds a NUL)


def expand_braces(pattern: str) -> list[str]:
    """Expand one shard pattern exactly as webdataset does, in order.

    ``${NAME}`` takes the value of the environment variable ``WDS_NAME``; then
    :func:`braceexpand.braceexpand` expands ``{a,b}`` lists, ``{000..099}``
    ranges (padded to the wider bound), ``{a..e}``, steps (``{0..10..2}``) and
    nested braces; ``\\{`` is a literal brace.

    Raises:
        PatternError: unbalanced braces, a brace left unexpanded (``{a}``), a
            missing ``WDS_`` variable, or an empty name.
    """
    from braceexpand import braceexpand

    text = _substitute_env(pattern)
    try:
        names = list(braceexpand(_hide_escaped_braces(text)))
    except ValueError as exc:  # braceexpand.UnbalancedBracesError
        raise PatternError(f"{pattern!r}: unbalanced braces") from exc
    out = []
    for name in names:
        shown = name.replace(_ESCAPED["{"], "{").replace(_ESCAPED["}"], "}")
        if "{" in name:
            raise PatternError(f"{pattern!r}: brace left unexpanded in {shown!r} (write \\{{ for a literal brace)")
        if not name:
            raise PatternError(f"{pattern!r}: expands to an empty name")
        out.append(shown)
    return out


def _substitute_env(pattern: str) -> str:
    """``${NAME}`` -> the value of ``WDS_NAME``, repeated while it changes (at most 10 times, as webdataset)."""

    def value(m: re.Match[str]) -> str:
        name = "WDS_" + m.group(1)
        if name not in os.environ:
            raise PatternError(f"{pattern!r}: environment variable {name} is not set")
        return os.environ[name]

    text = pattern
    for _ in range(10):
        text, last = _ENV.sub(value, text), text
        if text == last:
            break
    return text


def _hide_escaped_braces(pattern: str) -> str:
    """``\\{`` and ``\\}`` as stand-ins, so that a brace left after expansion was not escaped."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            nxt = pattern[i + 1]
            # the backslash stays: braceexpand unescapes a piece again after a list alternative
            # (braceexpand gives a backslash-brace for `{a,BS BS}BS}`), so the stand-in is escaped the same way
            out.append(c + _ESCAPED[nxt] if nxt in _ESCAPED else c + nxt)
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def expand_patterns(spec: str) -> list[str]:
    """Expand ``::``-joined shard patterns (webdataset's ``expand_urls``), in order.

    Raises:
        PatternError: see :func:`expand_braces`.
    """
    parts = spec.split(PATTERN_SEPARATOR)
    if len(parts) > 1 and not all(parts):
        raise PatternError(f"{spec!r}: an empty pattern beside '{PATTERN_SEPARATOR}'")
    return [name for part in parts for name in expand_braces(part)]


def is_fingerprint(value: object) -> bool:
    """Whether ``value`` has the form :func:`fingerprint` gives (32 lower-case hex digits): safe in a file name."""
    return isinstance(value, str) and re.fullmatch(r"[0-9a-f]{32}", value) is not None


def expand_shards(
    specs: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    *,
    must_exist: bool = True,
    storage_options: dict[str, Any] | None = None,
) -> list[str]:
    """Turn paths, globs and patterns (braces, ``::``) into a list of shard names, in order.

    A glob in a URL lists the store (``file://``; ``s3://``, ``gs://``, ``az://`` through obstore;
    ``hf://`` and any other fsspec protocol through fsspec: :func:`tarindex.objstore.glob_urls`);
    ``http(s)://`` URLs pass through. A local ``.json`` file is a wids shard list: its shards, in order
    (:mod:`tarindex._widslist`).

    A scheme is honoured in the names given, never in the names a glob matches (see :func:`tarindex.naming.as_path`).

    Raises:
        PatternError: a pattern does not expand (see :func:`expand_braces`).
        ShardNotFoundError: a path does not exist, or a glob matches nothing.
        ListError: a ``.json`` file that is not a wids shard list.
    """
    from ._widslist import is_wids_list, wids_shards  # the list reader names its paths as this module does

    items = [specs] if isinstance(specs, (str, os.PathLike)) else list(specs)
    out: list[str] = []
    for spec in items:
        text = os.fspath(spec)
        for s in expand_patterns(text):
            ref = ShardRef.of(s)
            if ref.listable and glob.has_magic(s):
                out.extend(_glob_url(ref, text, must_exist, storage_options))
            elif not ref.local:
                out.append(s)
            elif glob.has_magic(s):
                found = sorted(glob.glob(s))
                matches = [m for m in found if not is_index_file(m)]  # an index beside its shards is no shard
                if not matches and must_exist:
                    also = f" (only the tarindex index {found[0]})" if len(found) == 1 else f" (only {len(found)} tarindex indexes)" if found else ""
                    raise ShardNotFoundError(f"{s}: no shard matches this pattern{also} (from {text!r})")
                out.extend(as_path(m) for m in matches)
            elif is_wids_list(s):  # a wids shard list (JSON): its shards
                out.extend(wids_shards(s))
            else:
                if must_exist and os.path.isdir(s):
                    example = os.path.join(s, "*.tar")
                    raise ShardNotFoundError(f"{s}: is a directory, not a shard; name its shards, for example '{example}'")
                if must_exist and not os.path.isfile(s):
                    if os.path.exists(s):
                        raise NotRegularFileError(f"{s}: not a regular file (a FIFO, socket or device); a shard must be a regular file")
                    raise ShardNotFoundError(f"{s}: no such shard")
                out.append(s)
    return out


SHARD_SUFFIXES = SUFFIXES
"""Names a glob match is taken as a shard by, unread (the codec registry's suffixes); any other match is read
to tell an index from a shard."""


def is_index_file(path: str) -> bool:
    """Whether a glob's match is a tarindex index (an LMDB file, by its first bytes), to be left out of the shards.

    A name with a shard's suffix (:data:`SHARD_SUFFIXES`) is not read: a glob over 100,000 shards on a network
    file system opens none of them here. Something that is not a regular file is not read either (a FIFO would
    block): opening it as a shard names it.
    """
    if path.endswith(SHARD_SUFFIXES):
        return False
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode) and looks_like_index(os.pread(fd, HEAD_BYTES, 0))
    except OSError:
        return False
    finally:
        os.close(fd)


def _glob_url(ref: ShardRef, spec: str, must_exist: bool, storage_options: dict[str, Any] | None) -> list[str]:
    """The objects a URL glob matches, sorted by name.

    Raises:
        ShardNotFoundError: nothing matches (with ``must_exist``).
    """
    if ref.kind == "file-url":
        matches = [ref.prefix + m for m in sorted(glob.glob(ref.path))]
    else:
        from .objstore import glob_urls

        matches = glob_urls(ref.name, storage_options=storage_options)
    if not matches and must_exist:
        raise ShardNotFoundError(f"{ref.name}: no shard matches this pattern (from {spec!r})")
    return matches


def default_index_path(shards: list[str]) -> Path:
    """The sidecar index of a shard set: ``<dir>/<common name prefix>.tarindex``.

    ``data/train-000000.tar`` ... ``data/train-000099.tar`` -> ``data/train.tarindex``.
    """
    if not shards:
        raise ShardNotFoundError("no shards given")
    paths = [os.path.abspath(s) for s in shards]
    directory = Path(os.path.commonpath(list({os.path.dirname(p) for p in paths})))
    names = [os.path.basename(p) for p in paths]
    stem = os.path.commonprefix(names) if len(names) > 1 else names[0].split(".", 1)[0]  # noqa: RUF071 - a common name prefix, not a path
    stem = stem.split(".", 1)[0]
    if len(names) > 1:
        stem = _set_stem(stem)
    stem = stem.rstrip("-_.") or "shards"
    return directory / (stem + INDEX_SUFFIX)


def _set_stem(stem: str) -> str:
    """The name of the set a shard name's stem belongs to: ``train-000003`` -> ``train``."""
    return stem.rstrip("0123456789").rstrip("-_.")


def index_candidates(shards: list[str]) -> Iterator[Path]:
    """Where an index of ``shards`` may be, in the order to look: :func:`default_index_path`, the default name of
    the set the first shard belongs to (``d/train.tarindex`` for ``d/train-000003.tar``), ``shards.tarindex``,
    then every other ``*.tarindex`` in their directory by name, parts of a split (``*.part-K-of-N.tarindex``) last
    (the directory is listed only when the caller asks past the names before).
    """
    first = default_index_path(shards)
    directory = first.parent
    stem = _set_stem(Path(shards[0]).name.split(".", 1)[0]) or "shards"
    seen: set[Path] = set()
    for path in (first, directory / (stem + INDEX_SUFFIX), directory / ("shards" + INDEX_SUFFIX)):
        if path not in seen:
            seen.add(path)
            yield path
    try:
        others = sorted(directory.glob("*" + INDEX_SUFFIX), key=lambda p: (".part-" in p.name, p.name))
    except OSError:
        others = []
    yield from (path for path in others if path not in seen)


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


def given_index(source: object) -> Path | None:
    """``source`` as an absolute path when it names an index file (``*.tarindex``, an LMDB file by its content, or
    a regular file that is not a shard by its content nor by its name: a ``.tgz`` shard is a shard), else ``None``
    (shards, to look for their index). A damaged file with a shard's name (an empty or garbled ``x.tar``) is a
    shard, so that reading it names the tar problem rather than "not an LMDB file"."""
    if not isinstance(source, (str, os.PathLike)):
        return None
    p = Path(source)
    if p.suffix == INDEX_SUFFIX:
        return p.absolute()
    if p.is_file():
        head = sniff_file(p)
        if looks_like_index(head) or not (looks_like_shard(head) or p.name.endswith(SHARD_SUFFIXES)):
            return p.absolute()
    return None
