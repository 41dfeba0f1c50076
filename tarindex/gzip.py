"""gzip shards (``.tar.gz``, ``.tgz``, gzip by content): streaming decompression with checks.

A gzip file is one or more members (``pigz`` writes one, ``bgzip`` and ``cat a.gz b.gz`` many),
each a header, a deflate stream and a trailer with the CRC-32 and length of its data. zlib
(``wbits=31``) parses the header, inflates and verifies the trailer of each member; this module
chains the members, bounds the output (:class:`tarindex.compression.Budget`: expansion ratio,
padding after the end of the archive) and names damage by the compressed offset.

Random reads through seek points, recorded while ``build`` decompresses, are in
:mod:`tarindex.gzip_random`; an index without them (made before they existed) is refused with the
conversion command (``tarindex compress``, which accepts gzip input).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator
from typing import Any

from .compression import ArchiveEnd, Budget
from .errors import CorruptDeflateError, RandomAccessError

__all__: list[str] = []  # internal: read through TarDataset, TarStream and build

GZIP_MAGIC = b"\x1f\x8b\x08"
"""The first bytes of a gzip member (deflate)."""
_OUT_PIECE = 1 << 20  # decompressed bytes per step



def random_access_refused(path: str) -> RandomAccessError:
    """The error a read of a sample from an indexed gzip shard raises, with the conversion command."""
    return RandomAccessError(
        path,
        f"the index holds no gzip seek points for this shard (indexed before they existed); rebuild the index, "
        f"stream it (TarStream), or rewrite it as a zstd shard with sample-aligned frames "
        f"('tarindex compress {path} OUT.tar.zst') and index that",
    )


class _Members:
    """The state of one pass over a multi-member gzip stream."""

    def __init__(self, path: str, end: ArchiveEnd | None) -> None:
        self.path = path
        self.budget = Budget(path, end)
        self.dobj = zlib.decompressobj(31)
        self.pos = 0  # compressed bytes consumed
        self.member = 0  # compressed offset of the current member
        self.in_member = False
        self.trailing_zeros = False
        self.stopped = False  # the padding after the end of the archive is decompressed: inflate no more

    def feed(self, data: bytes) -> Iterator[bytes]:
        """Decompress ``data`` (consecutive compressed bytes), member after member."""
        while data:
            if self.budget.padding_done():
                self.stopped = True
                return
            if not self.in_member:
                if self.trailing_zeros or data[:1] != GZIP_MAGIC[:1]:
                    self._trailing(data)
                    return
                self.in_member, self.member = True, self.pos
            try:
                out = self.dobj.decompress(data, _OUT_PIECE)
            except zlib.error as exc:
                raise CorruptDeflateError(
                    self.path, self.member, f"corrupt gzip member ({exc}; input read to offset {self.pos + len(data)})"
                ) from exc
            rest = self.dobj.unconsumed_tail or self.dobj.unused_data
            self.pos += len(data) - len(rest)
            if out:
                self.budget.spend(len(out), self.pos)
                yield out
            if self.dobj.eof:  # the member's trailer (CRC-32, length) has been verified by zlib
                self.in_member = False
                self.dobj = zlib.decompressobj(31)
            data = rest

    def _trailing(self, data: bytes) -> None:
        """Bytes after the last member: zeros are padding (as gzip says, "trailing zero bytes ignored")."""
        if data.strip(b"\x00"):
            raise CorruptDeflateError(self.path, self.pos, f"not a gzip member (bytes {data[:4].hex()})")
        self.trailing_zeros = True
        self.pos += len(data)

    def finish(self) -> None:
        """Raise if the input ended inside a member."""
        if self.in_member:
            raise CorruptDeflateError(self.path, self.member, f"truncated gzip member (input ends at {self.pos})")


def decompress_gzip(chunks: Iterable[Any], path: str, *, end: ArchiveEnd | None = None) -> Iterator[bytes]:
    """Decompress a gzip stream given as consecutive compressed pieces (any sizes); output pieces of at most 1 MiB.

    Every member's CRC-32 and length are verified. Once ``end`` is set (the tar walk saw the
    end-of-archive marker) at most :attr:`tarindex.compression.Limits.padding` more bytes are
    decompressed; the rest of the input is read, not inflated.

    Raises:
        CorruptDeflateError: a bad header, corrupt deflate data, a CRC or length mismatch, a
            truncated member, or bytes after the members that are neither a member nor zeros,
            naming ``path`` and the compressed offset of the member at fault.
        DecompressionLimitError: the output exceeds the expansion ratio.
    """
    state = _Members(path, end)
    chunks = iter(chunks)
    for chunk in chunks:
        yield from state.feed(bytes(chunk))
        if state.stopped:  # past the end of the archive: read the rest, inflate none of it
            for _ in chunks:
                pass
            return
    state.finish()
