"""bench-step's measurement: one full training step of `lmcore.TransformerLM`, ours beside a
torch-native one, as `run_step(config)`, and the `TOOL` its command runs.

What each row holds, the studies, the preset and the command line: `bench.commands.step`
(`bench-step --help`).
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

import lmcore
from bench.commands.step import (
    FIT,
    PRESETS,
    StepConfig,
    depth_reduced_argv,
    step_given,
)
from bench.core.cli import usage_errors
from bench.core.distributed import measure_cases, slowest_rank
from bench.core.env import device_name
from bench.core.launch import DEFAULT_TIMEOUT_S, torchrun_world_size, under_torchrun
from bench.core.layouts import DTYPES, LAYOUTS, PRECISIONS, autocast_dtype, compute_dtype
from bench.core.memory import GIB, MIB, free_memory
from bench.core.oom import OK, guarded
from bench.core.plots import Bars, stacked_bar_plot
from bench.core.ranks import is_primary
from bench.core.results import Keys, Run
from bench.core.timing import summarize
from bench.core.tool import Invocation, Tool, as_device, config_or_default
from bench.tools.step.full_step import (
    NATIVE_ATTENTION,
    NATIVE_LOSS,
    NATIVE_OPTIMIZER,
    StepSpec,
    matmul_ceiling,
    measure_step,
    step_flops,
)
from bench.tools.step.memory import capped_memory
from bench.tools.step.profile import save_step_profile

__all__ = [
    "COLUMNS",
    "KEYS",
    "PRESETS",
    "TOOL",
    "StepConfig",
    "depth_reduced_command",
    "fit_depth",
    "plot_step",
    "run_step",
    "step_specs",
]

_CACHE_VARS = {"TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton"}


def step_specs(config: StepConfig) -> list[StepSpec]:
    """Every row's step, in order: ours' combinations of each checkpointing (layouts in the
    order given, outermost), then its torch-native row. Each validates itself, so this checks
    the options together.

    Raises:
        ValueError: options that do not go together (the message says which).
    """
    common = {
        "batch": config.batch,
        "precision": config.precision,
        "compile": config.compile,
        "compile_backend": config.compile_backend,
        "world_size": config.nproc,
        "warmup_ms": config.warmup_ms,
        "rep_ms": config.rep_ms,
    }
    specs = []
    for ckpt in config.activation_checkpointing:
        for parallel in config.parallel:
            for attention in config.attention:
                model = config.model_config(attention)
                for loss in config.loss:
                    for optimizer in config.optimizer:
                        specs.append(StepSpec(model, **common, parallel=parallel, loss=loss,
                                              optimizer=optimizer,
                                              activation_checkpointing=ckpt))  # fmt: skip
        if config.native:
            model = config.model_config(NATIVE_ATTENTION)
            specs.append(StepSpec(model, **common, parallel=config.parallel[0],
                                  impl="torch-native", loss=NATIVE_LOSS,
                                  optimizer=NATIVE_OPTIMIZER,
                                  activation_checkpointing=ckpt))  # fmt: skip
    return specs


# ---- the depth that fits, and the study's segment size --------------------------------------


def _plan(spec: StepSpec) -> Any:
    """bench-plan's `TrainingPlan` of a row (the torch-native loss is its `chunked`)."""
    from bench.plan.memory import TrainingPlan

    return TrainingPlan(
        spec.model,
        batch=spec.batch * spec.world_size,
        precision=spec.plan_precision,
        layout=spec.layout,
        dp=spec.world_size,
        activation_checkpointing=spec.activation_checkpointing,
        loss=spec.loss,
        optimizer=spec.optimizer,
        compiled=spec.compile,
    )


def fit_depth(config: StepConfig, device: torch.device) -> tuple[int, str]:
    """The most blocks every row's step fits in the memory less the headroom, and a note why.

    The memory is `config.memory_bytes`, else the GPU's.

    Raises:
        ValueError: no memory to fill, an attention backend bench-plan does not model, or not
            even one block fits.
    """
    from bench.plan.activations import ATTENTION_KINDS
    from bench.plan.fit import largest_num_layers

    if config.memory_bytes is not None:
        memory = config.memory_bytes
    elif device.type == "cuda":
        memory = torch.cuda.get_device_properties(device).total_memory
    else:
        raise ValueError("--num-layers fit needs a GPU to fill, or --memory SIZE (e.g. 80GB)")
    budget = memory * (1 - config.headroom)
    specs = step_specs(config)
    full = specs[0].model.num_layers
    unknown = {s.model.attention for s in specs} - set(ATTENTION_KINDS)
    if unknown:
        raise ValueError(f"--num-layers fit: bench-plan does not model {sorted(unknown)}")
    depths = [largest_num_layers(_plan(spec), budget, limit=full) for spec in specs]
    if any(d is None for d in depths):
        raise ValueError(
            f"--num-layers fit: not even one block fits {budget / 1e9:.1f} GB by bench-plan's "
            "model; lower --batch or --context-length, or checkpoint more"
        )
    depth = min(depths)
    return depth, (
        f"--num-layers fit: {depth} of {full} blocks, the most whose predicted peak "
        f"(bench-plan's model) fits {memory / 1e9:.1f} GB less {config.headroom:.0%} headroom "
        "for every row."
    )


def _block_bytes(config: StepConfig, device: torch.device) -> tuple[int, int]:
    """(A, b): bytes one block of ours saves for backward, and its input's, at the run's
    precision (`lmcore.saved_activation_bytes`, one real block on `device`)."""
    model_config = config.model_config(config.attention[0])
    torch.manual_seed(0)
    with torch.device(device):
        rope = lmcore.RotaryEmbedding(
            model_config.head_dim, model_config.context_length, theta=model_config.rope_theta
        )
        block = lmcore.TransformerBlock(model_config, rope=rope)
    dtype = DTYPES[PRECISIONS[config.precision].weights]
    block = block.to(dtype)
    shape = (config.batch, model_config.context_length, model_config.d_model)
    x = torch.randn(shape, device=device, dtype=dtype, requires_grad=True)  # residual stream
    autocast_to = autocast_dtype(config.precision)
    with torch.autocast(device.type, dtype=autocast_to, enabled=autocast_to is not None):
        saved = lmcore.saved_activation_bytes(block, x)
    inputs = x.numel() * x.element_size()
    del block, x
    free_memory(device)
    return saved, inputs


def _checkpointing_study(
    config: StepConfig, device: torch.device
) -> tuple[StepConfig, str, dict[str, int]]:
    """The study's specs, segments of k − 1, k, k + 1 blocks and nested, for the k lmcore
    predicts from one block's measured bytes; a note saying how k was found; A and b."""
    saved, inputs = _block_bytes(config, device)
    n = config.model_config(config.attention[0]).num_layers
    k = lmcore.memory_optimal_segment_size(n, input_bytes=inputs, saved_bytes=saved)
    specs = [f"segments:{j}" if j else "none" for j in (k - 1, k, k + 1) if j <= n]
    specs.append("nested")
    note = (
        f"Checkpointing study: one block ({config.precision}, {config.attention[0]}, eager) "
        f"saves A = {saved / MIB:,.1f} MiB for backward and takes b = {inputs / MIB:,.1f} MiB "
        f"of input (lmcore.saved_activation_bytes); lmcore.memory_optimal_segment_size({n}, b, "
        f"A) = {k}: the rows are {', '.join(specs)} (segments of 0 blocks: none). pred_act_mib: "
        "lmcore.peak_activation_bytes of each form from A and b."
    )
    study = {"saved_bytes": saved, "input_bytes": inputs, "k": k}
    return replace(config, activation_checkpointing=tuple(dict.fromkeys(specs))), note, study


# ---- running the rows ------------------------------------------------------------------------


def _measure_rows(
    specs: list[StepSpec], config: StepConfig, device: torch.device, timeout: float | None
) -> list[tuple[StepSpec, list[dict[str, Any]]]]:
    """Every row's per-rank numbers. Compiled, each row runs in processes of its own with
    compiler cache folders of its own, so that its first step pays its own compilation (kernels
    an earlier row compiled stay in that row's processes and folders); otherwise the rows share
    one launch (or, on one rank, this process)."""
    if config.compile and not under_torchrun():
        measured = []
        for spec in specs:
            with _empty_compile_cache(True):
                measured += measure_cases(
                    _measure_case, [spec], config, device=device, timeout=timeout
                )
        return measured
    if config.nproc > 1:
        return measure_cases(_measure_case, specs, config, device=device, timeout=timeout)
    return [(spec, _measure_here(spec, config, device)) for spec in specs]


def _profile_dir(config: StepConfig) -> Path | None:
    return None if config.profile_dir is None else Path(config.profile_dir)


def _measure_case(
    spec: StepSpec, config: StepConfig, rank: int, device: torch.device
) -> dict[str, Any]:
    """One rank's numbers for one row (a module-level function: spawned ranks import it), the
    allocator capped at `--memory` (`capped_memory`)."""
    with capped_memory(config.memory_bytes, device):
        return measure_step(spec, rank=rank, device=device, profile=_profile_dir(config))


def _measure_here(spec: StepSpec, config: StepConfig, device: torch.device) -> list[dict[str, Any]]:
    """The row's numbers on this process's one rank, out of memory as a status."""
    profile = _profile_dir(config)
    with capped_memory(config.memory_bytes, device):
        outcome = guarded(
            lambda: measure_step(spec, rank=0, device=device, profile=profile), device=device
        )
    return [{**outcome.value, "status": OK} if outcome.ok else {"status": outcome.status}]


@contextlib.contextmanager
def _empty_compile_cache(enabled: bool) -> Iterator[None]:
    """Fresh Inductor and Triton cache folders for the run (restored and removed after); the
    ranks a run starts inherit them."""
    if not enabled:
        yield
        return
    saved = {name: os.environ.get(name) for name in _CACHE_VARS}
    with tempfile.TemporaryDirectory(prefix="bench-step-cache-") as folder:
        os.environ.update({name: os.path.join(folder, sub) for name, sub in _CACHE_VARS.items()})
        try:
            yield
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def _check_device(config: StepConfig, device: torch.device) -> None:
    """Refuse the Triton paths off CUDA: Triton's CPU interpreter runs them, far too slowly to
    time a step."""
    if device.type == "cuda":
        return
    if "fa2-triton" in config.attention:
        raise ValueError("attention fa2-triton needs CUDA; on a CPU use sdpa or fa2-pytorch")
    if "lmcore-fused" in config.optimizer:
        raise ValueError("--optimizer lmcore-fused needs CUDA; on a CPU use lmcore or torch-fused")


# ---- rows ------------------------------------------------------------------------------------


def _mib(value: int | None) -> float | None:
    return None if value is None else value / MIB


def _identity(spec: StepSpec, config: StepConfig) -> dict[str, Any]:
    """What a row ran, in the keys `bench-plan --check` reads (`bench.plan.check`)."""
    m = spec.model
    shape = replace(
        lmcore.MODEL_SIZES[config.size], num_layers=m.num_layers, vocab_size=m.vocab_size
    )
    return {
        "impl": spec.impl,
        "size": config.size,
        "size_label": f"{config.size} ({shape.dimensions})",
        "d_model": m.d_model,
        "d_ff": m.d_ff,
        "num_layers": m.num_layers,
        "num_heads": m.num_heads,
        "num_kv_heads": m.kv_heads,
        "vocab_size": m.vocab_size,
        "ctx": m.context_length,
        "batch": spec.batch,
        "world_size": spec.world_size,
        "layout": spec.layout,
        "fsdp_units": list(LAYOUTS[spec.layout].units),
        "precision": spec.plan_precision,
        "moment_dtype": spec.moment_dtype,
        "attention": m.attention,
        "loss": spec.loss,
        "optimizer": spec.optimizer,
        "activation_checkpointing": spec.activation_checkpointing,
        "compiled": spec.compile,
        "compile_backend": spec.compile_backend if spec.compile else None,
    }


def _attention_ms(spec: StepSpec, per_rank: Sequence[dict[str, Any]]) -> float | None:
    """The step's attention time: forward + backward per block, a forward per recomputed one
    (none for a block whose output `selective` keeps)."""
    from bench.plan.memory import Checkpointing

    measured = [r["attention"] for r in per_rank if r["attention"] is not None]
    if not measured:
        return None
    fwd, both = (max(t[i] for t in measured) for i in (0, 1))
    layers = spec.model.num_layers
    ckpt = Checkpointing.parse(spec.activation_checkpointing, layers)
    return layers * both + ckpt.recomputed_attention_forwards(spec.model.attention) * fwd


def _metrics(
    spec: StepSpec, per_rank: Sequence[dict[str, Any]], device: torch.device
) -> dict[str, Any]:
    from bench.core.hardware import matmul_format

    if len(per_rank) > 1:
        step = slowest_rank([r["times"] for r in per_rank])
    else:
        step = summarize(per_rank[0]["times"])
    busiest = max(per_rank, key=lambda r: r["memory"]["peak"] or 0)["memory"]
    phases = {p: max(r["phases"][p] for r in per_rank) for p in per_rank[0]["phases"]}
    flops, attention_flops = step_flops(spec.model, spec.batch)
    seconds = step.median * 1e-3
    ceiling = matmul_ceiling(device_name(device), matmul_format(compute_dtype(spec.precision)))
    attention_ms = _attention_ms(spec, per_rank)
    return {
        "step_ms": step.median,
        "step_std": step.std,
        "n": step.n,
        "first_step_ms": max(r["first_ms"] for r in per_rank),
        "fwd_ms": phases.get("forward"),
        "bwd_ms": phases.get("backward"),
        "opt_ms": phases.get("optimizer"),
        "attn_ms": attention_ms,
        "attn_time_share": None if attention_ms is None else attention_ms / step.median,
        "attn_flop_share": attention_flops / flops,
        "tokens_per_s": spec.batch * spec.model.context_length * spec.world_size / seconds,
        "mfu": None if ceiling is None else flops / seconds / (ceiling[0] * 1e12),
        "mfu_ceiling_tflops": None if ceiling is None else ceiling[0],
        "peak_mib": _mib(busiest["peak"]),
        "peak_phase": busiest["phase"],
        "param_mib": _mib(busiest["params"]),
        "grad_mib": _mib(busiest["grads"]),
        "state_mib": _mib(busiest["state"]),
        "act_mib": _mib(busiest["activations"]),
        "rest_mib": _mib(busiest["rest"]),
    }


def _row(
    spec: StepSpec,
    config: StepConfig,
    per_rank: Sequence[dict[str, Any]],
    *,
    device: torch.device,
    study: Mapping[str, int] | None,
) -> dict[str, Any]:
    row = _identity(spec, config)
    if study is not None:
        predicted = lmcore.peak_activation_bytes(
            spec.activation_checkpointing,
            spec.model.num_layers,
            input_bytes=study["input_bytes"],
            saved_bytes=study["saved_bytes"],
        )
        row["pred_act_mib"] = _mib(predicted)
    failed = [r["status"] for r in per_rank if r["status"] != OK]
    if failed:
        return {**row, **dict.fromkeys(_METRICS), "status": failed[0]}
    return {**row, **_metrics(spec, per_rank, device), "status": OK}


def _add_ratios(rows: list[dict[str, Any]]) -> None:
    """`time_vs_native`, `peak_vs_native`: an `ours` row over the torch-native row of its
    checkpointing (below 1: faster, smaller)."""
    native = {
        r["activation_checkpointing"]: r
        for r in rows
        if r["impl"] == "torch-native" and r["status"] == OK
    }
    for row in rows:
        theirs = native.get(row["activation_checkpointing"]) if row["impl"] == "ours" else None
        for key, column in (("step_ms", "time_vs_native"), ("peak_mib", "peak_vs_native")):
            mine, base = row.get(key), (theirs or {}).get(key)
            row[column] = mine / base if mine is not None and base else None


COLUMNS = [
    "impl", "layout", "attention", "loss", "optimizer", "activation_checkpointing", "step_ms",
    "time_vs_native", "first_step_ms", "tokens_per_s", "mfu", "peak_mib", "peak_vs_native",
    "param_mib", "grad_mib", "state_mib", "act_mib", "rest_mib", "peak_phase", "fwd_ms",
    "bwd_ms", "opt_ms", "attn_ms", "attn_time_share", "status",
]  # fmt: skip
# The printed table (`--wide`: every column), most telling first: what runs, its time beside the
# torch-native step's, its speed and memory; the columns past 120 characters are left out.
BRIEF = {
    "impl": "impl", "step_ms": "step_ms", "time_vs_native": "vs_native",
    "peak_mib": "peak_mib", "peak_vs_native": "peak_vs_native", "status": "status",
    "attention": "attention", "loss": "loss", "activation_checkpointing": "ckpt",
    "tokens_per_s": "tokens/s", "mfu": "mfu", "first_step_ms": "first_ms",
    "optimizer": "optimizer",
}  # fmt: skip
_METRICS = [
    "step_ms", "step_std", "n", "first_step_ms", "fwd_ms", "bwd_ms", "opt_ms", "attn_ms",
    "attn_time_share", "attn_flop_share", "tokens_per_s", "mfu", "mfu_ceiling_tflops",
    "peak_mib", "peak_phase", "param_mib", "grad_mib", "state_mib", "act_mib", "rest_mib",
]  # fmt: skip
# Every key of a row, for readers (bench-report, bench-plan --check).
KEYS = Keys(
    *COLUMNS, *_METRICS, "size", "size_label", "d_model", "d_ff", "num_layers", "num_heads",
    "num_kv_heads", "vocab_size", "ctx", "batch", "world_size", "layout", "fsdp_units",
    "precision", "moment_dtype", "compiled", "compile_backend", "pred_act_mib",
    "time_vs_native", "peak_vs_native",
)  # fmt: skip


def run_step(
    config: StepConfig | None = None,
    *,
    device: torch.device | str | None = None,
    command: str | None = None,
    timeout: float | None = DEFAULT_TIMEOUT_S,
) -> Run:
    """Measure every row of `config` on `device` (see the module docstring).

    Args:
        config: what to run; the device's default (`StepConfig`) when None.
        device: where to run; CUDA when available, else the CPU, when None.
        command: the command line to record; the process's own when None.
        timeout: seconds the ranks may take in all (several ranks only; None: no bound).

    Returns:
        A `Run` (tool `"step"`), a row per step with `KEYS`: the model's dimensions, context,
        batch per rank, ranks, bench-plan's names of the layout and precision, the options,
        times (ms), tokens/s, MFU, memory (MiB), ratios to the torch-native row, `status`.

    Raises:
        ValueError: an option the device cannot run (a Triton path off CUDA, more ranks than
            GPUs, `--num-layers fit` without a memory to fill).
    """
    device = as_device(device)
    config, notes = config_or_default(
        config,
        device,
        cls=StepConfig,
        tool="bench-step",
        describe=lambda c: f"{c.size}, context {c.context_length}, batch {c.batch}, fp32",
    )
    _check_device(config, device)
    study = None
    if config.study == "checkpointing":
        config, note, study = _checkpointing_study(config, device)
        notes.append(note)
    if config.num_layers == FIT:
        depth, note = fit_depth(config, device)
        config = replace(config, num_layers=depth)
        notes.append(note)
        print(f"bench-step: {note}", file=sys.stderr)
    specs = step_specs(config)
    measured = _measure_rows(specs, config, device, timeout)
    rows = [_row(spec, config, results, device=device, study=study) for spec, results in measured]
    _add_ratios(rows)
    notes += _notes(config, rows, device)
    if config.profile_dir is not None:
        notes.append(_save_profile(config, measured, device=device, command=command))
    columns = COLUMNS + (["pred_act_mib"] if study else [])
    return Run.create(
        "step",
        rows,
        device=device,
        config=asdict(config),
        command=command,
        title=f"Full training step: {rows[0]['size_label']}, context {rows[0]['ctx']:,}, "
        f"batch {config.batch} per rank × {config.nproc}, {config.precision}",
        columns=columns,
        notes=notes,
        brief=BRIEF,
    )


def _save_profile(
    config: StepConfig,
    measured: Sequence[tuple[StepSpec, Sequence[dict[str, Any]]]],
    *,
    device: torch.device,
    command: str | None,
) -> str:
    """Every rank's profile rows of every row into `--profile`'s run; the note that says so."""
    rows = [
        r
        for _, per_rank in measured
        for result in per_rank
        if result["status"] == OK
        for r in result["profile"]
    ]
    directory = Path(config.profile_dir)
    if is_primary():
        save_step_profile(directory, rows, device=device, command=command, config=asdict(config))
    return (
        "--profile: after each row's timed and instrumented steps, one more step on every rank "
        f"under torch.profiler (never timed): traces, kernel tables and {directory.name}.json "
        f"/ .md (time per kernel category, phase and rank; exposed communication) in {directory} "
        "(bench.tools.step.profile)."
    )


def _ours_note(config: StepConfig) -> str:
    """How ours runs: its AdamW's moments, its compilation, its FSDP."""
    parts = [
        "ours: AdamW's moments in the parameters' dtype (moment_dtype; lmcore's fused AdamW is "
        "given moment_dtype=torch.bfloat16 for a bf16 model), the precision torch's fused "
        "AdamW keeps them in"
    ]
    if config.compile:
        parts.append(
            f"each block compiled ({config.compile_backend}), under zero.FSDP each unit's "
            "forward with FSDP's hooks outside, as the torch-native row compiles each block"
        )
    if "fsdp" in config.parallel:
        parts.append(
            "fsdp: zero.apply_fsdp with the blocks, the embedding and the LM head as units "
            "(fsdp_units), weights gathered and gradients reduced in the model's dtype, as "
            "FSDP2 does by default"
        )
    return "; ".join(parts) + "."


def _notes(config: StepConfig, rows: Sequence[dict[str, Any]], device: torch.device) -> list:
    if config.nproc > 1:
        timer = (
            "the timed steps, each the slowest rank's (after the first step, two steps whose "
            "slowest rank sets how many fill the budgets, also warming up; then at least three "
            "timed)"
        )
    elif device.type == "cuda":
        timer = "triton.testing.do_bench over the whole step"
    else:
        timer = "the timed steps"
    notes = [
        f"step_ms: median of {timer} (warm-up {config.warmup_ms:g} ms, measurement "
        f"{config.rep_ms:g} ms); time_vs_native, peak_vs_native: ours / the torch-native row "
        "of the same checkpointing (below 1: faster, smaller). first_step_ms: the row's first "
        "step, compilation included; compiled, each row runs in processes and compiler cache "
        "folders of its own, so no row reuses another's kernels.",
        "Memory (MiB, the busiest rank): the peak of one instrumented step split into "
        "parameters, gradients, optimizer state (tensor bytes), activations (what the forward "
        "left for backward) and rest (buffers, the batch, transients); peak_phase: where it "
        "fell (bench.tools.step.memory). Under FSDP the parameters and gradients are shards.",
        "fwd_ms, bwd_ms, opt_ms: the instrumented step's phases (backward includes "
        "recomputation); attn_ms: the attention backend alone at the step's shape, forward and "
        "backward per block plus a forward per recomputed block (none under selective "
        "checkpointing, which keeps attention's output); attn_flop_share: attention's share of "
        "the step's FLOPs (causal: half the score matrix).",
        _ours_note(config),
    ]
    ceilings = {r["mfu_ceiling_tflops"] for r in rows if r.get("mfu_ceiling_tflops")}
    if ceilings:
        from bench.core.hardware import matmul_format

        dtype = compute_dtype(config.precision)
        _, source = matmul_ceiling(device_name(device), matmul_format(dtype)) or (0, "")
        notes.append(
            f"MFU against {', '.join(f'{c:g}' for c in sorted(ceilings))} TFLOP/s ({source}); "
            "FLOPs: matmuls only, forward + backward = 3 × forward, causal attention counted "
            "as half the scores, recomputation not counted."
        )
    if config.native:
        sharded = ", torch FSDP2 (fully_shard per block, then the root)" if config.nproc > 1 else ""
        notes.append(
            "torch-native: SDPA, torch.utils.checkpoint over the same segments (lmcore's "
            "non-reentrant checkpoints), a chunked cross-entropy (compiled per chunk, each chunk "
            "checkpointed: its logits recomputed in backward), torch.optim.AdamW(fused=True), "
            f"{'each block compiled' if config.compile else 'eager'}{sharded}; bench-plan's "
            "loss `chunked`."
        )
    return notes


def plot_step(run: Run, path: Path) -> Path:
    """Stacked bars of each row's peak (parameters … rest) beside bars of its step time.

    Raises:
        ValueError: no row completed.
    """
    keys = ("layout", "attention", "loss", "optimizer")
    several = [k for k in keys if len({r[k] for r in run.rows if r["impl"] == "ours"}) > 1]

    def label(r: dict[str, Any]) -> str:
        parts = [r["impl"], r["activation_checkpointing"]]
        return "\n".join(parts + ([r[k] for k in several] if r["impl"] == "ours" else []))

    rows = [dict(r, label=label(r)) for r in run.ok_rows]
    measured_peak = any(r.get("peak_mib") is not None for r in rows)
    parts = ("param", "parameters"), ("grad", "gradients"), ("state", "optimizer state")
    parts += ("act", "activations"), ("rest", "rest")
    memory = Bars(
        keys=tuple((f"{key}_mib", text) for key, text in parts),
        ylabel="MiB (busiest rank)",
        title="peak of one step" if measured_peak else "tensor sizes (no peak on CPU)",
    )
    time = Bars(keys=(("step_ms", "step"),), ylabel="ms", title="median step", err="step_std")
    return stacked_bar_plot(
        rows, label="label", panels=(memory, time), path=path, title=run.plot_title
    )


# ---- the preset on a machine that cannot run it ----------------------------------------------


def _num_gpus(device: torch.device) -> int:
    """The GPUs a run on `device` may use: torchrun's ranks under torchrun, else the machine's."""
    if device.type != "cuda":
        return 0
    return torchrun_world_size() if under_torchrun() else torch.cuda.device_count()


def depth_reduced_command(device: torch.device) -> str:
    """The command that stands in for the leaderboard preset on this machine (`--num-layers
    fit`; see `bench.commands.step.depth_reduced_argv`)."""
    return " ".join(depth_reduced_argv(num_gpus=_num_gpus(device)))


def _named(rows: Sequence[tuple[StepSpec, float]]) -> str:
    return ", ".join(f"{spec.impl} {spec.layout} ({peak / GIB:.1f} GiB)" for spec, peak in rows)


def _preset_fit(
    config: StepConfig, preset: str, device: torch.device
) -> tuple[str | None, StepConfig, str | None]:
    """Whether this machine runs the leaderboard preset `preset` (built into `config`), and with
    which rows: (why it cannot, or None; the config to run; a note naming the rows left out,
    or None).

    It cannot with too few GPUs, or where bench-plan predicts a headline row (ours on the
    preset's first layout, zero.FSDP, or torch-native) above a GPU's memory (`--memory` where
    given and smaller) less `--headroom`: the allocator needs more than the tensors (the ZeRO-1
    row, whose tensors peak at 69,490 MiB on H200s, ran out of memory with each rank's
    allocator capped at 80 GB; step_leaderboard_2xh200_2026-11-28_gluonbwd and _cap80gb). Rows
    of ours beyond the first predicted above it (on two 80 GB H100s, ZeRO-1) are left out."""
    from bench.plan.memory import estimate_memory

    if device.type != "cuda":
        return "it needs CUDA GPUs, and this run has none", config, None
    ranks, needed = _num_gpus(device), PRESETS[preset]["nproc"]
    if ranks < needed:
        return f"it needs {needed} GPUs and finds {ranks}", config, None
    visible = range(min(ranks, torch.cuda.device_count()))
    memory = min(torch.cuda.get_device_properties(i).total_memory for i in visible)
    if config.memory_bytes is not None:
        memory = min(memory, config.memory_bytes)
    budget = memory * (1 - config.headroom)
    peaks = [(spec, estimate_memory(_plan(spec)).peak.total) for spec in step_specs(config)]
    over = [(spec, peak) for spec, peak in peaks if peak > budget]
    here = f"the {memory / GIB:.1f} GiB per GPU here less {config.headroom:.0%} headroom"
    headline = [(s, p) for s, p in over if s.layout in (config.parallel[0], "fsdp:torch")]
    if headline:
        return f"bench-plan predicts {_named(headline)} above {here}", config, None
    if not over:
        return None, config, None
    dropped = {spec.layout for spec, _ in over}
    kept = tuple(layout for layout in config.parallel if layout not in dropped)
    note = f"Left out of the preset: {_named(over)}, which bench-plan predicts above {here}."
    return None, replace(config, parallel=kept), note


# ---- the command line ------------------------------------------------------------------------


def _run(config: StepConfig | None, cli: Invocation) -> Run:
    left_out = None  # the preset's rows predicted not to fit (`_preset_fit`)
    if cli.args.preset:
        missing, config, left_out = _preset_fit(config, cli.args.preset, cli.device)
        if missing is not None:
            preset = PRESETS[cli.args.preset]
            ranks = PRESETS["leaderboard-2026"]["nproc"]
            if _num_gpus(cli.device) >= ranks:
                instead = f"on these {ranks} GPUs, the leaderboard's ranks and layouts"
            else:
                instead = "on one GPU, batch 1: one GPU's share of the leaderboard's batch"
            batch = preset["batch"] * preset["nproc"]
            cli.parser.exit(
                1,
                f"bench-step: --preset {cli.args.preset} runs the handout's leaderboard step "
                f"(8B, context 32,768, batch {batch} over {preset['nproc']} ranks, "
                f"{preset['precision']}), but {missing}.\n"
                "Run the depth-reduced leaderboard model instead (the most blocks that fit, "
                f"{instead}):\n\n  {depth_reduced_command(cli.device)}\n",
            )
        if left_out is not None:
            print(f"bench-step: {left_out}", file=sys.stderr)
    with usage_errors(cli.parser):
        run = run_step(config, device=cli.device, command=cli.command, timeout=cli.args.timeout)
    if left_out is not None:
        run.notes.append(left_out)
    return run


TOOL = Tool(run=_run, config=StepConfig, preset=step_given, plot=plot_step)
