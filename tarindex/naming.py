"""Shard names are data: what a name means (:class:`ShardRef`, made once per name: its kind, scheme and path),
the name an index entry is opened by (checked against its recorded kind), and the command policy (an index's
``pipe:`` shards run only when the caller allowed commands).

A scheme (``pipe:``, ``-``, ``scheme://``) means something only in a name the caller wrote. A name that came
from a glob, a directory listing or an index is a path; :func:`as_path` makes sure it reads as one
(``pipe:rm -rf x.tar`` matched by ``*.tar`` becomes ``./pipe:rm -rf x.tar``). This module is the one place
that reads a name's look; every other module asks its :class:`ShardRef`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, overload

from .errors import CommandNotAllowedError, IndexFormatError

if TYPE_CHECKING:
    from .tables import ShardInfo

__all__: list[str] = []  # internal module: its names serve the package, the public API is tarindex.__all__

ShardKind = Literal["file", "url", "command"]
"""How an index records a shard: a local ``file``, a ``url`` (``scheme://``), or a ``command`` (``pipe:CMD``, ``-``)."""

RefKind = Literal["file", "stdin", "pipe", "http", "object", "hub", "file-url", "fsspec"]
"""What a name the caller wrote names: a local ``file``; ``stdin`` (``-``); a ``pipe`` (``pipe:CMD``); an ``http``
(``http://``, ``https://``) URL; an ``object`` in a store read through obstore (``s3://``, ``gs://``, ``az://``
and their aliases); a ``hub`` file (``hf://``); a ``file-url`` (``file://PATH``); any other ``scheme://``
(``fsspec``)."""

ObjectStore = Literal["s3", "gs", "az"]
"""The object stores read through obstore, each named by its main scheme."""

_OBJECT_SCHEMES: dict[str, ObjectStore] = {
    "s3": "s3", "s3a": "s3", "gs": "gs", "gcs": "gs", "az": "az", "azure": "az", "abfs": "az", "abfss": "az",
}
_KINDS: dict[str, RefKind] = {"http": "http", "https": "http", "hf": "hub", "file": "file-url"}
_STORED: dict[RefKind, ShardKind] = {"file": "file", "stdin": "command", "pipe": "command"}
_PIPE = "pipe:"
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")  # RFC 3986


@dataclass(frozen=True, slots=True)
class ShardRef:
    """A shard name and what it means, read once (:meth:`of`); modules ask it, never the string."""

    name: str
    """The name as written (every message names it so)."""
    kind: RefKind
    """What the name names (:data:`RefKind`)."""
    scheme: str
    """A URL's scheme in lower case (``s3``, ``https``); ``""`` for a path, ``-`` and ``pipe:``."""
    path: str
    """The name without its scheme: a local path, the command of ``pipe:``, what follows ``scheme://``."""

    @classmethod
    def of(cls, name: str) -> ShardRef:
        """What ``name`` means as the caller wrote it (a listed name: :func:`as_path` first)."""
        if name == "-":
            return cls(name, "stdin", "", name)
        if name.startswith(_PIPE):
            return cls(name, "pipe", "", name[len(_PIPE) :])
        scheme, sep, rest = name.partition("://")
        if not sep or not _SCHEME.fullmatch(scheme):  # ./s3://x is a path: a scheme is a letter, then [a-z0-9+.-]
            return cls(name, "file", "", name)
        scheme = scheme.lower()
        kind: RefKind = "object" if scheme in _OBJECT_SCHEMES else _KINDS.get(scheme, "fsspec")
        return cls(name, kind, scheme, rest)

    @property
    def stored(self) -> ShardKind:
        """How an index records the shard: ``file``, ``url`` or ``command``."""
        return _STORED.get(self.kind, "url")

    @property
    def local(self) -> bool:
        """Whether the name is a local path (not ``-``, ``pipe:``, or a URL; a ``file://`` URL is a URL)."""
        return self.kind == "file"

    @property
    def url(self) -> bool:
        """Whether the name is a URL (``scheme://``)."""
        return self.stored == "url"

    @property
    def prefix(self) -> str:
        """What precedes :attr:`path` in the name: ``s3://``, ``pipe:``; ``""`` for a path."""
        return self.name[: len(self.name) - len(self.path)]

    @property
    def ranged(self) -> bool:
        """Whether the shard is read at random without an index: an HTTP(S) server answering ``Range``."""
        return self.kind == "http"

    @property
    def listable(self) -> bool:
        """Whether a glob in this URL lists its store (``file://``, object stores, the Hub, fsspec); an HTTP(S)
        server is not listed (and ``?`` starts a query there, not a glob)."""
        return self.url and self.kind != "http"

    @property
    def secure(self) -> bool:
        """Whether the URL is ``https://``: TLS, and credentials that must not follow a move to ``http://``."""
        return self.scheme == "https"

    @property
    def cleartext(self) -> bool:
        """Whether the URL is ``http://``: no TLS."""
        return self.scheme == "http"

    @property
    def store(self) -> ObjectStore | None:
        """The object store of an ``object`` URL (``s3a://`` -> ``s3``), else ``None``."""
        return _OBJECT_SCHEMES.get(self.scheme)


def as_path(name: str) -> str:
    """A name from a listing (glob, directory, index) as a path that cannot read as a URL or command."""
    return name if ShardRef.of(name).local else os.path.join(os.curdir, name)


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
    if kind in ("url", "command") and ShardRef.of(path).stored == kind:
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
