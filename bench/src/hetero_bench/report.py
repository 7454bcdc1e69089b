"""What a benchmark returns and how it is shown: a table on stdout, a JSON file, a PNG plot.

A benchmark builds a ``Report``: header lines (machine, workload), a ``Table``, summary lines
(ratios), the JSON ``results`` and the plot's ``Panel``s. ``print_report``, ``write_json`` and
``write_plot`` do the rest, the same way for every benchmark.
"""

from __future__ import annotations

import importlib.util
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from hetero_core import HeteroError

PLOT_INSTALL = "pip install 'hetero-bench[plot]'"


@dataclass(frozen=True)
class Column:
    key: str
    header: str
    fmt: str = ""  # a format spec for the value (".2f", ".1%"); None values print as "-"
    suffix: str = ""  # after a formatted value ("x" for ratios)


@dataclass
class Table:
    columns: list[Column]
    rows: list[dict[str, Any]] = field(default_factory=list)

    def render(self) -> str:
        cells = [[_cell(row.get(c.key), c) for c in self.columns] for row in self.rows]
        widths = [max([len(c.header)] + [len(r[i]) for r in cells]) for i, c in enumerate(self.columns)]
        lines = [
            "  ".join(
                c.header.ljust(w) if i == 0 else c.header.rjust(w)
                for i, (c, w) in enumerate(zip(self.columns, widths))
            )
        ]
        for r in cells:
            lines.append(
                "  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths)))
            )
        return "\n".join(lines)


@dataclass(frozen=True)
class Panel:
    """One plot: grouped bars over categories, or lines over numeric x values."""

    title: str
    ylabel: str
    categories: list  # x labels (bars) or x values (lines)
    series: dict[str, list]  # legend label -> one value per category (None: no value)
    kind: str = "bar"  # "bar" or "line"
    xlabel: str = ""
    log_x: bool = False


@dataclass
class Report:
    benchmark: str
    settings: dict[str, Any]
    table: Table
    header: list[str] = field(default_factory=list)
    summary: list[str] = field(default_factory=list)
    results: dict[str, Any] = field(default_factory=dict)  # in the JSON beside the table's rows
    panels: list[Panel] = field(default_factory=list)
    title: str = ""  # the plot's title

    def as_json(self, machine: dict) -> dict:
        return {
            "benchmark": self.benchmark,
            "machine": machine,
            "settings": self.settings,
            "rows": self.table.rows,
            **self.results,
        }


def print_report(report: Report, out: TextIO) -> None:
    for line in report.header:
        print(line, file=out)
    print(report.table.render(), file=out)
    for line in report.summary:
        print(line, file=out)
    out.flush()


def write_json(report: Report, path: str, machine: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(report.as_json(machine), f, indent=2, default=str)
        f.write("\n")


def check_plot_available() -> None:
    if importlib.util.find_spec("matplotlib") is None:
        raise HeteroError(f"--plot needs matplotlib: {PLOT_INSTALL}")


def write_plot(report: Report, path: str, subtitle: str = "") -> None:
    """A PNG with one subplot per panel, side by side."""
    check_plot_available()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not report.panels:
        raise HeteroError(f"benchmark {report.benchmark!r} has nothing to plot")
    figure, axes = plt.subplots(1, len(report.panels), figsize=(5.2 * len(report.panels), 4.4), squeeze=False)
    for panel, ax in zip(report.panels, axes[0]):
        (_bars if panel.kind == "bar" else _lines)(ax, panel)
        ax.set_title(panel.title, fontsize=11)
        ax.set_ylabel(panel.ylabel)
        if panel.xlabel:
            ax.set_xlabel(panel.xlabel)
        ax.grid(axis="y", alpha=0.3)
        if len(panel.series) > 1:
            ax.legend(fontsize=8)
    figure.suptitle(report.title or report.benchmark, fontsize=12)
    if subtitle:
        figure.text(0.5, 0.005, subtitle, ha="center", va="bottom", fontsize=7, color="0.35")
    figure.tight_layout(rect=(0, 0.03, 1, 1))
    figure.savefig(Path(path), dpi=120, format="png")
    plt.close(figure)


def _bars(ax, panel: Panel) -> None:
    num = len(panel.series)
    width = 0.8 / num
    for i, (label, values) in enumerate(panel.series.items()):
        xs = [j + (i - (num - 1) / 2) * width for j in range(len(panel.categories))]
        heights = [0 if v is None else v for v in values]
        bars = ax.bar(xs, heights, width, label=label)
        for bar, value in zip(bars, values):
            if value is not None:
                ax.annotate(
                    _short(value),
                    (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center",
                    va="bottom",
                    fontsize=7,
                    xytext=(0, 1),
                    textcoords="offset points",
                )
    ax.set_xticks(range(len(panel.categories)))
    ax.set_xticklabels([str(c) for c in panel.categories], fontsize=8)


def _lines(ax, panel: Panel) -> None:
    for label, values in panel.series.items():
        points = [(x, v) for x, v in zip(panel.categories, values) if v is not None]
        ax.plot([x for x, _ in points], [v for _, v in points], marker="o", label=label)
    ax.set_ylim(bottom=0)
    if panel.log_x:
        ax.set_xscale("log", base=2)
    ax.set_xticks(list(panel.categories))
    ax.set_xticklabels([str(c) for c in panel.categories])


def _short(value: float) -> str:
    if not math.isfinite(value) or float(value).is_integer():
        return f"{value:g}" if not math.isfinite(value) else f"{value:.0f}"
    magnitude = abs(value)
    return f"{value:.0f}" if magnitude >= 100 else f"{value:.1f}" if magnitude >= 10 else f"{value:.2f}"


def _cell(value: Any, column: Column) -> str:
    if value is None:
        return "-"
    if column.fmt and isinstance(value, (int, float)) and not isinstance(value, bool):
        return format(value, column.fmt) + column.suffix
    return str(value) + column.suffix
