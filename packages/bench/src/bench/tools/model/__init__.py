"""bench-model's measurement: end-to-end timing of `lmcore.TransformerLM` (the handout's §1.1.3
to §1.1.6), as `run_model(config)` and `run_warmup_study(config)`, and the `TOOL` its command runs.

What each mode measures and the command line: `bench.commands.model` (`bench-model --help`).
Beside it, what only bench-model uses: `residuals` (what one block saves for backward, by
operation: `--study residuals`) and `timeline` (a memory snapshot drawn as a timeline:
`--memory-snapshot`).
"""

from __future__ import annotations

import contextlib
import itertools
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from bench.commands.model import COMPILE, MODES, WARMUP_STUDY, ModelBenchConfig, shapes_given
from bench.core.env import device_name
from bench.core.hardware import matmul_format, peak_tflops
from bench.core.layouts import autocast_dtype, compute_dtype
from bench.core.memory import (
    free_memory,
    memory_in_use,
    peak_memory,
    recording_memory,
    reset_peak_memory,
    to_mib,
)
from bench.core.model_options import (
    DEFAULT_CHECKPOINTING,
    DEFAULT_LOSS,
    with_depth,
)
from bench.core.model_runtime import build_optimizer, next_token_loss
from bench.core.oom import guarded
from bench.core.plots import bar_plot
from bench.core.results import Keys, Run, load_json
from bench.core.shapes import Shape
from bench.core.timing import elapsed_ms, summarize
from bench.core.tool import (
    Invocation,
    Tool,
    as_device,
    config_or_default,
    device_config,
    progress,
)
from bench.tools.model.annotated import annotated_attention
from bench.tools.model.profile import (
    PROFILE_COLUMNS,
    PROFILE_KEYS,
    AttentionShape,
    profiled,
    save_profile,
)
from bench.tools.model.residuals import run_residual_study
from bench.tools.model.timeline import render_memory_snapshot
from ddp import nvtx_range
from lmcore import (
    MODEL_SIZES,
    ModelConfig,
    TransformerLM,
    apply_activation_checkpointing,
    count_parameters,
    cross_entropy,
    forward_flops,
    training_flops,
)

__all__ = [
    "KEYS",
    "MODES",
    "PROFILE_COLUMNS",
    "PROFILE_KEYS",
    "TOOL",
    "ModelBenchConfig",
    "config_argv",
    "plot_model",
    "run_model",
    "run_warmup_study",
]


@dataclass(frozen=True)
class _Cell:
    shape: Shape
    context_length: int
    attention: str
    compile: bool
    dtype: str
    mode: str
    checkpointing: str | None = None  # the training modes only
    loss: str | None = None
    optimizer: str | None = None  # the train step only

    @property
    def label(self) -> str:
        name, size = self.shape
        named = MODEL_SIZES.get(name)
        reduced = named not in (None, size) and with_depth(named, size.num_layers) == size
        depth = [f"{size.num_layers}L"] if reduced else []  # a depth-reduced named size
        parts = [name, *depth, f"ctx{self.context_length}", self.mode, self.dtype]
        parts += [self.attention] + (["compiled"] if self.compile else [])
        defaults = (None, DEFAULT_CHECKPOINTING, DEFAULT_LOSS, "lmcore")
        options = (self.checkpointing, self.loss, self.optimizer)
        return "_".join(parts + [o.replace(":", "") for o in options if o not in defaults])


def _cells(config: ModelBenchConfig) -> list[_Cell]:
    """Every combination; the options a mode does not use are None there (so it runs once)."""
    shapes = [(name, with_depth(size, config.num_layers)) for name, size in config.shapes]
    cells = []
    for shape, ctx, attention, compiled, dtype, mode, spec, loss, optimizer in itertools.product(
        shapes,
        config.context_lengths,
        config.attention,
        config.compile,
        config.dtypes,
        config.modes,
        config.activation_checkpointing,
        config.loss,
        config.optimizer,
    ):
        training = mode != "forward"
        cells.append(
            _Cell(
                shape,
                ctx,
                attention,
                compiled,
                dtype,
                mode,
                spec if training else None,
                loss if training else None,
                optimizer if mode == "train-step" else None,
            )
        )
    return list(dict.fromkeys(cells))


def _vocab_size(cell: _Cell, config: ModelBenchConfig) -> int:
    """The cell's vocabulary: the configuration's, else its size's own."""
    return config.vocab_size or cell.shape[1].vocab_size


def _measure(
    cell: _Cell,
    config: ModelBenchConfig,
    device: torch.device,
    *,
    snapshot: Path | None,
    profile: Path | None,
    profile_rows: list[dict],
) -> dict[str, Any]:
    """Build the cell's model, warm it up, time `config.steps` steps; the row's metrics."""
    ranges = config.nvtx or profile is not None  # a profile reports time per range
    attention = annotated_attention(cell.attention) if ranges else cell.attention
    size = cell.shape[1]
    vocab_size = _vocab_size(cell, config)
    with torch.device(device):
        model = TransformerLM(
            vocab_size,
            cell.context_length,
            size.d_model,
            size.num_layers,
            size.num_heads,
            size.d_ff,
            attention=attention,
            num_kv_heads=config.num_kv_heads,
        )
    model_config = model.config
    if cell.checkpointing is not None:
        apply_activation_checkpointing(model, policy=cell.checkpointing)
    if cell.compile:
        torch.compiler.reset()  # a fresh cache per cell: no recompilation limit across a sweep
        model = torch.compile(model)
    optimizer = None
    if cell.optimizer is not None:
        optimizer = build_optimizer(cell.optimizer, model.parameters())
    shape = (config.batch, cell.context_length)
    x = torch.randint(0, vocab_size, shape, device=device)  # (batch, seq) token ids
    y = torch.randint(0, vocab_size, shape, device=device)  # next-token targets
    autocast_to = autocast_dtype(cell.dtype)

    def autocast() -> contextlib.AbstractContextManager:
        if autocast_to is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=autocast_to)

    phases: dict[str, Any] = {}  # the first timed step's memory by phase (memory study)
    read_phases = False

    def region(name: str, fn: Any) -> tuple[Any, float]:
        with nvtx_range(name, enabled=ranges):
            value, ms = elapsed_ms(fn, device=device)
        if read_phases:
            _read_phase(phases, name, device)
        return value, ms

    def step() -> dict[str, float]:
        if cell.mode == "forward":
            with torch.no_grad(), autocast():
                _, fwd = region("forward", lambda: model(x))
            return {"fwd": fwd}

        def forward() -> torch.Tensor:
            with autocast():
                fused = cell.loss == "fused"
                return next_token_loss(model, x, y, fused=fused, loss_fn=cross_entropy)

        loss, fwd = region("forward", forward)
        _, bwd = region("backward", loss.backward)
        times = {"fwd": fwd, "bwd": bwd}
        if optimizer is not None:
            _, times["opt"] = region("optimizer", optimizer.step)
        model.zero_grad(set_to_none=True)
        return times

    with nvtx_range("warmup", enabled=ranges):
        for _ in range(config.warmup):
            step()
    reset_peak_memory(device)
    samples = []
    shape = AttentionShape(config.batch, size.num_heads, cell.context_length, model_config.head_dim)
    with (
        recording_memory(snapshot, device),
        profiled(profile, cell.label, device, profile_rows, attention=shape),
    ):
        for i in range(config.steps):
            read_phases = snapshot is not None and i == 0
            if read_phases:
                phases["start_mib"] = to_mib(memory_in_use(device))
            with nvtx_range(f"step {i}", enabled=ranges):
                samples.append(step())
            read_phases = False
    plain = {}
    if profile is not None:  # one more step without the profiler: its cost, by difference
        times = step()
        plain = {"plain_fwd_ms": times["fwd"], "plain_step_ms": sum(times.values())}
    return {**_metrics(samples, cell, config, model_config, device), **phases, **plain}


# A memory study's phase readings (`_read_phase`): what is allocated when each phase of the
# first timed step ends, and the phase during which that step's peak fell.
_PHASE_KEYS = {"forward": "fwd_end_mib", "backward": "bwd_end_mib", "optimizer": "opt_end_mib"}
PHASE_METRICS = ["start_mib", *_PHASE_KEYS.values(), "peak_phase"]
# A profile run's one step after the profiled ones, timed without the profiler.
PLAIN_METRICS = ["plain_fwd_ms", "plain_step_ms"]


def _read_phase(phases: dict[str, Any], name: str, device: torch.device) -> None:
    """Record the memory allocated as phase `name` ends, and move `peak_phase` to `name` when
    the running peak (`max_memory_allocated`, reset before the step) grew during it."""
    phases[_PHASE_KEYS[name]] = to_mib(memory_in_use(device))
    peak = to_mib(peak_memory(device))
    if peak is not None and peak > phases.get("_peak", -1.0):
        phases["_peak"], phases["peak_phase"] = peak, name


def _without_private(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if not k.startswith("_")}


def _metrics(
    samples: list[dict[str, float]],
    cell: _Cell,
    config: ModelBenchConfig,
    model_config: ModelConfig,
    device: torch.device,
) -> dict[str, Any]:
    steps = [sum(s.values()) for s in samples]
    step = summarize(steps)
    row: dict[str, Any] = {}
    for key in ("fwd", "bwd", "opt"):
        if key in samples[0]:
            s = summarize([sample[key] for sample in samples])
            row[f"{key}_ms"], row[f"{key}_std"] = s.mean, s.std
    tokens = config.batch * cell.context_length
    count = forward_flops if cell.mode == "forward" else training_flops
    flops = count(model_config, batch_size=config.batch, seq_len=cell.context_length)
    fmt = matmul_format(compute_dtype(cell.dtype))
    peak = peak_tflops(device_name(device), fmt) if device.type == "cuda" else None
    row.update(
        step_ms=step.mean,
        step_std=step.std,
        first_step_ms=steps[0],
        tokens_per_s=tokens / (step.mean * 1e-3),
        mfu=flops / (step.mean * 1e-3) / (peak * 1e12) if peak else None,
        mfu_peak_tflops=peak,
        peak_mib=to_mib(peak_memory(device)),
        n=len(steps),
    )
    return row


# Set by the training modes (None in a forward row), after the model's other choices.
_OPTION_COLUMNS = ("activation_checkpointing", "loss", "optimizer")
COLUMNS = [
    "size",
    "ctx",
    "mode",
    "dtype",
    "attention",
    "compiled",
    *_OPTION_COLUMNS,
    "fwd_ms",
    "fwd_std",
    "bwd_ms",
    "bwd_std",
    "opt_ms",
    "step_ms",
    "step_std",
    "first_step_ms",
    "tokens_per_s",
    "mfu",
    "peak_mib",
    "params_m",
    "status",
]

_METRICS = [
    "fwd_ms",
    "fwd_std",
    "bwd_ms",
    "bwd_std",
    "opt_ms",
    "opt_std",
    "step_ms",
    "step_std",
    "first_step_ms",
    "tokens_per_s",
    "mfu",
    "mfu_peak_tflops",
    "peak_mib",
    "n",
]
# Every key of a row (a warm-up study's too), for readers (bench-report).
KEYS = Keys(
    *COLUMNS,
    *_METRICS,
    *PHASE_METRICS,
    *PLAIN_METRICS,
    "study",
    "batch",
    "vocab_size",
    "context_length",
    "d_model",
    "num_layers",
    "num_heads",
    "d_ff",
    "num_kv_heads",
    "warmup",
)


def _per_cell_path(path: str | Path | None, cell: _Cell, num_cells: int) -> Path | None:
    """`path` itself for a single cell; `<stem>_<cell label><suffix>` when there are several."""
    if path is None:
        return None
    path = Path(path)
    if num_cells == 1:
        return path
    return path.with_name(f"{path.stem}_{cell.label}{path.suffix}")


def run_model(
    config: ModelBenchConfig | None = None,
    *,
    device: torch.device | str | None = None,
    memory_snapshot: str | Path | None = None,
    profile: str | Path | None = None,
    command: str | None = None,
    show_progress: bool = True,
) -> Run:
    """Time every configuration of `config` on `device`.

    Args:
        config: what to run; the device's default (`ModelBenchConfig`) when None.
        device: where to run; CUDA when available, else the CPU, when None.
        memory_snapshot: record the allocator over the timed steps and dump the pickle here
            (with a `.png` timeline beside it); CUDA only. Several configurations get one file
            each, named `<stem>_<configuration><suffix>`.
        profile: a directory: run the timed steps under `torch.profiler` and write there, per
            configuration, a Chrome trace (`<configuration>.pt.trace.json`) and the top-kernels
            table (`<configuration>_kernels.txt`), and for all of them `<directory name>.json`
            (a `Run` of tool `profile`: time per range and the top kernels, `PROFILE_COLUMNS`).
        command: the command line to record; the process's own when None.
        show_progress: draw a progress bar on stderr.

    Returns:
        A `Run` (tool `"model"`): one row per configuration with times (ms), tokens/s, MFU,
        peak memory (MiB), parameter count (millions) and `status`.
    """
    device = as_device(device)
    config, notes = config_or_default(
        config,
        device,
        cls=ModelBenchConfig,
        tool="bench-model",
        describe=lambda c: (
            f"{c.shapes[0][1].num_layers} layers of width {c.shapes[0][1].d_model}, "
            f"context {c.context_lengths[0]}, batch {c.batch}"
        ),
    )
    if config.nvtx and device.type != "cuda":
        notes.append("--nvtx has no effect without CUDA.")
    cells = _cells(config)
    rows: list[dict[str, Any]] = []
    profile_rows: list[dict[str, Any]] = []
    profile = None if profile is None else Path(profile)
    snapshot_on = memory_snapshot is not None and device.type == "cuda"
    study = "memory" if memory_snapshot is not None else "profile" if profile else "timing"
    for cell in progress(cells, desc="bench-model", enabled=show_progress):
        snapshot = _per_cell_path(memory_snapshot, cell, len(cells)) if snapshot_on else None
        outcome = guarded(
            lambda c=cell, s=snapshot: _measure(
                c, config, device, snapshot=s, profile=profile, profile_rows=profile_rows
            ),
            device=device,
        )
        metrics = _without_private(outcome.value) if outcome.ok else None
        rows.append(_row(cell, config, metrics, outcome.status, study=study))
        free_memory(device)
        if outcome.ok and snapshot is not None:
            notes.append(_snapshot_note(snapshot, cell))
    if memory_snapshot is not None and not snapshot_on:
        notes.append("No memory snapshot: recording the allocator's history needs CUDA.")
    if profile is not None:
        notes.append(
            f"The timed steps ran under torch.profiler, which slows them down; traces and "
            f"kernel tables in {profile}."
        )
        save_profile(
            profile,
            profile_rows,
            device=device,
            command=command,
            config=asdict(config),
            steps=config.steps,
            batch=config.batch,
        )
    peaks = {r["mfu_peak_tflops"] for r in rows if r.get("mfu_peak_tflops")}
    if peaks:
        notes.append(
            f"MFU assumes a dense peak of {', '.join(f'{p:g}' for p in sorted(peaks))} TFLOP/s "
            f"({device_name(device)}; matmul format per row's dtype)."
        )
    return Run.create(
        "model",
        rows,
        device=device,
        config=asdict(config),
        command=command,
        title=f"TransformerLM end to end, batch {config.batch}, "
        f"{config.warmup} warm-up + {config.steps} timed steps",
        columns=COLUMNS,
        notes=notes,
    )


def _snapshot_note(snapshot: Path, cell: _Cell) -> str:
    """Draw the snapshot's timeline beside it; one sentence on what it shows."""
    summary = render_memory_snapshot(snapshot, snapshot.with_suffix(".png"), title=cell.label)
    top = summary.largest[0]
    requested = f"{to_mib(summary.peak_requested_bytes):,.0f} MiB requested by tensors"
    peak = (
        f"{to_mib(summary.peak_allocated_bytes):,.0f} MiB allocated ({requested})"
        if summary.peak_allocated_bytes is not None
        else f"{requested}; block sizes not determined: {'; '.join(summary.problems)}"
    )
    return (
        f"Memory snapshot {snapshot} (timeline {summary.path}): peak {peak}, largest "
        f"allocation {to_mib(top.size):,.1f} MiB requested at {top.where}."
    )


def _row(
    cell: _Cell,
    config: ModelBenchConfig,
    metrics: dict[str, Any] | None,
    status: str,
    *,
    study: str = "timing",
) -> dict[str, Any]:
    """One configuration's row; `study` says what the run was for: `timing`, `memory` (with
    allocator snapshots) or `profile` (under torch.profiler)."""
    name, size = cell.shape
    dims = {
        "vocab_size": _vocab_size(cell, config),
        "context_length": cell.context_length,
        "d_model": size.d_model,
        "num_layers": size.num_layers,
        "num_heads": size.num_heads,
        "d_ff": size.d_ff,
        "num_kv_heads": config.num_kv_heads,
    }
    return {
        "size": name,
        "ctx": cell.context_length,
        "batch": config.batch,
        "mode": cell.mode,
        "dtype": cell.dtype,
        "attention": cell.attention,
        "compiled": cell.compile,
        "activation_checkpointing": cell.checkpointing,
        "loss": cell.loss,
        "optimizer": cell.optimizer,
        **dims,
        "params_m": _parameters(dims) / 1e6,
        **dict.fromkeys(_METRICS),  # every row has every key, whatever its mode or status
        **(metrics or {}),
        "warmup": config.warmup,
        "study": study,
        "status": status,
    }


def _parameters(dims: dict[str, int]) -> int:
    return count_parameters(ModelConfig(**dims))


def config_argv(config: ModelBenchConfig) -> list[str]:
    """Command-line arguments of `bench-model` that reproduce `config`."""
    named = [name for name, size in config.shapes if MODEL_SIZES.get(name) == size]
    custom = [(name, size) for name, size in config.shapes if MODEL_SIZES.get(name) != size]
    if len(custom) > 1 or (custom and config.num_layers is not None):
        raise ValueError(
            "the command line takes at most one shape of explicit dimensions, and then no "
            "depth override (its --num-layers is that shape's depth)"
        )
    argv = ["--size", *named] if named else []
    for name, s in custom:
        argv += ["--d-model", str(s.d_model), "--d-ff", str(s.d_ff)]
        argv += ["--num-layers", str(s.num_layers), "--num-heads", str(s.num_heads)]
        argv += ["--name", name]
    argv += ["--context-length", *map(str, config.context_lengths)]
    argv += ["--batch", str(config.batch)]
    for flag, value in (
        ("--vocab-size", config.vocab_size),
        ("--num-kv-heads", config.num_kv_heads),
        ("--num-layers", config.num_layers),
    ):
        argv += [] if value is None else [flag, str(value)]
    argv += ["--mode", *config.modes, "--precision", *config.dtypes]
    argv += ["--attention", *config.attention]
    argv += ["--activation-checkpointing", *config.activation_checkpointing]
    argv += ["--loss", *config.loss, "--optimizer", *config.optimizer]
    compiled = next(word for word, value in COMPILE.items() if set(value) == set(config.compile))
    argv += ["--compile", compiled]
    argv += ["--warmup", str(config.warmup), "--steps", str(config.steps)]
    return argv + (["--nvtx"] if config.nvtx else [])


WARMUP_COLUMNS = [
    "size",
    "ctx",
    "mode",
    "dtype",
    "warmup",
    "step_ms",
    "step_std",
    "first_step_ms",
    "status",
]


def run_warmup_study(
    config: ModelBenchConfig | None = None,
    *,
    warmups: Sequence[int] = WARMUP_STUDY,
    device: torch.device | str | None = None,
    command: str | None = None,
    show_progress: bool = True,
) -> Run:
    """Run `config` once per warm-up count, each in a fresh Python process; rows tagged `warmup`.

    A fresh process is the point: the first steps of a process pay for CUDA context creation,
    library handles (cuBLAS), kernel loading and allocator growth, which a process that already
    ran anything has paid for.

    Args:
        config: the configuration (its own `warmup` is replaced); the device's default when None.
        warmups: warm-up step counts (the handout's 0, 1, 2, 5).
        device: where to run; CUDA when available, else the CPU, when None.
        command: the command line to record; the process's own when None.
        show_progress: draw a progress bar on stderr.

    Returns:
        A `Run` (tool `"warmup"`) with the rows of every child run.

    Raises:
        RuntimeError: a child process failed (its stderr is in the message).
    """
    device = as_device(device)
    config = config if config is not None else device_config(ModelBenchConfig, device)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for w in progress(list(warmups), desc="warm-up study", enabled=show_progress):
            out = Path(tmp) / f"warmup{w}.json"
            argv = [*config_argv(replace(config, warmup=w)), "--device", str(device)]
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "bench",
                    "model",
                    *argv,
                    "--no-progress",
                    "--json",
                    str(out),
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            if proc.returncode != 0:
                raise RuntimeError(f"warm-up study child (warmup {w}) failed:\n{proc.stderr}")
            rows.extend(load_json(out).rows)
    return Run.create(
        "warmup",
        rows,
        device=device,
        config={**asdict(config), "warmups": list(warmups)},
        command=command,
        title=f"Warm-up study: {config.steps} timed steps after 0…{max(warmups)} warm-up steps, "
        "each in a fresh process",
        columns=WARMUP_COLUMNS,
        notes=["first_step_ms: the first timed step, which pays whatever the warm-up did not."],
    )


def plot_model(run: Run, path: Path) -> Path:
    """Mean step time per configuration: bars per size, one colour per mode (or warm-up)."""
    series = "warmup" if run.tool == "warmup" else "mode"
    several_backends = len({r.get("attention") for r in run.rows}) > 1

    def label(r: dict[str, Any]) -> str:
        parts = [r["size"], f"ctx{r['ctx']}", r["dtype"]]
        parts += [r["attention"]] if several_backends else []
        return " ".join(parts + (["compiled"] if r.get("compiled") else []))

    rows = [dict(r, configuration=label(r)) for r in run.rows]
    dtypes = "/".join(dict.fromkeys(r["dtype"] for r in run.rows))
    return bar_plot(
        rows,
        x="configuration",
        y="step_ms",
        series=series,
        path=path,
        ylabel="step (ms)",
        logy=True,
        title=f"{run.plot_title} ({dtypes})",
    )


def _run(config: ModelBenchConfig | None, cli: Invocation) -> Run:
    if cli.args.study == "residuals":
        config = config if config is not None else device_config(ModelBenchConfig, cli.device)
        return run_residual_study(
            config.shapes,
            context_lengths=config.context_lengths,
            batch=config.batch,
            dtypes=config.dtypes,
            attention=config.attention,
            device=cli.device,
            command=cli.command,
            config=asdict(config),
        )
    if cli.args.warmup_study is not None:
        return run_warmup_study(
            config,
            warmups=cli.args.warmup_study or WARMUP_STUDY,
            device=cli.device,
            command=cli.command,
            show_progress=cli.show_progress,
        )
    return run_model(
        config,
        device=cli.device,
        memory_snapshot=cli.args.memory_snapshot,
        profile=cli.args.profile,
        command=cli.command,
        show_progress=cli.show_progress,
    )


TOOL = Tool(run=_run, config=ModelBenchConfig, preset=shapes_given, plot=plot_model)
