"""Helpers shared by CLI commands."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import click

if TYPE_CHECKING:
    from pathlib import Path

    from ..index.reader import IndexReader
    from ..view import View


def index_of(spec: str) -> Path:
    """The index file ``spec`` names, or the index beside the shards ``spec`` names that holds them all
    (:func:`tarindex.view.find_index`); an index file given is not opened here (``info`` imports no numpy)."""
    from ..shards import given_index

    given = given_index(spec)
    if given is not None:
        return given
    from ..view import find_index

    return find_index(spec)[0]


def open_index(spec: str) -> tuple[IndexReader, View | None]:
    """The index ``spec`` names (a file, or the shards it sits beside) and the view of it the shards make
    (``None``: every sample), imported on use: ``--help`` stays light."""
    from ..index.reader import IndexReader
    from ..view import find_index

    path, view = find_index(spec)
    return IndexReader(path), view if view is not None and not view.whole else None


def shown_path(path: str | os.PathLike[str]) -> str:
    """A path as every command's summary shows it: relative to the working directory when it lies inside
    it (``d/train.tarindex``), else absolute; URLs as they are."""
    from ..naming import ShardRef

    text = os.fspath(path)
    if ShardRef.of(text).url:
        return text
    absolute = os.path.abspath(text)
    relative = os.path.relpath(absolute)
    return absolute if relative == os.pardir or relative.startswith(os.pardir + os.sep) else relative


def check_parent(path: str | os.PathLike[str], parents: bool) -> None:
    """Refuse an output whose directory does not exist (a mistyped ``-o out/x``) unless ``parents`` (``-p``):
    the writer then makes it.

    Raises:
        click.UsageError: the directory is missing (exit 2), naming it and ``-p``.
    """
    if parents:
        return
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        shown = os.path.dirname(os.fspath(path)) or directory
        what = "is not a directory" if os.path.exists(directory) else "does not exist"
        raise click.UsageError(f"{os.fspath(path)}: directory {shown!r} {what}; create it, or pass -p (--parents) to have it made")


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


_SIZE = re.compile(r"([0-9]+)\s*([KMGTP]?)(?:I?B)?", re.IGNORECASE)
_UNITS = {"": 0, "K": 10, "M": 20, "G": 30, "T": 40, "P": 50}


def parse_size(text: str) -> int:
    """Bytes from ``1048576``, ``64M``, ``64MiB``, ``2G``, ``2GB`` (units are powers of 1024, as ``ls -h`` shows them).

    Raises:
        ValueError: not a whole number with an optional unit.
    """
    m = _SIZE.fullmatch(text.strip())
    if m is None:
        raise ValueError(f"{text!r} is not a size: expected a number of bytes with an optional unit K, M, G, T (powers of 1024), e.g. 64M")
    return int(m.group(1)) << _UNITS[m.group(2).upper()]


_T = TypeVar("_T")


def parsed(value: str | None, parse: Callable[[str], _T]) -> _T | None:
    """An option's ``value`` through ``parse`` (``None``, an option not given, stays ``None``).

    Raises:
        click.BadParameter: ``parse`` refused it (its ``ValueError`` is the message).
    """
    if value is None:
        return None
    try:
        return parse(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def size_option(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    """The click callback of a ``SIZE`` option: bytes (:func:`parse_size`)."""
    return parsed(value, parse_size)
