"""The codec registry is the one place that knows codec names: every row has its stream walk, its index scan
and its random reader, and no module outside the registry branches on a codec's name."""

from __future__ import annotations

import re

from conftest import package_lines
from tarindex import _codecs
from tarindex.access import codecs as access_codecs
from tarindex.cli.compress_cmd import output_name
from tarindex.packing import _pattern
from tarindex.scan import LOCAL_SCANS
from tarindex.shards import SHARD_SUFFIXES

REGISTRY = {"_codecs.py", "compression.py", "access/codecs.py"}
"""The modules allowed to name codecs in a comparison: the registry, detection, and the random readers' rows."""

BRANCH = re.compile(
    r"""[=!]=\s*["'](?:tar|zstd|gzip)["']"""  # codec == "zstd", compression != "gzip"
    r"""|["'](?:tar|zstd|gzip)["']\s*[=!]="""  # "tar" == codec
    r"""|\bin\s*\(\s*["'](?:tar|zstd|gzip)["']"""  # codec in ("zstd", ...)
    r"""|(?<!def )\b(?:is_zstd|is_gzip|codec_of)\("""  # a codec test by content outside the registry
    r"""|\bcompression\s+is\s+(?:not\s+)?None"""  # an entry's codec taken for "plain tar" by its None
    r"""|endswith\(\s*\(?\s*["']\.(?:tar|tgz|tzst|gz|zst)"""  # a codec told by a name's ending: the rows' suffixes
)


def test_every_row_has_its_walk_its_scan_and_its_random_reader() -> None:
    assert [c.name for c in _codecs.CODECS] == ["tar", "zstd", "gzip"]
    assert set(LOCAL_SCANS) == set(_codecs.CODECS)
    assert list(access_codecs.RANDOM) == list(_codecs.CODECS)
    assert [c.compressed for c in _codecs.CODECS] == [False, True, True]
    assert {c.compression for c in _codecs.CODECS} == {None, "zstd", "gzip"}
    for row in _codecs.CODECS:
        assert _codecs.BY_ENTRY[row.compression] is row and _codecs.of_name(row.name) is row


def test_the_branch_pattern_finds_the_branches_it_forbids() -> None:
    for line in ('if codec == "zstd":', "elif info.compression != 'gzip':", 'if "tar" == c:', 'if c in ("tar", "zstd"):', "if is_zstd(head):", "if info.compression is None:", "x if row.compression is not None else y", 'if name.endswith((".tar.zst", ".tzst")):', "if p.endswith('.tgz'):"):
        assert BRANCH.search(line), line
    for line in ('return pattern, "zstd"', "def is_zstd(head: bytes) -> bool:", "if codec.compressed:", "compression: str | None = None", "if path.endswith(SHARD_SUFFIXES):"):
        assert not BRANCH.search(line), line


def test_no_module_outside_the_registry_branches_on_a_codec_name() -> None:
    assert package_lines(BRANCH, REGISTRY) == []


def test_a_name_ending_is_the_registry_s_wherever_a_name_is_read() -> None:
    assert SHARD_SUFFIXES == _codecs.SUFFIXES == (".tar", ".tar.zst", ".tar.zstd", ".tzst", ".tar.gz", ".tgz")
    for suffix in _codecs.SUFFIXES:  # each ending of every row: a glob's shard, compress's output name
        assert output_name(f"d/a{suffix.upper()}") == "a.tar.zst"
        assert _codecs.of_suffix(f"a{suffix}") is next(c for c in _codecs.CODECS if suffix in c.suffixes)
    assert _codecs.of_suffix("a.tar.bz2") is None and output_name("a.tar.bz2") == "a.tar.bz2.tar.zst"
    assert [_pattern(f"o-%03d{s}")[1] for s in (".tar", ".tar.zst", ".tar.zstd", ".TZST")] == [None, "zstd", "zstd", "zstd"]
