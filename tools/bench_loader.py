"""Images per second into a training batch (``tools/bench.py --only loader``), every system in one run, alternated.

Two generated sets of natural-looking JPEGs (a 1/f amplitude spectrum, as photos have, with some
grain; quality 90): ``jpeg256`` (256x256, ~25 KB) and ``imagenet`` (500x375, ~110 KB, ImageNet-like).
On ``jpeg256``, to 128x128 RGB ``uint8`` tensors in ``DataLoader(batch_size=32)`` at 1 and 2 workers:
the PIL baseline (decode, resize to 128x128, tensor; ``TarDataset`` and ``TarStream``), webdataset and
wids with the same baseline, and ``tarindex.decode.Image(128)`` (``TarDataset`` batches and
``TarStream.batched``). On ``imagenet``, 224x224: PIL decode + a RandomResizedCrop(224) reference, and
PIL decode + Resize(256) + CenterCrop(224), against ``Image(224, crop="random-resized")`` and
``Image(224, resize=256)``. torchvision cannot be installed beside this torch, so the references are
written here with PIL and torch ops, as torchvision's PIL path computes them (same parameters, same
draws, PIL's bilinear resize). Then the quality: mean PSNR of each ``Image`` against full decode +
the same crop and resize (``exact=True``), and against the two-step references.
"""

from __future__ import annotations

import io
import math
import os
import random
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.utils.data

import tarindex
from tarindex.collate import collate
from tarindex.decode import Image

Row = tuple[str, float, str]
LOADER_SETS = {"jpeg256": (4, 1000, (256, 256), 1.35, 2.0), "imagenet": (2, 1000, (500, 375), 1.1, 8.0)}
"""name: (shards, samples per shard, (width, height), spectrum exponent, grain)."""
BATCH = 32


# -- data ------------------------------------------------------------------------------------------


def _natural(rng: np.random.Generator, w: int, h: int, alpha: float, grain: float) -> np.ndarray:
    """A picture with a natural image's 1/f amplitude spectrum (smooth areas, edges, texture) plus grain."""
    fy = np.fft.fftfreq(h)[:, None]
    fx = np.fft.rfftfreq(w)[None, :]
    f = np.sqrt(fx * fx + fy * fy)
    f[0, 0] = 1.0
    chans = [np.fft.irfft2((rng.standard_normal(f.shape) + 1j * rng.standard_normal(f.shape)) / f**alpha, s=(h, w)) for _ in range(3)]
    x = np.stack(chans, -1) @ (rng.normal(0, 1, (3, 3)) * 0.35 + np.eye(3))
    x = (x - x.mean((0, 1))) / (x.std() + 1e-9)
    return np.clip(128 + 45 * x + rng.normal(0, grain, x.shape), 0, 255).astype(np.uint8)


def make_loader_set(root: Path, name: str) -> list[str]:
    """The set's shards (jpg + cls + json per sample), made once and reused."""
    from bench import make_set
    from PIL import Image as PIL

    n_shards, per, (w, h), alpha, grain = LOADER_SETS[name]

    def jpeg(rng: np.random.Generator) -> tuple[str, bytes]:
        out = io.BytesIO()
        PIL.fromarray(_natural(rng, w, h, alpha, grain)).save(out, "JPEG", quality=90)
        return "jpg", out.getvalue()

    return make_set(root, name, n_shards, per, (0, 1), main=jpeg)


# -- the references (what a user writes with PIL and torchvision) -------------------------------------


def _tensor(im: Any) -> torch.Tensor:
    """torchvision's PILToTensor: uint8 CHW."""
    return torch.from_numpy(np.array(im.convert("RGB"))).permute(2, 0, 1)


def _open(data: bytes) -> Any:
    from PIL import Image as PIL

    im = PIL.open(io.BytesIO(data))
    im.load()
    return im


def resize128(data: bytes) -> torch.Tensor:
    """The baseline: decode, resize to 128x128 (bilinear), tensor."""
    from PIL import Image as PIL

    return _tensor(_open(data).convert("RGB").resize((128, 128), PIL.Resampling.BILINEAR))


def random_resized_crop224(data: bytes) -> torch.Tensor:
    """PIL decode + RandomResizedCrop(224) as torchvision computes it on a PIL image (its draws from
    torch's generator: ten tries at scale (0.08, 1) and ratio (3/4, 4/3), else the clamped center),
    then crop and bilinear resize, tensor."""
    from PIL import Image as PIL

    im = _open(data).convert("RGB")
    width, height = im.size
    area = width * height
    log_ratio = torch.log(torch.tensor([3 / 4, 4 / 3]))
    box = None
    for _ in range(10):
        target = area * torch.empty(1).uniform_(0.08, 1.0).item()
        aspect = math.exp(torch.empty(1).uniform_(float(log_ratio[0]), float(log_ratio[1])).item())
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            i = int(torch.randint(0, height - h + 1, size=(1,)).item())
            j = int(torch.randint(0, width - w + 1, size=(1,)).item())
            box = (j, i, j + w, i + h)
            break
    if box is None:
        side = min(width, height)
        box = ((width - side) // 2, (height - side) // 2, (width + side) // 2, (height + side) // 2)
    return _tensor(im.crop(box).resize((224, 224), PIL.Resampling.BILINEAR))


def _resize256_center224(im: Any) -> Any:
    """Resize(256) (shorter side, torchvision's rounding of the longer) then CenterCrop(224), on a PIL image."""
    from PIL import Image as PIL

    w, h = im.size
    nw, nh = (256, int(256 * h / w)) if w <= h else (int(256 * w / h), 256)
    im = im.resize((nw, nh), PIL.Resampling.BILINEAR)
    top, left = round((nh - 224) / 2.0), round((nw - 224) / 2.0)
    return im.crop((left, top, left + 224, top + 224))


def center224(data: bytes) -> torch.Tensor:
    return _tensor(_resize256_center224(_open(data).convert("RGB")))


class Transform:
    """A sample dict to ``{"image", "label"}`` through one of the reference functions (picklable)."""

    def __init__(self, fn: Callable[[bytes], torch.Tensor], ext: str = "jpg") -> None:
        self.fn, self.ext = fn, ext

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        label = sample.get("cls", sample.get(".cls", b"0"))
        return {"image": self.fn(sample[self.ext]), "label": int(label)}


class WidsView(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """wids samples (``.jpg`` keys) through a reference transform."""

    def __init__(self, shards: list[str], per_shard: int, fn: Callable[[bytes], torch.Tensor]) -> None:
        self.shards, self.per_shard, self.fn = shards, per_shard, fn
        self._ds: Any = None

    def __len__(self) -> int:
        return len(self.shards) * self.per_shard

    def __getitem__(self, i: int) -> dict[str, Any]:
        if self._ds is None:
            import wids

            spec = [{"url": u, "nsamples": self.per_shard} for u in self.shards]
            self._ds = wids.ShardListDataset(spec, localname=lambda url: url, lru_size=len(spec), transformations=[])
        s = self._ds[i]
        return {"image": self.fn(s[".jpg"].getvalue() if hasattr(s[".jpg"], "getvalue") else s[".jpg"]), "label": int(s[".cls"].getvalue() if hasattr(s[".cls"], "getvalue") else s[".cls"])}


def _count(batch: Any) -> int:
    if isinstance(batch, dict):
        return len(batch["label"] if "label" in batch else batch["__key__"])
    return len(batch[1])


# -- runs ------------------------------------------------------------------------------------------


def _pass(make: Callable[[], Any], expected: int) -> float:
    """Samples/s of one pass over a fresh DataLoader, in steady state: from the first batch's arrival to the
    last one's (the workers' start and the first batch left out: they cost the same to every system)."""
    n = 0
    first = 0
    t0 = t1 = time.perf_counter()
    for batch in make():
        if n == 0:
            first = _count(batch)
            t0 = time.perf_counter()
        n += _count(batch)
        t1 = time.perf_counter()
    if n != expected:
        raise RuntimeError(f"a pass gave {n} samples, not {expected}")
    return (n - first) / (t1 - t0)


def _loader(ds: Any, workers: int, **kw: Any) -> Callable[[], Any]:
    return lambda: torch.utils.data.DataLoader(ds, num_workers=workers, persistent_workers=False, **kw)


def _systems_256(paths: list[str], index: Path, subset: list[int], per: int) -> dict[str, tuple[Callable[[], Any], int]]:
    """name -> (a fresh loader, samples per pass), for the 128x128 comparison on the first shards."""
    n = len(subset)
    shards = paths[: n // per]
    ours = tarindex.TarDataset(index, decode=Image(128))
    base = tarindex.TarDataset(index, transform=Transform(resize128))
    out: dict[str, tuple[Callable[[], Any], int]] = {}
    for w in (1, 2):
        out[f"PIL baseline, TarDataset, {w} worker(s)"] = (_loader(base, w, sampler=subset, batch_size=BATCH), n)
        out[f"Image(128), TarDataset batches, {w} worker(s)"] = (_loader(ours, w, sampler=subset, batch_size=BATCH, collate_fn=collate), n)
        out[f"PIL baseline, TarStream, {w} worker(s)"] = (_loader(tarindex.TarStream(shards).map(Transform(resize128)), w, batch_size=BATCH), n)
        out[f"Image(128), TarStream.batched(32), {w} worker(s)"] = (_loader(tarindex.TarStream(shards).decode(Image(128)).batched(BATCH), w, batch_size=None), n)
        try:
            import webdataset as wds

            web = wds.WebDataset(shards, shardshuffle=False, empty_check=False).map(Transform(resize128))
            out[f"webdataset + PIL baseline, {w} worker(s)"] = (_loader(web, w, batch_size=BATCH), n)
        except ImportError:
            pass
        try:
            import wids  # noqa: F401

            out[f"wids + PIL baseline, {w} worker(s)"] = (_loader(WidsView(shards, per, resize128), w, sampler=subset, batch_size=BATCH), n)
        except ImportError:
            pass
    return out


def _systems_imagenet(index: Path, subset: list[int]) -> dict[str, tuple[Callable[[], Any], int]]:
    n = len(subset)
    out: dict[str, tuple[Callable[[], Any], int]] = {}
    rrc = tarindex.TarDataset(index, decode=Image(224, crop="random-resized"))
    center = tarindex.TarDataset(index, decode=Image(224, resize=256))
    rrc_base = tarindex.TarDataset(index, transform=Transform(random_resized_crop224))
    center_base = tarindex.TarDataset(index, transform=Transform(center224))
    for w in (1, 2):
        out[f"PIL + RandomResizedCrop(224) reference, {w} worker(s)"] = (_loader(rrc_base, w, sampler=subset, batch_size=BATCH), n)
        out[f"Image(224, crop='random-resized'), {w} worker(s)"] = (_loader(rrc, w, sampler=subset, batch_size=BATCH, collate_fn=collate), n)
        out[f"PIL + Resize(256) + CenterCrop(224) reference, {w} worker(s)"] = (_loader(center_base, w, sampler=subset, batch_size=BATCH), n)
        out[f"Image(224, resize=256), {w} worker(s)"] = (_loader(center, w, sampler=subset, batch_size=BATCH, collate_fn=collate), n)
    one = tarindex.TarDataset(index, decode=Image(224, crop="random-resized", threads=1))
    out["Image(224, crop='random-resized', threads=1), 1 worker(s)"] = (_loader(one, 1, sampler=subset, batch_size=BATCH, collate_fn=collate), n)
    return out


def _alternate(systems: dict[str, tuple[Callable[[], Any], int]], rounds: int) -> dict[str, float]:
    """Samples/s per system: the best of ``rounds`` passes, the systems taken in turn each round."""
    best = dict.fromkeys(systems, 0.0)
    for _ in range(rounds):
        for name, (make, n) in systems.items():
            best[name] = max(best[name], _pass(make, n))
    return best


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return 99.0 if mse == 0 else 10 * math.log10(255**2 / mse)


def quality(datas: list[bytes]) -> Iterator[tuple[str, float]]:
    """Mean PSNR of the reduced decode against the full one (same crop and resize), and against the two-step references."""
    cases = [("Image(128) vs full decode + the same resize", Image(128, output="numpy"), 256),
             ("Image(224, crop='random-resized') vs full decode + the same crop and resize", Image(224, crop="random-resized", output="numpy"), 500),
             ("Image(224, resize=256) vs full decode + the same crop and resize", Image(224, resize=256, output="numpy"), 500)]
    for label, image, width in cases:
        subset = [d for d in datas if _open(d).size[0] == width][:200]
        if not subset:
            continue
        exact = Image(image.size, crop=image.crop, resize=image.resize, output="numpy", exact=True)
        yield label, float(np.mean([_psnr(image(d, {"__index__": k}), exact(d, {"__index__": k})) for k, d in enumerate(subset)]))
        if image.resize == 256:
            two_step = [_psnr(image(d), np.asarray(_resize256_center224(_open(d).convert("RGB")))) for d in subset]
            yield "Image(224, resize=256) vs PIL Resize(256) then CenterCrop(224) (two resizes' rounding)", float(np.mean(two_step))
        if width == 256:
            from PIL import Image as PIL

            base = [_psnr(image(d), np.asarray(_open(d).convert("RGB").resize((128, 128), PIL.Resampling.BILINEAR))) for d in subset]
            yield "Image(128) vs the PIL baseline (full decode, resize to 128x128)", float(np.mean(base))


def _first_jpegs(paths: list[str], n: int) -> list[bytes]:
    out = []
    with tarfile.open(paths[0]) as tf:
        for m in tf:
            if m.name.endswith(".jpg"):
                out.append(tf.extractfile(m).read())  # type: ignore[union-attr]
                if len(out) == n:
                    break
    return out


def _pillow_image(*args: Any, **kw: Any) -> Image:
    """An Image that decodes JPEGs through PIL (TARINDEX_JPEG=pillow while it is made)."""
    before = os.environ.get("TARINDEX_JPEG")
    os.environ["TARINDEX_JPEG"] = "pillow"
    try:
        return Image(*args, **kw)
    finally:
        if before is None:
            del os.environ["TARINDEX_JPEG"]
        else:
            os.environ["TARINDEX_JPEG"] = before


def _one_process(name: str, datas: list[bytes]) -> list[Row]:
    """Per-image cost in one process, one thread (no DataLoader, no scheduling between processes), alternated,
    best of five: each pipeline against its PIL reference, Image with its default JPEG decoder (simplejpeg where
    installed) and with PIL's (TARINDEX_JPEG=pillow)."""
    if name == "jpeg256":
        fns: dict[str, Callable[..., Any]] = {
            "PIL full decode + resize to 128": resize128,
            "Image(128)": Image(128, threads=1),
            "Image(128), TARINDEX_JPEG=pillow": _pillow_image(128, threads=1),
        }
        pairs = {label: "PIL full decode + resize to 128" for label in fns}
    else:
        rrc, center = "PIL + RandomResizedCrop(224) reference", "PIL + Resize(256) + CenterCrop(224) reference"
        fns = {rrc: random_resized_crop224, "Image(224, crop='random-resized')": Image(224, crop="random-resized", threads=1),
               "Image(224, crop='random-resized'), TARINDEX_JPEG=pillow": _pillow_image(224, crop="random-resized", threads=1),
               center: center224, "Image(224, resize=256)": Image(224, resize=256, threads=1),
               "Image(224, resize=256), TARINDEX_JPEG=pillow": _pillow_image(224, resize=256, threads=1)}
        pairs = {label: (rrc if "random" in label else center) for label in fns if label.startswith("Image")}
    best = dict.fromkeys(fns, math.inf)
    for _ in range(5):
        for label, fn in fns.items():
            t0 = time.perf_counter()
            for k, d in enumerate(datas):
                fn(d, {"__index__": k}) if isinstance(fn, Image) else fn(d)
            best[label] = min(best[label], time.perf_counter() - t0)
    return [
        (f"{name}, one process, one thread: {label} (images/s)", len(datas) / t, f"{best[pairs[label]] / t:.2f}x {pairs[label]}" if label in pairs and pairs[label] != label else "")
        for label, t in best.items()
    ]


def bench_loader(root: Path, work: Path, rounds: int = 3, chart: Path | None = None) -> list[Row]:
    """Every row of the loader benchmark (see the module doc); a PNG chart when matplotlib is installed."""
    rows: list[Row] = []
    figures: dict[str, dict[str, float]] = {}
    for name in LOADER_SETS:
        paths = make_loader_set(root / name, name)
        index = tarindex.build_index(paths, index=work / f"{name}.tarindex").path
        per = LOADER_SETS[name][1]
        subset = list(range(len(paths) * per))  # every shard, in random order (half of the samples of the larger images)
        random.Random(0).shuffle(subset)
        if name == "imagenet":
            subset = subset[:per]
        datas = _first_jpegs(paths, 200)
        rows += _one_process(name, datas)
        systems = _systems_256(paths, index, subset, per) if name == "jpeg256" else _systems_imagenet(index, subset)
        got = _alternate(systems, rounds)
        figures[name] = got
        for system, rate in got.items():
            rows.append((f"{name}: {system} (images/s)", rate, _ratio(system, got)))
        for label, value in quality(datas):
            rows.append((f"{name}: mean PSNR, {label} (dB)", value, "target >= 32 dB" if "vs full decode" in label else ""))
    if chart is not None:
        _chart(figures, chart)
    return rows


def _ratio(system: str, got: dict[str, float]) -> str:
    """The ratio against the row it is measured against: the baseline of the same workers, and the best peer."""
    workers = system.rsplit(", ", 1)[-1]
    rate = got[system]
    if system.startswith("Image(128), TarDataset") or system.startswith("Image(128), TarStream"):
        base = got[f"PIL baseline, TarDataset, {workers}"]
        peers = [v for k, v in got.items() if k.endswith(workers) and (k.startswith("webdataset") or k.startswith("wids"))]
        text = f"{rate / base:.2f}x the PIL baseline (TarDataset)"
        if peers:
            text += f", {rate / max(peers):.2f}x the best peer; target >= 2x both"
        if workers == "1 worker(s)":
            text += "; one worker: target >= 1.6x"
        return text
    if system.startswith("Image(224, crop='random-resized')") and "threads=1" not in system:
        return f"{rate / got[f'PIL + RandomResizedCrop(224) reference, {workers}']:.2f}x the reference; target >= 1.5x"
    if system.startswith("Image(224, resize=256)"):
        return f"{rate / got[f'PIL + Resize(256) + CenterCrop(224) reference, {workers}']:.2f}x the reference; target >= 1.8x"
    if "threads=1" in system:
        return f"the thread pool's share: threads=2 is {got[system.replace(', threads=1', '')] / rate:.2f}x this"
    return ""


def _chart(figures: dict[str, dict[str, float]], out: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not installed: no chart at {out}")
        return
    fig, axes = plt.subplots(1, len(figures), figsize=(7 * len(figures), 5.5))
    for ax, (name, got) in zip(np.atleast_1d(axes), figures.items()):
        labels = list(got)
        colors = ["tab:green" if k.startswith("Image(") else "tab:gray" for k in labels]
        ax.barh(range(len(labels)), [got[k] for k in labels], color=colors)
        ax.set_yticks(range(len(labels)), [k.replace(" worker(s)", "w") for k in labels], fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("images/s (DataLoader, batch_size=32)")
        ax.set_title(name)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"chart: {out}")


if __name__ == "__main__":  # python tools/bench_loader.py [--dir bench-data]: the same as bench.py --only loader --sets ''
    import argparse

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dir", default="bench-data", type=Path)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--chart", type=Path, default=Path(__file__).resolve().parent.parent / "docs" / "loader.png")
    args = ap.parse_args()
    (args.dir / "work").mkdir(parents=True, exist_ok=True)
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")
    print("| measurement | value | ratio |\n|---|---|---|")
    for label, value, ratio in bench_loader(args.dir, args.dir / "work", args.rounds, args.chart):
        print(f"| {label} | {value:,.2f} | {ratio} |", flush=True)
