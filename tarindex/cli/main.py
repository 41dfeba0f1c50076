"""The click group; every command lives in its own module, which imports its heavy dependencies on use.

``tarindex --help``, a command's ``--help`` and usage errors import neither numpy nor lmdb (nor
torch): the package facade and the command modules import only click and the error classes at start-up.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

__all__ = ["main"]

COMMANDS = ("build", "merge", "info", "ls", "get", "verify", "compress", "pack", "export")
"""Command names, in the order ``--help`` lists them; ``tarindex.cli.<name>_cmd.command`` is each one."""


class _Group(click.Group):
    """Commands loaded by name (their help comes from the command objects), and the one place that
    turns tarindex errors into exit 1."""

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

        try:
            return super().invoke(ctx)
        except TarIndexError as exc:
            click.echo(f"tarindex: error: {exc}", err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            click.echo("tarindex: interrupted; any previous index is unchanged", err=True)
            sys.exit(130)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tarindex")
def main() -> None:
    """tarindex: tar shards as a fast random-access dataset.

    Exit codes: 0 ok, 1 bad or stale data, 2 usage.
    """


if __name__ == "__main__":
    main()
