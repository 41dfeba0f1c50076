"""The one retry policy of every remote read: exponential backoff with full jitter, ``Retry-After`` honoured.

Hundreds of DataLoader workers that fail together must not retry together: each wait is drawn
uniformly from ``[0, min(max_backoff, backoff * 2**(attempt-1))]`` ("full jitter"), and never
shorter than a server's ``Retry-After``. What is retried: throttling and server errors (HTTP 408,
425, 429, 500, 502, 503, 504, raised as :class:`Transient`), timeouts, connections reset or cut
mid-body. What fails at once, in one line: a refused connection, an unknown host, anything that is
already a :class:`~tarindex.errors.TarIndexError` (not found, changed on the server).
"""

from __future__ import annotations

import asyncio
import email.utils
import http.client
import random
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from .errors import SourceError, TarIndexError

__all__ = ["RETRYABLE_STATUS", "RetryPolicy", "Transient", "parse_retry_after"]

T = TypeVar("T")

RETRYABLE_STATUS = frozenset((408, 425, 429, 500, 502, 503, 504))
"""HTTP statuses retried: timeouts, throttling (429, 503 SlowDown) and server errors."""

_MAX_RETRY_AFTER = 300.0  # a server asking for more is answered by failing after the retries instead


class Transient(Exception):
    """A failure worth retrying (an HTTP status in :data:`RETRYABLE_STATUS`), with the server's ``Retry-After``."""

    def __init__(self, what: str, retry_after: float | None = None) -> None:
        super().__init__(what)
        self.retry_after = retry_after


def parse_retry_after(value: str | None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or an HTTP date); ``None`` if absent or bad."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _fatal_network_error(exc: BaseException) -> str | None:
    """A one-line reason for failures that retrying cannot mend, else ``None``."""
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (is the server running, and are host and port right?)"
    if isinstance(exc, socket.gaierror):
        return f"host not found ({exc.strerror or exc})"
    return None


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is a failure that a later try may not repeat."""
    if isinstance(exc, TarIndexError) or _fatal_network_error(exc) is not None:
        return False
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError)):
        return False
    return isinstance(exc, (Transient, OSError, http.client.HTTPException, asyncio.TimeoutError))


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how long to retry a remote read."""

    retries: int = 5
    """Tries after the first one, each after a failure without progress."""
    backoff: float = 0.5
    """Upper bound in seconds of the first wait; doubled on each further failure."""
    max_backoff: float = 30.0
    """Upper bound in seconds of any wait drawn by the policy (``Retry-After`` may ask for more, up to 300 s)."""

    def delay(self, attempt: int, exc: BaseException | None = None) -> float:
        """Seconds to wait before try ``attempt + 1`` (``attempt`` failures so far, from 1)."""
        ceiling = min(self.max_backoff, self.backoff * 2 ** max(0, attempt - 1))
        wait = random.uniform(0.0, ceiling)
        retry_after = getattr(exc, "retry_after", None)
        if retry_after is not None:
            wait = max(wait, min(float(retry_after), _MAX_RETRY_AFTER))
        return wait

    def check(self, exc: BaseException, attempt: int, url: str, offset: int, size: int | None = None) -> None:
        """Raise the error a caller sees if failure number ``attempt`` (from 1) is the last one.

        Raises:
            TarIndexError: ``exc`` itself when it is one (never retried).
            SourceError: a refused connection or an unknown host (at once), or the retries are spent.
            BaseException: ``exc`` itself when it is not a network failure (a bug is not retried).
        """
        if isinstance(exc, TarIndexError):
            raise exc
        where = f"bytes {offset}-{offset + size - 1}: " if size else ""
        fatal = _fatal_network_error(exc)
        if fatal is not None:
            raise SourceError(url, offset, where + fatal) from exc
        if not is_transient(exc):
            raise exc
        if attempt > self.retries:
            raise SourceError(
                url, offset, f"{where}read failed after {self.retries} retries ({type(exc).__name__}: {exc})"
            ) from exc

    def call(self, fn: Callable[[], T], url: str, offset: int = 0, size: int | None = None) -> T:
        """``fn()``, retried under this policy.

        Raises:
            SourceError, TarIndexError: see :meth:`check`.
        """
        attempt = 0
        while True:
            try:
                return fn()
            except Exception as exc:
                attempt += 1
                self.check(exc, attempt, url, offset, size)
                time.sleep(self.delay(attempt, exc))

    async def call_async(self, fn: Callable[[], Awaitable[T]], url: str, offset: int = 0, size: int | None = None) -> T:
        """``await fn()``, retried under this policy (the waits do not block the event loop).

        Raises:
            SourceError, TarIndexError: see :meth:`check`.
        """
        attempt = 0
        while True:
            try:
                return await fn()
            except Exception as exc:
                attempt += 1
                self.check(exc, attempt, url, offset, size)
                await asyncio.sleep(self.delay(attempt, exc))
