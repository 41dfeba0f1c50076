"""Every exception and warning raised by tarindex."""

from __future__ import annotations

import os

__all__ = [
    "CorruptArchiveError",
    "CorruptFrameError",
    "DecodeError",
    "DuplicateMemberError",
    "IndexChangedError",
    "IndexFormatError",
    "IndexNotFoundError",
    "RandomAccessError",
    "SampleNotFoundError",
    "SamplerStateError",
    "ShardNotFoundError",
    "SourceError",
    "StaleIndexError",
    "StreamWarning",
    "TarIndexError",
    "TarIndexWarning",
]


class TarIndexError(Exception):
    """Base class of every tarindex error."""


class TarIndexWarning(UserWarning):
    """Base class of every tarindex warning."""


class CorruptArchiveError(TarIndexError, ValueError):
    """A shard is not a valid tar archive at some byte offset."""

    def __init__(self, path: str, offset: int, what: str) -> None:
        self.path = str(path)
        self.offset = offset
        self.what = what
        super().__init__(f"{path}: {what} at offset {offset}")

    def __reduce__(self) -> tuple[type, tuple[str, int, str]]:  # survive worker processes
        return (type(self), (self.path, self.offset, self.what))


class CorruptFrameError(CorruptArchiveError):
    """zstd data is damaged (corrupt or truncated frame, bad seek table); the offset is in the compressed file."""


class DuplicateMemberError(CorruptArchiveError):
    """Two members of one sample share an extension."""


class DecodeError(TarIndexError, ValueError):
    """A sample's member could not be decoded (or its transform failed); names the shard and sample offset."""

    def __init__(self, path: str, offset: int, what: str) -> None:
        self.path = str(path)
        self.offset = offset
        self.what = what
        super().__init__(f"{path}: {what} (sample at offset {offset})")

    def __reduce__(self) -> tuple[type, tuple[str, int, str]]:  # survive worker processes
        return (type(self), (self.path, self.offset, self.what))


class StreamWarning(TarIndexWarning):
    """A streaming problem that was handled: a skipped sample or shard, fewer shards than workers."""


class IndexNotFoundError(TarIndexError, FileNotFoundError):
    """No index exists where one was expected."""


class ShardNotFoundError(TarIndexError, FileNotFoundError):
    """A shard named by the user or by an index does not exist."""


class SourceError(TarIndexError, OSError):
    """A shard's bytes could not be read: network failure after retries, a failing ``pipe:`` command."""

    def __init__(self, url: str, offset: int, what: str) -> None:
        self.path = str(url)
        self.offset = offset
        self.what = what
        super().__init__(f"{url}: {what} at byte offset {offset}")

    def __str__(self) -> str:  # OSError would format its arguments as (errno, strerror)
        return f"{self.path}: {self.what} at byte offset {self.offset}"

    def __reduce__(self) -> tuple[type, tuple[str, int, str]]:  # survive worker processes
        return (type(self), (self.path, self.offset, self.what))


class IndexFormatError(TarIndexError, ValueError):
    """A file is not a tarindex index, or has an unsupported format version."""


class RandomAccessError(TarIndexError, ValueError):
    """A shard cannot be read at random cheaply (a zstd shard made of one large frame)."""

    def __init__(self, path: str, what: str) -> None:
        self.path = str(path)
        self.what = what
        super().__init__(f"{path}: {what}")

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        return (type(self), (self.path, self.what))


class StaleIndexError(TarIndexError):
    """A shard changed after it was indexed."""

    def __init__(self, path: str, changed: str) -> None:
        self.path = str(path)
        self.changed = changed
        super().__init__(f"{path}: shard changed since it was indexed ({changed}); rebuild the index")

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        return (type(self), (self.path, self.changed))


class IndexChangedError(StaleIndexError):
    """The index file at a path is no longer the one first opened there (rebuilt in place)."""

    def __init__(self, path: str | os.PathLike[str], changed: str) -> None:
        self.path = str(path)
        self.changed = changed
        TarIndexError.__init__(self, f"{path}: the index was rebuilt since it was opened ({changed}); open it again")


class SampleNotFoundError(TarIndexError, KeyError):
    """A key or sample number is not in the index."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable
        return str(self.args[0]) if self.args else ""


class SamplerStateError(TarIndexError, ValueError):
    """A sampler state dict is malformed or belongs to another dataset or configuration."""
