"""Run the examples of one documentation file, in order, in the current directory (tests/test_docs.py).

Usage: ``python docs_runner.py BLOCKS.json``. The JSON holds a list of blocks, each
``{"path": "docs/x.md", "line": 12, "lang": "python" | "shell", "code": "...", "setup": "shell command" | null}``
(``line``: the first line of the code in the file, so that tracebacks point into the documentation).

Python blocks share one namespace per file (as doctest does); from the first block that mentions
torch on, they run as rank 0 of a one-process ``torch.distributed`` job (gloo), as under ``torchrun``; the names that examples leave to the reader
(``epoch``, ``augment``, ``items``, ...) are defined in :data:`PLACEHOLDERS`. Shell blocks run with
``bash -e -o pipefail``. The first failing block ends the run: exit status 1, with the block's place
in the documentation and its output.
"""

from __future__ import annotations

import glob
import io
import json
import os
import subprocess
import sys
import traceback
from typing import Any


def jpeg(i: int) -> bytes:
    """A small real JPEG (8x8 pixels), a little different for each ``i``."""
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (8, 8), (i % 256, 0, 0)).save(out, format="JPEG")
    return out.getvalue()


# The names that examples use and leave to the reader, with the smallest values that make them run.
PLACEHOLDERS: dict[str, Any] = {
    "i": 0,
    "epoch": 0,
    "epochs": 1,
    "start_epoch": 0,
    "samples_the_loop_used": 0,
    "samples_used_this_pass": 0,
    "augment": lambda x: x,
    "train": lambda batch: None,
    "save": lambda obj: None,
    "time_to_checkpoint": lambda: True,
}


def _namespace() -> dict[str, Any]:
    ns: dict[str, Any] = {"__name__": "__docs__", **PLACEHOLDERS}
    ns["urls"] = sorted(glob.glob("data/train-*.tar"))
    ns["items"] = [(jpeg(i), i % 10) for i in range(20)]
    return ns


def _shell(where: str, code: str) -> bool:
    done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", code], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        print(f"{where}: shell block failed (exit {done.returncode})\n{code}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}")
        return False
    return True


def main() -> int:
    with open(sys.argv[1]) as f:
        blocks = json.load(f)
    ns: dict[str, Any] | None = None
    for block in blocks:
        where, code = f"{block['path']}:{block['line']}", block["code"]
        if block.get("setup") and not _shell(f"{where} (setup)", block["setup"]):
            return 1
        if block["lang"] == "shell":
            if not _shell(where, code):
                return 1
            continue
        if ns is None:
            ns = _namespace()
        if "torch" in code and not _distributed():  # torch is imported only by pages that use it
            import torch.distributed as dist

            dist.init_process_group("gloo", init_method=f"file://{os.path.abspath('.dist-init')}", rank=0, world_size=1)
        try:
            exec(compile("\n" * (block["line"] - 1) + code, block["path"], "exec"), ns)
        except Exception:
            print(f"{where}: python block failed\n{code}\n--- traceback")
            traceback.print_exc(file=sys.stdout)
            return 1
    if _distributed():
        import torch.distributed as dist

        dist.destroy_process_group()
    return 0


def _distributed() -> bool:
    dist = sys.modules.get("torch.distributed")
    return dist is not None and bool(dist.is_available() and dist.is_initialized())  # type: ignore[attr-defined]


if __name__ == "__main__":
    sys.exit(main())
