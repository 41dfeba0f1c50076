"""The public API: the front door's __all__, public modules, docs/design.md's "Public API" and the generated reference agree."""

from __future__ import annotations

import importlib
import pkgutil
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import tarindex

ROOT = Path(__file__).resolve().parent.parent
# Modules public for the names their __all__ lists (the front door re-exports the names of the second group).
PUBLIC_MODULES = {
    "tarindex.collate", "tarindex.compression", "tarindex.decode", "tarindex.options", "tarindex.sources", "tarindex.zstd", "tarindex.stream", "tarindex.sampler",
}
FRONT_DOOR_MODULES = {
    "tarindex.build", "tarindex.dataset", "tarindex.errors", "tarindex.export", "tarindex.index.reader", "tarindex.packing", "tarindex.shard_writer",
    "tarindex.verify",
}
# The index format is being replaced (format 4); its modules' __all__ narrow when it lands.
PENDING = {"tarindex.index.format", "tarindex.index.records", "tarindex.index.writer"}


def _modules() -> dict[str, ModuleType]:
    found = {}
    for info in pkgutil.walk_packages(tarindex.__path__, "tarindex."):
        if info.name != "tarindex._speedups" and not info.name.startswith("tarindex.cli"):
            found[info.name] = importlib.import_module(info.name)
    return found


def _design_section() -> str:
    """The code block of docs/design.md's "Public API" section."""
    text = (ROOT / "docs" / "design.md").read_text()
    section = text[text.index("## Public API") :]
    return section[section.index("```python") : section.index("```\n", section.index("```python") + 3)]


def test_front_door_names_resolve() -> None:
    for name in tarindex.__all__:
        assert getattr(tarindex, name) is not None, name
    for module in FRONT_DOOR_MODULES:
        names = set(importlib.import_module(module).__all__)
        assert names <= set(tarindex.__all__), (module, names - set(tarindex.__all__))


def test_internal_modules_export_nothing() -> None:
    """A module outside the public ones is internal: its __all__ is empty (or its name says so with a leading _)."""
    for name, module in _modules().items():
        if name in PUBLIC_MODULES | FRONT_DOOR_MODULES | PENDING or name.rsplit(".", 1)[1].startswith("_"):
            continue
        assert getattr(module, "__all__", []) == [], f"{name}.__all__ = {module.__all__}: internal modules export nothing"


def test_design_public_api_matches_all() -> None:
    section = _design_section()
    documented = set(re.findall(r"\btarindex\.(\w+(?:\.\w+)*)", section))
    modules = {m.removeprefix("tarindex.") for m in PUBLIC_MODULES | FRONT_DOOR_MODULES}
    front = {n for n in documented if "." not in n and n not in modules}
    assert front == set(tarindex.__all__), (front - set(tarindex.__all__), set(tarindex.__all__) - front)
    for dotted in documented - front:
        module, _, name = dotted.rpartition(".")
        if not module:
            continue
        assert f"tarindex.{module}" in PUBLIC_MODULES, dotted
        assert name in importlib.import_module(f"tarindex.{module}").__all__, dotted
    for module in PUBLIC_MODULES:
        for name in importlib.import_module(module).__all__:
            listed = f"{module}.{name}" in section or name in tarindex.__all__
            assert listed, f"{module}.{name} is public but docs/design.md does not list it"


def test_reference_builds_strictly_from_the_public_names(tmp_path: Path) -> None:
    """mkdocs --strict: a docstring that does not parse, a parameter it names that does not exist, a broken link fail."""
    site = tmp_path / "site"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    page = (site / "api" / "index.html").read_text()
    anchors = set(re.findall(r'id="(tarindex[\w.]*)"', page))
    missing = {f"tarindex.{n}" for n in tarindex.__all__ if n != "__version__"} - anchors
    assert not missing, f"the reference lacks {sorted(missing)}"
    for module in PUBLIC_MODULES - {"tarindex.stream", "tarindex.sampler"}:
        names = {f"{module}.{n}" for n in importlib.import_module(module).__all__ if not n.isupper() and n != "DecodeMode"}
        assert names <= anchors, f"the reference lacks {sorted(names - anchors)}"
