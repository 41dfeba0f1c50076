"""Every shell and Python example of README.md and docs/*.md runs, against a small generated data set.

A doctest-style runner (``tests/docs_runner.py``): each documentation file's fenced ```` ```python ````
and ```` ```shell ```` (``sh``, ``bash``) blocks run in order, in a fresh copy of the data set, with
``tarindex`` and ``python`` on the ``PATH`` taken from this tree and ``HOME`` inside the copy. An HTML
comment on the line before a block changes what happens to it:

- ``<!-- docs-test: skip (why) -->``: not run (it needs a remote store, makes a virtual environment...);
  the reason is required.
- ``<!-- docs-test: setup: COMMAND -->``: a shell command run before the block (files it needs that
  the page does not make).

The data set: ``data/train-000000.tar`` ... ``data/train-000099.tar``, two samples each, keys
``000000`` ... ``000199`` (the global sample number), members ``jpg`` (a real JPEG), ``cls`` and
``json``, and ``data/train.tarindex`` built over them. Fenced blocks without a language are text
(diagrams, output); one that starts like a command must say what it is (``shell`` or ``text``).
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from docs_runner import jpeg

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL = {"shell", "sh", "bash"}
_FENCE = re.compile(r"^```(\S*)\s*$")
_MARK = re.compile(r"^<!--\s*docs-test:\s*(skip|setup:)\s*(.*?)\s*-->\s*$")
_COMMAND_LIKE = re.compile(r"^(\$ |tarindex |python|pip |PYTHONPATH=|_TARINDEX_COMPLETE=|zstd |tar )")


@dataclass(frozen=True)
class Block:
    """One fenced block of a documentation file."""

    path: str
    """The file, relative to the repository root."""
    line: int
    """The first line of the code (1-based)."""
    lang: str
    """``python``, ``shell``, or the fence's word (empty: text)."""
    code: str
    skip: str | None
    """Why the block is not run, when a comment says so."""
    setup: str | None
    """A shell command to run first, when a comment says so."""


def blocks(doc: Path) -> list[Block]:
    """The fenced blocks of ``doc``, with the ``docs-test`` comment before each, if any.

    Raises:
        ValueError: a fence left open, or a ``skip`` without a reason.
    """
    lines = doc.read_text(encoding="utf-8").splitlines()
    rel = str(doc.relative_to(ROOT))
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        start = i + 1
        end = next((j for j in range(start, len(lines)) if lines[j].strip() == "```"), None)
        if end is None:
            raise ValueError(f"{rel}:{i + 1}: fenced block never closed")
        skip = setup = None
        mark = _MARK.match(lines[i - 1]) if i > 0 else None
        if mark is not None:
            kind, arg = mark.groups()
            if kind == "skip":
                if not arg.strip("() "):
                    raise ValueError(f"{rel}:{i}: 'docs-test: skip' needs a reason in parentheses")
                skip = arg.strip("() ")
            else:
                setup = arg
        lang = m.group(1).lower()
        lang = "shell" if lang in SHELL else lang
        out.append(Block(rel, start + 1, lang, "\n".join(lines[start:end]) + "\n", skip, setup))
        i = end + 1
    return out


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The data set every page starts from (a fresh copy per page), and the bin/ directory."""
    from tarindex import build_index

    root = tmp_path_factory.mktemp("docs-data")
    data = root / "data"
    data.mkdir()
    for s in range(100):
        with tarfile.open(data / f"train-{s:06d}.tar", "w", format=tarfile.GNU_FORMAT) as tf:
            for j in range(2):
                n = 2 * s + j
                for ext, payload in (("jpg", jpeg(n)), ("cls", str(n % 10).encode()), ("json", json.dumps({"n": n}).encode())):
                    ti = tarfile.TarInfo(f"{n:06d}.{ext}")
                    ti.size = len(payload)
                    ti.mtime = 1_700_000_000
                    tf.addfile(ti, io.BytesIO(payload))
    build_index(str(data / "train-*.tar"), index=data / "train.tarindex", workers=1)
    return root


def _bin(directory: Path) -> Path:
    """``tarindex`` and ``python`` commands that run this tree, as an install would."""
    directory.mkdir()
    (directory / "tarindex").write_text(
        f"#!{sys.executable}\nimport sys\nfrom tarindex.cli.main import main\nsys.exit(main())\n"
    )
    (directory / "python").symlink_to(sys.executable)
    mode = (directory / "tarindex").stat().st_mode
    (directory / "tarindex").chmod(mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return directory


def test_every_command_like_block_says_what_it_is() -> None:
    untagged = [
        f"{b.path}:{b.line}"
        for doc in DOCS
        for b in blocks(doc)
        if not b.lang and _COMMAND_LIKE.match(b.code.lstrip())
    ]
    assert untagged == [], "fenced blocks that look like commands: tag them ```shell (or ```text for output)"


def test_markers_are_read() -> None:
    readme = blocks(ROOT / "README.md")
    assert readme[0].lang == "shell" and readme[0].skip and "virtual environment" in readme[0].skip
    zstd = [b for b in blocks(ROOT / "docs" / "zstd.md") if b.setup]
    assert zstd and zstd[0].setup is not None and zstd[0].setup.startswith("zstd ")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_examples_run(doc: Path, dataset: Path, tmp_path: Path) -> None:
    runnable = [b for b in blocks(doc) if b.skip is None and b.lang in ("python", "shell")]
    if not runnable:
        return  # a page without examples (nothing to run is not a failure of the page)
    work = tmp_path / "work"
    shutil.copytree(dataset, work, copy_function=os.link)  # hard links: shards are never written in place
    (work / "home").mkdir()
    spec = tmp_path / "blocks.json"
    spec.write_text(json.dumps([b.__dict__ for b in runnable]))
    env = {
        **os.environ,
        "PATH": f"{_bin(tmp_path / 'bin')}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
        "HOME": str(work / "home"),
    }
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "docs_runner.py"), str(spec)],
        cwd=work, env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
