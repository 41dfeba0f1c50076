"""Decoders by extension, with WebDataset's extension names and image specs.

The extension's last part picks the decoder (``seg.png`` decodes as ``png``). Images are decoded as
``decode=`` says: one of webdataset's image specs with webdataset's meaning (``"pil"``, ``"rgb8"``,
``"torchrgb8"``, ``"torchrgb"``, ... :data:`IMAGE_SPECS`), tarindex's ``"numpy"`` (``uint8`` HWC,
the image's own channels), or an :class:`Image` that decodes at the size the model needs. Audio
becomes a ``(samples, sample_rate)`` pair through the optional ``soundfile``; ``json``,
``txt``/``text``, ``cls``/``cls2``/``index``, ``npy``/``npz`` and ``pth``/``pt``
(``torch.load(weights_only=True)``) have fixed decoders; everything else stays ``bytes``.
Pickle-based extensions (``pickle``, ``pkl``, ``pyd``) are decoded only with ``allow_pickle=True``.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable, Mapping
from typing import Any, Literal

from . import _args
from ._image import Image, empty_rows, sample_ident
from .errors import counted

__all__ = ["IMAGE_EXTENSIONS", "IMAGE_SPECS", "DecodeMode", "Decoder", "Image"]

DecodeMode = Literal[
    "pil", "pill", "pilrgb", "pilrgba",
    "l8", "rgb8", "rgba8", "l", "rgb", "rgba",
    "torchl8", "torchrgb8", "torchrgba8", "torchl", "torchrgb", "torchrgba",
    "numpy",
]
IMAGE_EXTENSIONS = frozenset(["jpg", "jpeg", "png", "ppm", "pgm", "pbm", "pnm", "webp", "bmp", "tif", "tiff", "gif"])
AUDIO_EXTENSIONS = frozenset(["wav", "flac", "ogg"])
PICKLE_EXTENSIONS = frozenset(["pickle", "pkl", "pyd"])

IMAGE_SPECS: dict[str, tuple[str, str | None, str]] = {
    **{
        f"{'' if kind == 'numpy' else kind}{channels}{'8' if element == 'uint8' else ''}": (kind, element, channels)
        for kind in ("numpy", "torch")
        for element in ("uint8", "float")
        for channels in ("l", "rgb", "rgba")
    },
    "pill": ("pil", None, "l"),
    "pil": ("pil", None, "rgb"),
    "pilrgb": ("pil", None, "rgb"),
    "pilrgba": ("pil", None, "rgba"),
}
"""webdataset's image specs, with webdataset's meanings: ``(array type, element type, channels)``.
``uint8`` values are 0-255, ``float`` ones ``float32`` in ``[0, 1]``; torch arrays are CHW and numpy
ones HWC, except ``l`` specs, whose arrays are 2-D (HW), as webdataset makes them. Not here:
webdataset's ``"torch"`` (float RGB), refused because tarindex's ``"torch"`` meant ``uint8``."""

_TORCH_REFUSED = (
    "decode='torch' is ambiguous: webdataset's 'torch' is float32 RGB CHW in [0, 1], spelled 'torchrgb' here; "
    "tarindex's own 'torch' was uint8 CHW, spelled 'torchrgb8' (RGB) or tarindex.decode.Image(output='tensor', mode=None) "
    "(the image's own channels)"
)


class _Spec:
    """One of webdataset's image specs (:data:`IMAGE_SPECS`), decoded as webdataset decodes it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.kind, self.element, self.channels = IMAGE_SPECS[name]

    def __call__(self, data: bytes) -> Any:
        from PIL import Image as PIL

        with io.BytesIO(data) as f:
            opened = PIL.open(f)
            opened.load()
        img = opened.convert(self.channels.upper())
        if self.kind == "pil":
            return img
        import numpy as np

        arr = np.asarray(img)
        if self.element == "float":
            arr = arr.astype(np.float32) / 255.0
        if self.kind == "numpy":
            return arr
        import torch

        return torch.from_numpy(arr.transpose(2, 0, 1).copy() if arr.ndim == 3 else arr.copy())

    def __reduce__(self) -> tuple[Any, ...]:
        return (_Spec, (self.name,))


def _image_decoder(mode: str | Image) -> Callable[..., Any]:
    """The image decoder ``decode=mode`` names.

    Raises:
        ValueError: a name that is not a spec (``"torch"``, with the spellings to use).
    """
    if isinstance(mode, Image):
        return mode
    if mode == "torch":
        raise ValueError(_TORCH_REFUSED)
    if mode == "numpy":
        return Image(mode=None, output="numpy")
    if mode not in IMAGE_SPECS:
        names = ", ".join(repr(n) for n in [*IMAGE_SPECS, "numpy"])
        raise ValueError(f"decode must be None, a tarindex.decode.Image or one of {names}, not {mode!r}")
    return _Spec(mode)


_ADDRESS = re.compile(r" ?<[\w.]+ object at 0x[0-9a-fA-F]+>")
"""An object's default repr in a decoder's message (PIL's ``cannot identify image file <_io.BytesIO object
at 0x...>``): an address that says nothing about the data."""
_HEAD = 16
"""Leading bytes of a member that failed to decode, shown in the message (an HTML page saved as .jpg shows)."""


def failure(exc: BaseException) -> str:
    """What failed, for a :class:`~tarindex.errors.DecodeError` message: the member (when a member's
    decoder failed: its extension, size and first bytes), the exception's type and text (without the
    address of an in-memory file the decoder read from)."""
    member = getattr(exc, "tarindex_member", None)
    head = getattr(exc, "tarindex_head", None)
    where = f"member {member!r}: " if member is not None else ""
    seen = f" (the member: {counted(head[0], 'byte')}, starting {head[1]!r})" if member is not None and head is not None else ""
    return f"{where}{type(exc).__name__}: {_ADDRESS.sub('', str(exc))}{seen}"


def _tag(exc: BaseException, ext: str, data: bytes | None = None) -> BaseException:
    """``exc`` marked with the member it came from and, when given, the member's size and first bytes (read
    by :func:`failure`)."""
    try:
        exc.tarindex_member = ext  # type: ignore[attr-defined]
        if data is not None:
            exc.tarindex_head = (len(data), bytes(data[:_HEAD]))  # type: ignore[attr-defined]
    except AttributeError:  # an exception type without a __dict__
        pass
    return exc


def _audio(data: bytes) -> Any:
    try:
        import soundfile
    except ImportError as exc:
        raise ImportError("decoding audio needs soundfile: pip install 'tarindex[audio]'") from exc
    return soundfile.read(io.BytesIO(data))


def _npy(data: bytes, allow_pickle: bool) -> Any:
    import numpy as np

    return np.load(io.BytesIO(data), allow_pickle=allow_pickle)


def _npz(data: bytes, allow_pickle: bool) -> Any:
    import numpy as np

    with np.load(io.BytesIO(data), allow_pickle=allow_pickle) as z:
        return {k: z[k] for k in z.files}


def _torch(data: bytes, allow_pickle: bool) -> Any:
    import torch

    return torch.load(io.BytesIO(data), weights_only=not allow_pickle)


def _pickle(data: bytes) -> Any:
    import pickle

    return pickle.loads(data)


class Decoder:
    """Decode the members of a sample dict in place, by extension.

    Args:
        mode: how images decode: one of webdataset's image specs (:data:`IMAGE_SPECS`: ``"pil"``,
            ``"rgb8"``, ``"torchrgb8"``, ``"torchrgb"``, ...), ``"numpy"`` (``uint8`` HWC, the image's
            own channels), or an :class:`Image`; ``None`` leaves images as bytes.
        decoders: custom ``{extension: fn(bytes) -> value}`` (an :class:`Image` too), tried before
            the built-in ones (full extension first, then its last part).
        allow_pickle: decode pickle-based members (``pickle``, ``pyd``; object arrays in ``npy``;
            full ``torch.load``). Never for untrusted shards.

    Raises:
        ValueError: an unknown ``mode``; ``"torch"``, whose meaning differs between webdataset
            (float32 in [0, 1]) and earlier tarindex (``uint8``): the message names both spellings.
        OptionTypeError: ``decoders`` is not a mapping of extension to function (``["jpg"]``).
    """

    def __init__(
        self,
        mode: DecodeMode | Image | None = None,
        *,
        decoders: Mapping[str, Callable[[bytes], Any]] | None = None,
        allow_pickle: bool = False,
    ) -> None:
        self._image = _image_decoder(mode) if mode is not None else None
        self.mode = mode
        self.custom = _args.decoders(decoders) or {}
        self.allow_pickle = allow_pickle
        self._cache: dict[str, Callable[[bytes], Any] | None] = {}

    def _builtin(self, ext: str) -> Callable[[bytes], Any] | None:
        p = self.allow_pickle
        if ext in IMAGE_EXTENSIONS:
            return self._image
        if ext in AUDIO_EXTENSIONS:
            return _audio
        if ext == "json":
            return json.loads
        if ext in ("txt", "text"):
            return lambda b: b.decode("utf-8")
        if ext in ("cls", "cls2", "index"):
            return lambda b: int(b.strip())
        if ext == "npy":
            return lambda b: _npy(b, p)
        if ext == "npz":
            return lambda b: _npz(b, p)
        if ext in ("pth", "pt"):
            return lambda b: _torch(b, p)
        if ext in PICKLE_EXTENSIONS and p:
            return _pickle
        return None

    def for_extension(self, ext: str) -> Callable[[bytes], Any] | None:
        """The decoder for one extension, or ``None`` to keep bytes."""
        try:
            return self._cache[ext]
        except KeyError:
            pass
        last = ext.rsplit(".", 1)[-1]
        fn = self.custom.get(ext) or self.custom.get(last) or self._builtin(last.lower())
        self._cache[ext] = fn
        return fn

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        """``sample`` with its members decoded (in place).

        Raises:
            Exception: what a member's decoder raised, marked with the member (see :func:`failure`).
        """
        for ext, value in sample.items():
            if ext[:2] != "__" and isinstance(value, bytes):
                fn = self.for_extension(ext)
                if fn is not None:
                    try:
                        sample[ext] = fn(value, sample) if isinstance(fn, Image) else fn(value)
                    except Exception as exc:
                        _tag(exc, ext, value)
                        raise
        return sample

    def set_epoch(self, epoch: int) -> None:
        """The epoch of every :class:`Image` decoder here (random crops are drawn per epoch)."""
        for fn in (self._image, *self.custom.values()):
            if isinstance(fn, Image):
                fn.set_epoch(epoch)

    @property
    def batches(self) -> bool:
        """Whether a batch of samples decodes some images into one array (:meth:`decode_batch`)."""
        return any(isinstance(fn, Image) and fn.batchable for fn in (self._image, *self.custom.values()))

    def decode_batch(self, samples: list[dict[str, Any]]) -> list[BaseException | None]:
        """Decode ``samples`` in place: each member that every sample has and that an :class:`Image`
        with a size decodes goes into one preallocated ``uint8`` array (``N`` rows, decoded in a
        thread pool), each sample's value a view of its row; the other members as ``__call__`` does.

        Returns:
            Per sample, ``None`` or the first exception of its members (marked with the member, see
            :func:`failure`); such a sample is left partly decoded.
        """
        errors: list[BaseException | None] = [None] * len(samples)
        if not samples:
            return errors
        zeros = [0] * len(samples)
        idents: list[int] | None = None  # the random crops' keys, computed once when a crop is random
        for ext, value in samples[0].items():
            fn = self.for_extension(ext) if ext[:2] != "__" and isinstance(value, bytes) else None
            if not (isinstance(fn, Image) and fn.batchable and all(isinstance(s.get(ext), bytes) for s in samples)):
                continue
            if fn.random and idents is None:
                idents = [sample_ident(s) for s in samples]
            oh, ow = fn.size or (0, 0)
            c = fn.channels
            rows, view = empty_rows(len(samples), (c, oh, ow) if fn.output == "tensor" else (oh, ow, c), fn.output == "tensor")
            failed = fn.decode_many([s[ext] for s in samples], idents if fn.random and idents is not None else zeros, view)
            for k, s in enumerate(samples):
                if failed[k] is None:
                    s[ext] = rows[k]
                elif errors[k] is None:
                    errors[k] = _tag(failed[k], ext, s[ext])  # type: ignore[arg-type]
        for k, s in enumerate(samples):
            if errors[k] is None:
                try:
                    self(s)
                except Exception as exc:
                    errors[k] = exc
        return errors

    def __getstate__(self) -> dict[str, Any]:
        return {"mode": self.mode, "custom": self.custom, "allow_pickle": self.allow_pickle}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["mode"], decoders=state["custom"], allow_pickle=state["allow_pickle"])  # type: ignore[misc]
