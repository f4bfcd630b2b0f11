"""bench-step: a row of ours with the torch-native row beside it, FSDP on 2 gloo ranks, the
checkpointing study, `--num-layers fit`, the preset's refusal, bench-plan's check of the rows,
out of memory as a row, and bad input."""

from __future__ import annotations

import dataclasses
import gzip
import json
import os

import pytest
import torch

import bench.tools.step.full_step
import lmcore
from bench.commands.step import COMMAND, PRESETS, depth_reduced_argv, main
from bench.core.memory import MIB
from bench.core.oom import OK, OOM
from bench.core.results import load_json, save_json
from bench.plan.check import STEP_KEYS, check_results
from bench.plan.memory import TrainingPlan, estimate_memory
from bench.tools.step import (
    COLUMNS,
    KEYS,
    TOOL,
    StepConfig,
    _attention_ms,
    fit_depth,
    plot_step,
    run_step,
    step_specs,
)
from bench.tools.step.profile import (
    STEP_PROFILE_KEYS,
    breakdown_rows,
    kernel_parity,
    phase_summary,
)

# One narrow block at context 16, vocabulary 97, fp32: milliseconds a step on one CPU thread.
TINY = {
    "size": "tiny",
    "num_layers": 1,
    "context_length": 16,
    "batch": 2,
    "vocab_size": 97,
    "precision": "fp32",
    "attention": ("sdpa",),
    "loss": ("fused",),
    "optimizer": ("lmcore",),
    "activation_checkpointing": ("blocks",),
    "compile": False,
    "warmup_ms": 1.0,
    "rep_ms": 2.0,
}


def _config(**overrides) -> StepConfig:
    return StepConfig(**{**TINY, **overrides})


def _params(num_layers: int = 1) -> int:
    model = lmcore.model_config("tiny", context_length=16, vocab_size=97)
    return lmcore.count_parameters(dataclasses.replace(model, num_layers=num_layers))


@pytest.fixture(scope="module")
def step_run():
    """Ours (fused loss, lmcore's AdamW, every block checkpointed) and the torch-native row."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return run_step(_config(), device="cpu", command="bench-step --test")
    finally:
        torch.set_num_threads(before)


def test_a_row_of_ours_with_the_torch_native_row_beside_it(step_run):
    ours, native = step_run.rows
    assert (ours["impl"], native["impl"]) == ("ours", "torch-native")
    assert (native["attention"], native["loss"], native["optimizer"]) == (
        "sdpa",
        "chunked",
        "torch-fused",
    )
    assert native["activation_checkpointing"] == ours["activation_checkpointing"] == "blocks"
    for row in step_run.rows:
        assert row["status"] == OK and row["n"] >= 1 and set(COLUMNS) <= set(row)
        assert set(row) <= set(KEYS)
        assert all(row[k] is not None for k in STEP_KEYS if k != "peak_mib")  # CPU: no peak
        assert row["step_ms"] > 0 and row["first_step_ms"] > 0
        assert row["fwd_ms"] > 0 and row["bwd_ms"] > 0 and row["opt_ms"] > 0
        assert row["tokens_per_s"] == pytest.approx(2 * 16 / (row["step_ms"] * 1e-3))
        # fp32: the parameters, their gradients, two moments (and a 4-byte step count each)
        assert row["param_mib"] * MIB == row["grad_mib"] * MIB == 4 * _params()
        assert 8 * _params() < row["state_mib"] * MIB < 8 * _params() + 4 * 64
        assert row["mfu"] is None and row["peak_mib"] is None and row["act_mib"] is None
        assert 0 < row["attn_flop_share"] < 1
    assert ours["time_vs_native"] == pytest.approx(ours["step_ms"] / native["step_ms"])
    assert native["time_vs_native"] is None


def test_the_plot_and_the_table(step_run, tmp_path):
    path = plot_step(step_run, tmp_path / "step.png")
    assert path.stat().st_size > 0
    text = step_run.to_markdown()
    assert "torch-native" in text
    assert "Full training step: tiny (64/256/1L/4H/V97), context 16" in text
    printed = step_run.to_markdown(wide=False).splitlines()
    table = [line for line in printed if line.startswith("|")]
    assert "vs_native" in table[0] and "peak_mib" in table[0] and max(map(len, table)) <= 120


def test_the_rows_sit_beside_bench_plans_prediction(step_run, tmp_path):
    """Every row carries what `bench-plan --check` reads: with a peak (a GPU's; set by hand
    here, in the optimizer step, where every gradient is alive and grad_mib counts them all)
    each gets a prediction, and the tensors' sizes agree with it."""
    rows = [dict(r, peak_mib=1.0, peak_phase="optimizer") for r in step_run.rows]
    save_json(dataclasses.replace(step_run, rows=rows), tmp_path / "step.json")
    checked = check_results(tmp_path).rows
    for impl in ("ours", "torch-native"):
        mine = [r for r in checked if r["predicted_mib"] is not None and impl in r["config"]]
        assert {r["quantity"] for r in mine} == {"peak", "param", "grad", "state"}, impl
        for r in mine:
            if r["quantity"] in ("param", "grad"):
                assert abs(r["error_pct"]) < 0.01, r


def test_each_option_reaches_the_rows_model(monkeypatch):
    """The loss, optimizer and checkpointing of each row reach the model its step builds."""
    import lmcore.linear

    rows: list[dict] = []
    build, optimizer = bench.tools.step.full_step._build, bench.tools.step.full_step.optimizer_class
    apply, fused = lmcore.apply_activation_checkpointing, lmcore.linear.fused_linear_cross_entropy

    def spy_build(spec, rank, device):
        rows.append({"spec": spec, "fused": 0})
        return build(spec, rank, device)

    def spy_apply(model, *, policy):
        rows[-1]["policy"] = policy
        return apply(model, policy=policy)

    def spy_optimizer(name, **options):
        rows[-1]["optimizer"] = name
        return optimizer(name, **options)

    def spy_fused(*args, **kwargs):
        rows[-1]["fused"] += 1
        return fused(*args, **kwargs)

    monkeypatch.setattr(bench.tools.step.full_step, "_build", spy_build)
    monkeypatch.setattr(bench.tools.step.full_step, "optimizer_class", spy_optimizer)
    monkeypatch.setattr(lmcore, "apply_activation_checkpointing", spy_apply)
    monkeypatch.setattr(lmcore.linear, "fused_linear_cross_entropy", spy_fused)
    config = _config(
        loss=("materialized", "fused"),
        optimizer=("lmcore", "torch-fused"),
        activation_checkpointing=("segments:1",),
    )
    run = run_step(config, device="cpu")
    assert len(rows) == len(run.rows) == 5 and all(r["status"] == OK for r in run.rows)
    for seen, row in zip(rows, run.rows, strict=True):
        assert seen["spec"].impl == row["impl"]
        assert seen["policy"] == row["activation_checkpointing"] == "segments:1"
        assert seen["optimizer"] == row["optimizer"]
        assert (seen["fused"] > 0) == (row["loss"] == "fused")


def test_selective_rows_run_and_count_no_recomputed_attention():
    """`selective` rows of ours and torch-native train; their attention time holds each block's
    forward and backward only, where `blocks` adds the recomputed forward."""
    config = _config(activation_checkpointing=("blocks", "selective"))
    run = run_step(config, device="cpu")
    assert [(r["impl"], r["activation_checkpointing"], r["status"]) for r in run.rows] == [
        ("ours", "blocks", OK), ("torch-native", "blocks", OK),
        ("ours", "selective", OK), ("torch-native", "selective", OK),
    ]  # fmt: skip
    fwd, both = 1.0, 3.0  # ms of one block's attention: forward, forward + backward
    per_rank = [{"attention": (fwd, both)}]
    spent = {s.activation_checkpointing: _attention_ms(s, per_rank) for s in step_specs(config)}
    assert spent == {"blocks": both + fwd, "selective": both}


@pytest.mark.parametrize(("compile", "launches"), [(True, 3), (False, 1)])
def test_compiled_rows_each_start_cold(monkeypatch, compile, launches):
    """Compiled, each row gets processes and compiler cache folders of its own (its first step
    pays its own compilation); otherwise the rows share one launch."""
    import bench.tools.step as step_tool

    calls = []

    def fake(measure, cases, config, **kwargs):
        calls.append((len(cases), os.environ.get("TORCHINDUCTOR_CACHE_DIR")))
        return [(case, [{}]) for case in cases]

    monkeypatch.setattr(step_tool, "measure_cases", fake)
    config = _config(nproc=2, parallel=("fsdp", "zero1"), compile=compile)
    specs = step_specs(config)
    assert len(specs) == 3
    measured = step_tool._measure_rows(specs, config, torch.device("cpu"), None)
    assert [spec for spec, _ in measured] == specs
    assert len(calls) == launches
    if compile:
        assert [n for n, _ in calls] == [1, 1, 1]
        folders = [folder for _, folder in calls]
        assert None not in folders and len(set(folders)) == 3


def test_fsdp_and_zero1_in_bf16_compiled_on_two_gloo_ranks():
    """The leaderboard preset's rows of ours at a tiny size: on zero.FSDP (bf16 shards, each
    unit compiled), then on ZeRO-1 (each block compiled), in bf16 with AdamW's moments in bf16;
    aot_eager traces what inductor would compile, without its kernels."""
    config = _config(
        nproc=2, parallel=("fsdp", "zero1"), num_layers=2, batch=1, precision="bf16",
        compile=True, compile_backend="aot_eager", native=False,
    )  # fmt: skip
    run = run_step(config, device="cpu", command="bench-step --test")
    assert [(r["impl"], r["layout"], r["world_size"], r["status"]) for r in run.rows] == [
        ("ours", "fsdp", 2, OK),
        ("ours", "zero1", 2, OK),
    ]
    fsdp, zero1 = run.rows
    full = 2 * _params(num_layers=2)  # bf16
    assert zero1["param_mib"] * MIB == full
    # each rank holds about half of every weight (norm gains whole) and two bf16 moments of it
    assert 0.45 * full < fsdp["param_mib"] * MIB < 0.6 * full
    assert 2 * fsdp["param_mib"] <= fsdp["state_mib"] < 2 * fsdp["param_mib"] + 64 / MIB * 32
    assert (fsdp["fsdp_units"], zero1["fsdp_units"]) == (
        ["TransformerBlock", "Embedding", "LMHead"], []
    )  # fmt: skip
    for row in run.rows:
        assert (row["precision"], row["moment_dtype"]) == ("bf16", "bf16")
        assert (row["compiled"], row["compile_backend"]) == (True, "aot_eager")
    assert "fsdp: zero.apply_fsdp" in " ".join(run.notes)


def test_fsdp_on_two_gloo_ranks_beside_torch_fsdp2_in_fp16():
    # fp16: both steps scale the loss, and each rank's scaler unscales its shards of the
    # gradients and agrees with the other rank on skipping (bench.core.loss_scale)
    run = run_step(
        _config(nproc=2, parallel=("fsdp",), num_layers=2, batch=1, precision="fp16"),
        device="cpu",
        command="bench-step --test",
    )
    ours = run.rows[0]
    assert [(r["impl"], r["layout"], r["world_size"], r["status"]) for r in run.rows] == [
        ("ours", "fsdp", 2, OK),
        ("torch-native", "fsdp:torch", 2, OK),
    ]
    full = 4 * _params(num_layers=2)
    for row in run.rows:  # each rank holds about half of every weight (norm gains whole)
        assert 0.45 * full < row["param_mib"] * MIB < 0.6 * full
    assert ours["time_vs_native"] > 0
    assert "torch FSDP2" in " ".join(run.notes)


def _profiled_phases(trace):
    """The phase ranges (on the host) of a gzipped Chrome trace."""
    events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    phases = ("forward", "backward", "optimizer")
    return [e["name"] for e in events if e.get("cat") == "user_annotation" and e["name"] in phases]


def _check_profile(folder, config, ranks):
    """Every row and rank of `config` profiled once in `folder`, each phase's categories adding
    up to its kernel time; the profile's rows by (row, rank, phase)."""
    profile = load_json(folder / f"{folder.name}.json")
    assert profile.tool == "step-profile" and (folder / f"{folder.name}.md").is_file()
    labels = [spec.label for spec in step_specs(config)]
    assert {r["row"] for r in profile.rows} == set(labels)
    found = {}
    for label in labels:
        for rank in range(ranks):
            name = f"{label}_rank{rank}"
            assert _profiled_phases(folder / f"{name}.pt.trace.json.gz") == [
                "forward", "backward", "optimizer",
            ]  # one step: the timed ones ran without the profiler  # fmt: skip
            assert (folder / f"{name}_kernels.md").read_text().startswith(f"# {name}")
            for phase in ("forward", "backward", "optimizer", "all"):
                mine = [r for r in profile.rows if (r["row"], r["rank"], r["phase"]) ==
                        (label, rank, phase)]  # fmt: skip
                (summary,) = [r for r in mine if r["kind"] == "phase"]
                assert summary["wall_ms"] > 0
                categories = {r["category"]: r for r in mine if r["kind"] == "category"}
                assert sum(r["share"] for r in categories.values()) == pytest.approx(1.0)
                assert all(r["kernels"] >= 1 and r["total_ms"] > 0 for r in categories.values())
                assert all(set(r) <= set(STEP_PROFILE_KEYS) for r in mine)
                found[label, rank, phase] = categories
    return found


def test_profile_on_two_gloo_ranks_splits_each_rows_phases_by_category(tmp_path):
    """--profile: after each row's timed steps, one more step on each rank under the profiler,
    a trace and a kernel table per row and rank, and the categories of each phase."""
    folder = tmp_path / "step_profile"
    config = _config(nproc=2, parallel=("fsdp",), num_layers=2, batch=1, profile_dir=str(folder))
    run = run_step(config, device="cpu", command="bench-step --test")
    assert [r["status"] for r in run.rows] == [OK, OK]
    found = _check_profile(folder, config, ranks=2)
    ours = step_specs(config)[0].label
    for rank in (0, 1):
        # FSDP gathers the weights in the forward (gloo's collectives), the matmuls and SDPA run
        assert {"matmul", "attention", "communication"} <= set(found[ours, rank, "forward"])
        assert set(found[ours, rank, "optimizer"]) <= {"optimizer", "communication"}
    assert "--profile" in " ".join(run.notes)


def test_profile_of_a_single_rank_run(tmp_path):
    folder = tmp_path / "one"
    config = _config(native=False, profile_dir=str(folder))
    run = run_step(config, device="cpu", command="bench-step --test")
    assert run.rows[0]["status"] == OK
    found = _check_profile(folder, config, ranks=1)
    label = step_specs(config)[0].label
    assert "communication" not in found[label, 0, "all"]
    assert set(found[label, 0, "optimizer"]) == {"optimizer"}


def test_profile_rows_split_each_phase_on_the_device():
    """On CUDA each phase's wall time is split by its kernels' device-side intervals (µs)."""
    categories = [
        {"kind": "category", "phase": "forward", "category": "matmul", "calls": 2,
         "total_ms": 0.5, "share": 0.8},
        {"kind": "category", "phase": "forward", "category": "communication", "calls": 1,
         "total_ms": 0.125, "share": 0.2},
        {"kind": "kernel", "phase": "forward", "category": "matmul", "calls": 2,
         "total_ms": 0.5, "share": 0.8},
        {"kind": "category", "phase": "backward", "category": "matmul", "calls": 1,
         "total_ms": 0.125, "share": 1.0},
        # profile_rows' whole profile: the barrier before the step too, not the step's
        {"kind": "category", "phase": "all", "category": "other", "calls": 90,
         "total_ms": 9.0, "share": 1.0},
    ]  # fmt: skip
    kernels = [
        ("nvjet_tst_128x256", 0, 300), ("nvjet_tst_128x256", 400, 600),
        ("ncclDevKernel_AllGather_RING_LL", 250, 375), ("nvjet_tst_128x256", 1100, 1200),
    ]  # fmt: skip
    windows = {"forward": (0, 1000), "backward": (1000, 1500), "all": (0, 1500)}
    rows = breakdown_rows(categories, kernels, windows, row="r", rank=1, on_cuda=True)
    assert [(r["phase"], r["kind"], r["category"]) for r in rows] == [
        ("forward", "phase", None), ("forward", "category", "matmul"),
        ("forward", "category", "communication"), ("backward", "phase", None),
        ("backward", "category", "matmul"), ("all", "phase", None),
        ("all", "category", "matmul"), ("all", "category", "communication"),
    ]  # fmt: skip
    forward = rows[0]
    assert forward["wall_ms"] == 1.0 and forward["kernel_ms"] == pytest.approx(0.5)
    assert forward["comm_ms"] == pytest.approx(0.125)
    assert forward["exposed_comm_ms"] == pytest.approx(0.075)  # 300-375 beside no compute
    assert forward["idle_ms"] == pytest.approx(1.0 - 0.375 - 0.2)
    assert rows[3]["busy_ms"] == pytest.approx(0.1) and rows[5]["busy_ms"] == pytest.approx(0.6)
    assert rows[1]["kernels"] == 2 and rows[1]["rank"] == 1 and rows[1]["row"] == "r"
    # the step's categories: its phases' added up
    assert rows[6]["kernels"] == 3 and rows[6]["total_ms"] == pytest.approx(0.625)
    assert rows[6]["share"] == pytest.approx(0.625 / 0.75)
    summary = phase_summary(rows)
    assert [(s["phase"], s["matmul_ms"], s["communication_ms"]) for s in summary] == [
        ("forward", 0.5, 0.125), ("backward", 0.125, None), ("all", 0.625, 0.125),
    ]  # fmt: skip
    assert summary[0]["exposed_comm_ms"] == forward["exposed_comm_ms"]


def _whole_step(row: str, wall: float, rest: float | None, **categories: float) -> list[dict]:
    """A profile's `all` rows of one row on rank 0 (`rest`: exposed communication + idle, split
    evenly; None: a CPU run, no device split)."""
    half = None if rest is None else rest / 2
    phase = dict(row=row, rank=0, phase="all", kind="phase", wall_ms=wall,
                 busy_ms=None if rest is None else wall - rest, exposed_comm_ms=half,
                 idle_ms=half)  # fmt: skip
    return [phase] + [
        dict(row=row, rank=0, phase="all", kind="category", category=c, total_ms=ms)
        for c, ms in categories.items()
    ]


def test_kernel_parity_takes_the_faster_row_in_every_category():
    """Ours at the faster row's time in every compute category, with ours' own exposed
    communication and idle time, over the torch-native step of the same checkpointing;
    communication is not a category there (it runs beside compute), and a category only the
    slower row runs counts as nothing."""
    rows = [
        *_whole_step("ours_fsdp_fa2_selective", 10.0, 1.0, matmul=5.0, attention=4.0,
                     communication=2.0),
        *_whole_step("ours_fsdp_fa2_blocks", 12.0, 1.0, matmul=6.0, attention=5.0),
        *_whole_step("torch-native_fsdp_sdpa_selective", 9.5, 0.8, matmul=5.5, attention=3.0,
                     other=0.2),
    ]  # fmt: skip
    (line,) = kernel_parity(rows)  # no torch-native row of `blocks`: no line
    assert line["native"] == "torch-native_fsdp_sdpa_selective"
    assert line["matmul"] == "5.0 / 5.5" and line["other"] == "0.0 / 0.2"
    assert "communication" not in line
    assert line["at_parity_ms"] == pytest.approx(5.0 + 3.0 + 1.0)
    assert line["at_parity_vs_native"] == pytest.approx(9.0 / 9.5)
    cpu = [*_whole_step("ours_x_blocks", 3.0, None, matmul=1.0),
           *_whole_step("torch-native_x_blocks", 2.0, None, matmul=1.0)]  # fmt: skip
    assert kernel_parity(cpu) == []


def test_the_checkpointing_study_picks_k_from_measured_bytes():
    config = _config(num_layers=None, study="checkpointing", native=False, batch=1)
    run = run_step(config, device="cpu", command="bench-step --test")
    model = lmcore.model_config("tiny", context_length=16, vocab_size=97)
    torch.manual_seed(0)
    block = lmcore.TransformerLM.from_config(model).layers[0]
    x = torch.randn(1, 16, model.d_model, requires_grad=True)
    saved, inputs = lmcore.saved_activation_bytes(block, x), x.numel() * 4
    k = lmcore.memory_optimal_segment_size(2, input_bytes=inputs, saved_bytes=saved)
    specs = [r["activation_checkpointing"] for r in run.rows]
    assert specs == [s for s in (f"segments:{k - 1}" if k > 1 else "none", f"segments:{k}",
                                 f"segments:{k + 1}", "nested") if s != "segments:3"]  # fmt: skip
    for row in run.rows:
        predicted = lmcore.peak_activation_bytes(
            row["activation_checkpointing"], 2, input_bytes=inputs, saved_bytes=saved
        )
        assert row["pred_act_mib"] * MIB == predicted and row["status"] == OK
    assert f"memory_optimal_segment_size(2, b, A) = {k}" in " ".join(run.notes)


def test_num_layers_fit_is_the_deepest_every_row_fits():
    config = StepConfig(
        size="leaderboard-8b",
        batch=1,
        precision="bf16",
        optimizer=("lmcore-fused", "torch-fused"),
        memory_bytes=80 * 10**9,
    )
    depth, note = fit_depth(config, torch.device("cpu"))
    assert 1 < depth < 34 and f"{depth} of 34 blocks" in note

    def fits(spec, layers):
        model = dataclasses.replace(spec.model, num_layers=layers)
        plan = TrainingPlan(model, batch=1, precision="bf16", optimizer=spec.optimizer,
                            activation_checkpointing="blocks", loss=spec.loss,
                            compiled=spec.compile)  # fmt: skip
        return estimate_memory(plan).fits(80e9 * (1 - config.headroom))

    specs = step_specs(config)
    assert all(fits(spec, depth) for spec in specs)
    assert not all(fits(spec, depth + 1) for spec in specs)


def test_out_of_memory_is_a_row(monkeypatch):
    build = bench.tools.step.full_step._build

    def failing(spec, rank, device):
        if spec.impl == "torch-native":
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        return build(spec, rank, device)

    monkeypatch.setattr(bench.tools.step.full_step, "_build", failing)
    ours, native = run_step(_config(), device="cpu").rows
    assert (ours["status"], native["status"]) == (OK, OOM)
    assert native["step_ms"] is None and ours["time_vs_native"] is None


def test_the_preset_says_what_it_needs_and_prints_the_one_gpu_command(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--preset", "leaderboard-2026", "--device", "cpu"])
    assert exc.value.code == 1
    err = capsys.readouterr().err
    assert "it needs CUDA GPUs" in err
    command = next(line.strip() for line in err.splitlines() if "bench-step --size" in line)
    args = COMMAND.parser().parse_args(command.split()[1:])
    assert (args.size, args.num_layers, args.batch, args.precision) == (
        "leaderboard-8b",
        "fit",
        1,
        "bf16",
    )


def _fake_gpus(monkeypatch, count: int, total_bytes: int) -> None:
    """`count` CUDA GPUs of `total_bytes` each, as far as the preset's check can tell."""
    import bench.tools.step as step

    props = type("Props", (), {"total_memory": total_bytes})()
    monkeypatch.setattr(step, "_num_gpus", lambda device: count)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)


ROWS = ["ours fsdp", "ours zero1", "torch-native fsdp:torch"]


@pytest.mark.parametrize(
    ("gpus", "total", "memory", "refused", "left_out"),
    [
        (2, 141 * 10**9, None, [], []),  # H200s: every row
        (2, 85 * 10**9, None, [], ["ours zero1"]),  # 80 GB H100s: ZeRO-1 left out
        (2, 141 * 10**9, "80GB", [], ["ours zero1"]),  # H200s standing in for them
        (2, 42 * 10**9, None, ["ours fsdp", "torch-native fsdp:torch"], None),
        (1, 141 * 10**9, None, None, None),  # too few GPUs
    ],
)
def test_the_preset_runs_the_rows_predicted_to_fit(
    monkeypatch, gpus, total, memory, refused, left_out
):
    """Ours on zero.FSDP and torch-native must fit a GPU's memory less the headroom by
    bench-plan's prediction, else the preset is refused; the ZeRO-1 row is left out, with a
    note, where it alone does not fit."""
    from bench.tools.step import _preset_fit

    _fake_gpus(monkeypatch, gpus, total)
    parser = COMMAND.parser()
    argv = ["--preset", "leaderboard-2026"] + (["--memory", memory] if memory else [])
    config = TOOL.configure(parser.parse_args(argv), parser, "cpu")
    missing, kept, note = _preset_fit(config, "leaderboard-2026", torch.device("cuda"))
    if refused is None:
        assert missing == "it needs 2 GPUs and finds 1"
        return
    if refused:
        assert [row for row in ROWS if f"{row} (" in missing] == refused
        return
    assert missing is None
    assert [row for row in ROWS if note and f"{row} (" in note] == left_out
    dropped = {row.split()[-1] for row in left_out}
    assert kept.parallel == tuple(p for p in config.parallel if p not in dropped)


def test_the_memory_cap_sets_the_allocators_share_and_gives_it_back(monkeypatch):
    from bench.tools.step.memory import capped_memory

    _fake_gpus(monkeypatch, 1, 100 * 10**9)
    shares = []
    monkeypatch.setattr(
        torch.cuda, "set_per_process_memory_fraction", lambda f, d: shares.append(f)
    )
    with capped_memory(80 * 10**9, torch.device("cuda")):
        assert shares == [pytest.approx(0.8)]
    assert shares == [pytest.approx(0.8), 1.0]
    for limit, device in [(None, "cuda"), (100 * 10**9, "cuda"), (10, "cpu")]:
        with capped_memory(limit, torch.device(device)):
            pass
    assert len(shares) == 2  # no cap: none asked for, not below the GPU's, or off CUDA


@pytest.mark.parametrize(
    ("num_gpus", "nproc", "memory"), [(0, None, 80e9), (1, None, None), (2, 2, None), (4, 2, None)]
)
def test_the_depth_reduced_command_keeps_the_presets_ranks_where_there_are_enough(
    num_gpus, nproc, memory
):
    argv = depth_reduced_argv(num_gpus=num_gpus)
    assert argv[0] == "bench-step"
    args = COMMAND.parser().parse_args(argv[1:])
    config = TOOL.configure(args, COMMAND.parser(), "cpu")
    assert (config.nproc, config.memory_bytes, config.num_layers, config.batch) == (
        nproc or 1,
        memory,
        "fit",
        1,
    )
    assert config.parallel == (("single",) if nproc is None else ("fsdp", "zero1"))
    preset = PRESETS["leaderboard-2026"]
    assert (config.size, config.optimizer, config.loss) == (
        preset["size"],
        preset["optimizer"],
        preset["loss"],
    )


@pytest.mark.parametrize(
    ("preset", "ranks"), [("leaderboard-2026", 2), ("leaderboard-2026-4gpu", 4)]
)
def test_the_preset_is_the_handouts_configuration(preset, ranks):
    """lmcore's leaderboard step: ours on zero.FSDP first, ZeRO-1 second (on its two GPUs),
    the torch-native FSDP2 row last, every row in bf16 with bf16 AdamW moments."""
    parser = COMMAND.parser()
    config = TOOL.configure(parser.parse_args(["--preset", preset]), parser, "cpu")
    specs = step_specs(config)
    assert (config.batch * config.nproc, config.nproc) == (ranks, ranks)
    layouts = ["fsdp", "zero1", "fsdp:torch"] if ranks == 2 else ["fsdp", "fsdp:torch"]
    assert [s.layout for s in specs] == layouts
    board = lmcore.LEADERBOARD_2026
    for spec in specs:
        assert spec.model == board.config(attention=spec.model.attention)
        assert (spec.precision, spec.moment_dtype, spec.compile) == (board.precision, "bf16", True)
        assert (spec.batch, spec.world_size) == (board.batch_per_gpu, ranks)
        assert spec.activation_checkpointing == "selective"  # the faster policy that fits
    profiled = parser.parse_args(["--preset", preset, "--profile", "out/step_profile"])
    config = TOOL.configure(profiled, parser, "cpu")
    assert config.profile_dir == "out/step_profile" and step_specs(config) == specs
    assert len({spec.label for spec in specs}) == len(specs)  # a file name per row


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--parallel", "zero"], "several ranks"),
        (["--study", "checkpointing", "--activation-checkpointing", "blocks"], "picks the"),
        (["--attention", "fa2-triton"], "fa2-triton needs CUDA"),
        (["--size", "tiny", "--num-layers", "fit"], "needs a GPU to fill"),
        (["--activation-checkpointing", "segments:0"], "K must be a positive integer"),
        (["--headroom", "1.5"], "--headroom"),
    ],
)
def test_bad_input_is_a_usage_error(argv, match, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--device", "cpu", "--no-progress", *argv])
    assert exc.value.code == 2
    assert match in capsys.readouterr().err


def test_a_size_without_a_context_needs_one():
    with pytest.raises(ValueError, match="no context length of its own"):
        StepConfig(size="small", num_layers=None)


def test_help_has_examples(help_text):
    text = help_text(main)
    assert "Examples:" in text and "--preset leaderboard-2026" in text
    assert "--activation-checkpointing SPEC" in text and "lmcore-fused" in text


@pytest.mark.gpu
def test_cuda_rows_compiled_with_the_peak_split_into_its_parts():
    """On a GPU: ours (fa2, fused loss, lmcore's fused AdamW, compiled) and the torch-native row
    at `small`'s width and 2 blocks in bf16; the parts of each peak add up to it, and lmcore's
    fused AdamW keeps bf16 moments as torch's does (the same precision)."""
    config = StepConfig(
        size="small",
        num_layers=2,
        context_length=256,
        batch=2,
        precision="bf16",
        attention=("fa2-triton",),
        optimizer=("lmcore-fused",),
        activation_checkpointing=("segments:2",),
        warmup_ms=25.0,
        rep_ms=100.0,
    )
    ours, native = run_step(config, device="cuda").rows
    params = lmcore.count_parameters(step_specs(config)[0].model)
    for row in (ours, native):
        assert row["status"] == OK and row["mfu"] > 0 and row["attn_ms"] > 0
        parts = ("param_mib", "grad_mib", "state_mib", "act_mib", "rest_mib")
        assert sum(row[k] for k in parts) == pytest.approx(row["peak_mib"])
        assert row["param_mib"] * MIB == pytest.approx(2 * params, rel=1e-3)
    assert ours["state_mib"] == pytest.approx(native["state_mib"], rel=1e-2)
    assert ours["moment_dtype"] == "bf16"
    assert ours["time_vs_native"] > 0 and ours["peak_vs_native"] > 0


@pytest.mark.gpu
def test_cuda_the_leaderboard_rows_at_a_small_size_on_two_gpus():
    """The leaderboard preset's three rows, cut to `small`'s width and 2 blocks with the
    leaderboard's vocabulary: ours on zero.FSDP (bf16 shards, each unit compiled by inductor),
    on ZeRO-1 (each block compiled), and FSDP2's; every row at torch's precision."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA devices")
    config = StepConfig(
        size="small", num_layers=2, context_length=2048, batch=1, vocab_size=151_936,
        precision="bf16", attention=("fa2-triton",), optimizer=("lmcore-fused",),
        activation_checkpointing=("blocks",), nproc=2, parallel=("fsdp", "zero1"),
        warmup_ms=25.0, rep_ms=100.0,
    )  # fmt: skip
    fsdp, zero1, native = run_step(config, device="cuda").rows
    assert [r["layout"] for r in (fsdp, zero1, native)] == ["fsdp", "zero1", "fsdp:torch"]
    for row in (fsdp, zero1, native):
        assert row["status"] == OK and row["first_step_ms"] > row["step_ms"] > 0
        parts = ("param_mib", "grad_mib", "state_mib", "act_mib", "rest_mib")
        assert sum(row[k] for k in parts) == pytest.approx(row["peak_mib"])
    # the same shards and bf16 moments as FSDP2's (ours keeps the norm gains whole)
    assert fsdp["param_mib"] == pytest.approx(native["param_mib"], rel=1e-2)
    assert fsdp["state_mib"] == pytest.approx(native["state_mib"], rel=1e-2)
    assert zero1["param_mib"] == pytest.approx(2 * native["param_mib"], rel=1e-2)


@pytest.mark.gpu
def test_cuda_profile_of_fsdp_beside_fsdp2_on_two_gpus(tmp_path):
    """--profile on 2 GPUs: every phase's wall time split on the device, fa2's kernels and
    NCCL's in their categories, and the kernels attributed by launch (the categories) adding up
    to at least the compute kernels found in the phase's device window."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA devices")
    folder = tmp_path / "step_profile"
    config = StepConfig(
        size="small", num_layers=2, context_length=2048, batch=1, precision="bf16",
        attention=("fa2-triton",), optimizer=("lmcore-fused",),
        activation_checkpointing=("selective",), nproc=2, parallel=("fsdp",),
        warmup_ms=25.0, rep_ms=100.0, profile_dir=str(folder),
    )  # fmt: skip
    assert all(r["status"] == OK for r in run_step(config, device="cuda").rows)
    found = _check_profile(folder, config, ranks=2)
    profile = load_json(folder / f"{folder.name}.json")
    for r in (r for r in profile.rows if r["kind"] == "phase"):
        assert r["busy_ms"] > 0 and r["idle_ms"] >= 0, r
        assert 0 <= r["exposed_comm_ms"] <= r["comm_ms"] <= r["wall_ms"], r
        categories = found[r["row"], r["rank"], r["phase"]]
        launched = sum(c["total_ms"] for name, c in categories.items() if name != "communication")
        assert launched >= 0.99 * r["kernel_ms"], r
    for spec in step_specs(config):
        for rank in (0, 1):
            forward = found[spec.label, rank, "forward"]
            assert {"matmul", "attention", "communication"} <= set(forward), spec.label
