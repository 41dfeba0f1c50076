"""Which process are we in: a counter that changes in every forked child.

Cheaper than ``os.getpid()`` (a system call) on per-sample paths: objects
remember the value they attached under and re-attach when it differs.
"""

from __future__ import annotations

import os

__all__ = ["FORK"]

FORK = [1]
"""``FORK[0]``: this process's generation; never 0 or negative (those mean "not attached")."""


def _child() -> None:
    FORK[0] += 1


os.register_at_fork(after_in_child=_child)
