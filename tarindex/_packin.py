"""What ``pack`` reads: a directory tree or a list file (text, CSV, JSON lines) turned into samples.

A sample is ``(key, ((extension, data), ...))``: each member's bytes inline or the file that holds them
(:class:`tarindex._packout.FileMember`, with the size it has now). Files are grouped into samples by
webdataset's key rule (:func:`tarindex.grouping.sample_key`); every name a sample would get in a shard is
checked to read back as the same key and extension.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Any, Literal

from ._packout import Data, FileMember
from .errors import ListError, PackError, counted, shown
from .grouping import RESERVED, sample_key

__all__: list[str] = []  # internal module: its names serve the package, the public API is tarindex.__all__

Member = tuple[str, Data]
Sample = tuple[str, tuple[Member, ...]]
SourceKind = Literal["folder", "text", "csv", "jsonl", "shards"]

LIST_SUFFIXES: dict[str, SourceKind] = {".txt": "text", ".lst": "text", ".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl"}
"""List files by name: one path per line, CSV with a header row, JSON lines."""
TEXT_SUFFIX = ":text"
"""A CSV column or JSON field named ``EXT:text`` holds the member's text itself, not a path."""
LABEL_EXT = "cls"


def source_kind(source: str) -> SourceKind:
    """What a ``pack`` source is: a directory, a list file (by its suffix), or shards (anything else)."""
    if os.path.isdir(source):
        return "folder"
    return LIST_SUFFIXES.get(os.path.splitext(source)[1].lower(), "shards")


def samples_of(source: str, kind: SourceKind, first: int = 0) -> list[Sample]:
    """The samples of a folder or list source, in order (``first``: the number of the first row of a CSV or
    JSON lines list, whose rows without ``__key__`` are keyed by their number).

    Raises:
        PackError: a file cannot be read or listed; two files of a folder would be one member.
        ListError: a line of a list does not parse or names no member.
    """
    if kind == "folder":
        return folder_samples(source)
    if kind == "text":
        return text_list_samples(source)
    if kind == "csv":
        return table_list_samples(source, _csv_rows(source), first)
    return table_list_samples(source, _jsonl_rows(source), first)


# -- folders ----------------------------------------------------------------------------------


def folder_samples(root: str) -> list[Sample]:
    """Every file under ``root`` (names starting with a dot and symbolic links to directories left out) as
    samples: keys are paths relative to ``root`` up to the first dot of the file name, sorted; members in
    extension order.

    Raises:
        PackError: a directory cannot be listed, a file cannot be read, or two files would be one member
            (``a.JPG`` and ``a.jpg``).
    """
    found: list[tuple[str, str, str, int]] = []  # key, extension, path, size
    stack = [""]
    while stack:
        rel = stack.pop()
        directory = os.path.join(root, rel) if rel else root
        try:
            entries = os.scandir(directory)
        except OSError as exc:
            raise PackError(directory, f"cannot list ({exc.strerror})") from exc
        with entries:
            for entry in entries:
                if entry.name.startswith("."):
                    continue
                name = rel + entry.name
                try:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(name + "/")
                        continue
                    if not entry.is_file():  # a socket, a FIFO, a link to nothing
                        continue
                    split = sample_key(name)
                    if split is None:  # no extension: not part of a sample, as in a shard
                        continue
                    found.append((split[0], split[1], entry.path, entry.stat().st_size))
                except OSError as exc:
                    raise PackError(entry.path, f"cannot read ({exc.strerror})") from exc
    found.sort()
    out: list[Sample] = []
    i = 0
    while i < len(found):
        key = found[i][0]
        j = i
        while j < len(found) and found[j][0] == key:
            j += 1
        members: list[Member] = []
        for k in range(i, j):
            _, ext, path, size = found[k]
            if k > i and found[k - 1][1] == ext:
                raise PackError(path, f"would be the same member {shown(key + '.' + ext)} as {found[k - 1][2]} (extensions are lower-cased)")
            if ext in RESERVED:
                raise PackError(path, f"extension {ext!r} is a field every sample has; rename the file")
            members.append((ext, FileMember(path, size)))
        out.append((key, tuple(members)))
        i = j
    return out


def class_names(samples: Iterable[Sample]) -> list[str]:
    """The sorted top directories of the samples' keys: the classes of torchvision's ``ImageFolder``."""
    return sorted({key.split("/", 1)[0] for key, _ in samples if "/" in key})


def add_labels(samples: list[Sample], where: str, classes: list[str]) -> list[Sample]:
    """Each sample with a ``cls`` member: the number of its top directory in ``classes`` (:func:`class_names`).

    Raises:
        PackError: a sample is not in a directory (of ``where``), or has a ``cls`` member already.
    """
    number = {name: i for i, name in enumerate(classes)}
    out: list[Sample] = []
    for key, members in samples:
        if "/" not in key:
            raise PackError(os.path.join(where, key), "is not in a class directory (labels come from the top directory of each sample)")
        if any(ext == LABEL_EXT for ext, _ in members):
            raise PackError(os.path.join(where, key), f"has a {LABEL_EXT!r} member already; it cannot also get a label")
        out.append((key, (*members, (LABEL_EXT, str(number[key.split("/", 1)[0]]).encode()))))
    return out


# -- lists ------------------------------------------------------------------------------------


def _lines(path: str) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` of a list file read as utf-8.

    Raises:
        PackError: the list cannot be read.
    """
    try:
        with open(path, encoding="utf-8", newline="") as f:
            yield from enumerate(f, 1)
    except OSError as exc:
        raise PackError(path, f"cannot read ({exc.strerror})") from exc
    except UnicodeDecodeError as exc:
        raise ListError(path, f"not utf-8 text ({exc.reason} at byte {exc.start})") from exc


def _file(lst: str, line: int, name: str) -> FileMember:
    """The file a list names (relative to the list's directory), with its size now.

    Raises:
        PackError: it does not exist or cannot be read.
    """
    path = os.path.join(os.path.dirname(lst), name)
    try:
        st = os.stat(path)
    except OSError as exc:
        raise PackError(path, f"cannot read ({exc.strerror}; listed in {lst} line {line})") from exc
    if not os.path.isfile(path):
        raise PackError(path, f"is not a file (listed in {lst} line {line})")
    return FileMember(path, st.st_size)


def text_list_samples(lst: str) -> list[Sample]:
    """A list of paths, one a line (relative to the list's directory and inside it; blank lines and lines
    starting with ``#`` skipped), grouped into samples by key as a shard groups its members: consecutive
    paths with one key are one sample.

    Raises:
        ListError: a path leaves the list's directory or has no extension.
        PackError: a listed file cannot be read.
    """
    out: list[Sample] = []
    current: list[Member] = []
    key: str | None = None
    for n, text in _lines(lst):
        name = text.rstrip("\r\n")
        if not name.strip() or name.startswith("#"):
            continue
        norm = os.path.normpath(name)
        if os.path.isabs(norm) or norm.split(os.sep)[0] == os.pardir:
            raise ListError(lst, f"line {n}: {shown(name)} is outside the list's directory; a CSV or JSON lines list with __key__ can name it")
        split = sample_key(norm)
        if split is None:
            raise ListError(lst, f"line {n}: {shown(name)} has no extension, so it belongs to no sample")
        k, ext = split
        if k != key:
            if key is not None:
                out.append((key, tuple(current)))
            key, current = k, []
        elif any(e == ext for e, _ in current):
            raise ListError(lst, f"line {n}: {shown(name)} repeats extension {ext!r} of sample {shown(k)}")
        current.append((ext, _file(lst, n, norm)))
    if key is not None:
        out.append((key, tuple(current)))
    return out


Row = tuple[int, dict[str, Any]]
"""A line number and the fields of one sample (``__key__`` and one field per member)."""


def _csv_rows(lst: str) -> Iterator[Row]:
    """The rows of a CSV list with a header row, as ``{column: text}`` without empty cells.

    Raises:
        ListError: no header, or a row with more cells than the header.
    """
    reader = csv.reader(text for _, text in _lines(lst))
    header = next(reader, None)
    if not header:
        raise ListError(lst, "line 1: expected a header row naming the columns (__key__, then one column per extension)")
    for row in reader:
        n = reader.line_num
        if not any(cell.strip() for cell in row):
            continue
        if len(row) > len(header):
            raise ListError(lst, f"line {n}: {counted(len(row), 'cell')}, the header names {counted(len(header), 'column')}")
        yield n, {name: cell for name, cell in zip(header, row) if cell != ""}


def _jsonl_rows(lst: str) -> Iterator[Row]:
    """The objects of a JSON lines list.

    Raises:
        ListError: a line that is not a JSON object.
    """
    for n, text in _lines(lst):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except ValueError as exc:
            raise ListError(lst, f"line {n}: not JSON ({exc})") from exc
        if not isinstance(obj, dict):
            raise ListError(lst, f"line {n}: expected a JSON object, got {type(obj).__name__}")
        yield n, obj


def table_list_samples(lst: str, rows: Iterable[Row], first: int = 0) -> list[Sample]:
    """One sample per row of a CSV or JSON lines list: ``__key__`` (default: the row's number from ``first``, 9
    digits: the lists of one pack are numbered on from one to the next), and a
    field per member: ``EXT`` is the path of a file (relative to the list's directory), ``EXT:text`` the text
    itself; in JSON, a value that is not a string (number, object, list) is written as JSON, ``null`` is no member.

    Raises:
        ListError: a row with no member, a key or extension that would not read back as this sample.
        PackError: a listed file cannot be read.
    """
    out: list[Sample] = []
    for number, (n, fields) in enumerate(rows, first):
        key = fields.get("__key__", f"{number:09d}")
        if not isinstance(key, str) or not key:
            raise ListError(lst, f"line {n}: __key__ must be a non-empty string, got {key!r}")
        members: list[Member] = []
        for name, value in fields.items():
            if name == "__key__" or value is None:
                continue
            ext, text = (name[: -len(TEXT_SUFFIX)], True) if name.endswith(TEXT_SUFFIX) else (name, False)
            ext = ext.lower()
            if sample_key(f"{key}.{ext}") != (key, ext) or ext in RESERVED:
                raise ListError(lst, f"line {n}: key {shown(key)} and extension {ext!r} would not read back as one member of that sample")
            if any(e == ext for e, _ in members):
                raise ListError(lst, f"line {n}: extension {ext!r} given twice")
            data: Data
            if not isinstance(value, str):
                data = json.dumps(value).encode()
            elif text:
                data = value.encode("utf-8", "surrogateescape")
            else:
                data = _file(lst, n, value)
            members.append((ext, data))
        if not members:
            raise ListError(lst, f"line {n}: sample {shown(key)} has no member")
        out.append((key, tuple(members)))
    return out


# -- filters ----------------------------------------------------------------------------------


KeyFilter = Collection[str] | Callable[[str], bool] | None


def key_test(keys: KeyFilter) -> Callable[[str], bool] | None:
    """A test of keys: the callable itself, membership of a collection, or ``None`` (every key)."""
    if keys is None or callable(keys):
        return keys
    wanted = keys if isinstance(keys, (set, frozenset)) else frozenset(keys)
    return wanted.__contains__


def select(samples: Iterable[Sample], exts: Collection[str] | None, keys: Callable[[str], bool] | None) -> list[Sample]:
    """The samples whose key passes ``keys``, each with only the members of ``exts`` (those left with none dropped)."""
    out: list[Sample] = []
    for key, members in samples:
        if keys is not None and not keys(key):
            continue
        if exts is not None:
            members = tuple(m for m in members if m[0] in exts)
            if not members:
                continue
        out.append((key, members))
    return out
