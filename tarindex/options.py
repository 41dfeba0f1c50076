"""How remote shards are read: one frozen options record instead of the same keywords in every signature."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypedDict

from ._retry import RetryPolicy

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["DEFAULT_COALESCE_GAP", "DEFAULT_MAX_IN_FLIGHT", "SourceOptions"]  # SourceAliases: the keywords of signatures

DEFAULT_MAX_IN_FLIGHT = 128
"""Ranged requests in flight per process for a batch (see docs/remote.md for the measurement)."""

DEFAULT_COALESCE_GAP = 4 << 10
"""Ranges of one shard at most this many bytes apart are fetched by one request (the gap is read and dropped)."""


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """Options of every remote read (HTTP(S), object stores, fsspec); the defaults suit most stores.

    Credentials never go into an index: they come from each store's standard environment
    (``AWS_*``, ``GOOGLE_*``, ``AZURE_*``, ``HF_TOKEN``) or from ``storage_options``.
    """

    block_size: int = 1 << 20
    """Bytes per sequential read (streaming, building)."""
    retries: int = 5
    """Tries after a failure without progress (see :class:`tarindex._retry.RetryPolicy`)."""
    backoff: float = 0.5
    """Upper bound in seconds of the first retry's wait (full jitter; doubled per failure, at most 30 s)."""
    timeout: float = 60.0
    """Seconds without a byte before a request counts as failed."""
    headers: Mapping[str, str] = field(default_factory=dict)
    """Extra HTTP(S) request headers, e.g. ``{"Authorization": "Bearer ..."}``."""
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    """Client options of the object store or fsspec filesystem (endpoint, region, credentials)."""
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    """Ranged requests (URL shards), or reads (local shards), in flight at once for one batch (``TarDataset.__getitems__``)."""
    coalesce_gap: int = DEFAULT_COALESCE_GAP
    """Ranges of one shard this close are merged into one request or read (negative: never merged)."""
    cache_dir: str | None = None
    """A local directory for the block cache of fetched ranges, shared by the processes of a node (off: ``None``)."""
    cache_bytes: int = 16 << 30
    """The block cache's bound in bytes (least recently used ranges are deleted)."""

    @property
    def retry(self) -> RetryPolicy:
        """The retry policy these options describe."""
        return RetryPolicy(retries=max(0, self.retries), backoff=self.backoff)

    @classmethod
    def given(cls, options: SourceOptions | None, *, call: str = "SourceOptions.given", **aliases: Unpack[SourceAliases]) -> SourceOptions:
        """``options`` (or the defaults) with the :class:`SourceAliases` a caller gave beside them, which win (``None``:
        not given): what ``open_source``, ``TarStream``, ``TarDataset`` and ``build_index`` take.

        Raises:
            TypeError: a keyword that is no alias, as Python words it for ``call``.
        """
        for name in aliases:
            if name not in _ALIASES:
                raise TypeError(f"{call}() got an unexpected keyword argument {name!r}")
        changes: dict[str, Any] = dict(aliases)
        for name in _MAPPINGS & changes.keys():
            if changes[name] is not None:
                changes[name] = dict(changes[name])  # a copy: the caller's mapping may change later
        return (options or cls()).with_(**changes)

    def with_(self, **changes: Any) -> SourceOptions:
        """A copy with ``changes`` applied (``None`` values ignored)."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})


class SourceAliases(TypedDict, total=False):
    """The keywords that :func:`tarindex.sources.open_source` and :class:`tarindex.TarStream` take beside
    ``options=``, each overriding the :class:`SourceOptions` field of its name (``None``: as ``options`` has it);
    ``TarDataset`` and ``build_index`` take ``storage_options`` and ``headers``."""

    block_size: int | None
    """Bytes per read."""
    retries: int | None
    """Network retries without progress."""
    backoff: float | None
    """The first backoff in seconds (doubled each time)."""
    timeout: float | None
    """Socket timeout in seconds."""
    storage_options: Mapping[str, Any] | None
    """Object store and fsspec client options."""
    headers: Mapping[str, str] | None
    """Extra HTTP(S) request headers."""


_ALIASES = frozenset(SourceAliases.__annotations__)
_MAPPINGS = frozenset({"storage_options", "headers"})
