"""Shard access: how an indexed (or unindexed) shard is opened for random reads, and who owns the open handles.

- :mod:`.reader`: the :class:`~tarindex.access.reader.RandomReader` seam every random reader offers, and
  :class:`~tarindex.access.reader.LocalReader` (``os.pread`` of a local descriptor).
- :mod:`.codecs`: the one codec registry (plain tar, zstd, gzip): for each, how its random reader is made
  over the compressed shard's bytes.
- :mod:`.open`: :func:`~tarindex.access.open.open_random`, the one path that opens a shard for random reads
  (``TarDataset``, ``TarStream``'s positions, ``verify``), checked against its index entry.
- :mod:`.handles`: :class:`~tarindex.access.handles.HandleTable`, the owner of a process's open handles
  of one index's shards (LRU, reads in progress, fork, the process-wide bound).
"""

from __future__ import annotations

__all__: list[str] = []  # internal package: its names serve the package, the public API is tarindex.__all__
