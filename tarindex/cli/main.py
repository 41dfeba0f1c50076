"""The click group; every command lives in its own module, which imports its heavy dependencies on use.

``tarindex --help``, a command's ``--help`` and usage errors import neither numpy nor lmdb (nor
torch): the package facade and the command modules import only click and the error classes at start-up.
"""

from __future__ import annotations

import importlib
import os
import select
import signal
import sys
import threading
from typing import Any

import click

__all__ = ["main"]

COMMANDS = ("build", "merge", "info", "ls", "get", "verify", "compress", "pack", "export")
"""Command names, in the order ``--help`` lists them; ``tarindex.cli.<name>_cmd.command`` is each one."""


class _Group(click.Group):
    """Commands loaded by name (their help comes from the command objects), and the one place that
    turns tarindex errors into exit 1, an interruption into exit 130 and a closed standard output
    (``tarindex ls IDX | head -1``) into a quiet exit 0."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module = importlib.import_module(f"tarindex.cli.{name}_cmd")
        cmd: click.Command = module.command
        return cmd

    def invoke(self, ctx: click.Context) -> Any:
        from ..errors import TarIndexError

        before = _one_interrupt()
        try:
            result = super().invoke(ctx)
            sys.stdout.flush()  # a closed pipe is met here, not in the interpreter's flush at exit
            return result
        except BrokenPipeError:
            if not _stdout_closed():
                raise
            _quiet_stdout()
            sys.exit(0)
        except TarIndexError as exc:
            click.echo(f"tarindex: error: {exc}", err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            from .._atomic import replaced

            written = replaced()  # Ctrl-C after the rename: the new file is whole, and the message says so
            if written:
                click.echo(f"tarindex: interrupted; {', '.join(map(str, written))} was already written whole", err=True)
            else:
                click.echo("tarindex: interrupted; any previous index is unchanged", err=True)
            sys.exit(130)
        finally:
            if before is not None and signal.getsignal(signal.SIGINT) is _interrupted:  # not interrupted: as it was
                signal.signal(signal.SIGINT, before)


def _stdout_closed() -> bool:
    """Whether standard output is a pipe whose reader is gone (``head`` has what it wanted)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    if not hasattr(select, "poll"):  # no poll (Windows): a broken pipe there is the output's
        return True
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def _quiet_stdout() -> None:
    """Point standard output at the null device, so that nothing left in its buffer fails again at exit."""
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, sys.stdout.fileno())
    finally:
        os.close(null)


def _interrupted(signum: int, frame: Any) -> None:
    """The first Ctrl-C stops the command; the ones after it are ignored while it cleans up (stops its workers,
    removes its temporary files) and exits 130 with one line, whatever the number of presses (until the end of
    the process)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def _one_interrupt() -> Any:
    """Install :func:`_interrupted` for SIGINT when Python's default handler is there (in the main thread);
    returns the handler it replaced, or ``None``."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return None
    return signal.signal(signal.SIGINT, _interrupted)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tarindex")
def main() -> None:
    """tarindex: tar shards as a fast random-access dataset.

    Exit codes: 0 ok (also when the reader of the output stops early, as head does), 1 bad or stale
    data, 2 usage, 130 interrupted (Ctrl-C; any previous index is unchanged, unless the new one was already written whole:
    the message says which).
    """


if __name__ == "__main__":
    main()
