"""bench-report: a report built from results the tools wrote."""

import json

import pytest

from bench.core.results import save_json
from bench.tools.attn import run_attention
from bench.tools.report import NOT_MEASURED, SECTIONS, build_report, collect_runs, main


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
    assert "![precision](../results/p.png)" in text
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
