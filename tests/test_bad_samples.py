"""Bad samples: TarDataset(on_error="skip", max_errors=...), TarStream(handler=..., max_errors=...),
and errors raised in DataLoader workers."""

from __future__ import annotations

import io
import logging
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch.utils.data

from conftest import py_tar
from tarindex import CorruptArchiveError, DecodeError, TarDataset, TarStream, build_index, compress_shard
from tarindex.errors import StreamWarning

BAD = {3: "garbage", 7: "truncated", 9: "garbage", 10: "garbage"}


def _jpeg(i: int) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(np.full((24, 32, 3), i * 20, dtype=np.uint8)).save(out, "JPEG", quality=90)
    return out.getvalue()


@pytest.fixture
def shard(tmp_path: Path) -> Path:
    """12 samples of jpg + cls: sample 3 is not a JPEG, 7 is a JPEG cut in half, 9 and 10 are not JPEGs."""
    specs = []
    for i in range(12):
        data = _jpeg(i)
        if BAD.get(i) == "garbage":
            data = b"this is not a jpeg" * 10
        elif BAD.get(i) == "truncated":
            data = data[: len(data) // 2]
        specs += [(f"s{i:02d}.jpg", data), (f"s{i:02d}.cls", str(i).encode())]
    return py_tar(tmp_path / "bad-000000.tar", specs, tarfile.GNU_FORMAT, dirs=False)


def _offsets(path: Path) -> dict[str, int]:
    """The oracle: each sample's first header offset, by tarfile."""
    out: dict[str, int] = {}
    with tarfile.open(path) as tf:
        for m in tf:
            out.setdefault(m.name.split(".")[0], m.offset)
    return out


def test_skip_returns_the_next_readable_sample_and_logs_shard_and_offset(shard: Path, caplog: pytest.LogCaptureFixture) -> None:
    index = build_index([str(shard)]).path
    ds = TarDataset(index, decode="numpy", on_error="skip", max_errors=3)
    with caplog.at_level(logging.WARNING, logger="tarindex"):
        got = [ds[i]["__key__"] for i in range(len(ds))]
    assert got == ["s00", "s01", "s02", "s04", "s04", "s05", "s06", "s08", "s08", "s11", "s11", "s11"]  # the epoch completes
    offsets = _offsets(shard)
    logged = "\n".join(r.getMessage() for r in caplog.records)
    for i in BAD:
        assert f"skipping sample {i} " in logged and f"{shard}: sample 's{i:02d}': " in logged, i
        assert f"at offset {offsets[f's{i:02d}']}" in logged, i
    assert "(2 in a row, max_errors=3)" in logged


def test_max_errors_raises_the_last_failure(shard: Path) -> None:
    index = build_index([str(shard)]).path
    ds = TarDataset(index, decode="numpy", on_error="skip", max_errors=2)
    assert ds[3]["__key__"] == "s04"  # one failure, then a good sample: the count starts again
    with pytest.raises(DecodeError, match=rf"{shard}: sample 's10': .* at offset {_offsets(shard)['s10']}"):
        ds[9]  # 9 and 10 fail: two in a row


def test_raise_names_shard_and_offset_and_keeps_its_type_through_workers(shard: Path) -> None:
    index = build_index([str(shard)]).path
    off = _offsets(shard)["s07"]
    with pytest.raises(DecodeError, match=rf"{shard}: sample 's07': member 'jpg': OSError: (?i:truncated).* at offset {off}"):
        TarDataset(index, decode="pil")[7]
    loader = torch.utils.data.DataLoader(TarDataset(index, decode="numpy"), batch_size=None, num_workers=2, collate_fn=_key)
    with pytest.raises(DecodeError, match=rf"{shard}: sample 's03': .* at offset {_offsets(shard)['s03']}"):
        list(loader)
    skipping = torch.utils.data.DataLoader(
        TarDataset(index, decode="numpy", on_error="skip"), batch_size=4, num_workers=2, collate_fn=_keys
    )
    assert sum(len(b) for b in skipping) == 12


def _key(sample: dict) -> str:
    return str(sample["__key__"])


def _keys(batch: list[dict]) -> list[str]:
    return [s["__key__"] for s in batch]


def test_damaged_zstd_frame_is_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    specs = [(f"k{i:03d}.bin", os.urandom(3000)) for i in range(40)]
    plain = py_tar(tmp_path / "z.tar", specs, tarfile.GNU_FORMAT, dirs=False)
    zst = tmp_path / "z-000000.tar.zst"
    frames = compress_shard(plain, zst, frame_size=8000)
    assert len(frames) > 4
    index = build_index([str(zst)]).path
    st = os.stat(zst)
    data = bytearray(zst.read_bytes())
    middle = sum(c for c, _ in frames[:2]) + 20  # inside the third frame
    data[middle : middle + 64] = bytes(64)
    zst.write_bytes(bytes(data))
    os.utime(zst, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size and mtime: the stat check passes
    with pytest.raises(CorruptArchiveError):
        [TarDataset(index)[i] for i in range(40)]
    ds = TarDataset(index, on_error="skip", max_errors=40)
    with caplog.at_level(logging.WARNING, logger="tarindex"):
        keys = [ds[i]["__key__"] for i in range(40)]
    assert len(set(keys)) < 40 and keys[0] == "k000" and keys[-1] == "k039"
    assert str(zst) in caplog.text


def test_stream_max_errors(shard: Path) -> None:
    with pytest.warns(StreamWarning) as warned:
        keys = [s["__key__"] for s in TarStream([str(shard)], decode="numpy", handler="warn", max_errors=3)]
    assert keys == [f"s{i:02d}" for i in range(12) if i not in BAD]
    assert [str(w.message).rsplit("(", 1)[-1] for w in warned] == ["1 in a row)", "1 in a row)", "1 in a row)", "2 in a row)"]
    with pytest.warns(StreamWarning), pytest.raises(DecodeError, match=rf"{shard}: sample 's10'.* at offset"):
        list(TarStream([str(shard)], decode="numpy", handler="warn", max_errors=2))
