"""The platform the package declares: POSIX only, little-endian C paths, the GIL."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent


def test_import_on_windows_fails_with_a_clear_message() -> None:
    code = "import sys; sys.platform = 'win32'; import tarindex"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "ImportError: tarindex runs on POSIX systems only (Linux, macOS); on Windows use it inside WSL"
    )


def test_package_metadata_says_posix() -> None:
    classifiers = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["classifiers"]
    assert "Operating System :: POSIX" in classifiers
    assert not any("Windows" in c or c == "Operating System :: OS Independent" for c in classifiers)


def test_extension_declares_gil_and_byte_order() -> None:
    """The stance is in the module definition (Py_mod_gil exists from Python 3.13; a big-endian host gets an
    ImportError from the extension and the pure-Python path)."""
    source = (ROOT / "tarindex" / "_speedups.c").read_text()
    assert "{Py_mod_gil, Py_MOD_GIL_USED}" in source
    assert "#if PY_BIG_ENDIAN" in source
