"""One output shard of ``pack``: samples in, tar headers written for them (:mod:`tarindex._tarwrite`), the shard's
offset table kept as it is written (the same table a scan of the finished shard gives, with no rescan), plain
or seekable zstd (:class:`tarindex.shard_writer.SeekableZstdWriter`), written under a temporary name and renamed
when complete (:class:`tarindex._atomic.AtomicFile`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import numpy as np

from ._atomic import AtomicFile
from ._codecs import TAR, ZSTD
from ._tarwrite import END_OF_ARCHIVE, member_header, padding
from .errors import PackError
from .scan import shard_info
from .shard_writer import SeekableZstdWriter
from .shards import fingerprint
from .tables import ShardInfo, ShardTable
from .zstd import frame_array

__all__: list[str] = []  # internal module: its names serve the package, the public API is tarindex.__all__

Compress = Literal["zstd"] | None

_WRITEV_BYTES = 1 << 20  # plain output: pending buffers written with one writev once they hold this much
_WRITEV_BUFFERS = 512  # ... or this many (IOV_MAX is 1024 on Linux)
_FILE_PIECE = 16 << 20  # a file member larger than this is copied in pieces of this size
_PADS = [bytes(n) for n in range(512)]


class FileMember:
    """A member whose bytes are a file's: ``path`` and the ``size`` it had when listed."""

    __slots__ = ("path", "size")

    def __init__(self, path: str, size: int) -> None:
        self.path = path
        self.size = size

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FileMember) and (self.path, self.size) == (other.path, other.size)

    __hash__ = None  # type: ignore[assignment]  # compared by value, never a dict key

    def __repr__(self) -> str:
        return f"FileMember({self.path!r}, {self.size})"

    def __reduce__(self) -> tuple[type[FileMember], tuple[str, int]]:  # the class and its two fields: jobs carry thousands
        return (FileMember, (self.path, self.size))


Data = bytes | memoryview | FileMember
"""A member's bytes, or the file that holds them."""


def member_size(data: Data) -> int:
    return data.size if isinstance(data, FileMember) else len(data)


class ShardOut:
    """One output shard being written: :meth:`add` samples, then :meth:`finish` (or :meth:`abort`).

    With ``path=None`` nothing is written and only the table is kept (the table a shard of these samples
    would have: how an existing shard is compared when a pack resumes).

    Raises:
        WriteError: the temporary file cannot be created.
    """

    def __init__(self, path: str | None, *, compress: Compress = None, level: int = 3, frame_size: int = 8 << 10) -> None:
        self.path = path
        self._out = AtomicFile(path) if path is not None else None
        self._zw = SeekableZstdWriter(self._out.file, level=level, frame_size=frame_size) if self._out is not None and compress is not None else None
        self._fd = self._out.file.fileno() if self._out is not None else -1
        self._pending: list[bytes | memoryview] = []
        self._pending_bytes = 0
        self.pos = 0
        """Bytes of tar written so far (uncompressed)."""
        self._s_off: list[int] = []
        self._s_size: list[int] = []
        self._s_n: list[int] = []
        self._m_ext: list[int] = []
        self._m_off: list[int] = []
        self._m_size: list[int] = []
        self._keys: list[str] = []
        self._exts: dict[str, int] = {}

    @property
    def n_samples(self) -> int:
        return len(self._keys)

    def add(self, key: str, members: Sequence[tuple[str, Data]]) -> int:
        """Append one sample (members in order, each ``(extension, bytes or file)``); returns its bytes in the tar.

        Raises:
            PackError: a file member cannot be read, or its size is not the size it was listed with.
            WriteError: the shard cannot be written.
        """
        start = self.pos
        for ext, data in members:
            size = member_size(data)
            self._emit(member_header(f"{key}.{ext}", size))
            eid = self._exts.get(ext)
            if eid is None:
                eid = self._exts[ext] = len(self._exts)
            self._m_ext.append(eid)
            self._m_off.append(self.pos - start)
            self._m_size.append(size)
            if self._out is None:  # the table only
                self.pos += size
            elif isinstance(data, FileMember):
                self._copy(data)
            elif size:
                self._emit(data)
            if size % 512:
                self._emit(_PADS[padding(size)])
        self._s_off.append(start)
        self._s_size.append(self.pos - start)
        self._s_n.append(len(members))
        self._keys.append(key)
        if self._zw is not None:
            self._zw.boundary()
        return self.pos - start

    def _emit(self, data: bytes | memoryview) -> None:
        self.pos += len(data)
        if self._out is None:
            return
        if self._zw is not None:
            try:
                self._zw.write(data)
            except OSError as exc:  # a full disk: one line naming the shard, and no partial file
                raise self._failed(exc) from exc
            return
        self._pending.append(data)
        self._pending_bytes += len(data)
        if self._pending_bytes >= _WRITEV_BYTES or len(self._pending) >= _WRITEV_BUFFERS:
            self._flush()

    def _flush(self) -> None:
        buffers, self._pending, self._pending_bytes = self._pending, [], 0
        while buffers:
            try:
                done = os.writev(self._fd, buffers)
            except OSError as exc:
                raise self._failed(exc) from exc
            while buffers and done >= len(buffers[0]):  # a short write (a signal, a nearly full disk): go on after it
                done -= len(buffers[0])
                buffers.pop(0)
            if done:
                buffers[0] = memoryview(buffers[0])[done:]

    def _failed(self, exc: OSError) -> OSError:
        """Drop the shard after ``exc`` and return the error to raise (:meth:`tarindex._atomic.AtomicFile.failed`)."""
        out, self._out = self._out, None
        return out.failed(exc) if out is not None else exc

    def _copy(self, member: FileMember) -> None:
        """A file's bytes into the shard, checked against the size it was listed with.

        Raises:
            PackError: the file cannot be read, or has another size now.
        """
        try:
            fd = os.open(member.path, os.O_RDONLY)
        except OSError as exc:
            raise PackError(member.path, f"cannot read ({exc.strerror})") from exc
        try:
            left = member.size
            while True:
                want = min(left, _FILE_PIECE)
                try:
                    piece = os.read(fd, want + 1 if want == left else want)  # a byte more at the end: a file that grew
                except OSError as exc:
                    raise PackError(member.path, f"cannot read ({exc.strerror})") from exc
                if len(piece) > left or (not piece and left):
                    raise PackError(member.path, f"changed while it was packed ({member.size} bytes when listed, {os.fstat(fd).st_size} now)")
                if piece:
                    self._emit(piece)
                    left -= len(piece)
                if not left and len(piece) < want + 1:
                    return
        finally:
            os.close(fd)

    def table(self) -> ShardTable:
        """The offset table of the samples added so far."""
        return ShardTable.from_columns(
            (self._s_off, self._s_size, self._s_n, self._m_ext, self._m_off, self._m_size, self._keys, list(self._exts))
        )

    def finish(self) -> tuple[ShardInfo, ShardTable]:
        """End the archive, rename the shard to its path, and return its record (``path`` as given) and table.

        Raises:
            WriteError: the shard cannot be written or renamed.
        """
        table = self.table()
        self._emit(END_OF_ARCHIVE)
        out = self._out
        if out is None or self.path is None:
            raise ValueError("finish() of a shard that is not written")
        if self._zw is not None:
            try:
                self._zw.close()
            except OSError as exc:
                raise self._failed(exc) from exc
            table.frames = _frames(self._zw.sizes)
        else:
            self._flush()
        out.commit()
        self._out = None
        fd = os.open(self.path, os.O_RDONLY)
        try:
            st = os.fstat(fd)
            fp = fingerprint(fd, st.st_size)
        finally:
            os.close(fd)
        return shard_info(self.path, st.st_size, st.st_mtime_ns, fp, table, TAR if self._zw is None else ZSTD), table

    def abort(self) -> None:
        """Drop the shard in progress (its temporary file is removed)."""
        if self._out is not None:
            self._out.abort()
            self._out = None


def _frames(sizes: list[tuple[int, int]]) -> np.ndarray:
    """The frame table of frames of ``(compressed, uncompressed)`` sizes written back to back from offset 0."""
    rows = []
    c = d = 0
    for cs, ds in sizes:
        rows.append((c, cs, d, ds))
        c += cs
        d += ds
    return frame_array(rows)


def same_table(a: ShardTable, b: ShardTable) -> bool:
    """Whether two tables describe the same samples: keys, member extensions and sizes, every offset."""
    if a.keys != b.keys or a.n_members != b.n_members:
        return False
    columns = ("sample_offset", "sample_size", "sample_nmembers", "member_offset", "member_size")
    if not all(np.array_equal(getattr(a, c), getattr(b, c)) for c in columns):
        return False
    ext_a = np.asarray(a.exts, dtype=object)[a.member_ext] if a.n_members else []
    ext_b = np.asarray(b.exts, dtype=object)[b.member_ext] if b.n_members else []
    return list(ext_a) == list(ext_b)


def newest_mtime(paths: Sequence[str]) -> int:
    """The latest modification time of ``paths`` in nanoseconds (0 for none).

    Raises:
        PackError: a path cannot be read.
    """
    newest = 0
    for path in paths:
        try:
            newest = max(newest, os.stat(path).st_mtime_ns)
        except OSError as exc:
            raise PackError(path, f"cannot read ({exc.strerror})") from exc
    return newest


def unlink_quietly(path: str | Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
