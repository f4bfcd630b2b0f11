"""Shared command-line plumbing."""

import pytest
import torch

from bench.core.cli import cpu_default_notice, emit, make_parser, progress, resolve_device
from bench.core.plots import line_plot
from bench.core.results import Run, load_json


def test_resolve_device_auto_and_cpu():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected
    assert resolve_device("cpu") == torch.device("cpu")


def test_resolve_device_rejects_nonsense():
    with pytest.raises(ValueError, match="not a device"):
        resolve_device("gpu0")


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the message on a machine without CUDA"
)
def test_resolve_device_rejects_cuda_without_cuda():
    with pytest.raises(ValueError, match="--device cpu"):
        resolve_device("cuda")


def test_cpu_default_notice_goes_to_stderr(capsys):
    line = cpu_default_notice("bench-x", "tiny")
    assert "no GPU" in line
    assert line in capsys.readouterr().err


def test_progress_disabled_is_identity():
    items = [1, 2]
    assert progress(items, desc="x", enabled=False) is items
    assert list(progress(items, desc="x")) == items


def test_emit_prints_and_writes_json_plot_markdown(tmp_path, capsys):
    parser = make_parser("bench-x", "doc")
    args = parser.parse_args(
        [
            "--json",
            str(tmp_path / "r.json"),
            "--plot",
            str(tmp_path / "r.png"),
            "--markdown",
            str(tmp_path / "r.md"),
        ]
    )
    rows = [{"x": 1, "y": 0.5}, {"x": 2, "y": 0.7}]
    run = Run.create("x", rows, device="cpu", config={}, title="Title")
    emit(run, args, plot=lambda p: line_plot(run.rows, x="x", y="y", path=p))
    assert "### Title" in capsys.readouterr().out
    assert load_json(tmp_path / "r.json").plots == ["r.png"]
    assert (tmp_path / "r.png").is_file()
    assert (tmp_path / "r.md").read_text().startswith("### Title")


def test_make_parser_help_exits_zero(help_text):
    assert "--json" in help_text(make_parser("bench-x", "doc").parse_args)
