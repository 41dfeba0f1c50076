"""Object stores and other remote shards: listing for globs, ranged reads, concurrent coalesced batches,
sequential sources (:class:`ObjectSource`, :class:`FsspecSource`).

``s3://``, ``gs://`` and ``az://`` go through :mod:`obstore` (Rust ``object_store``: concurrent
requests without the GIL, ~20x the throughput of fsspec's ``cat_ranges`` here; see docs/design.md),
``http(s)://`` through :class:`tarindex.sources.RangeReader`, any other protocol (``hf://``, ...)
through :mod:`fsspec`. Credentials and endpoints come from each store's standard environment
(``AWS_*``, ``GOOGLE_*``, ``AZURE_*``, ``HF_TOKEN``) or ``storage_options``; never from an index.

Every read is checked against what the index recorded: the object's size and, when the index
has one, its ETag (sent as ``If-Match``; a changed object is a :class:`StaleIndexError`, never
bytes of another version); a body shorter than asked for is retried, then an error. Failures go
through the one retry policy (:mod:`tarindex._retry`).

obstore's runtime does not survive ``fork``: a process forked after this one used obstore reads
through fsspec instead (with a :class:`~tarindex.errors.TarIndexWarning`); clients and pools are
otherwise made per process.
"""

from __future__ import annotations

import asyncio
import os
import re
import threading
import warnings
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, BinaryIO, TypeAlias, TypeGuard

from . import hub
from ._blockcache import BlockCache, CachedReader
from ._http import RangeReader, _Retrying
from ._process import FORK
from ._ranges import coalesce
from ._retry import RETRYABLE_STATUS, Transient
from .errors import ShardNotFoundError, SourceError, StaleIndexError, TarIndexError, TarIndexWarning
from .naming import ObjectStore, ShardRef
from .options import SourceOptions

if TYPE_CHECKING:
    from obstore import GetOptions

__all__: list[str] = []  # internal module: its names serve the package, the public API is tarindex.__all__

_OBSTORE_PID: list[int] = []  # the process whose obstore runtime started (obstore's runtime is not fork-safe)
_STORES: dict[tuple[int, str, str, str], Any] = {}
_STORES_LOCK = threading.Lock()


def split_url(url: str) -> tuple[str, str, str]:
    """``scheme://bucket/key`` -> ``(scheme, bucket, key)`` (``az://account/container/key``: the bucket
    is ``account/container`` only when the URL names an account host; else ``container``)."""
    ref = ShardRef.of(url)
    bucket, _, key = ref.path.partition("/")
    return ref.scheme, bucket, key



def _obstore_usable() -> bool:
    """Whether obstore works in this process (it does unless a parent process used it before ``fork``)."""
    return not _OBSTORE_PID or _OBSTORE_PID[0] == os.getpid()


def _store_config(store: ObjectStore | None, storage_options: Mapping[str, Any], timeout: float) -> dict[str, Any]:
    """obstore's configuration from ``storage_options``: obstore's own keys, plus s3fs's common ones
    (``key``, ``secret``, ``token``, ``anon``, ``endpoint_url``, ``client_kwargs``) translated."""
    opts = dict(storage_options)
    client = dict(opts.pop("client_options", {}) or {})
    config: dict[str, Any] = {}
    if store == "s3":
        kwargs = dict(opts.pop("client_kwargs", {}) or {})
        aliases = {"key": "access_key_id", "secret": "secret_access_key", "token": "session_token", "region_name": "region"}
        for old, new in aliases.items():
            if old in opts:
                config[new] = opts.pop(old)
            if old in kwargs:
                config[new] = kwargs.pop(old)
        endpoint = opts.pop("endpoint_url", None) or kwargs.pop("endpoint_url", None)
        if endpoint:
            config["endpoint"] = endpoint
        if opts.pop("anon", False):
            config["skip_signature"] = True
        endpoint = config.get("endpoint") or os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT")
        if endpoint and ShardRef.of(str(endpoint)).cleartext:
            client.setdefault("allow_http", True)
            config.setdefault("virtual_hosted_style_request", False)
    config.update(opts)
    client.setdefault("timeout", f"{max(1, int(timeout))}s")
    client.setdefault("connect_timeout", "10s")
    client.setdefault("pool_max_idle_per_host", "256")
    config["client_options"] = client
    # tarindex's retry policy is the only one: obstore's own retries off
    config["retry_config"] = {
        "max_retries": 0,
        "backoff": {"init_backoff": timedelta(seconds=0.1), "max_backoff": timedelta(seconds=1), "base": 2.0},
        "retry_timeout": timedelta(seconds=max(1.0, timeout)),
    }
    return config


def _store(url: str, options: SourceOptions) -> tuple[Any, str]:
    """This process's obstore store for ``url``'s bucket, and the object's path in it.

    Raises:
        SourceError: obstore is not installed, or the options are not obstore's.
    """
    try:
        from obstore.store import from_url
    except ImportError as exc:
        raise SourceError(url, 0, "obstore is not installed: pip install 'tarindex[remote]'") from exc
    scheme, bucket, key = split_url(url)
    opts = repr(sorted(options.storage_options.items()))
    cache_key = (FORK[0], scheme, bucket, opts + repr(options.timeout))
    with _STORES_LOCK:
        store = _STORES.get(cache_key)
        if store is None:
            try:
                store = from_url(f"{scheme}://{bucket}", **_store_config(ShardRef.of(url).store, options.storage_options, options.timeout))
            except Exception as exc:
                raise SourceError(url, 0, f"cannot make an object-store client: {_first_line(exc)}") from exc
            _STORES[cache_key] = store
    return store, key


def _mark_obstore_used() -> None:
    if not _OBSTORE_PID:
        _OBSTORE_PID.append(os.getpid())


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


_STATUS = re.compile(r"status code: (\d{3})|status: (\d{3})")


def _obstore_error(exc: Exception, url: str, offset: int) -> Exception:
    """The tarindex error (or a retryable :class:`Transient`) for an obstore exception."""
    import obstore.exceptions as oe

    text = str(exc)
    if isinstance(exc, FileNotFoundError):  # obstore's NotFoundError
        return ShardNotFoundError(f"{url}: no such shard (the object does not exist)")
    if isinstance(exc, oe.PreconditionError):
        return StaleIndexError(url, "the object's ETag differs from the one indexed")
    if "169.254.169.254" in text or "credential" in text.lower() or isinstance(exc, oe.UnauthenticatedError):
        return SourceError(
            url,
            offset,
            "no credentials for this store (set e.g. AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
            "GOOGLE_APPLICATION_CREDENTIALS or AZURE_STORAGE_ACCOUNT_KEY, or pass storage_options=; "
            "a public bucket: storage_options={'anon': True})",
        )
    if isinstance(exc, oe.PermissionDeniedError) or re.search(r"status code: 40[13]", text):
        return SourceError(url, offset, f"access denied: {_first_line(exc)}")
    if "Connection refused" in text:
        return ConnectionRefusedError(_first_line(exc))
    m = _STATUS.search(text)
    status = int(m.group(1) or m.group(2)) if m else None
    if status is not None and status not in RETRYABLE_STATUS and 400 <= status < 500:
        return SourceError(url, offset, _first_line(exc))
    return Transient(_first_line(exc))  # 5xx, 429, timeouts, connections cut: retried


class _ObjectReader:
    """Random reads of one remote object of the indexed ``size`` (and ETag, where known): one request a
    read, retried by ``options.retry``; the subclass makes the request (:meth:`_get_once`)."""

    def __init__(self, url: str, options: SourceOptions, *, size: int, etag: str | None) -> None:
        self.url = url
        self.options = options
        self.policy = options.retry
        self.size = size
        self.etag = etag

    def _get_once(self, offset: int, size: int) -> bytes:
        raise NotImplementedError

    def _whole(self, data: bytes, offset: int, size: int) -> bytes:
        """``data`` if it holds every byte asked for that the object has.

        Raises:
            Transient: a short body (retried).
        """
        want = max(0, min(size, self.size - offset))
        if len(data) != want:
            raise Transient(f"short body: {len(data)} of {want} bytes")
        return data

    def read_at(self, offset: int, size: int) -> bytes:
        """``size`` bytes at ``offset`` (fewer at the object's end): one request.

        Raises:
            StaleIndexError: the object changed since it was indexed.
            ShardNotFoundError: the object is gone.
            SourceError: no credentials, access denied, or failures after the retries.
        """
        if size <= 0 or offset >= self.size:  # nothing there: no request (a store answers 416)
            return b""
        return self.policy.call(lambda: self._get_once(offset, size), self.url, offset, size)

    def read_many(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """Every ``(offset, size)``, in order, as :func:`read_many` reads a batch: neighbours in one request,
        ``options.max_in_flight`` requests at once.

        Raises:
            StaleIndexError, ShardNotFoundError, SourceError: as :meth:`read_at`, the first one met.
        """
        return read_many([(self, offset, size) for offset, size in ranges], self.options)

    def fileno(self) -> None:
        """``None``: no descriptor's positional reads give these bytes (:class:`tarindex.access.reader.RandomReader`)."""
        return None

    def close(self) -> None:
        """Nothing to close: stores and fsspec filesystems are shared per process."""


class ObjectReader(_ObjectReader):
    """Random reads of one object in ``s3://``/``gs://``/``az://`` through obstore.

    Nothing is requested at open: every read carries the indexed ETag (``If-Match``) and its
    answer's size is compared with the indexed size.
    """

    def _get_options(self, offset: int, size: int) -> GetOptions:
        opts: GetOptions = {"range": (offset, offset + size)}
        if self.etag:
            opts["if_match"] = self.etag
        return opts

    def _check(self, meta: Mapping[str, Any], data: bytes, offset: int, size: int) -> bytes:
        """``data`` if the answer is of the indexed object and complete.

        Raises:
            StaleIndexError: another size or ETag than indexed.
            Transient: a short body (retried).
        """
        if meta.get("size") != self.size:
            raise StaleIndexError(self.url, f"size {self.size} -> {meta.get('size')}")
        if self.etag and meta.get("e_tag") and meta.get("e_tag") != self.etag:
            raise StaleIndexError(self.url, f"ETag {self.etag} -> {meta.get('e_tag')}")
        return self._whole(data, offset, size)

    def _get_once(self, offset: int, size: int) -> bytes:
        import obstore

        store, key = _store(self.url, self.options)
        _mark_obstore_used()
        try:
            result = obstore.get(store, key, options=self._get_options(offset, size))
            data = bytes(result.bytes())
        except Exception as exc:
            error = _obstore_error(exc, self.url, offset)
            gone = isinstance(error, StaleIndexError) and _missing(lambda: obstore.head(store, key))
            raise (self._gone() if gone else error) from exc
        return self._check(result.meta, data, offset, size)

    def _gone(self) -> ShardNotFoundError:
        """A deleted object: some stores (Azure) answer ``If-Match`` on it with 412, not 404; a ``HEAD`` tells."""
        return ShardNotFoundError(f"{self.url}: no such shard (the object does not exist)")

    async def _get_async(self, offset: int, size: int) -> bytes:
        import obstore

        store, key = _store(self.url, self.options)
        try:
            result = await obstore.get_async(store, key, options=self._get_options(offset, size))
            data = bytes(await result.bytes_async())
        except Exception as exc:
            error = _obstore_error(exc, self.url, offset)
            gone = isinstance(error, StaleIndexError) and await _missing_async(obstore.head_async(store, key))
            raise (self._gone() if gone else error) from exc
        return self._check(result.meta, data, offset, size)

    async def read_at_async(self, offset: int, size: int) -> bytes:
        """:meth:`read_at` in an event loop."""
        return await self.policy.call_async(lambda: self._get_async(offset, size), self.url, offset, size)


def _missing(head: Callable[[], object]) -> bool:
    """Whether ``head()`` (a ``HEAD`` of the object) answers that it does not exist."""
    try:
        head()
    except Exception as exc:  # any other answer: the precondition's stands
        return isinstance(exc, FileNotFoundError)
    return False


async def _missing_async(head: Awaitable[object]) -> bool:
    """:func:`_missing` of an awaited ``HEAD``."""
    try:
        await head
    except Exception as exc:  # any other answer: the precondition's stands
        return isinstance(exc, FileNotFoundError)
    return False


class FsspecReader(_ObjectReader):
    """Random reads of any fsspec URL (``hf://``, ``memory://``, ...) with ``cat_file``; the object's
    size is checked once at open, and its ETag or version when the filesystem reports one."""

    def __init__(self, url: str, options: SourceOptions, *, size: int, etag: str | None) -> None:
        super().__init__(url, options, size=size, etag=etag)
        self._fs: Any = None
        self._gen = -1
        self._path = ""
        info = self.policy.call(self._info, url)
        if info.get("size") != size:
            raise StaleIndexError(url, f"size {size} -> {info.get('size')}")
        tag = _fsspec_tag(info)
        if etag and tag and tag != etag:
            raise StaleIndexError(url, f"ETag {etag} -> {tag}")

    def _filesystem(self) -> tuple[Any, str]:
        if self._gen != FORK[0]:
            self._fs, self._path = _fsspec_fs(self.url, self.options)
            self._gen = FORK[0]
        return self._fs, self._path

    def _info(self) -> dict[str, Any]:
        fs, path = self._filesystem()
        try:
            info: dict[str, Any] = fs.info(path)
        except FileNotFoundError as exc:
            raise ShardNotFoundError(f"{self.url}: no such shard") from exc
        return info

    def _get_once(self, offset: int, size: int) -> bytes:
        fs, path = self._filesystem()
        try:
            data = bytes(fs.cat_file(path, start=offset, end=offset + size))
        except FileNotFoundError as exc:
            raise ShardNotFoundError(f"{self.url}: no such shard") from exc
        return self._whole(data, offset, size)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fs": None, "_gen": -1}


Remote: TypeAlias = RangeReader | _ObjectReader
"""A remote shard's reader: HTTP (:class:`RangeReader`), or an object through obstore or fsspec (:class:`ObjectReader`,
:class:`FsspecReader`)."""
AnyRemote: TypeAlias = Remote | CachedReader
"""What :func:`open_reader` returns: a :data:`Remote`, or one behind the block cache."""


def _fsspec_fs(url: str, options: SourceOptions) -> tuple[Any, str]:
    """The fsspec filesystem of ``url`` and the path in it.

    Raises:
        SourceError: fsspec (or the protocol's package) is not installed.
    """
    try:
        import fsspec  # type: ignore[import-untyped]  # optional, no stubs
    except ImportError as exc:
        raise SourceError(url, 0, "fsspec is not installed: pip install fsspec and the protocol's package") from exc
    try:
        fs, path = fsspec.core.url_to_fs(url, **dict(options.storage_options))
    except (ImportError, ValueError) as exc:
        raise SourceError(url, 0, f"no fsspec filesystem for this URL ({exc})") from exc
    return fs, path


def _fsspec_tag(info: Mapping[str, Any]) -> str | None:
    tag = info.get("ETag") or info.get("etag") or info.get("generation")
    return str(tag) if tag else None


def open_reader(url: str, *, size: int, etag: str | None, mtime_ns: int, options: SourceOptions) -> AnyRemote:
    """A random reader (``read_at``) for a remote shard, checked against its index entry.

    ``http(s)://``: :class:`RangeReader` (size, and ``Last-Modified`` when both know one, checked at
    open); ``s3://``, ``gs://``, ``az://``: :class:`ObjectReader` (checked on every answer), or
    :class:`FsspecReader` in a process forked after obstore was used; anything else: :class:`FsspecReader`.

    Raises:
        StaleIndexError: the shard's size, ETag or modification time differs from the index.
        ShardNotFoundError: the shard is gone.
        SourceError: the store cannot be reached (after the retries), or no credentials.
    """
    reader = _open_reader(url, size=size, etag=etag, mtime_ns=mtime_ns, options=options)
    if options.cache_dir is None:
        return reader
    return CachedReader(reader, _block_cache(options.cache_dir, options.cache_bytes), f"{url}\0{size}\0{etag or mtime_ns}")


_BLOCK_CACHES: dict[tuple[int, str, int], BlockCache] = {}


def _block_cache(cache_dir: str, cache_bytes: int) -> BlockCache:
    """This process's :class:`BlockCache` of ``cache_dir``."""
    key = (FORK[0], os.path.abspath(cache_dir), cache_bytes)
    cache = _BLOCK_CACHES.get(key)
    if cache is None:
        cache = _BLOCK_CACHES[key] = BlockCache(cache_dir, cache_bytes)
    return cache


def _open_reader(url: str, *, size: int, etag: str | None, mtime_ns: int, options: SourceOptions) -> Remote:
    ref = ShardRef.of(url)
    if ref.kind == "hub":  # the file's resolve URL, with the user's token: a plain HTTP(S) object
        url, options = hub.resolve(url, options)
        ref = ShardRef.of(url)
    if ref.kind == "http":
        reader = RangeReader(url, options)
        try:
            if reader.size >= 0 and reader.size != size:
                raise StaleIndexError(url, f"size {size} -> {reader.size}")
            if etag and reader.etag and reader.etag != etag:
                raise StaleIndexError(url, f"ETag {etag} -> {reader.etag}")
            if reader.mtime_ns and mtime_ns and reader.mtime_ns != mtime_ns:
                raise StaleIndexError.of_mtime(url, mtime_ns, reader.mtime_ns)
        except BaseException:
            reader.close()
            raise
        return reader
    if ref.kind == "object":
        if _obstore_usable():
            return ObjectReader(url, options, size=size, etag=etag)
        _warn_forked(url)
        return FsspecReader(url, _fsspec_options(ref.store, options), size=size, etag=etag)
    return FsspecReader(url, options, size=size, etag=etag)


def _warn_forked(url: str) -> None:
    warnings.warn(
        f"{url}: this process was forked after its parent used obstore, whose runtime does not survive "
        "fork; reading through fsspec instead (slower). Start DataLoader workers with "
        "multiprocessing_context='forkserver' (or 'spawn') to keep obstore",
        TarIndexWarning,
        stacklevel=3,
    )


def _fsspec_options(store: ObjectStore | None, options: SourceOptions) -> SourceOptions:
    """``options`` for fsspec's filesystem of an object store (``None``: another protocol): obstore-only keys left out."""
    keep = {k: v for k, v in options.storage_options.items() if k not in ("client_options", "retry_config")}
    if store == "s3":
        aliases = {"access_key_id": "key", "secret_access_key": "secret", "session_token": "token", "endpoint": "endpoint_url"}
        keep = {aliases.get(k, k): v for k, v in keep.items()}
        keep.pop("virtual_hosted_style_request", None)
        if keep.pop("skip_signature", False):
            keep["anon"] = True
        endpoint = os.environ.get("AWS_ENDPOINT_URL")
        if endpoint and "endpoint_url" not in keep and "client_kwargs" not in keep:
            keep["endpoint_url"] = endpoint
    return options.with_(storage_options=keep)


def is_remote_reader(handle: object) -> TypeGuard[AnyRemote]:
    """Whether a shard handle reads over the network (:func:`read_many` batches its reads)."""
    return isinstance(handle, (_ObjectReader, RangeReader, CachedReader))


# -- batches --------------------------------------------------------------------------------------


def read_many(requests: Sequence[tuple[AnyRemote, int, int]], options: SourceOptions) -> list[bytes]:
    """The bytes of every ``(reader, offset, size)``, in order: ranges of one reader closer than
    ``options.coalesce_gap`` fetched by one request, at most ``options.max_in_flight`` requests in flight.

    With a block cache (:class:`~tarindex._blockcache.CachedReader`), ranges found there are not
    fetched, and fetched ones are added.

    Raises:
        StaleIndexError, ShardNotFoundError, SourceError: the first failure met (no partial batch).
    """
    out: list[bytes | None] = [r.cached(o, n) if isinstance(r, CachedReader) else None for r, o, n in requests]
    missing = [k for k, data in enumerate(out) if data is None]
    if missing:
        got = _read_uncached([(_inner(requests[k][0]), requests[k][1], requests[k][2]) for k in missing], options)
        for k, data in zip(missing, got):
            reader, offset, size = requests[k]
            if isinstance(reader, CachedReader):
                reader.store(offset, size, data)
            out[k] = data
    return [data if data is not None else b"" for data in out]


def _inner(reader: AnyRemote) -> Remote:
    return reader.inner if isinstance(reader, CachedReader) else reader


def _read_uncached(requests: Sequence[tuple[Remote, int, int]], options: SourceOptions) -> list[bytes]:
    """:func:`read_many` without the cache: coalesced per reader, fetched concurrently."""
    by_reader: dict[int, list[int]] = {}
    for k, (reader, _, _) in enumerate(requests):
        by_reader.setdefault(id(reader), []).append(k)
    planned: list[tuple[Remote, int, int, list[int]]] = []  # reader, start, end, request numbers served
    for ks in by_reader.values():
        reader = requests[ks[0]][0]
        for start, end, members in coalesce([(requests[k][1], requests[k][2]) for k in ks], options.coalesce_gap):
            planned.append((reader, start, end, [ks[m] for m in members]))
    fetched = _fetch(planned, options)
    out: list[bytes] = [b""] * len(requests)
    for (_, start, _, served), data in zip(planned, fetched):
        for k in served:
            _, offset, size = requests[k]
            out[k] = data[offset - start : offset - start + size]
    return out


def _fetch(planned: Sequence[tuple[Remote, int, int, list[int]]], options: SourceOptions) -> list[bytes]:
    """Fetch each planned ``(reader, start, end, _)`` range, concurrently per kind of reader."""
    out: list[bytes] = [b""] * len(planned)
    objects = [(k, p[0], p[1], p[2] - p[1]) for k, p in enumerate(planned) if isinstance(p[0], ObjectReader)]
    others = [k for k, p in enumerate(planned) if not isinstance(p[0], ObjectReader)]
    if objects:
        got = _run(_gather([(reader, offset, size) for _, reader, offset, size in objects], options.max_in_flight))
        for (k, *_), data in zip(objects, got):
            out[k] = data
    if others:
        got = RangeReader.fetch_many([(planned[k][0], planned[k][1], planned[k][2] - planned[k][1]) for k in others], options.max_in_flight)
        for k, data in zip(others, got):
            out[k] = data
    return out


async def _gather(ranges: Sequence[tuple[ObjectReader, int, int]], max_in_flight: int) -> list[bytes]:
    limit = asyncio.Semaphore(max(1, max_in_flight))

    async def one(reader: ObjectReader, offset: int, size: int) -> bytes:
        async with limit:
            return await reader.read_at_async(offset, size)

    tasks = [asyncio.ensure_future(one(*r)) for r in ranges]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:  # the first failure ends the batch: nothing keeps running behind it ...
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)  # ... and the loop outlives every answer
        raise


def _run(coro: Any) -> list[bytes]:
    """Run ``coro`` to completion from synchronous code (in a helper thread if this one runs a loop)."""
    _mark_obstore_used()
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        result: list[bytes] = asyncio.run(coro)
        return result
    box: list[Any] = []

    def target() -> None:
        try:
            box.append(asyncio.run(coro))
        except BaseException as exc:  # handed to the caller's thread
            box.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if isinstance(box[0], BaseException):
        raise box[0]
    return list(box[0])


# -- listing --------------------------------------------------------------------------------------

_MAGIC = re.compile(r"[*?[]")


def _glob_regex(pattern: str) -> re.Pattern[str]:
    """A glob over object keys as a regex: ``*`` and ``?`` stop at ``/``, ``**`` crosses it, ``[...]`` a class."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[" and "]" in pattern[i + 2 :]:
            end = pattern.index("]", i + 2)
            body = pattern[i + 1 : end]
            out.append("[" + ("^" + body[1:] if body.startswith("!") else body).replace("\\", "\\\\") + "]")
            i = end + 1
            continue
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out) + r"\Z")


def _glob_directory(key: str) -> str:
    """The deepest directory above a glob's first wildcard (``a/b/`` of ``a/b/c-*.tar``; ``""`` at the top)."""
    first = _MAGIC.search(key)
    return key[: key.rfind("/", 0, first.start() if first else len(key)) + 1]


def glob_urls(url: str, *, storage_options: Mapping[str, Any] | None = None) -> list[str]:
    """The object URLs a glob (``s3://bucket/train-*.tar``) matches, sorted by name.

    Lists the deepest directory above the first wildcard through the store's client (obstore for
    ``s3://``, ``gs://``, ``az://``; fsspec's ``glob`` for other protocols such as ``hf://``).

    Raises:
        SourceError: the store cannot be listed (no credentials, unreachable).
    """
    options = SourceOptions(storage_options=dict(storage_options or {}))
    ref = ShardRef.of(url)
    if ref.kind == "hub":  # the Hub's tree API, with the user's token
        path = hub.parse(url).path
        pattern, prefix = _glob_regex(path), url[: len(url) - len(path)]
        return sorted(prefix + p for p in hub.files(url, _glob_directory(path), options) if pattern.match(p))
    scheme, bucket, key = split_url(url)
    if ref.kind != "object" or not _obstore_usable():
        fs, path = _fsspec_fs(url, options if ref.kind != "object" else _fsspec_options(ref.store, options))
        prefix = ref.prefix
        return sorted(prefix + p.lstrip("/") if not p.startswith(prefix) else p for p in fs.glob(path))
    pattern = _glob_regex(key)
    store, _ = _store(url, options)
    return sorted(f"{scheme}://{bucket}/{path}" for path in _list(store, _glob_directory(key), url, options) if pattern.match(path))


def _list(store: Any, directory: str, url: str, options: SourceOptions) -> list[str]:
    """Every object path under ``directory`` (recursively).

    Raises:
        SourceError: the listing failed after the retries, or no credentials.
    """
    import obstore

    def once() -> list[str]:
        _mark_obstore_used()
        try:
            return [meta["path"] for page in obstore.list(store, directory or None, chunk_size=1000) for meta in page]
        except Exception as exc:
            raise _obstore_error(exc, url, 0) from exc

    return options.retry.call(once, url)


# -- streaming ------------------------------------------------------------------------------------


class _Body:
    """An obstore answer as ``read(n)``/``close()`` for the retry loop of :class:`ObjectSource`."""

    def __init__(self, chunks: Iterator[bytes], url: str, offset: int) -> None:
        self.chunks = chunks
        self.url = url
        self.offset = offset
        self.pending = b""

    def read(self, n: int) -> bytes:
        if not self.pending:
            try:
                self.pending = next(self.chunks, b"")
            except TarIndexError:
                raise
            except Exception as exc:
                raise _obstore_error(exc, self.url, self.offset) from exc
        data, self.pending = self.pending[:n], self.pending[n:]
        self.offset += len(data)
        return data

    def close(self) -> None:
        self.chunks = iter(())


class ObjectSource(_Retrying):
    """A whole object of ``s3://``/``gs://``/``az://`` as a sequential source (streaming, building),
    resumed at the byte reached after a failure, with ``If-Match`` on the first answer's ETag."""

    def __init__(self, url: str, options: SourceOptions | None = None) -> None:
        super().__init__(url, options)
        self.etag: str | None = None

    def _open_at(self, start: int) -> _Body:
        import obstore

        store, key = _store(self.url, self.options)
        _mark_obstore_used()
        get_options: GetOptions = {}
        if start:
            get_options["range"] = {"offset": start}
        if self.etag:
            get_options["if_match"] = self.etag
        try:
            result = obstore.get(store, key, options=get_options or None)
        except Exception as exc:
            error = _obstore_error(exc, self.url, start)
            if isinstance(error, StaleIndexError):
                raise SourceError(self.url, start, "shard changed on the server while it was being read") from exc
            raise error from exc
        meta = result.meta
        if start == 0:
            self.size = int(meta["size"])
            self.etag = meta.get("e_tag")
            modified = meta.get("last_modified")
            self.mtime_ns = int(modified.timestamp()) * 1_000_000_000 if modified is not None else 0
        return _Body(iter(result.stream(min_chunk_size=self.block_size)), self.url, start)


class FsspecSource(_Retrying):
    """Any other ``scheme://`` through :mod:`fsspec` (``s3://``, ``gs://``, ...), reopened at the byte reached."""

    def __init__(self, url: str, options: SourceOptions | None = None) -> None:
        super().__init__(url, options)
        self.storage_options = dict(self.options.storage_options)

    def _open_at(self, start: int) -> BinaryIO:
        try:
            import fsspec  # optional
        except ImportError as exc:
            raise SourceError(self.url, 0, "fsspec is not installed: pip install 'tarindex[s3]'") from exc
        try:
            fs, path = fsspec.core.url_to_fs(self.url, **self.storage_options)
        except (ImportError, ValueError) as exc:
            raise SourceError(self.url, 0, f"no fsspec filesystem for this URL ({exc})") from exc
        try:
            if start == 0:
                info = fs.info(path)
                self.size = info.get("size")
                modified = info.get("LastModified") or info.get("mtime")
                if hasattr(modified, "timestamp"):
                    self.mtime_ns = int(modified.timestamp() * 1e9)
            f: BinaryIO = fs.open(path, "rb", block_size=self.block_size)
        except FileNotFoundError as exc:
            raise ShardNotFoundError(f"{self.url}: no such shard") from exc
        if start:
            f.seek(start)
        return f


def open_stream(url: str, options: SourceOptions) -> _Retrying:
    """A sequential source for an object-store URL: :class:`ObjectSource`, or fsspec's in a process
    forked after obstore was used."""
    if _obstore_usable():
        return ObjectSource(url, options)
    _warn_forked(url)
    return FsspecSource(url, _fsspec_options(ShardRef.of(url).store, options))
