"""Members -> samples, by WebDataset's key rules.

A member ``dir/000123.seg.png`` has key ``dir/000123`` (path up to the first
dot of the base name, directory kept) and extension ``seg.png`` (the rest,
lower-cased). Consecutive members with the same key form one sample. Names
without a dot in the base name, or a top-level name that starts with a dot,
are not part of any sample, and neither are WebDataset metadata files
(``__name__`` at the top level, or paths matching ``__*__/``). We use
webdataset's own key pattern, so its quirks are ours too: ``x/.hidden.txt``
has key ``x/`` and extension ``hidden.txt``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import NamedTuple

from .errors import DuplicateMemberError
from .tar import BLOCK, Entry

__all__ = ["SampleRecord", "group_members", "split_key"]

_META = re.compile(r"__[^/]*__($|/)")


_KEY = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")  # webdataset's base_plus_ext, to the letter


def split_key(name: str) -> tuple[str, str] | None:
    """Split a member name into ``(key, extension)``; ``None`` if it has no key."""
    slash = name.rfind("/")
    dot = name.find(".", slash + 1)
    if dot > slash + 1:  # the common case, where the pattern needs no backtracking
        return name[:dot], name[dot + 1 :].lower()
    m = _KEY.match(name)
    if m is None:
        return None
    return m.group(1), m.group(2).lower()


def _is_meta(name: str) -> bool:
    if "/" not in name and name.startswith("__") and name.endswith("__"):
        return True
    return _META.match(name) is not None


class SampleRecord(NamedTuple):
    """One sample: a run of members sharing a key (a named tuple: one is made per sample on the hot path)."""

    key: str
    """The WebDataset key (path up to the first dot of the base name)."""
    offset: int
    """Offset of the first header block of the sample's first member."""
    size: int
    """Whole byte range: headers, data and padding of every member."""
    members: tuple[tuple[str, int, int], ...]
    """``(extension, data offset in the shard, data size)`` per member."""
    data: tuple[bytes, ...] | None = None
    """Each member's bytes, in member order, when the entries carried them."""


def group_members(entries: Iterable[Entry], path: str) -> Iterator[SampleRecord]:
    """Group :func:`tarindex.tar.iter_tar` entries into samples.

    Raises:
        DuplicateMemberError: two members of one sample have the same extension.
    """
    key: str | None = None
    start = end = 0
    current: list[tuple[str, int, int]] = []
    exts: list[str] = []
    payloads: list[bytes] = []
    with_data = False
    for name, header_offset, offset, size, data in entries:
        split = split_key(name)
        if split is None or (name[:2] == "__" and _is_meta(name)):
            continue
        k, ext = split
        if k != key:
            if key is not None:
                yield SampleRecord(key, start, end - start, tuple(current), tuple(payloads) if with_data else None)
            key, start, current, exts, payloads = k, header_offset, [], [], []
        elif ext in exts:
            raise DuplicateMemberError(
                path, header_offset, f"duplicate extension {ext!r} in sample {k!r} (member {name!r})"
            )
        current.append((ext, offset, size))
        exts.append(ext)
        if data is not None:
            with_data = True
            payloads.append(data)
        end = offset + ((size + BLOCK - 1) & ~(BLOCK - 1))
    if key is not None:
        yield SampleRecord(key, start, end - start, tuple(current), tuple(payloads) if with_data else None)
