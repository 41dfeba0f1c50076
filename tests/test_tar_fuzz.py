"""A seeded differential fuzzer of the tar walk.

Small archives (PAX header per member with float mtimes as webdataset's TarWriter writes them, GNU
long names, plain ustar) are damaged at random (bytes flipped with the checksum fixed up, huge,
negative, base-256 and malformed sizes, PAX size and path records, truncation at every offset class,
garbage, zero blocks, type flags, old GNU sparse headers whose extension blocks are what follows) and walked every way (:mod:`_tarmut`: members, index tables and
sample dicts over a buffer, chunks, a file and a pipe) in C and in Python. Each case must be exact
bytes (equal to tarfile's wherever tarfile reads the archive by the same rules) or a named
``TarIndexError`` naming the shard and an offset inside it; never another exception or a hang, and
C and Python must agree on everything.
"""

from __future__ import annotations

import io
import os
import random
import tarfile
from pathlib import Path
from typing import Any

import pytest
from _tarmut import ALL_WAYS as WAYS
from _tarmut import fix_checksum, outcomes, pax_record, set_field, tarfile_view

from tarindex.tar import BLOCK

SEEDS = range(int(os.environ.get("TARINDEX_FUZZ_SEEDS", "8")))
CASES_PER_SEED = 50


def _base(kind: str) -> bytes:
    bio = io.BytesIO()
    fmt = {"pax": tarfile.PAX_FORMAT, "gnu": tarfile.GNU_FORMAT, "ustar": tarfile.USTAR_FORMAT}[kind]
    with tarfile.open(fileobj=bio, mode="w", format=fmt) as tf:
        for i in range(4):
            for ext, size in (("jpg", 300 * i + 17), ("cls", 1), ("json", 600 if i == 2 else 0)):
                name = f"{'long' * 30}/{i:04d}.{ext}" if kind == "gnu" and i == 1 else f"s{i:04d}.{ext}"
                ti = tarfile.TarInfo(name)
                ti.size = size
                ti.mtime = 1_700_000_000.5 if kind == "pax" else 1_700_000_000
                tf.addfile(ti, io.BytesIO(bytes((i * 7 + j) % 251 for j in range(size))))
        if kind == "gnu":
            d = tarfile.TarInfo("adir")
            d.type = tarfile.DIRTYPE
            tf.addfile(d)
    return bio.getvalue()


BASES = {kind: _base(kind) for kind in ("pax", "gnu", "ustar")}


def _headers(buf: bytes) -> list[int]:
    """Offsets of every header block of a valid archive (extension headers included)."""
    out, at = [], 0
    while at + BLOCK <= len(buf) and buf[at : at + BLOCK] != bytes(BLOCK):
        out.append(at)
        size = int(buf[at + 124 : at + 135], 8)
        at += BLOCK + -(-size // BLOCK) * BLOCK
    return out


SIZES = [
    b"77777777777\x00",
    b"\x80" + b"\xff" * 11,
    b"\xff" * 12,
    b"\x80" + (1 << 33).to_bytes(11, "big"),
    b"\x80" + bytes(10) + b"\x05",
    b"-0000000512\x00",
    b"+0000000005\x00",
    b"0000_000005\x00",
    b" " * 12,
    b"00000000000\x00",
    b"00000001000\x00",
    b"00000000777 ",
    b"\x00" * 12,
]
PAX_VALUES = ["-512", " 5", "+5", "5_0", "-1", "0", "1", "99999999999", "512", "x" * 5, "1" + "0" * 25]
PAX_JUNK = [b"5 a=1\n", b"30 path=x\n", b"x7 a=1\n", b"6 =1\n\n", b"7 a=12\x00", b"garbage", b"0 \n", b""]


def _mutate(rng: random.Random, base: bytes) -> tuple[str, bytes]:
    buf = bytearray(base)
    heads = _headers(base)
    at = rng.choice(heads)
    kind = rng.choice(["flip", "size", "pax", "truncate", "garbage", "zero", "insert", "type", "flips", "sparse"])
    if kind in ("flip", "flips"):
        for _ in range(1 if kind == "flip" else rng.randint(2, 6)):
            i = rng.randrange(BLOCK)
            buf[at + i] ^= 1 << rng.randrange(8)
        if rng.random() < 0.85:
            fix_checksum(buf, at)
    elif kind == "size":
        set_field(buf, at, 124, rng.choice(SIZES))
    elif kind == "pax":
        xs = [h for h in heads if buf[h + 156] in b"xgL"] or [at]
        at = rng.choice(xs)
        if rng.random() < 0.7:
            payload = b"".join(pax_record(rng.choice(["size", "path", "mtime", "linkpath"]), rng.choice(PAX_VALUES)) for _ in range(rng.randint(1, 3)))
        else:
            payload = rng.choice(PAX_JUNK)
        old = int(bytes(buf[at + 124 : at + 135]), 8)
        room = -(-old // BLOCK) * BLOCK
        if len(payload) <= room:
            buf[at + BLOCK : at + BLOCK + room] = payload + bytes(room - len(payload))
            set_field(buf, at, 124, b"%011o\x00" % len(payload), fix=False)
            if rng.random() < 0.2:
                buf[at + 156] = ord("g")
            fix_checksum(buf, at)
    elif kind == "truncate":
        size = int(base[at + 124 : at + 135], 8)
        cut = at + rng.choice([0, 1, 100, 156, 511, 512, 513, 512 + size // 2, 512 + size, 512 + size + 1, 512 + -(-size // BLOCK) * BLOCK - 1])
        cut = rng.choice([cut, cut, len(base) - 1024, len(base) - 512, len(base) - 1, len(base) - 1030])
        del buf[max(0, cut) :]
    elif kind == "garbage":
        buf[at : at + BLOCK] = rng.randbytes(BLOCK)
        if rng.random() < 0.5:
            fix_checksum(buf, at)
    elif kind == "zero":
        buf[at : at + BLOCK] = bytes(BLOCK)
    elif kind == "insert":
        buf[at:at] = bytes(BLOCK) if rng.random() < 0.5 else rng.randbytes(BLOCK)
    elif kind == "type":
        buf[at + 156] = rng.choice(b"0\x001234567KLSxgZ")
        fix_checksum(buf, at)
    elif kind == "sparse":  # an old GNU sparse header whose extension blocks are whatever follows it
        buf[at + 156] = ord("S")
        buf[at + 482] = rng.choice([1, 0x80])
        if rng.random() < 0.5:
            buf[at + BLOCK + 504 : at + BLOCK + 505] = b"\x01"  # the first block says another follows
        fix_checksum(buf, at)
    return kind, bytes(buf)


def _is_error(result: Any) -> bool:
    return isinstance(result, tuple) and result[:1] == ("error",)


def _check(kind: str, buf: bytes, path: Path, got: dict[tuple[str, str], Any]) -> None:
    for way in WAYS:
        assert got["c", way] == got["python", way], (kind, way, got["c", way], got["python", way])
    for way, result in ((w, got["python", w]) for w in WAYS):
        if _is_error(result):
            _, _, message, offset = result
            assert message.startswith(f"{path}: ") and f"at offset {offset}" in message, (kind, way, message)
            assert 0 <= offset <= len(buf), (kind, way, message)
    members = {w: got["python", w] for w in WAYS if w.startswith("members-")}
    ok = [w for w, r in members.items() if not _is_error(r)]
    assert len({str(members[w]) for w in ok}) <= 1, (kind, members)  # every cursor that succeeds reads the same
    if ok and len(ok) == len(members):
        expected = tarfile_view(buf)
        if expected is not None:
            assert members[ok[0]] == expected, (kind, members[ok[0]], expected)
    samples = {w: got["python", w] for w in WAYS if w.startswith("samples-")}
    good = [r for r in samples.values() if not _is_error(r)]
    assert all(r == good[0] for r in good), kind
    table = got["python", "table-file"]
    if not _is_error(table) and not _is_error(samples["samples-file"]):
        sliced = []
        m = 0
        for off, n in zip(table["sample_offset"], table["sample_nmembers"]):
            sliced.append([buf[off + table["member_offset"][m + j] : off + table["member_offset"][m + j] + table["member_size"][m + j]] for j in range(n)])
            m += n
        assert sliced == [[v for k, v in s.items() if not k.startswith("__")] for _, s in samples["samples-file"]], kind


@pytest.mark.parametrize("seed", SEEDS)
def test_tar_walk_fuzz(seed: int, tmp_path: Path) -> None:
    rng = random.Random(seed)
    kinds: dict[str, int] = {}
    errors = 0
    for case in range(CASES_PER_SEED):
        base = BASES[rng.choice(list(BASES))]
        kind, buf = _mutate(rng, base)
        path = tmp_path / f"case{case}.tar"
        got = outcomes(buf, path, WAYS)
        try:
            _check(kind, buf, path, got)
        except AssertionError as exc:
            raise AssertionError(f"seed {seed} case {case} ({kind}): {exc}") from None
        kinds[kind] = kinds.get(kind, 0) + 1
        errors += _is_error(got["python", "members-file"])
    assert 0 < errors < CASES_PER_SEED  # the mutations damage some archives, not all


def test_bases_read_exactly(tmp_path: Path) -> None:
    for kind, buf in BASES.items():
        got = outcomes(buf, tmp_path / f"{kind}.tar", WAYS)
        _check("none", buf, tmp_path / f"{kind}.tar", got)
        assert got["c", "members-file"] == tarfile_view(buf), kind
