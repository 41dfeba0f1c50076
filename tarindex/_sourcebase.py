"""The sequential source: what every shard reader (local file, pipe, HTTP, fsspec) is.

A source is iterated once and yields consecutive ``bytes`` chunks of the raw
stream, blocks of ``block_size`` bytes (never one read per member), read by a
thread that keeps ``prefetch`` blocks ahead so that reading (which releases
the GIL) overlaps parsing. A source that ``walks_direct`` is read by the C walk
itself instead (:class:`tarindex.tar.DirectSource`). The sources themselves
are in :mod:`tarindex.sources` (local, ``-``, ``pipe:``) and
:mod:`tarindex._http` (HTTP) and :mod:`tarindex.objstore` (object stores, fsspec).
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["DEFAULT_BLOCK_SIZE", "Source"]

DEFAULT_BLOCK_SIZE = 1 << 20

class Source:
    """A sequential byte stream; iterate once for its chunks, then ``close()``.

    Attributes:
        url: the name the source was opened with (used in every message).
        position: bytes delivered so far.
        size: total size when known in advance (file size, ``Content-Length``), else ``None``.
        mtime_ns: modification time when known (file, ``Last-Modified``), else 0.
        etag: the object's ``ETag`` when a server or store gives one, else ``None``.
    """

    def __init__(self, url: str, *, block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        self.url = url
        self.block_size = max(1 << 16, block_size)
        self.position = 0
        self.size: int | None = None
        self.mtime_ns = 0
        self.etag: str | None = None
        self._reader: Iterator[bytes] | None = None

    prefetch = 8
    """Blocks a reader thread keeps ready ahead of the parser (0: read in the caller's thread)."""

    walks_direct = False
    """Whether the C walk may read this source's descriptor itself: :meth:`read`, :meth:`direct`
    and :meth:`advance` (a :class:`tarindex.tar.DirectSource`), in the caller's thread."""

    def read(self, n: int) -> bytes:
        """Up to ``n`` more bytes (``b""`` at the end), for sources that :attr:`walks_direct`."""
        raise NotImplementedError(f"{type(self).__name__} is read in blocks")

    def direct(self) -> tuple[int, int, int] | None:
        """``(fd, bytes left or -1, timeout in ms or -1)`` when every byte read so far came out of
        :meth:`read` (nothing is buffered in Python), else ``None``."""
        return None

    def advance(self, n: int, timed_out: bool = False) -> None:
        """``n`` bytes were read from the :meth:`direct` descriptor (``timed_out``: then a wait for
        more timed out; sources without a timeout never see it)."""
        self.position += n

    def __iter__(self) -> Iterator[Any]:
        return self._run(self._chunks())

    def raw(self, first: bytes = b"") -> Iterator[bytes]:
        """The raw chunks, after ``first`` (bytes already read from the source), in the caller's thread."""
        raw = self._chunks()
        return itertools.chain((first,), raw) if first else raw

    def threaded(self, chunks: Iterator[bytes]) -> Iterator[bytes]:
        """``chunks`` (made from :meth:`raw`) computed in this source's reader thread, ``prefetch`` ahead."""
        return self._run(chunks)

    def _run(self, chunks: Iterator[bytes]) -> Iterator[bytes]:
        if self.prefetch <= 0:
            return chunks
        self._reader = _read_ahead(chunks, self.prefetch, self._interrupt)
        return self._reader

    def _chunks(self) -> Iterator[bytes]:
        raise NotImplementedError

    def _interrupt(self) -> None:
        """Release the connection or process, so that a read in progress returns (any thread)."""

    def close(self) -> None:
        """Stop reading and release the file, connection or process (safe to call twice)."""
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.close()  # type: ignore[attr-defined]  # a generator: stops and joins the reader thread
        self._interrupt()

    def __enter__(self) -> Source:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _blocks(self, read: Callable[[int], bytes]) -> Iterator[bytes]:
        """``block_size`` reads until an empty one (buffered readers fill each block; no extra copy)."""
        size = self.block_size
        while True:
            block = read(size)
            if not block:
                return
            self.position += len(block)
            yield block


class _Raised:
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


_END = object()


def _read_ahead(chunks: Iterator[bytes], depth: int, interrupt: Callable[[], None]) -> Iterator[bytes]:
    """Iterate ``chunks`` in a thread, ``depth`` blocks ahead: reads (no GIL) overlap the parser.

    Stopping early calls ``interrupt`` (closes the connection or ends the
    command) so that a read in progress returns, then waits for the thread.
    """
    q: queue.Queue[Any] = queue.Queue(depth)
    stop = threading.Event()

    def run() -> None:
        try:
            for chunk in chunks:
                if stop.is_set():
                    chunks.close()  # type: ignore[attr-defined]  # a generator: runs its cleanup here
                    return
                q.put(chunk)
            q.put(_END)
        except BaseException as exc:  # handed to the consumer's thread, whatever it is
            q.put(_Raised(exc))

    thread = threading.Thread(target=run, name="tarindex-read-ahead", daemon=True)
    thread.start()
    finished = False
    try:
        while True:
            item = q.get()
            if item is _END:
                finished = True
                return
            if isinstance(item, _Raised):
                finished = True
                raise item.exc
            yield item
    finally:
        if not finished:
            stop.set()
            interrupt()
            while thread.is_alive():  # let a blocked put() through
                try:
                    q.get(timeout=0.05)
                except queue.Empty:
                    pass
        thread.join()


def _reads(read: Callable[[int], bytes], size: int) -> Iterator[bytes]:
    """What each ``read(size)`` returns, until an empty one: a slow source's bytes go to the parser as
    they come, never held back to fill a block."""
    while chunk := read(size):
        yield chunk
