"""Index layout: LMDB keys, ``FORMAT_VERSION``, the sizes of blocks and buckets, and per-shard records.

See ``docs/design.md`` ("Index layout") for the table of keys. How a value is stored under its key (sealed:
a CRC-32 of key and payload, then the payload) is the index file's, :mod:`tarindex.index.pages`.
"""

from __future__ import annotations

import hashlib

from ..tables import ShardInfo, ShardTable

__all__ = [
    "BLOCK_SAMPLES",
    "BUCKET_BYTES",
    "CONTENT_SUMMARY",
    "FORMAT_VERSION",
    "LATER_CONTENT",
    "MAGIC",
    "SHARD_BLOCK",
    "SHARD_SUMMARY",
    "ShardInfo",
    "ShardTable",
    "bucket_keys",
    "bucket_of",
    "key_hash",
]

FORMAT_VERSION = 5
MAGIC = "tarindex"
# Keys, in the order a writer appends them (LMDB keeps keys sorted; appending in order fills pages).
BLOCK_PREFIX = b"b/"  # + u64 big-endian block number: the records of BLOCK_SAMPLES samples
START_KEY = b"c/start"  # u64[n_shards + 1]: first sample of each shard, then n_samples
FRAMES_PREFIX = b"f/"  # + u64 big-endian shard number: a zstd shard's (n_frames, 4) uint64 frame table
GZIP_PREFIX = b"g/"  # + u64 big-endian shard number: a gzip shard's seek-point table (tarindex.gzip_random)
KEYS_PREFIX = b"k/"  # + u64 big-endian bucket number: one bucket of the hashed key table
META_KEY = b"meta"  # JSON
SHARDS_PREFIX = b"s/"  # + u64 big-endian block number: JSON list of SHARD_BLOCK shard records

BLOCK_SAMPLES = 4096
"""Samples per record block: sample ``i`` is in block ``i // BLOCK_SAMPLES``. A block is an LMDB overflow
value of ~32 KB at 8 bytes a row (9 pages); its last page is partly empty, so larger blocks waste less
(1M one-member samples: 1,024 -> 17.9 B/sample, 2,048 -> 15.9, 4,096 -> 14.9)."""
SHARD_BLOCK = 64
"""Shard records per shard block (~16 KB of JSON: the first sample of a shard reads a few pages of them)."""
SHARD_SUMMARY = ("url_shards", "command_shards", "zstd_samples", "zstd_frames")
"""Counts over the shard records kept in the meta, so opening an index reads no shard record: URL and
command shards (how reads are batched, whether commands are refused), and samples and frames of the zstd
shards that have a frame table (the mean samples per frame a sampler shuffles by)."""
CONTENT_SUMMARY = ("data_bytes", "shard_bytes", "zstd_shards", "zstd_shards_without_random_access")
"""Totals over the records kept in the meta (with ``ext_members``, members per extension), so ``tarindex info``
decodes no record and reads no shard record: sample bytes, shard bytes, zstd shards, and those of them
that cannot be read at random cheaply. Indexes written before these existed lack them (optional keys)."""
LATER_CONTENT = ("gzip_shards",)
"""Totals kept beside ``CONTENT_SUMMARY`` since a later writer, each optional on its own (an index written
before one lacks it, and ``tarindex info`` then counts the records): gzip shards."""
BUCKET_BYTES = 1280
"""Bytes of entries per bucket of the key table, on average: three buckets (and their LMDB node headers,
keys and checksums, ~24 bytes each) fill a 4 KiB page with room for buckets larger than the mean."""


def bucket_keys(sample_bytes: int) -> int:
    """Keys per bucket, on average, for entries of ``2 + sample_bytes`` bytes: 256 for 3-byte sample numbers
    (up to 16M samples), 213 for 4 (up to 4G), 182 for 5 (a fixed count would leave a third of every
    page empty once sample numbers outgrow 3 bytes: two buckets a page instead of three)."""
    return BUCKET_BYTES // (2 + sample_bytes)


def key_hash(key: bytes) -> int:
    """The 64-bit hash of a key in the key table (BLAKE2b, so it is the same in every process)."""
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")


def bucket_of(h: int, n_buckets: int) -> int:
    """The bucket of hash ``h``: its high 32 bits scaled to ``n_buckets`` (so buckets follow hash order)."""
    return ((h >> 32) * n_buckets) >> 32
