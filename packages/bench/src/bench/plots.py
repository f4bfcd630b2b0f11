"""PNG plots drawn from result rows, so every figure comes from the same data as its table.

Both functions take the tidy rows a tool returns and name the keys to plot: `x` along the
horizontal axis, `y` up, one line or bar colour per value of `series`, and one panel per value of
`panels`. Rows without a finite `y` (out of memory, skipped) are left out. Drawing goes through
`matplotlib.figure.Figure` and the Agg canvas, never `pyplot`, so no display or global state is
touched.

Example::

    line_plot(run.rows, x="seq", y="fwd_ms", series="impl", panels="d",
              path="attn.png", logx=True, logy=True, ylabel="forward (ms)")
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["bar_plot", "line_plot"]

_PANEL_SIZE = (4.5, 3.4)  # inches per panel: readable at 100 dpi in a Markdown page
_MAX_COLUMNS = 4  # panels per figure row before wrapping
_DPI = 110


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _groups(rows: Sequence[Mapping[str, Any]], key: str | None) -> dict[Any, list[Mapping]]:
    groups: dict[Any, list[Mapping]] = {}
    for row in rows:
        groups.setdefault(row.get(key) if key else None, []).append(row)
    return groups


def _figure(num_panels: int) -> tuple[Figure, list[Any]]:
    # Imported on first use: matplotlib takes about a second to import, and most tool runs (and
    # every child process of the warm-up study) never draw.
    from matplotlib.figure import Figure

    cols = min(num_panels, _MAX_COLUMNS)
    nrows = math.ceil(num_panels / cols)
    fig = Figure(figsize=(_PANEL_SIZE[0] * cols, _PANEL_SIZE[1] * nrows), layout="constrained")
    axes = fig.subplots(nrows, cols, squeeze=False).ravel().tolist()
    for ax in axes[num_panels:]:
        ax.set_visible(False)
    return fig, axes[:num_panels]


def _save(fig: Figure, path: str | os.PathLike[str], title: str | None) -> Path:
    if title:
        fig.suptitle(title)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=_DPI)
    return path


def _plottable(rows: Sequence[Mapping[str, Any]], y: str) -> list[Mapping[str, Any]]:
    kept = [r for r in rows if _finite(r.get(y))]
    if not kept:
        raise ValueError(f"no row has a finite value for {y!r}: nothing to plot")
    return kept


def line_plot(
    rows: Sequence[Mapping[str, Any]],
    *,
    x: str,
    y: str,
    path: str | os.PathLike[str],
    series: str | None = None,
    panels: str | None = None,
    title: str | None = None,
    xlabel: str | None = None,
    ylabel: str | None = None,
    logx: bool = False,
    logy: bool = False,
) -> Path:
    """Draw `y` against numeric `x`, one line per `series` value, one panel per `panels` value.

    Args:
        rows: tidy result rows.
        x, y: keys of the numeric horizontal and vertical values.
        path: where to write the PNG (folders are created).
        series: key whose values get a line each (one line when None).
        panels: key whose values get a panel each (one panel when None).
        title, xlabel, ylabel: labels; axis labels default to the keys.
        logx, logy: logarithmic axes (base 2 for x, suited to power-of-two sweeps).

    Returns:
        The path written.

    Raises:
        ValueError: if no row has a finite `y`.
    """
    kept = _plottable(rows, y)
    by_panel = _groups(kept, panels)
    fig, axes = _figure(len(by_panel))
    for ax, (panel, panel_rows) in zip(axes, by_panel.items(), strict=True):
        for name, line_rows in _groups(panel_rows, series).items():
            pts = sorted((r[x], r[y]) for r in line_rows)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=name)
        if logx:
            ax.set_xscale("log", base=2)
        if logy:
            ax.set_yscale("log")
        ax.set_xlabel(xlabel or x)
        ax.set_ylabel(ylabel or y)
        if panels:
            ax.set_title(f"{panels} = {panel}")
        if series:
            ax.legend(fontsize="small")
        ax.grid(True, alpha=0.3)
    return _save(fig, path, title)


def bar_plot(
    rows: Sequence[Mapping[str, Any]],
    *,
    x: str,
    y: str,
    path: str | os.PathLike[str],
    series: str | None = None,
    panels: str | None = None,
    title: str | None = None,
    xlabel: str | None = None,
    ylabel: str | None = None,
    logy: bool = False,
) -> Path:
    """Grouped bars: a group per `x` value (first-seen order), a bar per `series` value.

    Arguments as in `line_plot`; `x` may be any value (it is shown as text).

    Returns:
        The path written.

    Raises:
        ValueError: if no row has a finite `y`.
    """
    kept = _plottable(rows, y)
    by_panel = _groups(kept, panels)
    fig, axes = _figure(len(by_panel))
    for ax, (panel, panel_rows) in zip(axes, by_panel.items(), strict=True):
        categories = list(dict.fromkeys(r.get(x) for r in panel_rows))
        by_series = _groups(panel_rows, series)
        width = 0.8 / len(by_series)  # the bars of one group fill 80% of its slot
        for i, (name, bar_rows) in enumerate(by_series.items()):
            heights = {r.get(x): r[y] for r in bar_rows}
            xs = [j + (i - (len(by_series) - 1) / 2) * width for j in range(len(categories))]
            ax.bar(xs, [heights.get(c, math.nan) for c in categories], width=width, label=name)
        ax.set_xticks(range(len(categories)), [str(c) for c in categories])
        if logy:
            ax.set_yscale("log")
        ax.set_xlabel(xlabel or x)
        ax.set_ylabel(ylabel or y)
        if panels:
            ax.set_title(f"{panels} = {panel}")
        if series:
            ax.legend(fontsize="small")
        ax.grid(True, axis="y", alpha=0.3)
    return _save(fig, path, title)
