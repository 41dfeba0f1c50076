"""TarDataset: map-style access to indexed tar shards, one ``os.pread`` per sample."""

from __future__ import annotations

import logging
import operator
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, overload

from . import _args, _native
from ._localbatch import read_ranges
from ._process import FORK
from ._readcheck import check_sample
from .access.codecs import ZstdCache
from .access.handles import HandleTable
from .access.open import IndexOpener, OpenOptions
from .decode import DecodeMode, Decoder, Image, failure
from .errors import (
    CorruptArchiveError,
    DecodeError,
    IndexFormatError,
    IndexNotFoundError,
    SampleNotFoundError,
    StaleIndexError,
    TarIndexError,
    counted,
    shown,
)
from .identity import Check, Checked
from .index.reader import IndexReader
from .naming import ShardNames
from .objstore import is_remote_reader, read_many
from .options import SourceOptions
from .tar import global_records
from .view import View, find_index, view_of

__all__ = ["TarDataset"]

log = logging.getLogger("tarindex")

OnError = Literal["raise", "skip"]

_BATCH_PART = 1024  # samples per Reader.read_batch call (a decoded record is 4.6 KB there)
_ATTACH = threading.Lock()  # attaching (the first read of a dataset in a process), across threads


def _new_attach_lock() -> None:  # a forked child must not inherit a lock another thread of the parent held
    global _ATTACH
    _ATTACH = threading.Lock()


os.register_at_fork(after_in_child=_new_attach_lock)

Sample = dict[str, Any]


class _Done:
    """A batch's sample that is already final (an unreadable one replaced by the next readable sample)."""

    __slots__ = ("sample",)

    def __init__(self, sample: Any) -> None:
        self.sample = sample


class TarDataset:
    """Map-style dataset over indexed tar shards.

    ``ds[i]`` does one index lookup (memoryviews over the LMDB map) and one
    positional read of the sample's whole byte range, and returns a dict with
    ``__key__``, ``__url__`` (the shard path), ``__index__`` and one entry per
    extension (``bytes``, or decoded). Works with any sampler and with
    ``DataLoader`` workers: the index and shard files open lazily in each
    process, and pickling carries paths and options only.

    Args:
        source: an index file (every sample of the index), or shards (list,
            glob or brace pattern): exactly the samples of those shards, in the
            order named, from the index beside them that holds them all (the
            default name, else any other ``*.tarindex`` there; docs/dataset.md,
            "Shards of an index"). Relative paths are resolved when the dataset
            is made (a later ``os.chdir`` does not move it).
        decode: image decoding: one of webdataset's image specs with webdataset's
            meaning (``"pil"``, ``"rgb8"``, ``"torchrgb8"``, ``"torchrgb"``, ...:
            :data:`tarindex.decode.IMAGE_SPECS`), ``"numpy"`` (``uint8`` HWC, the
            image's own channels), or a :class:`tarindex.decode.Image` (decoded at
            the output size; a batch into one array); ``None`` keeps images as
            bytes. Other known extensions are decoded whenever ``decode`` or
            ``decoders`` is given.
        decoders: custom ``{extension: fn(bytes) -> value}``.
        transform: applied to each sample dict after decoding.
        allow_pickle: decode pickle-based members. Never for untrusted shards.
        max_open_files: bound on open shard files per process (LRU).
        zstd_cache_dir: opt-in slower path for zstd shards made of one large
            frame (``zstd`` CLI output): each such shard is decompressed once
            into this directory and read from there. Without it, random access
            to such a shard raises :class:`~tarindex.errors.RandomAccessError`.
            See docs/zstd.md.
        zstd_cache_bytes: size bound of ``zstd_cache_dir`` (least recently
            used shards are deleted).
        on_error: what a sample that cannot be read or decoded does: ``"raise"``
            (default) raises it (a decoding failure as
            :class:`~tarindex.errors.DecodeError` naming the shard and offset);
            ``"skip"`` logs it (logger ``tarindex``, with the shard and offset)
            and returns the next readable sample (``i + 1``, ``i + 2``, ...,
            wrapping around): damaged members (``CorruptArchiveError``, a zstd
            frame that does not decompress) and decoding or ``transform``
            failures alike. Missing or changed shards always raise, a sample whose tar
            headers disagree with the index too (see ``read``).
        max_errors: with ``on_error="skip"``, this many failures in a row (in this
            process, across calls) raise the last one.
        verify: how a shard is checked when a process first opens it
            (:mod:`tarindex.identity`): ``"stat"`` compares size and mtime, and
            the fingerprint (first and last 64 KiB) only when the mtime
            differs, so an identical copy is accepted; ``"fingerprint"``
            compares the fingerprint always (catches a rewrite that kept size
            and mtime, within 64 KiB of either end).
        options: how URL shards (``http(s)://``, ``s3://``, ``gs://``, ``az://``,
            fsspec) are read: retries, timeout, requests in flight per batch,
            coalescing gap (:class:`~tarindex.options.SourceOptions`; docs/remote.md);
            the last two also for a batch of local shards (``__getitems__``; docs/dataset.md).
        storage_options: object-store or fsspec client options (endpoint,
            credentials); overrides ``options.storage_options``. Never stored in the index.
        headers: extra HTTP(S) request headers (e.g. ``Authorization``);
            overrides ``options.headers``.

    Raises:
        IndexNotFoundError: no index at ``source``, or none beside the shards
            that holds every one of them (the message names the shards it lacks).
        IndexFormatError: the file is not a tarindex index.
        PatternError: a shard is named twice.
        OptionError: ``max_open_files`` below 1; :class:`~tarindex.errors.OptionTypeError` for a
            ``max_open_files`` that is not an integer or ``decoders`` that is not a mapping of
            extension to function (``["jpg"]``).
    """

    def __init__(
        self,
        source: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
        *,
        decode: DecodeMode | Image | None = None,
        decoders: Mapping[str, Callable[[bytes], Any]] | None = None,
        transform: Callable[[Sample], Any] | None = None,
        allow_pickle: bool = False,
        max_open_files: int = 64,
        zstd_cache_dir: str | os.PathLike[str] | None = None,
        zstd_cache_bytes: int = 16 << 30,
        verify: Check = "stat",
        options: SourceOptions | None = None,
        storage_options: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        on_error: OnError = "raise",
        max_errors: int = 10,
    ) -> None:
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', not {on_error!r}")
        if max_errors < 1:
            raise ValueError(f"max_errors must be >= 1, not {max_errors}")
        self.on_error: OnError = on_error
        self.max_errors = max_errors
        self._failures = 0  # failures in a row, in this process
        _args.shard_names(source, "source", call="TarDataset")
        decoders = _args.decoders(decoders)
        max_open_files = _args.count(max_open_files, "max_open_files", means="shard files kept open per process")
        self.index_path, self._view = find_index(source)
        self._load_index()
        self.decoder = Decoder(decode, decoders=decoders, allow_pickle=allow_pickle) if (decode or decoders or allow_pickle) else None
        self.transform = transform
        self.max_open_files = max_open_files
        self.zstd_cache_dir = os.fspath(zstd_cache_dir) if zstd_cache_dir is not None else None
        self.zstd_cache_bytes = zstd_cache_bytes
        if verify not in ("stat", "fingerprint"):
            raise ValueError(f"verify must be 'stat' or 'fingerprint', not {verify!r}")
        self.verify: Check = verify
        self._gen = -1  # FORK[0] this object attached under; -1: not attached
        self.options = SourceOptions.given(options, storage_options=storage_options, headers=headers)

    # -- per-process state ----------------------------------------------------
    def _index_identity(self) -> tuple[int, ...]:
        """The index file's identity (a rebuild renames a new file over it); empty when it is gone."""
        try:
            st = os.stat(self.index_path)
        except FileNotFoundError:
            return ()
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)

    def _load_index(self) -> None:
        """The per-index state: the reader, the view and sample count, shard names, and the index file's identity.

        Raises:
            IndexNotFoundError: the dataset names shards and the index (rebuilt since) no longer holds them all.
        """
        self.index = IndexReader(self.index_path)
        self._index_id = self._index_identity()  # after the open: a rebuild in between only costs a reload
        view = self._view
        if view is not None and view.build_id != self.index.build_id:  # rebuilt since the view was made: map anew
            found, missing = view_of(self.index, view.named)
            if found is None:
                raise IndexNotFoundError(
                    f"{self.index_path}: the index was rebuilt and no longer holds {len(missing)} of this dataset's shards "
                    f"(first {missing[0]}); build it over them again, or make the dataset again"
                )
            self._view = view = found
        self._map: View | None = view if view is not None and not view.whole else None
        self._n = self._map.n if self._map is not None else self.index.n_samples
        self._samples_per_frame: int | None = None
        self.urls = ShardNames(self.index.path, self.index.shards)  # a shard's record is read when it is first read from
        self._remote = self.index.url_shards > 0  # batches of URL shards: concurrent requests

    def _attach(self) -> None:
        """Open this process's view once, whatever the threads asking: the sample records, no file handles yet.

        The index file may have been rebuilt in place since this object was made (a DataLoader worker
        forked for a later epoch): then every per-index field is read anew, never mixed with the old.
        """
        with _ATTACH:
            if self._gen != FORK[0]:
                self._attach_here()

    def _attach_here(self) -> None:
        if self._index_identity() != self._index_id:  # a removed index: IndexNotFoundError from the reload
            self.index.close()
            self._load_index()
        ix = self.index
        self._blocks = ix.blocks()  # keeps the index's map open while this process reads from it
        self._exts = ix.exts
        options = OpenOptions(self.options, self.verify, ZstdCache(self.zstd_cache_dir, self.zstd_cache_bytes))
        opener = IndexOpener(self.urls, ix, options, Checked(len(self.urls)))
        self._opener = HandleTable(len(self.urls), opener, self.max_open_files)  # it opens shards through `opener`
        self._global_walks: dict[int, tuple[int, list[tuple[int, dict[str, str]]]]] = {}  # see _globals_at
        self._modes = bytearray(len(self.urls))  # per shard: how a batch reads it (_localbatch)
        self._fast: Any = None
        speedups = _native.SPEEDUPS  # the C read path, or None; the Python path (_read_py) is the reference
        if speedups is not None:
            self._fast = speedups.Reader(
                _native.ReaderConfig(
                    blocks=self._blocks.payload,
                    block_samples=self._blocks.block_samples,
                    n_samples=ix.n_samples,
                    exts=tuple(self._exts),
                    names=self.urls.names,  # None until a shard is first read (the C reader hands such a read to _read_py)
                    handles=self._opener,
                    fallback=self._read_py,
                    error=CorruptArchiveError,
                    fork=FORK,
                    runs=self._map.runs() if self._map is not None else None,
                    guard=self._blocks,  # the index file checked again as blocks are held, records against their shard
                )
            )
        self._gen = FORK[0]
        # The hot path: this instance's `read` is the reader's own method, not the class's wrapper. Both
        # readers check the fork generation themselves (the C one hands a stale call to _read_py).
        self.read = self._fast.read if self._fast is not None else self._read_py  # type: ignore[method-assign]
        self._choose_item()

    def close(self) -> None:
        """Close this process's shard files (they reopen on demand); a file being read closes when its read ends."""
        if self._gen == FORK[0]:
            self._opener.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __getstate__(self) -> dict[str, Any]:
        state = {
            k: v
            for k, v in self.__dict__.items()
            if (not k.startswith("_") and k != "read") or k in ("_n", "_samples_per_frame", "_remote", "_index_id", "_view", "_map")
        }
        state["_gen"] = -1
        state["_failures"] = 0
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    # -- access ---------------------------------------------------------------
    def __len__(self) -> int:
        return self._n

    def read(self, i: int) -> Sample:
        """Sample ``i`` as raw bytes per extension (no decoding, no transform).

        Every read checks the members' tar headers inside the bytes it read (checksum, name, size) against
        the index record, in the C and the Python reader alike (:mod:`tarindex._readcheck`).

        Raises:
            IndexError: ``i`` is out of range.
            OptionTypeError: ``i`` is not an integer (a key: the message says to use :meth:`get`).
            StaleIndexError: the shard changed since it was indexed (at open: size, mtime, fingerprint;
                at each read: a member's header that disagrees with the record, named with its offset).
            ShardNotFoundError: the shard is missing.
            CorruptArchiveError: the shard is shorter than the index says.
        """
        if self._gen != FORK[0]:  # the first read in this process: from now on `read` is the attached reader's
            self._attach()
        return self.read(i)  # the instance's reader (see _attach)

    def _read_py(self, i: int) -> Sample:
        if self._gen != FORK[0]:  # inherited through fork: attach anew in this process
            self._attach()
            return self.read(i)
        i, offset, size, shard, members, key = self._locate(i)
        opener = self._opener
        handle = opener.acquire(shard)  # counted: no other thread closes it under this read
        try:
            buf = handle.read_at(offset, size)
        finally:
            opener.release(shard)
        return self._sample(i, buf, offset, size, shard, members, key)

    def _locate(self, i: int) -> tuple[int, int, int, int, list[tuple[int, int, int]], bytes]:
        """Sample ``i``'s record: ``(i, offset, size, shard, members, key)``, ``i`` made non-negative.

        ``members`` holds ``(extension number, data offset relative to the sample, size)`` each, checked
        against the sample's range; ``key`` is utf-8 (surrogateescape).

        Raises:
            IndexError: ``i`` is out of range.
            IndexFormatError: the record names a shard the index does not have.
        """
        n = self._n
        i = _args.sample_index(i)  # numpy integers too, as the C reader takes them
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"sample {i} out of range for {counted(n, 'sample')}")
        shard, offset, size, members, key = self._blocks.record(i if self._map is None else self._map.to_index(i))
        if shard >= len(self.urls):
            raise IndexFormatError(f"{self.index_path}: the record of sample {i} names shard {shard} of {len(self.urls)}; rebuild the index")
        return i, offset, size, shard, members, key

    def _sample(self, i: int, buf: Any, offset: int, size: int, shard: int, members: list[tuple[int, int, int]], key: bytes) -> Sample:
        """The sample dict of sample ``i`` from the bytes of its whole range, once its members' headers in
        those bytes are checked against the record (:func:`tarindex._readcheck.check_sample`).

        Raises:
            CorruptArchiveError: ``buf`` is short, or a member lies outside the sample's range.
            StaleIndexError: a member's headers do not say what the record says (name, size, checksum).
        """
        if len(buf) != size:
            raise CorruptArchiveError(self.urls[shard], offset + len(buf), "sample runs past the end of the shard")
        try:
            check_sample(buf, self.urls[shard], offset, key, members, self._exts)
        except StaleIndexError:
            globals_ = self._globals_at(shard, offset)  # a global PAX header before the range renames its members
            if not globals_:
                raise
            check_sample(buf, self.urls[shard], offset, key, members, self._exts, globals_)
        sample: Sample = {"__key__": key.decode("utf-8", "surrogateescape"), "__url__": self.urls[shard], "__index__": i}
        exts = self._exts
        for e, o, z in members:  # checked against the sample's range when the record was read
            sample[exts[e]] = buf[o : o + z]
        return sample

    def _globals_at(self, shard: int, offset: int) -> dict[str, str]:
        """The global PAX records in effect at ``offset`` of ``shard`` (empty: none), from a walk of the shard's
        headers up to there, made once per shard and process and only for a shard whose read check failed:
        the build applied them to the names and sizes it indexed, as :mod:`tarfile` does."""
        walked, found = self._global_walks.get(shard, (-1, []))
        if walked < offset:
            handle = self._opener.acquire(shard)
            try:
                step = 1 << 20
                chunks = (handle.read_at(at, min(step, offset - at)) for at in range(0, offset, step))
                found = global_records(chunks, self.urls[shard])
            finally:
                self._opener.release(shard)
            self._global_walks[shard] = (offset, found)
        records: dict[str, str] = {}
        for at, after in found:
            if at < offset:
                records = after
        return records

    if TYPE_CHECKING:

        def __getitem__(self, i: int) -> Any:
            """Sample ``i``, decoded and transformed when asked."""

    else:
        # ds[i] costs what ds.read(i) costs when nothing decodes or transforms: the type's __getitem__ is
        # a C-level property that hands out this instance's item function (_choose_item), so no Python
        # frame runs per sample on the raw path; with a decoder or a transform it is _decoded_item.
        __getitem__ = property(operator.attrgetter("_item"), doc="ds[i]: sample i, decoded and transformed when asked.")

    def _item(self, i: int) -> Any:
        """``ds[i]`` before this process chose its item function (first use, after fork or a new decoder)."""
        if self._gen != FORK[0]:
            self._attach()
        else:
            self._choose_item()
        item: Callable[[int], Any] = self.__dict__["_item"]
        return item(i)

    def _choose_item(self) -> None:
        if self.on_error == "skip":
            self._item = self._skipping_item  # type: ignore[method-assign]
        else:
            self._item = self.read if self.decoder is None and self.transform is None else self._decoded_item  # type: ignore[method-assign]

    def _decoded_item(self, i: int) -> Any:
        return self._finish(self.read(i))

    def _skipping_item(self, i: int) -> Any:
        """``ds[i]`` with ``on_error="skip"``: the first readable sample from ``i`` on (see the class doc)."""
        n = self._n
        j = i
        while True:
            try:
                sample = self._decoded_item(j)
            except (CorruptArchiveError, DecodeError) as exc:
                self._failures += 1
                log.warning("skipping sample %d (%d in a row, max_errors=%d): %s", j % n if n else j, self._failures, self.max_errors, exc)
                if self._failures >= self.max_errors:
                    raise
                j = (j + 1) % n if j >= 0 else j + 1
                continue
            self._failures = 0
            return sample

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        if name in ("decoder", "transform", "on_error"):  # ds[i] chooses its item function again
            self.__dict__.pop("_item", None)

    def __getitems__(self, indices: list[int]) -> list[Any]:
        """A batch of samples, read in index order (shard by shard, offset by offset) and returned in the order asked.

        ``DataLoader`` calls this for batched sampling; reading in file order keeps
        reads local (page cache, zstd frames) whatever order the sampler chose. The ranges of
        local shards are read together (:meth:`_read_batch`: many in flight on slow storage, the
        page cache's at once), those of URL shards as concurrent requests (docs/remote.md). With a
        :class:`tarindex.decode.Image` decoder of a fixed size, the batch's images are decoded
        together (:meth:`_decode_batch`): the samples are those ``ds[i]`` gives.
        """
        batch = self.decoder is not None and self.decoder.batches
        if self._remote and self.on_error == "raise":  # with "skip", sample by sample: each failure handled
            out = self._getitems_remote(indices, raw=batch)
        elif self.on_error == "raise":  # local shards: the batch's ranges read together (_localbatch)
            out = self._read_batch(indices)
            if not batch:
                return out if self.decoder is None and self.transform is None else [self._finish(s) for s in out]
        elif batch:
            out = [None] * len(indices)
            for k in sorted(range(len(indices)), key=indices.__getitem__):
                out[k] = self._read_or_skip(indices[k])
        else:
            out = [None] * len(indices)
            for k in sorted(range(len(indices)), key=indices.__getitem__):
                out[k] = self[indices[k]]
            return out
        return self._decode_batch(out)

    def _read_batch(self, indices: list[int]) -> list[Any]:
        """``[self.read(i) for i in indices]``, the ranges of local shards read together: sorted by shard and
        offset, neighbours within ``options.coalesce_gap`` merged, what the page cache holds read at once,
        the rest ``options.max_in_flight`` reads at a time (the C reader's ``read_batch``, or
        :func:`tarindex._localbatch.read_ranges`)."""
        if self._gen != FORK[0]:
            self._attach()
        opts = self.options
        if self._fast is not None:  # at most _BATCH_PART samples a call: the C reader holds a record of each
            fast = self._fast.read_batch
            if len(indices) <= _BATCH_PART:
                got: list[Any] = fast(indices, opts.max_in_flight, opts.coalesce_gap)
                return got
            asked = list(indices)
            return [s for k in range(0, len(asked), _BATCH_PART) for s in fast(asked[k : k + _BATCH_PART], opts.max_in_flight, opts.coalesce_gap)]
        located = [self._locate(i) for i in indices]
        opener = self._opener
        fds: dict[int, int | None] = {}
        try:
            for shard in sorted({loc[3] for loc in located}):
                fds[shard] = opener.acquire(shard).fileno()  # counted until the batch is read: not closed under it
            plain: list[int] = []  # samples of shards whose descriptor reads their tar bytes
            requests: list[tuple[int, int, int, int]] = []
            for k, (_, offset, size, shard, _, _) in enumerate(located):
                fd = fds[shard]
                if fd is not None:
                    plain.append(k)
                    requests.append((fd, shard, offset, size))
            got = read_ranges(requests, self._modes, max_in_flight=opts.max_in_flight, coalesce_gap=opts.coalesce_gap)
        finally:
            for shard in fds:
                opener.release(shard)
        out: list[Any] = [None] * len(indices)
        for k, buf in zip(plain, got):
            i, offset, size, shard, members, key = located[k]
            if isinstance(buf, OSError):
                raise OSError(buf.errno, buf.strerror, self.urls[shard]) from buf
            out[k] = self._sample(i, buf, offset, size, shard, members, key)
        for k in range(len(indices)):
            if out[k] is None:  # a shard read through its handle's read_at (zstd, gzip): sample by sample
                out[k] = self.read(indices[k])
        return out

    def _read_or_skip(self, i: int) -> Any:
        """Sample ``i``'s bytes; with ``on_error="skip"``, an unreadable sample is ``ds[i]`` (the next readable
        one, decoded) as :meth:`_decode_batch` hands it on."""
        if self.on_error != "skip":
            return self.read(i)
        try:
            return self.read(i)
        except CorruptArchiveError:
            return _Done(self._skipping_item(i))

    def _decode_batch(self, raw: list[Any]) -> list[Any]:
        """Raw samples decoded together (``Decoder.decode_batch``: images in a thread pool, into one array),
        then transformed one by one; a sample that fails is a :class:`DecodeError` naming shard, offset,
        key and member, or with ``on_error="skip"`` the next readable sample, as ``ds[i]`` does."""
        decoder = self.decoder
        if decoder is None:
            return raw
        todo = [k for k, s in enumerate(raw) if not isinstance(s, _Done)]
        errors = decoder.decode_batch([raw[k] for k in todo])
        out: list[Any] = [s.sample if isinstance(s, _Done) else None for s in raw]
        for k, exc in zip(todo, errors):
            sample = raw[k]
            if exc is None and self.transform is not None:
                try:
                    sample = self.transform(sample)
                except Exception as err:
                    exc = err
            if exc is None:
                self._failures = 0
                out[k] = sample
                continue
            i = raw[k]["__index__"]
            error = exc if isinstance(exc, TarIndexError) else self._decode_error(i, exc)
            if self.on_error != "skip" or not isinstance(error, (CorruptArchiveError, DecodeError)):
                raise error from exc
            self._failures += 1
            n = self._n
            log.warning("skipping sample %d (%d in a row, max_errors=%d): %s", i, self._failures, self.max_errors, error)
            if self._failures >= self.max_errors:
                raise error from exc
            out[k] = self._skipping_item((i + 1) % n)
        return out

    def _getitems_remote(self, indices: list[int], *, raw: bool = False) -> list[Any]:
        """A batch over URL shards: every range requested at once (``options.max_in_flight`` in
        flight, neighbours within ``options.coalesce_gap`` in one request), samples in the order asked
        (``raw``: as ``read`` gives them)."""
        if self._gen != FORK[0]:
            self._attach()
        located = [self._locate(i) for i in indices]
        opener = self._opener
        handles: dict[int, Any] = {}
        out: list[Any] = [None] * len(indices)
        try:
            for shard in {loc[3] for loc in located}:
                handles[shard] = opener.acquire(shard)  # counted until the batch is read: not closed under it
            remote = [k for k, loc in enumerate(located) if is_remote_reader(handles[loc[3]])]
            got = read_many([(handles[located[k][3]], located[k][1], located[k][2]) for k in remote], self.options) if remote else []
        finally:
            for shard in handles:
                opener.release(shard)
        for k, buf in zip(remote, got):
            sample = self._sample(located[k][0], buf, *located[k][1:])
            out[k] = sample if raw else self._finish(sample)
        for k in range(len(indices)):
            if out[k] is None:
                out[k] = self.read(indices[k]) if raw else self[indices[k]]
        return out

    def _finish(self, sample: Sample) -> Any:
        """Decoding and transform, as ``ds[i]`` applies them.

        Raises:
            DecodeError: the decoder or the transform failed (names the shard, the sample's offset and key,
                and the member), as :class:`~tarindex.TarStream` raises it.
        """
        i = sample["__index__"]
        try:
            if self.decoder is not None:
                sample = self.decoder(sample)
            return self.transform(sample) if self.transform is not None else sample
        except TarIndexError:
            raise
        except Exception as exc:
            raise self._decode_error(i, exc) from exc

    def _decode_error(self, i: int, exc: BaseException) -> DecodeError:
        shard, offset, _, _, key = self.index.record(self._index_of(i))
        return DecodeError(self.urls[shard], offset, f"sample {shown(key)}: {failure(exc)}")

    def set_epoch(self, epoch: int) -> None:
        """The epoch random image crops are drawn for (:class:`tarindex.decode.Image`; shared with
        DataLoader workers, persistent ones too): call it before each epoch, as ``sampler.set_epoch``."""
        if self.decoder is not None:
            self.decoder.set_epoch(epoch)

    def _index_of(self, i: int) -> int:
        """The index's number of this dataset's sample ``i`` (``0 <= i < len(self)``)."""
        return i if self._map is None else self._map.to_index(i)

    def get(self, key: str) -> Any:
        """The sample with ``key`` (the first one in the index, if several share it).

        Raises:
            OptionTypeError: ``key`` is not a string.
            SampleNotFoundError: no sample has this key, or (a dataset of some shards of an index) the
                index's sample with this key is in a shard the dataset does not read.
        """
        j = self.index.lookup(_args.sample_key(key))
        if self._map is None:
            return self[j]
        i = self._map.from_index(j)
        if i is None:
            shard = self.index.record(j)[0]
            raise SampleNotFoundError(
                f"{self.index_path}: the sample with key {shown(key)} is in {self.urls[shard]}, "
                f"not one of this dataset's {counted(len(self._map.shards), 'shard')}"
            )
        return self[i]

    @property
    def shard_sizes(self) -> list[int]:
        """Samples per shard, in the dataset's order (sample numbers run shard after shard)."""
        if self._map is not None:
            return list(self._map.sizes)
        starts = self.index.shard_starts()
        return [int(b - a) for a, b in zip(starts[:-1].tolist(), starts[1:].tolist())]

    @property
    def samples_per_frame(self) -> int:
        """Mean samples per zstd frame over the zstd shards (rounded down, at least 1); 1 without zstd shards.

        ``ShardSampler`` shuffles runs of this many consecutive samples by
        default, so each frame is decompressed about once per epoch.
        """
        if self._samples_per_frame is None:  # counted by the index's writer: no shard record or frame table read
            self._samples_per_frame = self.index.samples_per_frame
        return self._samples_per_frame

    def keys(self) -> SampleKeys:
        """Every sample's key, in the dataset's order: a sized view (``len``, ``keys[i]``, iteration, ``key in``)."""
        return SampleKeys(self)

    def __iter__(self) -> Iterator[Any]:
        for i in range(self._n):
            yield self[i]

    def __repr__(self) -> str:
        shards = len(self._map.shards) if self._map is not None else len(self.urls)
        return f"TarDataset({str(self.index_path)!r}, samples={self._n}, shards={shards})"


class SampleKeys(Sequence[str]):
    """The keys of a :class:`TarDataset`'s samples, in its order (``ds.keys()``): ``len``, ``keys[i]``
    (sample ``i``'s key; a slice gives a list), iteration, and ``key in keys`` by the index's key table
    (one bucket read, not a scan). Reads the dataset's index as it is when asked."""

    __slots__ = ("_ds",)

    def __init__(self, ds: TarDataset) -> None:
        self._ds = ds

    def __len__(self) -> int:
        return len(self._ds)

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        n = len(self)
        k = operator.index(i)
        if k < 0:
            k += n
        if not 0 <= k < n:
            raise IndexError(f"key {i} out of range for {counted(n, 'sample')}")
        return self._ds.index.key(self._ds._index_of(k))

    def __iter__(self) -> Iterator[str]:
        ds = self._ds
        for i in range(len(ds)):
            yield ds.index.key(ds._index_of(i))

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        ds = self._ds
        try:
            j = ds.index.lookup(key)
        except SampleNotFoundError:
            return False
        return ds._map is None or ds._map.from_index(j) is not None

    def __repr__(self) -> str:
        return f"<keys of {self._ds!r}>"
