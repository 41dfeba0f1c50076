"""Bad inputs tried by class, the outcome of each case counted: ``python tools/reliability.py [--dir D] [--only A,B]``.

Each class runs in its own process (a crash or hang is counted, not fatal) inside a sandbox directory; every
case must end in a named error (a ``TarIndexError``) or in exactly the bytes ``tarfile`` extracts from the
shard as it is now. Also counted: commands run (marker files a hostile name would create), files written or
deleted outside the place asked for (the sandbox is listed before and after, the asked place left out).
Results: a markdown table on stdout, recorded in docs/reliability.md.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

CLASSES = ("names", "index_meta", "cache", "changed", "writes", "threads")
MARK = "PWNED"


def shard(path: Path, tag: str, n: int = 6) -> Path:
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tf:
        for i in range(n):
            for ext, data in (("txt", f"{tag} {i}".encode()), ("bin", os.urandom(300 + 97 * i))):
                ti = tarfile.TarInfo(f"{tag}{i:03d}.{ext}")
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
    return path


def oracle(paths: list[str]) -> list[tuple[str, bytes, bytes]]:
    out = []
    for p in paths:
        with tarfile.open(p) as tf:
            members = {m.name: tf.extractfile(m).read() for m in tf if m.isreg()}  # type: ignore[union-attr]
        keys = sorted({n.split(".")[0] for n in members}, key=lambda k: list(members).index(f"{k}.txt"))
        out += [(k, members[f"{k}.txt"], members[f"{k}.bin"]) for k in keys]
    return out


def listing(root: Path, skip: Path | None = None) -> dict[str, int]:
    out = {}
    for p in root.rglob("*"):
        if skip is not None and (p == skip or skip in p.parents):
            continue
        if p.is_file():
            out[str(p.relative_to(root))] = p.stat().st_size
    return out


def outcome(fn: Callable[[], Any]) -> str:
    """``named`` (a TarIndexError), ``exact`` (fn returned True), ``wrong`` (False) or ``unnamed:<type>``."""
    import tarindex

    try:
        return "exact" if fn() else "wrong"
    except tarindex.TarIndexError:
        return "named"
    except Exception as exc:
        return f"unnamed:{type(exc).__name__}"


def read_all(ds: Any) -> list[tuple[str, bytes, bytes]]:
    return [(s["__key__"], bytes(s["txt"]), bytes(s["bin"])) for s in (ds[i] for i in range(len(ds)))]


def stream_all(st: Any) -> list[tuple[str, bytes, bytes]]:
    return [(s["__key__"], bytes(s["txt"]), bytes(s["bin"])) for s in st]


# -- classes: each yields (case name, function returning True for exact bytes) -----------------------


def names(root: Path) -> Iterator[tuple[str, Callable[[], bool]]]:
    """Shard files whose names read as commands, stdin, URLs or shell, matched by a glob."""
    import tarindex
    from tarindex.cli.main import main

    hostile = [f"pipe:touch {MARK}; cat a.tar #.tar", "-", "pipe:", f"a;touch {MARK}.tar", f"$(touch {MARK}).tar",
               f"`touch {MARK}`.tar", f"a|touch {MARK}.tar", "http:x.tar", "s3:x.tar", " lead.tar", "new\nline.tar",
               f"pipe:touch {MARK}|.tar"]  # fmt: skip
    for k, name in enumerate(hostile):
        d = root / f"n{k}"
        d.mkdir()
        shard(d / name, "h")
        shard(d / "z-000000.tar", "z")
        os.chdir(d)
        pattern = "?" if name == "-" else "[!x]*"  # every shard, not the index
        files = sorted(str(p.name) for p in d.iterdir())
        expected = oracle([f"./{f}" for f in files])

        def build(pattern: str = pattern) -> bool:
            from click.testing import CliRunner

            r = CliRunner().invoke(main, ["build", "-q", "-w", "1", "-o", "x.tarindex", pattern] + ([] if pattern != "?" else ["z-000000.tar"]))
            if r.exit_code != 0:
                raise RuntimeError(r.output)
            return True

        yield f"build {name!r}", build
        yield f"verify {name!r}", lambda: tarindex.verify_index("x.tarindex") is not None
        yield f"TarDataset {name!r}", lambda e=expected: read_all(tarindex.TarDataset("x.tarindex")) == e  # type: ignore[misc]
        yield f"TarStream(index) {name!r}", lambda e=expected: stream_all(tarindex.TarStream("x.tarindex")) == e  # type: ignore[misc]
        if pattern != "?":
            yield f"TarStream(glob) {name!r}", lambda e=expected, p=pattern: stream_all(tarindex.TarStream(p)) == e  # type: ignore[misc]


def edit_shard(index: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    """The first shard record of ``index`` changed by ``edit`` and sealed again (its checksum recomputed)."""
    import lmdb

    from tarindex.index.format import SHARDS_PREFIX
    from tarindex.index.pages import numbered, seal, unseal

    key = numbered(SHARDS_PREFIX, 0)
    env = lmdb.open(str(index), subdir=False, lock=False)
    try:
        with env.begin(write=True) as txn:
            records = json.loads(bytes(unseal(txn.get(key), key, str(index))))
            edit(records[0])
            txn.put(key, seal(key, json.dumps(records).encode()))
    finally:
        env.close()


def index_meta(root: Path) -> Iterator[tuple[str, Callable[[], bool]]]:
    """An index's shard entries edited: paths that leave its directory, commands, kinds, fingerprints, sizes."""
    import tarindex

    (root / "outside.tar").write_bytes(shard(root / "o.tar", "o").read_bytes())
    edits: list[tuple[str, dict[str, Any]]] = [
        ("path ../outside.tar", {"path": "../outside.tar"}),
        ("path sub/../../outside.tar", {"path": "sub/../../outside.tar"}),
        ("path absolute", {"path": str(root / "outside.tar")}),
        ("path /etc/passwd", {"path": "/etc/passwd"}),
        ("path pipe:touch", {"path": f"pipe:touch {root / MARK}"}),
        ("path pipe: (no kind)", {"path": f"pipe:touch {root / MARK}", "kind": None}),
        ("path - (no kind)", {"path": "-", "kind": None}),
        ("kind command, a file's path", {"kind": "command"}),
        ("kind url, a file's path", {"kind": "url"}),
        ("kind url, http path", {"kind": "url", "path": "http://127.0.0.1:9/x.tar"}),
        ("kind bogus", {"kind": "bogus"}),
        ("path empty", {"path": ""}),
        ("path with NUL", {"path": "a\0b.tar"}),
        ("path a number", {"path": 7}),
        ("outside true, escaping", {"path": "../outside.tar", "outside": True}),
        ("fingerprint ../OUTSIDE_CACHE", {"fingerprint": "../OUTSIDE_CACHE", "random_access": False, "compression": "zstd"}),
        ("fingerprint absolute", {"fingerprint": str(root / "FP"), "random_access": False, "compression": "zstd"}),
        ("fingerprint empty", {"fingerprint": "", "random_access": False, "compression": "zstd"}),
        ("size negative", {"size": -1}),
        ("size string", {"size": "../x"}),
    ]
    for k, (what, change) in enumerate(edits):
        d = root / f"m{k}"
        d.mkdir()
        s = shard(d / "a-000000.tar", "a")
        index = tarindex.build_index([str(s)], index=d / "a.tarindex", workers=1).path

        def apply(record: dict[str, Any], change: dict[str, Any] = change) -> None:
            for key, value in change.items():
                if value is None:
                    record.pop(key, None)
                else:
                    record[key] = value

        edit_shard(index, apply)
        expected = oracle([str(root / "outside.tar" if change.get("outside") else s)])  # built outside: it names that file
        yield f"TarDataset, {what}", lambda i=index, e=expected, d=d: read_all(tarindex.TarDataset(i, zstd_cache_dir=d / "cache")) == e  # type: ignore[misc]
        yield f"TarStream, {what}", lambda i=index, e=expected: stream_all(tarindex.TarStream(i)) == e  # type: ignore[misc]
        yield f"verify, {what}", lambda i=index: tarindex.verify_index(i) is not None  # type: ignore[misc]


def cache(root: Path) -> Iterator[tuple[str, Callable[[], bool]]]:
    """The zstd decompressed-shard cache pointed at directories holding the user's files."""
    import tarindex

    big = root / "big"
    big.mkdir()
    tars = []
    for k in range(3):
        p = big / f"one-{k}.tar"
        with tarfile.open(p, "w", format=tarfile.GNU_FORMAT) as tf:
            for i in range(1000):
                for ext, data in (("txt", f"{k} {i}".encode() * 2), ("bin", f"sample {k} {i} ".encode() * 1000)):
                    ti = tarfile.TarInfo(f"c{k}{i:04d}.{ext}")
                    ti.size = len(data)
                    tf.addfile(ti, io.BytesIO(data))
        subprocess.run(["zstd", "-q", "-1", "-f", str(p), "-o", f"{p}.zst"], check=True)
        tars.append(p)
    for k, layout in enumerate(["data dir", "data dir with a user tarindex-zstd", "home-like dir", "cache dir is a shard dir"]):
        c = root / f"c{k}"
        c.mkdir()
        for j in range(3):
            shard(c / f"user-{j}.tar", "u")
        if k == 1:
            (c / "tarindex-zstd").mkdir()
            (c / "tarindex-zstd" / "mine.tar").write_bytes(b"user data")
        where = c if k != 3 else big
        user = {p: p.read_bytes() for p in [*c.rglob("*"), *big.glob("one-*")] if p.is_file()}
        for t in tars:
            ix = tarindex.build_index([f"{t}.zst"], index=root / f"c{k}-{t.name}.tarindex", workers=1).path
            yield f"{layout}: read {t.name}.zst", lambda ix=ix, t=t, w=where: read_all(  # type: ignore[misc]
                tarindex.TarDataset(ix, zstd_cache_dir=w, zstd_cache_bytes=40 << 20)
            )[:50] == oracle([str(t)])[:50]
        yield f"{layout}: the user's {len(user)} files intact", lambda u=user: all(p.read_bytes() == b for p, b in u.items())  # type: ignore[misc]


def changed(root: Path) -> Iterator[tuple[str, Callable[[], bool]]]:
    """Shards changed after indexing: appended, truncated, bytes changed with or without the mtime, copies."""
    import tarindex

    def variant(name: str, change: Callable[[Path], None]) -> Iterator[tuple[str, Callable[[], bool]]]:
        d = root / name.replace(" ", "_")
        d.mkdir()
        s = shard(d / "a-000000.tar", "a")
        index = tarindex.build_index([str(s)], index=d / "a.tarindex", workers=1).path
        change(d)
        target = d if (d / "a.tarindex").exists() else d / "copy"
        current = [str(target / "a-000000.tar")]
        yield f"TarDataset, {name}", lambda: read_all(tarindex.TarDataset(target / "a.tarindex")) == oracle(current)
        yield f"TarDataset fingerprint, {name}", lambda: read_all(tarindex.TarDataset(target / "a.tarindex", verify="fingerprint")) == oracle(current)
        yield f"verify, {name}", lambda: tarindex.verify_index(target / "a.tarindex") is not None
        del index

    def rewrite(at: int, keep_mtime: bool) -> Callable[[Path], None]:
        def go(d: Path) -> None:
            p = d / "a-000000.tar"
            st = p.stat()
            data = bytearray(p.read_bytes())
            data[at % len(data)] ^= 1
            p.write_bytes(bytes(data))
            if keep_mtime:
                os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
            else:
                os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))

        return go

    def append(d: Path) -> None:
        with open(d / "a-000000.tar", "ab") as f:
            f.write(bytes(512))

    def to_directory(d: Path) -> None:
        os.unlink(d / "a-000000.tar")
        (d / "a-000000.tar").mkdir()

    def copy(d: Path) -> None:
        (d / "copy").mkdir()
        for p in (d / "a-000000.tar", d / "a.tarindex"):
            shutil.copyfile(p, d / "copy" / p.name)  # new mtimes, same bytes
        os.unlink(d / "a.tarindex")

    cases: list[tuple[str, Callable[[Path], None]]] = [
        ("appended 512 bytes", append),
        ("truncated by half", lambda d: os.truncate(d / "a-000000.tar", (d / "a-000000.tar").stat().st_size // 2)),
        ("truncated to 0", lambda d: os.truncate(d / "a-000000.tar", 0)),
        ("data byte changed, new mtime", rewrite(512 + 3, False)),
        ("header byte changed, new mtime", rewrite(5, False)),
        ("last byte changed, new mtime", rewrite(-1, False)),
        ("touched only", lambda d: os.utime(d / "a-000000.tar", ns=(1, 1))),
        ("copied (cp: new mtimes)", copy),
        ("removed", lambda d: os.unlink(d / "a-000000.tar")),
        ("replaced by a directory", to_directory),
        ("data byte changed, same size and mtime (documented: only a fingerprint or --deep sees it)", rewrite(512 + 3, True)),
    ]
    for name, change in cases:
        yield from variant(name, change)


def writes(root: Path) -> Iterator[tuple[str, Callable[[], bool]]]:
    """Writing where it cannot be done: a full disk and a read-only directory (tmpfs, as root)."""
    import tarindex

    s = shard(root / "s-000000.tar", "s", n=200)
    for what, options in (("full disk", "size=64k"), ("read-only directory", "ro,size=64k")):
        mnt = root / what.replace(" ", "_")
        mnt.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mnt)], check=True)
        try:
            if "ro" not in options:
                (mnt / "filler").write_bytes(bytes(60 << 10))

            def build(mnt: Path = mnt) -> bool:
                tarindex.build_index([str(s)], index=mnt / "x.tarindex", workers=1)
                return True

            def write_shards(mnt: Path = mnt) -> bool:
                with tarindex.ShardWriter(str(mnt / "w-%06d.tar")) as w:
                    for i in range(100):
                        w.write({"__key__": f"k{i}", "bin": os.urandom(1000)})
                return True

            yield f"build index, {what}", build
            yield f"ShardWriter, {what}", write_shards
            yield f"compress_shard, {what}", lambda mnt=mnt: tarindex.compress_shard(s, mnt / "c.tar.zst") is None  # type: ignore[misc]
            leftovers = [p.name for p in mnt.iterdir() if p.name != "filler"]
            yield f"no partial files, {what}", lambda left=leftovers: left == []  # type: ignore[misc]
        finally:
            subprocess.run(["umount", "-l", str(mnt)], check=True)


def threads(root: Path) -> Iterator[tuple[str, Callable[[], bool]]]:
    """close() racing 8 reading threads, 3 open files for 12 shards; each sample read is one case."""
    import threading

    import numpy as np

    import tarindex

    paths = [str(shard(root / f"t-{k:06d}.tar", f"t{k:02d}")) for k in range(12)]
    expected = oracle(paths)
    for path in ("c", "python"):
        import tarindex._native

        saved = tarindex._native.SPEEDUPS
        if path == "python":
            tarindex._native.SPEEDUPS = None  # the one switch
        ds = tarindex.TarDataset(tarindex.build_index(paths, index=root / f"t-{path}.tarindex", workers=1).path, max_open_files=3)
        got: list[tuple[int, tuple[str, bytes, bytes]]] = []
        stop = threading.Event()

        def reader(k: int, ds: Any = ds, got: list[Any] = got, stop: threading.Event = stop) -> None:
            rng = np.random.default_rng(k)
            while not stop.is_set():
                for i in rng.integers(0, len(ds), 32).tolist():
                    s = ds[i]
                    got.append((i, (s["__key__"], bytes(s["txt"]), bytes(s["bin"]))))

        workers = [threading.Thread(target=reader, args=(k,)) for k in range(8)]
        for w in workers:
            w.start()
        end = time.monotonic() + 3
        while time.monotonic() < end:
            ds.close()
            time.sleep(0.001)
        stop.set()
        for w in workers:
            w.join()
        tarindex._native.SPEEDUPS = saved
        for i, sample in got:
            yield f"{path} read", lambda i=i, s=sample: s == expected[i]  # type: ignore[misc]


# -- driver ------------------------------------------------------------------------------------------


def run_class(name: str, root: Path) -> dict[str, Any]:
    root.mkdir(parents=True)
    sandbox = root.parent
    before = listing(sandbox, skip=root)
    counts: Counter[str] = Counter()
    examples: dict[str, str] = {}
    for case, fn in globals()[name](root):
        result = outcome(fn)
        counts[result.split(":")[0]] += 1
        examples.setdefault(result, case)
    os.chdir(sandbox)
    ran = sum(1 for _ in sandbox.rglob(MARK)) + sum(1 for _ in Path("/").glob(MARK))
    outside = before != listing(sandbox, skip=root)
    return {"counts": dict(counts), "examples": examples, "commands_run": ran, "outside_changed": outside}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", default="/tmp/tarindex-reliability")
    parser.add_argument("--only", default=",".join(CLASSES))
    parser.add_argument("--class", dest="one")
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_class(args.one, Path(args.dir) / args.one)))
        return
    base = Path(args.dir)
    shutil.rmtree(base, ignore_errors=True)
    print("| class | cases | exact bytes | named errors | wrong bytes | unnamed errors | crashes | hangs | commands run | files changed outside |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in args.only.split(","):
        sandbox = base / name
        sandbox.mkdir(parents=True)
        cmd = [sys.executable, __file__, "--class", name, "--dir", str(sandbox)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            print(f"| {name} | | | | | | 0 | 1 | | |")
            continue
        if proc.returncode != 0:
            print(f"| {name} | | | | | | 1 (exit {proc.returncode}) | 0 | | |")
            sys.stderr.write(proc.stderr[-2000:])
            continue
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        c = r["counts"]
        total = sum(c.values())
        print(f"| {name} | {total} | {c.get('exact', 0)} | {c.get('named', 0)} | {c.get('wrong', 0)} | {c.get('unnamed', 0)} | 0 | 0 | {r['commands_run']} | {int(r['outside_changed'])} |")
        for result, case in sorted(r["examples"].items()):
            if result not in ("exact", "named"):
                sys.stderr.write(f"{name}: {result}: {case}\n")


if __name__ == "__main__":
    main()
