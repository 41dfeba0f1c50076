"""Shard names are data: the name an index entry is opened by (checked against its recorded kind), and the
command policy (an index's ``pipe:`` shards run only when the caller allowed commands)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import overload

from .errors import CommandNotAllowedError, IndexFormatError
from .shards import as_path, shard_kind
from .tables import ShardInfo

__all__: list[str] = []  # internal module: its names serve the package, the public API is tarindex.__all__


def shard_name(index_path: str | os.PathLike[str], info: ShardInfo) -> str:
    """The name a shard of an index is opened by, checked against its recorded kind.

    A ``file`` is a path relative to the index's directory and stays inside it
    (no ``..``, not absolute) unless the index recorded it as built outside;
    whatever it looks like, the result reads as a path (``./pipe:x`` for a file
    named ``pipe:x``). A ``url`` or ``command`` is returned as recorded (a
    command runs only where :func:`check_commands` allowed it).

    Raises:
        IndexFormatError: the entry's kind is unknown or does not match its path, or a file's path
            leaves the index's directory and the index does not say it was built so.
    """
    path, kind = info.path, info.kind
    if not isinstance(path, str) or not path or "\0" in path:
        raise IndexFormatError(f"{index_path}: a shard entry has no usable path ({path!r}); rebuild the index")
    if kind == "file":
        norm = os.path.normpath(path)
        leaves = os.path.isabs(norm) or norm.split(os.sep)[0] == os.pardir
        if leaves and not info.outside:
            raise IndexFormatError(
                f"{index_path}: shard path {path!r} leaves the index's directory, and the index was not built so; "
                f"rebuild the index"
            )
        return as_path(os.path.join(os.path.dirname(os.fspath(index_path)), path))
    if kind in ("url", "command") and shard_kind(path) == kind:
        return path
    raise IndexFormatError(
        f"{index_path}: shard {path!r} is recorded as kind {kind!r}, which its name is not; rebuild the index"
    )


class ShardNames(Sequence[str]):
    """Each shard's name (:func:`shard_name`), resolved from its index record the first time it is asked for.

    Opening an index reads no shard record: a name costs its record's block (``SHARD_BLOCK`` records)
    once, when a sample of that shard is first read. :attr:`names` is the list the C reader reads
    (``None`` until resolved; its length never changes).

    Args:
        index_path: the index the records belong to (relative names are resolved against its directory).
        records: the shard records (an :class:`tarindex.index.reader.ShardList`, read by block).
    """

    def __init__(self, index_path: str | os.PathLike[str], records: Sequence[ShardInfo]) -> None:
        self.index_path = index_path
        self.records = records
        self.names: list[str | None] = [None] * len(records)

    def __len__(self) -> int:
        return len(self.names)

    @overload
    def __getitem__(self, s: int) -> str: ...
    @overload
    def __getitem__(self, s: slice) -> list[str]: ...
    def __getitem__(self, s: int | slice) -> str | list[str]:
        """Raises:
        IndexFormatError: the shard's record is damaged or its name does not match its kind.
        """
        if isinstance(s, slice):
            return [self[k] for k in range(*s.indices(len(self.names)))]
        name = self.names[s]
        if name is None:
            name = self.names[s] = shard_name(self.index_path, self.records[s])
        return name

    def __iter__(self) -> Iterator[str]:
        for s in range(len(self.names)):
            yield self[s]

    def __eq__(self, other: object) -> bool:
        return list(self) == list(other) if isinstance(other, Sequence) else NotImplemented

    __hash__ = None  # type: ignore[assignment]  # a sequence compared by value

    def __repr__(self) -> str:
        return f"ShardNames({str(self.index_path)!r}, {len(self.names)} shards)"


def check_commands(index_path: str | os.PathLike[str], infos: Sequence[ShardInfo], allow_commands: bool) -> None:
    """Refuse an index whose shards are commands unless the caller allowed commands (as with pickle).

    Raises:
        CommandNotAllowedError: a shard is a command and ``allow_commands`` is false.
    """
    if allow_commands:
        return
    for info in infos:
        if info.kind == "command":
            raise CommandNotAllowedError(
                f"{index_path}: shard {info.path!r} is a command; an index runs commands only when allowed "
                f"(allow_commands=True, --allow-commands), and only for an index you trust"
            )
