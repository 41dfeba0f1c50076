"""The click group; every command lives in its own module and is imported on use."""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

__all__ = ["main"]

_COMMANDS = {
    "build": "Index tar shards (parallel, incremental, atomic).",
    "merge": "Combine partial indexes into one.",
    "info": "Summarise an index: shards, samples, bytes, extensions.",
    "ls": "List samples: key, shard, offset, members.",
    "get": "Write one member's bytes to stdout or a file.",
    "verify": "Check shards against an index (fingerprints; --deep rescans).",
    "compress": "Rewrite a tar as seekable zstd with sample-aligned frames.",
}


class _Group(click.Group):
    """Lazy commands, and the one place that turns tarindex errors into exit 1."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(_COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in _COMMANDS:
            return None
        module = importlib.import_module(f"tarindex.cli.{name}_cmd")
        cmd: click.Command = module.command
        return cmd

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl(list(_COMMANDS.items()))

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
