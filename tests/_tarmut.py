"""Damaged tar archives and every way tarindex walks them (for the integrity tests and the fuzzer).

A way is one cursor (a whole buffer, 700-byte chunks, a file read with ``pread``, a pipe the C
walk reads itself, of unknown or declared length) times one sink (members, an index table, sample dicts); :func:`outcomes` runs
every way in the C and the pure-Python implementation and gives, per way, the result or the
error (type and message).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import signal
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import use_pure_python
from tarindex.errors import TarIndexError
from tarindex.grouping import iter_samples
from tarindex.scan import table_from_chunks, table_from_file
from tarindex.tar import BLOCK, DirectArchive, iter_tar, iter_tar_file

IMPLS = ("c", "python")


def checksum(block: bytes | bytearray) -> int:
    """The unsigned header checksum (the checksum field counted as spaces)."""
    return sum(block[:148]) + 8 * 32 + sum(block[156:BLOCK])


def fix_checksum(buf: bytearray, at: int) -> None:
    """Write the right checksum into the header at ``at``."""
    buf[at + 148 : at + 156] = b"%06o\x00 " % checksum(buf[at : at + BLOCK])


def set_field(buf: bytearray, at: int, start: int, value: bytes, fix: bool = True) -> None:
    """Overwrite a header field (``start`` relative to the header) and fix the checksum."""
    buf[at + start : at + start + len(value)] = value
    if fix:
        fix_checksum(buf, at)


def pax_record(key: str, value: str | bytes) -> bytes:
    """One PAX record ``"<len> key=value\\n"`` with its length right."""
    body = key.encode() + b"=" + (value if isinstance(value, bytes) else value.encode()) + b"\n"
    n = len(body) + 2
    while len(b"%d " % n) + len(body) != n:
        n += 1
    return b"%d " % n + body


def header(name: bytes, size: int, typ: bytes = b"0", size_field: bytes | None = None) -> bytearray:
    """A ustar header block with its checksum."""
    h = bytearray(BLOCK)
    h[: len(name)] = name
    h[100:108] = b"0000644\x00"
    h[108:116] = b"0000000\x00"
    h[116:124] = b"0000000\x00"
    h[124:136] = size_field if size_field is not None else b"%011o\x00" % size
    h[136:148] = b"00000000000\x00"
    h[156:157] = typ
    h[257:265] = b"ustar\x0000"
    fix_checksum(h, 0)
    return h


def member(name: bytes, data: bytes, typ: bytes = b"0") -> bytes:
    """A header and its padded data."""
    return bytes(header(name, len(data), typ)) + data + bytes(-len(data) % BLOCK)


def extension(typ: bytes, payload: bytes) -> bytes:
    """An extension header (PAX ``x``/``g``, GNU ``L``/``K``) and its padded payload."""
    name = b"././@LongLink" if typ in b"LK" else b"PaxHeader/x"
    return member(name, payload, typ)


def archive(*parts: bytes) -> bytes:
    """Parts, then the end-of-archive marker."""
    return b"".join(parts) + bytes(2 * BLOCK)


def tarfile_view(buf: bytes) -> list[tuple[str, bytes]] | None:
    """``(name, bytes)`` of each regular member as :mod:`tarfile` reads them, or ``None`` where
    tarfile fails or reads the archive by rules tarindex does not share (sparse members, which
    tarindex skips; a size in a global PAX header). Links, devices, directories and FIFOs with a
    size are read by the same rule (no data)."""
    try:
        with tarfile.open(fileobj=io.BytesIO(buf), mode="r:") as tf:
            out = []
            for m in tf:
                if m.issparse() or "size" in tf.pax_headers or not _gnu_names_end(buf, m):
                    return None
                if m.isreg():
                    f = tf.extractfile(m)
                    data = f.read() if f is not None else b""
                    if len(data) != m.size:
                        return None
                    out.append((m.name, data))
            if buf[tf.offset : tf.offset + BLOCK] != bytes(BLOCK):  # tarfile stops quietly at a bad header
                return None
            return out
    except Exception:  # tarfile's many ways of refusing an archive: no oracle then
        return None


def _gnu_names_end(buf: bytes, m: tarfile.TarInfo) -> bool:
    """Whether tarfile and GNU tar agree on ``m``'s name: each GNU long-name header before it ends its
    name within its size (tarfile reads the whole block, GNU tar and tarindex the header's size), and
    a ustar prefix is only in a POSIX header (tarfile applies one after any magic)."""
    at = m.offset
    main = m.offset_data - BLOCK
    if buf[main + 345] and buf[main + 257 : main + 263] != b"ustar\x00":  # tarfile: a prefix whatever the magic
        return False
    while at < main:
        size = tarfile.nti(buf[at + 124 : at + 136])
        if buf[at + 156] in b"LK" and any(buf[at + BLOCK + size : at + BLOCK + -(-size // BLOCK) * BLOCK]):
            return False
        at += BLOCK + -(-size // BLOCK) * BLOCK
    return True


class PipeFeed:
    """A :class:`tarindex.tar.DirectSource` over an ``os.pipe`` that a thread fills with ``data``;
    ``sized``: it declares the bytes left (as HTTP's Content-Length does), else the length is unknown."""

    def __init__(self, data: bytes, sized: bool = False) -> None:
        self.left = len(data) if sized else -1
        self.r, w = os.pipe()
        self.thread = threading.Thread(target=self._write, args=(w, data), daemon=True)
        self.thread.start()

    @staticmethod
    def _write(w: int, data: bytes) -> None:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(w, view[: 1 << 16]) :]
        except OSError:  # the reader closed its end
            pass
        finally:
            os.close(w)

    def read(self, n: int, /) -> bytes:
        got = os.read(self.r, n)
        self.advance(len(got))
        return got

    def direct(self) -> tuple[int, int, int]:
        return self.r, self.left, -1

    def advance(self, n: int, timed_out: bool = False, /) -> None:
        if self.left >= 0:
            self.left -= n

    def close(self) -> None:
        os.close(self.r)
        self.thread.join(5)


@contextlib.contextmanager
def impl(which: str) -> Iterator[None]:
    """Run with the C walks (``"c"``) or the pure-Python reference (``"python"``, the suite's one switch)."""
    with pytest.MonkeyPatch.context() as m:
        if which == "python":
            use_pure_python(m)
        yield


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Fail a walk that runs longer than ``seconds`` (a hang) instead of waiting for ever."""

    def expired(signum: int, frame: Any) -> None:
        raise TimeoutError(f"walk still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _chunks(buf: bytes, step: int = 700) -> Iterator[bytes]:
    return (buf[i : i + step] for i in range(0, len(buf), step))


def _table(table: Any) -> dict[str, Any]:
    return {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in dataclasses.asdict(table).items()}


WAYS = ("members-buffer", "members-chunks", "members-file", "table-buffer", "table-chunks", "table-file",
        "samples-chunks", "samples-file", "samples-pipe")  # fmt: skip
ALL_WAYS = (*WAYS, "samples-sized")
"""``WAYS`` and a pipe of declared length (the bound of an HTTP body), which the fuzzer runs too."""


def run(way: str, buf: bytes, path: Path, max_member_size: int | None = None, allow_missing_end: bool = False) -> Any:
    """One way over ``buf`` (also written at ``path``): its result, or ``("error", type, message, offset)``."""
    url = str(path)
    fd = os.open(path, os.O_RDONLY) if way.endswith("-file") else -1
    feed = PipeFeed(buf, sized=way == "samples-sized") if way in ("samples-pipe", "samples-sized") else None
    opts: dict[str, Any] = {"max_member_size": max_member_size, "allow_missing_end": allow_missing_end}
    try:
        if way == "members-buffer":
            return [(e[0], e[4]) for e in iter_tar((buf,), url, with_data=True, **opts)]
        if way == "members-chunks":
            return [(e[0], e[4]) for e in iter_tar(_chunks(buf), url, with_data=True, **opts)]
        if way == "members-file":
            return [(e[0], os.pread(fd, e[3], e[2])) for e in iter_tar_file(fd, url, **opts)]
        if way == "table-buffer":
            return _table(table_from_chunks((buf,), url, **opts))
        if way == "table-chunks":
            return _table(table_from_chunks(_chunks(buf), url, **opts))
        if way == "table-file":
            return _table(table_from_file(fd, url, **opts))
        if way == "samples-chunks":
            return list(iter_samples(_chunks(buf), url, **opts))
        if way == "samples-file":
            return list(iter_samples(fd, url, **opts))
        if way in ("samples-pipe", "samples-sized"):
            assert feed is not None
            first = feed.read(BLOCK)
            return list(iter_samples(DirectArchive(feed, first), url, **opts))
        raise ValueError(way)
    except TarIndexError as exc:
        return ("error", type(exc).__name__, str(exc), getattr(exc, "offset", None))
    finally:
        if fd >= 0:
            os.close(fd)
        if feed is not None:
            feed.close()


def outcomes(buf: bytes, path: Path, ways: tuple[str, ...] = WAYS, **options: Any) -> dict[tuple[str, str], Any]:
    """Every way in both implementations, each under a deadline."""
    path.write_bytes(buf)
    out = {}
    for which in IMPLS:
        with impl(which):
            for way in ways:
                with deadline(20):
                    out[which, way] = run(way, buf, path, **options)
    return out
