"""Tar headers for the shards ``tarindex pack`` writes: the bytes Python's ``tarfile`` writes in PAX format for a
regular file with fixed metadata (mtime 0, mode 0644, uid and gid 0, no user or group name), so that the same
samples always make the same shard, byte for byte.

A name of at most 100 ASCII characters and a size under 8 GiB take one 512-byte header, made here from a
template (the name and size fields filled in, the checksum summed); any other member (a longer or non-ASCII
name, a larger size) gets ``tarfile``'s own PAX extended header before it.
"""

from __future__ import annotations

import tarfile

__all__: list[str] = []  # internal module: its names serve the package, the public API is tarindex.__all__

BLOCK = 512
END_OF_ARCHIVE = bytes(2 * BLOCK)
"""The two zero blocks that end a tar archive."""
MODE = 0o644

_NAME = 100  # bytes of the ustar name field
_SIZE_AT, _SIZE_LEN = 124, 12
_SUM_AT = 148
_MAX_PLAIN = 8**11  # sizes from here on need a PAX record (11 octal digits)


def _info(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = 0
    info.mode = MODE
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _template() -> tuple[bytes, int]:
    """An ustar header with an empty name and size 0 (checksum field as blanks), and the sum of its other bytes."""
    head = bytearray(_info("", 0).tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape"))
    head[_SIZE_AT : _SIZE_AT + _SIZE_LEN] = bytes(_SIZE_LEN)
    head[_SUM_AT : _SUM_AT + 8] = b" " * 8
    return bytes(head), sum(head)


_TEMPLATE, _TEMPLATE_SUM = _template()


def member_header(name: str, size: int) -> bytes:
    """The header block(s) of a regular member ``name`` of ``size`` bytes, as ``tarfile`` writes them in PAX format
    with the fixed metadata of this module."""
    if size < _MAX_PLAIN and len(name) <= _NAME and name.isascii():
        head = bytearray(_TEMPLATE)
        raw = name.encode("ascii")
        field = b"%011o\0" % size
        head[: len(raw)] = raw
        head[_SIZE_AT : _SIZE_AT + _SIZE_LEN] = field
        head[_SUM_AT : _SUM_AT + 7] = b"%06o\0" % (_TEMPLATE_SUM + sum(raw) + sum(field))
        return bytes(head)
    return _info(name, size).tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def header_size(name: str, size: int) -> int:
    """``len(member_header(name, size))``, without making the header in the common case."""
    if size < _MAX_PLAIN and len(name) <= _NAME and name.isascii():
        return BLOCK
    return len(member_header(name, size))


def padding(size: int) -> int:
    """Zero bytes after ``size`` bytes of member data, to the next block."""
    return -size % BLOCK
