"""tarindex: tar shards as a fast random-access dataset for PyTorch.

Importing this package never imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._state import stream_states
from .build import BuildReport, build_index, merge_indexes
from .dataset import TarDataset
from .errors import (
    CommandNotAllowedError,
    CorruptArchiveError,
    CorruptFrameError,
    DecodeError,
    DuplicateMemberError,
    IndexFormatError,
    IndexNotFoundError,
    PatternError,
    RandomAccessError,
    SampleNotFoundError,
    SamplerStateError,
    ShardNotFoundError,
    SourceError,
    StaleIndexError,
    StateError,
    StreamWarning,
    TarIndexError,
    TarIndexWarning,
    WriteError,
)
from .index.reader import IndexReader
from .sampler import MixSampler, ShardSampler
from .shard_writer import ShardWriter, compress_shard
from .verify import VerifyReport, verify_index

if TYPE_CHECKING:  # type checkers and editors see the real class; at run time __getattr__ imports it on use
    from .mixing import Mix, mix
    from .stream import TarStream

__version__ = "0.1.0"

__all__ = [
    "BuildReport",
    "CommandNotAllowedError",
    "CorruptArchiveError",
    "CorruptFrameError",
    "DecodeError",
    "DuplicateMemberError",
    "IndexFormatError",
    "IndexNotFoundError",
    "IndexReader",
    "Mix",
    "MixSampler",
    "PatternError",
    "RandomAccessError",
    "SampleNotFoundError",
    "SamplerStateError",
    "ShardNotFoundError",
    "ShardSampler",
    "ShardWriter",
    "SourceError",
    "StaleIndexError",
    "StateError",
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
    "mix",
    "stream_states",
    "verify_index",
]


def __getattr__(name: str) -> object:
    if name == "TarStream":  # imports torch, so only on use
        from .stream import TarStream

        return TarStream
    if name in ("mix", "Mix"):  # imports torch too (the module is `mixing`: `tarindex.mix` stays the function)
        from . import mixing

        return getattr(mixing, name)
    raise AttributeError(f"module 'tarindex' has no attribute {name!r}")
