"""Images decoded at the size a model needs (:class:`tarindex.decode.Image`), one at a time or a batch
into one array in a thread pool.

A JPEG is decoded at the smallest DCT scale (1/2, 1/4, 1/8: libjpeg-turbo's scaled decode, through
simplejpeg when it is installed, else PIL's ``draft``) at which the crop still covers the output size,
then cropped and resized once (``PIL.Image.resize`` with a box, or after simplejpeg the C extension's
``resample``, which gives the same bytes, straight into a batch's row). Other formats (PNG, WebP, ...)
are decoded at full scale and take the same crop and resize. Random crops come from a counter-based
generator keyed by the seed, the epoch and the sample, so they are the same in every run, in every
``DataLoader`` worker layout and after a resume. simplejpeg, PIL and ``resample`` release the GIL
while they decode and resize, so a batch decodes in parallel threads inside one process.
"""

from __future__ import annotations

import hashlib
import io
import math
import os
import sys
import threading
import zlib
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Literal, cast

from . import _native
from ._epochs import SharedEpoch

if TYPE_CHECKING:
    from PIL.Image import Image as PILImage

__all__: list[str] = []  # tarindex.decode.Image is the public name

Crop = Literal["center", "random-resized"]
Output = Literal["tensor", "numpy", "pil"]
Mode = Literal["RGB", "L", "RGBA"]
Resample = Literal["nearest", "bilinear", "bicubic", "lanczos", "box", "hamming"]
JpegBackend = Literal["simplejpeg", "pillow"]

_SCALES = (8, 4, 2)  # the DCT scales PIL's draft offers (libjpeg's 1/8, 1/4, 1/2)
_MAX_THREADS = 16
_M64 = (1 << 64) - 1
_ORIENTATION = 0x0112  # the EXIF tag
_TRANSPOSED = (5, 6, 7, 8)  # orientations that swap width and height


def _mix64(z: int) -> int:
    """splitmix64's finalizer: a 64-bit value to a well-mixed 64-bit value."""
    z = (z + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _uniforms(seed: int, epoch: int, ident: int) -> Iterator[float]:
    """Floats in ``[0, 1)`` from a counter-based stream keyed by ``(seed, epoch, ident)``: the same
    numbers on every machine, in every process and lane (plain integer arithmetic)."""
    key = _mix64(_mix64(_mix64(seed & _M64) ^ (epoch & _M64)) ^ (ident & _M64))
    counter = 0
    while True:
        counter += 1
        yield (_mix64(key ^ counter) >> 11) * (1.0 / (1 << 53))


def sample_ident(sample: Mapping[str, Any]) -> int:
    """The number that keys a sample's random crop: its ``__index__`` (TarDataset, TarStream over an
    index), else a hash of its shard's base name and its key (the same wherever the shard is read from)."""
    index = sample.get("__index__")
    if isinstance(index, int):
        return index
    url = str(sample.get("__url__", "")).rstrip("/")
    name = f"{url.rsplit('/', 1)[-1]}\0{sample.get('__key__', '')}".encode("utf-8", "surrogateescape")
    return int.from_bytes(hashlib.blake2b(name, digest_size=8).digest(), "little")


def jpeg_backend() -> JpegBackend:
    """The JPEG decoder an :class:`Image` made now uses: ``"simplejpeg"`` (libjpeg-turbo's scaled decode
    in one call that releases the GIL) when it is installed (``pip install 'tarindex[jpeg]'``), unless
    ``TARINDEX_JPEG=pillow`` is set in the environment; else ``"pillow"``."""
    if os.environ.get("TARINDEX_JPEG", "").lower() == "pillow":
        return "pillow"
    try:
        import simplejpeg  # noqa: F401
    except ImportError:
        return "pillow"
    return "simplejpeg"


def _pil() -> Any:
    from PIL import Image as PIL

    return PIL


class Image:
    """An image decoder that knows its output size: decode, crop and resize in one step.

    Usable as ``decode=`` (every image extension) or in ``decoders={ext: ...}`` of
    :class:`~tarindex.TarDataset` and :class:`~tarindex.TarStream`. With a ``size`` and ``output``
    ``"tensor"`` or ``"numpy"``, a batch (``DataLoader(batch_size=...)`` over a ``TarDataset``,
    ``TarStream.batched``) is decoded in a thread pool into one preallocated ``uint8`` array per
    member, which :func:`tarindex.collate.collate` hands on without a copy.

    A JPEG is decoded at the smallest DCT scale (1/2, 1/4 or 1/8) at which the crop still covers
    the output size, so a 256x256 JPEG bound for 128x128 is decoded at 128x128; other formats at
    full scale. ``exact=True`` decodes every image at full scale (the reference the reduced decode
    is measured against in docs/performance.md).

    Args:
        size: output ``(height, width)``, or one number for a square; ``None`` keeps the image's
            size (no crop, no resize).
        crop: the region resized to ``size``: ``"center"`` (default), the largest centered region of
            the output's aspect ratio, or with ``resize=R`` what ``Resize(R)`` then
            ``CenterCrop(size)`` keep; ``"random-resized"``, a region drawn as torchvision's
            ``RandomResizedCrop(size, scale, ratio)`` draws it; ``None``, the whole image (its
            aspect ratio changes to the output's).
        resize: with ``crop="center"``: the shorter side's length before the crop, as
            ``Resize(resize)`` then ``CenterCrop(size)`` (e.g. 256 for a 224 output).
        scale: ``"random-resized"``: the range of the region's area, as a fraction of the image's.
        ratio: ``"random-resized"``: the range of the region's aspect ratio (width / height),
            drawn log-uniformly.
        mode: ``"RGB"`` (3 channels; gray images repeated, alpha dropped, CMYK converted by PIL),
            ``"L"`` (1 channel), ``"RGBA"`` (4), or ``None``: the image's own ``L``, ``RGB`` or
            ``RGBA`` (other modes to ``RGB``, or ``RGBA`` when they have alpha).
        output: ``"tensor"`` (torch ``uint8`` CHW), ``"numpy"`` (``uint8`` HWC), ``"pil"``.
        resample: the resize filter (PIL's; ``"bilinear"``, antialiased when shrinking, as
            torchvision's default).
        exact: decode at full scale always.
        exif_orientation: turn the image as its EXIF orientation says (off by default, as PIL,
            torchvision's PIL path and webdataset leave it).
        seed: with the epoch and the sample, fixes every random crop.
        threads: threads per process that decode a batch (``None``: this process's share of the
            CPUs: all of them in the main process, ``cpus // num_workers`` in a DataLoader worker;
            1: no thread pool).

    Raises:
        ValueError: a bad option value.
    """

    def __init__(
        self,
        size: int | tuple[int, int] | None = None,
        *,
        crop: Crop | None = "center",
        resize: int | None = None,
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        mode: Mode | None = "RGB",
        output: Output = "tensor",
        resample: Resample = "bilinear",
        exact: bool = False,
        exif_orientation: bool = False,
        seed: int = 0,
        threads: int | None = None,
    ) -> None:
        if size is not None:
            hw = (size, size) if isinstance(size, int) else tuple(size)
            if len(hw) != 2 or not all(isinstance(v, int) and v > 0 for v in hw):
                raise ValueError(f"size must be a positive int or (height, width), not {size!r}")
            size = (hw[0], hw[1])
        if crop not in (None, "center", "random-resized"):
            raise ValueError(f"crop must be 'center', 'random-resized' or None, not {crop!r}")
        if size is None and crop == "random-resized":
            raise ValueError("crop='random-resized' needs a size")
        if resize is not None and (crop != "center" or size is None or resize < 1):
            raise ValueError(f"resize={resize!r} needs a size and crop='center', and must be >= 1")
        if not 0 < scale[0] <= scale[1] <= 1:
            raise ValueError(f"scale must be (low, high) with 0 < low <= high <= 1, not {scale!r}")
        if not 0 < ratio[0] <= ratio[1]:
            raise ValueError(f"ratio must be (low, high) with 0 < low <= high, not {ratio!r}")
        if mode not in (None, "RGB", "L", "RGBA"):
            raise ValueError(f"mode must be 'RGB', 'L', 'RGBA' or None, not {mode!r}")
        if output not in ("tensor", "numpy", "pil"):
            raise ValueError(f"output must be 'tensor', 'numpy' or 'pil', not {output!r}")
        if resample not in ("nearest", "bilinear", "bicubic", "lanczos", "box", "hamming"):
            raise ValueError(f"resample must be one of nearest, bilinear, bicubic, lanczos, box, hamming, not {resample!r}")
        if threads is not None and threads < 1:
            raise ValueError(f"threads must be >= 1, not {threads}")
        self.size: tuple[int, int] | None = size
        self.crop = crop if size is not None else None
        self.resize = resize
        self.scale = (float(scale[0]), float(scale[1]))
        self.ratio = (float(ratio[0]), float(ratio[1]))
        self.mode: Mode | None = mode
        self.output: Output = output
        self.resample: Resample = resample
        self.exact = exact
        self.exif_orientation = exif_orientation
        self.seed = seed
        self.threads = threads
        self._jpeg: JpegBackend = jpeg_backend()
        self._epoch = SharedEpoch(0)

    # -- the epoch -------------------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        """The epoch random crops are drawn for (shared with DataLoader workers, persistent ones too)."""
        return self._epoch.value

    def set_epoch(self, epoch: int) -> None:
        """Draw the random crops of ``epoch`` (call before each epoch; ``TarStream.set_epoch`` calls it)."""
        self._epoch.value = epoch

    @property
    def jpeg(self) -> JpegBackend:
        """The JPEG decoder this image decoder uses (:func:`jpeg_backend` when it was made)."""
        return self._jpeg

    @property
    def random(self) -> bool:
        """Whether the crop is random (drawn per sample and epoch)."""
        return self.crop == "random-resized"

    @property
    def batchable(self) -> bool:
        """Whether a batch of these images fills one array (a fixed size, a fixed mode, an array output)."""
        return self.size is not None and self.mode is not None and self.output != "pil"

    @property
    def channels(self) -> int:
        """Channels of the output (``mode`` must be set)."""
        return {"RGB": 3, "L": 1, "RGBA": 4}[self.mode or "RGB"]

    # -- geometry --------------------------------------------------------------------------------
    def box(self, width: int, height: int, ident: int = 0, epoch: int | None = None) -> tuple[float, float, float, float]:
        """The region ``(left, top, right, bottom)`` of a ``width`` x ``height`` image (as it is shown,
        after any EXIF turn) that is resized to the output, for the sample ``ident`` in ``epoch``
        (default: the current one)."""
        if self.size is None or self.crop is None:
            return (0.0, 0.0, float(width), float(height))
        oh, ow = self.size
        if self.crop == "center":
            r = max(oh / height, ow / width) if self.resize is None else self.resize / min(width, height)
            cw, ch = min(float(width), ow / r), min(float(height), oh / r)
            left, top = (width - cw) / 2, (height - ch) / 2
            return (left, top, left + cw, top + ch)
        draws = _uniforms(self.seed, self.epoch if epoch is None else epoch, ident)
        x, y, w, h = _random_resized(width, height, self.scale, self.ratio, draws)
        return (float(x), float(y), float(x + w), float(y + h))

    # -- decoding ------------------------------------------------------------------------------
    def decode_pil(self, data: bytes, ident: int = 0, epoch: int | None = None) -> PILImage:
        """``data`` decoded, cropped and resized to the output size, in the output mode, as a PIL image.

        Raises:
            PIL.UnidentifiedImageError: not an image PIL reads.
            OSError: damaged image data.
        """
        PIL = _pil()
        im = PIL.open(io.BytesIO(data))
        width, height = im.size
        turn = 1
        if self.exif_orientation:
            turn = int(im.getexif().get(_ORIENTATION, 1) or 1)
            if turn not in range(1, 9):
                turn = 1
        swap = turn in _TRANSPOSED
        shown_w, shown_h = (height, width) if swap else (width, height)
        left, top, right, bottom = _unturn(self.box(shown_w, shown_h, ident, epoch), shown_w, shown_h, turn)
        target: tuple[int, int] | None = None
        if self.size is not None:
            oh, ow = self.size
            target = (oh, ow) if swap else (ow, oh)  # (width, height) before the turn
        if target is not None and not self.exact and im.format in ("JPEG", "MPO"):
            s = _dct_scale(right - left, bottom - top, target, width, height)
            if s > 1:
                drafted = im.draft("L" if self.mode == "L" else None, (max(1, width // s), max(1, height // s)))
                if drafted is not None:
                    f = drafted[1][2] / width
                    w2, h2 = im.size
                    left, top = min(left * f, w2), min(top * f, h2)
                    right, bottom = min(right * f, w2), min(bottom * f, h2)
        mode = self.mode or _own_mode(im)
        if im.mode != mode and not (im.mode == "L" and mode == "RGB"):  # gray: resized first, then repeated (same pixels)
            im = im.convert(mode)
        if target is not None:
            w2, h2 = im.size
            if (left, top, right, bottom) != (0, 0, w2, h2) or (w2, h2) != target:
                im = im.resize(target, _RESAMPLE[self.resample], box=(left, top, right, bottom))
        else:
            im.load()
        if turn != 1:
            im = im.transpose(_TURN[turn])
        if im.mode != mode:
            im = im.convert(mode)
        return cast("PILImage", im)

    def decode_array(self, data: bytes, ident: int = 0, epoch: int | None = None, out: Any = None) -> Any:
        """``data`` decoded, cropped and resized as :meth:`decode_pil` does, as a ``uint8`` HWC numpy
        array (read-only when it is a view of a PIL image): through simplejpeg when it can
        (:func:`jpeg_backend`), else through PIL. With ``out`` (a batch's row: ``uint8``, CHW for a
        ``"tensor"`` output, else HWC), the pixels may be written into it instead: then ``out`` is
        returned.

        Raises:
            PIL.UnidentifiedImageError: not an image PIL reads.
            OSError: damaged image data.
        """
        import numpy as np

        arr = _simplejpeg_decode(self, data, ident, epoch, out) if self._jpeg == "simplejpeg" else None
        if arr is None:
            arr = np.asarray(self.decode_pil(data, ident, epoch))
        return arr[:, :, None] if arr.ndim == 2 else arr

    def __call__(self, data: bytes, sample: Mapping[str, Any] | None = None) -> Any:
        """One image: ``data`` decoded as the options say. ``sample`` (the dict the member belongs to)
        keys a random crop (its ``__index__``, or its shard and key); without it, the bytes' CRC does.

        Raises:
            PIL.UnidentifiedImageError: not an image PIL reads.
            OSError: damaged image data.
        """
        ident = (sample_ident(sample) if sample is not None else zlib.crc32(data)) if self.random else 0
        if self.output == "pil":
            return self.decode_pil(data, ident)
        if self.output == "numpy":
            arr = self.decode_array(data, ident)
            return arr if arr.flags.writeable and arr.flags.c_contiguous else arr.copy()  # writable, as a batch's rows are
        import torch

        if self.batchable:  # the output's shape is known: decoded straight into the tensor where it can be
            oh, ow = self.size or (0, 0)
            out = torch.empty((self.channels, oh, ow), dtype=torch.uint8)
            row = out.numpy()
            arr = self.decode_array(data, ident, None, row)
            if arr is not row:
                row[...] = arr.transpose(2, 0, 1)
            return out
        arr = self.decode_array(data, ident)
        out = torch.empty((arr.shape[2], arr.shape[0], arr.shape[1]), dtype=torch.uint8)
        out.numpy()[...] = arr.transpose(2, 0, 1)
        return out

    def decode_many(self, datas: Sequence[bytes], idents: Sequence[int], out: Any) -> list[BaseException | None]:
        """Decode ``datas`` into the rows of ``out`` (``uint8``: ``(N, C, H, W)`` for ``"tensor"``,
        ``(N, H, W, C)`` for ``"numpy"``; a numpy view), in this process's thread pool.

        Returns:
            Per image, ``None`` or the exception that stopped it (its row is then undefined).
        """
        epoch = self.epoch
        chw = self.output == "tensor"

        def one(k: int) -> BaseException | None:
            try:
                row = out[k]
                arr = self.decode_array(datas[k], idents[k], epoch, row)
                if arr is not row:
                    row[...] = arr.transpose(2, 0, 1) if chw else arr
            except Exception as exc:
                return exc
            return None

        threads = min(len(datas), self.threads or default_threads())
        if threads <= 1:
            return [one(k) for k in range(len(datas))]
        return list(_pool(threads).map(one, range(len(datas))))

    def __repr__(self) -> str:
        opts = [f"{k}={v!r}" for k, v in self.__dict__.items() if not k.startswith("_") and k != "size"]
        return f"Image({self.size!r}, {', '.join(opts)})"


# -- simplejpeg ------------------------------------------------------------------------------------

_SJ_SPACES = ("YCbCr", "RGB", "Gray")  # what simplejpeg decodes here; CMYK and YCCK go through PIL


def _simplejpeg_decode(image: Image, data: bytes, ident: int, epoch: int | None, out: Any = None) -> Any:
    """``data`` as :meth:`Image.decode_array` returns it, through simplejpeg: the same region and
    output as PIL's path, decoded at the same DCT scale; ``None`` where PIL must decode it (not a
    JPEG, CMYK or YCCK, an EXIF turn asked for, a color JPEG to gray, or data simplejpeg refuses:
    PIL then decodes it or names what is wrong)."""
    if data[:2] != b"\xff\xd8" or image.exif_orientation:
        return None
    import simplejpeg

    try:
        height, width, space, _ = simplejpeg.decode_jpeg_header(data)
    except Exception:  # any refusal: PIL decides
        return None
    gray = space == "Gray"
    mode = image.mode or ("L" if gray else "RGB")
    if space not in _SJ_SPACES or (mode == "L" and not gray):
        return None
    left, top, right, bottom = image.box(width, height, ident, epoch)
    scale = 1
    if image.size is not None and not image.exact:
        oh, ow = image.size
        scale = _dct_scale(right - left, bottom - top, (ow, oh), width, height)
    try:
        if scale > 1:  # the fast IDCT and upsampling, as PIL's draft decodes
            arr = simplejpeg.decode_jpeg(data, "GRAY" if gray else "RGB", True, True, -(-height // scale), -(-width // scale))
        else:
            arr = simplejpeg.decode_jpeg(data, "GRAY" if gray else "RGB")
    except Exception:  # damaged data, or a warning libjpeg recovers from: PIL decides
        return None
    if image.size is None:
        return _to_mode(arr, mode)
    h2, w2 = arr.shape[:2]
    fx, fy = w2 / width, h2 / height
    box = (min(left * fx, w2), min(top * fy, h2), min(right * fx, w2), min(bottom * fy, h2))
    oh, ow = image.size
    if box == (0, 0, w2, h2) and (w2, h2) == (ow, oh):
        return _to_mode(arr, mode)
    planar = image.output == "tensor"
    if out is not None and _native.SPEEDUPS is not None and arr.shape[2] == image.channels and image.resample != "nearest":
        return resize(arr, (oh, ow), box, image.resample, out, planar)  # straight into the batch's row
    return _to_mode(resize(arr, (oh, ow), box, image.resample), mode)


def _to_mode(arr: Any, mode: str) -> Any:
    """A decoded HW or HWx1 (gray) or HWx3 (RGB) array in ``mode``, as PIL converts (gray repeated,
    alpha 255)."""
    import numpy as np

    if arr.ndim == 2:
        arr = arr[:, :, None]
    have = arr.shape[2]
    want = {"L": 1, "RGB": 3, "RGBA": 4}[mode]
    if have == want:
        return arr
    out = np.empty((*arr.shape[:2], want), dtype=np.uint8)
    out[:, :, :3] = arr[:, :, :1] if have == 1 else arr
    if want == 4:
        out[:, :, 3] = 255
    return out


def resize(
    arr: Any, size: tuple[int, int], box: tuple[float, float, float, float], resample: Resample, out: Any = None, planar: bool = False
) -> Any:
    """The ``box`` region of ``arr`` (``uint8`` HWC, 1 to 4 bands, no alpha to premultiply) resized to
    ``size`` (height, width): the pixels ``PIL.Image.resize`` gives, computed by the C extension
    where it is built (in ``out`` when given: HWC, or CHW with ``planar``), else by PIL."""
    import numpy as np

    oh, ow = size
    c = arr.shape[2]
    speedups = _native.SPEEDUPS  # PIL's resize, in C (reference: PIL)
    if speedups is not None and resample != "nearest":
        if out is None:
            out = np.empty((c, oh, ow) if planar else (oh, ow, c), dtype=np.uint8)
        h, w = arr.shape[:2]
        speedups.resample(np.ascontiguousarray(arr), out, box, _RESAMPLE[resample], planar, _vertical_first(h, w, oh, ow))
        return out
    PIL = _pil()
    if c == 4:  # as RGBX: PIL premultiplies an RGBA image's alpha before it resizes
        im = PIL.frombytes("RGBX", (arr.shape[1], arr.shape[0]), np.ascontiguousarray(arr).tobytes())
    else:
        im = PIL.fromarray(arr[:, :, 0] if c == 1 else arr)
    got = np.asarray(im.resize((ow, oh), _RESAMPLE[resample], box=box))
    got = got[:, :, None] if got.ndim == 2 else got
    if out is None:
        return got.transpose(2, 0, 1) if planar else got
    out[...] = got.transpose(2, 0, 1) if planar else got
    return out


def _vertical_first(h: int, w: int, oh: int, ow: int) -> bool:
    """Whether PIL resizes down the columns first: Pillow 13 does when the height shrinks by more than
    twice as many pixels as the width; earlier releases never."""
    if not _PILLOW_13:
        from PIL import __version__

        _PILLOW_13.append(int(__version__.split(".")[0]) >= 13)
    return _PILLOW_13[0] and h - oh > 0 and h - oh > (w - ow) * 2


_PILLOW_13: list[bool] = []  # the installed PIL's rule, found at the first resize


# -- geometry helpers ---------------------------------------------------------------------------


def _random_resized(width: int, height: int, scale: tuple[float, float], ratio: tuple[float, float], draws: Iterator[float]) -> tuple[int, int, int, int]:
    """``(x, y, w, h)``: RandomResizedCrop's region: ten tries at an area in ``scale`` and a
    log-uniform aspect ratio in ``ratio`` that fit the image, else the central region with the
    image's aspect ratio clamped to ``ratio``."""
    area = width * height
    lo, hi = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(10):
        target = area * (scale[0] + (scale[1] - scale[0]) * next(draws))
        aspect = math.exp(lo + (hi - lo) * next(draws))
        w = round(math.sqrt(target * aspect))
        h = round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            x = min(width - w, int(next(draws) * (width - w + 1)))
            y = min(height - h, int(next(draws) * (height - h + 1)))
            return x, y, w, h
    own = width / height
    if own < ratio[0]:
        w, h = width, round(width / ratio[0])
    elif own > ratio[1]:
        w, h = round(height * ratio[1]), height
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h


def _unturn(box: tuple[float, float, float, float], w: float, h: float, turn: int) -> tuple[float, float, float, float]:
    """A box in the turned image (``w`` x ``h``, as shown) as a box in the stored image."""
    left, top, right, bottom = box
    if turn == 1:
        return box
    if turn == 2:  # mirrored left to right
        return (w - right, top, w - left, bottom)
    if turn == 3:  # turned 180
        return (w - right, h - bottom, w - left, h - top)
    if turn == 4:  # mirrored top to bottom
        return (left, h - bottom, right, h - top)
    if turn == 5:  # transposed
        return (top, left, bottom, right)
    if turn == 6:  # stored turned 90 counter-clockwise: shown = stored turned 270
        return (top, w - right, bottom, w - left)
    if turn == 7:  # transversed
        return (h - bottom, w - right, h - top, w - left)
    return (h - bottom, left, h - top, right)  # 8: stored turned 90 clockwise


def _dct_scale(crop_w: float, crop_h: float, target: tuple[int, int], width: int, height: int) -> int:
    """The largest DCT reduction (8, 4, 2, else 1) at which a ``crop_w`` x ``crop_h`` region still
    covers ``target`` (width, height) pixels."""
    for s in _SCALES:
        if crop_w / s >= target[0] and crop_h / s >= target[1] and s <= min(width, height):
            return s
    return 1


def _own_mode(im: Any) -> str:
    """``mode=None``: the image's own L, RGB or RGBA; other modes to RGB, or RGBA when they carry alpha."""
    if im.mode in ("L", "RGB", "RGBA"):
        return str(im.mode)
    return "RGBA" if "A" in im.getbands() or "transparency" in im.info else "RGB"


def _resample_table() -> dict[str, int]:
    return {"nearest": 0, "box": 4, "bilinear": 2, "hamming": 5, "bicubic": 3, "lanczos": 1}  # PIL.Image.Resampling values


_RESAMPLE = _resample_table()
_TURN = {2: 0, 3: 3, 4: 1, 5: 5, 6: 4, 7: 6, 8: 2}  # EXIF orientation -> the PIL.Image.Transpose value that turns it upright


# -- the thread pool ------------------------------------------------------------------------------

_POOL: list[Any] = [None, 0, 0]  # executor, its threads, the pid it belongs to
_POOL_LOCK = threading.Lock()


def _forget_pool() -> None:  # a forked child has none of the parent's threads
    global _POOL_LOCK
    _POOL[:] = [None, 0, 0]
    _POOL_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_forget_pool)


def _pool(threads: int) -> ThreadPoolExecutor:
    """This process's decoding pool, of ``threads`` threads (made anew when another count is asked)."""
    with _POOL_LOCK:
        pool, n, pid = _POOL
        if pool is None or n != threads or pid != os.getpid():
            if pool is not None and pid == os.getpid():
                pool.shutdown(wait=False)
            pool = ThreadPoolExecutor(threads, thread_name_prefix="tarindex-decode")
            _POOL[:] = [pool, threads, os.getpid()]
        return pool  # type: ignore[no-any-return]


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def default_threads() -> int:
    """Decoding threads for a batch: the CPUs this process may use, shared among DataLoader workers."""
    workers = 1
    data = sys.modules.get("torch.utils.data")
    if data is not None:
        info = data.get_worker_info()
        if info is not None:
            workers = info.num_workers
    return max(1, min(_MAX_THREADS, _cpus() // max(1, workers)))


def empty_rows(n: int, shape: tuple[int, ...], tensor: bool) -> tuple[Any, Any]:
    """``(array, numpy view)``: ``n`` rows of ``shape`` ``uint8``, a torch tensor when ``tensor`` (in
    shared memory inside a DataLoader worker, where the batch is sent to the main process without
    another copy, as torch's ``default_collate`` allocates), else a numpy array."""
    import numpy as np

    if not tensor:
        arr = np.empty((n, *shape), dtype=np.uint8)
        return arr, arr
    import torch

    full = (n, *shape)
    if torch.utils.data.get_worker_info() is not None:
        storage = torch.UntypedStorage._new_shared(math.prod(full))  # type: ignore[no-untyped-call]  # what default_collate uses
        strides = [math.prod(full[d + 1 :]) for d in range(len(full))]
        t = torch.empty(0, dtype=torch.uint8).set_(storage, 0, full, strides)
    else:
        t = torch.empty(full, dtype=torch.uint8)
    return t, t.numpy()

