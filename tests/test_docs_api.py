"""The documentation against the code: signatures, keywords, CLI options, option tables, extras, installs, links.

``tests/test_docs.py`` runs the examples; this file checks what examples do not run: the signatures the
pages write out (a fenced block marked ``<!-- docs-test: skip (signatures...) -->``) against
:func:`inspect.signature`, every keyword that a page passes to a public name or to a method of a public class
(in code blocks and in inline code) against its parameters, ``docs/cli.md``'s command table against the click
commands, every table that gives a default of ``SourceOptions`` or ``compression.Limits`` against the
dataclass, the C files ``docs/dataset.md`` names, the extras pages name against ``pyproject.toml``, every
``pip install`` against ``constraints.txt``, every page against ``mkdocs.yml``, references to a section of
another page against its headings, machine paths, and ``docs/performance.md``'s shape (a table, a date and a
command per workload; ratios the chart can draw).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click
import pytest
import tomllib
import yaml
from test_docs import DOCS, ROOT, Block, blocks

import tarindex
import tarindex.options
from tarindex.cli.main import COMMANDS
from tarindex.options import SourceOptions

# The names a page may call with keywords: the front door and the public modules' names.
_PUBLIC_MODULES = ("collate", "compression", "decode", "options", "sources", "zstd", "stream", "sampler")


def _public() -> dict[str, Callable[..., Any]]:
    found: dict[str, Callable[..., Any]] = {}
    for module in _PUBLIC_MODULES:
        mod = importlib.import_module(f"tarindex.{module}")
        for name in mod.__all__:
            if callable(obj := getattr(mod, name)):
                found[f"{module}.{name}"] = obj
    for name in tarindex.__all__:
        obj = getattr(tarindex, name)
        if name != "__version__" and callable(obj) and not (isinstance(obj, type) and issubclass(obj, BaseException | Warning)):
            found[name] = obj
    return found


PUBLIC = _public()
_SHORT = {dotted.rsplit(".", 1)[-1]: obj for dotted, obj in PUBLIC.items()}  # Image, collate, TarDataset, ...


def _parameters(obj: Callable[..., Any]) -> dict[str, inspect.Parameter]:
    """The parameters of ``obj``; a ``**kwargs: Unpack[SomeTypedDict]`` of ``tarindex.options`` stands for the
    typed dict's keys (keyword-only, ``None`` by default), so that they are checked as the other keywords are."""
    found: dict[str, inspect.Parameter] = {}
    for name, param in inspect.signature(obj).parameters.items():
        typed = re.fullmatch(r"Unpack\[(\w+)\]", str(param.annotation)) if param.kind is param.VAR_KEYWORD else None
        if typed is None:
            found[name] = param
            continue
        for key in getattr(tarindex.options, typed.group(1)).__annotations__:
            found[key] = inspect.Parameter(key, inspect.Parameter.KEYWORD_ONLY, default=None)
    return found


def _takes_any_keyword(obj: Callable[..., Any]) -> bool:
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in _parameters(obj).values())


# --- signatures written out -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Written:
    """One signature a page writes out: ``tarindex.Name(params)``."""

    where: str
    name: str
    params: list[str]
    """The parameters as written, ``*`` included (``name``, ``name=default``, ``*``)."""


def _split_top(text: str) -> list[str]:
    """``text`` split at the commas outside brackets and strings."""
    parts, depth, quote, cur = [], 0, "", []
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
            continue
        cur.append(ch)
    if "".join(cur).strip():
        parts.append("".join(cur).strip())
    return parts


def _balanced(text: str, start: int) -> int:
    """The index of the ``)`` that closes the ``(`` at ``start``."""
    depth = 0
    for k in range(start, len(text)):
        if text[k] == "(":
            depth += 1
        elif text[k] == ")":
            depth -= 1
            if depth == 0:
                return k
    raise ValueError(f"unbalanced parentheses from {text[start:start + 60]!r}")


_SIGNATURE_START = re.compile(r"(?<![\w.])tarindex\.([\w.]+)\(")


def _without_comments(code: str) -> str:
    return "\n".join(line.split("  #", 1)[0] if not line.lstrip().startswith("#") else "" for line in code.splitlines())


def written_signatures(block: Block) -> Iterator[Written]:
    code = _without_comments(block.code)
    for m in _SIGNATURE_START.finditer(code):
        name = m.group(1)
        if name not in PUBLIC:
            continue
        end = _balanced(code, m.end() - 1)
        line = block.line + code[: m.start()].count("\n")
        yield Written(f"{block.path}:{line}", name, _split_top(code[m.end() : end].replace("\n", " ")))


def signature_blocks() -> list[Block]:
    return [b for doc in DOCS for b in blocks(doc) if b.skip and b.skip.startswith("signatures")]


def _default_of(text: str) -> tuple[bool, Any]:
    """The value a written default stands for, when it is a plain expression (``None``, ``1 << 20``, ``3e9``)."""
    try:
        return True, eval(compile(text, "<docs>", "eval"), {"__builtins__": {}}, {})  # literals and operators from our own docs
    except Exception:  # a description (None | "zstd"), not a value: compared by name only
        return False, None


def _real_default(obj: Callable[..., Any], param: inspect.Parameter) -> Any:
    """A parameter's default; a dataclass field's factory called (``headers={}`` of ``SourceOptions``)."""
    if dataclasses.is_dataclass(obj):
        field = next((f for f in dataclasses.fields(obj) if f.name == param.name), None)
        if field is not None and field.default_factory is not dataclasses.MISSING:
            return field.default_factory()
    return param.default


def signature_mismatches(written: Written) -> list[str]:
    """What a written signature gets wrong: names, order, keyword-only marker, defaults, parameters left out."""
    obj = PUBLIC[written.name]
    actual = [p for p in _parameters(obj).values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    problems: list[str] = []
    keyword_only = abridged = False
    names: list[str] = []
    for param in written.params:
        if param == "...":  # the rest left out on purpose: no completeness check
            abridged = True
            continue
        if param == "*":
            keyword_only = True
            continue
        name, eq, default = param.partition("=")
        name, default = name.strip(), default.strip()
        names.append(name)
        real = next((p for p in actual if p.name == name), None)
        if real is None:
            problems.append(f"{name}: no such parameter")
            continue
        if (real.kind is real.KEYWORD_ONLY) != keyword_only:
            problems.append(f"{name}: {'keyword-only' if real.kind is real.KEYWORD_ONLY else 'positional'} in the code")
        if eq and default:
            known, value = _default_of(default)
            if known and real.default is not inspect.Parameter.empty and value != _real_default(obj, real):
                problems.append(f"{name}: default {default} written, {_real_default(obj, real)!r} in the code")
        elif eq and real.default is inspect.Parameter.empty:
            problems.append(f"{name}: written with a default, required in the code")
    order = [p.name for p in actual if p.name in names]
    if order != [n for n in names if n in order]:
        problems.append(f"order {names} written, {order} in the code")
    left_out = [p.name for p in actual if p.name not in names]
    if left_out and not abridged:
        problems.append(f"left out: {', '.join(left_out)}")
    return problems


# Pages known to be behind the code, each with what is wrong: their signatures, their references to sections of
# other pages. Strict: once a page is fixed, its entry must go (its case then passes unexpectedly, which fails).
BEHIND_SIGNATURES: dict[str, str] = {}
BEHIND_REFERENCES: dict[str, str] = {}


def _marked(pages: list[str], behind: dict[str, str]) -> list[Any]:
    return [pytest.param(p, marks=pytest.mark.xfail(strict=True, reason=behind[p])) if p in behind else p for p in pages]


def _pages_with_signatures() -> list[Any]:
    return _marked(sorted({b.path for b in signature_blocks()}), BEHIND_SIGNATURES)


def test_the_api_page_writes_out_every_public_callable() -> None:
    """docs/api.md's block names every public function and class (the front door's and the public modules'),
    each once under its public name; exceptions, protocols and type aliases aside."""
    written = [w.name for b in signature_blocks() if b.path == "docs/api.md" for w in written_signatures(b)]
    returned = {"BuildReport", "VerifyReport", "PackReport", "Mix", "sources.Source"}  # made by the library, not by users
    front = {id(getattr(tarindex, n)) for n in tarindex.__all__}
    wanted = {
        name for name, obj in PUBLIC.items()
        if (inspect.isfunction(obj) or inspect.isclass(obj)) and not getattr(obj, "_is_protocol", False)
        and name not in returned and ("." not in name or id(obj) not in front)
    }  # fmt: skip
    assert sorted(written) == sorted(set(written)), "a callable written twice"
    assert set(written) == wanted, (wanted - set(written), set(written) - wanted)


@pytest.mark.parametrize("page", _pages_with_signatures())
def test_written_signatures_match_the_code(page: str) -> None:
    found = {}
    for block in signature_blocks():
        if block.path == page:
            for written in written_signatures(block):
                if problems := signature_mismatches(written):
                    found[f"{written.where} {written.name}"] = problems
    assert found == {}


def test_the_signature_check_sees_a_wrong_signature() -> None:
    """The checker itself: a parameter renamed, one left out, a wrong default and a lost ``*`` are each named."""
    ok = Written("x", "verify_index", ["path", "*", "deep=False", "allow_commands=False", "progress=None", "shards=None"])
    assert signature_mismatches(ok) == []
    bad = Written("x", "verify_index", ["path", "deep=True", "allow_command=False"])
    problems = "; ".join(signature_mismatches(bad))
    for what in ("deep: keyword-only in the code", "deep: default True written", "allow_command: no such parameter", "left out: allow_commands, progress"):
        assert what in problems, problems


# --- keywords a page passes ---------------------------------------------------------------------------


def _called_name(func: ast.expr, imported: dict[str, str]) -> str | None:
    """The public name a call calls: ``tarindex.X(...)``, ``tarindex.mod.X(...)``, or a name imported from tarindex."""
    parts: list[str] = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if not isinstance(func, ast.Name):
        return None
    parts.append(imported.get(func.id, func.id))
    dotted = ".".join(reversed(parts))
    if dotted.startswith("tarindex."):
        dotted = dotted.removeprefix("tarindex.")
        return dotted if dotted in PUBLIC else None
    return None


def _nodes(block: Block) -> list[ast.AST]:
    """Every node of a Python block's syntax tree (none when it does not parse: text that only looks like code)."""
    try:
        return list(ast.walk(ast.parse(block.code)))
    except SyntaxError:
        return []


def code_calls(block: Block) -> Iterator[tuple[str, str, list[str]]]:
    """``(where, public name, keywords)`` of each call of a public name in a Python block."""
    nodes = _nodes(block)
    imported: dict[str, str] = {}
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tarindex"):
            for alias in node.names:
                imported[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    for node in nodes:
        if isinstance(node, ast.Call) and (name := _called_name(node.func, imported)):
            keywords = [k.arg for k in node.keywords if k.arg is not None]
            yield f"{block.path}:{block.line + node.lineno - 1}", name, keywords


_INLINE = re.compile(r"`((?:tarindex\.)?(?:[a-z_]+\.)?([A-Za-z_]\w*))\(([^`]*)\)`")


def inline_calls(doc: Path) -> Iterator[tuple[str, str, list[str]]]:
    """``(where, public name, keywords)`` of each inline code span that calls a public name with keywords
    (``TarDataset(..., verify="fingerprint")``)."""
    rel = str(doc.relative_to(ROOT))
    for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
        for m in _INLINE.finditer(line):
            written, short, inside = m.groups()
            target = written.removeprefix("tarindex.")
            name = target if target in PUBLIC else (short if short in _SHORT and "." not in target else None)
            if name is None:
                continue
            keywords = re.findall(r"(?:^|[,(]\s*)([A-Za-z_]\w*)\s*=(?!=)", inside)
            yield f"{rel}:{number}", name, keywords


def _callee(name: str) -> Callable[..., Any]:
    return PUBLIC[name] if name in PUBLIC else _SHORT[name]


def unknown_keywords() -> list[str]:
    found = []
    for doc in DOCS:
        calls = [c for b in blocks(doc) if b.lang == "python" for c in code_calls(b)]
        calls += list(inline_calls(doc))
        for where, name, keywords in calls:
            callee = _callee(name)
            if _takes_any_keyword(callee):
                continue
            params = _parameters(callee)
            found += [f"{where}: {name}({k}=...): no such parameter" for k in keywords if k not in params]
    return found


def test_every_keyword_the_docs_pass_exists() -> None:
    assert unknown_keywords() == []


def _methods() -> dict[str, list[Callable[..., Any]]]:
    """The public methods of the public classes, by name (``state_dict``: the samplers', the stream's, ``Mix``'s)."""
    found: dict[str, list[Callable[..., Any]]] = {}
    classes = {obj for obj in PUBLIC.values() if inspect.isclass(obj)} | {tarindex.Mix}
    for cls in classes:
        for name, member in inspect.getmembers(cls, inspect.isfunction):
            if not name.startswith("_"):
                found.setdefault(name, []).append(member)
    return found


def method_calls(block: Block) -> Iterator[tuple[str, str, list[str]]]:
    """``(where, method name, keywords)`` of each ``x.name(..., kw=...)`` call with keywords in a Python block."""
    for node in _nodes(block):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.keywords:
            keywords = [k.arg for k in node.keywords if k.arg is not None]
            yield f"{block.path}:{block.line + node.lineno - 1}", node.func.attr, keywords


def inline_method_calls(doc: Path) -> Iterator[tuple[str, str, list[str]]]:
    """``(where, method name, keywords)`` of each method call with keywords in an inline code span that parses as
    Python (``sampler.state_dict(consumed=...)``; a span starting with ``.`` is read as a method of ``x``)."""
    rel = str(doc.relative_to(ROOT))
    for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
        for m in re.finditer(r"`([^`]*\w\([^`]*\))`", line):
            code = m.group(1).replace("...", "x")
            block = Block(rel, number, "python", "x" + code if code.startswith(".") else code, None, None)
            yield from method_calls(block)


def method_keyword_problems(calls: list[tuple[str, str, list[str]]]) -> tuple[int, list[str]]:
    """How many calls name a method of a public class, and their keywords that no such method takes."""
    methods = _methods()
    checked, found = 0, []
    for where, name, keywords in calls:
        if name not in methods or any(_takes_any_keyword(m) for m in methods[name]):
            continue  # another library's method (DataLoader, torch), or one taking any keyword
        checked += 1
        known = {p for m in methods[name] for p in _parameters(m)}
        found += [f"{where}: .{name}({k}=...): no such parameter" for k in keywords if k not in known]
    return checked, found


def test_every_keyword_the_docs_pass_to_a_method_exists() -> None:
    """A keyword passed to a method that a public class has (``sampler.state_dict(consumed=...)``,
    ``stream.batched(64, partial=False)``) is a parameter of that method in one of the classes that have it."""
    calls = [c for doc in DOCS for block in blocks(doc) if block.lang == "python" for c in method_calls(block)]
    calls += [c for doc in DOCS for c in inline_method_calls(doc)]
    checked, found = method_keyword_problems(calls)
    assert checked >= 3 and found == []
    block = Block("x.md", 1, "python", "s.state_dict(consumd=3)\nloader.to(device='cpu')\n", None, None)
    assert method_keyword_problems(list(method_calls(block))) == (1, ["x.md:1: .state_dict(consumd=...): no such parameter"])


# --- the CLI table --------------------------------------------------------------------------------------


def _cli_rows() -> dict[str, str]:
    """``docs/cli.md``'s command table: command name -> its usage cell."""
    rows = {}
    for line in (ROOT / "docs" / "cli.md").read_text().splitlines():
        m = re.match(r"^\| `(\w+) ([^`]*)` \|", line)
        if m:
            rows[m.group(1)] = m.group(2)
    return rows


def _command(name: str) -> click.Command:
    return importlib.import_module(f"tarindex.cli.{name}_cmd").command


def _options_of(cmd: click.Command) -> tuple[set[str], list[set[str]]]:
    """Every option spelling of ``cmd`` (``--help`` aside), and each option's spellings."""
    each = [set(p.opts) | set(p.secondary_opts) for p in cmd.params if isinstance(p, click.Option)]
    return set().union(*each), each


def cli_table_problems(rows: dict[str, str]) -> list[str]:
    """What a command table (command -> usage cell) gets wrong against the click commands."""
    problems = []
    for name, usage in rows.items():
        cmd = _command(name)
        spellings, each = _options_of(cmd)
        written = set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", usage))
        problems += [f"{name}: {opt} written, no such option" for opt in written - spellings]
        problems += [f"{name}: option {sorted(opt)} not in the table" for opt in each if not opt & written]
        arguments = [(p.metavar or p.name.upper()).split()[0].rstrip(".") for p in cmd.params if isinstance(p, click.Argument)]
        problems += [f"{name}: argument {a} not in the table" for a in arguments if not re.search(rf"\b{a}\b", usage)]
    return problems


def test_cli_table_lists_every_command_and_option() -> None:
    rows = _cli_rows()
    assert sorted(rows) == sorted(COMMANDS)
    assert cli_table_problems(rows) == []


def test_cli_table_check_sees_a_missing_or_unknown_option() -> None:
    rows = _cli_rows()
    build = rows["build"].replace(" [-H 'NAME: VALUE']", "").replace("[-q]", "[-q] [--quiet-please]")
    assert build != rows["build"]
    problems = cli_table_problems({"build": build, "info": "INDEX"})
    assert "build: --quiet-please written, no such option" in problems
    assert any(p.startswith("build: option ['--header', '-H']") for p in problems), problems
    assert "info: option ['--json'] not in the table" in problems


# --- the SourceOptions table ------------------------------------------------------------------------------


def _option_default(field: dataclasses.Field[Any]) -> Any:
    return field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default


_SPELLED = {"None": None, "{}": {}, "16 GiB": 16 << 30, "64 MiB": 64 << 20, "1 MiB": 1 << 20}


def test_remote_options_table_is_the_dataclass() -> None:
    """docs/remote.md's table lists every ``SourceOptions`` field with its default."""
    text = (ROOT / "docs" / "remote.md").read_text()
    rows = dict(re.findall(r"^\| `(\w+)` \| ([^|]+?) \|", text, re.MULTILINE))
    fields = {f.name: f for f in dataclasses.fields(SourceOptions)}
    assert set(rows) >= set(fields), set(fields) - set(rows)


def test_every_option_default_in_a_table_matches_the_code() -> None:
    """Wherever a page's table gives a field of ``SourceOptions`` or ``compression.Limits`` a default (remote.md,
    dataset.md's knobs, compression.md's limits), it is the dataclass's."""
    from tarindex.compression import Limits

    fields = {f.name: f for f in (*dataclasses.fields(SourceOptions), *dataclasses.fields(Limits))}
    found = []
    for doc in DOCS:
        for name, cell in re.findall(r"^\| `(\w+)` \| ([^|]+?) \|", doc.read_text(), re.MULTILINE):
            if name in fields:
                cell = cell.strip().strip("`")
                default = _option_default(fields[name])
                value = _SPELLED[cell] if cell in _SPELLED else type(default)(cell)
                found.append((doc.name, name))
                assert value == default, (doc.name, name, cell, default)
    assert {n for d, n in found if d == "remote.md"} == {f.name for f in dataclasses.fields(SourceOptions)}
    assert ("dataset.md", "coalesce_gap") in found and {n for d, n in found if d == "compression.md"} == {f.name for f in dataclasses.fields(Limits)}


# --- extras, install commands, the nav -------------------------------------------------------------------


def _pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_extras_the_docs_name_exist() -> None:
    extras = set(_pyproject()["project"]["optional-dependencies"])
    named = {(str(doc.relative_to(ROOT)), e) for doc in DOCS for group in re.findall(r"tarindex\[([\w,\s-]+)\]", doc.read_text()) for e in group.split(",")}
    named |= {(str(doc.relative_to(ROOT)), e) for doc in DOCS for e in re.findall(r"the `(\w+)` extra", doc.read_text())}
    assert {e for _, e in named} >= {"remote", "audio"}
    assert sorted(f"{where}: [{e.strip()}]" for where, e in named if e.strip() not in extras) == []


def pip_installs(text: str) -> list[str]:
    """Every ``pip install`` command with arguments in ``text`` (fenced or inline), up to the end of its command."""
    return [m.group(0) for m in re.finditer(r"pip install (?!`)[^`\n&;|#]+", text)]


def test_every_pip_install_keeps_the_constraints() -> None:
    found = {str(doc.relative_to(ROOT)): pip_installs(doc.read_text()) for doc in DOCS}
    assert sum(map(len, found.values())) >= 5
    assert {where: [c for c in commands if "-U pip" not in c and "-c constraints.txt" not in c] for where, commands in found.items()} == {where: [] for where in found}
    assert pip_installs("run `pip install torchdata==0.11.0` then") == ["pip install torchdata==0.11.0"]


def test_every_page_is_in_the_nav() -> None:
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    listed = {page for entry in nav for page in entry.values()}
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert pages - listed == set()
    assert listed - pages == set()


def test_the_c_sources_are_named() -> None:
    """docs/dataset.md's "The C extension" names every C file the extension is built from, and no other."""
    text = (ROOT / "docs" / "dataset.md").read_text()
    section = text[text.index("## The C extension") :]
    section = section[: section.find("\n## ", 1) if "\n## " in section[1:] else len(section)]
    named = set(re.findall(r"`(?:tarindex/)?(_\w+\.c)`", section))
    assert named == {p.name for p in (ROOT / "tarindex").glob("*.c")}


def test_no_machine_paths_in_the_docs() -> None:
    """No page names a path of one machine (a home, a scratch directory, a checkout): commands use relative paths."""
    found = [
        f"{doc.relative_to(ROOT)}:{n}: {m.group(0)}"
        for doc in DOCS
        for n, line in enumerate(doc.read_text().splitlines(), 1)
        for m in re.finditer(r"(?<![\w.~])/(?:work|tmp|home|root|Users)/[\w./-]*", line)
    ]
    assert found == []


def _performance_sections() -> dict[str, str]:
    text = (ROOT / "docs" / "performance.md").read_text()
    parts = re.split(r"^## (.+)$", text, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2]))


def test_every_performance_workload_has_a_table_a_date_and_a_command() -> None:
    """docs/performance.md: each workload section holds its table, when it was measured, and how to measure it again."""
    sections = _performance_sections()
    assert len(sections) >= 8, list(sections)
    missing = {
        name: [what for what, ok in (
            ("a table", re.search(r"^\|.+\|\s*$", body, re.MULTILINE) is not None),
            ("a date", re.search(r"\b20\d\d-\d\d-\d\d\b", body) is not None),
            ("a command", re.search(r"python\s+tools/\w+\.py", body) is not None),
        ) if not ok]
        for name, body in sections.items()
    }  # fmt: skip
    assert {name: what for name, what in missing.items() if what} == {}


def test_the_performance_chart_reads_the_page() -> None:
    """Every ratio row of the page's workload tables says what it is beside (the limit or a peer), so the chart
    (``tools/bench.py --chart``) draws it; the page shows the chart, and the README too."""
    import sys

    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from bench_chart import bars
    finally:
        sys.path.remove(str(ROOT / "tools"))
    found = bars(ROOT / "docs" / "performance.md")
    assert len(found) >= 30 and {b.versus for b in found} == {"limit", "peer"}
    assert len({b.section for b in found}) >= 8
    assert (ROOT / "docs" / "performance.png").stat().st_size > 10_000
    assert "(performance.png)" in (ROOT / "docs" / "performance.md").read_text()
    assert "(docs/performance.png)" in (ROOT / "README.md").read_text()


def section_references() -> list[tuple[str, str, str]]:
    """``(where, page, heading)`` of every reference to a section of another page: ``docs/x.md, "Heading"`` or
    ``docs/x.md ("Heading")``, with or without code marks around the page."""
    pattern = re.compile(r"`?docs/([\w-]+\.md)`?(?:,\s*|\s*\()\"([^\"]+)\"")
    found = []
    for doc in DOCS:
        text = doc.read_text()
        for m in pattern.finditer(text):
            found.append((f"{doc.relative_to(ROOT)}:{text[: m.start()].count(chr(10)) + 1}", m.group(1), m.group(2)))
    return found


def _referring_pages() -> list[Any]:
    return _marked(sorted({where.split(":")[0] for where, _, _ in section_references()}), BEHIND_REFERENCES)


@pytest.mark.parametrize("referring", _referring_pages())
def test_every_section_a_page_points_to_exists(referring: str) -> None:
    """A reference names the start of a heading of the page it points to (``"Shards on storage with latency"``
    for ``## Shards on storage with latency (NFS, ...)``)."""
    headings = {
        p.name: [re.sub(r"[`*]", "", h).strip() for h in re.findall(r"^#+ (.+)$", p.read_text(), re.MULTILINE)]
        for p in (ROOT / "docs").glob("*.md")
    }
    refs = [r for r in section_references() if r[0].startswith(referring + ":")]
    assert refs
    missing = [
        f"{where}: {page} has no section {heading!r}"
        for where, page, heading in refs
        if not any(h.startswith(re.sub(r"[`*]", "", heading)) for h in headings.get(page, []))
    ]
    assert missing == []
