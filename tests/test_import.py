"""Importing tarindex never imports torch."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path


def test_import_does_not_load_torch() -> None:
    code = (
        "import sys\n"
        "import tarindex\n"
        "import tarindex.index.reader\n"
        "import tarindex.dataset, tarindex.build, tarindex.decode\n"
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))\n"
        "print('ok', tarindex.__version__)\n"
    )
    result = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok ")


def test_users_type_checker_sees_the_real_types(tmp_path: Path) -> None:
    """mypy --strict over a user's program finds the installed package and every front-door name's real type.

    It runs where a user's would: outside the repository, so tarindex is found the way the environment's
    install provides it (the README's editable install must leave a path mypy can read, not an import hook).
    """
    script = tmp_path / "user_script.py"
    shutil.copy(Path(__file__).parent / "typing" / "user_script.py", script)
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path / "cache"), str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues found in 1 source file" in result.stdout
