"""The modules a main flow crosses: ``python tools/walks.py [--dir DIR]``.

Four walks, each traced with ``sys.setprofile`` after every tarindex module is imported (so import-time code
does not count) and the object made: "the first ds[i]" (the first ``ds[i]`` of a ``TarDataset`` over a zstd
shard, which reads the index's records, opens, checks and reads the shard), "ds[i] opening a second shard" (the
index already read and one sample of the first shard read: the first read of the second shard, the walk of
opening a shard), the same over plain tar shards, and "stream a shard" (iterating a ``TarStream`` over a plain tar). Prints,
per walk, how many tarindex modules run a Python function during it, and which. The figures are recorded in
docs/design.md; a walk that crosses fewer modules is one a newcomer follows in fewer files.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import io
import os
import pkgutil
import sys
import tarfile
from collections.abc import Callable
from types import FrameType
from typing import Any

import tarindex
from tarindex import TarDataset, TarStream, build_index
from tarindex.shard_writer import compress_shard


def _import_all() -> None:
    for info in pkgutil.walk_packages(tarindex.__path__, "tarindex."):
        if info.name != "tarindex._speedups":
            importlib.import_module(info.name)


def _modules(run: Callable[[], Any]) -> list[str]:
    """The tarindex modules whose Python functions run during ``run()``."""
    seen: set[str] = set()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            name = frame.f_globals.get("__name__", "")
            if name.startswith("tarindex"):
                seen.add(name)

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return sorted(seen)


def _shard(path: str, n: int = 50) -> None:
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tf:
        for k in range(n):
            for ext, data in (("jpg", os.urandom(2000)), ("cls", str(k).encode())):
                info = tarfile.TarInfo(f"s{k:05d}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dir", default="/tmp/tarindex-walks")
    args = parser.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    plain, zst, zst2 = (os.path.join(args.dir, n) for n in ("a.tar", "a.tar.zst", "b.tar.zst"))
    _shard(plain)
    compress_shard(plain, zst, frame_size=4096)
    compress_shard(plain, zst2, frame_size=4096)
    index = build_index([zst, zst2], index=os.path.join(args.dir, "z.tarindex")).path
    plain2 = os.path.join(args.dir, "b.tar")
    _shard(plain2)
    plain_index = build_index([plain, plain2], index=os.path.join(args.dir, "p.tarindex")).path
    _import_all()

    def first_shard_read(index: str = index) -> TarDataset:
        ds = TarDataset(index)
        ds[3]
        return ds

    walks: dict[str, tuple[Callable[[], Any], Callable[[Any], Any]]] = {  # (made outside the trace, traced)
        "the first ds[i]": (lambda: TarDataset(index), lambda ds: ds[3]),
        "ds[i] opening a second shard": (first_shard_read, lambda ds: ds[-3]),  # a sample of the second shard
        "ds[i] opening a second plain shard": (functools.partial(first_shard_read, plain_index), lambda ds: ds[-3]),
        "stream a shard": (lambda: TarStream(plain), list),
    }
    for name, (make, walk) in walks.items():
        walk(make())  # caches warm, lazy imports made: the second run is the walk
        made = make()
        found = _modules(functools.partial(walk, made))
        print(f"{name}: {len(found)} modules: {', '.join(m.removeprefix('tarindex.') for m in found)}")


if __name__ == "__main__":
    main()
