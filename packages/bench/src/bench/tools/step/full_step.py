"""One full training step of `lmcore.TransformerLM` on one rank: built, timed, instrumented.

The step is the CS336 2026 leaderboard's `train_step`: `optimizer.zero_grad(set_to_none=True)`,
the forward with the mean next-token cross-entropy, `loss.backward()`, the AdamW step. A
`StepSpec` names the model and how the step runs it, in two flavours:

- `ours`: lmcore's model with the shared model options (`bench.core.model_options`): attention
  backend, loss, optimizer (its moments in the parameters' dtype, as torch's AdamW keeps them),
  activation checkpointing, `torch.compile` of each block; on several ranks a layout of ours
  (`bench.core.parallel`): `zero1` (`ddp.DDPBucketed` with `zero.ShardedOptimizer`) or `fsdp`
  (`zero.apply_fsdp`: a unit per block, the embedding and the head; each unit compiled).
- `torch-native`: the same model as a torch user would run it (`bench.core.torch_native`): SDPA,
  the same checkpointed segments, a compiled chunked cross-entropy, `torch.optim.AdamW(fused=
  True)`, each block compiled, and torch's FSDP2 on several ranks.

`measure_step(spec, rank=, device=)` builds the step, times its first call (compilation
included), then its steady state (`triton.testing.do_bench` on one rank, the leaderboard's
method; on several ranks a number of steps every rank agrees on, so their collectives pair up:
two steps whose slowest rank sets the step time, counted as warm-up, then more warm-up steps to
fill `warmup_ms`, then `max(3, rep_ms / step)` timed steps), then one more step read at its
phase boundaries (`bench.tools.step.memory`), with `profile=DIR` one more under torch.profiler
(`bench.tools.step.profile`), and last, with the model gone, the attention backend alone at the
step's shape. `step_flops` counts the step's FLOPs for MFU.

Example::

    spec = StepSpec(lmcore.model_config("small", context_length=512), batch=8,
                    precision="bf16-autocast", loss="fused", optimizer="torch-fused",
                    activation_checkpointing="blocks", warmup_ms=25, rep_ms=100)
    numbers = measure_step(spec, rank=0, device=torch.device("cuda"))
    statistics.median(numbers["times"])  # ms per step
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import lmcore
from bench.core.hardware import MEASURED_MATMUL_TFLOPS, find_gpu
from bench.core.layouts import (
    DTYPES,
    LAYOUTS,
    PRECISIONS,
    autocast_dtype,
    check_combination,
    compute_dtype,
    loss_scaled,
    planned_precision,
)
from bench.core.loss_scale import LossScaler
from bench.core.memory import free_memory, tensor_bytes
from bench.core.model_options import COMPILE_BACKENDS, DEFAULT_COMPILE_BACKEND, LOSSES, OPTIMIZERS
from bench.core.model_runtime import loss_function, next_token_loss, optimizer_class
from bench.core.parallel import Parallel
from bench.core.step import build_lm
from bench.core.timing import do_bench, elapsed_ms
from bench.core.training_bench import ADAMW_OPTIONS
from bench.tools.step.memory import PhaseMeter, breakdown
from bench.tools.step.profile import PhaseRanges, profile_step

__all__ = [
    "IMPLS",
    "NATIVE_ATTENTION",
    "NATIVE_LOSS",
    "NATIVE_OPTIMIZER",
    "StepSpec",
    "matmul_ceiling",
    "measure_step",
    "step_flops",
]

IMPLS = ("ours", "torch-native")
# Ours: the model alone on one rank, and every layout of ours on several.
_OURS = tuple(name for name, layout in LAYOUTS.items() if layout.runs and layout.ours)
# The torch-native step's choices: torch's own.
NATIVE_ATTENTION = "sdpa"
NATIVE_LOSS = "chunked"
NATIVE_OPTIMIZER = "torch-fused"
# Seeds of the random tokens: each rank its own batch, as in data-parallel training.
_DATA_SEED = 1000
# The attention alone is timed with at most these do_bench budgets (ms): it is a small part of
# the row's time, and its shape is fixed.
_ATTENTION_BUDGET_MS = (25.0, 100.0)
# On several ranks: steps whose slowest rank's median sets the step time the counts are taken
# from (they are warm-up steps too), and the fewest timed steps (a median of three).
_ESTIMATE_STEPS = 2
_MIN_TIMED_STEPS = 3


@dataclass(frozen=True)
class StepSpec:
    """One row's step: the model and how the step runs it; validated on construction.

    Args:
        model: the model (the torch-native step's attention is SDPA).
        batch: sequences per rank, each `model.context_length` tokens.
        impl: `ours` or `torch-native`.
        precision: a runnable precision of `bench.core.layouts.PRECISIONS`.
        loss: `materialized` or `fused` (ours; the torch-native step's is `chunked`).
        optimizer: from `bench.core.model_options.OPTIMIZERS` (the torch-native step's is
            `torch-fused`).
        activation_checkpointing: an lmcore spec, for both.
        compile: `torch.compile` (ours: each block, under `zero.FSDP` each unit; torch-native:
            each block and the loss).
        compile_backend: `torch.compile`'s backend (`bench.core.model_options.COMPILE_BACKENDS`).
        world_size: ranks in the default process group (1: none).
        parallel: ours' layout (`bench.core.layouts`): `single` on one rank, one of ours on
            several (the torch-native step runs FSDP2 there).
        warmup_ms, rep_ms: the timing's warm-up and measurement budgets.

    Raises:
        ValueError: an unknown name, or options that do not go together.
    """

    model: lmcore.ModelConfig
    batch: int
    impl: str = "ours"
    precision: str = "fp32"
    loss: str = "materialized"
    optimizer: str = "lmcore"
    activation_checkpointing: str = "none"
    compile: bool = False
    compile_backend: str = DEFAULT_COMPILE_BACKEND
    world_size: int = 1
    parallel: str = "single"
    warmup_ms: float = 25.0
    rep_ms: float = 100.0

    def __post_init__(self) -> None:
        native = self.impl == "torch-native"
        choices = (
            ("impl", self.impl, IMPLS),
            ("precision", self.precision, tuple(PRECISIONS)),
            ("loss", self.loss, (NATIVE_LOSS,) if native else LOSSES),
            ("optimizer", self.optimizer, (NATIVE_OPTIMIZER,) if native else OPTIMIZERS),
            ("parallel", self.parallel, _OURS),
            ("compile_backend", self.compile_backend, COMPILE_BACKENDS),
        )
        for name, value, allowed in choices:
            if value not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")
        if native and self.model.attention != NATIVE_ATTENTION:
            raise ValueError(f"the torch-native step runs {NATIVE_ATTENTION}: build its model so")
        lmcore.ActivationCheckpointing.parse(self.activation_checkpointing)
        if min(self.batch, self.world_size) < 1 or not (self.warmup_ms > 0 and self.rep_ms > 0):
            raise ValueError(f"batch, world_size and the budgets must be positive: {self}")
        if (self.world_size > 1) != (self.parallel != "single"):
            raise ValueError(
                f"{self.world_size} ranks with parallel {self.parallel!r}: several ranks need "
                "a layout of ours, and those need several ranks"
            )
        if not native:
            check_combination(self.parallel, self.precision)

    @property
    def layout(self) -> str:
        """The layout the step runs (`bench.core.layouts`): ours', or on several ranks FSDP2
        for the torch-native step."""
        if self.impl == "torch-native" and self.world_size > 1:
            return "fsdp:torch"
        return self.parallel

    @property
    def label(self) -> str:
        """The row's name in file names: impl, layout, attention, loss, optimizer and
        checkpointing (a colon written as -)."""
        parts = (self.impl, self.layout, self.model.attention, self.loss, self.optimizer)
        return "_".join((*parts, self.activation_checkpointing)).replace(":", "-")

    @property
    def moment_dtype(self) -> str:
        """AdamW's moments' dtype (`fp32`, `bf16`): the parameters', for every optimizer
        (lmcore's fused one is given `moment_dtype` for bf16 parameters, as torch's keeps)."""
        return PRECISIONS[self.precision].weights

    @property
    def plan_precision(self) -> str:
        """bench-plan's name of the precision (FSDP under autocast: `bf16-master`)."""
        return planned_precision(self.precision, self.layout)


@dataclass
class _Step:
    """A built step: the leaderboard's `train_step`, with optional marks at its phase ends."""

    module: torch.nn.Module
    optimizer: torch.optim.Optimizer
    forward: Callable[[], torch.Tensor]
    autocast: Callable[[], contextlib.AbstractContextManager]
    before: Callable[[], None] = lambda: None
    after_backward: Callable[[], None] = lambda: None
    mark: Callable[[str], None] = lambda phase: None
    loss_scaler: LossScaler | None = None  # fp16: the loss scaled, the optimizer step checked

    def __call__(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.before()
        with self.autocast():
            loss = self.forward()
        self.mark("forward")
        scaler = self.loss_scaler
        (loss if scaler is None else scaler.scale(loss)).backward()
        self.after_backward()
        self.mark("backward")
        if scaler is None:
            self.optimizer.step()
        else:
            scaler.unscale_(self.optimizer)
            scaler.step(self.optimizer)
            scaler.update()
        self.mark("optimizer")


def _build(spec: StepSpec, rank: int, device: torch.device) -> _Step:
    """The step's model (built on the meta device, materialised on `device`), its wrappers,
    optimizer and batch."""
    model_config = spec.model
    model = build_lm(model_config, device, seed=0)
    lmcore.apply_activation_checkpointing(model, policy=spec.activation_checkpointing)
    g = torch.Generator().manual_seed(_DATA_SEED + rank)
    shape = (spec.batch, model_config.context_length)  # (batch, seq) token ids
    x = torch.randint(model_config.vocab_size, shape, generator=g).to(device)
    y = torch.randint(model_config.vocab_size, shape, generator=g).to(device)
    autocast_to = autocast_dtype(spec.precision)
    scaler = LossScaler(device) if loss_scaled(spec.precision) else None
    compiled = {"compile": spec.compile, "compile_backend": spec.compile_backend}

    def autocast() -> contextlib.AbstractContextManager:
        return torch.autocast(device.type, dtype=autocast_to, enabled=autocast_to is not None)

    if spec.impl == "torch-native":
        from bench.core.torch_native import (
            TorchNativeLM,
            fully_shard_blocks,
            torch_native_model,
        )

        if PRECISIONS[spec.precision].weights == "bf16":
            model = model.to(torch.bfloat16)
        if spec.world_size > 1:
            native = TorchNativeLM(model, **compiled)
            fully_shard_blocks(
                native, model.layers, param_dtype=autocast_to, **compiled,
                reduce_dtype=torch.float32 if scaler is not None else None,  # as `Parallel`'s
            )  # fmt: skip
        else:
            native = torch_native_model(model, **compiled)
        cls, path = optimizer_class(NATIVE_OPTIMIZER)
        optimizer = cls(native.parameters(), **ADAMW_OPTIONS, **path)
        return _Step(native, optimizer, lambda: native(x, y), autocast, loss_scaler=scaler)
    fused = spec.loss == "fused"
    loss_fn = loss_function(compile=spec.compile and not fused, backend=spec.compile_backend)
    parallel = Parallel(spec.parallel, device=device, precision=spec.precision, **compiled)
    wrapped = parallel.wrap(model)
    cls, path = optimizer_class(spec.optimizer, param_dtype=DTYPES[spec.moment_dtype])
    optimizer = parallel.build_optimizer(wrapped.parameters(), cls, {**ADAMW_OPTIONS, **path})
    return _Step(
        wrapped,
        optimizer,
        lambda: next_token_loss(wrapped, x, y, fused=fused, loss_fn=loss_fn),
        autocast,
        before=getattr(wrapped, "on_train_batch_start", lambda: None),
        after_backward=getattr(wrapped, "finish_gradient_synchronization", lambda: None),
        loss_scaler=scaler,
    )


def _agreed_steps(step: _Step, spec: StepSpec, device: torch.device) -> list[float]:
    """Step times (ms) on several ranks: counts from the slowest rank's estimate, the same on
    every rank, so that their collectives pair up. The estimating steps warm up too; for a step
    of seconds the window is those two and `_MIN_TIMED_STEPS` timed ones."""
    estimate = torch.tensor(
        [statistics.median(elapsed_ms(step, device=device)[1] for _ in range(_ESTIMATE_STEPS))],
        device=device,
    )
    dist.all_reduce(estimate, op=dist.ReduceOp.MAX)
    per_step = max(estimate.item(), 1e-3)
    for _ in range(int(spec.warmup_ms / per_step) - _ESTIMATE_STEPS):
        step()
    repeats = min(1000, max(_MIN_TIMED_STEPS, int(spec.rep_ms / per_step)))
    return [elapsed_ms(step, device=device)[1] for _ in range(repeats)]


@contextlib.contextmanager
def _phase_hooks(
    step: _Step, *, start: Callable[[], None], mark: Callable[[str], None]
) -> Iterator[None]:
    """Within the block, `step` calls `start()` after its own set-up (after `zero_grad`: the
    step's work starts there) and `mark(phase)` as each phase ends; its hooks are restored
    after."""
    setup, marks = step.before, step.mark

    def before() -> None:
        setup()
        start()

    step.before, step.mark = before, mark
    try:
        yield
    finally:
        step.before, step.mark = setup, marks


def _instrumented(step: _Step, device: torch.device) -> tuple[dict[str, Any], dict[str, float]]:
    """One more step, read at its phase boundaries: its memory split and its phases' times."""
    meter = PhaseMeter(device)
    params = list(step.module.parameters())
    grads: list[int] = []

    def mark(phase: str) -> None:
        meter.mark(phase)
        if phase == "backward":
            grads.append(tensor_bytes((p.grad for p in params), device))

    with _phase_hooks(step, start=meter.start, mark=mark):
        step()
    inner = getattr(step.optimizer, "local_optimizer", step.optimizer)  # ZeRO-1: this rank's
    state = tensor_bytes((v for s in inner.state.values() for v in s.values()), device)
    readings = meter.readings()
    split = breakdown(readings, params=tensor_bytes(params, device), grads=grads[0], state=state)
    return asdict(split), dict(readings.times_ms)


def _profiled(
    step: _Step, spec: StepSpec, rank: int, device: torch.device, directory: Path
) -> list[dict[str, Any]]:
    """One more step under torch.profiler, its phases marked (`bench.tools.step.profile`)."""
    ranges = PhaseRanges(device)
    with _phase_hooks(step, start=ranges.start, mark=ranges.mark):
        return profile_step(step, directory=directory, row=spec.label, rank=rank, device=device)


def _timed(spec: StepSpec, rank: int, device: torch.device, profile: Path | None) -> dict[str, Any]:
    """Build the step, time its first call, its steady state and one instrumented step; with
    `profile`, one more under the profiler."""
    step = _build(spec, rank, device)
    _, first = elapsed_ms(step, device=device)
    if spec.world_size > 1:
        times = _agreed_steps(step, spec, device)
    else:
        times = do_bench(step, device=device, warmup_ms=spec.warmup_ms, rep_ms=spec.rep_ms)
    memory, phases = _instrumented(step, device)
    found = None if profile is None else _profiled(step, spec, rank, device, profile)
    return {
        "first_ms": first, "times": times, "phases": phases, "memory": memory, "profile": found,
    }  # fmt: skip


def _attention_ms(spec: StepSpec, device: torch.device) -> tuple[float, float] | None:
    """(forward, forward + backward) ms of the step's attention alone at its shape; None for a
    Triton backend off CUDA (its interpreter is far too slow to time)."""
    m = spec.model
    if device.type != "cuda" and m.attention == "fa2-triton":
        return None
    attend = lmcore.get_attention(m.attention)
    shapes = [(m.num_heads,), (m.kv_heads,), (m.kv_heads,)]
    q, k, v = (
        torch.randn(spec.batch, *heads, m.context_length, m.head_dim, device=device)
        .to(compute_dtype(spec.precision))
        .requires_grad_()
        for heads in shapes
    )  # (batch, heads, seq, head_dim)
    budget = {
        "warmup_ms": min(spec.warmup_ms, _ATTENTION_BUDGET_MS[0]),
        "rep_ms": min(spec.rep_ms, _ATTENTION_BUDGET_MS[1]),
    }
    fwd = do_bench(lambda: attend(q, k, v, causal=True), device=device, **budget)
    both = do_bench(
        lambda: attend(q, k, v, causal=True).sum().backward(),
        device=device,
        grad_to_none=[q, k, v],
        **budget,
    )
    return statistics.median(fwd), statistics.median(both)


def measure_step(
    spec: StepSpec, *, rank: int, device: torch.device, profile: Path | None = None
) -> dict[str, Any]:
    """One rank's numbers for one step (see the module docstring).

    Every rank of the default process group calls it (with `spec.world_size > 1`).

    Args:
        spec: the row's step.
        rank: this rank.
        device: this rank's device.
        profile: a directory: after the timed and instrumented steps, one more under
            torch.profiler, its trace and kernel table written there
            (`bench.tools.step.profile.profile_step`).

    Returns:
        `first_ms` (the first step, compilation included), `times` (ms per timed step),
        `phases` (ms of forward, backward, optimizer in the instrumented step), `memory`
        (`bench.tools.step.memory.MemoryBreakdown` as a dict, bytes), `profile` (this rank's
        `bench.tools.step.profile` rows, or None), `attention` ((forward, forward + backward)
        ms of the attention alone, or None).

    Raises:
        torch.OutOfMemoryError: the step does not fit (callers make it a row's status).
    """
    free_memory(device)
    torch.compiler.reset()  # each step compiles its own graphs
    measured = _timed(spec, rank, device, profile)
    free_memory(device)  # the model is gone: time the attention alone
    torch.compiler.reset()
    return {**measured, "attention": _attention_ms(spec, device)}


def step_flops(model: lmcore.ModelConfig, batch: int) -> tuple[int, int]:
    """(all, attention) FLOPs of one rank's step of `batch` full-length sequences.

    lmcore's count (`lmcore.training_flops`: matmuls only, forward + backward = 3× forward) with
    causal attention's score matmuls counted over half the T × T square, the work a causal
    kernel does; recomputation is not counted.
    """
    seq = model.context_length
    full = lmcore.training_flops(model, batch_size=batch, seq_len=seq)
    # lmcore counts q·kᵀ and softmax·v as 4·L·T·d per token over the whole square
    square = 3 * batch * seq * 4 * model.num_layers * seq * model.d_model
    return full - square // 2, square // 2


def matmul_ceiling(device_name: str, fmt: str) -> tuple[float, str] | None:
    """The matmul rate MFU is taken against: `(TFLOP/s, where it comes from)`, or None.

    The rate measured on this project's GPUs (`MEASURED_MATMUL_TFLOPS`, by the GPU's short
    name) where there is one for `fmt`, else the data sheet's dense peak (as
    `bench.core.hardware.peak_tflops`); None for a device in neither table.
    """
    gpu = find_gpu(device_name)
    if gpu is None:
        return None
    measured = MEASURED_MATMUL_TFLOPS.get(gpu.name, {}).get(fmt)
    if measured is not None:
        return measured, f"measured {fmt} matmul ceiling of the {gpu.name}"
    peak = gpu.peaks.get(fmt)
    return None if peak is None else (peak, f"data-sheet dense {fmt} peak")
