"""Plots are drawn from rows and skip rows without a value."""

import pytest
import torch

from bench.core.plots import Bars, bar_plot, hbar_plot, heatmap_plot, line_plot, stacked_bar_plot

PNG_MAGIC = b"\x89PNG"


def _rows():
    ms = torch.rand(6).add(0.1).tolist()
    rows = [
        {"impl": impl, "d": d, "seq": seq, "ms": ms.pop()}
        for impl in ("a", "b")
        for d, seq in ((16, 64), (16, 128), (32, 64))
    ]
    rows.append({"impl": "a", "d": 32, "seq": 128, "ms": None})
    return rows


def test_line_plot_writes_png_with_panels(tmp_path):
    path = line_plot(
        _rows(),
        x="seq",
        y="ms",
        series="impl",
        panels="d",
        path=tmp_path / "p" / "l.png",
        logx=True,
        logy=True,
        title="t",
    )
    assert path.read_bytes()[:4] == PNG_MAGIC


def test_bar_plot_writes_png(tmp_path):
    path = bar_plot(_rows(), x="seq", y="ms", series="impl", path=tmp_path / "b.png")
    assert path.read_bytes()[:4] == PNG_MAGIC


def test_plot_without_finite_values_raises(tmp_path):
    with pytest.raises(ValueError, match="nothing to plot"):
        line_plot([{"x": 1, "y": None}], x="x", y="y", path=tmp_path / "n.png")


def test_hbar_plot_writes_png_and_leaves_gaps(tmp_path):
    rows = [{"case": name, **row} for name, row in zip("ab", _rows(), strict=False)]
    rows[1]["ms"] = None  # a gap, not an error
    path = hbar_plot(
        rows, label="case", values=[("ms", "time"), ("nope", "x")], path=tmp_path / "h.png"
    )
    assert path.read_bytes()[:4] == PNG_MAGIC


def test_hbar_plot_without_values_raises(tmp_path):
    with pytest.raises(ValueError, match="no row has a value"):
        hbar_plot([{"case": "a"}], label="case", values=[("ms", "time")], path=tmp_path / "h.png")


def test_stacked_bar_plot_writes_png_with_two_panels(tmp_path):
    parts = torch.rand(3, 2).add(0.1).tolist()
    rows = [
        {"name": f"v{i}", "a": a, "b": b, "total": a + b, "std": 0.1}
        for i, (a, b) in enumerate(parts)
    ]
    panels = (Bars(keys=(("a", "A"), ("b", "B"))), Bars(keys=(("total", "total"),), err="std"))
    path = stacked_bar_plot(rows, label="name", panels=panels, path=tmp_path / "s.png", title="t")
    assert path.read_bytes()[:4] == PNG_MAGIC


def test_stacked_bar_plot_without_rows_raises(tmp_path):
    with pytest.raises(ValueError, match="nothing to plot"):
        stacked_bar_plot(
            [], label="name", panels=(Bars(keys=(("a", "A"),)),), path=tmp_path / "s.png"
        )


def test_heatmap_plot_writes_png_and_needs_a_positive_value(tmp_path):
    rows = [{"d": d, "seq": s, "r": 0.5 + s / 100, "k": k} for d in (16, 32) for s in (64, 128)
            for k in ("a", "b")]  # fmt: skip
    rows.append({"d": 64, "seq": 64, "r": None, "k": "a"})  # blank cell
    path = heatmap_plot(rows, x="d", y="seq", value="r", panels="k", path=tmp_path / "h.png")
    assert path.read_bytes()[:4] == PNG_MAGIC
    with pytest.raises(ValueError, match="nothing to plot"):
        heatmap_plot([{"d": 1, "seq": 1, "r": 0.0}], x="d", y="seq", value="r", path=path)
