"""Write shards: ``ShardWriter`` (sample dicts -> tar or seekable ``.tar.zst``) and ``compress_shard``.

Compressed output is zstd frames that start on sample boundaries (several
small samples per frame, one large sample per frame), followed by a seek
table in the zstd seekable format, so any reader of that format can seek too
and plain ``zstd -d`` restores the tar byte for byte. Every file is written
under a temporary name beside its destination and renamed only when complete.
"""

from __future__ import annotations

import json
import mmap
import os
import stat
import tarfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, Literal, NoReturn

import zstandard

from . import _args
from ._atomic import AtomicFile
from ._codecs import HEAD_BYTES, ZSTD, of_head
from .errors import CorruptArchiveError, ShardNotFoundError
from .grouping import group_members
from .tar import BLOCK, iter_tar
from .zstd import MAX_FRAME_BYTES, close_map, seek_table_frame

__all__ = ["ShardWriter", "compress_shard"]  # public (tarindex.ShardWriter, tarindex.compress_shard); the rest serves the package

DEFAULT_LEVEL = 3
"""zstd level of ``tarindex compress`` and ``ShardWriter`` (zstd's own default)."""
DEFAULT_FRAME_SIZE = 8 << 10
"""Target uncompressed bytes per frame; chosen from the table in docs/performance.md."""

_READ = 4 << 20


class SeekableZstdWriter:
    """Compress a byte stream into independent zstd frames cut at caller-given boundaries.

    ``write`` appends bytes; ``boundary()`` marks a place where a frame may
    end (a sample boundary) and ends one there if ``frame_size`` bytes are
    pending. ``close()`` compresses the rest and appends the seek table.
    A frame never exceeds ``MAX_FRAME_BYTES`` (a larger sample is split).

    Args:
        file: binary file to write to (not closed).
        level: zstd compression level.
        frame_size: uncompressed bytes after which the next boundary ends a frame.
    """

    def __init__(self, file: BinaryIO, *, level: int = DEFAULT_LEVEL, frame_size: int = DEFAULT_FRAME_SIZE) -> None:
        if frame_size < 1:
            raise ValueError(f"frame size must be positive, got {frame_size}")
        self.file = file
        self.frame_size = min(frame_size, MAX_FRAME_BYTES)
        self._cctx = zstandard.ZstdCompressor(level=level, write_content_size=True, write_checksum=True)
        self._pending: list[bytes | memoryview] = []
        self._pending_bytes = 0
        self.sizes: list[tuple[int, int]] = []
        """``(compressed, uncompressed)`` size of each frame written so far."""

    def write(self, data: bytes | memoryview) -> None:
        """Append uncompressed bytes."""
        mv = memoryview(data)
        while self._pending_bytes + len(mv) > MAX_FRAME_BYTES:
            room = MAX_FRAME_BYTES - self._pending_bytes
            self._pending.append(mv[:room])
            self._pending_bytes += room
            self._flush()
            mv = mv[room:]
        if len(mv):
            self._pending.append(mv)
            self._pending_bytes += len(mv)

    def boundary(self) -> None:
        """A frame may end here; it does once ``frame_size`` bytes are pending."""
        if self._pending_bytes >= self.frame_size:
            self._flush()

    def _flush(self) -> None:
        if not self._pending_bytes:
            return
        data = self._pending[0] if len(self._pending) == 1 else b"".join(self._pending)
        frame = self._cctx.compress(data)
        self.file.write(frame)
        self.sizes.append((len(frame), self._pending_bytes))
        self._pending, self._pending_bytes = [], 0

    def close(self) -> None:
        """Write the last frame and the seek table."""
        self._flush()
        self.file.write(seek_table_frame(self.sizes))


def _sample_starts(buf: Any, path: str) -> list[int]:
    """Offset of each sample's first header in a plain tar."""
    return [rec.offset for rec in group_members(iter_tar((buf,), path), path)]


_TELL_EVERY = 8 << 20
"""Bytes of tar compressed between two calls of ``compress_shard``'s ``progress``."""


def _compress_plain(
    src: str, fd: int, out: BinaryIO, level: int, frame_size: int, tell: Callable[[int, int], None] | None = None
) -> list[tuple[int, int]]:
    """The plain tar ``fd`` as seekable zstd into ``out``; ``tell(done, total)`` with the tar bytes compressed so far."""
    buf = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    try:
        starts = _sample_starts(buf, src)
        writer = SeekableZstdWriter(out, level=level, frame_size=frame_size)
        mv = memoryview(buf)
        prev = told = 0
        for off in starts:
            if off > prev:
                writer.write(mv[prev:off])
                prev = off
                writer.boundary()
                if tell is not None and off - told >= _TELL_EVERY:
                    tell(off, len(buf))
                    told = off
        writer.write(mv[prev:])
        writer.close()
        mv.release()
    finally:
        close_map(buf)
    return writer.sizes


def compress_shard(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    level: int = DEFAULT_LEVEL,
    frame_size: int = DEFAULT_FRAME_SIZE,
    progress: Callable[[int], None] | None = None,
) -> list[tuple[int, int]]:
    """Rewrite a tar (plain, or any zstd ``.tar.zst``) as a seekable ``.tar.zst`` with sample-aligned frames.

    ``dst`` may equal ``src`` (recompress in place): the output is written to a
    temporary name and renamed when complete. Returns the ``(compressed,
    uncompressed)`` size of each frame. ``progress`` is called with the bytes of ``src``
    done since the last call (every 8 MiB of tar compressed, the rest at the end: they add up
    to the size of ``src``; a compressed ``src`` counts as the share of its tar compressed).

    Raises:
        ShardNotFoundError: ``src`` does not exist, or is a directory or another file that is not regular.
        CorruptArchiveError: ``src`` is not a valid tar (or zstd or gzip) archive.
        UnsupportedCompressionError: ``src`` is bzip2, xz, lzma, lzip, lz4 or Unix compress.
    """
    src, dst = os.fspath(src), os.fspath(dst)
    try:
        fd = os.open(src, os.O_RDONLY)
    except FileNotFoundError as exc:
        raise ShardNotFoundError(f"{src}: no such shard") from exc
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):  # read at random below: a directory, FIFO or device is no shard
        os.close(fd)
        raise ShardNotFoundError(f"{src}: {'is a directory' if stat.S_ISDIR(mode) else 'not a regular file'}, not a shard")
    out = AtomicFile(dst)
    plain: AtomicFile | None = None
    src_size = os.fstat(fd).st_size
    told = 0

    def tell(done: int, total: int) -> None:  # tar bytes compressed -> bytes of src
        nonlocal told
        now = done * src_size // max(total, 1)
        if progress is not None and now > told:
            progress(now - told)
            told = now

    try:
        if src_size == 0:
            raise CorruptArchiveError(src, 0, "empty file, not a tar archive")
        codec = of_head(os.pread(fd, HEAD_BYTES, 0), src)
        if codec.walk is not None:  # compressed: decompress to a temporary tar beside the output first
            plain = AtomicFile(Path(dst).with_name(Path(dst).name + ".plain"))
            with open(src, "rb") as f:
                for piece in codec.walk(iter(lambda: f.read(_READ), b""), src, None, None, None):
                    plain.file.write(piece)
            plain.file.close()
            os.close(fd)
            fd = os.open(plain.tmp, os.O_RDONLY)
        sizes = _compress_plain(src, fd, out.file, level, frame_size, tell if progress is not None else None)
    except OSError as exc:  # a full disk: one line naming the output, and no partial file
        raise out.failed(exc) from exc
    except BaseException:
        out.abort()
        raise
    finally:
        os.close(fd)
        if plain is not None:
            plain.abort()
    out.commit()
    if progress is not None and src_size > told:
        progress(src_size - told)
    return sizes


# -- ShardWriter ----------------------------------------------------------------


def _encode(key: str, ext: str, value: Any) -> bytes:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value).encode()
    if isinstance(value, (dict, list)):
        return json.dumps(value).encode()
    raise TypeError(
        f"sample {key!r}: cannot write {ext!r} of type {type(value).__name__} (give bytes, str, a number, dict or list)"
    )


class Cutter:
    """Cuts a sequence of samples into shards of at most ``maxcount`` samples and ``maxsize`` bytes."""

    def __init__(self, maxcount: int, maxsize: int) -> None:
        self.maxcount, self.maxsize = maxcount, maxsize
        self.count = self.size = 0

    def starts_shard(self, nbytes: int) -> bool:
        """Whether a sample of ``nbytes`` starts a new shard (the first always does); counts it in its shard."""
        new = self.count == 0 or self.count >= self.maxcount or self.size + nbytes > self.maxsize
        if new:
            self.count = self.size = 0
        self.count += 1
        self.size += nbytes
        return new


class ShardWriter:
    """Write webdataset-style sample dicts into numbered shards, plain or seekable zstd.

    Each sample is a mapping with ``"__key__"`` and one entry per extension
    (``bytes``, ``str``, numbers, ``dict``/``list`` as JSON). A new shard starts
    when the current one holds ``maxcount`` samples or would exceed
    ``maxsize`` bytes (uncompressed). Shard ``k`` is named ``pattern % k``.
    Each shard is written under a temporary name and renamed when complete;
    leaving the ``with`` block through an exception discards the shard in
    progress. ``zstd`` shards hold sample-aligned frames and a seek table
    (see :func:`compress_shard`).

    Args:
        pattern: shard path with a ``%`` format for the shard number, e.g. ``"out/train-%06d.tar.zst"``.
        maxcount: samples per shard.
        maxsize: uncompressed bytes per shard.
        compress: ``"zstd"`` for seekable ``.tar.zst`` shards, ``None`` for plain tar.
        level: zstd level.
        frame_size: target uncompressed bytes per zstd frame.
        start: number of the first shard.

    Raises:
        ValueError: a sample without ``__key__``, or a key or extension that would
            not read back as the same sample.
        TypeError: a value of a type with no encoding.
    """

    def __init__(
        self,
        pattern: str | os.PathLike[str],
        *,
        maxcount: int = 100_000,
        maxsize: int = 3_000_000_000,
        compress: Literal["zstd"] | None = None,
        level: int = DEFAULT_LEVEL,
        frame_size: int = DEFAULT_FRAME_SIZE,
        start: int = 0,
    ) -> None:
        if compress not in (ZSTD.name, None):
            raise ValueError(f"compress must be 'zstd' or None, got {compress!r}")
        self.pattern = _args.shard_pattern(pattern)
        self._cut = Cutter(maxcount, maxsize)
        self.compress = compress
        self.level = level
        self.frame_size = frame_size
        self.shard = start
        self.shards: list[str] = []
        """Paths of the shards completed so far."""
        self._mtime = int(time.time())
        self._out: AtomicFile | None = None
        self._zw: SeekableZstdWriter | None = None

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.close()
        elif self._out is not None:
            self._out.abort()
            self._out = self._zw = None

    def _open(self) -> None:
        self._out = AtomicFile(self.pattern % self.shard)
        self._zw = (
            SeekableZstdWriter(self._out.file, level=self.level, frame_size=self.frame_size)
            if self.compress is not None  # zstd, the one codec written
            else None
        )

    def _emit(self, data: bytes) -> None:
        try:
            if self._zw is not None:
                self._zw.write(data)
            elif self._out is not None:
                self._out.file.write(data)
        except OSError as exc:  # a full disk: one line naming the shard, and no partial file
            self._fail(exc)

    def _fail(self, exc: OSError) -> NoReturn:
        out, self._out, self._zw = self._out, None, None
        if out is None:
            raise exc
        raise out.failed(exc) from exc

    def _finish(self) -> None:
        if self._out is None:
            return
        self._emit(bytes(2 * BLOCK))  # end-of-archive marker
        if self._zw is not None:
            try:
                self._zw.close()
            except OSError as exc:
                self._fail(exc)
        self._out.commit()
        self.shards.append(str(self._out.path))
        self._out = self._zw = None
        self.shard += 1

    def _member(self, name: str, data: bytes) -> bytes:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mtime = self._mtime
        info.mode = 0o644
        head = info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
        pad = -len(data) % BLOCK
        return head + data + bytes(pad)

    def write(self, sample: Mapping[str, Any]) -> None:
        """Add one sample.

        Raises:
            ValueError: no ``__key__``, a key with a dot in its base name, or an empty extension.
            TypeError: a value that has no encoding.
        """
        key = sample.get("__key__")
        if not isinstance(key, str) or not key:
            raise ValueError(f"sample has no string '__key__': {sorted(sample)}")
        if "." in key.rsplit("/", 1)[-1]:
            raise ValueError(f"key {key!r} has a dot in its base name; it would not read back as one sample")
        parts = []
        for ext, value in sample.items():
            if ext.startswith("__"):
                continue
            if not ext or "/" in ext:
                raise ValueError(f"sample {key!r}: bad extension {ext!r}")
            parts.append(self._member(f"{key}.{ext}", _encode(key, ext, value)))
        if not parts:
            raise ValueError(f"sample {key!r} has no members")
        blob = b"".join(parts)
        if self._cut.starts_shard(len(blob)):
            self._finish()
            self._open()
        self._emit(blob)
        if self._zw is not None:
            self._zw.boundary()

    def close(self) -> list[str]:
        """Finish the shard in progress; return every shard path written."""
        self._finish()
        return self.shards

