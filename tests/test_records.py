"""Record blocks (tarindex.index.records): encode -> decode is the identity in the Python and C readers."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tarindex.access.handles import HandleTable
from tarindex.errors import IndexFormatError
from tarindex.index.records import MAX_KEY_BYTES, MAX_MEMBERS, Columns, encode_block, parse

Sample = tuple[int, int, int, list[tuple[int, int, int]], bytes]  # shard, offset, size, (ext, offset, size)..., key

_key = st.one_of(
    st.text(max_size=12).map(lambda t: t.encode("utf-8", "surrogatepass")),  # unicode, empty
    st.integers(0, 10**6).map(lambda k: b"k%07d" % k),  # counters
    st.binary(max_size=6),  # any bytes (keys are utf-8 with surrogateescape)
)


_tar_key = st.one_of(  # keys a tar member name splits into (a base name without dots), any bytes but NUL
    st.integers(0, 10**6).map(lambda k: b"k%07d" % k),
    st.text(st.characters(blacklist_characters="./\x00"), min_size=1, max_size=8).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.binary(min_size=1, max_size=6).map(lambda b: b"d/" + bytes(c for c in b if c not in b"./\x00") + b"x"),
).filter(lambda k: not k.startswith(b"__"))


@st.composite
def _samples(draw: st.DrawFn, small: bool = False) -> list[Sample]:
    """Samples of any shape, members inside their sample and in order; with ``small``, the shape of a tar
    that a reader can actually read (:func:`_tar_range`): one or more members, each after its header and
    any directory headers, keys a member name splits into, offsets still near 2**40 (distinct per sample)."""
    n = draw(st.integers(1, 40))
    out: list[Sample] = []
    sequential = draw(st.booleans())
    for i in range(n):
        members, pos = [], 0
        if small:
            offset = 2**40 - 2**26 + i * 2**16 + draw(st.integers(0, 2**15))
            for e in draw(st.lists(st.integers(0, 5), min_size=1, max_size=4, unique=True)):
                mo = _round(pos) + 512 * draw(st.integers(1, 3))
                ms = draw(st.integers(0, 1500))
                members.append((e, mo, ms))
                pos = mo + ms
            size = _round(pos) + 512 * draw(st.integers(0, 1))
        else:
            size = draw(st.one_of(st.integers(0, 2**63 - 1), st.integers(0, 5000)))
            offset = draw(st.integers(0, 2**64 - 1))
            for e in draw(st.lists(st.integers(0, 5), max_size=4, unique=True)):
                mo = draw(st.integers(pos, size))
                ms = draw(st.integers(0, size - mo))
                members.append((e, mo, ms))
                pos = mo + ms
        key = b"%08d" % (1000 + i) if sequential else draw(_tar_key if small else _key)
        out.append((draw(st.integers(0, 3)), offset, size, members, key))
    return out


def _round(x: int) -> int:
    return (x + 511) & ~511


def _columns(samples: list[Sample]) -> Columns:
    members = [m for s in samples for m in s[3]]
    return Columns(
        np.array([s[0] for s in samples], np.uint64),
        np.array([s[1] for s in samples], np.uint64),
        np.array([s[2] for s in samples], np.uint64),
        np.array([len(s[3]) for s in samples], np.int64),
        np.array([m[0] for m in members], np.uint16),
        np.array([m[1] for m in members], np.uint64),
        np.array([m[2] for m in members], np.uint64),
        [s[4] for s in samples],
    )


@settings(max_examples=300, deadline=None)
@given(_samples())
def test_python_round_trip_of_any_values(samples: list[Sample]) -> None:
    cols = _columns(samples)
    block = parse(memoryview(encode_block(cols)), 6, len(samples), "test")
    decoded = block.columns("test")
    for name in ("shard", "offset", "size", "nmembers", "member_ext", "member_offset", "member_size"):
        assert getattr(decoded, name).tolist() == getattr(cols, name).tolist(), name
    assert decoded.keys == cols.keys
    for j, s in enumerate(samples):
        assert block.record(j, "test") == s


@settings(max_examples=100, deadline=None)
@given(_samples(), st.data())
def test_members_outside_their_sample_are_errors(samples: list[Sample], data: st.DataObject) -> None:
    j = data.draw(st.integers(0, len(samples) - 1))
    shard, offset, size, _, key = samples[j]
    bad = data.draw(st.sampled_from([[(0, size + 1, 0)], [(0, 0, size + 1)], [(0, 1, 0), (1, 0, 0)], [(0, 0, 2**64 - 1)]]))
    samples[j] = (shard, offset, size, bad, key)
    block = parse(memoryview(encode_block(_columns(samples))), 6, len(samples), "test")
    with pytest.raises(IndexFormatError, match="test is damaged"):
        block.record(j, "test")
    with pytest.raises(IndexFormatError, match="test is damaged"):
        block.columns("test")


def _config(blocks: Any, per: int, n: int, exts: tuple[str, ...], names: Any, handles: Any, fallback: Any) -> Any:
    """The C reader's configuration over test blocks (a short read is a CorruptArchiveError)."""
    from tarindex._native import ReaderConfig
    from tarindex._process import FORK
    from tarindex.errors import CorruptArchiveError

    return ReaderConfig(blocks, per, n, exts, names, handles, fallback, CorruptArchiveError, FORK)


class _Shard:
    """A shard of the test: ``read_at`` returns bytes computed from the position (any offset, no file), or,
    where a sample of ``samples`` starts, that sample's range as a tar holds it (:func:`_tar_range`)."""

    def __init__(self, shard: int, samples: dict[tuple[int, int], Sample] | None = None, exts: tuple[str, ...] = ()) -> None:
        self.shard, self.samples, self.exts = shard, samples or {}, exts

    def read_at(self, offset: int, size: int) -> bytes:
        sample = self.samples.get((self.shard, offset))
        if sample is not None and sample[2] == size:
            return _tar_range(sample, self.exts, self.data)
        return self.data(offset, size)

    def data(self, offset: int, size: int) -> bytes:
        return bytes((offset + k + 7 * self.shard) % 251 for k in range(size))

    size = 1 << 40  # any offset reads

    def fileno(self) -> None:
        return None

    def close(self) -> None:
        pass


def _header(name: bytes, size: int, typ: bytes) -> bytes:
    h = bytearray(512)
    h[: len(name)] = name
    h[100:108], h[124:136], h[136:148], h[156:157], h[257:265] = b"0000644\x00", b"%011o\x00" % size, b"%011o\x00" % 0, typ, b"ustar\x0000"
    h[148:156] = b"%06o\x00 " % (sum(h) + 8 * 32)
    return bytes(h)


def _tar_range(sample: Sample, exts: tuple[str, ...], data: Any) -> bytes:
    """A sample's byte range as a tar holds it: per member, directory headers in the blocks before its own
    header (a delta in the record), its header (name key.ext, its size), its data (``data(offset, size)``)."""
    _, offset, size, members, key = sample
    out, pos = bytearray(size), 0
    for e, mo, ms in members:
        for at in range(_round(pos), mo - 512, 512):
            out[at : at + 512] = _header(b"dir%d/" % at, 0, b"5")
        out[mo - 512 : mo] = _header(key + b"." + exts[e].encode(), ms, b"0")
        out[mo : mo + ms] = data(offset + mo, ms)
        pos = mo + ms
    return bytes(out)


@settings(max_examples=150, deadline=None)
@given(_samples(small=True))
def test_c_reader_reads_what_was_encoded(samples: list[Sample]) -> None:
    from conftest import require_c_extension

    require_c_extension()
    from tarindex._native import SPEEDUPS

    assert SPEEDUPS is not None
    per = 16  # several blocks, the last one partial
    payloads = [memoryview(encode_block(_columns(samples[b : b + per]))) for b in range(0, len(samples), per)]
    blocks = [parse(p, 6, min(per, len(samples) - b * per), "test") for b, p in enumerate(payloads)]
    exts = tuple(f"e{k}" for k in range(6))
    urls = tuple(f"s{k}.tar" for k in range(4))

    def fallback(i: int) -> Any:
        raise AssertionError(f"the C reader handed sample {i} to the Python path")

    table = {(s[0], s[1]): s for s in samples}
    opener = HandleTable(len(urls), lambda shard: _Shard(shard, table, exts), len(urls))
    reader = SPEEDUPS.Reader(_config(lambda b: blocks[b].view, per, len(samples), exts, list(urls), opener, fallback))
    for i, (shard, offset, size, members, key) in enumerate(samples):
        got = reader.read(i)  # the members' headers agree with the record: no read goes to the Python path
        data = _Shard(shard, table, exts).read_at(offset, size)
        expected = {"__key__": key.decode("utf-8", "surrogateescape"), "__url__": urls[shard], "__index__": i}
        expected.update({exts[e]: data[mo : mo + ms] for e, mo, ms in members})
        assert got == expected
    # a shard whose name is not resolved yet (None): its handle's open resolves it (as TarDataset's does), and
    # its first read is the C reader's too; an open that leaves it unresolved hands the read to the Python path
    names: list[str | None] = [None] * len(urls)
    opened: list[int] = []

    def open_naming(shard: int) -> _Shard:
        opened.append(shard)
        if shard != 0:
            names[shard] = urls[shard]
        return _Shard(shard, table, exts)

    handed: list[int] = []

    def resolve(i: int) -> Any:
        handed.append(i)
        return {"resolved": i}

    opener = HandleTable(len(urls), open_naming, len(urls))
    reader = SPEEDUPS.Reader(_config(lambda b: blocks[b].view, per, len(samples), exts, names, opener, resolve))
    for i, sample in enumerate(samples):
        got = reader.read(i)
        if sample[0] == 0:
            assert got == {"resolved": i}
        else:
            assert got["__url__"] == urls[sample[0]] and got["__index__"] == i
    read = list(dict.fromkeys(s[0] for s in samples))  # the shards read, in the order first read
    assert opened == read  # each opened once, by its first read
    assert handed == [i for i, s in enumerate(samples) if s[0] == 0]
    assert names == [urls[k] if k in read and k != 0 else None for k in range(len(urls))]


@pytest.mark.parametrize("prefix", [b"", b"d/x"])
@pytest.mark.parametrize("digits", range(1, 20))
def test_c_reader_spells_keys_of_any_number_of_digits(digits: int, prefix: bytes) -> None:
    """Keys of a prefix and a number in 1 to 19 decimals (a block's key_mode 1), at the edges of their width (0,
    1, all nines, a one and zeros, a mix): the C reader's ``__key__`` and its read check spell them as the index
    does, with no read handed to the Python path."""
    from conftest import require_c_extension

    require_c_extension()
    from tarindex._native import SPEEDUPS

    assert SPEEDUPS is not None
    top = 10**digits - 1
    numbers = sorted({0, 1, top, top - 1, 10 ** (digits - 1), 123456789012345678901 % (top + 1), top // 7})
    samples: list[Sample] = []
    for i, v in enumerate(numbers):
        members = [(0, 512, 100 + i), (1, _round(612 + i) + 512, 7)]
        samples.append((0, 2**20 + i * 2**12, _round(members[-1][1] + 7), members, prefix + b"%0*d" % (digits, v)))
    block = parse(memoryview(encode_block(_columns(samples))), 2, len(samples), "test")
    assert block.mode == 1 and block.digits == digits  # the keys as a prefix and a number
    exts = ("txt", "cls")

    def fallback(i: int) -> Any:
        raise AssertionError(f"the C reader handed sample {i} to the Python path")

    table = {(s[0], s[1]): s for s in samples}
    opener = HandleTable(1, lambda shard: _Shard(shard, table, exts), 1)
    reader = SPEEDUPS.Reader(_config(lambda b: block.view, len(samples), len(samples), exts, ["s.tar"], opener, fallback))
    for i, (_, _, _, _, key) in enumerate(samples):
        assert reader.read(i)["__key__"] == key.decode()
        assert reader.read_batch([i], 4, 0)[0]["__key__"] == key.decode()


def test_a_damaged_record_in_the_c_reader_is_the_python_error() -> None:
    from conftest import require_c_extension

    require_c_extension()
    from tarindex._native import SPEEDUPS

    assert SPEEDUPS is not None
    first: Sample = (0, 0, 1024, [(0, 512, 10)], b"a")
    block = parse(memoryview(encode_block(_columns([first, (9, 0, 10, [], b"b")]))), 1, 2, "t")

    def python_path(i: int) -> Any:
        return block.record(i, f"the record of sample {i}")

    def opened(shard: int) -> _Shard:
        return _Shard(shard, {(0, 0): first}, ("jpg",))

    reader = SPEEDUPS.Reader(_config(lambda b: block.view, 2, 2, ("jpg",), ["s.tar"], HandleTable(1, opened, 1), python_path))
    assert reader.read(0)["jpg"] == _Shard(0).read_at(512, 10)
    with pytest.raises(IndexError):
        reader.read(2)
    # sample 1 names shard 9 of 1: the C reader defers to the Python path, which must raise too
    reader = SPEEDUPS.Reader(_config(lambda b: block.view, 2, 2, ("jpg",), ["s.tar"], HandleTable(1, _Shard, 1), lambda i: {}))
    with pytest.raises(IndexFormatError, match="record of sample 1 is damaged"):
        reader.read(1)


def test_common_shapes_take_few_bytes() -> None:
    """Counters as keys, members one after another: a few bytes per sample."""
    samples: list[Sample] = []
    offset = 0
    rng = np.random.default_rng(0)
    for i in range(1024):
        members, pos = [], 0
        for e in range(3):
            mo = ((pos + 511) & ~511) + 512
            ms = int(rng.integers(900, 1100))
            members.append((e, mo, ms))
            pos = mo + ms
        size = (pos + 511) & ~511
        samples.append((0, offset, size, members, b"%08d" % i))
        offset += size
    raw = encode_block(_columns(samples))
    assert len(raw) / 1024 <= 10  # offset 3 bytes, three sizes of 2 bytes; key, pattern, shard, member offsets 0
    block = parse(memoryview(raw), 3, 1024, "t")
    assert block.widths[:5] == [0, 3, 0, 0, 0] and block.record(1023, "t")[4] == b"00001023"


def test_limits_are_errors() -> None:
    with pytest.raises(IndexFormatError, match=f"at most {MAX_MEMBERS}"):
        encode_block(_columns([(0, 0, 1, [(0, 0, 0)] * (MAX_MEMBERS + 1), b"k")]))
    with pytest.raises(IndexFormatError, match=f"at most {MAX_KEY_BYTES}"):
        encode_block(_columns([(0, 0, 1, [], b"x" * 70_000)]))


def test_a_block_that_does_not_match_its_header_is_an_error() -> None:
    raw = encode_block(_columns([(0, 5, 10, [(0, 512, 3)], b"key")] * 3))
    with pytest.raises(IndexFormatError, match="expected n=4"):
        parse(memoryview(raw), 1, 4, "b")
    with pytest.raises(IndexFormatError, match=r"expected .* bytes from its header"):
        parse(memoryview(raw + b"x"), 1, 3, "b")
    with pytest.raises(IndexFormatError, match="names extension 0 of 0"):
        parse(memoryview(raw), 0, 3, "b")
