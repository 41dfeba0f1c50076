"""The typed C boundary: _speedups.pyi against the compiled module (every name, every arity), and init()."""

from __future__ import annotations

import ast
import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zstandard

from conftest import require_c_extension
from tarindex._native import ReaderConfig
from tarindex.errors import CorruptFrameError, IndexFormatError

STUB = Path(__file__).resolve().parent.parent / "tarindex" / "_speedups.pyi"


@pytest.fixture(scope="module")
def speedups() -> Any:
    require_c_extension()
    from tarindex._native import SPEEDUPS

    return SPEEDUPS


def _stub() -> dict[str, ast.FunctionDef | ast.ClassDef]:
    return {n.name: n for n in ast.parse(STUB.read_text()).body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}


def _stub_constants() -> set[str]:
    body = ast.parse(STUB.read_text()).body
    return {n.target.id for n in body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


def _members(cls: ast.ClassDef) -> dict[str, ast.FunctionDef | ast.AnnAssign]:
    out: dict[str, ast.FunctionDef | ast.AnnAssign] = {}
    for node in cls.body:
        if isinstance(node, ast.FunctionDef):
            out[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = node
    return out


def _public(names: list[str]) -> set[str]:
    return {n for n in names if not n.startswith("__")}


def test_every_name_is_declared_and_exists(speedups: Any) -> None:
    stub = _stub()
    assert set(stub) | _stub_constants() == _public(dir(speedups)), "the .pyi and the module name different functions and types"
    for name, node in stub.items():
        if isinstance(node, ast.ClassDef):
            declared = _public(list(_members(node)))
            assert declared == _public(list(vars(getattr(speedups, name)))), name


def _arity(fn: ast.FunctionDef, method: bool) -> tuple[int, int]:
    positional = [*fn.args.posonlyargs, *fn.args.args][1 if method else 0 :]
    return len(positional) - len(fn.args.defaults), len(positional)


def _check_arity(label: str, call: Any, fn: ast.FunctionDef, method: bool) -> None:
    """Calls with one positional argument too many, and one too few, fail on the count, not later."""
    low, high = _arity(fn, method)
    with pytest.raises(TypeError, match="argument"):
        call(*[None] * (high + 1))
    if low:
        with pytest.raises(TypeError, match="argument"):
            call(*[None] * (low - 1))
    assert label


def _instances(speedups: Any, tmp_path: Path) -> dict[str, Any]:
    shard = tmp_path / "empty.zst"
    shard.write_bytes(b"")
    fd = os.open(shard, os.O_RDONLY)
    frames = np.zeros((0, 4), np.uint64)
    zreader = speedups.ZstdReader(
        str(shard), fd, frames, zstandard.ZstdDecompressor, CorruptFrameError, zstandard.ZstdError, speedups.FrameCache(1 << 20)
    )
    return {
        "Reader": speedups.Reader.__new__(speedups.Reader),
        "Packer": speedups.Packer(lambda name: None, lambda *a: ValueError(a), "s.tar", 0),
        "FrameCache": speedups.FrameCache(1 << 20),
        "ZstdReader": zreader,
    }


def test_every_arity_matches(speedups: Any, tmp_path: Path) -> None:
    instances = _instances(speedups, tmp_path)
    for name, node in _stub().items():
        if isinstance(node, ast.FunctionDef):
            _check_arity(name, getattr(speedups, name), node, method=False)
            continue
        for member, decl in _members(node).items():
            if not isinstance(decl, ast.FunctionDef) or any(isinstance(d, ast.Name) and d.id == "property" for d in decl.decorator_list):
                continue
            if member == "__init__":
                _check_arity(name, getattr(speedups, name), decl, method=True)
            elif not member.startswith("__"):
                _check_arity(f"{name}.{member}", getattr(instances[name], member), decl, method=True)
    instances["ZstdReader"].close()


def test_properties_are_properties(speedups: Any) -> None:
    for name, node in _stub().items():
        if isinstance(node, ast.ClassDef):
            for member, decl in _members(node).items():
                attribute = isinstance(decl, ast.AnnAssign) or any(
                    isinstance(d, ast.Name) and d.id == "property" for d in decl.decorator_list
                )
                if attribute:
                    assert hasattr(vars(getattr(speedups, name))[member], "__get__"), f"{name}.{member}"
                    assert not callable(vars(getattr(speedups, name))[member]), f"{name}.{member}"


def test_error_classes_are_handed_in(speedups: Any) -> None:
    """The extension imports no Python module: its error classes come from init(), and a Reader needs them."""
    with pytest.raises(TypeError, match="exception class"):
        speedups.init(index_format_error=int)
    speedups.init(index_format_error=IndexFormatError)
    code = (
        "import sys\n"
        "from tarindex import _speedups\n"
        "try:\n"
        "    _speedups.Reader(None)\n"
        "except RuntimeError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert "init() was not called" in out.stdout


def test_the_reader_checks_the_view_runs(speedups: Any, tmp_path: Path) -> None:
    """A view's runs (tarindex/view.py) reach the C reader checked: within the index, from 0, no empty run."""
    from conftest import make_shard_set
    from tarindex import TarDataset, build_index

    paths = make_shard_set(tmp_path / "d", n_shards=3, per=10)
    build_index(paths, workers=1)
    ds = TarDataset([str(paths[2]), str(paths[0])])
    assert [ds[i]["__key__"] for i in (0, 10)] == ["s02i000", "s00i000"]
    config = ReaderConfig(ds._blocks.payload, ds._blocks.block_samples, 30, tuple(ds._exts), ds.urls.names, ds._opener, ds._read_py, IndexFormatError, [0])
    runs = np.array([0, 10, 20], np.uint64).tobytes(), np.array([20, 0], np.uint64).tobytes()
    assert speedups.Reader(dataclasses.replace(config, runs=runs)) is not None
    for view, index in [
        ([0, 10, 20], [25, 0]),  # a run past the index's end
        ([1, 10, 20], [20, 0]),  # not from 0
        ([0, 10, 10], [20, 0]),  # an empty run
        ([0, 10], [20, 0]),  # one start short
    ]:
        with pytest.raises(ValueError, match="the view's runs do not fit the index"):
            speedups.Reader(dataclasses.replace(config, runs=(np.array(view, np.uint64).tobytes(), np.array(index, np.uint64).tobytes())))


def test_constants_shared_with_python_are_equal(speedups: Any) -> None:
    """What C and Python both hard-code is defined on each side once and checked equal here."""
    from tarindex import tar
    from tarindex.index import records

    assert records.HEADER.size == speedups.BLOCK_HEAD
    assert speedups.TAR_BLOCK == tar.BLOCK
    assert speedups.TAR_MAX_SIZE == tar.MAX_MEMBER_SIZE
    assert speedups.TAR_WINDOW_LARGE == tar._WINDOW
    assert speedups.TAR_WINDOW_SMALL == tar._SMALL_WINDOW
    assert 0 < speedups.READER_MAX_MEMBERS <= records.MAX_MEMBERS  # the C reader's own bound: more go to the Python path


def test_the_backend_is_chosen_in_one_place() -> None:
    """No module but tarindex._native keeps a reference to the extension: turning it off is one attribute."""
    code = (
        "import importlib, pkgutil, sys, tarindex\n"
        "for info in pkgutil.walk_packages(tarindex.__path__, 'tarindex.'):\n"
        "    if info.name != 'tarindex._speedups':\n"
        "        importlib.import_module(info.name)\n"
        "held = sorted(f'{m}.{a}' for m, mod in list(sys.modules.items()) if m.startswith('tarindex.') and m != 'tarindex._speedups'\n"
        "              for a, v in vars(mod).items()\n"
        "              if 'tarindex._speedups' in (getattr(v, '__name__', None), getattr(v, '__module__', None), type(v).__module__))\n"
        "print(held)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TARINDEX_PURE_PYTHON"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True, env=env)
    assert out.stdout.strip() == "['tarindex._native.SPEEDUPS']"
