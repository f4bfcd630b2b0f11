"""bench-attn: records, OOM handling, the CPU default, the command line."""

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from bench.commands.attn import COMMAND, main
from bench.core.oom import OK, OOM
from bench.core.results import NOISY, Run, load_json
from bench.core.tool import device_config
from bench.tools.attn import (
    BRIEF,
    COLUMNS,
    CPU_TIMES,
    HANDOUT_GRID,
    IMPLS,
    TOOL,
    AttnConfig,
    _add_ratios,
    run_attention,
)


def test_rows_have_every_column_and_status(tiny_attn_config):
    run = run_attention(tiny_attn_config(), device="cpu", show_progress=False)
    assert run.tool == "attn"
    assert len(run.rows) == 2 * 3  # seqs x impls
    for row in run.rows:
        assert set(COLUMNS) <= set(row)
        assert row["status"] == OK
        assert row["fwd_ms"] > 0 and row["bwd_ms"] > 0
        assert row["mem_before_bwd_mib"] is None  # not tracked on the CPU
    assert run.env["device_type"] == "cpu"
    assert run.config["seqs"] == [17, 32]


def test_ratios_are_sdpa_time_over_own_time(tiny_attn_config):
    run = run_attention(tiny_attn_config(seqs=(32,)), device="cpu", show_progress=False)
    by_impl = {r["impl"]: r for r in run.rows}
    assert by_impl["sdpa"]["fwd_vs_sdpa"] == 1.0
    naive = by_impl["naive"]
    assert naive["fwd_vs_sdpa"] == pytest.approx(by_impl["sdpa"]["fwd_ms"] / naive["fwd_ms"])


def test_a_cpu_run_says_first_that_its_times_check_it_runs(tiny_attn_config, capsys):
    run = run_attention(tiny_attn_config(seqs=(17,)), device="cpu", show_progress=False)
    assert run.notes[0] == CPU_TIMES and CPU_TIMES in capsys.readouterr().err
    assert all(NOISY in row for row in run.rows)


def test_noisy_times_and_their_ratios_are_flagged_and_printed_as_noisy():
    rows = [
        {"impl": "naive", "d": 16, "seq": 64, "seq_k": 64, "fwd_ms": 5.0, "bwd_ms": 2.0,
         NOISY: ["fwd_ms"], "status": OK},
        {"impl": "sdpa", "d": 16, "seq": 64, "seq_k": 64, "fwd_ms": 1.0, "bwd_ms": 1.0,
         NOISY: ["bwd_ms"], "status": OK},
    ]  # fmt: skip
    _add_ratios(rows)
    assert rows[0][NOISY] == ["fwd_ms", "fwd_vs_sdpa", "bwd_vs_sdpa"]
    assert rows[0]["fwd_vs_sdpa"] == pytest.approx(0.2)  # the number stays in the row
    run = Run.create("attn", rows, device="cpu", config={}, columns=COLUMNS, brief=BRIEF)
    naive = next(line for line in run.table(wide=False).splitlines() if "naive" in line)
    assert naive.count("noisy") == 3 and "0.2" not in naive
    assert "0.2" in run.table()


def test_injected_oom_marks_the_row_and_the_sweep_goes_on(tiny_attn_config, naive_attention_oom):
    run = run_attention(tiny_attn_config(), device="cpu", show_progress=False)
    status = {(r["impl"], r["seq"]): r["status"] for r in run.rows}
    assert status[("naive", 17)] == OK
    assert status[("naive", 32)] == OOM
    assert status[("sdpa", 32)] == OK
    oom_row = next(r for r in run.rows if r["status"] == OOM)
    assert oom_row["fwd_ms"] is None and oom_row["fwd_vs_sdpa"] is None
    assert "| OOM" in run.table()


def test_triton_on_cpu_is_skipped_with_reason(tiny_attn_config):
    run = run_attention(
        tiny_attn_config(seqs=(17,), impls=("fa2-triton",)), device="cpu", show_progress=False
    )
    (row,) = run.rows
    assert row["status"].startswith("skipped: ") and "CUDA" in row["status"]


def test_missing_fa2_is_skipped_not_fatal(tiny_attn_config, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "fa2", None)  # `import fa2` now fails
    run = run_attention(
        tiny_attn_config(seqs=(17,), impls=("fa2-pytorch", "naive")),
        device="cpu",
        show_progress=False,
    )
    status = {r["impl"]: r["status"] for r in run.rows}
    assert status["naive"] == OK
    assert status["fa2-pytorch"].startswith("skipped: the fa2 package is not importable")


def test_the_main_job_runs_as_the_readme_gives_it(tmp_path):
    """`uv run bench-attn`: the console script (`python -m bench attn` where the sources are on
    the path without an installation), in a process of its own, runs the CPU default and says
    so. The one run of the real default in the tests: its numbers are checked by the tests above
    on smaller grids."""
    script = Path(sys.executable).with_name("bench-attn")
    command = [str(script)] if script.is_file() else [sys.executable, "-m", "bench", "attn"]
    out = tmp_path / "attn.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}  # the CPU default
    proc = subprocess.run(
        [*command, "--no-progress", "--json", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "no GPU: running the small CPU default" in proc.stderr
    run = load_json(out)
    assert run.command.startswith("bench-attn") and "| impl" in proc.stdout
    assert proc.stdout.count(CPU_TIMES.split(":")[0]) == 1  # said once, before the table
    table = [line for line in proc.stdout.splitlines() if line.startswith("|")]
    assert max(map(len, table)) <= 120 and "skipped" not in "".join(table)  # a numbered note
    assert any("no GPU" in n for n in run.notes)
    assert {r["status"] for r in run.rows if r["impl"] != "fa2-triton"} == {OK}
    assert len(run.rows) == device_config(AttnConfig, "cpu").num_cells


@pytest.mark.parametrize("bad", [{"impls": ("nope",)}, {"dtype": "fp8"}, {"seqs": (0,)}])
def test_config_rejects_bad_values(bad):
    with pytest.raises(ValueError):
        AttnConfig(**bad)


def test_main_help_exits_zero(help_text):
    assert "--seq" in help_text(main)


def test_main_writes_json_and_plots(tmp_path, capsys):
    out = tmp_path / "attn.json"
    argv = ["--device", "cpu", "--d", "16", "--seq", "16", "32", "--impls", "naive", "sdpa"]
    argv += ["--steps", "2", "--warmup", "0", "--no-progress"]
    assert main([*argv, "--json", str(out), "--plot", str(tmp_path / "attn.png")]) == 0
    assert out.is_file()
    assert (tmp_path / "attn.png").is_file() and (tmp_path / "attn_bwd.png").is_file()
    assert "bench-attn --device cpu" in capsys.readouterr().out


def test_gpu_default_is_the_story_in_about_a_minute():
    config = device_config(AttnConfig, "cuda")
    assert {"fa2-triton", "sdpa", "naive"} == set(config.impls)
    assert len(config.d_values) > 1 and len(config.seqs) > 1
    assert 30 <= config.estimate_s() <= 90


def test_grid_handout_is_the_whole_grid_and_options_still_apply():
    parser = COMMAND.parser()
    cuda = torch.device("cuda")
    handout = TOOL.configure(parser.parse_args(["--grid", "handout"]), parser, cuda)
    assert handout == HANDOUT_GRID
    assert handout.d_values == (16, 32, 64, 128) and handout.seqs[-1] == 16384
    assert set(handout.impls) == set(IMPLS) and handout.steps == 100
    narrowed = TOOL.configure(parser.parse_args(["--grid", "handout", "--d", "64"]), parser, cuda)
    assert narrowed == replace(HANDOUT_GRID, d_values=(64,))


def test_slow_cells_time_fewer_calls_and_say_why(tiny_attn_config):
    config = tiny_attn_config(seqs=(32,), impls=("naive",), steps=50, max_seconds=1e-6)
    (row,) = run_attention(config, device="cpu", show_progress=False).rows
    assert row["n"] == 3
    assert row["note"].startswith("3 of 50 calls") and "budget" in row["note"]


def test_a_slow_first_call_does_not_size_the_timing(tiny_attn_config, monkeypatch):
    """The first call builds kernels (seconds on a GPU); the calls after it set the count."""
    import bench.tools.attn as attn

    calls = []

    def fake_time_fn(fn, *, device, warmup, repeats):
        calls.append(repeats)
        fn()
        return [5_000.0 if len(calls) == 1 else 1.0] * repeats

    monkeypatch.setattr(attn, "time_fn", fake_time_fn)
    config = tiny_attn_config(seqs=(32,), impls=("naive",), steps=50, max_seconds=1.0)
    (row,) = run_attention(config, device="cpu", show_progress=False).rows
    assert row["n"] == 50 and row["note"] is None


def test_rows_print_as_they_complete_without_a_bar(capsys):
    argv = ["--device", "cpu", "--d", "16", "--seq", "16", "32", "--impls", "naive", "sdpa"]
    assert main([*argv, "--steps", "2", "--warmup", "0", "--no-progress"]) == 0
    err = capsys.readouterr().err.splitlines()
    plan = next(i for i, line in enumerate(err) if line.startswith("bench-attn: 4 cells"))
    assert "about" in err[plan]
    rows = [line for line in err[plan:] if line.startswith(("| naive", "| sdpa"))]
    assert len(rows) == 4


@pytest.mark.gpu
def test_every_implementation_runs_on_cuda():
    config = AttnConfig(d_values=(64,), seqs=(256,), impls=IMPLS, steps=3, warmup=1)
    run = run_attention(config, device="cuda", show_progress=False)
    assert {r["status"] for r in run.rows} == {OK}
    assert all(r["mem_before_bwd_mib"] > 0 and r["peak_mib"] > 0 for r in run.rows)


def test_rectangular_shapes_time_each_query_length_against_each_key_length(
    tiny_attn_config, tmp_path
):
    config = tiny_attn_config(seqs=(17, 32), seq_ks=(17, 32), impls=("fa2-pytorch", "sdpa"))
    assert config.num_cells == 2 * 2 * 2
    run = run_attention(config, device="cpu", show_progress=False)
    assert [(r["seq"], r["seq_k"]) for r in run.rows[::2]] == [
        (17, 17),
        (17, 32),
        (32, 17),
        (32, 32),
    ]
    sdpa = {(r["seq"], r["seq_k"]): r for r in run.rows if r["impl"] == "sdpa"}
    for row in run.rows:
        assert row["status"] == OK and row["fwd_ms"] > 0
        ref = sdpa[row["seq"], row["seq_k"]]  # each shape against SDPA at the same shape
        assert row["fwd_vs_sdpa"] == pytest.approx(ref["fwd_ms"] / row["fwd_ms"])
    written = {p.name for p in TOOL.plot(run, tmp_path / "attn.png")}
    # the square cells' lines, fa2's ratio over (Nq, Nk), and over (seq, d) for two square seqs
    assert written == {"attn.png", "attn_bwd.png", "attn_ratio_nq_nk.png", "attn_ratio_seq_d.png"}


def test_square_shapes_have_their_own_key_length(tiny_attn_config):
    run = run_attention(tiny_attn_config(seqs=(17,)), device="cpu", show_progress=False)
    assert {r["seq_k"] for r in run.rows} == {17}
