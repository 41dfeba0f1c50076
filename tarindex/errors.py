"""Every exception and warning raised by tarindex."""

from __future__ import annotations

import datetime
import os
from typing import Any, ClassVar, overload

__all__ = [
    "CommandNotAllowedError",
    "CorruptArchiveError",
    "CorruptDeflateError",
    "CorruptFrameError",
    "DecodeError",
    "DecompressionLimitError",
    "DescriptorLimitError",
    "DuplicateMemberError",
    "ExportError",
    "IndexChangedError",
    "IndexFormatError",
    "IndexNotFoundError",
    "ListError",
    "NotRegularFileError",
    "OptionError",
    "OptionTypeError",
    "OverwriteError",
    "PackError",
    "PatternError",
    "RandomAccessError",
    "SampleNotFoundError",
    "SamplerStateError",
    "ShardNotFoundError",
    "SourceError",
    "StaleIndexError",
    "StateError",
    "StreamWarning",
    "TarIndexError",
    "TarIndexWarning",
    "UnsupportedCompressionError",
    "WriteError",
]

SHOWN_CHARS = 80
"""How much of a key (or any name taken from data) an error message shows."""


def shown(name: str | bytes) -> str:
    """``name`` quoted for an error message, cut to :data:`SHOWN_CHARS` characters with its full length said:
    a key of 100,000 bytes must not make a 100,000-character error line."""
    text = name.decode("utf-8", "replace") if isinstance(name, bytes) else name
    if len(text) <= SHOWN_CHARS:
        return repr(text)
    return f"{text[:SHOWN_CHARS]!r}... ({len(text)} characters)"


NO_RANGES = (
    "the server does not answer Range requests (TarDataset needs them to read at random, TarStream streams "
    "without them; serve the shards with one that answers ranges: nginx, Apache, caddy, python -m RangeHTTPServer, "
    "an object store)"
)
"""What a read (or a build's check) says of an HTTP server that answers a ranged request with the whole file."""


def iso_time(ns: int) -> str:
    """A time in nanoseconds since the epoch as an ISO 8601 local time with its UTC offset, to the
    nanosecond when it has a fraction of a second: ``2024-05-01T12:00:00.123456789+02:00``."""
    seconds, fraction = divmod(ns, 1_000_000_000)
    when = datetime.datetime.fromtimestamp(seconds).astimezone()
    text = when.strftime("%Y-%m-%dT%H:%M:%S")
    if fraction:
        text += f".{fraction:09d}".rstrip("0")
    offset = when.strftime("%z")
    return text + (f"{offset[:3]}:{offset[3:]}" if offset not in ("", "+0000") else "Z")


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1: ``1 shard``, ``2 shards``, ``0 shards``
    (``plural`` for a noun that does not take an s: ``counted(2, "index", "indexes")``)."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


class TarIndexError(Exception):
    """Base class of every tarindex error.

    Every error can be made from its finished message alone, ``SomeError(message=...)``: that is how
    torch's DataLoader re-raises a worker's exception in the main process (it calls ``type(exc)(message=...)``
    when the class has a ``message`` attribute), so the type survives DataLoader workers. Errors pickle as
    their type, message and fields, without calling ``__init__`` again (process pools, spawned workers).
    """

    def __init__(self, *args: object, message: str | None = None) -> None:
        super().__init__(*((message,) if message is not None else args))

    @property
    def message(self) -> str:
        """The error's message: what, where, expected vs got."""
        return str(self)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_restore, (type(self), self.args, dict(self.__dict__)))


def _restore(cls: type[TarIndexError], args: tuple[object, ...], fields: dict[str, Any]) -> TarIndexError:
    """An unpickled error: its type, its message and its fields, as they were."""
    error = cls.__new__(cls, *args)
    error.args = args
    error.__dict__.update(fields)
    return error


class _AtOffset(TarIndexError):
    """An error at a byte offset of a shard: ``.path``, ``.offset``, ``.what``; the message from ``_template``."""

    _template: ClassVar[str] = "{path}: {what} at offset {offset}"
    path: str = ""  # these defaults hold for an error made from its message alone
    offset: int = -1
    what: str = ""

    @overload
    def __init__(self, path: str | os.PathLike[str], offset: int, what: str) -> None: ...
    @overload
    def __init__(self, *, message: str) -> None: ...
    def __init__(
        self, path: str | os.PathLike[str] = "", offset: int = -1, what: str = "", *, message: str | None = None
    ) -> None:
        if message is None:
            self.path, self.offset, self.what = str(path), offset, what
            message = self._template.format(path=self.path, offset=offset, what=what)
        super().__init__(message=message)


class _OfShard(TarIndexError):
    """An error about a whole shard: ``.path``, ``.what``; the message from ``_template``."""

    _template: ClassVar[str] = "{path}: {what}"
    path: str = ""  # these defaults hold for an error made from its message alone
    what: str = ""

    @overload
    def __init__(self, path: str | os.PathLike[str], what: str) -> None: ...
    @overload
    def __init__(self, *, message: str) -> None: ...
    def __init__(self, path: str | os.PathLike[str] = "", what: str = "", *, message: str | None = None) -> None:
        if message is None:
            self.path, self.what = str(path), what
            message = self._template.format(path=self.path, what=what)
        super().__init__(message=message)


class TarIndexWarning(UserWarning):
    """Base class of every tarindex warning."""


class CorruptArchiveError(_AtOffset, ValueError):
    """A shard is not a valid tar archive at some byte offset."""


class CorruptFrameError(CorruptArchiveError):
    """zstd data is damaged (corrupt or truncated frame, bad seek table); the offset is in the compressed file."""


class CorruptDeflateError(CorruptArchiveError):
    """gzip data is damaged (bad header, corrupt deflate stream, CRC or length mismatch, truncated);
    the offset is in the compressed file."""


class DecompressionLimitError(CorruptArchiveError):
    """Compressed data expands beyond a configured bound (:class:`tarindex.compression.Limits`): a
    decompression bomb, or a shard that needs the bound raised; the offset is in the compressed file."""


class UnsupportedCompressionError(_OfShard, ValueError):
    """A shard is compressed with a format tarindex does not read (bzip2, xz, lz4); the message names the
    format and the command that converts the shard."""


class DuplicateMemberError(CorruptArchiveError):
    """Two members of one sample share an extension."""


class DecodeError(_AtOffset, ValueError):
    """A sample's member could not be decoded (or its transform failed); names the shard and sample offset."""

    _template = "{path}: {what} (sample at offset {offset})"


class StreamWarning(TarIndexWarning):
    """A streaming problem that was handled: a skipped sample or shard, fewer shards than workers."""


class IndexNotFoundError(TarIndexError, FileNotFoundError):
    """No index exists where one was expected."""


class ShardNotFoundError(TarIndexError, FileNotFoundError):
    """A shard named by the user or by an index does not exist."""


class OptionError(TarIndexError, ValueError):
    """An argument's value is refused (a negative buffer size); the message names the argument and what it accepts."""


class OptionTypeError(OptionError, TypeError):
    """An argument is of a type the function does not take (``shuffle="100"``); the message names the
    argument, the types it accepts and the one given."""
class NotRegularFileError(TarIndexError, OSError):
    """A shard's path names something other than a regular file (a FIFO, a device, a socket): opening it
    could block for good, and it cannot be read at random."""


class OverwriteError(TarIndexError, FileExistsError):
    """A write refused because it would destroy something: an output that exists and is not a tarindex
    index (a shard named by mistake, any other file), an output that is one of the shards being indexed,
    or an index that holds shards the build was not given (``drop_unlisted=True`` allows that)."""


class DescriptorLimitError(TarIndexError, OSError):
    """The process ran out of file descriptors (``EMFILE``, ``ENFILE``) with no shard file of tarindex's left to
    close; the message names the limit and what to change (``ulimit -n``, ``max_open_files``)."""


class PatternError(TarIndexError, ValueError):
    """A shard pattern cannot be expanded: unbalanced or unexpanded braces, a missing ``${VAR}``, an empty name."""


class ExportError(_OfShard, ValueError):
    """An index cannot be written in another loader's format: a compressed shard (DALI and wids read plain tar
    files), a name DALI's index format cannot hold, a shard without samples; ``.path`` is the shard."""


class ListError(_OfShard, ValueError):
    """A list file cannot be used: a ``pack`` file list (text, CSV, JSON lines) or a wids shard list whose
    line or entry does not parse, names a missing field, or names a command; ``.path`` is the list, ``.what``
    says which line or entry and why."""


class PackError(_OfShard, ValueError):
    """``pack`` cannot use an input or an output: a file that cannot be read or changed while it was packed,
    two files that would be one member, an output that names an input; ``.path`` is the file."""


class SourceError(_AtOffset, OSError):
    """A shard's bytes could not be read: network failure after retries, a failing ``pipe:`` command."""

    _template = "{path}: {what} at byte offset {offset}"


class IndexFormatError(TarIndexError, ValueError):
    """A file is not a tarindex index, or has an unsupported format version."""


class RandomAccessError(_OfShard, ValueError):
    """A shard cannot be read at random cheaply (a zstd shard made of one large frame), or at all
    (a ``pipe:`` or ``-`` shard: a command's output is read once, from start to end)."""


class StaleIndexError(_OfShard):
    """A shard changed after it was indexed; ``.changed`` (``.what``) says what changed; ``.mtime_ns`` holds the
    indexed and the current modification time (nanoseconds) when a changed time is what the message names."""

    _template = "{path}: shard changed since it was indexed ({what}); rebuild the index"
    mtime_ns: tuple[int, int] | None = None  # the default holds for an error made from its message alone

    @property
    def changed(self) -> str:
        """What changed: ``"size 10240 -> 20480"``, ``"content fingerprint differs"``."""
        return self.what

    @classmethod
    def of_mtime(cls, path: str | os.PathLike[str], indexed_ns: int, current_ns: int, also: str = "") -> StaleIndexError:
        """The error for a modification time that changed (and ``also``, what else differs): the message shows
        both times as ISO 8601 local times (:func:`iso_time`), ``.mtime_ns`` keeps them in nanoseconds."""
        error = cls(path, f"mtime {iso_time(indexed_ns)} -> {iso_time(current_ns)}{also}")
        error.mtime_ns = (indexed_ns, current_ns)
        return error


class CommandNotAllowedError(TarIndexError, PermissionError):
    """An index names a shard that is a command (``pipe:CMD``) and the caller did not allow commands."""


class IndexChangedError(StaleIndexError):
    """The index file at a path is no longer the one first opened there (rebuilt, copied over, truncated or
    rewritten in place); ``.what`` says how."""

    _template = "{path}: the index file changed since it was opened ({what}); open it again"


class SampleNotFoundError(TarIndexError, KeyError):
    """A key or sample number is not in the index."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable
        return str(self.args[0]) if self.args else ""


class StateError(TarIndexError, ValueError):
    """A state dict (``load_state_dict``) is malformed or belongs to another dataset or configuration."""


class SamplerStateError(StateError):
    """A sampler state dict is malformed or belongs to another dataset or configuration."""


class WriteError(_OfShard, OSError):
    """A file (index, shard, cache entry) could not be written: full disk, read-only directory, I/O error.
    ``.path`` is the file, ``.what`` the cause."""

    _template = "{path}: cannot write ({what})"
