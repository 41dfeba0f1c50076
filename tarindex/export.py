"""Indexes for other loaders, written from a tarindex index without reading a shard.

- :func:`export_dali`: NVIDIA DALI's webdataset index files (``fn.readers.webdataset(index_paths=...)``), one per
  shard, in the format DALI's ``tools/wds2idx.py`` writes (version ``v1.2``: a line ``v1.2 N``, then a line per
  sample of ``ext data_offset size name`` per member).
- :func:`export_wids`: a wids shard list (``wids.ShardListDataset``): the shards with their sample counts and sizes.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path

import numpy as np

from . import _native
from ._atomic import atomic_write
from ._codecs import stores_tar
from .errors import ExportError, OverwriteError, shown
from .index.merge import relative_path
from .index.reader import IndexReader
from .naming import shard_name
from .view import find_index

__all__ = ["export_dali", "export_wids"]

DALI_VERSION = "v1.2"
"""The index version DALI's ``wds2idx`` writes (DALI reads ``v1.1`` and ``v1.2``)."""
_SPACE = re.compile(rb"\s")
_SPACES = b" \t\n\r\x0b\x0c"  # what _SPACE matches
_WIDS_KIND = "wids-shard-index-v1"
_WIDS_HEAD = re.compile(rb'"__kind__"\s*:\s*"' + _WIDS_KIND.encode() + rb'"')


def _check_output(path: Path, replaceable: Callable[[bytes], bool], what: str) -> None:
    """Refuse to write ``path`` over a file an export did not write (a shard or the index named by mistake):
    replaced are nothing, an empty file, and a file whose first 4 KiB ``replaceable`` accepts.

    Raises:
        OverwriteError: naming the file and what to do.
    """
    try:
        st = os.stat(path)
        if stat.S_ISREG(st.st_mode) and st.st_size == 0:
            return
        with open(path, "rb") as f:
            head = f.read(4096) if stat.S_ISREG(st.st_mode) else None
    except FileNotFoundError:
        return
    except OSError as exc:  # a directory, unreadable: not an earlier export
        raise OverwriteError(f"{path}: exists and cannot be read ({exc.strerror or exc}); refusing to overwrite it") from exc
    if head is None or not replaceable(head):
        raise OverwriteError(f"{path}: exists and is not {what}; refusing to overwrite it: remove it first, or choose another path")


def _is_dali(head: bytes) -> bool:
    return head.startswith(b"v1.")


def _is_wids(head: bytes) -> bool:
    return head.lstrip().startswith(b"{") and _WIDS_HEAD.search(head) is not None


def _open(index: str | os.PathLike[str]) -> IndexReader:
    return IndexReader(find_index(index)[0])


def _plain(reader: IndexReader, i: int, loader: str) -> str:
    """Shard ``i``'s name, refused unless it is a plain tar (other loaders read raw tar offsets).

    Raises:
        ExportError: the shard is compressed.
    """
    info = reader.shards[i]
    name = shard_name(reader.path, info)
    if not stores_tar(info.compression):
        raise ExportError(name, f"is a {info.compression} shard; {loader} reads plain tar files (offsets in the index are in the decompressed tar)")
    return name


def export_dali(index: str | os.PathLike[str], directory: str | os.PathLike[str]) -> list[Path]:
    """Write DALI webdataset index files for every shard of ``index`` into ``directory``; returns their paths.

    Shard ``d/train-000000.tar`` gets ``directory/train-000000.idx`` (the name ``wds2idx`` gives it by default),
    listing each sample's members with their data offsets and sizes from the index, byte for byte what
    ``wds2idx`` writes for a tar of these samples (extensions are lower-case in a tarindex index). Pass the shards
    and these files in the same order to ``fn.readers.webdataset(paths=..., index_paths=...)``. Each file is
    written atomically.

    Raises:
        IndexNotFoundError, IndexFormatError: ``index`` is missing or not an index.
        ExportError: a compressed shard, a shard without samples, a key or extension with white space (DALI's
            format separates fields by it), or two shards that would get the same index file name.
        OverwriteError: an index file's name holds a file that is not a DALI index (nothing is written).
    """
    reader = _open(index)
    out = Path(directory)
    try:
        names = [_plain(reader, i, "DALI") for i in range(len(reader.shards))]
        files: dict[str, str] = {}
        for name in names:
            base = os.path.basename(name)
            dot = base.find(".", 1)
            target = (base[:dot] if dot > 0 else base) + ".idx"
            if target in files:
                raise ExportError(name, f"would get the same DALI index file {target} as {files[target]}")
            files[target] = name
        for target in files:  # all checked before any is written
            _check_output(out / target, _is_dali, "a DALI index file")
        paths = []
        for i, (target, name) in enumerate(files.items()):
            data = _dali_bytes(reader, i, name)
            path = out / target
            with atomic_write(path) as f:
                f.write(data)
            paths.append(path)
        return paths
    finally:
        reader.close()


def _dali_bytes(reader: IndexReader, shard: int, name: str) -> bytes:
    """One shard's DALI index file.

    Raises:
        ExportError: no samples, or white space in a key or extension.
    """
    cols = reader.shard_columns(shard)
    n = len(cols)
    if n == 0:
        raise ExportError(name, "has no samples; a DALI index lists at least one")
    exts = [e.encode("utf-8", "surrogateescape") for e in reader.exts]
    keys = cols.keys
    joined = b"".join(keys)
    bad = next((k for k in keys if _SPACE.search(k)), None) if len(joined.translate(None, _SPACES)) != len(joined) else None
    if bad is not None or any(_SPACE.search(e) for e in exts):
        what = f"key {shown(bad)}" if bad is not None else f"extension {shown(next(e for e in exts if _SPACE.search(e)))}"
        raise ExportError(name, f"{what} holds white space, which separates the fields of a DALI index line")
    nmembers = cols.nmembers.astype(np.int64)
    offsets = np.repeat(cols.offset.astype(np.int64), nmembers) + cols.member_offset.astype(np.int64)
    head = b"%b %d\n" % (DALI_VERSION.encode(), n)
    speedups = _native.SPEEDUPS
    if speedups is not None:  # the C formatter; _dali_lines is its reference
        ids = np.ascontiguousarray(cols.member_ext, np.uint16)
        sizes = np.ascontiguousarray(cols.member_size, np.uint64)
        return head + speedups.dali_lines(keys, exts, nmembers, ids, offsets.astype(np.uint64), sizes)
    return head + _dali_lines(keys, exts, nmembers, cols.member_ext.astype(np.int64), offsets, cols.member_size.astype(np.int64))


def _dali_lines(keys: list[bytes], exts: list[bytes], nmembers: np.ndarray, ids: np.ndarray, offsets: np.ndarray, sizes: np.ndarray) -> bytes:
    """DALI index lines, one per sample, each ended by a newline: ``ext offset size key.ext`` per member."""
    n = len(keys)
    width = int(nmembers[0])
    if bool((nmembers == width).all()) and bool((ids.reshape(n, width) == ids[:width]).all()):
        # every sample has the same extensions (the common case): one format, filled per sample
        pattern = [exts[e].replace(b"%", b"%%") for e in ids[:width].tolist()]
        template = b" ".join(ext + b" %d %d %b." + ext for ext in pattern)
        columns: list[list[int] | list[bytes]] = []
        for k in range(width):
            columns += [offsets[k::width].tolist(), sizes[k::width].tolist(), keys]
        body = b"\n".join(map(template.__mod__, zip(*columns)))
    else:
        member_ext = [exts[e] for e in ids.tolist()]
        offs, sz = offsets.tolist(), sizes.tolist()
        lines = []
        m = 0
        for key, count in zip(keys, nmembers.tolist()):
            lines.append(b" ".join(b"%b %d %d %b.%b" % (member_ext[j], offs[j], sz[j], key, member_ext[j]) for j in range(m, m + count)))
            m += count
        body = b"\n".join(lines)
    return body + b"\n"


def export_wids(index: str | os.PathLike[str], path: str | os.PathLike[str], *, name: str | None = None) -> Path:
    """Write a wids shard list (JSON) of the shards of ``index`` to ``path``: each shard's ``url`` (a file's path
    relative to the list's directory, as wids resolves it; a URL as it is), ``nsamples`` and ``filesize``, from
    the index. ``wids.ShardListDataset(path)`` reads it; ``tarindex build path`` builds an index from it.

    Args:
        index: the index (or the shards it sits beside).
        path: the JSON file to write (atomically).
        name: the dataset's name in the list; default the index's file name without ``.tarindex``.

    Raises:
        IndexNotFoundError, IndexFormatError: ``index`` is missing or not an index.
        ExportError: a compressed shard.
        OverwriteError: ``path`` holds a file that is not a wids shard list (a shard or the index named by
            mistake, any other file).
    """
    reader = _open(index)
    out = Path(path)
    try:
        where = out.absolute().parent
        shards = []
        for i, info in enumerate(reader.shards):
            shard = _plain(reader, i, "wids")
            url = relative_path(shard, where) if info.kind == "file" else shard
            shards.append({"url": url, "nsamples": info.n_samples, "filesize": info.size})
        desc = {
            "__kind__": _WIDS_KIND,
            "wids_version": 1,
            "name": name if name is not None else reader.path.name.removesuffix(".tarindex"),
            "shardlist": shards,
        }
    finally:
        reader.close()
    _check_output(out, _is_wids, "a wids shard list")
    with atomic_write(out) as f:
        f.write((json.dumps(desc, indent=2) + "\n").encode())
    return out
