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
from typing import Any, NamedTuple, Protocol

from . import _native, tar
from .errors import DuplicateMemberError, shown
from .tar import BLOCK, Buffer, Entry

__all__: list[str] = []  # internal module: its names serve the package, the public API is tarindex.__all__

# the packer in C (names in the common case split on bytes, the rest by sample_key); TablePacker is the reference

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


def sample_key(name: str) -> tuple[str, str] | None:
    """Like :func:`split_key`, and ``None`` for WebDataset metadata files too: the rule for whether a member joins a sample."""
    split = split_key(name)
    if split is None or (name[:2] == "__" and _is_meta(name)):
        return None
    return split


RESERVED = frozenset({"__key__", "__url__", "__index__"})
"""Fields every sample dict has: a member with one of these as its extension is refused like a duplicate."""


def _duplicate(path: str, header_offset: int, ext: str, key: str, name: str) -> DuplicateMemberError:
    if ext in RESERVED:
        what = f"member {shown(name)} would replace the reserved field {ext!r} of sample {shown(key)}"
        return DuplicateMemberError(path, header_offset, what)
    return DuplicateMemberError(path, header_offset, f"duplicate extension {ext!r} in sample {shown(key)} (member {shown(name)})")


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
        split = sample_key(name)
        if split is None:
            continue
        k, ext = split
        if k != key:
            if key is not None:
                yield SampleRecord(key, start, end - start, tuple(current), tuple(payloads) if with_data else None)
            key, start, current, exts, payloads = k, header_offset, [], [], []
        elif ext in exts:
            raise _duplicate(path, header_offset, ext, k, name)
        if ext in RESERVED:
            raise _duplicate(path, header_offset, ext, k, name)
        current.append((ext, offset, size))
        exts.append(ext)
        if data is not None:
            with_data = True
            payloads.append(data)
        end = offset + ((size + BLOCK - 1) & ~(BLOCK - 1))
    if key is not None:
        yield SampleRecord(key, start, end - start, tuple(current), tuple(payloads) if with_data else None)


Columns = tuple[Any, Any, Any, Any, Any, Any, list[str], list[str]]
"""``(sample_offset, sample_size, sample_nmembers, member_ext, member_offset, member_size, keys, exts)``:
the first six as sequences of ints or little-endian buffers of u64/u64/u32/u16/u64/u64 (see
:class:`tarindex.tables.ShardTable`)."""


class Packer(Protocol):
    """Members in archive order -> a shard's offset tables (see :func:`new_packer`)."""

    def add(self, name: str, header_offset: int, offset: int, size: int, /) -> None: ...
    def finish(self) -> Columns: ...


def pack_samples(samples: Iterable[SampleRecord]) -> Columns:
    """Samples -> offset-table columns (extensions numbered in order of first appearance)."""
    s_off: list[int] = []
    s_size: list[int] = []
    s_n: list[int] = []
    keys: list[str] = []
    m_ext: list[int] = []
    m_off: list[int] = []
    m_size: list[int] = []
    ext_ids: dict[str, int] = {}
    for rec in samples:
        keys.append(rec.key)
        s_off.append(rec.offset)
        s_size.append(rec.size)
        s_n.append(len(rec.members))
        base = rec.offset
        for ext, off, size in rec.members:
            eid = ext_ids.get(ext)
            if eid is None:
                eid = ext_ids[ext] = len(ext_ids)
            m_ext.append(eid)
            m_off.append(off - base)
            m_size.append(size)
    return s_off, s_size, s_n, m_ext, m_off, m_size, keys, list(ext_ids)


class TablePacker:
    """The reference :class:`Packer`: keeps the members, groups them with :func:`group_members` at the end."""

    __slots__ = ("entries", "path")

    def __init__(self, path: str) -> None:
        self.path = path
        self.entries: list[Entry] = []

    def add(self, name: str, header_offset: int, offset: int, size: int, /) -> None:
        """Add one regular member, in archive order."""
        self.entries.append((name, header_offset, offset, size, None))

    def finish(self) -> Columns:
        """The offset tables of the members added.

        Raises:
            DuplicateMemberError: two members of one sample have the same extension.
        """
        return pack_samples(group_members(self.entries, self.path))


def new_packer(path: str) -> Packer:
    """A packer for one shard: the C one (which also walks plain headers itself, see
    :func:`tarindex.tar.index_tar`) when the extension is built, else :class:`TablePacker`.

    Both give the same tables and raise the same :class:`DuplicateMemberError`
    from ``finish()`` (a walk error anywhere in the shard comes first).
    """
    speedups = _native.SPEEDUPS
    if speedups is None:
        return TablePacker(path)
    packer: Packer = speedups.Packer(sample_key, lambda offset, ext, key, name: _duplicate(path, offset, ext, key, name))
    return packer


def fused() -> bool:
    """Whether :func:`iter_samples` runs the fused C walk (then a local file is best given as its
    descriptor: large members are read straight into their bytes; the Python walker is faster over blocks)."""
    return _native.SPEEDUPS is not None


def iter_samples(
    source: Iterable[Buffer] | int | tar.DirectArchive,
    url: str,
    *,
    index: int | None = None,
    max_member_size: int | None = None,
    allow_missing_end: bool = False,
) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(sample offset, sample)`` for each sample of an archive: chunks, an open file's descriptor,
    or a :class:`tarindex.tar.DirectArchive` (a socket the C walk reads itself).

    A sample is ``{"__key__": key, "__url__": url, "__index__": index, ext: bytes, ...}``
    (``__index__`` counting up from ``index``, only when it is given). With the C
    extension the walk and the grouping are one pass in C (a local file is read with
    ``pread``, each large member straight into its own bytes); the reference is
    :func:`tarindex.tar.iter_tar` and :func:`group_members`, with the same samples and errors.
    A member over ``max_member_size`` is an error before anything is allocated for it (default:
    :data:`tarindex.tar.MAX_MEMBER_SIZE` for a source of unknown length, chunks or a stream; none but
    the file's size for a file). ``allow_missing_end``: an archive may end without its end-of-archive
    marker (see :func:`tarindex.tar.iter_tar`).

    Raises:
        CorruptArchiveError: see :func:`tarindex.tar.iter_tar`.
        DuplicateMemberError: two members of one sample have the same extension.
    """
    speedups = _native.SPEEDUPS
    if speedups is not None:
        packer = speedups.Packer(sample_key, lambda offset, ext, key, name: _duplicate(url, offset, ext, key, name), url, index)
        yield from tar.group_tar(source, url, packer, max_member_size=max_member_size, allow_missing_end=allow_missing_end)
        return
    if isinstance(source, tar.DirectArchive):
        source = tar.direct_chunks(source)
    if isinstance(source, int):
        entries = tar.iter_tar_file(source, url, with_data=True, max_member_size=max_member_size, allow_missing_end=allow_missing_end)
    else:
        entries = tar.iter_tar(source, url, with_data=True, max_member_size=max_member_size, allow_missing_end=allow_missing_end)
    for rec in group_members(entries, url):
        sample: dict[str, Any] = {"__key__": rec.key, "__url__": url}
        if index is not None:
            sample["__index__"] = index
            index += 1
        sample.update(zip([m[0] for m in rec.members], rec.data or ()))
        yield rec.offset, sample
