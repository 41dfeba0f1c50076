"""A sample's bytes against its index record: the check every read makes before it hands out a member.

A sample's byte range starts at its first member's first header, so each member's tar headers (its own
512-byte header and any PAX ``x`` / GNU ``L``/``K`` extension headers before it) lie inside the bytes
a read fetches anyway. :func:`check_sample` makes sure they still say what the index says: a valid
header checksum, a regular file, the member's name (the sample's key and the member's extension, by
webdataset's rules: :func:`tarindex.grouping.split_key`) and its size, for every member. A shard rewritten
in place whose members moved, were renamed or resized (two samples of one size trading places) or a record
edited with its checksum recomputed is then a :class:`~tarindex.errors.StaleIndexError`, never another sample's
bytes. The member data is not checked: bytes changed in place under headers that still say the same name,
type and size (a caption rewritten to the same length) are read as they are now.

Three steps. :func:`_plain_agrees` accepts the common shape with one read of a member's header fields and no
call per field (each member's own header right before its data, alone or after one PAX header with one block of
records that cannot rename or resize it (:func:`_inert`: webdataset's ``TarWriter``, GNU tar ``--format=posix``);
the name ``key.ext``, the size and checksum fields as the common writers spell them; an ASCII header's checksum
against one adler32 sum, save a PAX header byte for byte the same as one found valid before). :func:`_agrees`
accepts the other common shapes (PAX and GNU long-name headers, other spellings, non-ASCII headers, a directory
between members). The C reader (``_speedups.c``, ``headers_agree``) makes the same check, a plain header field by field and any
other shape with the C header step (``tar_step``). Whatever none of them accepts goes to :func:`_judge`, the
reference: the range is walked by the build's own walker and grouped by its own rules
(:func:`tarindex.tar.iter_tar`, :func:`tarindex.grouping.group_members`), and must give exactly this record, or
the error names the shard, the offset and the first difference, expected vs got. One place words every error, for both lanes.
"""

from __future__ import annotations

import re
import struct
import tarfile
import zlib
from collections.abc import Callable, Mapping, Sequence
from itertools import zip_longest
from typing import Any

from .errors import CorruptArchiveError, StaleIndexError, shown
from .grouping import group_members, sample_key
from .tar import BLOCK, _is_regular, _member_name, _number, _octal, _padded, _parse_pax, iter_tar

__all__: list[str] = []  # internal module: its names serve the package

_END = bytes(2 * BLOCK)  # what ends the walk of one sample's range: an end-of-archive marker
_PAX, _LONGNAME = ord("x"), ord("L")
_adler32 = zlib.adler32
_FIELDS = struct.Struct("124x12s20xB188xB")  # a header's size field, type and the first byte of its ustar prefix
_Fields = Callable[[bytes, int], tuple[Any, ...]]  # a Struct's unpack_from
_HEADERS: dict[int, tuple[_Fields, _Fields, dict[str, bytes]]] = {}  # _layouts, by key length
_NO_REST = b"/" * 100  # _rest of an extension a name field does not show by itself: longer than any rest
_PAX_SEEN: dict[bytes, bytes] = {}  # PAX headers _plain_agrees found valid, by checksum field (emptied past 256)
_CHECKSUMS: dict[bytes, int] = {}  # _expected
_SIZE_FIELDS: dict[int, bytes] = {}  # _size_field
_SIZES = {b"%011o\x00" % n: n for n in range(BLOCK)}  # PAX sizes in the common spelling: records of one block
_TOUCHY = re.compile(rb"path=|size=|GNU\.sparse")  # what a PAX record that renames or resizes holds (_inert)
_REGULAR = frozenset(b"0\x007")  # a regular file's types (NUL: unless its name ends in "/")
_EXTENSIONS = frozenset(b"xLK")  # the extension headers a member may have before its own (a global PAX one: _judge)


def _summed(buf: bytes, at: int) -> bool:
    """Whether the header at ``at`` holds its checksum (as the common writers spell it, or any octal): the sum
    of its bytes, the checksum field counted as spaces. Each half's byte sum is at most 256 x 255 < 65521, so
    adler32's low half (1 + the byte sum, mod 65521) gives it exactly, at C speed."""
    field = buf[at + 148 : at + 156]
    s = (_adler32(buf[at : at + 256]) & 0xFFFF) + (_adler32(buf[at + 256 : at + 512]) & 0xFFFF) - 2 - sum(field) + 8 * 32
    return field == b"%06o\x00 " % s or _octal(field) == s


def _plain_agrees(buf: bytes, key: bytes, members: Sequence[tuple[int, int, int]], exts: Sequence[str]) -> bool:
    """Whether every member's headers are the common shape and say what the record says, with one read of each
    member's header fields (:func:`_layouts`) and no call per field: the member's own header right before its data,
    alone or after one PAX header of one block of records that cannot rename or resize it (:func:`_inert`); a
    regular file named exactly ``key.ext`` (no ustar prefix); the size and checksum fields spelled as GNU tar,
    tarfile and webdataset spell them; each header's checksum its byte sum. An ASCII header's byte sum is at most
    512 x 127 < 65521, so adler32's low half (1 + the sum) gives it exactly in one call, compared with what the
    checksum field asks for (:func:`_expected`, kept per field). A PAX header byte for byte the same as one found
    valid before (webdataset's: the same for every member with records of one length) is not summed again
    (``_PAX_SEEN``), and its records go to the search only when they hold a ``p`` or an ``s`` (every name it looks
    for holds one). ``False`` is not a verdict: :func:`_agrees` looks again (other spellings, non-ASCII headers,
    ...)."""
    klen = len(key)
    base = key[key.rfind(b"/") + 1 :]
    if not members or klen > 98 or not base or 46 in base or key[:2] == b"__":  # 46: "."; the key the common split makes: _plain
        return False
    own_fields, gap_fields, rests = _HEADERS.get(klen) or _layouts(klen)
    prefix = key + b"."
    at = 0  # where the member's headers start: after the previous member's data, rounded up to a block
    for e, mo, ms in members:
        own = mo - 512  # block sizes as literals here: constants when compiled, not a global's lookup and arithmetic
        if at == own:
            dotted, rest, size_field, chk, typ, ustar_prefix = own_fields(buf, own)
        elif own - at == 1024:  # one PAX header, then one block of its records
            pax_size, pax_chk, pax_typ, records, dotted, rest, size_field, chk, typ, ustar_prefix = gap_fields(buf, at)
            seen = _PAX_SEEN.get(pax_chk)
            if seen is None or not buf.startswith(seen, at):
                header = buf[at : at + 512]
                if (
                    pax_typ != _PAX or not _SIZES.get(pax_size) or not header.isascii()
                    or (_adler32(header) & 0xFFFF) != (_CHECKSUMS.get(pax_chk) or _expected(pax_chk))
                ):  # fmt: skip
                    return False
                if len(_PAX_SEEN) >= 256:
                    _PAX_SEEN.clear()
                _PAX_SEEN[pax_chk] = header
            if (112 in records or 115 in records) and _TOUCHY.search(buf, at + 512, at + 512 + _SIZES[pax_size]):  # "p", "s"
                return False
        else:
            return False
        header = buf[own:mo]
        if (
            dotted != prefix or rest != (rests.get(exts[e]) or _rest(rests, exts[e], klen)) or size_field != (_SIZE_FIELDS.get(ms) or _size_field(ms))
            or typ not in _REGULAR or ustar_prefix or not header.isascii() or (_adler32(header) & 0xFFFF) != (_CHECKSUMS.get(chk) or _expected(chk))
        ):  # fmt: skip
            return False
        at = (mo + ms + 511) & -512
    return True


def _layouts(klen: int) -> tuple[_Fields, _Fields, dict[str, bytes]]:
    """The reads of a member's header fields for a key of ``klen`` bytes (at most 98), kept in ``_HEADERS``: its
    own header alone (the key and its dot, the rest of the name field, the size and checksum fields, the type,
    the first byte of the ustar prefix), and one PAX header, its block of records and its own header (the PAX
    header's size and checksum fields and type, the records, then the same); with the rests of the name field
    that :func:`_rest` gave, by extension."""
    own = f"{klen + 1}s{99 - klen}s24x12s12x8sB188xB"
    got = _HEADERS[klen] = (struct.Struct(own).unpack_from, struct.Struct("124x12s12x8sB355x512s" + own).unpack_from, {})
    return got


def _rest(rests: dict[str, bytes], ext: str, klen: int) -> bytes:
    """The rest of a name field ``key.ext`` after the key's dot, for a key of ``klen`` bytes: the extension (utf-8,
    surrogateescape) and NULs up to the field's 100 bytes; ``_NO_REST`` when the name does not fit or does not
    show the member by itself (a ``/`` or a leading ``__``: :func:`_named` compares). Kept in ``rests`` (the
    extensions of the indexes read: a few; emptied past 4,096)."""
    if len(rests) >= 4096:
        rests.clear()
    tail = ext.encode("utf-8", "surrogateescape")
    got = rests[ext] = _NO_REST if ext[:2] == "__" or "/" in ext or len(tail) > 99 - klen else tail.ljust(99 - klen, b"\x00")
    return got


def _size_field(size: int) -> bytes:
    """A size field as the common writers spell it (11 octal digits and a NUL), kept in ``_SIZE_FIELDS`` (emptied
    past 65,536)."""
    if len(_SIZE_FIELDS) >= 65536:
        _SIZE_FIELDS.clear()
    got = _SIZE_FIELDS[size] = b"%011o\x00" % size
    return got


def _expected(field: bytes) -> int:
    """What adler32's low half of an ASCII header holding checksum ``field`` must be: 1 + the checksum - the 8 spaces the
    field counts as + the field's own bytes; -1 (never a low half) for a field not spelled ``"%06o\\0 "``. Kept in
    ``_CHECKSUMS`` (a few thousand values in practice; emptied past 65,536)."""
    if len(_CHECKSUMS) >= 65536:
        _CHECKSUMS.clear()
    digits = field[:6]
    common = field[6:] == b"\x00 " and digits.isdigit() and b"8" not in digits and b"9" not in digits
    got = _CHECKSUMS[field] = int(digits, 8) + 1 - 8 * 32 + sum(field) if common else -1
    return got


def _agrees(buf: Any, key: str, members: Sequence[tuple[int, int, int]], exts: Sequence[str]) -> bool:
    """Whether every member's headers say what the record says, in the shapes this step knows (those
    :func:`_plain_agrees` leaves): each member's headers (PAX ``x``, GNU ``L``/``K``, then its own) end where its
    data starts, every checksum valid. ``False`` is not a verdict: :func:`_judge` decides (a global PAX header, a sparse or
    base-256 member, a directory between two members, a mismatch)."""
    if not members:
        return False
    if type(buf) is not bytes:
        buf = bytes(buf)
    plain = _plain(key)
    prefix = key.encode("utf-8", "surrogateescape") + b"."
    pos = 0
    for e, mo, ms in members:
        ext = exts[e]
        at = (pos + BLOCK - 1) & ~(BLOCK - 1)
        path: str | None = None
        size: int | None = None
        while at + BLOCK < mo:  # extension headers before the member's own: the first that sets a field wins
            field, typ, _ = _FIELDS.unpack_from(buf, at)
            n = _size_of(field)
            if typ not in _EXTENSIONS or n is None or not _summed(buf, at):
                return False
            start = at + BLOCK
            if typ == _PAX and _inert(buf, start, start + n):  # nothing in it renames or resizes the member
                at = start + _padded(n)
                continue
            data = buf[start : start + n]
            if typ == _PAX:
                try:
                    records = _parse_pax(data, "", at)
                except CorruptArchiveError:
                    return False
                if any(k.startswith("GNU.sparse.") for k in records):
                    return False
                if path is None:
                    path = records.get("path")
                if size is None and "size" in records:
                    size = int(records["size"])  # decimal digits: checked by _parse_pax
            elif typ == _LONGNAME and path is None:
                path = data.split(b"\x00", 1)[0].decode("utf-8", "surrogateescape")
            at += BLOCK + _padded(n)
        field, typ, ustar_prefix = _FIELDS.unpack_from(buf, at) if at + BLOCK == mo else (b"", -1, 0)
        if typ not in _REGULAR or not _summed(buf, at):
            return False
        if size is None:
            size = ms if field == b"%011o\x00" % ms else _size_of(field)
        if size != ms:
            return False
        if path is None:  # its name field, as most writers spell it: key.ext, no ustar prefix
            raw = prefix + ext.encode("utf-8", "surrogateescape")
            n = len(raw)
            if plain and not ustar_prefix and buf.startswith(raw, at) and (n >= 100 or not buf[at + n]) and ext[:2] != "__" and "/" not in ext:
                pos = mo + ms
                continue
        header = buf[at:mo]
        if not _is_regular(header, typ) or not _named(_member_name(header) if path is None else path, f"{key}.{ext}", key, ext):
            return False
        pos = mo + ms
    return True


def _inert(buf: bytes, start: int, end: int) -> bool:
    """Whether the PAX records in ``buf[start:end]`` hold none that the walker applies to a member's name or size
    (``path``, ``size``, ``GNU.sparse.*``; :func:`tarindex.tar._walk`): then they need no parsing here (webdataset's
    ``TarWriter`` and GNU tar ``--format=posix`` write only times there). A record that sets one of them holds its
    key and ``=`` side by side, so one search of the bytes finds it; anything found goes to the parser."""
    return _TOUCHY.search(buf, start, end) is None


def _size_of(field: bytes) -> int | None:
    """A size field's value: the common spelling (11 octal digits and a NUL) read by ``int``, any other as tar
    reads it (:func:`tarindex.tar._number`: octal, base-256; ``None`` if malformed)."""
    if field[11:] == b"\x00" and field[:11].isdigit():
        try:
            return int(field[:11], 8)
        except ValueError:  # an 8 or a 9
            pass
    return _number(field)


def _plain(key: str) -> bool:
    """Whether ``key`` is one the common split makes: no leading ``__``, a base name (after the last ``/``)
    that is not empty and has no dot. ``key.ext`` then splits into this key and ``ext`` (no ``/``, no leading ``__``)."""
    base = key[key.rfind("/") + 1 :]
    return bool(base) and "." not in base and key[:2] != "__"


def _named(got: str, name: str, key: str, ext: str) -> bool:
    """Whether a member named ``got`` has this key and extension by the build's rules
    (:func:`tarindex.grouping.sample_key`); ``name`` is ``f"{key}.{ext}"``. The common case is a compare
    (:func:`_plain`)."""
    if got == name and ext[:2] != "__" and "/" not in ext and _plain(key):
        return True
    return sample_key(got) == (key, ext)


def check_sample(
    buf: Any,
    path: str,
    offset: int,
    key: bytes,
    members: Sequence[tuple[int, int, int]],
    exts: Sequence[str],
    globals_: Mapping[str, str] | None = None,
) -> None:
    """Check a sample's bytes (its whole range, read from ``offset`` of shard ``path``) against its record.

    Args:
        buf: the bytes of the sample's range (``len(buf)`` is the record's size).
        path: the shard, as errors name it.
        offset: where the range starts in the shard (the tar stream, for a compressed shard).
        key: the record's key, utf-8 (surrogateescape).
        members: the record's ``(extension number, data offset in the range, size)`` per member.
        exts: the index's extensions, by number.
        globals_: the global PAX records in effect at ``offset`` (from a global header before the range,
            :func:`tarindex.tar.global_records`): they rename or resize the members as the build read them.

    Raises:
        StaleIndexError: the headers in the range do not say what the record says (names the shard,
            the byte offset and the first difference).
    """
    if not globals_ and _plain_agrees(buf if type(buf) is bytes else bytes(buf), key, members, exts):
        return
    text = key.decode("utf-8", "surrogateescape")
    if globals_ or not _agrees(buf, text, members, exts):
        _judge(buf, path, offset, text, members, exts, tarfile.TarInfo.create_pax_global_header(dict(globals_)) if globals_ else b"")


def _judge(
    buf: Any, path: str, offset: int, key: str, members: Sequence[tuple[int, int, int]], exts: Sequence[str], prefix: bytes = b""
) -> None:
    """The reference: the range walked and grouped as the build walks and groups a shard must give the record
    (after ``prefix``: a global PAX header holding the global records in effect at the range).

    Raises:
        StaleIndexError: it does not (names the first difference).
    """
    where = f"sample {shown(key)} at offset {offset}"
    try:
        found = [
            s if not prefix else s._replace(offset=s.offset - len(prefix), members=tuple((e, o - len(prefix), z) for e, o, z in s.members))
            for s in group_members(iter_tar((prefix, buf, _END), path), path)
        ]
    except CorruptArchiveError as exc:
        at = offset + max(exc.offset - len(prefix), 0)
        raise StaleIndexError(path, f"{where}: {exc.what} at offset {at}") from exc
    wanted = [(exts[e], mo, ms) for e, mo, ms in members]
    what = None
    if not found:
        what = f"no member of a sample in its {len(buf)} bytes"
    elif found[0].offset != 0:
        what = f"its first header is at offset {offset + found[0].offset}"
    elif found[0].key != key:
        shard_key, index_key = shown_pair(found[0].key, key)
        what = f"the shard has key {shard_key} there, the index {index_key}"
    else:
        for k, (got, asked) in enumerate(zip_longest(found[0].members, wanted)):
            if got != asked:
                what = f"member {k + 1}: the shard has {_member(key, offset, got)}, the index {_member(key, offset, asked)}"
                break
        else:
            if len(found) > 1:
                what = f"sample {shown(found[1].key)} at offset {offset + found[1].offset} inside its {len(buf)} bytes"
            elif found[0].size != len(buf):
                what = f"its members take {found[0].size} bytes, the index says {len(buf)}"
    if what is not None:
        raise StaleIndexError(path, f"{where}: {what}")


def shown_pair(a: str, b: str) -> tuple[str, str]:
    """Two names an error says differ, each as :func:`~tarindex.errors.shown` gives it, or from a little before
    their first difference when cutting a long name would hide it (keys that share a long directory)."""
    got, want = shown(a), shown(b)
    if got != want or a == b:
        return got, want
    same = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    start = max(0, same - 20)
    return "..." + shown(a[start:]), "..." + shown(b[start:])


def _member(key: str, offset: int, member: tuple[str, int, int] | None) -> str:
    """A member as an error names it: name, size and where its data starts in the shard."""
    if member is None:
        return "no member"
    ext, at, size = member
    return f"{shown(f'{key}.{ext}')} of {size} bytes at offset {offset + at}"
