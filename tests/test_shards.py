"""Shard patterns: expansion identical to webdataset's (braceexpand, ``::``, ``${VAR}``), globs, errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from braceexpand import UnbalancedBracesError, braceexpand
from hypothesis import given, settings
from hypothesis import strategies as st
from webdataset.shardlists import expand_urls

from tarindex.errors import PatternError, ShardNotFoundError
from tarindex.shards import expand_braces, expand_patterns, expand_shards

EXAMPLES = [
    ("train-{000..003}.tar", ["train-000.tar", "train-001.tar", "train-002.tar", "train-003.tar"]),
    ("s-{1..010}.tar", [f"s-{i:03d}.tar" for i in range(1, 11)]),  # padded to the wider bound
    ("x{a,{b,c}}y", ["xay", "xby", "xcy"]),
    ("{a..c}", ["a", "b", "c"]),
    ("{0..6..2}", ["0", "2", "4", "6"]),
    ("{3..1}", ["3", "2", "1"]),
    ("{-1..1}", ["-1", "0", "1"]),
    (r"a\{b,c\}", ["a{b,c}"]),
    (r"x{a,\\}\}", ["xa}", "x\\}"]),  # an escaped backslash as an alternative, then an escaped brace
    ("a{b,c}-{1..2}", ["ab-1", "ab-2", "ac-1", "ac-2"]),
    ("a-{0..1}.tar::b-{0..1}.tar", ["a-0.tar", "a-1.tar", "b-0.tar", "b-1.tar"]),
    ("s3://bucket/x-{00..02}.tar", ["s3://bucket/x-00.tar", "s3://bucket/x-01.tar", "s3://bucket/x-02.tar"]),
]


@pytest.mark.parametrize(("pattern", "expected"), EXAMPLES)
def test_examples_as_webdataset(pattern: str, expected: list[str]) -> None:
    assert expand_patterns(pattern) == expected
    assert expand_urls(pattern) == expected


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("a{b", r"'a\{b': unbalanced braces"),
        ("a{b,c}}", r"'a\{b,c\}\}': unbalanced braces"),
        ("a{b}.tar", r"'a\{b\}.tar': brace left unexpanded in 'a\{b\}.tar'"),
        ("x-{1..3}{}", r"brace left unexpanded"),
        ("", r"'': expands to an empty name"),
        ("a.tar::", r"'a.tar::': an empty pattern beside '::'"),
        ("${TARINDEX_TEST_UNSET}/a.tar", r"environment variable WDS_TARINDEX_TEST_UNSET is not set"),
    ],
)
def test_pattern_errors_name_the_pattern(pattern: str, message: str) -> None:
    with pytest.raises(PatternError, match=message):
        expand_shards(pattern)


def test_environment_variables_as_webdataset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WDS_ROOT", "/data/{a,b}")
    assert expand_patterns("${ROOT}/x.tar") == ["/data/a/x.tar", "/data/b/x.tar"] == expand_urls("${ROOT}/x.tar")


_PIECES = st.sampled_from(["a", "b", "0", "-", ".", ",", "{", "}", "..", "\\", "\\{", "\\}", "\\,", "\\\\", "{1..3}", "{001..10..3}", "{a..c}", "{5..2}"])


@settings(max_examples=800, deadline=None)
@given(st.lists(_PIECES, min_size=1, max_size=10), st.booleans())
def test_identical_to_braceexpand(pieces: list[str], join: bool) -> None:
    """Whatever the pattern: the same list as braceexpand (and webdataset), or an error where braceexpand
    fails or would hand back a name with an unescaped brace left in it."""
    pattern = "".join(pieces)
    if join:
        pattern = pattern + "::" + pattern[::-1]
    parts = pattern.split("::")
    expected: list[str] = []
    may_refuse = False  # a brace in braceexpand's names: escaped (kept) or left unexpanded (refused)
    for part in parts:  # the first part that fails decides the error: the parts are expanded in order
        try:
            names = list(braceexpand(part))
        except UnbalancedBracesError:
            with pytest.raises(PatternError, match=r"unbalanced braces|brace left unexpanded|empty"):
                expand_patterns(pattern)
            return
        if not part or "" in names:
            with pytest.raises(PatternError, match=r"empty|brace left unexpanded"):
                expand_patterns(pattern)
            return
        may_refuse = may_refuse or any("{" in n for n in names)
        expected += names
    try:
        got = expand_patterns(pattern)
    except PatternError as exc:
        assert may_refuse, exc
        return
    assert got == expected == expand_urls(pattern)


def test_escaped_brace_kept_unescaped_brace_refused() -> None:
    assert expand_braces(r"a\{1..2\}") == ["a{1..2}"]
    assert expand_braces(r"a\\{1..2}") == ["a\\1", "a\\2"]  # an escaped backslash, then a range
    with pytest.raises(PatternError):
        expand_braces("a{1..2")


def test_local_globs_and_patterns(tmp_path: Path) -> None:
    for name in ("b-1.tar", "a-2.tar", "a-1.tar", "c.txt"):
        (tmp_path / name).write_bytes(b"")
    assert expand_shards(f"{tmp_path}/a-*.tar::{tmp_path}/b-{{1..1}}.tar") == [
        f"{tmp_path}/a-1.tar",
        f"{tmp_path}/a-2.tar",
        f"{tmp_path}/b-1.tar",
    ]
    assert expand_shards(f"file://{tmp_path}/a-*.tar") == [f"file://{tmp_path}/a-1.tar", f"file://{tmp_path}/a-2.tar"]
    with pytest.raises(ShardNotFoundError, match=r"z-\*\.tar: no shard matches this pattern"):
        expand_shards(f"{tmp_path}/z-*.tar")
    with pytest.raises(ShardNotFoundError, match=r"z-\*\.tar: no shard matches this pattern"):
        expand_shards(f"file://{tmp_path}/z-*.tar")
    with pytest.raises(ShardNotFoundError, match=r"a-3\.tar: no such shard"):
        expand_shards(f"{tmp_path}/a-{{1..3}}.tar")
