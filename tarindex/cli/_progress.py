"""The progress line every long command shows on a terminal: what it does, items done of the total, MB/s, ETA.

``build``, ``merge``, ``verify``, ``compress`` and ``pack`` draw it on stderr when stderr is a terminal (and
``-q`` is not given); elsewhere (a pipe, a log file) nothing is drawn.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from dataclasses import KW_ONLY, dataclass, field
from types import TracebackType
from typing import TextIO

from ..errors import counted

__all__ = ["Bar"]

_EVERY = 0.1
"""Seconds between two redraws at most (the last state is always drawn when the bar closes)."""
_WIDTH = 24
"""Characters of the bar itself."""


def clock(seconds: float) -> str:
    """``seconds`` as ``M:SS`` or ``H:MM:SS``."""
    s = int(seconds + 0.5)
    h, rest = divmod(s, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


@dataclass(eq=False)
class Bar:
    """A progress line on stderr: ``label [#####.....] 12/30 shards  145.2 MB/s  ETA 0:12``.

    Thread-safe. Items done without work (:meth:`skip`: shards a build reuses) count towards the total but
    not towards the rates, so the ETA is the work left at the pace of the work done. The ETA follows the
    bytes when the total bytes are known, else the items.

    Args:
        label: what the command does (``"scanning"``); :meth:`relabel` changes it.
        total: items to do (``None``: not known yet; set :attr:`total` when it is).
        unit: the items' noun (``"shard"``).
        total_bytes: bytes to do, when known.
        show: draw at all (a terminal, no ``-q``); a hidden bar only counts.
        item_rate: show items per second too (``1,234 samples/s``).
        file: where the bar is drawn (stderr).
    """

    label: str
    total: int | None
    unit: str
    _: KW_ONLY
    total_bytes: int | None = None
    show: bool = True
    item_rate: bool = False
    file: TextIO = field(default_factory=lambda: sys.stderr)
    done: int = field(default=0, init=False)
    """Items done (worked or skipped)."""
    worked: int = field(default=0, init=False)
    """Items done with work (not skipped)."""
    nbytes: int = field(default=0, init=False)
    """Bytes of work done."""
    start: float = field(default_factory=time.monotonic, init=False)
    _drawn: float = field(default=0.0, init=False)
    _width: int = field(default=0, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __enter__(self) -> Bar:
        self._draw(force=True)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def advance(self, items: int = 0, nbytes: int = 0) -> None:
        """``items`` done with work, ``nbytes`` of it."""
        with self._lock:
            self.done += items
            self.worked += items
            self.nbytes += nbytes
            self._draw()

    def skip(self, items: int) -> None:
        """``items`` done without work (found unchanged): in the count, not in the rates."""
        with self._lock:
            self.done += items
            self._draw()

    def relabel(self, label: str) -> None:
        """Say what the command does now (``"writing index"``), drawn at once."""
        with self._lock:
            self.label = label
            self._draw(force=True)

    def close(self) -> None:
        """Draw the final state and end the line."""
        with self._lock:
            if self.show and self._width:
                self._draw(force=True)
                self.file.write("\n")
                self.file.flush()
            self.show = False

    def line(self) -> str:
        """The line as it would be drawn now."""
        elapsed = max(time.monotonic() - self.start, 1e-9)
        total = self.total
        parts = [self.label]
        if total:
            filled = min(_WIDTH, _WIDTH * self.done // total)
            parts.append("[" + "#" * filled + "." * (_WIDTH - filled) + "]")
            parts.append(f"{self.done}/{counted(total, self.unit)}")
        else:
            parts.append(counted(self.done, self.unit))
        if self.item_rate and self.worked:
            parts.append(f"{self.worked / elapsed:,.0f} {self.unit}s/s")
        if self.nbytes:
            parts.append(f"{self.nbytes / elapsed / 1e6:,.1f} MB/s")
        if total is not None and self.done >= total:
            parts.append(f"in {clock(elapsed)}")
        else:
            eta = self._eta(elapsed)
            parts.append(f"ETA {clock(eta)}" if eta is not None else "ETA --")
        return "  ".join(parts)

    def _eta(self, elapsed: float) -> float | None:
        """Seconds left at the pace of the work done: by bytes when their total is known, else by items."""
        if self.total_bytes is not None and self.nbytes:
            return max(self.total_bytes - self.nbytes, 0) * elapsed / self.nbytes
        if self.total is not None and self.worked:
            return max(self.total - self.done, 0) * elapsed / self.worked
        return None

    def _draw(self, force: bool = False) -> None:
        if not self.show:
            return
        now = time.monotonic()
        if not force and now - self._drawn < _EVERY:
            return
        self._drawn = now
        text = self.line()[: max(shutil.get_terminal_size().columns - 1, 20)]
        self.file.write("\r" + text.ljust(self._width))
        self.file.flush()
        self._width = len(text)
