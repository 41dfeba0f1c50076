"""The command line starts at once: ``--help``, a command's ``--help`` and usage errors import neither
numpy nor lmdb nor torch (nor the zstd codec)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tarindex.cli.main import COMMANDS

HEAVY = ("numpy", "lmdb", "torch", "zstandard")

_PROBE = """
import json, sys
from tarindex.cli.main import main
sys.argv = ["tarindex", *json.loads(sys.argv[1])]
try:
    main()
    code = 0
except SystemExit as exc:
    code = exc.code
sys.stdout.flush()
print("\\n" + json.dumps({"code": code, "modules": sorted({m.split(".")[0] for m in sys.modules})}))
"""


def _start(*args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (os.path.dirname(os.path.dirname(os.path.abspath(__file__))), os.environ.get("PYTHONPATH")) if p)}
    out = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(list(args))], capture_output=True, text=True, env=env, check=True, timeout=60)
    return dict(json.loads(out.stdout.rstrip().rsplit("\n", 1)[-1]), stdout=out.stdout, stderr=out.stderr)


@pytest.mark.parametrize(
    ("args", "code"),
    [(("--help",), 0), (("-h",), 0), (("--version",), 0), (("nosuch",), 2), (("build",), 2), (("info",), 2), (("get", "x"), 2)]
    + [((name, "--help"), 0) for name in COMMANDS],
)
def test_start_up_imports_nothing_heavy(args: tuple[str, ...], code: int) -> None:
    got = _start(*args)
    assert got["code"] == code, got
    assert not set(HEAVY) & set(got["modules"]), (args, set(HEAVY) & set(got["modules"]))


def test_help_lists_every_command_with_its_own_help() -> None:
    """The listing comes from the command objects: each command's first docstring line, one copy."""
    import importlib

    out = _start("--help")["stdout"]
    for name in COMMANDS:
        cmd = importlib.import_module(f"tarindex.cli.{name}_cmd").command
        first = cmd.get_short_help_str(limit=30).rstrip(".")
        line = next(ln for ln in out.splitlines() if ln.strip().startswith(name + " "))
        assert first.split("...")[0][:25] in line, (name, line)


def test_import_tarindex_is_light() -> None:
    code = "import sys, tarindex; print(sorted({m.split('.')[0] for m in sys.modules}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60).stdout
    assert not set(HEAVY[:3]) & set(eval(out)), out  # our own output


def test_compress_defaults_are_the_writers() -> None:
    from tarindex import shard_writer
    from tarindex.cli import compress_cmd

    assert (compress_cmd.DEFAULT_LEVEL, compress_cmd.DEFAULT_FRAME_SIZE) == (shard_writer.DEFAULT_LEVEL, shard_writer.DEFAULT_FRAME_SIZE)
