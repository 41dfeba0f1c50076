"""tarindex: tar shards as a fast random-access dataset for PyTorch.

Importing this package imports neither torch nor numpy nor lmdb: the public names that need them
are imported on first use.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING

if sys.platform == "win32":  # os.pread, fork-aware readers, fcntl locks: the package is POSIX-only
    raise ImportError("tarindex runs on POSIX systems only (Linux, macOS); on Windows use it inside WSL")

from . import errors
from .errors import *  # noqa: F403  # every exception and warning class: the names errors.__all__ lists

if TYPE_CHECKING:
    from ._state import stream_states
    from .build import BuildReport, build_index, merge_indexes
    from .dataset import TarDataset
    from .export import export_dali, export_wids
    from .index.reader import IndexReader
    from .mixing import Mix, mix
    from .options import SourceOptions
    from .packing import PackReport, pack
    from .sampler import MixSampler, ShardSampler
    from .shard_writer import ShardWriter, compress_shard
    from .stream import TarStream
    from .verify import VerifyReport, verify_index

__version__ = "0.1.0"

__all__ = [
    "BuildReport",
    "IndexReader",
    "Mix",
    "MixSampler",
    "PackReport",
    "ShardSampler",
    "ShardWriter",
    "SourceOptions",
    "TarDataset",
    "TarStream",
    "VerifyReport",
    "__version__",
    "build_index",
    "compress_shard",
    "export_dali",
    "export_wids",
    "merge_indexes",
    "mix",
    "pack",
    "stream_states",
    "verify_index",
]
__all__ += errors.__all__


_LAZY = {
    "BuildReport": "build",
    "build_index": "build",
    "merge_indexes": "build",
    "TarDataset": "dataset",
    "IndexReader": "index.reader",
    "SourceOptions": "options",
    "ShardSampler": "sampler",
    "ShardWriter": "shard_writer",
    "compress_shard": "shard_writer",
    "VerifyReport": "verify",
    "verify_index": "verify",
    "TarStream": "stream",  # imports torch where installed
    "MixSampler": "sampler",
    "stream_states": "_state",
    "Mix": "mixing",  # imports torch where installed; the module is not named `mix`, so that `tarindex.mix` stays the function
    "mix": "mixing",
    "export_dali": "export",
    "export_wids": "export",
    "PackReport": "packing",
    "pack": "packing",  # the module is not named `pack`, so that `tarindex.pack` stays the function
}
"""Public names imported on first use, so that ``import tarindex`` (and the CLI's ``--help``) imports
neither numpy, lmdb nor torch."""


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tarindex' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
