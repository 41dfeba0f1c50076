"""The index's container and meta: the LMDB file checked before it is mapped, the sealed meta's
checksum and schema. Imports neither numpy nor the record codec, so ``tarindex info`` (which
shows what the meta holds) starts as fast as the CLI itself.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import lmdb

from ..errors import IndexFormatError
from .format import CONTENT_SUMMARY, FORMAT_VERSION, MAGIC, META_KEY, SHARD_SUMMARY, unseal

__all__: list[str] = []  # internal module: the index reader and `tarindex info` use these names

_LMDB_MAGIC = 0xBEEFC0DE


def check_container(path: Path) -> None:
    """Check that the file holds every page its LMDB meta pages name, before it is mapped.

    A truncated index (an interrupted copy, a full disk) would otherwise be mapped and
    fault (``SIGBUS``) on the first page past its end.

    Raises:
        IndexFormatError: not an LMDB file, or shorter than its meta pages say.
    """
    try:
        with open(path, "rb") as f:
            head = f.read(152)
            size = os.fstat(f.fileno()).st_size
            psize = int.from_bytes(head[40:44], "little") if len(head) >= 152 else 0
            if len(head) < 152 or int.from_bytes(head[16:20], "little") != _LMDB_MAGIC or not 512 <= psize <= 1 << 16:
                raise IndexFormatError(f"{path}: not a tarindex index (not an LMDB file: {size} bytes)")
            f.seek(psize)
            second = f.read(152)
    except OSError as exc:
        raise IndexFormatError(f"{path}: cannot read the index ({exc.strerror or exc})") from exc
    metas = [head] + ([second] if len(second) == 152 and int.from_bytes(second[16:20], "little") == _LMDB_MAGIC else [])
    meta = max(metas, key=lambda m: int.from_bytes(m[144:152], "little"))  # LMDB uses the later transaction's
    last = int.from_bytes(meta[136:144], "little")
    if (last + 1) * psize > size:
        raise IndexFormatError(
            f"{path}: the index is truncated (expected at least {(last + 1) * psize} bytes, got {size}); rebuild or copy it again"
        )


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
    return [*checks, ("ext_members", ok and sum(counts) == meta["n_members"])]


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
                ("block_samples", b > 0),
                ("shard_block", meta["shard_block"] > 0),
                ("n_blocks", meta["n_blocks"] == -(-n // b)),
                ("n_buckets", (meta["n_buckets"] > 0) == (n > 0)),
                ("sample_bytes", 1 <= meta["sample_bytes"] <= 8 and n <= 1 << (8 * meta["sample_bytes"])),
                ("exts", isinstance(meta.get("exts"), list) and all(isinstance(e, str) for e in meta["exts"])),
                ("build_id", isinstance(meta.get("build_id"), str)),
                ("part", _is_part(meta.get("part"))),
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


def _is_part(part: Any) -> bool:
    if part is None:
        return True
    return isinstance(part, list) and len(part) == 2 and all(type(x) is int for x in part) and 1 <= part[0] <= part[1]


def read_meta(path: Path) -> dict[str, Any]:
    """The meta of the index at ``path``, checked, without mapping more than its page.

    Raises:
        IndexFormatError: not a tarindex index, another format version, truncated or damaged.
    """
    check_container(path)
    try:
        env = lmdb.open(str(path), subdir=False, readonly=True, lock=False, max_dbs=0, readahead=False)
    except lmdb.Error as exc:
        raise IndexFormatError(f"{path}: not a tarindex index ({exc})") from exc
    try:
        with env.begin() as txn:
            raw = txn.get(META_KEY)
    except lmdb.Error as exc:
        raise IndexFormatError(f"{path}: the index is damaged ({exc}); rebuild the index") from exc
    finally:
        env.close()
    return check_meta(path, raw)
