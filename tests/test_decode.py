"""Image decoding: tarindex.decode.Image (sizes, crops, DCT-scaled JPEGs, seeded random crops), batches
decoded into one array (TarDataset.__getitems__, TarStream.batched, DataLoader workers, resume), and
webdataset's image specs against webdataset's own decoder."""

from __future__ import annotations

import io
import re
import subprocess
import tarfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.utils.data

import tarindex
from conftest import py_tar, wds_write
from tarindex import DecodeError, TarDataset, TarStream, build_index
from tarindex._image import _dct_scale
from tarindex.collate import collate
from tarindex.decode import IMAGE_SPECS, Decoder, Image
from tarindex.errors import StreamWarning

W, H = 96, 64  # stored width and height of the test images


def _pixels(w: int = W, h: int = H, seed: int = 0) -> np.ndarray:
    """A smooth picture with some texture: gradients plus noise (JPEG-friendly, not flat)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 / w, y * 255 / h, (x + y) * 127 / (w + h) + 60], -1)
    return np.clip(base + rng.normal(0, 12, (h, w, 3)), 0, 255).astype(np.uint8)


def _save(img: Any, fmt: str, **kw: Any) -> bytes:
    out = io.BytesIO()
    img.save(out, fmt, **kw)
    return out.getvalue()


@pytest.fixture(scope="module")
def images() -> dict[str, bytes]:
    """One image per case the docs name: JPEG RGB, gray, CMYK, progressive, EXIF-turned; PNG RGB, RGBA, palette, gray; WebP."""
    from PIL import Image as PIL

    rgb = PIL.fromarray(_pixels())
    exif = PIL.Exif()
    exif[0x0112] = 6  # stored turned: shown upright after a 90-degree clockwise turn
    return {
        "rgb.jpg": _save(rgb, "JPEG", quality=92),
        "gray.jpg": _save(rgb.convert("L"), "JPEG", quality=92),
        "cmyk.jpg": _save(rgb.convert("CMYK"), "JPEG", quality=92),
        "progressive.jpg": _save(rgb, "JPEG", quality=92, progressive=True),
        "exif6.jpg": _save(rgb, "JPEG", quality=92, exif=exif.tobytes()),
        "rgb.png": _save(rgb, "PNG"),
        "rgba.png": _save(PIL.fromarray(np.dstack([_pixels(), _pixels(seed=1)[:, :, :1]])), "PNG"),
        "palette.png": _save(rgb.quantize(64), "PNG"),
        "gray.png": _save(rgb.convert("L"), "PNG"),
        "rgb.webp": _save(rgb, "WEBP", quality=90),
    }


@pytest.fixture(params=["simplejpeg", "pillow"])
def jpeg(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The JPEG decoder of the Image decoders a test makes: simplejpeg (the default where it is
    installed) or PIL (``TARINDEX_JPEG=pillow``)."""
    monkeypatch.setenv("TARINDEX_JPEG", str(request.param))
    assert Image().jpeg == request.param
    return str(request.param)


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return 99.0 if mse == 0 else 10 * np.log10(255**2 / mse)


def _reference(data: bytes, image: Image, ident: int = 0) -> np.ndarray:
    """Full decode (turned upright when asked), the mode, then the same region resized: HWC uint8."""
    from PIL import Image as PIL
    from PIL import ImageOps

    im = PIL.open(io.BytesIO(data))
    if image.exif_orientation:
        im = ImageOps.exif_transpose(im)
    im = im.convert(image.mode or "RGB")
    if image.size is not None:
        oh, ow = image.size
        im = im.resize((ow, oh), PIL.Resampling.BILINEAR, box=image.box(*im.size, ident))
    arr = np.asarray(im)
    return arr[:, :, None] if arr.ndim == 2 else arr


# -- one image ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["rgb.jpg", "gray.jpg", "cmyk.jpg", "progressive.jpg", "exif6.jpg", "rgb.png", "rgba.png", "palette.png", "gray.png", "rgb.webp"])
@pytest.mark.parametrize("mode", ["RGB", "L", "RGBA"])
def test_shapes_dtypes_channels_and_pixels(jpeg: str, images: dict[str, bytes], name: str, mode: str) -> None:
    data = images[name]
    channels = {"RGB": 3, "L": 1, "RGBA": 4}[mode]
    exact = Image((40, 50), mode=mode, exact=True)  # type: ignore[arg-type]
    t = exact(data)
    assert isinstance(t, torch.Tensor) and t.dtype == torch.uint8 and tuple(t.shape) == (channels, 40, 50) and t.is_contiguous()
    np.testing.assert_array_equal(t.permute(1, 2, 0).numpy(), _reference(data, exact))
    a = Image((40, 50), mode=mode, output="numpy")(data)  # type: ignore[arg-type]
    assert a.dtype == np.uint8 and a.shape == (40, 50, channels) and a.flags.writeable
    assert _psnr(a, _reference(data, exact)) > 30  # reduced-scale JPEG decode where it applies
    p = Image((40, 50), mode=mode, output="pil")(data)  # type: ignore[arg-type]
    assert p.size == (50, 40) and p.mode == mode
    full = Image(mode=mode, output="numpy")(data)  # type: ignore[arg-type]
    assert full.shape == (H, W, channels)


def test_simplejpeg_is_the_default_and_pillow_can_be_forced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TARINDEX_JPEG", raising=False)
    assert Image().jpeg == "simplejpeg"  # installed with the test extra
    monkeypatch.setenv("TARINDEX_JPEG", "pillow")
    assert Image().jpeg == "pillow"
    assert Image(32, crop="random-resized").jpeg == "pillow"


@pytest.mark.parametrize("name", ["rgb.jpg", "gray.jpg", "cmyk.jpg", "progressive.jpg", "exif6.jpg"])
@pytest.mark.parametrize("mode", ["RGB", "L", "RGBA", None])
def test_both_jpeg_decoders_give_the_same_pixels(monkeypatch: pytest.MonkeyPatch, images: dict[str, bytes], name: str, mode: str | None) -> None:
    """Full scale: the same libjpeg-turbo decode, the same resize: equal. At a reduced DCT scale (1/2 here),
    both decode with the fast IDCT and upsampling, PIL through its draft: equal but for rounding."""
    from PIL import Image as PIL

    big = _save(PIL.open(io.BytesIO(images[name])).resize((W * 2, H * 2)), "JPEG", quality=92)
    pillow = {}
    for backend in ("pillow", "simplejpeg"):
        monkeypatch.setenv("TARINDEX_JPEG", backend)
        got = [
            Image((30, 40), mode=mode, output="numpy", exact=True)(images[name]),  # type: ignore[arg-type]
            Image(crop=None, mode=mode, output="numpy")(images[name]),  # type: ignore[arg-type]
            Image((40, 40), crop="random-resized", seed=3, mode=mode, output="numpy")(images[name], {"__index__": 5}),  # type: ignore[arg-type]
            Image((60, 80), mode=mode, output="numpy")(big),  # type: ignore[arg-type]
        ]
        if backend == "pillow":
            pillow = dict(enumerate(got))
            continue
        for k, arr in enumerate(got):
            assert arr.shape == pillow[k].shape and arr.dtype == np.uint8 and arr.flags.writeable
            if k < 3:
                np.testing.assert_array_equal(arr, pillow[k])
            else:
                assert np.abs(arr.astype(int) - pillow[k]).max() <= 8 and _psnr(arr, pillow[k]) > 40


def test_jpeg_damage_libjpeg_recovers_from_decodes_as_pil_decodes_it(monkeypatch: pytest.MonkeyPatch, images: dict[str, bytes]) -> None:
    """Bytes between the scan and the end marker: libjpeg warns ("extraneous bytes before marker"); simplejpeg
    refuses the image in strict mode and PIL, which ignores the warning, decodes it: as the pillow setting does."""
    data = images["rgb.jpg"]
    assert data.endswith(b"\xff\xd9")
    damaged = data[:-2] + b"\x00\x17\x2a" + data[-2:]
    import simplejpeg

    with pytest.raises(ValueError, match="extraneous"):
        simplejpeg.decode_jpeg(damaged)
    got = Image(24, output="numpy")(damaged)
    monkeypatch.setenv("TARINDEX_JPEG", "pillow")
    np.testing.assert_array_equal(got, Image(24, output="numpy")(damaged))


def test_exif_orientation_turns_the_image_when_asked(images: dict[str, bytes]) -> None:
    data = images["exif6.jpg"]
    assert Image(output="numpy")(data).shape == (H, W, 3)  # as stored, by default (as PIL and webdataset)
    upright = Image(output="numpy", exif_orientation=True)(data)
    assert upright.shape == (W, H, 3)
    np.testing.assert_array_equal(upright, _reference(data, Image(exif_orientation=True)))
    for crop in ("center", "random-resized"):
        image = Image((30, 20), crop=crop, exif_orientation=True, exact=True, output="numpy")  # type: ignore[arg-type]
        got = image(data, {"__index__": 3})
        assert got.shape == (30, 20, 3)
        # resized before the turn here, after it in the reference: the passes round in another order
        assert np.abs(got.astype(int) - _reference(data, image, ident=3)).max() <= 2
    reduced = Image((24, 16), crop="random-resized", exif_orientation=True, output="numpy")  # sample 2: a 64x49 region, at 1/2 scale
    assert reduced.box(H, W, ident=2) == (0.0, 2.0, 64.0, 51.0)
    assert reduced(data, {"__index__": 2}).shape == (24, 16, 3)
    assert 28 < _psnr(reduced(data, {"__index__": 2}), _reference(data, reduced, ident=2)) < 50


def test_non_jpeg_keeps_its_own_channels_with_mode_none(images: dict[str, bytes]) -> None:
    own = Image(mode=None, output="numpy")
    assert own(images["gray.png"]).shape == (H, W, 1)
    assert own(images["rgba.png"]).shape == (H, W, 4)
    assert own(images["palette.png"]).shape == (H, W, 3)
    assert own(images["cmyk.jpg"]).shape == (H, W, 3)


def test_the_smallest_dct_scale_that_covers_the_crop(images: dict[str, bytes]) -> None:
    assert _dct_scale(256, 256, (64, 64), 256, 256) == 4
    assert _dct_scale(256, 256, (128, 128), 256, 256) == 2
    assert _dct_scale(256, 256, (129, 128), 256, 256) == 1
    assert _dct_scale(200, 150, (24, 18), 200, 150) == 8
    assert _dct_scale(300, 260, (224, 224), 500, 375) == 1
    from PIL import Image as PIL

    big = _save(PIL.fromarray(_pixels(256, 256)), "JPEG", quality=92)
    fast, exact = Image(64, output="numpy"), Image(64, output="numpy", exact=True)
    got, want = fast(big), exact(big)
    assert got.shape == want.shape == (64, 64, 3)
    assert 30 < _psnr(got, want) < 99  # decoded at 1/4 scale: close to, not equal to, the full decode


def test_center_crop_is_resize_then_center_crop() -> None:
    image = Image(224, resize=256)
    left, top, right, bottom = image.box(500, 375)
    assert right - left == pytest.approx(375 * 224 / 256) and bottom - top == pytest.approx(375 * 224 / 256)
    assert (left + right) / 2 == pytest.approx(250) and (top + bottom) / 2 == pytest.approx(187.5)
    assert Image((10, 20)).box(100, 100) == (0.0, 25.0, 100.0, 75.0)  # the largest centered 1:2 region
    assert Image((10, 20), crop=None).box(100, 100) == (0.0, 0.0, 100.0, 100.0)


def test_random_crops_are_fixed_by_seed_epoch_and_sample() -> None:
    image = Image(32, crop="random-resized", seed=5)
    assert image.box(500, 375, ident=7, epoch=3) == (230.0, 105.0, 465.0, 350.0)  # the same on every machine and release
    assert Image(32, crop="random-resized", seed=5).box(500, 375, ident=7, epoch=3) == image.box(500, 375, ident=7, epoch=3)
    assert image.box(500, 375, ident=7, epoch=4) != image.box(500, 375, ident=7, epoch=3)
    assert image.box(500, 375, ident=8, epoch=3) != image.box(500, 375, ident=7, epoch=3)
    assert Image(32, crop="random-resized", seed=6).box(500, 375, ident=7, epoch=3) != image.box(500, 375, ident=7, epoch=3)
    image.set_epoch(3)
    assert image.box(500, 375, ident=7) == (230.0, 105.0, 465.0, 350.0)
    areas, ratios = [], []
    for ident in range(300):
        left, top, right, bottom = image.box(500, 375, ident=ident, epoch=0)
        assert 0 <= left < right <= 500 and 0 <= top < bottom <= 375
        areas.append((right - left) * (bottom - top) / (500 * 375))
        ratios.append((right - left) / (bottom - top))
    assert min(areas) > 0.07 and max(areas) <= 1.0 and 0.3 < float(np.mean(areas)) < 0.7
    assert min(ratios) > 0.74 and max(ratios) < 1.34


def test_bad_options_are_refused() -> None:
    for kwargs, what in [
        ({"size": 0}, "size"),
        ({"size": (3, 4, 5)}, "size"),
        ({"crop": "random-resized"}, "needs a size"),
        ({"size": 8, "crop": "middle"}, "crop"),
        ({"size": 8, "crop": None, "resize": 10}, "resize"),
        ({"size": 8, "scale": (0.5, 0.2)}, "scale"),
        ({"size": 8, "ratio": (0, 1)}, "ratio"),
        ({"mode": "CMYK"}, "mode"),
        ({"output": "jax"}, "output"),
        ({"resample": "cubic"}, "resample"),
        ({"threads": 0}, "threads"),
    ]:
        with pytest.raises(ValueError, match=what):
            Image(**kwargs)


# -- webdataset's names ---------------------------------------------------------------------------


@pytest.mark.parametrize("spec", sorted(IMAGE_SPECS))
def test_every_webdataset_spec_decodes_as_webdataset_decodes_it(images: dict[str, bytes], spec: str) -> None:
    from webdataset.autodecode import ImageHandler

    theirs = ImageHandler(spec)
    ours = Decoder(spec)  # type: ignore[arg-type]
    for name in ("rgb.jpg", "gray.png", "rgba.png", "palette.png", "cmyk.jpg"):
        ext = name.split(".")[1]
        want = theirs(ext, images[name])
        got = ours({"__key__": "k", ext: images[name]})[ext]
        assert type(got) is type(want), (spec, name)
        if isinstance(want, torch.Tensor | np.ndarray):
            assert got.dtype == want.dtype and tuple(got.shape) == tuple(want.shape), (spec, name)
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
        else:
            assert got.mode == want.mode and got.size == want.size
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_torch_is_refused_with_both_spellings() -> None:
    with pytest.raises(ValueError, match=r"'torch' is ambiguous.*float32.*'torchrgb'.*uint8.*'torchrgb8'"):
        Decoder("torch")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'torch' is ambiguous"):
        TarStream([__file__]).decode("torch")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="one of 'l8'"):
        Decoder("rgb16")  # type: ignore[arg-type]


@pytest.fixture
def wds_images(tmp_path: Path, images: dict[str, bytes]) -> Path:
    samples = [{"__key__": f"k{i:03d}", "jpg": images["rgb.jpg"], "seg.png": images["gray.png"], "cls": i} for i in range(6)]
    return wds_write(tmp_path / "w-000000.tar", samples)


def test_stream_decode_matches_webdataset_end_to_end(wds_images: Path) -> None:
    import webdataset as wds

    for spec in ("torchrgb", "torchrgb8", "rgb8", "l", "pil"):
        ours = list(TarStream([str(wds_images)]).decode(spec).to_tuple("jpg", "seg.png", "cls"))  # type: ignore[arg-type]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # webdataset's own notices, and the file it leaves open
            theirs = list(wds.WebDataset(str(wds_images), shardshuffle=False).decode(spec).to_tuple("jpg", "seg.png", "cls"))
        assert len(ours) == len(theirs) == 6
        for a, b in zip(ours, theirs):
            for x, y in zip(a, b):
                np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
                assert type(x) is type(y)


def test_decode_stage_keeps_the_decoders_and_allow_pickle_given_before(tmp_path: Path, images: dict[str, bytes]) -> None:
    import pickle

    shard = py_tar(
        tmp_path / "k-000000.tar",
        [("a.jpg", images["rgb.jpg"]), ("a.seg.png", images["gray.png"]), ("a.pkl", pickle.dumps({"x": 1})), ("a.cls", b"2")],
        tarfile.GNU_FORMAT,
        dirs=False,
    )
    stream = TarStream([str(shard)], decoders={"seg.png": bytes}, allow_pickle=True).decode("torchrgb8")
    (s,) = list(stream)
    assert s["seg.png"] == images["gray.png"]  # the constructor's decoder, not the image decoder again
    assert s["pkl"] == {"x": 1}  # allow_pickle kept
    assert s["jpg"].dtype == torch.uint8 and tuple(s["jpg"].shape) == (3, H, W)
    (s,) = list(stream.decode("rgb8", decoders={"cls": lambda b: b.decode()}))
    assert s["seg.png"] == images["gray.png"] and s["cls"] == "2" and s["jpg"].shape == (H, W, 3)
    (s,) = list(stream.decode("pil", allow_pickle=False))
    assert s["pkl"] == pickle.dumps({"x": 1})


# -- batches --------------------------------------------------------------------------------------

N = 24
BAD = {5: b"not a jpeg at all" * 8}


def _jpegs(n: int = N) -> list[bytes]:
    from PIL import Image as PIL

    return [_save(PIL.fromarray(_pixels(80 + 8 * (i % 4), 60 + 4 * (i % 3), seed=i)), "JPEG", quality=90) for i in range(n)]


@pytest.fixture(scope="module")
def jpeg_shards(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Two shards of 12 samples (jpg + cls), the first by GNU tar (pax), the second by webdataset's TarWriter."""
    root = tmp_path_factory.mktemp("jpegs")
    jpegs = _jpegs()
    src = root / "src"
    src.mkdir()
    names = []
    for i in range(12):
        (src / f"s{i:03d}.jpg").write_bytes(jpegs[i])
        (src / f"s{i:03d}.cls").write_text(str(i))
        names += [f"s{i:03d}.jpg", f"s{i:03d}.cls"]
    first = root / "img-000000.tar"
    subprocess.run(["tar", "--format=pax", "--no-recursion", "-C", str(src), "-cf", str(first), *names], check=True)
    second = wds_write(root / "img-000001.tar", [{"__key__": f"s{i:03d}", "jpg": jpegs[i], "cls": i} for i in range(12, N)])
    return [first, second]


@pytest.fixture(scope="module")
def jpeg_index(jpeg_shards: list[Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_index([str(p) for p in jpeg_shards], index=tmp_path_factory.mktemp("ix") / "img.tarindex").path


@pytest.fixture(scope="module")
def bad_index(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("bad")
    jpegs = _jpegs(12)
    specs = []
    for i, data in enumerate(jpegs):
        specs += [(f"s{i:03d}.jpg", BAD.get(i, data)), (f"s{i:03d}.cls", str(i).encode())]
    shard = py_tar(root / "bad-000000.tar", specs, tarfile.GNU_FORMAT, dirs=False)
    return shard, build_index([str(shard)], index=root / "bad.tarindex").path


def _member_bytes(shards: list[Path]) -> dict[str, bytes]:
    """The oracle: each sample's JPEG bytes by key, extracted by tarfile."""
    out = {}
    for p in shards:
        with tarfile.open(p) as tf:
            for m in tf:
                if m.name.endswith(".jpg"):
                    out[m.name.split(".")[0]] = tf.extractfile(m).read()  # type: ignore[union-attr]
    return out


@pytest.mark.parametrize("output", ["tensor", "numpy"])
def test_a_batch_is_one_array_equal_to_sample_by_sample_decoding(
    impl: str, jpeg: str, jpeg_shards: list[Path], jpeg_index: Path, output: str
) -> None:
    image = Image((32, 48), crop="random-resized", seed=3, output=output, threads=2)  # type: ignore[arg-type]
    ds = TarDataset(jpeg_index, decode=image)
    ds.set_epoch(2)
    indices = [17, 3, 9, 0, 22, 12, 5, 5]
    samples = ds.__getitems__(indices)
    assert [s["__index__"] for s in samples] == indices
    batch = collate(samples)
    rows = batch["jpg"]
    shape = (len(indices), 3, 32, 48) if output == "tensor" else (len(indices), 32, 48, 3)
    assert tuple(rows.shape) == shape and rows.dtype in (torch.uint8, np.uint8)
    first = samples[0]["jpg"]
    assert (rows.data_ptr() if output == "tensor" else rows.ctypes.data) == (first.data_ptr() if output == "tensor" else first.ctypes.data)  # no copy
    np.testing.assert_array_equal(batch["cls"], [17, 3, 9, 0, 22, 12, 5, 5])
    oracle = _member_bytes(jpeg_shards)
    again = Image((32, 48), crop="random-resized", seed=3, output=output)  # type: ignore[arg-type]
    again.set_epoch(2)
    for k, i in enumerate(indices):
        one = ds[i]["jpg"]
        np.testing.assert_array_equal(np.asarray(rows[k]), np.asarray(one))
        np.testing.assert_array_equal(np.asarray(one), np.asarray(again(oracle[f"s{i:03d}"], {"__index__": i})))
    ds.set_epoch(3)
    assert not np.array_equal(np.asarray(collate(ds.__getitems__(indices))["jpg"]), np.asarray(rows))


@pytest.fixture(scope="module")
def truncated_index(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A shard of 8 JPEGs, the fourth cut in half (a JPEG header, then half a scan)."""
    root = tmp_path_factory.mktemp("truncated")
    specs = []
    for i, data in enumerate(_jpegs(8)):
        specs += [(f"s{i:03d}.jpg", data[: len(data) // 2] if i == 3 else data), (f"s{i:03d}.cls", str(i).encode())]
    shard = py_tar(root / "cut-000000.tar", specs, tarfile.GNU_FORMAT, dirs=False)
    return shard, build_index([str(shard)], index=root / "cut.tarindex").path


def test_a_truncated_jpeg_in_a_batch_names_shard_offset_and_key(jpeg: str, truncated_index: tuple[Path, Path]) -> None:
    shard, index = truncated_index
    with tarfile.open(shard) as tf:
        offset = next(m.offset for m in tf if m.name == "s003.jpg")
    ds = TarDataset(index, decode=Image(24, crop="random-resized", threads=2))
    with pytest.raises(DecodeError, match=rf"{shard}: sample 's003': member 'jpg': OSError: image file is truncated.* at offset {offset}\)"):
        ds.__getitems__([0, 3, 6])
    skipping = TarDataset(index, decode=Image(24, crop="random-resized", threads=2), on_error="skip")
    got = skipping.__getitems__([0, 3, 6, 2])
    assert [s["__key__"] for s in got] == ["s000", "s004", "s006", "s002"]
    for s, i in zip(got, [0, 4, 6, 2]):
        np.testing.assert_array_equal(s["jpg"].numpy(), ds[i]["jpg"].numpy())


def test_a_corrupt_jpeg_in_a_batch_names_shard_offset_key_and_member(impl: str, bad_index: tuple[Path, Path]) -> None:
    shard, index = bad_index
    with tarfile.open(shard) as tf:
        offset = next(m.offset for m in tf if m.name == "s005.jpg")
    ds = TarDataset(index, decode=Image(24, threads=2))
    with pytest.raises(DecodeError, match=rf"{shard}: sample 's005': member 'jpg': UnidentifiedImageError.* at offset {offset}\)"):
        ds.__getitems__([1, 5, 7])
    skipping = TarDataset(index, decode=Image(24, threads=2), on_error="skip")
    got = skipping.__getitems__([1, 5, 7, 4])
    assert [s["__key__"] for s in got] == ["s001", "s006", "s007", "s004"]  # just it, replaced as ds[5] is
    for s, i in zip(got, [1, 6, 7, 4]):
        np.testing.assert_array_equal(s["jpg"].numpy(), skipping[i]["jpg"].numpy())
    assert tuple(collate(got)["jpg"].shape) == (4, 3, 24, 24)


def test_stream_batches_are_one_array_equal_to_sample_by_sample(impl: str, jpeg_shards: list[Path]) -> None:
    urls = [str(p) for p in jpeg_shards]
    image = Image(40, crop="random-resized", seed=1, threads=2)
    per_sample = list(TarStream(urls, shuffle=5, seed=2).decode(image).to_tuple("jpg", "cls"))
    batches = list(TarStream(urls, shuffle=5, seed=2).decode(image).to_tuple("jpg", "cls").batched(5))
    assert [len(b[1]) for b in batches] == [5, 5, 5, 5, 4]
    images = torch.cat([b[0] for b in batches])
    assert tuple(images.shape) == (N, 3, 40, 40)
    np.testing.assert_array_equal(np.concatenate([b[1] for b in batches]), [c for _, c in per_sample])
    assert torch.equal(images, torch.stack([img for img, _ in per_sample]))
    oracle = _member_bytes(jpeg_shards)
    for img, c in per_sample[:4]:  # keyed by shard name and key: the same crop wherever the shard is read from
        name = Path(urls[0 if c < 12 else 1]).name
        assert torch.equal(img, image(oracle[f"s{c:03d}"], {"__url__": f"http://elsewhere/{name}", "__key__": f"s{c:03d}"}))


def test_stream_batch_with_a_corrupt_jpeg(impl: str, bad_index: tuple[Path, Path]) -> None:
    shard, _ = bad_index
    stream = TarStream([str(shard)]).decode(Image(24)).batched(4)
    with pytest.raises(DecodeError, match=r"bad-000000\.tar: sample 's005': member 'jpg': UnidentifiedImageError"):
        list(stream)
    warned = TarStream([str(shard)], handler="warn").decode(Image(24)).batched(4)
    with pytest.warns(StreamWarning, match="sample 's005'.*skipping the sample"):
        got = list(warned)
    assert [len(b["__key__"]) for b in got] == [4, 3, 4]  # just it: its batch is one shorter
    assert "s005" not in got[1]["__key__"]
    assert tuple(got[1]["jpg"].shape) == (3, 3, 24, 24)


def _batch_view(batch: dict[str, Any]) -> tuple[list[int], torch.Tensor]:
    return [int(i) for i in batch["__index__"]], batch["jpg"]


@pytest.mark.filterwarnings("ignore:'pin_memory' argument is set as true but no accelerator:UserWarning")  # CPU-only torch
def test_dataloader_workers_pin_memory_persistent_workers_and_shard_sampler(impl: str, jpeg_index: Path) -> None:
    image = Image(32, crop="random-resized", seed=4)
    ds = TarDataset(jpeg_index, decode=image)
    sampler = tarindex.ShardSampler(ds, seed=1, num_replicas=1, rank=0)
    loader = torch.utils.data.DataLoader(
        ds, sampler=sampler, batch_size=6, num_workers=2, persistent_workers=True, pin_memory=True, collate_fn=collate
    )
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        ds.set_epoch(epoch)  # shared with the persistent workers
        got = [_batch_view(b) for b in loader]
        order = list(sampler)
        assert [i for idx, _ in got for i in idx] == order
        for idx, rows in got:
            assert tuple(rows.shape) == (6, 3, 32, 32)
            if torch.cuda.is_available():
                assert rows.is_pinned()
            assert torch.equal(rows, collate(ds.__getitems__(idx))["jpg"])  # the same crops as in this process


def test_random_crops_are_the_same_after_a_resume(impl: str, jpeg_index: Path) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    def loader() -> StatefulDataLoader:
        ds = TarDataset(jpeg_index, decode=Image(32, crop="random-resized", seed=9))
        ds.set_epoch(1)
        sampler = tarindex.ShardSampler(ds, seed=3, num_replicas=1, rank=0)
        sampler.set_epoch(1)
        return StatefulDataLoader(ds, sampler=sampler, batch_size=4, num_workers=2, collate_fn=collate)

    full = [_batch_view(b) for b in loader()]
    first = loader()
    got = []
    for batch in first:
        got.append(_batch_view(batch))
        if len(got) == 2:
            state = first.state_dict()
            break
    again = loader()
    again.load_state_dict(state)
    got += [_batch_view(b) for b in again]
    assert [idx for idx, _ in got] == [idx for idx, _ in full]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(got, full))


def test_stream_batches_in_workers_and_after_a_stream_resume(impl: str, jpeg_shards: list[Path]) -> None:
    urls = [str(p) for p in jpeg_shards]

    def stream() -> TarStream:
        return TarStream(urls, shuffle=6, seed=5).decode(Image(32, crop="random-resized", seed=2)).to_tuple("jpg", "cls").batched(4)

    here = list(stream())
    loader = torch.utils.data.DataLoader(stream(), batch_size=None, num_workers=2)
    in_workers = list(loader)
    by_label = {int(c): img for imgs, cls in here for img, c in zip(imgs, cls)}
    assert sorted(by_label) == list(range(N))
    for imgs, cls in in_workers:
        for img, c in zip(imgs, cls):
            assert torch.equal(img, by_label[int(c)])  # crops keyed by the sample, not by the worker or the order
    s = stream()
    it = iter(s)
    head = [next(it), next(it)]
    state = s.state_dict()
    rest = stream()
    rest.load_state_dict(state)
    resumed = head + list(rest)
    assert [list(c) for _, c in resumed] == [list(c) for _, c in here]
    assert all(torch.equal(a, b) for (a, _), (b, _) in zip(resumed, here))


def _pair(sample: dict[str, Any]) -> tuple[Any, int]:
    return sample["jpg"], sample["cls"]


def test_a_transform_runs_per_sample_on_the_batch_rows(impl: str, jpeg_index: Path) -> None:
    ds = TarDataset(jpeg_index, decode=Image(24, seed=1), transform=_pair)
    indices = [4, 20, 11]
    images, labels = collate(ds.__getitems__(indices))
    assert tuple(images.shape) == (3, 3, 24, 24)
    np.testing.assert_array_equal(labels, indices)
    assert all(torch.equal(images[k], ds[i][0]) for k, i in enumerate(indices))
    failing = TarDataset(jpeg_index, decode=Image(24), transform=lambda s: s["missing"])
    with pytest.raises(DecodeError, match=r"img-00000[01]\.tar: sample 's020': KeyError: 'missing' \(sample at offset \d+\)"):
        failing.__getitems__([20])


def test_batches_over_http_shards(impl: str, jpeg_shards: list[Path], jpeg_index: Path, http_server: Any, tmp_path: Path) -> None:
    import shutil

    dest = http_server.root / "decode-batches"
    dest.mkdir(parents=True, exist_ok=True)
    for p in jpeg_shards:
        shutil.copyfile(p, dest / p.name)
    urls = [http_server.url(f"decode-batches/{p.name}") for p in jpeg_shards]
    remote = TarDataset(build_index(urls, index=tmp_path / "http.tarindex").path, decode=Image(24, crop="random-resized"))
    local = TarDataset(jpeg_index, decode=Image(24, crop="random-resized"))
    indices = [23, 0, 7, 12, 7]
    got, want = collate(remote.__getitems__(indices)), collate(local.__getitems__(indices))
    assert torch.equal(got["jpg"], want["jpg"]) and list(got["__key__"]) == list(want["__key__"])


def test_a_decode_error_shows_the_member_not_an_object_address(impl: str, bad_index: tuple[Path, Path]) -> None:
    """PIL says ``cannot identify image file <_io.BytesIO object at 0x...>``: the message keeps its words, drops
    the address, and shows what the member holds instead (its size and first bytes), every way a sample decodes."""
    shard, index = bad_index
    with tarfile.open(shard) as tf:
        offset = next(m.offset for m in tf if m.name == "s005.jpg")
        data = tf.extractfile("s005.jpg").read()  # type: ignore[union-attr]
    said = (
        rf"{shard}: sample 's005': member 'jpg': UnidentifiedImageError: cannot identify image file "
        rf"\(the member: {len(data)} bytes, starting b'not a jpeg at al'\) \(sample at offset {offset}\)"
    )
    ways = {
        "ds[i]": lambda: TarDataset(index, decode="rgb8")[5],
        "batch": lambda: TarDataset(index, decode=Image(24, threads=2)).__getitems__([4, 5]),
        "stream": lambda: list(TarStream([str(shard)], decode="pil")),
        "stream batch": lambda: list(TarStream([str(shard)]).decode(Image(24)).batched(4)),
    }
    for way, read in ways.items():
        with pytest.raises(DecodeError) as caught:
            read()
        message = str(caught.value)
        assert re.fullmatch(said, message), (way, message)
        assert " object at 0x" not in message
