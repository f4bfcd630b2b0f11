"""Shared command-line plumbing."""

import sys
import types

import pytest
import torch

from bench.core.cli import Command, LazyChoices, bucket_size_mb, resolve_device
from bench.core.plots import line_plot
from bench.core.results import Run, load_json
from bench.core.tool import cpu_default_notice, emit, progress


def _command(**fields) -> Command:
    return Command("bench-x", "doc", add_options=lambda parser: None, **{"run": "x:y", **fields})


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


def test_emit_prints_and_writes_json_csv_plot_markdown(tmp_path, capsys):
    parser = _command().parser()
    files = {kind: str(tmp_path / f"r.{kind}") for kind in ("json", "csv", "png", "md")}
    args = parser.parse_args(
        ["--json", files["json"], "--csv", files["csv"], "--plot", files["png"],
         "--markdown", files["md"]]
    )  # fmt: skip
    rows = [{"x": 1, "y": 0.5}, {"x": 2, "y": 0.7}]
    run = Run.create("x", rows, device="cpu", config={}, title="Title")
    emit(run, args, plot=lambda p: line_plot(run.rows, x="x", y="y", path=p))
    assert "### Title" in capsys.readouterr().out
    assert load_json(tmp_path / "r.json").plots == ["r.png"]
    assert (tmp_path / "r.png").is_file()
    assert (tmp_path / "r.md").read_text().startswith("### Title")
    header, *lines = (tmp_path / "r.csv").read_text().splitlines()
    assert header.startswith("x,y,tool,") and [line[:5] for line in lines] == ["1,0.5", "2,0.7"]


def test_a_command_has_the_common_options_and_its_help_exits_zero(help_text):
    assert "--json" in help_text(_command().parser().parse_args)


def test_a_command_imports_its_implementation_only_after_parsing(help_text, capsys):
    command = _command(run="no_such_module:run")
    assert "doc" in help_text(command.main)  # --help never reaches the import
    with pytest.raises(SystemExit) as exit_:
        command.main(["--no-such-option"])
    assert exit_.value.code == 2
    with pytest.raises(ModuleNotFoundError, match="no_such_module"):
        command.main([])


def test_a_command_runs_its_implementation_with_the_parsed_options(monkeypatch):
    seen = []

    def run(parser, args, argv) -> int:
        seen.append((parser, args, argv))
        return 7

    monkeypatch.setitem(sys.modules, "an_implementation", types.SimpleNamespace(run=run))
    assert _command(run="an_implementation:run").main(["--device", "cpu"]) == 7
    ((parser, args, argv),) = seen
    assert parser.prog == "bench-x" and args.device == "cpu" and argv == ["--device", "cpu"]


def test_a_commands_check_is_a_usage_error_before_the_import(capsys):
    def check(args):
        if args.json is None:
            raise ValueError("--json is needed here")

    command = _command(run="no_such_module:run", check=check)
    with pytest.raises(SystemExit) as exit_:
        command.main([])
    assert exit_.value.code == 2
    assert "--json is needed here" in capsys.readouterr().err


def test_a_usage_error_is_two_lines_without_the_usage_block(capsys):
    with pytest.raises(SystemExit) as exit_:
        _command().main(["--no-such-option"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "bench-x: error: unrecognized arguments: --no-such-option",
        "(bench-x --help lists the options)",
    ]


def test_a_command_refuses_a_run_that_is_not_module_colon_name():
    with pytest.raises(ValueError, match="module:name"):
        _command(run="bench.tools.attn")


def test_lazy_choices_offer_names_and_import_on_lookup():
    choices = LazyChoices(fp32=None, bf16="torch:bfloat16", adamw="torch.optim:AdamW")
    assert list(choices) == ["fp32", "bf16", "adamw"] and len(choices) == 3
    assert choices["fp32"] is None and choices["bf16"] is torch.bfloat16
    assert choices["adamw"] is torch.optim.AdamW
    with pytest.raises(KeyError):
        choices["fp16"]
    with pytest.raises(ValueError, match="module:attribute"):
        LazyChoices(fp16="torch.float16")


def test_bucket_size_mb_reads_ddps_vocabulary():
    assert bucket_size_mb("25") == 25.0 and bucket_size_mb("0") == 0.0
    assert bucket_size_mb("none") is None and bucket_size_mb("None") is None
    for bad in ("-1", "inf", "nan"):
        with pytest.raises(ValueError):
            bucket_size_mb(bad)
