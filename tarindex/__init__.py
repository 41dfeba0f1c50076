"""tarindex: tar shards as a fast random-access dataset for PyTorch.

Importing this package never imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .build import BuildReport, build_index, merge_indexes
from .dataset import TarDataset
from .errors import (
    CommandNotAllowedError,
    CorruptArchiveError,
    CorruptFrameError,
    DecodeError,
    DuplicateMemberError,
    IndexChangedError,
    IndexFormatError,
    IndexNotFoundError,
    RandomAccessError,
    SampleNotFoundError,
    SamplerStateError,
    ShardNotFoundError,
    SourceError,
    StaleIndexError,
    StreamWarning,
    TarIndexError,
    TarIndexWarning,
    WriteError,
)
from .index.reader import IndexReader
from .sampler import ShardSampler
from .shard_writer import ShardWriter, compress_shard
from .verify import VerifyReport, verify_index

if TYPE_CHECKING:  # type checkers and editors see the real class; at run time __getattr__ imports it on use
    from .stream import TarStream

__version__ = "0.1.0"

__all__ = [
    "BuildReport",
    "CommandNotAllowedError",
    "CorruptArchiveError",
    "CorruptFrameError",
    "DecodeError",
    "DuplicateMemberError",
    "IndexChangedError",
    "IndexFormatError",
    "IndexNotFoundError",
    "IndexReader",
    "RandomAccessError",
    "SampleNotFoundError",
    "SamplerStateError",
    "ShardNotFoundError",
    "ShardSampler",
    "ShardWriter",
    "SourceError",
    "StaleIndexError",
    "StreamWarning",
    "TarDataset",
    "TarIndexError",
    "TarIndexWarning",
    "TarStream",
    "VerifyReport",
    "WriteError",
    "__version__",
    "build_index",
    "compress_shard",
    "merge_indexes",
    "verify_index",
]


def __getattr__(name: str) -> object:
    if name == "TarStream":  # imports torch, so only on use
        from .stream import TarStream

        return TarStream
    raise AttributeError(f"module 'tarindex' has no attribute {name!r}")
