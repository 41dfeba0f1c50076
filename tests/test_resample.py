"""The resize of decode.Image (tarindex/_resample.c) against PIL's Image.resize, the reference: every filter,
boxes inside the image, shrinking and growing on either axis (both pass orders), 1, 3 and 4 bands, HWC and CHW
out; in the Python lane the same calls go through PIL."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from conftest import require_c_extension
from tarindex import _image
from tarindex._image import Resample, resize

FILTERS: list[Resample] = ["bilinear", "bicubic", "lanczos", "box", "hamming"]


def _pil_resize(arr: np.ndarray, size: tuple[int, int], box: tuple[float, float, float, float], resample: Resample) -> np.ndarray:
    """PIL's resize of an HWC array: L for one band, RGB for three, RGBX for four (RGBA would premultiply alpha)."""
    from PIL import Image as PIL

    h, w, c = arr.shape
    im = PIL.fromarray(arr[:, :, 0]) if c == 1 else PIL.frombytes({3: "RGB", 4: "RGBX"}[c], (w, h), arr.tobytes())
    got = np.asarray(im.resize((size[1], size[0]), _image._RESAMPLE[resample], box=box))
    return got[:, :, None] if got.ndim == 2 else got


def _cases(n: int, seed: int = 0) -> Any:
    rng = np.random.default_rng(seed)
    for k in range(n):
        c = (1, 3, 4)[k % 3]
        h, w = (int(v) for v in rng.integers(1, 80, 2))
        oh, ow = (int(v) for v in rng.integers(1, 64, 2))
        if k % 4 == 0:  # a smooth picture: the filters' negative lobes overshoot at its edges
            y, x = np.mgrid[0:h, 0:w]
            arr = np.clip(((x * 7 + y * 5) % 256 + rng.integers(0, 20, (h, w)))[..., None] * np.ones(c), 0, 255).astype(np.uint8)
        else:
            arr = rng.integers(0, 256, (h, w, c), dtype=np.uint8)
        if k % 5 == 0:
            box = (0.0, 0.0, float(w), float(h))
        else:
            left, top = float(rng.uniform(0, w - 0.5)), float(rng.uniform(0, h - 0.5))
            box = (left, top, float(rng.uniform(left + 0.25, w)), float(rng.uniform(top + 0.25, h)))
        yield arr, (oh, ow), box, FILTERS[k % len(FILTERS)]


def test_the_same_pixels_as_pil_in_both_layouts(impl: str) -> None:
    for arr, size, box, resample in _cases(1500):
        want = _pil_resize(arr, size, box, resample)
        got = resize(arr, size, box, resample)
        np.testing.assert_array_equal(got, want, err_msg=f"{arr.shape} {box} -> {size}, {resample}")
        out = np.full((arr.shape[2], *size), 7, dtype=np.uint8)
        assert resize(arr, size, box, resample, out, planar=True) is out
        np.testing.assert_array_equal(out.transpose(1, 2, 0), want)


def test_both_pass_orders_are_pils(impl: str) -> None:
    """Pillow 13 resizes down the columns first when the height shrinks by more than twice as many pixels as the
    width: the two orders round differently, and both are met here."""
    rng = np.random.default_rng(3)
    arr = rng.integers(0, 256, (375, 500, 3), dtype=np.uint8)
    for size, box in [((40, 480), (0.0, 0.0, 500.0, 375.0)), ((224, 224), (50.5, 20.25, 400.0, 360.0)), ((300, 130), (3.0, 0.0, 497.0, 375.0))]:
        np.testing.assert_array_equal(resize(arr, size, box, "bilinear"), _pil_resize(arr, size, box, "bilinear"))
    assert _image._vertical_first(375, 500, 40, 480) and not _image._vertical_first(375, 500, 224, 224)


def test_the_c_function_refuses_what_it_cannot_resize() -> None:
    require_c_extension()
    from tarindex._native import SPEEDUPS

    assert SPEEDUPS is not None
    src = np.zeros((10, 12, 3), np.uint8)
    out = np.zeros((5, 6, 3), np.uint8)
    for args, what in [
        ((src, np.zeros((5, 6, 1), np.uint8), (0.0, 0.0, 12.0, 10.0), 2, False, False), "same bands"),
        ((src, out, (0.0, 0.0, 13.0, 10.0), 2, False, False), "not a non-empty region"),
        ((src, out, (4.0, 0.0, 4.0, 10.0), 2, False, False), "not a non-empty region"),
        ((src, out, (0.0, 0.0, 12.0, 10.0), 0, False, False), "unknown filter 0"),
        ((src.astype(np.uint16), out, (0.0, 0.0, 12.0, 10.0), 2, False, False), "uint8"),
        ((src, np.zeros((5, 6), np.uint8), (0.0, 0.0, 12.0, 10.0), 2, False, False), "uint8 arrays of 2 or 3 dimensions alike"),
    ]:
        with pytest.raises(ValueError, match=what):
            SPEEDUPS.resample(*args)
    with pytest.raises(ValueError, match="not C-contiguous"):
        SPEEDUPS.resample(src, out[:, ::2], (0.0, 0.0, 12.0, 10.0), 2, False, False)  # not contiguous
    with pytest.raises(BufferError, match="not writable"):
        SPEEDUPS.resample(src, bytes(90), (0.0, 0.0, 12.0, 10.0), 2, False, False)  # not writable


def test_a_resize_releases_the_gil() -> None:
    """This thread counts in Python while another resizes a large image in C: with the GIL held through the call
    it could count only between calls, so its pace during the resizes is compared with its pace alone."""
    import threading
    import time

    require_c_extension()
    arr = np.random.default_rng(0).integers(0, 256, (1200, 1600, 3), dtype=np.uint8)

    def pace(busy: threading.Thread) -> float:
        busy.start()
        n, t0 = 0, time.perf_counter()
        while busy.is_alive():
            n += 1
        busy.join()
        return n / (time.perf_counter() - t0)

    alone = pace(threading.Thread(target=time.sleep, args=(0.3,)))
    during = pace(threading.Thread(target=lambda: [resize(arr, (900, 1100), (1.0, 1.0, 1599.0, 1199.0), "lanczos") for _ in range(4)]))
    assert during > 0.3 * alone, (during, alone)  # a call that kept the GIL would stop this loop while it ran
