"""Plots are drawn from rows and skip rows without a value."""

import pytest
import torch

from bench.plots import bar_plot, line_plot

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
