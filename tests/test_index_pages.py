"""index/pages.py reads an LMDB file with pread: the same values as LMDB's own reader for every key, None for
keys it lacks, and every damaged page an IndexFormatError (a loop in the tree, a node or a value past its
page or the file), never a hang or an exception of another class."""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

import lmdb
import pytest

import tarindex
from conftest import make_shard_set
from tarindex.errors import IndexFormatError
from tarindex.index.pages import IndexFile


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pages")
    return tarindex.build_index([str(p) for p in make_shard_set(root, n_shards=4, per=2500)], workers=1).path


def _lmdb_items(path: Path) -> list[tuple[bytes, bytes]]:
    env = lmdb.open(str(path), subdir=False, readonly=True, lock=False)
    with env.begin() as txn:
        items = [(bytes(k), bytes(v)) for k, v in txn.cursor()]
    env.close()
    return items


def test_every_value_is_what_lmdb_reads(index: Path) -> None:
    items = _lmdb_items(index)
    f = IndexFile(index)
    try:
        assert f.depth >= 2 and any(len(v) > 4096 for _, v in items) and any(len(v) < 2000 for _, v in items)
        for key, value in items:
            assert bytes(f.get(key) or b"") == value and f.size_of(key) == len(value), key
        keys = {k for k, _ in items}
        for key, _ in items:
            for other in (key + b"\0", key[:-1], key[:-1] + bytes([key[-1] + 1 & 0xFF])):
                if other and other not in keys:
                    assert f.get(other) is None and f.size_of(other) is None, other
        assert f.get(b"a") is None and f.get(b"zzz") is None
    finally:
        f.close()


def _root_page(path: Path) -> tuple[int, int]:
    f = IndexFile(path)
    try:
        return f.root, f.psize
    finally:
        f.close()


def _damaged(index: Path, out: Path, change: Callable[[bytearray, int, int], None]) -> Path:
    data = bytearray(index.read_bytes())
    root, psize = _root_page(index)
    change(data, root, psize)
    out.write_bytes(bytes(data))
    return out


def _loop(data: bytearray, root: int, psize: int) -> None:
    """The root branch's first child is the root itself."""
    page = root * psize
    at = struct.unpack_from("<H", data, page + 16)[0]
    struct.pack_into("<HHH", data, page + at, root & 0xFFFF, root >> 16 & 0xFFFF, root >> 32 & 0xFFFF)


def _node_outside(data: bytearray, root: int, psize: int) -> None:
    struct.pack_into("<H", data, root * psize + 16, psize - 2)


def _child_past_the_file(data: bytearray, root: int, psize: int) -> None:
    page = root * psize
    at = struct.unpack_from("<H", data, page + 16)[0]
    struct.pack_into("<HHH", data, page + at, 0xFFFF, 0xFFFF, 0x7F)


def _not_a_page(data: bytearray, root: int, psize: int) -> None:
    struct.pack_into("<Q", data, root * psize, root + 1)  # the page says it is another page


@pytest.mark.parametrize("change", [_loop, _node_outside, _child_past_the_file, _not_a_page])
def test_a_damaged_tree_is_index_format_error(index: Path, tmp_path: Path, change: Callable[[bytearray, int, int], None]) -> None:
    bad = _damaged(index, tmp_path / "bad.tarindex", change)
    f = IndexFile(bad)
    try:
        with pytest.raises(IndexFormatError, match=rf"{bad}: the index is damaged \(page \d+ at offset \d+: .*\); rebuild the index"):
            for key, _ in _lmdb_items(index):
                f.get(key)
    finally:
        f.close()
