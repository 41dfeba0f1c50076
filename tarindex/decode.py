"""Decoders by extension, with WebDataset's extension names.

The extension's last part picks the decoder (``seg.png`` decodes as ``png``).
Images become PIL images, numpy ``uint8`` HWC or torch ``uint8`` CHW arrays
(``decode="pil"|"numpy"|"torch"``); audio a ``(samples, sample_rate)`` pair
through the optional ``soundfile``; ``json``, ``txt``/``text``, ``cls``/``cls2``/
``index``, ``npy``/``npz`` and ``pth``/``pt`` (``torch.load(weights_only=True)``)
have fixed decoders; everything else stays ``bytes``. Pickle-based extensions
(``pickle``, ``pkl``, ``pyd``) are decoded only with ``allow_pickle=True``.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Mapping
from typing import Any, Literal

__all__ = ["IMAGE_EXTENSIONS", "DecodeMode", "Decoder"]

DecodeMode = Literal["pil", "numpy", "torch"]
IMAGE_EXTENSIONS = frozenset(["jpg", "jpeg", "png", "ppm", "pgm", "pbm", "pnm", "webp", "bmp", "tif", "tiff", "gif"])
AUDIO_EXTENSIONS = frozenset(["wav", "flac", "ogg"])
PICKLE_EXTENSIONS = frozenset(["pickle", "pkl", "pyd"])


def _pil(data: bytes) -> Any:
    from PIL import Image

    img = Image.open(io.BytesIO(data))
    img.load()
    return img


def _image_array(data: bytes) -> Any:
    import numpy as np

    img = _pil(data)
    if img.mode not in ("L", "RGB", "RGBA"):
        img = img.convert("RGBA" if "A" in img.getbands() else "RGB")
    arr = np.asarray(img)
    return arr[:, :, None] if arr.ndim == 2 else arr


def _image_tensor(data: bytes) -> Any:
    import torch

    return torch.from_numpy(_image_array(data).copy()).permute(2, 0, 1).contiguous()


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
        mode: image output type; ``None`` leaves images as bytes.
        decoders: custom ``{extension: fn(bytes) -> value}``, tried before the
            built-in ones (full extension first, then its last part).
        allow_pickle: decode pickle-based members (``pickle``, ``pyd``; object
            arrays in ``npy``; full ``torch.load``). Never for untrusted shards.
    """

    def __init__(
        self,
        mode: DecodeMode | None = None,
        *,
        decoders: Mapping[str, Callable[[bytes], Any]] | None = None,
        allow_pickle: bool = False,
    ) -> None:
        if mode not in (None, "pil", "numpy", "torch"):
            raise ValueError(f"decode must be None, 'pil', 'numpy' or 'torch', not {mode!r}")
        self.mode = mode
        self.custom = dict(decoders or {})
        self.allow_pickle = allow_pickle
        self._cache: dict[str, Callable[[bytes], Any] | None] = {}

    def _builtin(self, ext: str) -> Callable[[bytes], Any] | None:
        p = self.allow_pickle
        if ext in IMAGE_EXTENSIONS:
            return {None: None, "pil": _pil, "numpy": _image_array, "torch": _image_tensor}[self.mode]
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
        fn = self.custom.get(ext) or self.custom.get(last) or self._builtin(last)
        self._cache[ext] = fn
        return fn

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        for ext, value in sample.items():
            if ext[:2] != "__" and isinstance(value, bytes):
                fn = self.for_extension(ext)
                if fn is not None:
                    sample[ext] = fn(value)
        return sample

    def __getstate__(self) -> dict[str, Any]:
        return {"mode": self.mode, "custom": self.custom, "allow_pickle": self.allow_pickle}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["mode"], decoders=state["custom"], allow_pickle=state["allow_pickle"])  # type: ignore[misc]
