"""Per-device memory of training `lmcore.TransformerLM`, predicted without a GPU.

A `TrainingPlan` names the model, the batch, the precision, the parallel layout, activation
checkpointing, the loss and the optimizer; `estimate_memory(plan)` walks one training step and
returns the bytes alive on the busiest device at each moment that can be the peak:

- **forward end**: parameters, optimizer state, what the forward saved for backward, the loss's
  forward (the fused loss's gradients among it), autocast's cache of bf16 weights (until the
  autocast region ends), gathered weights;
- **backward, loss**: the loss's backward (logits' gradients; the fused loss's held gradients)
  on top of the saved activations;
- **backward, block i**: gradients of the blocks after i, the activations still saved (and those a
  checkpointed segment recomputed), the block's working set, in-flight communication buffers;
  the worst block is reported;
- **backward end**: every gradient;
- **optimizer step**: gradients, optimizer state and the optimizer's temporaries.

Each moment is a `Phase` of named `Term`s, each with the formula that gives it, so a table can
show the arithmetic beside the number. What is modelled, and what is not:

- Parameters, gradients and optimizer state: exact byte counts of the tensors (the parameter
  list comes from the model itself, `bench.plan.params`), sharded as each layout shards them:
  ZeRO-1 assigns whole parameters to ranks with `zero.partition_by_numel` (the busiest rank is
  reported), FSDP pads every weight to a multiple of the ranks as `zero.FSDP` does and keeps norm
  gains whole, tensor parallelism splits Megatron-style (`ParamSpec.tp_numel`). AdamW's moments
  are in the parameters' dtype (every optimizer bench runs keeps them so; float32 under
  `bf16-master`), unless the plan names their bytes (`moment_bytes`).
- FSDP's units (`bench.core.layouts.Layout.units`): each block always; the embedding and the LM
  head units of their own under `zero.FSDP` (each gathered around its own passes, the head's
  gradient reduce-scattered as the backward begins), in the root unit under FSDP2 (gathered from
  the forward to the end of the backward, the head's gradient held full-size until then).
  FSDP2's blocks follow torch's own schedule (`_fsdp2_block_buffers`): resharded after their
  forward, one block prefetched in the backward, one reduce-scatter input held.
- Activations: the residuals of `bench.plan.activations`, read off lmcore's eager code, or, for a
  plan whose blocks are compiled, what inductor's partition of a block keeps (measured on the
  CPU for fused attention kernels in fp32 and bf16; eager's elsewhere).
- Estimates, not exact: an eager block's backward working set (a compiled block's is read off
  inductor's code: `bench.plan.activations.block_backward_working_set`), the optimizer's
  temporaries (the foreach AdamW's `sqrt(v)` list, one moment's size; none for the fused ones),
  communication staging.
- Not modelled: the CUDA context, cuBLAS workspaces and the caching allocator's rounding; the
  measured check (`bench-plan --check`) states how large that remainder is.

Example::

    >>> config = lmcore.model_config("small", context_length=512)
    >>> plan = TrainingPlan(config, batch=8, precision="bf16-autocast")
    >>> estimate = estimate_memory(plan)
    >>> estimate.peak.name, estimate.peak.total / 2**30
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import ddp
import lmcore
from bench.core.layouts import LAYOUTS as ALL_LAYOUTS
from bench.core.layouts import PRECISIONS, Layout, Precision, layout_names, planned_precision
from bench.plan.activations import (
    PLAN_LOSSES,
    LossMemory,
    Residual,
    block_backward_working_set,
    block_residuals,
    combined_formula,
    compiled_residuals_known,
    head_residuals,
    kept_attention_residuals,
    loss_memory,
    residual_bytes,
    residual_stream_bytes,
    total_bytes,
)
from bench.plan.params import model_parameters

__all__ = [
    "CHECKPOINTING_FORMS",
    "LAYOUTS",
    "MODES",
    "OPTIMIZERS",
    "PRECISIONS",
    "Checkpointing",
    "MemoryEstimate",
    "Phase",
    "Term",
    "TrainingPlan",
    "estimate_memory",
]


# What bench-plan predicts: every layout of one family (`bench.core.layouts`) whose memory the
# model tells apart (our DDP wrappers but DDPBucketed keep their gradients as torch keeps them).
LAYOUTS = layout_names(exclude=("ddp:naive", "ddp:flat", "ddp:individual"))
MODES = ("train-step", "forward-backward", "forward")
# Optimizer implementations and their temporaries in units of one moment of the stepped
# parameters: the foreach AdamWs (lmcore's on CUDA, torch's default) build `sqrt(v)` as a new
# tensor list; the fused kernels update in place.
OPTIMIZERS: Mapping[str, int] = MappingProxyType(
    {"lmcore": 1, "lmcore-fused": 0, "torch-fused": 0, "torch": 1}
)
CHECKPOINTING_FORMS = lmcore.ActivationCheckpointing.FORMS


@dataclass(frozen=True)
class Checkpointing:
    """A parsed activation-checkpointing spec: which runs of blocks are recomputed, and how.

    `segments` are `(start, stop, kind)` runs covering the blocks in order: `plain` (saved as
    usual), `segment` (one checkpoint: only the run's input is saved; backward recomputes the
    run), `nested` (a checkpoint of per-block checkpoints: the run's input is saved; backward
    recomputes the run saving each block's input, then each block), `selective` (one block
    checkpointed inside its forward: its input and its attention output are saved; backward
    recomputes the rest of the block).
    """

    spec: str
    segments: tuple[tuple[int, int, str], ...]

    @classmethod
    def parse(cls, spec: str, num_layers: int) -> Checkpointing:
        """The runs of `spec` over `num_layers` blocks, as lmcore plans them.

        The grammar and the plan are lmcore's (`lmcore.ActivationCheckpointing.parse(spec)
        .plan(num_layers)`: a block index runs as it is, a tuple of indices is one checkpoint,
        a tuple of tuples a checkpoint of checkpoints), so that what is predicted is what
        `lmcore.apply_activation_checkpointing` applies.

        Raises:
            ValueError: a spec lmcore does not read (its message lists the forms).
        """
        runs = []
        parsed = lmcore.ActivationCheckpointing.parse(spec)
        if parsed.keeps_attention:
            return cls(spec, tuple((i, i + 1, "selective") for i in range(num_layers)))
        for item in parsed.plan(num_layers):
            if isinstance(item, int):
                runs.append((item, item + 1, "plain"))
                continue
            nested = isinstance(item[0], tuple)
            first = item[0][0] if nested else item[0]
            last = item[-1][-1] if nested else item[-1]
            runs.append((first, last + 1, "nested" if nested else "segment"))
        return cls(spec, tuple(runs))

    @property
    def keeps_attention(self) -> bool:
        """Whether its checkpoints keep their blocks' attention outputs (`selective`)."""
        return any(kind == "selective" for *_, kind in self.segments)

    @property
    def recomputed_block_forwards(self) -> int:
        """Extra block forwards backward runs: one per block of a checkpoint, two when nested
        (`selective`'s recomputations, without attention, count as one)."""
        extra = {"plain": 0, "segment": 1, "nested": 2, "selective": 1}
        return sum((b - a) * extra[kind] for a, b, kind in self.segments)

    def recomputed_attention_forwards(self, attention: str) -> int:
        """Extra attention forwards backward runs: one per recomputed block forward, less
        `selective`'s where it keeps the backend's output (`lmcore.SELECTIVE_KEEPS`)."""
        kept = sum(b - a for a, b, kind in self.segments if kind == "selective")
        keeps = attention in lmcore.SELECTIVE_KEEPS
        return self.recomputed_block_forwards - (kept if keeps else 0)


@dataclass(frozen=True)
class TrainingPlan:
    """One training configuration to predict; validated on construction.

    Args:
        model: the model (`lmcore.ModelConfig`; its `attention` backend matters).
        batch: sequences per step in all (split over the data-parallel ranks).
        seq_len: tokens per sequence; the model's context length when None.
        precision: a key of `PRECISIONS`.
        layout: one of `LAYOUTS` (`bench.core.layouts` says what each runs): `single` device;
            the `ddp` family (torch DDP's flat gradient buckets kept for the whole run under
            `ddp:torch`, DDPBucketed's `.grad` views of its buckets under `ddp`); the `zero1`
            family (optimizer state sharded as `zero.ShardedOptimizer` does; torch's
            ZeroRedundancyOptimizer stages no broadcast); the `fsdp` family (weights, gradients
            and state sharded, one unit per block, as `zero.FSDP`; `fsdp:no-prefetch` gathers
            one unit at a time); `tp` (Megatron-style tensor parallelism); `fsdp-tp` (FSDP
            across `dp` ranks of `tp`-way tensor-parallel groups).
        dp: data-parallel ranks (`ddp`, `zero1`, `fsdp`, `fsdp-tp`).
        tp: tensor-parallel ranks (`tp`, `fsdp-tp`).
        activation_checkpointing: a spec of `CHECKPOINTING_FORMS`.
        loss: `"materialized"`, `"fused"` or the torch-native step's `"chunked"` (see
            `bench.plan.activations.loss_memory`).
        optimizer: a key of `OPTIMIZERS`.
        mode: `train-step` (forward, backward, optimizer step; the optimizer state exists),
            `forward-backward` (no optimizer) or `forward` (inference under `no_grad`).
        hold_logits: the training step keeps the logits alive through backward
            (`logits = model(x); loss = ce(logits, y)`; bench-model's step does not).
        zero_bucket_mb: `zero.ShardedOptimizer`'s broadcast cap (MiB; None: one per owner).
        loss_chunk_tokens: the fused (and chunked) loss's chunk (None: lmcore's rule).
        moment_bytes: bytes of each AdamW moment's elements (None: the precision's, the
            parameters' dtype; 4: float32, as lmcore's fused AdamW kept them before bench gave
            it `moment_dtype`).
        head_units: under FSDP, whether the embedding and the LM head are units of their own
            (None: as the layout shards them, `Layout.units`).
        compiled: each block compiled by inductor: a block's residuals are what its partition
            keeps, where that is known (`bench.plan.activations.compiled_residuals_known`).

    Raises:
        ValueError: an unknown name, a degree that does not match the layout, a batch that the
            data-parallel ranks do not divide, a head count or width the TP ranks do not
            divide, or an autocast precision with FSDP (FSDP casts weights itself: use
            `bf16-master`, `bench.core.layouts.planned_precision`).
    """

    model: lmcore.ModelConfig
    batch: int
    seq_len: int | None = None
    precision: str = "fp32"
    layout: str = "single"
    dp: int = 1
    tp: int = 1
    activation_checkpointing: str = "none"
    loss: str = "materialized"
    optimizer: str = "lmcore"
    mode: str = "train-step"
    hold_logits: bool = True
    # zero.ShardedOptimizer's default cap, which is ddp's (tests/test_zero_with_ddp.py checks), read
    # from ddp so that this module imports no torch (bench-plan's command line reads it).
    zero_bucket_mb: float | None = ddp.DEFAULT_BUCKET_SIZE_MB
    loss_chunk_tokens: int | None = None
    moment_bytes: int | None = None
    head_units: bool | None = None
    compiled: bool = False
    checkpointing: Checkpointing = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        choices = (
            ("precision", self.precision, tuple(PRECISIONS)),
            ("layout", self.layout, LAYOUTS),
            ("loss", self.loss, PLAN_LOSSES),
            ("optimizer", self.optimizer, tuple(OPTIMIZERS)),
            ("mode", self.mode, MODES),
        )
        for name, value, allowed in choices:
            if value not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")
        for name in ("batch", "dp", "tp"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.seq_len is not None and (
            isinstance(self.seq_len, bool) or not isinstance(self.seq_len, int) or self.seq_len < 1
        ):
            raise ValueError(f"seq_len must be a positive integer, got {self.seq_len!r}")
        if self.dp > 1 and not self.layout_spec.data_parallel:
            raise ValueError(
                f"layout {self.layout!r} has no data-parallel ranks (dp={self.dp}); use one of "
                f"{', '.join(n for n in LAYOUTS if ALL_LAYOUTS[n].data_parallel)}"
            )
        if self.tp > 1 and not self.layout_spec.tensor_parallel:
            raise ValueError(f"layout {self.layout!r} has no tensor parallelism (tp={self.tp})")
        if self.batch % self.dp:
            raise ValueError(
                f"batch {self.batch} does not split over {self.dp} data-parallel ranks; use a "
                "multiple of dp"
            )
        m, tp = self.model, self.tp
        if m.num_heads % tp or m.kv_heads % tp or m.d_ff % tp:
            raise ValueError(
                f"tp={tp} must divide the heads ({m.num_heads}), key/value heads ({m.kv_heads}) "
                f"and d_ff ({m.d_ff})"
            )
        if planned_precision(self.precision, self.layout) != self.precision:
            raise ValueError(
                f"FSDP gathers weights in its own compute dtype instead of autocast: {self.layout} "
                f"under {self.precision} keeps the bytes of precision bf16-master (float32 shards "
                "gathered in 16 bits, as zero.FSDP(compute_dtype=torch.bfloat16 or float16)); "
                "predict it as bf16-master"
            )
        if self.loss_chunk_tokens is not None and self.loss_chunk_tokens < 1:
            raise ValueError(f"loss_chunk_tokens must be positive, got {self.loss_chunk_tokens}")
        if self.moment_bytes not in (None, 2, 4):
            raise ValueError(f"moment_bytes must be 2, 4 or None, got {self.moment_bytes!r}")
        object.__setattr__(
            self,
            "checkpointing",
            Checkpointing.parse(self.activation_checkpointing, self.model.num_layers),
        )

    @property
    def tokens_per_sequence(self) -> int:
        """s: the sequence length (the model's context length unless given)."""
        return self.seq_len or self.model.context_length

    @property
    def micro_batch(self) -> int:
        """b: sequences on one device (the batch over the data-parallel ranks)."""
        return self.batch // self.dp

    @property
    def num_devices(self) -> int:
        """dp × tp."""
        return self.dp * self.tp

    @property
    def precision_spec(self) -> Precision:
        """The `Precision` named by `precision`."""
        return PRECISIONS[self.precision]

    @property
    def layout_spec(self) -> Layout:
        """The `bench.core.layouts.Layout` named by `layout`."""
        return ALL_LAYOUTS[self.layout]

    @property
    def family(self) -> str:
        """What each device holds: `single`, `ddp`, `zero1`, `fsdp`, `tp` or `fsdp-tp`."""
        return self.layout_spec.family

    @property
    def fsdp_head_units(self) -> bool:
        """Whether FSDP shards the embedding and the LM head as units of their own (False
        outside FSDP)."""
        if not self.layout_spec.shards_weights:
            return False
        return "LMHead" in self.layout_spec.units if self.head_units is None else self.head_units

    @property
    def fsdp2(self) -> bool:
        """Whether torch's FSDP2 (`fully_shard`) shards the model: its own schedule of
        gathers and reduce-scatters (`_fsdp2_block_buffers`), not zero.FSDP's."""
        return self.layout_spec.wrapper == "fully_shard"

    def describe(self) -> str:
        """The configuration in one line."""
        m = self.model
        mesh = {
            "single": "1 device",
            "tp": f"TP {self.tp}",
            "fsdp-tp": f"FSDP {self.dp} × TP {self.tp}",
        }.get(self.family, f"{self.layout.upper()} {self.dp}")
        return (
            f"{m.d_model}/{m.d_ff}/{m.num_layers}L/{m.num_heads}H V={m.vocab_size:,}, "
            f"batch {self.batch} × {self.tokens_per_sequence:,}, {self.precision}, {mesh}, "
            f"{m.attention}{' compiled' if self.compiled else ''}, checkpointing "
            f"{self.activation_checkpointing}, {self.loss} loss, {self.optimizer}"
        )


@dataclass(frozen=True)
class Term:
    """Bytes of one kind of tensor at one moment, and the formula that gives them."""

    name: str
    num_bytes: int
    formula: str


@dataclass(frozen=True)
class Phase:
    """A moment of the step: the terms alive then."""

    name: str
    terms: tuple[Term, ...]

    @property
    def total(self) -> int:
        """Bytes alive at this moment."""
        return sum(t.num_bytes for t in self.terms)

    def bytes_of(self, name: str) -> int:
        """The bytes of the term called `name` (0 if it has none)."""
        return sum(t.num_bytes for t in self.terms if t.name == name)


@dataclass(frozen=True)
class MemoryEstimate:
    """`estimate_memory`'s answer.

    Attributes:
        plan: what was predicted.
        phases: the moments that can be the peak, in step order.
        definitions: the quantities the phases' formulas name (A_block, X, the loss, ...) with
            their own formulas.
        notes: assumptions specific to this plan.
    """

    plan: TrainingPlan
    phases: tuple[Phase, ...]
    definitions: tuple[Term, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def peak(self) -> Phase:
        """The phase with the most bytes alive."""
        return max(self.phases, key=lambda p: p.total)

    def phase(self, name: str) -> Phase:
        """The phase called `name`.

        Raises:
            KeyError: no phase has that name.
        """
        for p in self.phases:
            if p.name == name:
                return p
        raise KeyError(f"no phase {name!r}; phases: {[p.name for p in self.phases]}")

    def fits(self, memory_bytes: float) -> bool:
        """Whether the peak is at most `memory_bytes`."""
        return self.peak.total <= memory_bytes


# --- parameters, gradients, optimizer state --------------------------------------------------


@dataclass(frozen=True)
class _State:
    """Per-device element counts (the busiest device) and the terms they give."""

    params: Term
    master: Term
    grads: Term
    state: Term
    optimizer_temp: Term
    rope: Term
    ddp_buckets: Term
    zero_staging: Term
    root_gathered: Term
    units_gathered: Term
    unit_grads: Term
    head_root_grads: Term  # the LM head's full-size gradient, from its backward on
    root_grads: Term  # the root unit's full-size gradients at the end of backward
    head_gathered: Term  # the LM head as a unit: gathered for its forward and its backward
    unit_prefetched: Term  # the last block, prefetched as the loss's backward begins
    embedding_end: Term  # the embedding as a unit: gathered, with its gradient, at the end
    block_grads: tuple[int, ...]  # gradient bytes per block on this device
    head_grads: int  # gradient bytes outside the blocks alive during the blocks' backward
    unit_bytes: int  # one block unit, full-size, in the compute dtype (FSDP; 0 otherwise)


def _padded_shard(numel: int, ranks: int) -> int:
    """Elements of one rank's shard: ceil(numel / ranks), as zero.FSDP pads."""
    return -(-numel // ranks)


def _state(plan: TrainingPlan) -> _State:
    prec = plan.precision_spec
    params = model_parameters(plan.model)
    tp, dp = plan.tp, plan.dp
    fsdp = plan.layout_spec.shards_weights
    training = plan.mode != "forward"
    stepping = plan.mode == "train-step"
    local = [p.tp_numel(tp) for p in params]  # after tensor parallelism
    sharded = [fsdp and p.kind != "norm" for p in params]  # zero.FSDP shards >= 2-D weights
    on_device = [_padded_shard(n, dp) if s else n for n, s in zip(local, sharded, strict=True)]
    total_local = sum(local)
    tp_text = "" if tp == 1 else f" / TP {tp}"
    if plan.family == "zero1":
        from zero import partition_by_numel  # imports torch: only when a plan is computed

        owners = partition_by_numel(local, dp)
        stepped = max(
            sum(n for n, owner in zip(local, owners, strict=True) if owner == r) for r in range(dp)
        )
        stepped_text = f"the busiest rank's parameters under zero.partition_by_numel over {dp}"
    elif fsdp:
        stepped = sum(on_device)
        stepped_text = f"⌈n/{dp}⌉ per weight (padded), norm gains whole"
    else:
        stepped = total_local
        stepped_text = "every parameter" + tp_text
    device_params = sum(on_device)
    p_bytes = prec.shard_bytes if fsdp else prec.param_bytes
    where = f"⌈n/{dp}⌉ per weight (padded), norm gains whole" if fsdp else "N" + tp_text
    params_term = Term(
        "parameters",
        p_bytes * device_params,
        f"{p_bytes} B × {device_params:,} ({where})",
    )
    has_master = prec.master_bytes and not fsdp and stepping
    master = Term(
        "master weights",
        prec.master_bytes * stepped if has_master else 0,
        f"{prec.master_bytes} B × {stepped:,} ({stepped_text})" if has_master else "none",
    )
    g_bytes = prec.shard_bytes if fsdp else prec.grad_bytes
    grads = Term(
        "gradients",
        g_bytes * device_params if training else 0,
        f"{g_bytes} B × {device_params:,}" if training else "none (no backward)",
    )
    moment_bytes = plan.moment_bytes or prec.moment_bytes
    state = Term(
        "optimizer state",
        2 * moment_bytes * stepped if stepping else 0,
        f"2 moments × {moment_bytes} B × {stepped:,} ({stepped_text})"
        if stepping
        else "none (no optimizer step)",
    )
    temp_units = OPTIMIZERS[plan.optimizer] if stepping else 0
    optimizer_temp = Term(
        "optimizer temporaries",
        temp_units * moment_bytes * stepped,
        f"{temp_units} × {moment_bytes} B × {stepped:,} (foreach AdamW's sqrt(v) list)"
        if temp_units
        else "none (fused update)",
    )
    head_dim = plan.model.head_dim
    rope_bytes = 2 * plan.model.context_length * (head_dim // 2) * 4
    rope = Term(
        "buffers",
        rope_bytes,
        f"RoPE cos, sin tables: 2 × {plan.model.context_length:,} × {head_dim // 2} × 4 B",
    )
    gb = prec.grad_bytes
    ddp_on = plan.layout_spec.torch_buckets and training
    ddp_buckets = Term(
        "communication buffers",
        gb * total_local if ddp_on else 0,
        f"torch DDP's flat gradient buckets: {gb} B × {total_local:,}" if ddp_on else "none",
    )
    zero_staging = Term("communication buffers", 0, "none")
    if plan.layout_spec.optimizer == "ShardedOptimizer" and stepping:
        shard_bytes = prec.param_bytes * stepped
        cap = plan.zero_bucket_mb
        if cap is None:
            zero_staging = Term(
                "communication buffers",
                shard_bytes,
                "broadcast staging: one bucket per owner (the whole shard)",
            )
        elif cap > 0:
            staged = min(2 * int(cap * 2**20), shard_bytes)
            zero_staging = Term(
                "communication buffers",
                staged,
                f"broadcast staging: 2 buckets of {cap:g} MiB in flight",
            )
    c = prec.compute_bytes
    outside = [p for p, s in zip(params, sharded, strict=True) if s and p.block is None]
    unit = [p for p, s in zip(params, sharded, strict=True) if s and p.block == 0]
    head_units = plan.fsdp_head_units
    root = [] if head_units else outside  # the embedding and the head: units, or the root's
    root_numel = sum(_padded_shard(p.tp_numel(tp), dp) * dp for p in root)
    head_numel = sum(_padded_shard(p.tp_numel(tp), dp) * dp for p in root if p.kind == "linear")
    unit_numel = sum(_padded_shard(p.tp_numel(tp), dp) * dp for p in unit)
    head_unit = sum(_padded_shard(p.tp_numel(tp), dp) * dp for p in outside if p.kind == "linear")
    embedding_unit = sum(
        _padded_shard(p.tp_numel(tp), dp) * dp for p in outside if p.kind == "embedding"
    )
    prefetch = plan.layout_spec.prefetch
    gathered_units = (2 if prefetch else 1) + 1
    none = Term("communication buffers", 0, "none")
    head_gathered = unit_prefetched = embedding_end = none
    if plan.fsdp2 and prefetch:
        unit_prefetched = Term(
            "communication buffers",
            c * unit_numel,
            f"the last block's all-gather output, prefetched by the root's pre-backward: "
            f"{c} B × {unit_numel:,}",
        )
    if head_units:
        head_gathered = Term(
            "communication buffers",
            c * head_unit,
            f"the LM head unit gathered (its forward, then its backward): {c} B × {head_unit:,}",
        )
        if prefetch:
            unit_prefetched = Term(
                "communication buffers",
                c * unit_numel,
                f"the last block prefetched as the head's backward begins: {c} B × {unit_numel:,}",
            )
        embedding_end = Term(
            "communication buffers",
            2 * c * embedding_unit,
            f"the embedding unit gathered and its full-size gradient before the reduce-scatter: "
            f"2 × {c} B × {embedding_unit:,}",
        )
    if fsdp:
        root_gathered = Term(
            "communication buffers",
            c * root_numel,
            f"FSDP root unit (embedding, LM head) gathered: {c} B × {root_numel:,}",
        )
        units_gathered = Term(
            "communication buffers",
            gathered_units * c * unit_numel,
            f"FSDP units gathered: {gathered_units} × {c} B × {unit_numel:,} (one computing"
            + (", one prefetched" if prefetch else "")
            + ", one all-gather staging copy)",
        )
        unit_grads = Term(
            "communication buffers",
            3 * c * unit_numel,
            f"full-size unit gradients: 3 × {c} B × {unit_numel:,} (the one "
            "being computed, two reduce-scatters in flight)",
        )
        head_root_grads = Term(
            "communication buffers",
            c * head_numel,
            f"the LM head's full-size gradient (the root unit's, reduce-scattered at the end): "
            f"{c} B × {head_numel:,}",
        )
        root_grads = Term(
            "communication buffers",
            c * root_numel,
            f"the root unit's full-size gradients before their reduce-scatter: {c} B × "
            f"{root_numel:,}",
        )
    else:
        root_gathered = units_gathered = unit_grads = head_root_grads = root_grads = none
    block_grads = [0] * plan.model.num_layers
    head_grads = 0  # those alive while the blocks' backward runs: not yet the embedding's, nor
    in_root = {id(p) for p in root}  # the root's, held full-size until the end (root_grads)
    if training:
        for p, n in zip(params, on_device, strict=True):
            if p.block is not None:
                block_grads[p.block] += g_bytes * n
            elif p.kind != "embedding" and id(p) not in in_root:
                head_grads += g_bytes * n
    return _State(
        params_term, master, grads, state, optimizer_temp, rope, ddp_buckets, zero_staging,
        root_gathered, units_gathered, unit_grads, head_root_grads, root_grads, head_gathered,
        unit_prefetched, embedding_end, tuple(block_grads), head_grads,
        c * unit_numel if fsdp else 0,
    )  # fmt: skip


# --- the phases of a step ---------------------------------------------------------------------


def _resident(s: _State, *, grads_always: bool) -> list[Term]:
    """What lives through the whole step: weights, masters, state, buffers, (bucket) grads."""
    terms = [s.params, s.master, s.state, s.rope, s.ddp_buckets]
    if grads_always:
        terms.append(s.grads)
    return terms


@dataclass(frozen=True)
class _Activations:
    """The activation quantities of one device, and their definitions as terms."""

    block: int  # A_block: one block's residuals
    block_cache: int  # of which autocast's bf16 weight copies
    checkpoint: int  # X: a checkpoint's saved input (the residual stream)
    kept: int  # K: what `selective` keeps of a block beyond X (attention output, logsumexp)
    head: int  # embedding ids, final norm, LM head's autocast copy
    ids: int  # the token ids, saved until the embedding's backward
    working: Residual  # a block's backward working set
    loss: LossMemory
    saves_input: bool  # a block's residuals include its input (inductor's partition keeps it)
    definitions: tuple[Term, ...]


def _activations(plan: TrainingPlan) -> _Activations:
    """Per-block and per-model activation bytes of `plan` (one device), with their formulas."""
    m = plan.model
    regime = plan.precision_spec.regime
    b, s = plan.micro_batch, plan.tokens_per_sequence
    kw = {"batch": b, "seq_len": s, "regime": regime, "tp": plan.tp}
    block = block_residuals(m, **kw, compiled=plan.compiled)
    head = head_residuals(m, **kw, loss=plan.loss)
    x_bytes = residual_bytes(regime)
    checkpoint = residual_stream_bytes(b, s, m.d_model, element_bytes=x_bytes)
    kept = kept_attention_residuals(m, **kw) if plan.checkpointing.keeps_attention else []
    working = block_backward_working_set(m, **kw, compiled=plan.compiled)
    saves_input = plan.compiled and compiled_residuals_known(m, regime=regime, tp=plan.tp)
    prec = plan.precision_spec
    loss = loss_memory(
        m, **kw, loss=plan.loss, hold_logits=plan.hold_logits, chunk_tokens=plan.loss_chunk_tokens,
        weight_bytes=prec.compute_bytes if plan.layout_spec.shards_weights else prec.param_bytes,
    )  # fmt: skip
    symbols = (
        f"T = b·s = {b:,} × {s:,} = {b * s:,} tokens, d = {m.d_model:,}, f = {m.d_ff:,}, "
        f"h = {m.num_heads}, V = {m.vocab_size:,}"
        + (f", d_kv = {m.kv_heads * m.head_dim:,}" if m.kv_heads != m.num_heads else "")
        + (f", t = {plan.tp}" if plan.tp > 1 else "")
        + (
            f", N_block = {sum(p.numel for p in model_parameters(m) if p.block == 0 and p.kind == 'linear'):,} (one block's matmul weights)"  # noqa: E501
            if regime == "autocast"
            else ""
        )
    )
    definitions = (
        Term("symbols", 0, symbols),
        Term("A_block: one block's residuals", total_bytes(block), combined_formula(block)),
        Term("X: a checkpoint (the block's input)", checkpoint, f"{x_bytes}·T·d"),
        *([Term("K: what selective keeps beyond X", total_bytes(kept), combined_formula(kept))]
          if kept else []),
        Term("head: token ids, final norm" + (", LM head copy" if regime == "autocast" else ""),
             total_bytes(head), combined_formula(head)),
        Term(f"loss ({plan.loss}), forward", loss.forward_peak, loss.forward_formula),
        Term(f"loss ({plan.loss}), backward", loss.backward_peak, loss.backward_formula),
        Term("W: a block's backward working set" + ("" if saves_input else " (estimate)"),
             working.num_bytes, working.formula),
    )  # fmt: skip
    return _Activations(
        block=total_bytes(block),
        block_cache=sum(r.num_bytes for r in block if r.where == "weights"),
        checkpoint=checkpoint,
        kept=total_bytes(kept),
        head=total_bytes(head),
        ids=next(r.num_bytes for r in head if r.where == "embedding"),
        working=working,
        loss=loss,
        saves_input=saves_input,
        definitions=definitions,
    )


def _mib(num_bytes: float) -> str:
    return f"{num_bytes / 2**20:,.1f} MiB"


def _forward_mode(plan: TrainingPlan, s: _State, acts: _Activations) -> list[Phase]:
    """Inference under no_grad: weights, autocast's cache, one block's or the logits' worth."""
    m = plan.model
    tokens = plan.micro_batch * plan.tokens_per_sequence
    c = plan.precision_spec.compute_bytes
    logits = c * tokens * -(-m.vocab_size // plan.tp)
    cache = 0
    if plan.precision_spec.regime == "autocast":
        cache = 2 * sum(p.tp_numel(plan.tp) for p in model_parameters(m) if p.kind == "linear")
    working = acts.working
    terms = [
        *_resident(s, grads_always=False),
        s.root_gathered,
        s.units_gathered,
        Term("autocast weight cache", cache,
             "2 B × every matmul weight (bf16 copies, alive until autocast exits)"
             if cache else "none"),
        Term("activations", max(working.num_bytes, logits),
             f"max(W = {_mib(working.num_bytes)}, logits {c}·T·V = {_mib(logits)}) "
             "(nothing is saved under no_grad; an estimate)"),
    ]  # fmt: skip
    return [Phase("forward (no_grad)", tuple(terms))]


def _fsdp2_block_buffers(s: _State, i: int, num_layers: int) -> tuple[Term, Term]:
    """torch FSDP2's full-size buffers while block `i` runs its backward, read off torch 2.11's
    `_fsdp_param_group.py` (one `fully_shard` unit per block, the default implicit prefetch):

    - gathered: block i's unsharded weights (its all-gather output was copied into them and
      freed in its pre-backward, `wait_for_unshard`), and the all-gather output of block i − 1,
      which block i's pre-backward prefetches (`_backward_prefetch`: one unit ahead in the
      reverse post-forward order; none before block 0);
    - gradients: block i's full-size gradients as autograd makes them, and block i + 1's
      reduce-scatter input, held in `reduce_scatter_state` until block i's post-backward frees
      it; none for the last block, whose predecessor in the backward is the root, reduced only
      at the end of the backward.
    """
    gathered = 2 if i > 0 else 1
    grads = 2 if i < num_layers - 1 else 1
    return (
        Term("communication buffers", gathered * s.unit_bytes,
             f"FSDP2 units gathered: {gathered} × {_mib(s.unit_bytes)} (block {i}"
             + (f", block {i - 1}'s prefetched all-gather" if gathered == 2 else "") + ")"),
        Term("communication buffers", grads * s.unit_bytes,
             f"FSDP2 full-size gradients: {grads} × {_mib(s.unit_bytes)} (block {i}'s"
             + (f", block {i + 1}'s reduce-scatter input" if grads == 2 else "") + ")"),
    )  # fmt: skip


def _training_phases(plan: TrainingPlan, s: _State, acts: _Activations) -> list[Phase]:
    ckpt = plan.checkpointing
    block, x_in, loss = acts.block, acts.checkpoint, acts.loss
    views = plan.family in ("ddp", "zero1") and not plan.layout_spec.torch_buckets
    resident = _resident(s, grads_always=views)
    forward_saved = {"plain": block, "segment": x_in, "nested": x_in, "selective": x_in + acts.kept}
    saved_by_run = [forward_saved[kind] for _, _, kind in ckpt.segments]
    full = sum(b - a for a, b, kind in ckpt.segments if kind == "plain")
    points = len(ckpt.segments) - sum(1 for *_, kind in ckpt.segments if kind == "plain")
    kept = sum(1 for *_, kind in ckpt.segments if kind == "selective")
    saved_all = sum(saved_by_run)
    kept_text = f" + {kept} × K" if kept else ""
    kept_value = f" + {kept} × {_mib(acts.kept)}" if kept else ""
    saved_text = (
        f"{full} × A_block + {points} × X{kept_text} + head = {full} × {_mib(block)} + "
        f"{points} × {_mib(x_in)}{kept_value} + {_mib(acts.head)} (checkpointing "
        f"{plan.activation_checkpointing!r})"
    )
    unsaved_cache = sum(acts.block_cache * (b - a) for a, b, k in ckpt.segments if k != "plain")
    # FSDP at the loss: the root's weights and the last units, or the LM head unit alone (the
    # blocks freed), then as its backward begins the last block prefetched; FSDP2 reshards every
    # block after its forward and keeps only its root gathered (`_fsdp2_block_buffers`)
    if plan.fsdp_head_units:
        at_loss = [s.head_gathered]
    elif plan.fsdp2:
        at_loss = [s.root_gathered]
    else:
        at_loss = [s.root_gathered, s.units_gathered]
    forward_end = [
        *resident,
        *at_loss,
        Term("activations", saved_all + acts.head, saved_text),
        Term("autocast weight cache", unsaved_cache,
             "bf16 copies of checkpointed blocks' weights, held by autocast until it exits"
             if unsaved_cache else "none"),
        Term("loss", loss.forward_peak, f"{plan.loss}: {loss.forward_formula}"),
    ]  # fmt: skip
    backward_loss = [
        *resident,
        *at_loss,
        s.unit_prefetched,
        Term("activations", saved_all + acts.head, saved_text),
        Term("loss", loss.backward_peak, f"{plan.loss}: {loss.backward_formula}"),
    ]
    phases = [
        Phase("forward end", tuple(forward_end)),
        Phase("backward, loss", tuple(backward_loss)),
    ]
    # Backward through the blocks, last first: gradients of blocks >= i exist, runs before
    # block i's keep their forward-saved tensors, block i's run holds what it recomputed.
    fsdp_bwd = [s.root_gathered, s.units_gathered, s.unit_grads, s.head_root_grads]
    worst: Phase | None = None
    for j in reversed(range(len(ckpt.segments))):
        a, b, kind = ckpt.segments[j]
        before = ckpt.segments[:j]
        n_full = sum(y - x for x, y, k in before if k == "plain")
        n_points = sum(1 for *_, k in before if k != "plain")
        n_kept = sum(1 for *_, k in before if k == "selective")
        for i in reversed(range(a, b)):
            alive = i - a + 1  # blocks a..i of this run not yet through backward
            if kind == "plain":
                here, here_text = block, "A_block"
            elif kind == "selective":  # its kept attention output is A_block's own
                here = x_in + block
                here_text = "X + A_block (recomputed but for its attention output)"
            elif kind == "segment":
                here = x_in + alive * block
                here_text = f"X + {alive} × A_block (its segment recomputed)"
            else:
                here = alive * x_in + block
                here_text = f"{alive} × X + A_block (its nested segment, then itself, recomputed)"
            if kind != "plain" and acts.saves_input:
                # the recomputed block saves its input: the tensor its checkpoint kept, not a copy
                here -= x_in
                here_text += " − X (A_block's input is the checkpoint's)"
            grads = s.head_grads + sum(s.block_grads[i:])
            grads_text = f"the LM head's, final norm's and blocks ≥ {i}'s"
            if plan.fsdp2:  # block i's shard is its reduce-scatter's output, after its backward
                grads = s.head_grads + sum(s.block_grads[i + 1 :])
                grads_text = f"the final norm's and blocks > {i}'s shards"
                fsdp_bwd = [s.root_gathered, *_fsdp2_block_buffers(s, i, plan.model.num_layers),
                            s.head_root_grads]  # fmt: skip
            activations = n_full * block + n_points * x_in + n_kept * acts.kept + here + acts.ids
            terms = [
                *resident,
                *([] if views else [Term("gradients", grads, grads_text)]),
                *fsdp_bwd,
                Term("activations", activations,
                     f"{n_full} × A_block + {n_points} × X"
                     f"{f' + {n_kept} × K' if n_kept else ''} (before block {i}) + {here_text} + "
                     f"token ids"),
                Term("backward working set", acts.working.num_bytes, acts.working.formula),
            ]  # fmt: skip
            phase = Phase(f"backward, block {i}", tuple(terms))
            if worst is None or phase.total > worst.total:
                worst = phase
    if worst is not None:
        phases.append(worst)
    # the embedding's gradient is the last; FSDP reduce-scatters the root's gradients then
    end = [*resident, *([] if views else [s.grads]), s.root_gathered, s.root_grads]
    end.append(s.embedding_end)
    phases.append(Phase("backward end", tuple(end)))
    if plan.mode == "train-step":
        step = [*resident, *([] if views else [s.grads]), s.optimizer_temp, s.zero_staging]
        phases.append(Phase("optimizer step", tuple(step)))
    return phases


def estimate_memory(plan: TrainingPlan) -> MemoryEstimate:
    """Predict the bytes alive on the busiest device at each moment of one step of `plan`.

    Returns:
        A `MemoryEstimate`; its `peak` is the prediction of `torch.cuda.max_memory_allocated`
        (which counts tensors, not the CUDA context or the allocator's cached blocks).

    Example::

        >>> estimate_memory(TrainingPlan(config, batch=4)).peak.total / 2**20  # MiB
    """
    s = _state(plan)
    acts = _activations(plan)
    # Right after building the model, its wrapper and the optimizer (AdamW makes its moments at
    # the first step): what bench-zero reports as `init`.
    setup = Phase("after set-up", (s.params, s.master, s.rope, s.ddp_buckets))
    if plan.mode == "forward":
        phases = [setup, *_forward_mode(plan, s, acts)]
    else:
        phases = [setup, *_training_phases(plan, s, acts)]
    notes = []
    if plan.precision_spec.autocast:
        notes.append(
            f"autocast: float32 residual stream and norms, {plan.precision_spec.compute} matmul "
            "inputs cast per matmul, float32 softmax (CUDA's autocast lists)."
        )
    if plan.layout_spec.tensor_parallel:
        notes.append(
            "TP: norms and the residual stream are whole on every rank (no sequence "
            "parallelism); attention heads, the FFN width and the vocabulary are split."
        )
    return MemoryEstimate(plan, tuple(phases), acts.definitions, tuple(notes))
