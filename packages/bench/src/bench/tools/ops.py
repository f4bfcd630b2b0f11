"""bench-ops' measurement: lmcore's fused LM-head loss and fused AdamW against torch's best, op
by op, as `run_ops(config)`, and the `TOOL` its command runs.

The studies, the shapes and the command line: `bench.commands.ops` (`bench-ops --help`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import lmcore
from bench.commands.ops import (
    ADAMW_IMPLS,
    DTYPES,
    LOSS_IMPLS,
    LOSS_SHAPES,
    LossShape,
    OpsConfig,
)
from bench.core.env import device_name
from bench.core.memory import free_memory, memory_in_use, peak_memory, reset_peak_memory, to_mib
from bench.core.oom import OK, Unavailable, guarded
from bench.core.plots import bar_plot
from bench.core.results import Keys, Run
from bench.core.timing import summarize, time_fn
from bench.core.tool import Invocation, Tool, as_device, config_or_default, live_rows, progress

__all__ = [
    "ADAMW_IMPLS",
    "KEYS",
    "LOSS_IMPLS",
    "LOSS_SHAPES",
    "TOOL",
    "LossShape",
    "OpsConfig",
    "plot_ops",
    "run_ops",
]

LOSS_BASELINE = "compiled"
ADAMW_BASELINE = "torch-fused"


def _unfused(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(hidden @ weight.T, targets)


@functools.cache
def _compiled_unfused() -> Callable[..., torch.Tensor]:
    """One compiled function for the run; each new shape compiles once (static shapes)."""
    return torch.compile(_unfused, dynamic=False)


def _loss_fn(impl: str) -> Callable[..., torch.Tensor]:
    if impl == "fused":
        return lmcore.fused_linear_cross_entropy
    return _unfused if impl == "eager" else _compiled_unfused()


def _loss_inputs(
    shape: LossShape, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    size = lmcore.MODEL_SIZES[shape.size]
    g = torch.Generator(device=device).manual_seed(0)
    hidden = torch.randn(shape.tokens, size.d_model, device=device, generator=g).to(dtype)
    # logits of order one, as a trained model's: weights of std 1/√d
    weight = torch.randn(size.vocab_size, size.d_model, device=device, generator=g)
    weight = (weight / size.d_model**0.5).to(dtype)
    targets = torch.randint(0, size.vocab_size, (shape.tokens,), device=device, generator=g)
    return hidden.requires_grad_(), weight.requires_grad_(), targets


def _measure_loss(
    impl: str,
    inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    config: OpsConfig,
    device: torch.device,
) -> dict[str, Any]:
    hidden, weight, targets = inputs
    fn = _loss_fn(impl)

    def step() -> None:
        hidden.grad = weight.grad = None
        fn(hidden, weight, targets).backward()

    times = summarize(time_fn(step, device=device, warmup=config.warmup, repeats=config.steps))
    hidden.grad = weight.grad = None
    free_memory(device)
    base = memory_in_use(device)
    reset_peak_memory(device)
    step()
    peak = peak_memory(device)
    returned = hidden.numel() * hidden.element_size() + weight.numel() * weight.element_size()
    extra = None if peak is None or base is None else peak - base - returned
    hidden.grad = weight.grad = None
    return {
        "ms": times.mean,
        "std": times.std,
        "peak_mib": to_mib(peak),
        "extra_mib": to_mib(extra),
        "n": times.n,
    }


def _describe_loss(name: str, dtype: str) -> dict[str, Any]:
    shape = LOSS_SHAPES[name]
    size = lmcore.MODEL_SIZES[shape.size]
    logits = shape.tokens * size.vocab_size * DTYPES[dtype].itemsize
    return {
        "size": lmcore.describe_size(shape.size),
        "about": shape.about,
        "tokens": shape.tokens,
        "features": size.d_model,
        "vocab": size.vocab_size,
        "dtype": dtype,
        "logits_mib": to_mib(logits),
    }


# ---- the optimizer step --------------------------------------------------------------------


def _parameter_shapes(size: str) -> list[torch.Size]:
    with torch.device("meta"):
        model = lmcore.TransformerLM.from_size(size, context_length=128)
    return [p.shape for p in model.parameters()]


def _optimizer(impl: str, params: list[torch.Tensor]) -> torch.optim.Optimizer:
    options = {"lr": 1e-4, "weight_decay": 0.1}
    if impl == "torch-fused":
        return torch.optim.AdamW(params, fused=True, **options)
    if impl == "lmcore-fused":
        if params[0].device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise Unavailable("the fused kernel needs CUDA (or TRITON_INTERPRET=1 on a CPU)")
        return lmcore.AdamW(params, fused=True, **options)
    return lmcore.AdamW(params, foreach=params[0].is_cuda, **options)


def _measure_adamw(
    impl: str, params: list[torch.Tensor], config: OpsConfig, device: torch.device
) -> dict[str, Any]:
    optimizer = _optimizer(impl, params)
    times = summarize(
        time_fn(optimizer.step, device=device, warmup=config.warmup, repeats=config.steps)
    )
    del optimizer
    return {"ms": times.mean, "std": times.std, "n": times.n}


def _adamw_inputs(size: str, device: torch.device) -> list[torch.Tensor]:
    """Every parameter of `size`, float32 with a random gradient, on `device`."""
    g = torch.Generator(device=device).manual_seed(0)
    params = [torch.randn(s, device=device, generator=g) for s in _parameter_shapes(size)]
    for p in params:
        p.grad = torch.randn(p.shape, device=device, generator=g)
    return params


# ---- the sweep, ratios, the run ------------------------------------------------------------


def _sweep(
    study: str,
    cells: list[tuple[str, str]],
    *,
    prepare: Callable[[str], Any],
    measure: Callable[[str, Any], dict[str, Any]],
    describe: Callable[[str, Any], dict[str, Any]],
    metrics: Sequence[str],
    device: torch.device,
    show: Callable[[dict[str, Any]], None],
    show_progress: bool,
) -> list[dict[str, Any]]:
    """A row per (shape, implementation) cell: each shape's inputs built once (`prepare`),
    each measurement guarded, so that out of memory or `Unavailable` is its row's status."""
    rows = []
    inputs: dict[str, Any] = {}
    for shape, impl in progress(cells, desc=f"bench-ops {study}", enabled=show_progress):
        if shape not in inputs:
            inputs.clear()
            free_memory(device)
            inputs[shape] = prepare(shape)
        outcome = guarded(
            lambda impl=impl, shape=shape: measure(impl, inputs[shape]), device=device
        )
        free_memory(device)
        rows.append(
            {
                "study": study,
                "shape": shape,
                **describe(shape, inputs[shape]),
                "impl": impl,
                **(outcome.value if outcome.ok else dict.fromkeys(metrics)),
                "status": outcome.status,
            }
        )
        show(rows[-1])
    inputs.clear()
    free_memory(device)
    return rows


def _add_ratios(rows: list[dict[str, Any]]) -> None:
    """`vs_baseline`: the baseline's ms over this row's (above 1: faster); for the loss also
    `extra_vs_baseline` (extra memory over the baseline's) and `extra_vs_logits`."""
    baselines = {"loss": LOSS_BASELINE, "adamw": ADAMW_BASELINE}
    base = {
        (r["study"], r["shape"]): r
        for r in rows
        if r["impl"] == baselines[r["study"]] and r["status"] == OK
    }
    for row in rows:
        ref = base.get((row["study"], row["shape"]))
        ok = row["status"] == OK and ref is not None
        row["vs_baseline"] = ref["ms"] / row["ms"] if ok and row["ms"] else None
        if row["study"] != "loss":
            continue
        extra, ref_extra = row.get("extra_mib"), ref.get("extra_mib") if ref else None
        row["extra_vs_baseline"] = extra / ref_extra if ok and extra and ref_extra else None
        logits = row["logits_mib"]
        row["extra_vs_logits"] = extra / logits if extra is not None and logits else None


_LOSS_METRICS = ["ms", "std", "peak_mib", "extra_mib", "n"]
_ADAMW_METRICS = ["ms", "std", "n"]
COLUMNS = [
    "study",
    "shape",
    "size",
    "about",
    "tokens",
    "params",
    "impl",
    "ms",
    "std",
    "vs_baseline",
    "peak_mib",
    "extra_mib",
    "extra_vs_baseline",
    "extra_vs_logits",
    "logits_mib",
    "n",
    "status",
]
_LIVE_COLUMNS = ["study", "shape", "impl", "ms", "peak_mib", "extra_mib", "status"]
# Every key of a row, for readers (bench-report).
KEYS = Keys(*COLUMNS, "features", "vocab", "dtype")


def run_ops(
    config: OpsConfig | None = None,
    *,
    device: torch.device | str | None = None,
    command: str | None = None,
    show_progress: bool = True,
) -> Run:
    """Measure the studies of `config` on `device` and return the run.

    Args:
        config: what to measure; the device's default (`OpsConfig`) when None.
        device: where to run; CUDA when available, else the CPU, when None.
        command: the command line to record; the process's own when None.
        show_progress: draw a progress bar on stderr.

    Returns:
        A `Run` (tool `"ops"`, grouped by `study`) whose rows have the keys of `COLUMNS`
        (ms per call, MiB; memory None off CUDA) and `status` (`ok`, `OOM`, `skipped: why`).

    Example::

        >>> run = run_ops(OpsConfig(studies=("adamw",), adamw_sizes=("tiny",),
        ...                         adamw_impls=("lmcore", "torch-fused"), steps=2),
        ...               device="cpu", show_progress=False)
        >>> [(r["impl"], r["status"]) for r in run.rows]
        [('lmcore', 'ok'), ('torch-fused', 'ok')]
    """
    device = as_device(device)
    config, notes = config_or_default(
        config,
        device,
        cls=OpsConfig,
        tool="bench-ops",
        describe=lambda c: f"loss at {c.loss_shapes}, AdamW over {c.adamw_sizes}",
    )
    notes.append(
        "Times are ms per call (mean and std over n timed calls after warm-up; the compiled "
        "baseline compiles during warm-up). vs_baseline: the baseline's time / this time "
        f"(above 1: faster; loss: {LOSS_BASELINE}, adamw: {ADAMW_BASELINE}). extra_mib: the "
        "peak beyond the inputs and the returned gradients; extra_vs_baseline: that over the "
        f"{LOSS_BASELINE} one's; extra_vs_logits: over the bytes of the materialised logits "
        "(logits_mib, tokens × vocabulary in the loss's dtype)."
    )
    sweep = functools.partial(
        _sweep, device=device, show=live_rows(_LIVE_COLUMNS, title="bench-ops"),
        show_progress=show_progress,
    )  # fmt: skip
    rows: list[dict[str, Any]] = []
    if "loss" in config.studies:
        rows += sweep(
            "loss",
            [(s, i) for s in config.loss_shapes for i in config.loss_impls],
            prepare=lambda name: _loss_inputs(LOSS_SHAPES[name], DTYPES[config.dtype], device),
            measure=lambda impl, inputs: _measure_loss(impl, inputs, config, device),
            describe=lambda name, _: _describe_loss(name, config.dtype),
            metrics=_LOSS_METRICS,
        )
    if "adamw" in config.studies:
        rows += sweep(
            "adamw",
            [(s, i) for s in config.adamw_sizes for i in config.adamw_impls],
            prepare=lambda size: _adamw_inputs(size, device),
            measure=lambda impl, params: _measure_adamw(impl, params, config, device),
            describe=lambda size, params: {
                "size": lmcore.describe_size(size),
                "params": sum(p.numel() for p in params),
                "dtype": "fp32",
            },
            metrics=_ADAMW_METRICS,
        )
    _add_ratios(rows)
    return Run.create(
        "ops",
        rows,
        device=device,
        config=asdict(config),
        command=command,
        title=f"Fused LM-head loss and fused AdamW against torch, {device_name(device)}",
        columns=COLUMNS,
        group_by="study",
        notes=notes,
    )


def plot_ops(run: Run, path: Path) -> Path:
    """ms per call, a group per shape and a bar per implementation, a panel per study."""
    return bar_plot(
        run.ok_rows,
        x="shape",
        y="ms",
        path=path,
        series="impl",
        panels="study",
        logy=True,
        ylabel="ms per call",
        title=run.plot_title,
    )


def _run(config: OpsConfig | None, cli: Invocation) -> Run:
    return run_ops(config, device=cli.device, command=cli.command, show_progress=cli.show_progress)


TOOL = Tool(run=_run, config=OpsConfig, plot=plot_ops)
