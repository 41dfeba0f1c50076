"""Importing tarindex never imports torch."""

from __future__ import annotations

import subprocess
import sys


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
