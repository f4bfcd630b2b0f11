"""PNG plots drawn from result rows, so every figure comes from the same data as its table.

Every function takes the tidy rows a tool returns and names the keys to draw:

- `line_plot`: `y` against numeric `x`, a line per `series` value, a panel per `panels` value.
- `bar_plot`: grouped bars, a group per `x` value (shown as text), a bar per `series` value,
  a panel per `panels` value.
- `hbar_plot`: horizontal grouped bars, a group per row and a bar per value key; long row names
  stay readable down the side, where `bar_plot` would overlap them along the bottom.
- `stacked_bar_plot`: panels of bars side by side over the same rows, each bar stacked from
  several keys (a memory breakdown, say), with optional error bars.
- `scatter_plot`: one value against another, a colour per `series` value, with the line y = x
  (a prediction against its measurement).
- `heatmap_plot`: a ratio over a grid of two keys (query by key length, length by head size),
  a panel per `panels` value, each cell coloured by how far above or below 1 it is and labelled;
  `ratio_heatmaps`, the two the attention benchmarks draw with it.

`line_plot` and `bar_plot` leave out rows without a finite `y` (out of memory, skipped);
`hbar_plot` and `stacked_bar_plot` draw a missing value as a gap. Drawing goes through
`matplotlib.figure.Figure` and the Agg canvas, never `pyplot`, so no display or global state is
touched.

Example::

    line_plot(run.rows, x="seq", y="fwd_ms", series="impl", panels="d",
              path="attn.png", logx=True, logy=True, ylabel="forward (ms)")
"""

from __future__ import annotations

import math
import os
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "Bars",
    "PanelOptions",
    "bar_plot",
    "hbar_plot",
    "heatmap_plot",
    "line_plot",
    "ratio_heatmaps",
    "scatter_plot",
    "stacked_bar_plot",
]

Row = Mapping[str, Any]

_PANEL_SIZE = (4.5, 3.4)  # inches per panel: readable at 100 dpi in a Markdown page
_INCHES_PER_CATEGORY = 0.6  # bar plots widen with their categories (slanted labels fit)
_MAX_COLUMNS = 4  # panels per figure row before wrapping
_DPI = 110
_BAR_FILL = 0.8  # the bars of one group fill 80% of its slot, leaving a gap between groups
_GRID_ALPHA = 0.3


class PanelOptions(TypedDict, total=False):
    """Options `line_plot` and `bar_plot` share.

    Keys:
        series: key whose values get a line (or a bar in each group) each; one when absent.
        panels: key whose values get a panel each; one panel when absent.
        title: the figure's title.
        xlabel, ylabel: axis labels; the keys `x` and `y` when absent.
        logy: a logarithmic vertical axis.
    """

    series: str | None
    panels: str | None
    title: str | None
    xlabel: str | None
    ylabel: str | None
    logy: bool


@dataclass(frozen=True)
class Bars:
    """One panel of `stacked_bar_plot`.

    Args:
        keys: `(row key, legend text)` pairs, stacked bottom to top. A missing value counts as
            0; a key that is 0 or missing in every row is left out. A panel of several keys
            gets a legend.
        ylabel: the panel's vertical axis label.
        title: the panel's title.
        err: key of each bar's error-bar half-length (a standard deviation, say), drawn on top
            of the stack; no error bars when None.
    """

    keys: tuple[tuple[str, str], ...]
    ylabel: str | None = None
    title: str | None = None
    err: str | None = None


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _groups(rows: Sequence[Row], key: str | None) -> dict[Any, list[Row]]:
    groups: dict[Any, list[Row]] = {}
    for row in rows:
        groups.setdefault(row.get(key) if key else None, []).append(row)
    return groups


def _offsets(num_bars: int) -> tuple[list[float], float]:
    """Centre offsets of `num_bars` bars sharing one slot, and the width of each."""
    width = _BAR_FILL / num_bars
    return [(i - (num_bars - 1) / 2) * width for i in range(num_bars)], width


def _figure(
    num_panels: int, *, panel_size: tuple[float, float] = _PANEL_SIZE
) -> tuple[Figure, list[Axes]]:
    # Imported on first use: matplotlib takes about a second to import, and most tool runs (and
    # every child process of the warm-up study) never draw.
    from matplotlib.figure import Figure

    cols = min(num_panels, _MAX_COLUMNS)
    nrows = math.ceil(num_panels / cols)
    fig = Figure(figsize=(panel_size[0] * cols, panel_size[1] * nrows), layout="constrained")
    axes = fig.subplots(nrows, cols, squeeze=False).ravel().tolist()
    for ax in axes[num_panels:]:
        ax.set_visible(False)
    return fig, axes[:num_panels]


def _label_panel(
    ax: Axes,
    *,
    xlabel: str | None,
    ylabel: str | None,
    title: str | None,
    legend: bool,
    grid: str,
) -> None:
    """Axis labels, panel title, legend and a light grid along `grid` (`x`, `y` or `both`)."""
    ax.set_xlabel(xlabel or "")
    ax.set_ylabel(ylabel or "")
    if title:
        ax.set_title(title)
    if legend:
        # Outside the axes, to the right: a legend inside would cover bars or lines.
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    ax.grid(True, axis=grid, alpha=_GRID_ALPHA)


def _save(
    fig: Figure, path: str | os.PathLike[str], title: str | None, *, title_size: str = "large"
) -> Path:
    if title:
        # Wrapped to the figure's width (about 11 characters per inch at this size).
        width = int(fig.get_figwidth() * 11)
        fig.suptitle(textwrap.fill(title, width=max(width, 40)), fontsize=title_size)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=_DPI)
    return path


def _panel_plot(
    rows: Sequence[Row],
    draw: Callable[[Axes, list[Row], str | None], None],
    *,
    x: str,
    y: str,
    path: str | os.PathLike[str],
    grid: str,
    series: str | None = None,
    panels: str | None = None,
    title: str | None = None,
    xlabel: str | None = None,
    ylabel: str | None = None,
    logy: bool = False,
    panel_width: float = _PANEL_SIZE[0],
) -> Path:
    """The frame `line_plot` and `bar_plot` share: `draw(ax, rows, series)` fills each panel."""
    kept = [r for r in rows if _finite(r.get(y))]
    if not kept:
        raise ValueError(f"no row has a finite value for {y!r}: nothing to plot")
    by_panel = _groups(kept, panels)
    fig, axes = _figure(len(by_panel), panel_size=(panel_width, _PANEL_SIZE[1]))
    for ax, (panel, panel_rows) in zip(axes, by_panel.items(), strict=True):
        draw(ax, panel_rows, series)
        if logy:
            from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # on first use

            ax.set_yscale("log")
            # Plain numbers at 1, 2 and 5 of each decade, none on the minor ticks: no "4×10¹".
            ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
            ax.yaxis.set_minor_formatter(NullFormatter())
        _label_panel(
            ax,
            xlabel=xlabel or x,
            ylabel=ylabel or y,
            title=f"{panels} = {panel}" if panels else None,
            legend=bool(series),
            grid=grid,
        )
    return _save(fig, path, title)


def line_plot(
    rows: Sequence[Row],
    *,
    x: str,
    y: str,
    path: str | os.PathLike[str],
    logx: bool = False,
    **options: Unpack[PanelOptions],
) -> Path:
    """Draw `y` against numeric `x`, one line per `series` value, one panel per `panels` value.

    Args:
        rows: tidy result rows.
        x, y: keys of the numeric horizontal and vertical values.
        path: where to write the PNG (folders are created).
        logx: a logarithmic horizontal axis (base 2, suited to power-of-two sweeps).
        **options: `series`, `panels`, `title`, `xlabel`, `ylabel`, `logy` (`PanelOptions`).

    Returns:
        The path written.

    Raises:
        ValueError: if no row has a finite `y`.
    """

    def draw(ax: Axes, panel_rows: list[Row], series: str | None) -> None:
        for name, line_rows in _groups(panel_rows, series).items():
            pts = sorted((r[x], r[y]) for r in line_rows)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=name)
        if logx:
            ax.set_xscale("log", base=2)

    return _panel_plot(rows, draw, x=x, y=y, path=path, grid="both", **options)


def bar_plot(
    rows: Sequence[Row],
    *,
    x: str,
    y: str,
    path: str | os.PathLike[str],
    **options: Unpack[PanelOptions],
) -> Path:
    """Grouped bars: a group per `x` value (first-seen order), a bar per `series` value.

    Arguments as in `line_plot` (without `logx`); `x` may be any value (it is shown as text).

    Returns:
        The path written.

    Raises:
        ValueError: if no row has a finite `y`.
    """

    def draw(ax: Axes, panel_rows: list[Row], series: str | None) -> None:
        categories = list(dict.fromkeys(r.get(x) for r in panel_rows))
        by_series = _groups(panel_rows, series)
        offsets, width = _offsets(len(by_series))
        for offset, (name, bar_rows) in zip(offsets, by_series.items(), strict=True):
            heights = {r.get(x): r[y] for r in bar_rows}
            xs = [j + offset for j in range(len(categories))]
            ax.bar(xs, [heights.get(c, math.nan) for c in categories], width=width, label=name)
        labels = [str(c) for c in categories]
        # Long category names (configurations, say) would overlap: slant them, smaller.
        slant = sum(map(len, labels)) > 40
        ax.set_xticks(
            range(len(categories)),
            labels,
            rotation=35 if slant else 0,
            ha="right" if slant else "center",
            rotation_mode="anchor",
            fontsize="small" if slant else "medium",
        )

    # Wider panels for many categories: about 0.6 inch per category keeps slanted
    # labels from running into each other.
    largest = max(len({r.get(x) for r in g}) for g in _groups(rows, options.get("panels")).values())
    width = max(_PANEL_SIZE[0], _INCHES_PER_CATEGORY * largest)
    return _panel_plot(rows, draw, x=x, y=y, path=path, grid="y", panel_width=width, **options)


def hbar_plot(
    rows: Sequence[Row],
    *,
    label: str,
    values: Sequence[tuple[str, str]],
    path: str | os.PathLike[str],
    title: str | None = None,
    xlabel: str | None = None,
) -> Path:
    """Horizontal grouped bars: a group per row (named by `rows[i][label]`), a bar per value.

    Long category names stay readable down the side, where `bar_plot` would overlap them along
    the bottom.

    Args:
        rows: tidy result rows, drawn top to bottom.
        label: key of each row's name.
        values: (key, legend text) of the values drawn for every row; a missing value is a gap,
            a value no row has is left out.
        path: where to write the PNG (folders are created).
        title, xlabel: labels.

    Returns:
        The path written.

    Raises:
        ValueError: if no row has any of the values.
    """
    values = [(key, text) for key, text in values if any(r.get(key) is not None for r in rows)]
    if not values:
        raise ValueError("no row has a value to plot")
    # Height grows with the number of bars so that each stays about 0.22 inches thick.
    fig, (ax,) = _figure(1, panel_size=(7.0, 1.0 + 0.22 * len(rows) * len(values)))
    offsets, height = _offsets(len(values))
    for offset, (key, text) in zip(offsets, values, strict=True):
        ys = [j + offset for j in range(len(rows))]
        widths = [row.get(key) if row.get(key) is not None else math.nan for row in rows]
        ax.barh(ys, widths, height=height, label=text)
    ax.set_yticks(range(len(rows)), [str(row[label]) for row in rows])
    ax.invert_yaxis()
    _label_panel(ax, xlabel=xlabel, ylabel=None, title=None, legend=False, grid="x")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return _save(fig, path, title, title_size="small")


def stacked_bar_plot(
    rows: Sequence[Row],
    *,
    label: str,
    panels: Sequence[Bars],
    path: str | os.PathLike[str],
    title: str | None = None,
) -> Path:
    """Panels of bars side by side, a bar per row in each (named by `rows[i][label]`).

    Each panel (`Bars`) stacks its keys bottom to top, so one bar shows a whole and its parts.

    Args:
        rows: tidy result rows, drawn left to right.
        label: key of each row's name (shown as a tick label, rotated).
        panels: what each panel draws.
        path: where to write the PNG (folders are created).
        title: the figure's title.

    Returns:
        The path written.

    Raises:
        ValueError: if there are no rows.
    """
    if not rows:
        raise ValueError("no rows: nothing to plot")
    names = [str(r[label]) for r in rows]
    # 0.8 inches per bar beside 2 inches of axis and labels, at the height rotated names need.
    fig, axes = _figure(len(panels), panel_size=(2 + 0.8 * len(rows), 4.6))
    for ax, panel in zip(axes, panels, strict=True):
        drawn = [(k, t, [r.get(k) or 0.0 for r in rows]) for k, t in panel.keys]
        drawn = [(k, t, heights) for k, t, heights in drawn if any(heights)]
        bottom = [0.0] * len(rows)
        for i, (_, text, heights) in enumerate(drawn):
            on_top = panel.err is not None and i == len(drawn) - 1
            errs = [r.get(panel.err) or 0.0 for r in rows] if on_top else None
            ax.bar(names, heights, bottom=bottom, yerr=errs, label=text)
            bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
        ax.tick_params(axis="x", labelsize="small", labelrotation=30)
        _label_panel(
            ax,
            xlabel=None,
            ylabel=panel.ylabel,
            title=panel.title,
            legend=len(panel.keys) > 1 and bool(drawn),
            grid="y",
        )
    return _save(fig, path, title, title_size="small")


def scatter_plot(
    rows: Sequence[Row],
    *,
    x: str,
    y: str,
    path: str | os.PathLike[str],
    series: str | None = None,
    identity: bool = True,
    log: bool = True,
    title: str | None = None,
    xlabel: str | None = None,
    ylabel: str | None = None,
) -> Path:
    """Points of `y` against `x`, a colour per `series` value, with the diagonal y = x.

    Args:
        rows: tidy result rows; rows without a finite, positive (on log axes) `x` and `y` are
            left out.
        x, y: keys of the two values (a measurement and its prediction, say).
        path: where to write the PNG (folders are created).
        series: key whose values get a colour each (and a legend entry).
        identity: draw the line y = x across the points' range.
        log: logarithmic axes (both).
        title, xlabel, ylabel: labels; the keys when absent.

    Returns:
        The path written.

    Raises:
        ValueError: if no row has both values.
    """
    kept = [
        r
        for r in rows
        if _finite(r.get(x)) and _finite(r.get(y)) and (not log or min(r[x], r[y]) > 0)
    ]
    if not kept:
        raise ValueError(f"no row has finite values for both {x!r} and {y!r}: nothing to plot")
    fig, (ax,) = _figure(1, panel_size=(6.0, 5.0))
    for name, points in _groups(kept, series).items():
        ax.scatter([r[x] for r in points], [r[y] for r in points], s=18, label=name)
    if identity:
        low = min(min(r[x], r[y]) for r in kept)
        high = max(max(r[x], r[y]) for r in kept)
        ax.plot([low, high], [low, high], color="grey", linewidth=1, linestyle="--", label="y = x")
    if log:
        ax.set_xscale("log")
        ax.set_yscale("log")
    _label_panel(ax, xlabel=xlabel or x, ylabel=ylabel or y, title=None, legend=True, grid="both")
    return _save(fig, path, title)


def heatmap_plot(
    rows: Sequence[Row],
    *,
    x: str,
    y: str,
    value: str,
    path: str | os.PathLike[str],
    panels: str | None = None,
    title: str | None = None,
    xlabel: str | None = None,
    ylabel: str | None = None,
    colorbar: str | None = None,
) -> Path:
    """A ratio over the grid of `x` and `y` values, one panel per `panels` value.

    Each cell is coloured on a diverging scale, logarithmic and centred on 1 (red below,
    blue above, the same distance for half and for twice), and labelled with its value; a
    cell without a finite value stays blank. The axes list the values present, in order.

    Args:
        rows: tidy result rows; one per (panel, x, y), the last one wins.
        x, y: keys of the grid's columns and rows.
        value: key of the ratio to show.
        path: where to write the PNG.
        panels: key whose values get a panel each.
        title, xlabel, ylabel: the figure's title and axis labels (`x`, `y` when absent).
        colorbar: the colour bar's label (`value` when absent).

    Returns:
        The path written.

    Raises:
        ValueError: if no row has a finite `value`.
    """
    from matplotlib.colors import LogNorm  # on first use, as every figure here

    kept = [r for r in rows if _finite(r.get(value)) and r[value] > 0]
    if not kept:
        raise ValueError(f"no row has a finite positive {value!r}: nothing to plot")
    ratios = [r[value] for r in kept]
    spread = max(max(ratios), 1 / min(ratios), 1.05)  # symmetric about 1 on a log scale
    norm = LogNorm(vmin=1 / spread, vmax=spread)
    by_panel = _groups(kept, panels)
    fig, axes = _figure(len(by_panel))
    for ax, (panel, panel_rows) in zip(axes, by_panel.items(), strict=True):
        xs = sorted({r[x] for r in panel_rows})
        ys = sorted({r[y] for r in panel_rows})
        grid = [[math.nan] * len(xs) for _ in ys]
        for r in panel_rows:
            grid[ys.index(r[y])][xs.index(r[x])] = r[value]
        image = ax.imshow(grid, cmap="RdBu", norm=norm, origin="lower", aspect="auto")
        for i, row in enumerate(grid):
            for j, cell in enumerate(row):
                if math.isfinite(cell):  # white on the darker half of either end of the scale
                    dark = abs(math.log(cell)) > math.log(spread) / 2
                    ax.text(j, i, f"{cell:.2f}", ha="center", va="center", fontsize="small",
                            color="white" if dark else "black")  # fmt: skip
        ax.set_xticks(range(len(xs)), [str(v) for v in xs])
        ax.set_yticks(range(len(ys)), [str(v) for v in ys])
        ax.set_xlabel(xlabel or x)
        ax.set_ylabel(ylabel or y)
        if panels:
            ax.set_title(f"{panels} = {panel}")
        fig.colorbar(image, ax=ax, label=colorbar or value)
    return _save(fig, path, title)


def ratio_heatmaps(
    rows: Sequence[Row], path: Path, *, impls: Sequence[str], ratio: str, title: str
) -> list[Path]:
    """The attention benchmarks' heatmaps (bench-attn's and bench-flash's rows: `impl`, `seq`
    the queries, `seq_k` the keys, `d`) of the first of `impls` that has a `ratio` to its
    baseline: over the query and key lengths, a panel per d, where some shape is rectangular
    (`<stem>_ratio_nq_nk.png`); over the length and head size where the square shapes span more
    than one of either (`<stem>_ratio_seq_d.png`). The files written (none without such rows).
    """
    ran = {r["impl"] for r in rows if _finite(r.get(ratio))}
    impl = next((name for name in impls if name in ran), None)
    if impl is None:
        return []
    mine = [r for r in rows if r["impl"] == impl]
    square = [r for r in mine if r.get("seq_k", r["seq"]) == r["seq"]]
    suffix, written = path.suffix or ".png", []
    if len(square) < len(mine):
        written.append(heatmap_plot(
            mine, x="seq_k", y="seq", value=ratio, panels="d", title=f"{title} ({impl})",
            path=path.with_name(f"{path.stem}_ratio_nq_nk{suffix}"), xlabel="Nk (keys)",
            ylabel="Nq (queries)", colorbar=f"{ratio} (above 1: {impl} faster)",
        ))  # fmt: skip
    if len({r["seq"] for r in square}) > 1 or len({r["d"] for r in square}) > 1:
        written.append(heatmap_plot(
            square, x="d", y="seq", value=ratio, title=f"{title} ({impl})",
            path=path.with_name(f"{path.stem}_ratio_seq_d{suffix}"), xlabel="head size d",
            ylabel="sequence length", colorbar=f"{ratio} (above 1: {impl} faster)",
        ))  # fmt: skip
    return written
