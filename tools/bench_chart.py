"""The chart of docs/performance.md: every ratio of its workload tables in one picture (``tools/bench.py --chart``).

The page is the source: each workload's table has the columns ``measurement | tarindex | beside it | ratio |
target``, where "beside it" starts with ``limit:`` (the physical limit: a bare ``os.pread`` loop, ``cat``,
``zstd -d``, threads reading the same mount) or ``peer:`` (another library, or the naive way), and "ratio"
starts with the ratio, ``0.93x``. Each such row is a bar, grouped by the section it is in, blue against the
limit (1x is the limit itself) and orange against a peer (above 1x: faster than the peer), with the row's
target as a black mark where the target cell gives one (``>= 0.5x``). Rows whose ratio cell does not start
with a ratio (a time, a size, ``time 1.11x`` for a cost), or give several (``8.8x / 14.6x``), are left out of
the chart, not out of the page.

Run: ``python tools/bench.py --chart docs/performance.png`` (or this file: ``python tools/bench_chart.py``);
needs matplotlib (the ``bench`` extra: ``pip install -c constraints.txt -e '.[bench]'``).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "performance.md"
CHART = ROOT / "docs" / "performance.png"
COLUMNS = ("measurement", "tarindex", "beside it", "ratio", "target")

_RATIO = re.compile(r"^\**\s*([0-9][0-9,]*(?:\.[0-9]+)?)x\b")
_TARGET = re.compile(r"([<>]=?)\s*([0-9]+(?:\.[0-9]+)?)x")


@dataclass(frozen=True, slots=True)
class Bar:
    """One row of a workload table that the chart draws: its section and measurement, its ratio, what the ratio
    is to (``versus``: ``limit`` or ``peer``) and its target ratio, if the row gives one."""

    section: str
    label: str
    ratio: float
    versus: str
    target: float | None


def _plain(cell: str) -> str:
    """A table cell without markdown emphasis and code marks."""
    return re.sub(r"[*`]", "", cell).strip()


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def bars(page: Path = PAGE) -> list[Bar]:
    """Every chartable row of the page's workload tables, in page order.

    Raises:
        ValueError: a row with a ratio whose "beside it" cell says neither ``limit:`` nor ``peer:``.
    """
    found: list[Bar] = []
    section = ""
    in_table = False
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        if line.startswith("## "):
            section, in_table = _plain(line[3:]), False
            continue
        if not line.startswith("|"):
            in_table = False
            continue
        cells = _cells(line)
        if tuple(c.lower() for c in cells) == COLUMNS:
            in_table = True
            continue
        if not in_table or set("".join(cells)) <= set("-: "):
            continue
        measurement, _, beside, ratio, target = (cells + [""] * 5)[:5]
        m = _RATIO.match(_plain(ratio))
        if m is None or " / " in ratio:  # a time, a size, several sets in one row: in the page, not in the chart
            continue
        kind = _plain(beside).split(":", 1)[0]
        if kind not in ("limit", "peer"):
            raise ValueError(f"{page.name}:{number}: a ratio's 'beside it' must start with 'limit:' or 'peer:', got {beside!r}")
        t = _TARGET.search(_plain(target))
        found.append(Bar(section, _plain(measurement), float(m.group(1).replace(",", "")), kind, float(t.group(2)) if t else None))
    return found


def draw(found: list[Bar], out: Path = CHART) -> Path:
    """The bars as a PNG at ``out``: one row a bar, on a log scale, grouped by section."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels: list[str] = []
    rows: list[Bar | None] = []
    section = None
    for bar in found:
        if bar.section != section:
            section = bar.section
            labels.append(section.upper() if len(section) < 60 else section[:57].upper() + "...")
            rows.append(None)
        labels.append(bar.label if len(bar.label) <= 70 else bar.label[:67] + "...")
        rows.append(bar)
    fig, ax = plt.subplots(figsize=(11, 0.26 * len(rows) + 1.4))
    colours = {"limit": "tab:blue", "peer": "tab:orange"}
    for y, bar in enumerate(rows):
        if bar is None:
            continue
        ax.barh(y, bar.ratio, color=colours[bar.versus], height=0.7)
        ax.text(bar.ratio * 1.04, y, f"{bar.ratio:g}x", va="center", fontsize=7)
        if bar.target is not None:
            ax.plot([bar.target, bar.target], [y - 0.42, y + 0.42], color="black", linewidth=1.6)
    ax.set_xscale("log")
    ax.axvline(1.0, color="gray", linewidth=0.8)
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    for tick, bar in zip(ax.get_yticklabels(), rows):
        if bar is None:
            tick.set_fontweight("bold")
    ax.invert_yaxis()
    ax.set_xlabel("ratio (log scale): blue, to the physical limit (1x = the limit); orange, to a peer (above 1x: faster); black mark: target")
    ax.xaxis.label.set_fontsize(8)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def main(out: Path = CHART, page: Path = PAGE) -> int:
    try:
        import matplotlib  # noqa: F401 - only to say what is missing before any work
    except ImportError:
        print("the chart needs matplotlib: pip install -c constraints.txt -e '.[bench]'", file=sys.stderr)
        return 1
    found = bars(page)
    print(f"chart: {draw(found, out)} ({len(found)} ratios from {page.name})")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else CHART))
