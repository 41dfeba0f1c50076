"""The one atomic writer: a temporary name in the target's directory, fsync of the file and of the
directory, then a rename; the stale temporary files of dead writers are removed by the next one.

A power loss or a crash leaves the previous file or the new one, never a partial or empty one. Temporary
names are ``.NAME.tmp-PID``; a writer removes those of ``NAME`` whose process no longer runs on this
host (a directory shared over NFS by several hosts may hold live ones of another host: they are left
while their PID is alive here too, and otherwise removed, which only fails that writer's rename).
"""

from __future__ import annotations

import contextlib
import errno
import glob
import os
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from .errors import WriteError

__all__ = ["WRITE_ERRNOS", "AtomicFile", "alive", "atomic_write", "clean_stale", "commit", "fsync_dir", "replaced", "temp_name", "write_error"]


_NEARLY_FULL = 1 << 20  # bytes free under which an I/O error is most likely a full disk


def temp_name(target: Path) -> Path:
    """This process's temporary name for ``target``: ``.NAME.tmp-PID`` beside it."""
    return target.with_name(f".{target.name}.tmp-{os.getpid()}")


def alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (this process included): whose temporary files must stay."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def clean_stale(target: Path) -> list[Path]:
    """Remove the temporary files of ``target`` left by writers that died (``kill -9``, power loss); returns them."""
    removed = []
    for name in glob.glob(glob.escape(str(target.with_name(f".{target.name}.tmp-"))) + "*"):
        tail = name.rsplit(".tmp-", 1)[1]
        pid = int(tail.split("-", 1)[0]) if tail.split("-", 1)[0].isdigit() else -1
        if pid < 0 or alive(pid):
            continue
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)
            removed.append(Path(name))
    return removed


def fsync_dir(directory: Path) -> None:
    """Make a rename or unlink in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError as exc:  # some file systems cannot sync a directory: the rename is as durable as they allow
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


_RENAMED: dict[Path, tuple[int, int]] = {}  # target -> (device, inode) of the file this process renamed over it


def commit(tmp: Path, target: Path) -> None:
    """Rename the complete, synced ``tmp`` over ``target`` and sync the directory."""
    st = os.stat(tmp)
    _RENAMED[Path(target)] = (st.st_dev, st.st_ino)  # before the rename: replaced() tells whether it happened
    os.replace(tmp, target)
    fsync_dir(target.parent)


def replaced() -> list[Path]:
    """The targets whose file is now one this process wrote and renamed over them: exact whenever it is asked
    (an interrupt between the record and the rename leaves the target's inode the old one)."""
    done = []
    for target, ident in _RENAMED.items():
        try:
            st = os.stat(target)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == ident:
            done.append(target)
    return done


def write_error(target: Path, exc: BaseException) -> WriteError:
    """The one-line error for a failed write of ``target`` (full disk, read-only directory, I/O error)."""
    cause = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    cause = cause.removeprefix(f"{temp_name(target)}: ")  # LMDB names the file it opened: ours, named in the message
    if not (isinstance(exc, OSError) and exc.errno == errno.ENOSPC):  # LMDB reports a short write as EIO
        try:
            st = os.statvfs(target.parent)
        except OSError:
            pass
        else:
            if st.f_blocks and st.f_bavail * st.f_frsize < _NEARLY_FULL:  # (no blocks at all: /proc, not a full disk)
                cause += f"; the disk is full ({st.f_bavail * st.f_frsize} bytes free)"
    return WriteError(str(target), cause)


class AtomicFile:
    """A binary file written as ``.NAME.tmp-PID`` beside ``path``; :meth:`commit` syncs it and renames it over
    ``path``, :meth:`abort` removes it. Stale temporary files of ``path`` are cleaned on creation.

    Raises:
        WriteError: the temporary file cannot be created (read-only or missing directory, full disk).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.tmp = temp_name(self.path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            clean_stale(self.path)
            self.file: BinaryIO = open(self.tmp, "wb")  # noqa: SIM115 - closed by commit/abort
        except OSError as exc:
            raise write_error(self.path, exc) from exc

    def commit(self) -> None:
        """Sync the file, rename it over ``path``, sync the directory.

        Raises:
            WriteError: the data could not be written (a full disk shows here at the latest).
        """
        try:
            try:
                self.file.flush()
                os.fsync(self.file.fileno())
            finally:
                self.file.close()
            commit(self.tmp, self.path)
        except OSError as exc:
            self.abort()
            raise write_error(self.path, exc) from exc

    def abort(self) -> None:
        """Remove the temporary file (the previous ``path``, if any, is untouched)."""
        with contextlib.suppress(OSError):
            self.file.close()  # may fail to flush (full disk): the data is discarded anyway
        with contextlib.suppress(OSError):
            self.tmp.unlink()

    def failed(self, exc: OSError) -> OSError:
        """Abort after ``exc`` and return the error to raise: a :class:`WriteError` for an error of writing."""
        self.abort()
        return write_error(self.path, exc) if exc.errno in WRITE_ERRNOS else exc


WRITE_ERRNOS = frozenset(
    getattr(errno, name) for name in ("ENOSPC", "EDQUOT", "EROFS", "EACCES", "EPERM", "EFBIG", "EIO") if hasattr(errno, name)
)
"""Errors of a write (as opposed to those of reading the input), reported as :class:`WriteError`."""


@contextlib.contextmanager
def atomic_write(target: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """A binary file to fill; on a clean exit it is synced and renamed over ``target``, else removed.

    Raises:
        WriteError: the file could not be written or renamed (one line: the path and the cause).
    """
    out = AtomicFile(target)
    try:
        yield out.file
    except OSError as exc:
        raise out.failed(exc) from exc
    except BaseException:
        out.abort()
        raise
    out.commit()
