"""Sample records (tarindex.index.records): encode -> decode is the identity; damage is reported."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tarindex.errors import IndexFormatError
from tarindex.index.records import HEAD, MAX_MEMBERS, STRIDE_SLACK, decode, encode, unpack_head

_sample = st.tuples(
    st.integers(0, 2**40),  # offset
    st.integers(0, 2**40),  # size
    st.integers(0, 2**32 - 1),  # shard
    st.lists(st.tuples(st.integers(0, 2**63), st.integers(0, 2**63), st.integers(0, 2**16 - 1)), max_size=6),
    st.text(max_size=40),  # key
)


def _encode(samples: list) -> tuple[np.ndarray, np.ndarray, int]:
    members = [m for s in samples for m in s[3]]
    return encode(
        np.array([s[2] for s in samples], np.uint32),
        np.array([s[0] for s in samples], np.uint64),
        np.array([s[1] for s in samples], np.uint64),
        np.array([len(s[3]) for s in samples], np.uint32),
        np.array([m[2] for m in members], np.uint16),
        np.array([m[0] for m in members], np.uint64),
        np.array([m[1] for m in members], np.uint64),
        [s[4].encode("utf-8", "surrogatepass") for s in samples],
    )


@settings(max_examples=200, deadline=None)
@given(st.lists(_sample, max_size=30), st.data())
def test_encode_decode_round_trip(samples: list, data: st.DataObject) -> None:
    table, blob, stride = _encode(samples)
    n = len(samples)
    starts = [i * stride for i in range(n + 1)] if stride else table.tolist()
    assert len(blob) % 8 == 0 and starts[-1] == len(blob) and len(starts) == n + 1
    assert len(table) == (0 if stride else n + 1)
    lengths = [HEAD.size + 18 * len(s[3]) + len(s[4].encode("utf-8", "surrogatepass")) for s in samples]
    if stride:  # a stride only where padding every record to the longest costs little
        assert stride == -(-max(lengths) // 8) * 8 and stride * n <= STRIDE_SLACK * sum(-(-x // 8) * 8 for x in lengths)
    lo = data.draw(st.integers(0, n))
    hi = data.draw(st.integers(lo, n))
    dec = decode(blob, table, stride, lo, hi)
    part = samples[lo:hi]
    assert dec.offset.tolist() == [s[0] for s in part]
    assert dec.size.tolist() == [s[1] for s in part]
    assert dec.shard.tolist() == [s[2] for s in part]
    assert dec.nmembers.tolist() == [len(s[3]) for s in part]
    assert dec.member_offset.tolist() == [m[0] for s in part for m in s[3]]
    assert dec.member_size.tolist() == [m[1] for s in part for m in s[3]]
    assert dec.member_ext.tolist() == [m[2] for s in part for m in s[3]]
    assert dec.keys(blob) == [s[4].encode("utf-8", "surrogatepass").decode("utf-8", "surrogateescape") for s in part]
    for i, s in enumerate(samples):  # the fixed head, as the read paths unpack it
        assert unpack_head(blob, starts[i])[:4] == (s[0], s[1], s[2], len(s[3]))
        assert starts[i] % 8 == 0


def test_uniform_records_sit_at_a_stride_uneven_ones_behind_a_table() -> None:
    uniform = [(i, 10, 0, [(0, 5, 0), (5, 5, 1)], f"{i:06d}") for i in range(50)]
    table, blob, stride = _encode(uniform)
    assert stride == len(blob) // 50 and len(table) == 0
    uneven = [*uniform, (0, 10, 0, [(0, 1, 0)] * 400, "big")]
    table, blob, stride = _encode(uneven)
    assert stride == 0 and len(table) == 52 and int(table[-1]) == len(blob)


def test_limits_are_errors() -> None:
    too_many = [(0, 1, 0, [(0, 0, 0)] * (MAX_MEMBERS + 1), "k")]
    with pytest.raises(IndexFormatError, match="65536 members"):
        _encode(too_many)
    with pytest.raises(IndexFormatError, match="at most 65535"):
        _encode([(0, 1, 0, [], "x" * 70_000)])


def test_damaged_offsets_are_errors() -> None:
    starts, blob, stride = _encode([(0, 10, 0, [(0, 10, 0)] * 20, "a"), (10, 10, 0, [], "b")])
    assert stride == 0  # uneven: an offset table
    bad = starts.copy()
    bad[1] = len(blob) + 8
    with pytest.raises(IndexFormatError, match="damaged"):
        decode(blob, bad, 0, 0, 2)
    bad[1] = 3  # not 8-aligned
    with pytest.raises(IndexFormatError, match="damaged"):
        decode(blob, bad, 0, 0, 2)
    assert HEAD.size == 24


def test_c_reader_rejects_damaged_records() -> None:
    from conftest import require_c_extension

    require_c_extension()
    from tarindex._native import SPEEDUPS
    from tarindex._process import FORK
    from tarindex.errors import CorruptArchiveError

    assert SPEEDUPS is not None
    starts, blob, _ = _encode([(0, 10, 0, [(0, 10, 0)] * 20, "a"), (10, 10, 0, [], "b")])
    bad = starts.copy()
    bad[1] = len(blob) - 8  # the record's head runs past the blob

    def never(*_: object) -> None:
        raise AssertionError("the damaged record must be caught before any shard is opened")

    from tarindex.opener import ShardOpener

    opener = ShardOpener(1, never, 1)
    reader = SPEEDUPS.Reader(memoryview(bad), memoryview(blob), 0, 2, ("jpg",), ("s.tar",), opener, never, CorruptArchiveError, FORK)
    with pytest.raises(IndexFormatError, match="record of sample 1 is damaged"):
        reader.read(1)
    with pytest.raises(IndexError):
        reader.read(2)
    with pytest.raises(IndexFormatError, match="fewer than the index's samples"):  # a stride that does not fit the blob
        SPEEDUPS.Reader(memoryview(bad), memoryview(blob), len(blob), 2, ("jpg",), ("s.tar",), opener, never, CorruptArchiveError, FORK)
