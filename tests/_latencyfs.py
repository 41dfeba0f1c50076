"""Storage with latency, on this machine: a FUSE passthrough that adds a fixed delay to every read, and
cold-cache helpers.

``mount(source, mountpoint, delay=0.001)`` mounts the directory ``source`` read-only at ``mountpoint``
through a FUSE file system (mfusepy over Debian's libfuse3) that runs in a process of its own, so the
FUSE loop never shares a GIL with the reader being measured. Every ``read`` that reaches it sleeps
``delay`` seconds, then ``pread``s the source file; ``open_delay`` and ``getattr_delay`` do the same for
``open`` and ``getattr`` (0 by default). The loop is multithreaded (up to ``threads`` requests served at
once), so reads from many threads or processes overlap as they do on a network file system: 32 threads
each reading once take about one delay, not 32 (``tests/test_latencyfs.py``). What that costs the CPU
bounds what the mount can serve: each request is a round trip through the kernel and a Python
callback, about 100-200 us of CPU on a 2-core machine, so at 1 ms a mount serves some 6,500-11,000
reads/s however many threads ask (64 threads get 8-14x one thread there, 50-58x at 10 ms:
docs/performance.md); a benchmark measures the physical limit through the same mount in the same run
(``tools/bench_latency.py``).

The kernel's side is chosen at mount time:

- ``direct_io=False`` (default): reads go through the kernel's page cache, with its readahead
  (``max_readahead``: bytes per file, ``None`` the kernel's default of 128 KiB, ``0`` off; above 128 KiB
  it is set through the mount's ``/sys/class/bdi/*/read_ahead_kb``, as root) and requests of up to
  ``max_read`` bytes (``None``: the kernel's largest, 1 MiB with libfuse 3). A file's cache is kept
  across opens while its size and mtime stay (libfuse's ``auto_cache``, as NFS keeps it) and dropped by
  :func:`drop_cache`; what the cache serves never reaches the delay.
- ``direct_io=True``: no page cache and no readahead; every ``read``/``pread`` of the reader becomes
  FUSE reads of its own size (split at ``max_read``), each paying the delay, as on mountpoint-s3 or a
  FUSE mount opened with ``O_DIRECT``. Files cannot be memory-mapped there.

The mount counts what reached it (:meth:`LatencyMount.stats`: reads, bytes, the largest read, opens,
getattrs, the most reads in flight at once) in a small file both processes map. ``unmount`` (and the
``latency_mount`` fixture after every test, passed or failed) runs ``fusermount3 -u``, lazily (``-z``)
when the mount is busy, and ends the process.

Cold cache: :func:`drop_cache` writes back and drops the page cache of files
(``posix_fadvise(POSIX_FADV_DONTNEED)``, for this machine's local files and for files of a mount alike);
:func:`resident_pages` counts a file's pages in the cache with ``mincore`` (through ``ctypes``, on a
``PROT_READ`` mapping), so a cold pass can check its shards left the cache: after a drop the count is 0
(``tests/test_latencyfs.py`` checks it, and checks the count against util-linux's ``fincore``). Without
``/dev/fuse`` (a container started without it) the fixture skips with that reason; everywhere else a
mount that fails to start is an error with the FUSE process's output.

Run alone, the module is the FUSE process: ``python tests/_latencyfs.py SOURCE MOUNTPOINT --delay 0.001``
(``--help``); it serves until ``fusermount3 -u MOUNTPOINT``.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import mmap
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["LatencyMount", "LatencyStats", "drop_cache", "latency_mount", "mount", "mount_type", "readahead", "resident_pages"]

DEFAULT_DELAY = 0.001
"""Seconds each read waits: 1 ms, a round trip to a network file system or a bucket's nearby cache."""

_FIELDS = ("reads", "read_bytes", "max_read", "opens", "getattrs", "in_flight", "peak_in_flight")
_STATS = struct.Struct(f"<{len(_FIELDS)}q")
_RESETTABLE = (0, 1, 2, 3, 4, 6)  # all but in_flight: a reset between passes must not lose reads in progress


@dataclass(frozen=True, slots=True)
class LatencyStats:
    """What reached the FUSE process since the mount or the last :meth:`LatencyMount.reset_stats`."""

    reads: int
    """FUSE read requests (each paid the delay)."""
    read_bytes: int
    """Bytes those requests returned."""
    max_read: int
    """The largest request's size in bytes (what the kernel asked, before a short read at the end)."""
    opens: int
    """``open`` requests."""
    getattrs: int
    """``getattr`` requests (a ``stat`` the kernel did not answer from its attribute cache)."""
    in_flight: int
    """Reads being served now."""
    peak_in_flight: int
    """The most reads served at once."""


# -- the FUSE process ------------------------------------------------------------------------------


class _Passthrough:
    """The file system's operations (mfusepy calls the methods it finds: nothing else is registered, so
    writes, links and locks stay with the kernel or fail as on any read-only mount)."""

    use_ns = True  # times as integer nanoseconds, exactly as the source's stat has them

    def __init__(self, root: str, delays: tuple[float, float, float], max_read: int | None, max_readahead: int | None, counters: memoryview) -> None:
        self.root = root
        self.delay, self.open_delay, self.getattr_delay = delays
        self.max_read, self.max_readahead = max_read, max_readahead
        self.counters = counters  # int64 fields of _FIELDS, in the file the mounting process reads
        self.mutex = threading.Lock()  # not "lock": mfusepy would take an attribute of that name for the FUSE op

    def init_with_config(self, conn: Any, config: Any) -> None:
        """The connection's limits, which libfuse 3.14's high-level API takes from no option."""
        if conn is None:
            return
        if self.max_read is not None:
            conn.max_read = self.max_read  # as the mount option says, or libfuse refuses the connection
        if self.max_readahead is not None:
            conn.max_readahead = self.max_readahead  # the kernel keeps the smaller of this and 128 KiB

    def _source(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    def getattr(self, path: str, fh: int | None = None) -> dict[str, int]:
        if self.getattr_delay:
            time.sleep(self.getattr_delay)
        with self.mutex:
            self.counters[4] += 1
        st = os.lstat(self._source(path))
        return {
            "st_mode": st.st_mode & ~0o222,  # read-only, as mounted
            "st_nlink": st.st_nlink,
            "st_size": st.st_size,
            "st_uid": st.st_uid,
            "st_gid": st.st_gid,
            "st_blocks": st.st_blocks,
            "st_atime": st.st_atime_ns,
            "st_mtime": st.st_mtime_ns,
            "st_ctime": st.st_ctime_ns,
        }

    def readdir(self, path: str, fh: int) -> list[str]:
        return [".", "..", *sorted(os.listdir(self._source(path)))]

    def readlink(self, path: str) -> str:
        return os.readlink(self._source(path))

    def statfs(self, path: str) -> dict[str, int]:
        sv = os.statvfs(self._source(path))
        keys = ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree", "f_favail", "f_namemax")
        return {key: getattr(sv, key) for key in keys}

    def open(self, path: str, flags: int) -> int:
        if flags & os.O_ACCMODE != os.O_RDONLY:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        if self.open_delay:
            time.sleep(self.open_delay)
        with self.mutex:
            self.counters[3] += 1
        return os.open(self._source(path), os.O_RDONLY)

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        c = self.counters
        with self.mutex:
            c[5] += 1
            if c[5] > c[6]:
                c[6] = c[5]
        try:
            time.sleep(self.delay)
            data = os.pread(fh, size, offset)
        except BaseException:
            with self.mutex:
                c[5] -= 1
            raise
        with self.mutex:
            c[5] -= 1
            c[0] += 1
            c[1] += len(data)
            if size > c[2]:
                c[2] = size
        return data

    def release(self, path: str, fh: int) -> int:
        os.close(fh)
        return 0


def _serve(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="A read-only FUSE passthrough of SOURCE at MOUNTPOINT that delays every read.")
    ap.add_argument("source")
    ap.add_argument("mountpoint")
    ap.add_argument("--delay", type=float, default=DEFAULT_DELAY, help="seconds per read (default 0.001)")
    ap.add_argument("--open-delay", type=float, default=0.0)
    ap.add_argument("--getattr-delay", type=float, default=0.0)
    ap.add_argument("--direct-io", action="store_true", help="no page cache, no readahead")
    ap.add_argument("--max-read", type=int, default=None, help="largest read request, bytes")
    ap.add_argument("--max-readahead", type=int, default=None, help="kernel readahead per file, bytes (0: off)")
    ap.add_argument("--threads", type=int, default=128, help="requests served at once")
    ap.add_argument("--stats", default=None, help=f"a file of {_STATS.size} bytes to count into")
    args = ap.parse_args(argv)

    import mfusepy

    if args.stats:
        fd = os.open(args.stats, os.O_RDWR)
        shared = mmap.mmap(fd, _STATS.size)
        os.close(fd)
        counters = memoryview(shared).cast("q")
    else:
        counters = memoryview(bytearray(_STATS.size)).cast("q")
    delays = (args.delay, args.open_delay, args.getattr_delay)
    ops = _Passthrough(os.path.realpath(args.source), delays, args.max_read, args.max_readahead, counters)
    options: dict[str, Any] = {
        "foreground": True,
        "ro": True,
        "fsname": f"latencyfs:{args.source}",
        "subtype": "latencyfs",
        "max_threads": args.threads,
        "max_idle_threads": args.threads,  # libfuse 3.14 would end idle threads past its default (and say so)
    }
    if args.direct_io:
        options["direct_io"] = True
    else:
        options["auto_cache"] = True  # a file's cache survives its next open while its size and mtime stay
    if args.max_read is not None:
        options["max_read"] = args.max_read
    mfusepy.FUSE(ops, args.mountpoint, **options)


# -- the mounting side ------------------------------------------------------------------------------


def mount_type(mountpoint: str) -> str | None:
    """The file system type mounted at ``mountpoint`` now, or ``None`` (from the mount table: no ``stat``
    through the mount)."""
    escaped = mountpoint.replace("\\", "\\134").replace(" ", "\\040").replace("\t", "\\011").replace("\n", "\\012")
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split(" ")
            if fields[4] == escaped:
                return fields[fields.index("-") + 1]
    return None


@dataclass
class LatencyMount:
    """A running mount (see :func:`mount`); a context manager that unmounts on exit."""

    source: Path
    mountpoint: Path
    delay: float
    direct_io: bool
    options: dict[str, object]
    process: subprocess.Popen[bytes]
    stats_file: Path
    log_file: Path
    _workdir: Path = field(repr=False)

    def path(self, source_path: str | os.PathLike[str]) -> Path:
        """``source_path`` (a file under :attr:`source`, or a name relative to it) as seen through the mount."""
        p = Path(source_path)
        return self.mountpoint / (p.resolve().relative_to(self.source) if p.is_absolute() else p)

    def paths(self, source_paths: Iterable[str | os.PathLike[str]]) -> list[str]:
        return [str(self.path(p)) for p in source_paths]

    def stats(self) -> LatencyStats:
        return LatencyStats(*_STATS.unpack(self.stats_file.read_bytes()[: _STATS.size]))

    def reset_stats(self) -> None:
        """Zero every count but the reads in flight (call it between passes, with no reads in progress)."""
        fd = os.open(self.stats_file, os.O_WRONLY)
        try:
            for k in _RESETTABLE:
                os.pwrite(fd, bytes(8), 8 * k)
        finally:
            os.close(fd)

    def log(self) -> str:
        """What the FUSE process wrote (libfuse's and mfusepy's messages), until the unmount."""
        return self.log_file.read_text(errors="replace") if self.log_file.exists() else ""

    def unmount(self) -> None:
        """Unmount (lazily when the mount is busy) and end the FUSE process; safe to call twice."""
        target = str(self.mountpoint)
        if mount_type(target):
            tool = shutil.which("fusermount3")
            for args in (["-u"], ["-u", "-z"]):
                done = subprocess.run([tool, *args, target], capture_output=True) if tool else None
                if done is not None and done.returncode == 0:
                    break
            else:  # no fusermount3, or it failed twice: the kernel's lazy unmount (root)
                subprocess.run(["umount", "-l", target], capture_output=True)
        if self.process.poll() is None:
            self.process.terminate()  # libfuse's handler: leave the loop, unmount if still mounted
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self._workdir, ignore_errors=True)

    def __enter__(self) -> LatencyMount:
        return self

    def __exit__(self, *exc: object) -> None:
        self.unmount()


def mount(
    source: str | os.PathLike[str],
    mountpoint: str | os.PathLike[str],
    *,
    delay: float = DEFAULT_DELAY,
    open_delay: float = 0.0,
    getattr_delay: float = 0.0,
    direct_io: bool = False,
    max_read: int | None = None,
    max_readahead: int | None = None,
    threads: int = 128,
    timeout: float = 30.0,
) -> LatencyMount:
    """Mount ``source`` read-only at ``mountpoint`` (an empty directory) with ``delay`` seconds per read.

    Raises:
        RuntimeError: the FUSE process ended or did not mount within ``timeout`` seconds (with its output).
    """
    src, mnt = Path(source).resolve(), Path(mountpoint).resolve()
    if mount_type(str(mnt)) == "fuse.latencyfs":  # a mount of this harness left here (a killed run's) goes first
        subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True)
    workdir = Path(tempfile.mkdtemp(prefix="latencyfs-"))
    stats_file, log_file = workdir / "stats", workdir / "log"
    stats_file.write_bytes(bytes(_STATS.size))
    options: dict[str, object] = {"open_delay": open_delay, "getattr_delay": getattr_delay, "max_read": max_read, "max_readahead": max_readahead, "threads": threads}
    cmd = [sys.executable, str(Path(__file__).resolve()), str(src), str(mnt), "--delay", repr(delay), "--stats", str(stats_file)]
    cmd += ["--open-delay", repr(open_delay), "--getattr-delay", repr(getattr_delay), "--threads", str(threads)]
    cmd += ["--direct-io"] if direct_io else []
    cmd += ["--max-read", str(max_read)] if max_read is not None else []
    cmd += ["--max-readahead", str(max_readahead)] if max_readahead is not None else []
    with open(log_file, "wb") as log:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    handle = LatencyMount(src, mnt, delay, direct_io, options, proc, stats_file, log_file, workdir)
    deadline = time.monotonic() + timeout
    while True:
        failure = None
        if mount_type(str(mnt)):
            try:
                os.stat(mnt)  # the first request: a FUSE init that failed answers ECONNREFUSED here
                break
            except OSError as exc:
                failure = exc
        if failure is not None or proc.poll() is not None or time.monotonic() > deadline:
            time.sleep(0.2)  # the process's last words
            output = handle.log()
            handle.unmount()
            why = (f"mounted, but answers {failure}" if failure is not None else f"exited with status {proc.returncode}"
                   if proc.returncode is not None else f"did not mount within {timeout:g} s")
            raise RuntimeError(f"latencyfs {why}: {' '.join(cmd)}\n{output}")
        time.sleep(0.01)
    if max_readahead is not None:
        try:
            _set_readahead(mnt, max_readahead)
        except OSError as exc:
            handle.unmount()
            raise RuntimeError(f"latencyfs: cannot set the readahead of {mnt} to {max_readahead} bytes: {exc}") from exc
    return handle


def readahead(mountpoint: str | os.PathLike[str]) -> int:
    """The kernel's readahead for files of a mount, in bytes (its backing device's ``read_ahead_kb``)."""
    dev = os.stat(mountpoint).st_dev
    return int(Path(f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb").read_text()) << 10


def _set_readahead(mountpoint: Path, size: int) -> None:
    """The mount's readahead: ``max_readahead`` at FUSE init caps it at the kernel's 128 KiB default; the
    device's ``read_ahead_kb`` (root) sets any size. Raises ``OSError`` when neither gives ``size``."""
    if readahead(mountpoint) == size:
        return
    dev = os.stat(mountpoint).st_dev
    Path(f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb").write_text(str(-(-size >> 10)))
    if readahead(mountpoint) != -(-size >> 10) << 10:
        raise OSError(errno.EINVAL, f"read_ahead_kb reads {readahead(mountpoint)} bytes")


# -- cold cache ----------------------------------------------------------------------------------


def drop_cache(paths: Iterable[str | os.PathLike[str]]) -> None:
    """Drop the page cache of each file (written back first: dirty pages cannot be dropped).

    ``posix_fadvise(POSIX_FADV_DONTNEED)`` over the whole file: works for local files and for files of a
    FUSE mount (its own cache; the source files' cache is theirs to drop). Only these files, nothing global.
    """
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            with contextlib.suppress(OSError):  # a file system without fsync (a read-only FUSE mount) has nothing dirty
                os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
_MAP_FAILED = ctypes.c_void_p(-1).value


def resident_pages(path: str | os.PathLike[str]) -> tuple[int, int]:
    """(pages of ``path`` in the page cache, pages of the file), by ``mincore`` over a read-only shared mapping.

    Raises:
        OSError: the file cannot be opened or mapped (a ``direct_io`` mount refuses maps).
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        page = mmap.PAGESIZE
        pages = -(-size // page)
        if pages == 0:
            return 0, 0
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr == _MAP_FAILED or addr is None:
            err = ctypes.get_errno()
            raise OSError(err, f"mmap of {path}: {os.strerror(err)}")
        try:
            vec = (ctypes.c_ubyte * pages)()
            if _libc.mincore(addr, size, vec) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"mincore of {path}: {os.strerror(err)}")
            return sum(b & 1 for b in vec), pages
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)


if __name__ == "__main__":
    _serve()
else:  # imported by the tests or a benchmark; the FUSE process itself skips pytest's import (0.2 s a mount)
    import pytest

    @pytest.fixture
    def latency_mount(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., LatencyMount]]:
        """``latency_mount(source, **options)`` mounts ``source`` through the latency passthrough (:func:`mount`'s
        options) at a fresh directory; every mount the test made is unmounted after it, passed or failed.

        Skips only where ``/dev/fuse`` is missing (``tests/test_latencyfs.py`` asserts it exists on Linux)."""
        if not os.path.exists("/dev/fuse"):
            pytest.skip("/dev/fuse is missing: no FUSE mounts on this machine (a container needs --device /dev/fuse)")
        made: list[LatencyMount] = []

        def make(source: str | os.PathLike[str], **options: Any) -> LatencyMount:
            handle = mount(source, tmp_path_factory.mktemp("mnt"), **options)
            made.append(handle)
            return handle

        try:
            yield make
        finally:
            for handle in made:
                handle.unmount()
