"""bench-report: a report built from results the tools wrote."""

import json

import pytest

from bench.core.results import save_json
from bench.tools.attn import run_attention
from bench.tools.report import (
    NOT_MEASURED,
    SECTIONS,
    build_report,
    collect_runs,
    main,
    report_links,
)


def test_collects_every_tool_result(tool_results):
    runs, skipped = collect_runs(tool_results)
    assert sorted(r.tool for _, r in runs) == ["attn", "flash", "model", "precision"]
    assert skipped == []


def test_sections_in_handout_order_with_tables(tool_results):
    text = build_report(tool_results)
    positions = [text.index(f"{s.title} (") for s in SECTIONS]
    assert positions == sorted(positions)
    assert text.count("Source: `") == 4
    assert "| impl" in text and "| size" in text


def test_unmeasured_sections_say_so(tool_results):
    text = build_report(tool_results)
    for title in ("Warm-up", "Communication: all-reduce", "Data-parallel training"):
        section = text.split(f"{title} (")[1].split("\n## ")[0]
        assert NOT_MEASURED in section


def test_answers_come_from_the_rows(tool_results):
    text = build_report(tool_results)
    runs = {r.tool: r for _, r in collect_runs(tool_results)[0]}
    fb = next(r for r in runs["model"].rows if r["mode"] == "forward-backward")
    assert "Backward time / forward time:" in text
    assert f"{fb['size']} ctx {fb['ctx']} fp32:" in text
    assert "bf16 autocast speed-up (fp32 step / bf16 step):" in text
    fp16 = next(r for r in runs["precision"].rows if r.get("case") == "fp16 += fp16")
    assert f"fp16 += fp16: {fp16['printed']}" in text
    assert "fa2-pytorch forward+backward vs sdpa" in text


def test_oom_boundary_is_reported(tmp_path, tiny_attn_config, naive_attention_oom):
    run = run_attention(tiny_attn_config(), device="cpu", show_progress=False)
    save_json(run, tmp_path / "attn.json")
    text = build_report(tmp_path)
    assert "d=16: naive attention fits up to seq 17, out of memory from seq 32." in text


def test_plots_are_linked_relative_to_the_report(tmp_path):
    from bench.tools.precision import main as precision_main

    results = tmp_path / "results"
    assert (
        precision_main(
            ["--device", "cpu", "--json", str(results / "p.json"), "--plot", str(results / "p.png")]
        )
        == 0
    )
    text = build_report(results, output=tmp_path / "docs" / "report.md")
    assert "![p](../results/p.png)" in text
    assert (tmp_path / "docs" / "report.md").read_text() == text


def test_foreign_json_is_skipped(tmp_path):
    (tmp_path / "other.json").write_text(json.dumps({"hello": 1}))
    text = build_report(tmp_path)
    assert "Skipped files: other.json" in text
    assert text.count(NOT_MEASURED) == len(SECTIONS)


def test_missing_folder_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="--json"):
        build_report(tmp_path / "nope")


def test_main_help_exits_zero(help_text):
    assert "folder" in help_text(main)


def test_main_writes_output(tool_results, tmp_path, capsys):
    out = tmp_path / "report.md"
    assert main([str(tool_results), "-o", str(out)]) == 0
    assert out.read_text().startswith("# Benchmark report")


def test_communication_answers_from_an_allreduce_run(tmp_path):
    from bench.tools.allreduce import AllReduceConfig, run_allreduce

    config = AllReduceConfig(backends=("gloo",), sizes_mb=(1.0,), world_sizes=(2,), steps=2)
    run = run_allreduce(config, device="cpu", show_progress=False)
    save_json(run, tmp_path / "allreduce.json")
    (row,) = run.rows
    text = build_report(tmp_path)
    assert f"gloo, 2 ranks (median): 1 MB {row['ms']:.3g} ms" in text


def _assert_links_exist(text, report_dir):
    links = report_links(text)
    assert links
    missing = [link for link in links if not (report_dir / link).exists()]
    assert missing == []


def test_every_link_in_the_report_exists(tool_results, tmp_path):
    from bench.tools.attn import plot_attention

    attn_run = next(r for _, r in collect_runs(tool_results)[0] if r.tool == "attn")
    results = tmp_path / "results"
    save_json(attn_run, results / "attn_cpu.json")
    plot_attention(attn_run, results / "attn_cpu.png")
    out = tmp_path / "docs" / "REPORT.md"
    text = build_report(results, output=out)
    assert "![attn_cpu](../results/attn_cpu.png)" in text
    assert "![attn_cpu_bwd](../results/attn_cpu_bwd.png)" in text
    _assert_links_exist(text, out.parent)


def test_images_follow_a_renamed_result(tmp_path):
    from bench.tools.precision import main as precision_main

    results = tmp_path / "results"
    argv = ["--device", "cpu", "--json", str(results / "p.json"), "--plot", str(results / "p.png")]
    assert precision_main(argv) == 0
    (results / "p.json").rename(results / "precision_cpu_2026-01-01.json")
    (results / "p.png").rename(results / "precision_cpu_2026-01-01.png")
    (results / "precision_cpu_2026-01-01_extra.png").write_bytes(
        (results / "precision_cpu_2026-01-01.png").read_bytes()
    )
    text = build_report(results)
    assert "![precision_cpu_2026-01-01](precision_cpu_2026-01-01.png)" in text
    assert "![precision_cpu_2026-01-01_extra](precision_cpu_2026-01-01_extra.png)" in text
    assert "(p.png)" not in text  # the recorded name no longer exists
    _assert_links_exist(text, results)


def test_report_opens_with_a_summary_and_asks_each_question(tool_results):
    text = build_report(tool_results)
    summary = text.split("## Summary")[1].split("\n## ")[0]
    assert "from 4 result file(s)" in summary and "attn on" in summary
    assert "Triton FlashAttention-2" not in summary  # fa2-triton is skipped on the CPU
    for section in SECTIONS:
        body = text.split(f"{section.title} ({section.handout})")[1].split("\n## ")[0]
        assert f"*Question.* {section.question}" in body


def test_real_ddp_and_zero_output_goes_through_the_report(tmp_path, ddp_run, zero_run):
    save_json(ddp_run, tmp_path / "ddp_cpu.json")
    save_json(zero_run, tmp_path / "zero_cpu.json")
    text = build_report(tmp_path)
    rows = {r["case"]: r for r in ddp_run.rows}
    bucketed = rows["bucketed 0.01 MB"]
    assert f"hides {bucketed['hidden_e2e']:.0%} of that all-reduce end to end" in text
    assert "A standalone all-reduce of all gradient bytes (all-reduce alone" in text
    assert f"takes {bucketed['vs_torch']:.2f}× torch DDP's step time" in text
    sharded = next(r for r in zero_run.rows if r["variant"] == "sharded")
    assert f"keeps {sharded['state_vs_ddp']:.2f}× the optimizer state of plain DDP" in text
    for title in ("Data-parallel training", "Optimizer-state sharding"):
        section = text.split(f"{title} (")[1].split("\n## ")[0]
        assert NOT_MEASURED not in section and "Source: `" in section


def test_profile_answers_section_1_1_4(tmp_path, tiny_model_config):
    from bench.tools.model import run_model

    run_model(
        tiny_model_config(modes=("train-step",), steps=1),
        device="cpu",
        profile=tmp_path / "profile_cpu",
        show_progress=False,
    )
    text = build_report(tmp_path)
    section = text.split("Profiling (§1.1.4")[1].split("\n## ")[0]
    assert "under the profiler, forward" in section
    assert "the most expensive operator is" in section
    assert "inside naive attention, softmax takes" in section
    assert "Source: `profile_cpu.json`" in section


def test_every_key_a_tool_writes_is_declared_in_its_keys(tool_results, ddp_run, zero_run):
    from bench.tools import attn, data_parallel, flash, model, precision, sharding

    keys = {
        "model": model.KEYS,
        "attn": attn.KEYS,
        "flash": flash.KEYS,
        "precision": precision.KEYS,
        "ddp": data_parallel.KEYS,
        "zero": sharding.KEYS,
    }
    runs = [r for _, r in collect_runs(tool_results)[0]] + [ddp_run, zero_run]
    for run in runs:
        written = {key for row in run.rows for key in row}
        assert written <= set(keys[run.tool]), (run.tool, written - set(keys[run.tool]))
