"""bench-report's 2026 sections from results of several days: earlier runs set apart, sizes
shown with their dimensions, the checkpointing study, the leaderboard, missing timelines, the
committed report's links and the missing runs' commands."""

import json
import re
import shlex
from pathlib import Path

from bench.core.results import Run, save_json
from bench.report.results import Results, name_with_dims, topic
from bench.report.runs import (
    CHECKPOINTING_STUDY,
    COMPILE_MODEL,
    FLASH_NAIVE,
    MEMORY_TIMELINES,
    PROFILES,
    SCRIPT,
)
from bench.report.single_gpu import is_memory
from bench.report.tool import build_report, report_links

ROOT = Path(__file__).resolve().parents[3]
XL_2025 = {"d_model": 1600, "d_ff": 6400, "num_layers": 48, "num_heads": 25}
XL = {"d_model": 2560, "d_ff": 10240, "num_layers": 32, "num_heads": 32}


def _section(text: str, key: str) -> str:
    return text.split(f"`{key}`)\n")[1].split("\n## ")[0]


def _model_row(size: str, dims: dict, ctx: int, mode: str, fwd_ms: float) -> dict:
    return {
        "size": size, **dims, "ctx": ctx, "batch": 4, "mode": mode, "dtype": "fp32",
        "attention": "naive", "compiled": False, "fwd_ms": fwd_ms, "fwd_std": 0.1,
        "bwd_ms": None if mode == "forward" else 2.1 * fwd_ms, "step_ms": 3.3 * fwd_ms,
        "step_std": 0.2, "status": "ok",
    }  # fmt: skip


def test_topic_is_the_name_less_device_and_date():
    assert topic("docs/results/memory_fp32_h100_2026-11-25.json") == "memory_fp32"
    assert topic("ddp_2xh200_2026-11-22.json") == "ddp"
    assert topic("profile_h100_2026-11-23_timing.json") == "profile"
    assert topic("plan_check_2026-11-25.json") == "plan_check"


def test_a_newer_result_of_the_same_kind_replaces_the_older(save, tmp_path):
    old = [_model_row("xl", XL_2025, 256, m, 120.5) for m in ("forward", "train-step")]
    new = [_model_row("xl", XL, 512, m, 326.25) for m in ("forward", "train-step")]
    save("model_h100_2026-11-22", "model", old, date="2026-11-22T00:00:00+00:00")
    save("model_h100_2026-11-25", "model", new, date="2026-11-25T00:00:00+00:00")
    res = Results.collect(tmp_path)
    assert [r.path.name for r in res.earlier[tmp_path / "model_h100_2026-11-22.json"]] == [
        "model_h100_2026-11-25.json"
    ]
    section = _section(build_report(tmp_path), "benchmarking_script")
    assert "326 ms" in section and "120.5" not in section and "121 ms" not in section
    assert "Earlier run: " in section and "Replaced by `model_h100_2026-11-25.json`" in section
    # the earlier run's table is left out, so its 1600-wide xl cannot pass for the 2026 one
    assert "1600/6400" not in section


def test_an_attention_grid_measured_again_elsewhere_is_an_earlier_run(save, tmp_path):
    def cell(impl, d, seq, ms):
        measured = {"fwd_ms": ms, "bwd_ms": 2 * ms, "mem_before_bwd_mib": seq / 10}
        config = {"impl": impl, "batch": 8, "d": d, "seq": seq, "dtype": "fp32", "causal": False}
        return {**config, **measured, "status": "ok"}

    save("attn_h100_2026-11-23", "attn", [cell("naive", 64, 1024, 9.75)], date="2026-11-23")
    grid = [
        cell(i, d, s, 0.5) for i in ("naive", "compiled") for d in (16, 64) for s in (256, 1024)
    ]
    save("attn_grid_h100_2026-11-25", "attn", grid, date="2026-11-25")
    save("attn_other_h100_2026-11-24", "attn", [cell("sdpa", 32, 97, 1.0)], date="2026-11-24")
    res = Results.collect(tmp_path)
    assert set(res.earlier) == {tmp_path / "attn_h100_2026-11-23.json"}
    section = _section(build_report(tmp_path), "pytorch_attention")
    assert "9.75" not in section and "| 64  | 1024" in section


def test_an_all_reduce_measured_again_on_more_gpus_replaces_the_older_cells(save, tmp_path):
    def row(backend, world, size_mb, ms, status="ok"):
        return {"backend": backend, "world_size": world, "size_mb": size_mb, "ms": ms,
                "busbw_gbps": ms and size_mb / ms, "status": status}  # fmt: skip

    old = [row(b, 2, s, 9.5 * s) for b in ("nccl", "gloo") for s in (1, 10, 100)]
    old.append(row("gloo", 2, 1000, None, status="skipped: --full not given"))
    save("allreduce_2xh200_2026-11-22", "allreduce", old, date="2026-11-22",
         device_name="NVIDIA H200")  # fmt: skip
    new = [row(b, w, s, 0.25 * s * w) for b in ("nccl", "gloo") for w in (2, 4)
           for s in (1, 10, 100, 1000)]  # fmt: skip
    save("allreduce_4xh200_2026-11-28", "allreduce", new, date="2026-11-28",
         device_name="NVIDIA H200")  # fmt: skip
    res = Results.collect(tmp_path)
    # every cell the two-GPU run measured was measured again: its file name's GPU count
    # does not keep it current, as it does for a result of one topic
    assert set(res.earlier) == {tmp_path / "allreduce_2xh200_2026-11-22.json"}
    section = _section(build_report(tmp_path), "distributed_communication_single_node")
    assert "95" not in section.split("Not run")[0]  # no old time (9.5 x 10 ms) in the table


def test_gloo_measured_on_a_cpu_alone_fills_and_replaces_the_gpu_runs_gloo_cells(
    save, tmp_path, base_env
):
    def row(backend, world, size_mb, ms):
        return {"backend": backend, "world_size": world, "size_mb": size_mb, "ms": ms,
                "busbw_gbps": size_mb / ms, "status": "ok"}  # fmt: skip

    # an older GPU machine's run measured gloo at 6 processes; a newer one at 2 and 4 only
    save("allreduce_2xh200_2026-11-22", "allreduce", [row("gloo", 6, 1, 9.75)],
         date="2026-11-22", device_name="NVIDIA H200")  # fmt: skip
    save("allreduce_4xh200_2026-11-28", "allreduce",
         [row(b, w, 1, 0.5 * w) for b in ("nccl", "gloo") for w in (2, 4)],
         date="2026-11-28", device_name="NVIDIA H200")  # fmt: skip
    # gloo needs no GPU: a later run on a CPU alone is a measurement, not a stand-in
    env = {**base_env, "device_type": "cpu", "date": "2026-11-29"}
    cpu = Run.create("allreduce", [row("gloo", 6, 1, 3.25)], device="cpu", config={}, env=env)
    save_json(cpu, tmp_path / "allreduce_gloo6_cpu_2026-11-29.json")
    res = Results.collect(tmp_path)
    assert tmp_path / "allreduce_2xh200_2026-11-22.json" in res.earlier
    section = _section(build_report(tmp_path), "distributed_communication_single_node")
    table = section.split("Not run")[0]
    assert "3.25" in table and "9.75" not in table
    assert "gloo at 6" not in section  # the column is filled
    assert "allreduce_gloo6_cpu_2026-11-29.json" in section


def test_two_current_all_reduce_results_of_one_process_count_read_as_one(save, tmp_path):
    def row(world, size_mb, ms):
        return {"backend": "nccl", "world_size": world, "size_mb": size_mb, "ms": ms,
                "busbw_gbps": size_mb / ms, "status": "ok"}  # fmt: skip

    # the older one has a cell (6 processes) the newer lacks, so both stay current
    save("allreduce_8xh100_2026-11-22", "allreduce", [row(2, 1, 0.05), row(6, 1, 0.1)],
         date="2026-11-22")  # fmt: skip
    save("allreduce_4xh100_2026-11-28", "allreduce", [row(2, 1, 0.04), row(2, 1000, 3.0)],
         date="2026-11-28")  # fmt: skip
    section = _section(build_report(tmp_path), "distributed_communication_single_node")
    assert "from 1 to 1,000 MB the time grows" in section


def test_tables_and_titles_show_what_a_size_name_meant(save, tmp_path):
    save("model_h100_2026-11-22", "model", [_model_row("xl", XL_2025, 256, "forward", 120.5)],
         date="2026-11-22")  # fmt: skip
    shape = {"name": "xl", **XL_2025}
    single = {"case": "single", "variant": "single", "step_ms": 236.5}
    save("ddp_2xh200_2026-11-22", "ddp", [single], date="2026-11-22",
         title="Data-parallel training step: xl, fp32, 2 ranks",
         config={"shape": shape, "context_length": 128, "batch": 4})  # fmt: skip
    text = build_report(tmp_path)
    assert "xl-2025 (1600/6400/48L/25H; recorded as xl)" in text
    assert "Data-parallel training step: xl-2025 (1600/6400/48L/25H; recorded as xl), fp32" in text
    assert re.search(r"\|\s*xl\s*\|", text) is None  # no table cell names xl alone


def test_a_title_without_dimensions_takes_them_from_the_runs_date():
    title = "scaling: small (768/3072/12L/12H), xl, context 256; xl: batch 8"
    assert name_with_dims(title, date="2026-11-28") == (
        "scaling: small (768/3072/12L/12H), xl (2560/10240/32L/32H), context 256; xl: batch 8"
    )
    assert name_with_dims("zero: xl (AdamW), 2 ranks", date="2026-11-22") == (
        "zero: xl-2025 (1600/6400/48L/25H; recorded as xl) (AdamW), 2 ranks"
    )
    assert name_with_dims("zero: xl, 2 ranks") == "zero: xl (dimensions not recorded), 2 ranks"


_STUDY_NOTE = (
    "Checkpointing study: one block (bf16-autocast, fa2-triton, eager) saves A = 1,561.1 MiB "
    "for backward and takes b = 80.0 MiB of input (lmcore.saved_activation_bytes); "
    "lmcore.memory_optimal_segment_size(32, b, A) = 1: the rows are none, segments:1, "
    "segments:2, nested (segments of 0 blocks: none)."
)


def _step_row(impl: str, ckpt: str, **values) -> dict:
    base = {
        "impl": impl, "size": "xl", "size_label": "xl (2560/10240/32L/32H)", **XL, "ctx": 2048,
        "batch": 4, "precision": "bf16-autocast", "attention": "fa2-triton",
        "loss": "materialized", "optimizer": "torch-fused", "activation_checkpointing": ckpt,
        "compiled": False, "status": "ok",
    }  # fmt: skip
    return {**base, **values}


def test_checkpointing_quotes_the_measured_peaks_and_the_chosen_k(save, tmp_path):
    fixed = {"param_mib": 12996.0, "grad_mib": 12128.0, "state_mib": 25992.0}
    rows = [
        _step_row("ours", "none", status="OOM", pred_act_mib=49954.0),
        _step_row("ours", "segments:1", peak_mib=54549.8, act_mib=3433.9, step_ms=672.36,
                  pred_act_mib=4041.06, **fixed),
        _step_row("ours", "segments:2", peak_mib=55672.8, act_mib=2153.9, step_ms=679.96,
                  **fixed),
        _step_row("ours", "nested", peak_mib=54539.8, act_mib=1353.9, step_ms=804.41, **fixed),
    ]  # fmt: skip
    save("step_checkpointing_h100_2026-11-25", "step", rows, date="2026-11-25",
         notes=[_STUDY_NOTE])  # fmt: skip
    section = _section(build_report(tmp_path), "gradient_checkpointing")
    assert "`lmcore.memory_optimal_segment_size(32, b, A)` chooses k = 1" in section
    assert "no checkpointing: out of memory (predicted activations 49,954 MiB)" in section
    assert "segments of 1 block: peak 54,550 MiB" in section and "55,673 MiB" in section
    assert "segments of 2 blocks needs 1,123 MiB more" in section
    assert "nesting lowers the peak by 10 MiB at 1.20× the time" in section
    assert "(source: `step_checkpointing_h100_2026-11-25.json` at `" in section
    assert "Source: `step_checkpointing_h100_2026-11-25.json`" in section  # shown here, in full


def _leaderboard_results(save) -> None:
    lb = {"size": "leaderboard-8b", "size_label": "leaderboard-8b (4096/11008/19L/32H/V151936)",
          "num_layers": 19, "ctx": 32768, "batch": 1, "precision": "bf16", "loss": "fused",
          "activation_checkpointing": "blocks", "compiled": True, "status": "ok",
          "mfu_ceiling_tflops": 800.9}  # fmt: skip
    ours = {**lb, "impl": "ours", "attention": "fa2-triton", "optimizer": "torch-fused",
            "step_ms": 3067.0, "peak_mib": 45225.6, "state_mib": 19416.6, "fwd_ms": 904.7,
            "bwd_ms": 2128.0, "opt_ms": 36.04, "attn_ms": 1545.0, "attn_time_share": 0.5038,
            "attn_flop_share": 0.3634, "mfu": 0.5617}  # fmt: skip
    native = {**lb, "impl": "torch-native", "attention": "sdpa", "loss": "chunked",
              "optimizer": "torch-fused", "step_ms": 3274.0, "peak_mib": 42753.0,
              "state_mib": 19416.6}  # fmt: skip
    save("step_leaderboard_h100_2026-11-25", "step", [ours, native], date="2026-11-25")
    flash = [
        {"case": "d128", "impl": impl, "dtype": "bf16", "batch": 64, "seq": 32768, "d": 128,
         "fwd_ms": f, "bwd_ms": b, "fwd_bwd_ms": f + b, "status": "ok"}
        for impl, f, b in (("fa2-triton", 32.4, 116.1), ("sdpa-cudnn", 28.28, 77.69))
    ]  # fmt: skip
    save("flash_leaderboard_h100_2026-11-25", "flash", flash, date="2026-11-25")
    plan_rows = [
        {"precision": "bf16", "layout": layout, "loss": "fused", "optimizer": "lmcore",
         "ckpt_80gb": ckpt, "peak_80gb": peak, "ckpt_141gb": "blocks", "peak_141gb": 90.83,
         "sent_gb": 23.1, "comm_ms": 72.24, "compute_ms": 5392.2}
        for layout, ckpt, peak in (("fsdp", "blocks", 47.26), ("ddp", "does not fit", None))
    ]  # fmt: skip
    config = {"model": {"num_layers": 34, "context_length": 32768}, "batch": 2, "devices": 2,
              "bandwidth_gbps": 320.2, "tflops": 800.9}  # fmt: skip
    save("plan_leaderboard_2026-11-25", "plan_leaderboard", plan_rows, date="2026-11-25",
         config=config)  # fmt: skip


def test_a_whole_model_on_one_gpu_and_a_data_sheet_ceiling_are_said_so(save, tmp_path):
    whole = {"size": "leaderboard-8b", "size_label": "leaderboard-8b (4096/11008/34L/32H)",
             "num_layers": 34, "ctx": 32768, "batch": 1, "precision": "bf16", "loss": "fused",
             "activation_checkpointing": "blocks", "compiled": True, "status": "ok",
             "impl": "ours", "attention": "fa2-triton", "optimizer": "torch-fused",
             "step_ms": 6073.0, "mfu": 0.3948, "mfu_ceiling_tflops": 989.4}  # fmt: skip
    save("step_leaderboard_h200_2026-11-28", "step", [whole], date="2026-11-28",
         device_name="NVIDIA H200")  # fmt: skip
    section = _section(build_report(tmp_path), "leaderboard")
    assert "fits one NVIDIA H200 whole with its AdamW state, so bench-step ran all 34" in section
    assert "cut to" not in section
    assert "MFU: 39% of the data sheet's dense bf16 peak, 989 TFLOP/s" in section
    assert "measured bf16 matmul ceiling" not in section


def test_leaderboard_presents_the_one_gpu_step_and_the_prediction(save, tmp_path):
    _leaderboard_results(save)
    section = _section(build_report(tmp_path), "leaderboard")
    assert "cut to 19 of its 34 blocks (leaderboard-8b (4096/11008/19L/32H/V151936))" in section
    assert "with torch-fused AdamW 3,067 ms, 1.07× as fast as the torch-native step" in section
    assert "forward 905 ms, backward with its recomputation 2,128 ms, optimizer 36 ms" in section
    assert "MFU: 56% of the GPU's measured bf16 matmul ceiling, 801 TFLOP/s" in section
    assert "sdpa-cudnn is 1.40× as fast as fa2" in section
    assert "With 80 GB per GPU 1 of 2 forms fit: bf16 fsdp fused loss lmcore AdamW" in section
    assert "Not run: the leaderboard's own measurement" in section
    assert "two such GPUs were not available" in section
    for stem in ("step_leaderboard", "flash_leaderboard", "plan_leaderboard"):
        assert f"Source: `{stem}_" in section  # each shown in this section


def _full_rows(
    world: int, ours_ms: float, native_ms: float, peak: float, policy: str = "blocks"
) -> list[dict]:
    full = {"size": "leaderboard-8b", "num_layers": 34, "world_size": world, "ctx": 32768,
            "batch": 1, "precision": "bf16", "activation_checkpointing": policy,
            "compiled": True, "status": "ok"}  # fmt: skip
    return [
        {**full, "impl": "ours", "layout": "fsdp", "attention": "fa2-triton", "loss": "fused",
         "optimizer": "lmcore-fused", "step_ms": ours_ms, "first_step_ms": 19963.0,
         "peak_mib": peak, "time_vs_native": ours_ms / native_ms, "peak_vs_native": 0.7086,
         "tokens_per_s": world * 32768 / ours_ms * 1e3},
        {**full, "impl": "torch-native", "layout": "fsdp:torch", "attention": "sdpa",
         "loss": "chunked", "optimizer": "torch-fused", "step_ms": native_ms,
         "first_step_ms": 14195.0, "peak_mib": 57372.9},
    ]  # fmt: skip


def test_leaderboard_puts_a_committed_full_step_first_and_keeps_the_one_gpu_step(save, tmp_path):
    _leaderboard_results(save)
    save("step_leaderboard_2xh100_2026-11-28", "step", _full_rows(2, 6206.0, 5801.0, 40656.5),
         date="2026-11-28")  # fmt: skip
    section = _section(build_report(tmp_path), "leaderboard")
    assert "The leaderboard's own step, measured: all 34 blocks, batch 2 over 2 " in section
    assert "zero.FSDP (the blocks, the embedding and the LM head as units): 6,206 ms" in section
    assert "1.07× the torch-native step's time (slower than it) and 0.71× its peak" in section
    assert "on torch's FSDP2: 5,801 ms a step (first step 14,195 ms)" in section
    assert "Not run: the leaderboard's own measurement" not in section
    assert "cut to 19 of its 34 blocks" in section  # the one-GPU step, from its own file
    assert section.index("own step, measured") < section.index("cut to 19 of its 34")


def test_the_full_step_on_more_gpus_follows_the_handouts_and_says_how_it_scaled(save, tmp_path):
    save("step_leaderboard_4xh100_2026-11-28", "step", _full_rows(4, 5000.0, 5900.0, 28527.4),
         date="2026-11-28")  # fmt: skip
    save("step_leaderboard_2xh100_2026-11-28", "step", _full_rows(2, 6206.0, 5801.0, 40656.5),
         date="2026-11-28")  # fmt: skip
    section = _section(build_report(tmp_path), "leaderboard")
    two, four = section.index("batch 2 over 2"), section.index("batch 4 over 4")
    assert two < four and "The full step on more GPUs" in section
    assert "(faster than it)" in section[four:] and "(slower than it)" in section[two:four]
    assert "our fastest step falls (6,206 to 5,000 ms) and its peak falls" in section
    assert "tokens per second grow 2.48× for 2× the GPUs (124% scaling efficiency)" in section


def test_a_step_with_capped_allocators_is_a_stand_in_said_apart(save, tmp_path):
    """A run whose ranks' allocators `--memory` capped (a stand-in for smaller GPUs) never
    replaces the whole GPUs' newest run, and is said in a paragraph of its own, its rows that
    ran out of memory included."""
    save("step_leaderboard_2xh100_2026-11-28", "step", _full_rows(2, 6206.0, 5801.0, 40656.5),
         date="2026-11-28")  # fmt: skip
    capped = _full_rows(2, 5467.0, 5096.0, 48632.0)
    capped.insert(1, {**capped[0], "layout": "zero1", "status": "OOM", "step_ms": None,
                      "peak_mib": None, "time_vs_native": None})  # fmt: skip
    save("step_leaderboard_2xh100_2026-11-29_cap80gb", "step", capped, date="2026-11-29",
         config={"memory_bytes": 80 * 10**9})  # fmt: skip
    section = _section(build_report(tmp_path), "leaderboard")
    assert "zero.FSDP (the blocks, the embedding and the LM head as units): 6,206 ms" in section
    stand_in = section[section.index("allocator capped at 80 GB") :]
    assert "5,467 ms, peak 48,632 MiB (1.07× the torch-native step's time)" in stand_in
    assert "ZeRO-1 (ddp.DDPBucketed + zero.ShardedOptimizer): out of memory" in stand_in
    assert "torch's FSDP2: 5,096 ms" in stand_in


def test_each_checkpointing_of_a_full_step_has_its_own_paragraph_the_presets_first(save, tmp_path):
    rows = _full_rows(2, 6318.0, 5898.0, 40656.0) + _full_rows(
        2, 5572.0, 5206.0, 49281.0, policy="selective"
    )
    save("step_leaderboard_2xh100_2026-11-28", "step", rows, date="2026-11-28")
    # a newer run of one policy replaces that policy's rows only
    newer = _full_rows(2, 6209.0, 5783.0, 40656.0)
    save("step_leaderboard_2xh100_2026-11-28_again", "step", newer, date="2026-11-29")
    section = _section(build_report(tmp_path), "leaderboard")
    selective = section.index("The leaderboard's own step, measured")
    blocks = section.index("The same step on the same 2 GPUs with blocks checkpointing")
    assert selective < blocks
    assert "selective checkpointing (every block recomputed in backward but for its" in section
    assert "; the leaderboard itself runs on two B200s" in section[:blocks]
    assert "5,572 ms a step" in section[:blocks] and "5,206 ms a step" in section[:blocks]
    assert "6,209 ms a step" in section[blocks:] and "6,318" not in section


def test_a_torch_native_peak_that_moved_between_runs_is_said(save, tmp_path):
    earlier = _full_rows(2, 6206.0, 5801.0, 40656.0)
    save("step_leaderboard_2xh100_2026-11-28", "step", earlier, date="2026-11-28")
    later = _full_rows(2, 6318.0, 5898.0, 40656.0)
    later[1]["peak_mib"] = 41860.0
    save("step_leaderboard_2xh100_2026-11-28_again", "step", later, date="2026-11-28")
    section = _section(build_report(tmp_path), "leaderboard")
    assert (
        "an earlier run measured 57,373 MiB where this one measured 41,860 MiB, while ours on "
        "zero.FSDP measured 40,656 and 40,656 MiB" in section
    )
    # within 5 %: nothing said
    later[1]["peak_mib"] = 57000.0
    save("step_leaderboard_2xh100_2026-11-28_again", "step", later, date="2026-11-28")
    assert "not the same from run to run" not in _section(build_report(tmp_path), "leaderboard")


def test_one_gpu_rows_of_two_checkpointings_each_get_their_ratio(save, tmp_path):
    whole = {"size": "leaderboard-8b", "size_label": "leaderboard-8b (4096/11008/34L/32H)",
             "num_layers": 34, "ctx": 32768, "batch": 1, "precision": "bf16",
             "compiled": True, "status": "ok", "optimizer": "lmcore-fused",
             "state_mib": 30997.0, "fwd_ms": 1472.0, "bwd_ms": 3802.0, "opt_ms": 46.3,
             "mfu": 0.45, "mfu_ceiling_tflops": 989.4}  # fmt: skip
    native = {"impl": "torch-native", "attention": "sdpa", "loss": "chunked",
              "optimizer": "torch-fused"}  # fmt: skip
    rows = [
        {**whole, "impl": "ours", "attention": "fa2-triton", "loss": "fused",
         "activation_checkpointing": policy, "step_ms": ours_ms, "peak_mib": 65923.0}
        for policy, ours_ms in (("blocks", 6061.0), ("selective", 5320.0))
    ] + [
        {**whole, **native, "activation_checkpointing": policy, "step_ms": ms,
         "peak_mib": 65914.0}
        for policy, ms in (("blocks", 5669.0), ("selective", 5014.0))
    ]  # fmt: skip
    save("step_leaderboard_h200_2026-11-28", "step", rows, date="2026-11-28",
         device_name="NVIDIA H200")  # fmt: skip
    section = _section(build_report(tmp_path), "leaderboard")
    assert "fused loss, blocks and selective checkpointing, compiled) with lmcore-fused" in section
    assert "With blocks checkpointing: the ratio to the torch-native step, which takes 5,669" in (
        section
    )
    assert "With selective checkpointing (every block recomputed in backward but for its" in section
    assert "which takes 5,014 ms" in section and "5,320 ms, 0.94× as fast" in section
    assert "Where the time goes (ours, selective checkpointing, lmcore-fused AdamW)" in section


def test_memory_without_timelines_says_so_and_shows_an_earlier_runs(save, tmp_path):
    def rows(size, ctx):
        return [
            {**_model_row(size, XL, ctx, mode, 86.3), "peak_mib": 13236.7 if mode == "forward"
             else 65687.0}
            for mode in ("forward", "train-step")
        ]  # fmt: skip

    command = "bench-model --memory-snapshot x.pickle"
    save("memory_fp32_h100_2026-11-23", "model", rows("2.7B", 128), date="2026-11-23",
         command=command)  # fmt: skip
    for mode in ("forward", "train-step"):
        name = f"memory_fp32_h100_2026-11-23_snapshot_2.7B_ctx128_{mode}_fp32_naive.png"
        (tmp_path / name).write_bytes(b"\x89PNG")
    save("memory_fp32_h100_2026-11-25", "model", rows("xl", 128), date="2026-11-25",
         command=command)  # fmt: skip
    out = tmp_path / "REPORT.md"
    section = _section(build_report(tmp_path, output=out), "memory_profiling")
    assert "(a) Not run with timelines" in section and MEMORY_TIMELINES.command in section
    assert "recorded as 2.7B (2560/10240/32L/32H)" in section
    assert "(memory_fp32_h100_2026-11-23_snapshot_2.7B_ctx128_forward_fp32_naive.png)" in section
    assert "| xl (2560/10240/32L/32H) | 128   | fp32    | 13,237" in section


def test_a_bench_train_text_record_is_read(tmp_path, base_env):
    summary = {
        "final_train_loss": 1.0803, "final_val_loss": 1.5523, "steps": 500,
        "tokens_per_s": 310975.3, "mfu": 0.2228, "first_step_s": 57.6, "parameters": 113658624,
        "env": {**base_env, "command": "bench-train --size small"},
        "config": {"data": "text.txt", "size": "small", "context_length": 256,
                   "batch_size": 32, "precision": "bf16", "attention": "fa2-triton",
                   "tokenizer": "bytes"},
    }  # fmt: skip
    metrics = [{"step": 50, "loss": 2.3, "val_loss": 2.28}, {"step": 450, "val_loss": 1.5502}]
    path = tmp_path / "train_text_cpu_2026-11-25.json"
    path.write_text(json.dumps({"summary": summary, "metrics": metrics}))
    res = Results.collect(tmp_path)
    assert res.skipped == []
    (record,) = res.records
    assert record.run.rows[0]["best_val_step"] == 450
    text = build_report(tmp_path)
    assert "bench-train on text.txt: small (768/3072/12L/12H), context 256" in text


def test_every_link_in_the_committed_report_exists():
    report = ROOT / "docs" / "results" / "REPORT.md"
    links = [link for link in report_links(report.read_text()) if "://" not in link]
    assert links
    assert [link for link in links if not (report.parent / link).exists()] == []


def test_the_missing_runs_are_the_commands_the_gpu_script_runs():
    script = (ROOT / SCRIPT).read_text().replace("\\\n", " ")
    runs = [*PROFILES, MEMORY_TIMELINES, COMPILE_MODEL, FLASH_NAIVE]
    for run in runs:
        body = script.split(f"\n{run.part}() {{")[1].split("\n}")[0]
        tool, *options = shlex.split(run.command)
        assert f"-m bench {tool.removeprefix('bench-')}" in body, run.part
        # every option but those naming a path (named per run: `<device>_<date>`)
        kept = [
            o
            for o, after in zip(options, [*options[1:], ""], strict=True)
            if "<" not in o and "<" not in after
        ]
        missing = [o for o in kept if o not in body.split()]
        assert missing == [], (run.part, missing)
    assert CHECKPOINTING_STUDY.command.startswith("bench-step --study checkpointing")


def test_a_memory_run_is_told_by_its_rows_study_and_an_old_one_by_its_command(save, tmp_path):
    """bench-model's rows say what the run was for; results from before read their command."""
    dims = {"d_model": 64, "d_ff": 256, "num_layers": 2, "num_heads": 4}
    row = _model_row("tiny", dims, 128, "forward", 1.0)
    save("memory_fp32_h100_2026-11-28", "model", [{**row, "study": "memory"}], date="2026-11-28",
         command="bench-model --size tiny")  # fmt: skip
    save("memory_bf16_h100_2026-11-28", "model", [row], date="2026-11-28",
         command="bench-model --size tiny --memory-snapshot m.pickle")  # fmt: skip
    save("model_h100_2026-11-28", "model", [row], date="2026-11-28", command="bench-model")
    records = {r.path.stem: r for r in Results.collect(tmp_path).records}
    memory = {stem for stem, r in records.items() if is_memory(r)}
    assert memory == {"memory_fp32_h100_2026-11-28", "memory_bf16_h100_2026-11-28"}


def test_a_hand_written_record_never_shows_an_empty_command(tmp_path, base_env):
    env = {**base_env, "device_type": "cuda", "device_name": "NVIDIA H100 80GB HBM3"}
    tests = {"meta": {}, "env": env, "rows": [{"command": "pytest -m gpu packages/fa2"}]}
    scripts = {"meta": {"scripts": {"tma.py": "...", "regs.py": "..."}}, "env": env}
    bare = {"meta": {}, "env": env}
    for name, data in (("gpu_tests", tests), ("fa2_tma", scripts), ("other_note", bare)):
        (tmp_path / f"{name}_h100_2026-11-23.json").write_text(json.dumps(data))
    text = build_report(tmp_path)
    assert "Command: ``" not in text
    assert "Command: `pytest -m gpu packages/fa2`" in text
    assert "Command: `python3 tma.py; python3 regs.py (the scripts are in the file's meta)`" in text
    assert "Command: not recorded" in text


def test_a_script_record_with_its_machine_at_the_top_level_names_it(tmp_path):
    """A script that keeps the machine beside its rows (`device`, `torch`, `git_revision`) and
    the environment variables it ran under in `env` is read by the former."""
    data = {"tool": "ddp_overlap", "device": "NVIDIA H200 x2", "torch": "2.11.0",
            "git_revision": "9c0bde1c09629e7462c1ead823b7987d23c5376e", "git_dirty": True,
            "git_revision_note": "the tree run was 389af01", "date": "2026-11-28T11:55:22+00:00",
            "command": "python3 ddp_overlap.py", "env": {"NCCL_NVLS_ENABLE": "0"},
            "rows": [{"case": "single", "step_ms": 351.0}]}  # fmt: skip
    (tmp_path / "ddp_overlap_2xh200_2026-11-28").mkdir()
    (tmp_path / "ddp_overlap_2xh200_2026-11-28" / "ddp_overlap.json").write_text(json.dumps(data))
    text = build_report(tmp_path)
    assert "Device: NVIDIA H200; torch 2.11.0; 2026-11-28T11:55:22+00:00" in text
    assert "Code: `9c0bde1c0962` (the tree run was 389af01) (uncommitted changes)" in text
    assert "on None" not in text


def _plan_row(size: str, layout: str, peak_gib: float) -> dict:
    return {"table": "Predictions (GiB per device at its peak)", "size": size, "ctx": 128,
            "batch": 8, "precision": "fp32", "layout": layout, "mesh": "dp2",
            "optimizer": "torch", "peak_gib": peak_gib}  # fmt: skip


def test_fsdp_accounting_predicts_the_saving_and_checks_the_model_on_section_6(save, tmp_path):
    size = "xl-2025 (1600/6400/48L/25H)"
    rows = [_plan_row(size, "ddp:torch", 44.66), _plan_row(size, "zero1:torch-ddp", 33.55)]
    rows.append(_plan_row(size, "fsdp", 18.61))
    save("plan_fsdp_2026-11-28", "plan", rows, date="2026-11-28")
    zero = {"variant": "zero1:torch-ddp", "after_step_mib": 34937.8, "status": "ok"}
    save("zero_2xh200_2026-11-22", "zero", [zero], date="2026-11-22",
         config={"shape": {"name": "xl", **XL_2025}, "world_size": 2})  # fmt: skip
    text = _section(build_report(tmp_path), "fsdp_accounting")
    assert "fsdp 19,057 MiB: FSDP saves 15,299 MiB (45%) of ZeRO-1's peak" in text
    assert "within zero1:torch-ddp -1.7%" in text
    assert "(b) Not run: the command (on two GPUs of one node) runs `bench-zero" in text


def test_the_2025_appendix_sweeps_buckets_and_sets_the_equation_beside_them(save, tmp_path):
    def bucketed(mb: float, step: float, over: float, calls: int) -> dict:
        case = {"case": f"bucketed {mb:g} MB", "variant": "ddp", "bucket_mb": mb}
        return {**case, "step_ms": step, "overhead_ms": over, "collectives": calls, "status": "ok"}

    rows = [bucketed(1, 262.5, 26.0, 435), bucketed(100, 246.0, 9.5, 98)]
    rows.append(bucketed(1000, 246.6, 10.1, 8))
    config = {"shape": {"name": "xl", **XL_2025}, "context_length": 128, "batch": 4}
    save("ddp_2xh200_2026-11-22", "ddp", rows, date="2026-11-22", config=config)
    link = [
        {"backend": "nccl", "world_size": 2, "size_mb": mb, "ms": ms, "algbw_gbps": bw,
         "status": "ok"}
        for mb, ms, bw in ((1.0, 0.0804, 12.4), (1000.0, 3.123, 320.2))
    ]  # fmt: skip
    save("allreduce_2xh200_2026-11-22", "allreduce", link, date="2026-11-22")
    text = build_report(tmp_path)
    assert "## Appendix: the 2025 handout's problems that 2026 dropped" in text
    sweep = _section(text, "ddp_bucketed_benchmarking (a)")
    assert "2 ranks) is shortest at 100 MB buckets, 246 ms; 1,000 MB is within 5% of it" in sweep
    equation = _section(text, "ddp_bucketed_benchmarking (b)")
    assert "overhead(n_b) = n_b·o + s/(n_b·w)" in equation
    assert "the optimum is b* = 445 MB" in equation and "one of the two swept sizes" in equation
    xxl = _section(text, "communication_accounting")
    assert "219,848,638,464" in xxl and "N_FSDP ≥ 38" in xxl and "319.4 tokens" in xxl


def test_the_leaderboard_plan_check_names_each_row_by_side_and_layout():
    from bench.report.leaderboard import _checked_row

    ours = (
        "leaderboard-8b (4096/11008/34L/32H), ours, 4096/11008/34L/32H V=151,936, batch 2 × "
        "32,768, bf16, ZERO1 2, fa2-triton compiled, checkpointing blocks, fused loss"
    )
    native = ours.replace("ours", "torch-native").replace("ZERO1 2", "FSDP:TORCH 4")
    single = ours.replace("ZERO1 2", "1 device")
    assert _checked_row(ours) == "ours (ZERO1 2)"
    assert _checked_row(native) == "torch-native (FSDP:TORCH 4)"
    assert _checked_row(single) == "ours (1 device)"


def test_a_profiled_step_is_split_by_kernel_category_beside_torch_natives(save, tmp_path):
    def rows(label: str, kernel_ms: float, **ms: float) -> list[dict]:
        phase = {"row": label, "rank": 0, "phase": "all", "kind": "phase", "category": None,
                 "kernel_ms": kernel_ms, "wall_ms": kernel_ms + 10}  # fmt: skip
        forward = {**phase, "phase": "forward", "kernel_ms": kernel_ms / 3}  # not the step's
        return [phase, forward] + [
            {
                "row": label,
                "rank": 0,
                "phase": "all",
                "kind": "category",
                "category": cat,
                "total_ms": t,
                "kernels": 3,
            }
            for cat, t in ms.items()
        ]

    ours = rows("ours_single", 5144.0, matmul=2505.0, attention=2382.0, optimizer=44.55)
    native = rows("torch-native_single", 5025.0, matmul=2628.0, attention=2111.0, other=17.5)
    save("step_profile_h200_2026-11-28", "step-profile", ours + native, date="2026-11-28",
         device_name="NVIDIA H200")  # fmt: skip
    section = _section(build_report(tmp_path), "leaderboard")
    assert (
        "ours (ours_single) runs 5,144 ms of kernels in its step against the torch-native step's "
        "5,025 ms; by category, matmul 2,505 against 2,628 ms, attention 2,382 against 2,111 ms"
    ) in section
    assert "optimizer 44.5 against 0 ms, other 0 against 17.5 ms" in section


def test_fa2_gpu_tests_are_counted_over_every_run_at_the_newest_revision(tmp_path, save):
    """fa2's GPU suite runs in parts; the report adds up the parts run on the newest tree and
    leaves out an older tree's runs."""
    runs = [("a", "older", 300, 1, "2026-11-28T01"), ("b", "newer", 242, 0, "2026-11-29T01"),
            ("c", "newer", 45, 0, "2026-11-29T02")]  # fmt: skip
    for part, revision, passed, failed, date in runs:
        row = {"command": f"python3 -m pytest -m gpu packages/fa2 -k {part}",
               "revision": revision, "passed": passed, "failed": failed}  # fmt: skip
        save(f"gpu_tests_fa2_h200_{date[:10]}_{part}", "gpu_tests", [row], date=f"{date}:00:00")
    text = build_report(tmp_path)
    assert "last passed 287 of 287 at `newer`, in 2 runs." in text
