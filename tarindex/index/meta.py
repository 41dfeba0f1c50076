"""The index's meta: the sealed meta's checksum and schema, its counts checked against each other and
against the file (the values they describe exist and have the sizes they imply), before anything is
allocated from them. Imports neither numpy nor the record codec, so ``tarindex info`` (which shows what
the meta holds) starts as fast as the CLI itself.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import IndexFormatError
from ..tables import MAX_EXTS
from .format import (
    BLOCK_PREFIX,
    CONTENT_SUMMARY,
    FORMAT_VERSION,
    LATER_CONTENT,
    MAGIC,
    META_KEY,
    SHARD_SUMMARY,
    START_KEY,
    bucket_keys,
)
from .pages import IndexFile, numbered, unseal

__all__: list[str] = []  # internal module: the index reader and `tarindex info` use these names

_META_INTS = (
    "n_samples", "n_members", "n_shards", "duplicate_keys", "block_samples", "n_blocks", "n_buckets", "sample_bytes", "shard_block",
    *SHARD_SUMMARY,
)  # fmt: skip


def _content_checks(meta: dict[str, Any]) -> list[tuple[str, bool]]:
    """The optional content summary (``CONTENT_SUMMARY``, ``ext_members``): absent, or whole and consistent."""
    if "ext_members" not in meta:
        return [(k, k not in meta) for k in CONTENT_SUMMARY]
    counts = meta["ext_members"]
    checks = [(k, type(meta.get(k)) is int and meta[k] >= 0) for k in CONTENT_SUMMARY]
    ok = (
        isinstance(counts, list) and len(counts) == len(meta["exts"]) and all(type(c) is int and c >= 0 for c in counts)
    )
    later = [(k, k not in meta or (type(meta[k]) is int and 0 <= meta[k] <= meta["n_shards"])) for k in LATER_CONTENT]
    return [*checks, *later, ("ext_members", ok and sum(counts) == meta["n_members"])]


def check_meta(path: Path, raw: Any) -> dict[str, Any]:
    """The meta, its checksum and schema checked.

    Raises:
        IndexFormatError: not a tarindex index, another format version, or damaged.
    """
    if raw is not None and bytes(raw[:1]) == b"{":  # format 3 and older: JSON without a checksum
        try:
            old = json.loads(bytes(raw))
        except ValueError:
            old = None
        if isinstance(old, dict) and old.get("magic") == MAGIC:
            raise IndexFormatError(
                f"{path}: index format version {old.get('format_version')}, this tarindex reads version {FORMAT_VERSION}; "
                "rebuild the index ('tarindex build' over it does)"
            )
    if raw is None:
        raise IndexFormatError(f"{path}: an LMDB file, but not a tarindex index")
    try:
        meta = json.loads(bytes(unseal(raw, META_KEY, f"{path}: the index's meta")))
    except ValueError as exc:
        raise IndexFormatError(f"{path}: the index's meta is damaged ({exc}); rebuild the index") from exc
    if not isinstance(meta, dict) or meta.get("magic") != MAGIC:
        raise IndexFormatError(f"{path}: an LMDB file, but not a tarindex index")
    if meta.get("format_version") != FORMAT_VERSION:
        raise IndexFormatError(
            f"{path}: index format version {meta.get('format_version')}, this tarindex reads version {FORMAT_VERSION}; rebuild the index"
        )
    bad = [k for k in _META_INTS if type(meta.get(k)) is not int or meta[k] < 0]
    if not bad:
        n, b = meta["n_samples"], meta["block_samples"]
        bad = [
            name
            for name, ok in (
                ("block_samples", 0 < b <= _MAX_U32),  # a block header's n is a u32
                ("shard_block", 0 < meta["shard_block"] <= _MAX_U32),
                ("n_blocks", b > 0 and meta["n_blocks"] == -(-n // b)),  # b checked above, but every row is computed
                ("sample_bytes", meta["sample_bytes"] == max(1, (max(n - 1, 0).bit_length() + 7) // 8)),  # as written
                ("n_buckets", meta["n_buckets"] in _bucket_counts(n, meta["sample_bytes"])),
                ("exts", _are_exts(meta.get("exts"))),
                ("build_id", isinstance(meta.get("build_id"), str)),
                ("part", _is_part(meta.get("part"))),
                ("packed", meta.get("packed") is None or isinstance(meta["packed"], str)),  # a pack's output pattern
                ("url_shards", meta["url_shards"] + meta["command_shards"] <= meta["n_shards"]),
                ("zstd_samples", meta["zstd_samples"] <= n and (meta["zstd_frames"] > 0) == (meta["zstd_samples"] > 0)),
                *_content_checks(meta),
            )
            if not ok
        ]
    if bad:
        shown = {k: meta.get(k) for k in bad}
        raise IndexFormatError(
            f"{path}: the index's meta is damaged (bad {', '.join(bad)}: {str(shown)[:200]}); rebuild the index"
        )
    return meta


def _bucket_counts(n: int, sample_bytes: int) -> tuple[int, ...]:
    """The bucket counts a writer gives ``n`` samples: by entry width (``bucket_keys``), or 256 keys a bucket
    (format-5 indexes written before buckets were sized by width). Any other count sends lookups to the
    wrong bucket, so it is refused."""
    return (-(-n // bucket_keys(sample_bytes)), -(-n // 256)) if 1 <= sample_bytes <= 8 else ()


_MAX_U32 = 0xFFFF_FFFF
_RESERVED = ("__key__", "__url__", "__index__")  # fields of every sample dict (tarindex.grouping.RESERVED)


def _are_exts(exts: Any) -> bool:
    """An extension table: distinct non-empty strings, none a sample's reserved field, at most ``MAX_EXTS``."""
    return (
        isinstance(exts, list)
        and len(exts) <= MAX_EXTS
        and all(isinstance(e, str) and e and e not in _RESERVED for e in exts)
        and len(set(exts)) == len(exts)
    )


def _is_part(part: Any) -> bool:
    if part is None:
        return True
    return isinstance(part, list) and len(part) == 2 and all(type(x) is int for x in part) and 1 <= part[0] <= part[1]


def open_meta(file: IndexFile) -> dict[str, Any]:
    """The meta of an open index file, checked (:func:`check_meta`), and its counts against the file: the
    shard start table has ``n_shards + 1`` entries, and the last record block is ``n_blocks - 1`` (read from
    the B-tree's leaves: no table is read). A crafted count is refused here, before a reader allocates
    anything by it.

    Raises:
        IndexFormatError: not a tarindex index, another format version, or damaged.
    """
    path = file.path
    meta = check_meta(path, file.get(META_KEY))
    starts = file.size_of(START_KEY)
    if starts != 4 + 8 * (meta["n_shards"] + 1):
        raise IndexFormatError(
            f"{path}: the index's meta is damaged (bad n_shards: {meta['n_shards']}, the shard start table holds "
            f"{'no' if starts is None else max(starts - 4, 0) // 8} entries, expected n_shards + 1); rebuild the index"
        )
    n_blocks = meta["n_blocks"]
    if n_blocks and (file.size_of(numbered(BLOCK_PREFIX, n_blocks - 1)) is None or file.size_of(numbered(BLOCK_PREFIX, n_blocks)) is not None):
        raise IndexFormatError(
            f"{path}: the index's meta is damaged (bad n_blocks: {n_blocks} record blocks of {meta['block_samples']} samples "
            f"for {meta['n_samples']} samples, the file holds another number); rebuild the index"
        )
    return meta


def read_meta(path: Path) -> dict[str, Any]:
    """The meta of the index at ``path``, checked, reading only the pages on its way.

    Raises:
        IndexFormatError: not a tarindex index, another format version, truncated or damaged.
    """
    try:
        file = IndexFile(path)
    except OSError as exc:
        raise IndexFormatError(f"{path}: cannot read the index ({exc.strerror or exc})") from exc
    try:
        return open_meta(file)
    except OSError as exc:
        raise IndexFormatError(f"{path}: cannot read the index ({exc.strerror or exc})") from exc
    finally:
        file.close()
