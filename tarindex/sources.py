"""Where bytes come from: a URL opened as a sequential source of large chunks.

``open_source(url)`` accepts a local path, ``-`` (standard input),
``pipe:COMMAND`` (a shell command whose standard output is the shard, as in
webdataset), ``http://`` and ``https://`` (the standard library's
:mod:`http.client`; retries with backoff, resumed with a ``Range`` request at
the byte reached) and any other ``scheme://`` that :mod:`fsspec` knows
(``s3://``, ``gs://``, ...; ``pip install 'tarindex[s3]'``).

A source is iterated once and yields consecutive ``bytes`` chunks of the raw
stream, blocks of ``block_size`` bytes (never one read per member), read by a
thread that keeps ``prefetch`` blocks ahead so that reading (which releases
the GIL) overlaps parsing.
:func:`tarindex.scan.iter_archive` adds the codec's decompression (the codec registry, by content).

This module holds the local sources (file, ``-``, ``pipe:``) and
:func:`open_source`; the base class is in :mod:`tarindex._sourcebase`, the HTTP
sources (:class:`HTTPSource`, :class:`RangeReader`) in :mod:`tarindex._http`, the object-store and
fsspec ones in :mod:`tarindex.objstore`, and all of them are reached through here.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

from . import hub

# Re-exported for the package (`X as X`): importers reach every source through this module.
from ._http import HTTPSource as HTTPSource
from ._http import RangeReader as RangeReader
from ._sourcebase import DEFAULT_BLOCK_SIZE as DEFAULT_BLOCK_SIZE
from ._sourcebase import Source, _reads
from .errors import DescriptorLimitError, NotRegularFileError, ShardNotFoundError, SourceError
from .naming import ShardRef
from .objstore import FsspecSource as FsspecSource
from .objstore import open_stream
from .options import SourceAliases, SourceOptions

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["Source", "open_source"]  # public: open_source and what it returns; the rest serves the package

_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"))  # fmt: skip


def open_regular(path: str, flags: int = 0) -> tuple[int, os.stat_result]:
    """A read-only descriptor of the regular file at ``path`` and its ``fstat``; ``flags`` are added (``O_NOATIME``).

    Opened with ``O_NONBLOCK``, so that a FIFO where a shard should be (named by a pattern or by an index record)
    is refused at once instead of blocking ``open`` until some process writes to it. The flag stays on the
    descriptor: it has no effect on a regular file's reads (open(2)).

    Raises:
        NotRegularFileError: ``path`` is a FIFO, a socket, a device or a directory.
        OSError: the file cannot be opened (``FileNotFoundError`` when it is missing).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | flags)
    try:
        st = os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a regular file")
        raise NotRegularFileError(
            f"{path}: is {kind}, not a regular file; a shard must be a regular file (to stream a pipe, name it as 'pipe:cat {path}')"
        )
    return fd, st


class FileSource(Source):
    """A local file, read in blocks by the reader thread.

    Measured against one memory map per shard (``tools/bench.py``): reads in
    a thread overlap the parser and avoid page faults, and were faster.
    """

    def __init__(self, url: str, *, block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        super().__init__(url, block_size=block_size)
        try:
            self._fd, st = open_regular(url)
        except FileNotFoundError as exc:
            raise ShardNotFoundError(f"{url}: no such shard") from exc
        except IsADirectoryError as exc:
            raise ShardNotFoundError(f"{url}: is a directory, not a shard") from exc
        except OSError as exc:
            if exc.errno not in (errno.EMFILE, errno.ENFILE):
                raise
            raise DescriptorLimitError(
                f"{url}: cannot open: the process is out of file descriptors (ulimit -n: {resource.getrlimit(resource.RLIMIT_NOFILE)[0]}), "
                f"and a stream holds its shard open; raise the limit (ulimit -n) or stream fewer shards at once ({exc.strerror})"
            ) from exc
        self.size = st.st_size
        self.mtime_ns = st.st_mtime_ns
        self.device = st.st_dev
        """The device the file lies on (``st_dev``: which file system, :func:`tarindex._localreads.slow_device`)."""

    def _chunks(self) -> Iterator[bytes]:
        with open(self._fd, "rb", closefd=False) as f:
            yield from self._blocks(f.read)

    def fileno(self) -> int:
        """The open file's descriptor (for ``os.pread``; it stays ours, closed by :meth:`close`)."""
        return self._fd

    def close(self) -> None:
        super().close()  # the reader thread first: the descriptor is closed after its last read
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class StdinSource(Source):
    """Standard input (``-``); never closed by us. The C walk may read the descriptor itself once
    the bytes Python buffered (if anything read it before) are out."""

    walks_direct = True

    def __init__(self, url: str, *, block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        super().__init__(url, block_size=block_size)
        self._fresh = True

    def read(self, n: int) -> bytes:
        if self._fresh:  # what the buffered reader holds first, then the descriptor itself
            self._fresh = False
            buffer = sys.stdin.buffer
            read1 = getattr(buffer, "read1", None)  # a BufferedReader's: what it holds, or one read
            data: bytes = read1(n) if read1 is not None else buffer.read(n)
        else:
            data = os.read(sys.stdin.buffer.fileno(), n)
        self.position += len(data)
        return data

    def direct(self) -> tuple[int, int, int] | None:
        return None if self._fresh else (sys.stdin.buffer.fileno(), -1, -1)

    def _chunks(self) -> Iterator[bytes]:
        return _reads(self.read, self.block_size)


class PipeSource(Source):
    """``pipe:COMMAND``: the command's standard output; a non-zero exit status is an error.

    The pipe is unbuffered in Python, so the C walk may read its descriptor itself."""

    walks_direct = True

    def __init__(self, url: str, *, block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        super().__init__(url, block_size=block_size)
        self.command = ShardRef.of(url).path
        self._proc: subprocess.Popen[bytes] | None = None
        self._started = False

    def _start(self) -> subprocess.Popen[bytes]:
        self._started = True
        try:  # a 1 MiB pipe (the default maximum) instead of 64 KiB: fewer context switches
            proc = subprocess.Popen(
                self.command, shell=True, stdout=subprocess.PIPE, bufsize=0, pipesize=1 << 20, start_new_session=True
            )
        except PermissionError:  # over the unprivileged pipe-max-size
            proc = subprocess.Popen(self.command, shell=True, stdout=subprocess.PIPE, bufsize=0, start_new_session=True)
        self._proc = proc
        return proc

    def read(self, n: int) -> bytes:
        proc = self._proc
        if proc is None:
            if self._started:  # ended, or stopped by the consumer
                return b""
            proc = self._start()
        stdout = proc.stdout
        data = stdout.read(n) if stdout is not None else b""  # unbuffered: one read(); None never (blocking)
        if data:
            self.position += len(data)
            return data
        self._finish(proc)
        return b""

    def _finish(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.stdout is not None:
            proc.stdout.close()
        status = proc.wait()
        if self._proc is None:  # closed by the consumer: the status is not ours to report
            return
        self._proc = None
        if status != 0:
            raise SourceError(self.url, self.position, f"command exited with status {status}")

    def direct(self) -> tuple[int, int, int] | None:
        proc = self._proc
        return (proc.stdout.fileno(), -1, -1) if proc is not None and proc.stdout is not None else None

    def _chunks(self) -> Iterator[bytes]:
        return _reads(self.read, self.block_size)

    def _interrupt(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:  # stopped early: the rest of the output is not wanted
            try:  # the whole process group: a shell's children hold the pipe open too
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=2)
            except subprocess.TimeoutExpired:  # a SIGTERM that raced the shell's fork, or a command that ignores it
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()


def open_source(url: str | ShardRef, *, options: SourceOptions | None = None, read_ahead: int | None = None, **aliases: Unpack[SourceAliases]) -> Source:
    """Open a shard name as a sequential :class:`Source` (see the module docstring).

    Args:
        url: local path, ``-``, ``pipe:COMMAND``, ``http(s)://...``, ``s3://``/``gs://``/``az://``
            (:mod:`tarindex.objstore`) or another fsspec URL; or what it means (a
            :class:`~tarindex.naming.ShardRef`, made once by a caller that opens the name again and again).
        options: every remote option at once (:class:`~tarindex.options.SourceOptions`); the
            keywords below override single fields of it.
        read_ahead: blocks a reader thread keeps ready (0: no thread); default :attr:`Source.prefetch` (8).

    Keyword Args:
        block_size (int | None): bytes per read (default 1 MiB).
        retries (int | None): network failures allowed without progress before giving up (see :mod:`tarindex._retry`).
        backoff (float | None): upper bound in seconds of the first retry's wait (full jitter, doubled per failure, at most 30).
        timeout (float | None): seconds without a byte before a request fails.
        storage_options (Mapping[str, Any] | None): client options of an object store or fsspec filesystem (endpoint, credentials...).
        headers (Mapping[str, str] | None): extra HTTP(S) request headers (e.g. ``Authorization``).

    Raises:
        ShardNotFoundError: a local shard does not exist (remote ones fail on first read).
    """
    if aliases or options is None:  # the options as given otherwise: a stream opens each shard with its own
        options = SourceOptions.given(options, call="open_source", **aliases)
    source = _open(url if isinstance(url, ShardRef) else ShardRef.of(url), options)
    if read_ahead is not None:
        source.prefetch = read_ahead
    return source


def _open(ref: ShardRef, options: SourceOptions) -> Source:
    url = ref.name
    if ref.kind == "stdin":
        return StdinSource(url, block_size=options.block_size)
    if ref.kind == "pipe":
        return PipeSource(url, block_size=options.block_size)
    if ref.kind == "hub":  # the file's resolve URL, with the user's token
        return HTTPSource(*hub.resolve(url, options))
    if ref.kind == "http":
        return HTTPSource(url, options)
    if ref.kind == "object":
        return open_stream(url, options)
    if ref.kind == "fsspec":
        return FsspecSource(url, options)
    return FileSource(ref.path if ref.kind == "file-url" else url, block_size=options.block_size)
