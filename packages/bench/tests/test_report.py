"""bench-report: the 2026 handout's problems answered from results the tools wrote."""

import json

import pytest

from bench.commands.report import main
from bench.core.results import Run, save_json
from bench.report.analysis import ANALYTIC_PROBLEMS
from bench.report.document import Heading, Image, Paragraph, Table, render
from bench.report.results import SOURCE, Results
from bench.report.single_gpu import _profile_cells, kernel_label
from bench.report.tool import PROBLEMS, build_report, report_links
from bench.tools.attn import run_attention
from bench.tools.model.residuals import run_residual_study
from lmcore import ModelSize

NOT_MEASURED = "Not measured: no result answers it yet."


def _section(text: str, key: str) -> str:
    """The body of the problem `key`'s section."""
    return text.split(f"`{key}`)\n")[1].split("\n## ")[0]


def test_collects_every_tool_result(tool_results):
    res = Results.collect(tool_results)
    assert sorted(r.run.tool for r in res.records) == ["attn", "flash", "model", "precision"]
    assert res.skipped == []


def test_every_problem_of_the_2026_handout_in_order(tool_results):
    text = build_report(tool_results)
    keys = [p.key for p in PROBLEMS]
    assert keys[:3] == ["benchmarking_script", "benchmarking_script (c)", "nsys_profile"]
    assert {
        "memory_profiling",
        "gradient_checkpointing",
        "fsdp_accounting",
        "fsdp_tp_calcs",
    } <= set(keys)
    positions = [text.index(f"`{key}`)\n") for key in keys]
    assert positions == sorted(positions)
    for problem in PROBLEMS:
        assert f"*Asks.* {problem.asks}" in _section(text, problem.key)


def test_unmeasured_problems_say_what_they_need(tool_results):
    text = build_report(tool_results)
    for key in ("naive_ddp_benchmarking", "leaderboard", "distributed_communication_single_node"):
        section = _section(text, key)
        assert NOT_MEASURED in section and "It needs" in section
    assert "two B200s" in _section(text, "leaderboard")


def test_answers_quote_the_rows_with_file_and_revision(tool_results):
    text = build_report(tool_results)
    res = Results.collect(tool_results)
    model = next(r for r in res.records if r.run.tool == "model")
    revision = model.run.env["git_revision"][:12]
    section = _section(text, "benchmarking_script")
    assert f"(source: `model.json` at `{revision}`)" in section
    fwd = next(r for r in model.run.rows if r["mode"] == "forward" and r["dtype"] == "fp32")
    assert f"{fwd['fwd_ms']:.3g} ms" in section
    precision = next(r for r in res.records if r.run.tool == "precision")
    fp16 = next(r for r in precision.run.rows if r.get("case") == "fp16 += fp16")
    assert f"fp16 += fp16: {fp16['printed']}" in _section(text, "mixed_precision_accumulation")
    assert "bf16 autocast runs a step at" in _section(text, "benchmarking_mixed_precision")


def test_analytic_problems_give_bench_plans_formulas_and_example_values(tool_results):
    text = build_report(tool_results)
    expected = {
        "alternate_ring_all_reduce": ["(N − 1)·S/W"],
        "data_parallel_calcs": ["12·B·D·F / N", "N ≤ 1 + B·W/C"],
        "fsdp_calcs": ["(a) forward FLOPs", "(c) largest N_FSDP, backward"],
        "tp_calcs": ["(a) backward pass", "(d) largest N_TP, forward"],
        "fsdp_tp_calcs": ["(c) largest N, axes overlapped", "(d) largest N, shared network"],
    }
    for key, pieces in expected.items():
        section = _section(text, key)
        for piece in pieces:
            assert piece in section, (key, piece)
        assert "800.9 TFLOP/s" in section and "allreduce_4xh200_2026-11-28.json" in section


def test_the_data_parallel_example_value_is_the_hand_computed_one():
    # B = 8192 tokens, C = 800.9e12 FLOP/s, W = 323.3e9 B/s: N_DP ≤ 1 + B·W/C.
    rows = ANALYTIC_PROBLEMS["data_parallel_calcs"][0]()
    bound = next(r for r in rows if r["part"] == "(c) largest N_DP")
    assert bound["example"] == f"N ≤ {1 + 8192 * 323.3e9 / 800.9e12:.4g}"


def test_oom_boundary_and_memory_accounting(tmp_path, tiny_attn_config, naive_attention_oom):
    run = run_attention(tiny_attn_config(), device="cpu", show_progress=False)
    save_json(run, tmp_path / "attn.json")
    section = _section(build_report(tmp_path), "pytorch_attention")
    assert "Out of memory from seq 32 (d=16)" in section
    assert "| d " in section and "OOM" in section


def test_profile_section_quotes_kernels_per_phase_never_ranges(tmp_path, tiny_model_config):
    from bench.tools.model import run_model

    timing = run_model(
        tiny_model_config(modes=("forward", "train-step"), steps=1),
        device="cpu",
        profile=tmp_path / "profile_cpu",
        show_progress=False,
    )
    save_json(timing, tmp_path / "profile_cpu_timing.json")
    section = _section(build_report(tmp_path), "nsys_profile")
    assert "(a) the forward pass takes" in section and "without the profiler" in section
    assert "(b) the operator with the most forward time is `aten::" in section
    assert "(d) over a training step matmuls take" in section
    assert "(e) inside attention softmax takes" in section and "their FLOPs" in section
    assert "Source: `profile_cpu.json`" in section
    assert "torch.profiler stands in for it" in section  # said plainly, before the answers


@pytest.mark.parametrize(
    ("name", "label"),
    [
        ("void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<"
         "at::native::BinaryFunctor<float, float, float, at::native::binary_internal::"
         "MulFunctor<float> > >(at::TensorIteratorBase&)", "elementwise_kernel (Mul)"),
        ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::"
         "(anonymous namespace)::TensorListMetadata<1>, std::plus<float>, float>(int)",
         "multi_tensor_apply_kernel (plus)"),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::"
         "silu_kernel(at::TensorIteratorBase&)::{lambda()#1}, std::array<char*, 2ul> >(int)",
         "vectorized_elementwise_kernel (silu)"),
        ("void cutlass::Kernel2<cutlass_80_simt_sgemm_128x256_8x4_nt_align1>(Params)",
         "Kernel2<cutlass_80_simt_sgemm_128x256_8x4_nt_align1>"),
        ("aten::mm", "aten::mm"),
        ("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n", "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n"),
    ],
)  # fmt: skip
def test_a_kernel_is_named_by_what_it_computes(name, label):
    assert kernel_label(name) == label


def test_residuals_answer_memory_question_f_and_checkpointing(tmp_path):
    shape = ("odd", ModelSize(d_model=12, d_ff=20, num_layers=4, num_heads=3))
    run = run_residual_study([shape], context_lengths=(2048,), batch=1)
    save_json(run, tmp_path / "residuals_cpu.json")
    text = build_report(tmp_path)
    memory = _section(text, "memory_profiling")
    block = next(r for r in run.rows if r["kind"] == "block" and r["checkpointing"] == "none")
    assert f"keeps {block['mib']:.3g} MiB for backward" in memory
    assert "the five largest contributors:" in memory and "(100%)" not in memory
    checkpointing = _section(text, "gradient_checkpointing")
    assert "least at K = √(N·input/residuals)" in checkpointing
    assert "K=1:" in checkpointing and "K=4:" in checkpointing


def test_official_suites_and_the_fsdp_last_bit(tmp_path):
    rows = [
        {"suite": "spring2026", "version": "26.1.1", "test": t, "outcome": o, "seconds": 1.0}
        for t, o in (
            ("test_fsdp::test_fsdp_correctness[fp32]", "failed"),
            ("test_fsdp::test_fsdp_correctness[fp16]", "passed"),
            ("test_attention::test_flash_forward_pass_pytorch", "passed"),
        )
    ]
    save_json(Run.create("official_tests", rows, device="cpu", config={}), tmp_path / "o.json")
    last_bit = {"threads": 1, "step": 0, "parameter": "linear1.weight", "numel": 8192}
    last_bit |= {"grad_differ": 4000, "grad_max_abs": 1.5e-8, "param_differ": 40}
    save_json(Run.create("fsdp_last_bit", [last_bit], device="cpu", config={}), tmp_path / "f.json")
    text = build_report(tmp_path)
    fsdp = _section(text, "fsdp")
    assert "spring2026: 1 of 2 passed (failed: test_fsdp::test_fsdp_correctness[fp32])" in fsdp
    assert "in 4,000 of 8,192 elements of linear1.weight" in fsdp
    assert "1 passed, 0 failed" in _section(text, "flash_forward")


def test_real_ddp_and_zero_output_goes_through_the_report(tmp_path, ddp_run, zero_run):
    save_json(ddp_run, tmp_path / "ddp_cpu.json")
    save_json(zero_run, tmp_path / "zero_cpu.json")
    text = build_report(tmp_path)
    naive = next(r for r in ddp_run.rows if r["variant"] == "ddp:naive")
    assert f"{naive['step_ms']:.3g} ms per step" in _section(text, "naive_ddp_benchmarking")
    sharded = next(r for r in zero_run.rows if r["variant"] == "zero1:torch-ddp")
    section = _section(text, "optimizer_state_sharding_accounting")
    assert f"{sharded['state_vs_ddp']:.2f}× plain DDP's" in section


def test_latex_and_typst_export_the_tables(tool_results, tmp_path):
    latex = build_report(tool_results, fmt="latex", output=tmp_path / "r.tex")
    assert latex.startswith(r"\documentclass{article}") and latex.rstrip().endswith(
        r"\end{document}"
    )
    assert r"\toprule" in latex and r"\section*{1. Benchmarking Script" in latex
    assert r"\texttt{benchmarking\_script}" in latex
    typst = build_report(tool_results, fmt="typst")
    assert "#fit-table(" in typst and "== 1. Benchmarking Script" in typst


def test_document_renderers_escape_and_keep_every_cell():
    doc = [
        Heading(1, "R"),
        Paragraph("a_b costs 5% of `x_y` and **much** more"),
        Table([{"name": "mm_kernel", "ms": 1.5}, {"name": "#2", "status": "OOM"}], ["name", "ms"]),
        Image("p.png", "plot"),
    ]
    latex = render(doc, "latex")
    assert r"a\_b costs 5\% of \texttt{x\_y} and \textbf{much}" in latex
    assert r"mm\_kernel & 1.5 \\" in latex and r"\#2 & OOM \\" in latex
    assert r"\includegraphics[width=\linewidth]{p.png}" in latex
    typst = render(doc, "typst")
    assert '("mm_kernel", "1.5",)' in typst and 'image("p.png"' in typst
    markdown = render(doc, "markdown")
    assert "![plot](p.png)" in markdown and "| mm_kernel" in markdown
    with pytest.raises(ValueError, match="typst"):
        render(doc, "html")


def test_every_link_in_the_report_exists(tool_results, tmp_path):
    from bench.tools.attn import plot_attention

    attn = next(r for r in Results.collect(tool_results).records if r.run.tool == "attn")
    results = tmp_path / "results"
    save_json(attn.run, results / "attn_cpu.json")
    plot_attention(attn.run, results / "attn_cpu.png")
    out = tmp_path / "docs" / "REPORT.md"
    text = build_report(results, output=out)
    assert "![attn_cpu](../results/attn_cpu.png)" in text
    links = report_links(text)
    assert links and [link for link in links if not (out.parent / link).exists()] == []


def test_images_follow_a_renamed_result(tmp_path):
    from bench.commands.precision import main as precision_main

    results = tmp_path / "results"
    argv = ["--device", "cpu", "--json", str(results / "p.json"), "--plot", str(results / "p.png")]
    assert precision_main(argv) == 0
    (results / "p.json").rename(results / "precision_cpu_2026-01-01.json")
    (results / "p.png").rename(results / "precision_cpu_2026-01-01.png")
    text = build_report(results)
    assert "![precision_cpu_2026-01-01](precision_cpu_2026-01-01.png)" in text
    assert "(p.png)" not in text  # the recorded name no longer exists


def test_foreign_json_is_skipped_and_a_missing_folder_is_an_error(tmp_path):
    (tmp_path / "other.json").write_text(json.dumps({"hello": 1}))
    text = build_report(tmp_path)
    assert "Skipped files: other.json" in text
    with pytest.raises(FileNotFoundError, match="--json"):
        build_report(tmp_path / "nope")


def test_main_help_and_output(help_text, tool_results, tmp_path):
    assert "--format" in help_text(main)
    out = tmp_path / "report.typ"
    assert main([str(tool_results), "-o", str(out), "--format", "typst"]) == 0
    assert out.read_text().startswith("#set page")


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
    runs = [r.run for r in Results.collect(tool_results).records] + [ddp_run, zero_run]
    for run in runs:
        written = {key for row in run.rows for key in row}
        assert written <= set(keys[run.tool]), (run.tool, written - set(keys[run.tool]))


def test_a_cell_profiled_twice_is_quoted_from_the_newer_file_and_forward_folds_into_the_step():
    def row(cell, source, name):
        return {"cell": cell, SOURCE: source, "name": name}

    rows = [  # oldest file first, as Results.rows gives them
        row("small_ctx256_train-step_fp32_naive", 0, "old kernel"),
        row("medium_ctx256_train-step_fp32_naive", 0, "medium kernel"),
        row("small_ctx256_train-step_fp32_naive", 1, "new kernel"),
        row("small_ctx256_forward_fp32_naive", 1, "forward kernel"),
        row("xl_ctx256_forward_fp32_naive", 1, "xl forward kernel"),
    ]
    cells = _profile_cells(rows)
    assert [r["name"] for r in cells["small_ctx256_train-step_fp32_naive"]] == ["new kernel"]
    assert "medium_ctx256_train-step_fp32_naive" in cells  # only the older file has it
    assert "small_ctx256_forward_fp32_naive" not in cells  # its step's forward answers it
    assert "xl_ctx256_forward_fp32_naive" in cells  # no step of that shape


def test_the_writeup_answers_from_the_newer_gpu_and_the_full_report_keeps_both(save, tmp_path):
    rows = [{"size": "small", "ctx": 512, "mode": "forward", "step_ms": 20.0, "status": "ok"}]
    save("model_h100_2026-11-25", "model", rows, date="2026-11-25")
    save("model_h200_2026-11-28", "model", rows, date="2026-11-28", device_name="NVIDIA H200")
    assert not Results.collect(tmp_path).earlier
    earlier = Results.collect(tmp_path, newest_gpu=True).earlier
    assert set(earlier) == {tmp_path / "model_h100_2026-11-25.json"}
