"""The harness's one vocabulary of parallel layouts and precisions: every command offers a subset
of these names, and every old name still reads through `ALIASES`. Plain Python (no torch), so
that each command builds its `choices=` from here before anything heavy is imported.

**Layouts** are named `family` or `family:implementation`. The family says what each rank holds
(bench-plan's model predicts it); the implementation says whose code runs it, ours when none is
named:

=================== ================================================================ ==========
name                what runs                                                        family
=================== ================================================================ ==========
`single`            the model alone (on several ranks: each alone, no communication)  single
`ddp`               `ddp.DDPBucketed` (gradients all-reduced in buckets, overlapped)  ddp
`ddp:naive`         `ddp.NaiveDDP` (one all-reduce per gradient, after backward)      ddp
`ddp:flat`          `ddp.FlatDDP` (one all-reduce of all gradients, after backward)   ddp
`ddp:individual`    `ddp.DDPIndividualParameters` (one per gradient, overlapped)      ddp
`ddp:torch`         torch's `DistributedDataParallel`                                 ddp
`zero1`             `ddp.DDPBucketed` + `zero.ShardedOptimizer` (optimizer state     zero1
                    sharded)
`zero1:torch-ddp`   torch's DDP + `zero.ShardedOptimizer`                             zero1
`zero1:torch`       torch's DDP + torch's `ZeroRedundancyOptimizer`                   zero1
`fsdp`              `zero.FSDP`, a unit per block, the embedding and the LM head      fsdp
                    units of their own, the next unit prefetched
`fsdp:no-prefetch`  `zero.FSDP` gathering each unit only when it is needed            fsdp
`fsdp:torch`        torch's FSDP2 (`fully_shard` per block, then the root)            fsdp
`tp`, `fsdp-tp`     Megatron-style tensor parallelism, alone or inside FSDP groups    (predicted
                    (bench-plan only)                                                 only)
=================== ================================================================ ==========

**Precisions**: `fp32` (float32 throughout); `bf16-autocast` (float32 weights, gradients and
AdamW moments; matmuls in bf16 under `torch.autocast`); `fp16` (the same in fp16, with the loss
scaled dynamically by `torch.amp.GradScaler`: fp16's 5 exponent bits flush small gradients to
zero without it); `bf16` (the model stored in bf16, the leaderboard's `torch_dtype`: weights,
gradients and activations bf16, AdamW's moments in the parameters' dtype); `bf16-master`
(bench-plan's: bf16 weights and activations over float32 master weights and moments, what FSDP
with a bf16 compute dtype keeps). Under FSDP, `bf16-autocast` and `fp16` run as FSDP's mixed
precision: float32 shards gathered in 16 bits, which bench-plan predicts as `bf16-master`
(`planned_precision`). There is no fp16 model stored in fp16: without float32 master weights
its updates below fp16's resolution would be lost, and no seed or handout trains so.

**Old names** (`ALIASES`) read as their new ones, on the command line, in config files and in
results recorded before the rename (`renamed_row`). Where an old name now means another run in
one command (`CHANGED`: bench-zero's `ddp` was torch's DDP, bench-train's `bf16` was autocast,
...), `resolve` says so in a one-line note.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from bench.core.cli import LazyChoices

__all__ = [
    "ALIASES",
    "CHANGED",
    "DTYPES",
    "FAMILIES",
    "LAYOUTS",
    "PRECISIONS",
    "Layout",
    "Precision",
    "autocast_dtype",
    "check_combination",
    "choices",
    "compute_dtype",
    "layout_names",
    "loss_scaled",
    "parse_name",
    "planned_precision",
    "renamed_row",
    "resolve",
]


@dataclass(frozen=True)
class Layout:
    """One way of spreading training over ranks.

    Attributes:
        name: its key in `LAYOUTS`.
        description: what runs, in words.
        family: what each rank holds, bench-plan's layout: `single`, `ddp` (everything
            replicated), `zero1` (optimizer state sharded), `fsdp` (weights, gradients and
            optimizer state sharded), `tp`, `fsdp-tp`.
        wrapper: the class that wraps the model (`bench.core.parallel` builds it); None for the
            model alone, or for a layout that is only predicted (`tp`, `fsdp-tp`).
        optimizer: `plain` (the optimizer over the wrapper's parameters), `ShardedOptimizer`
            (`zero.ShardedOptimizer` around it) or `ZeroRedundancyOptimizer` (torch's).
        prefetch: FSDP gathers the next unit while one computes.
        units: under FSDP, the `lmcore` module classes sharded as units of their own, by name
            (what is in none stays in the root unit, gathered from the forward to the end of
            the backward).
    """

    name: str
    description: str
    family: str
    wrapper: str | None
    optimizer: str = "plain"
    prefetch: bool = True
    units: tuple[str, ...] = ()

    @property
    def runs(self) -> bool:
        """Whether a tool can run it (not only predict it)."""
        return self.family == "single" or self.wrapper is not None

    @property
    def data_parallel(self) -> bool:
        """Whether it has data-parallel ranks (each its own batch)."""
        return self.family in ("ddp", "zero1", "fsdp", "fsdp-tp")

    @property
    def tensor_parallel(self) -> bool:
        """Whether it splits matmuls over tensor-parallel ranks."""
        return self.family in ("tp", "fsdp-tp")

    @property
    def shards_optimizer(self) -> bool:
        """Whether each rank keeps optimizer state for its shard only."""
        return self.family in ("zero1", "fsdp", "fsdp-tp")

    @property
    def shards_weights(self) -> bool:
        """Whether each rank keeps a shard of the weights and gradients (FSDP)."""
        return self.family in ("fsdp", "fsdp-tp")

    @property
    def torch_buckets(self) -> bool:
        """Whether torch's DDP synchronises the gradients: its reducer keeps a flat copy of every
        gradient in buckets for the whole run (ours make `.grad` views of their buckets)."""
        return self.wrapper == "DistributedDataParallel"

    @property
    def ours(self) -> bool:
        """Whether the project's own code runs it (not torch's alone)."""
        return ":torch" not in self.name


# zero.FSDP's units in an `lmcore.TransformerLM`: each block, and the embedding and the LM head,
# the two largest weights of a large-vocabulary model, gathered around their own passes only
# (FSDP2's root keeps them gathered from the forward to the end of the backward).
_OURS = ("TransformerBlock", "Embedding", "LMHead")
_LAYOUT_LIST = (
    Layout("single", "the model alone", "single", None),
    Layout("ddp", "ddp.DDPBucketed", "ddp", "DDPBucketed"),
    Layout("ddp:naive", "ddp.NaiveDDP", "ddp", "NaiveDDP"),
    Layout("ddp:flat", "ddp.FlatDDP", "ddp", "FlatDDP"),
    Layout("ddp:individual", "ddp.DDPIndividualParameters", "ddp", "DDPIndividualParameters"),
    Layout("ddp:torch", "torch DistributedDataParallel", "ddp", "DistributedDataParallel"),
    Layout(
        "zero1",
        "ddp.DDPBucketed + zero.ShardedOptimizer",
        "zero1",
        "DDPBucketed",
        "ShardedOptimizer",
    ),
    Layout(
        "zero1:torch-ddp",
        "torch DDP + zero.ShardedOptimizer",
        "zero1",
        "DistributedDataParallel",
        "ShardedOptimizer",
    ),
    Layout(
        "zero1:torch",
        "torch DDP + torch ZeroRedundancyOptimizer",
        "zero1",
        "DistributedDataParallel",
        "ZeroRedundancyOptimizer",
    ),
    Layout("fsdp", "zero.FSDP, units: blocks, embedding, head", "fsdp", "FSDP", units=_OURS),
    Layout("fsdp:no-prefetch", "zero.FSDP without prefetching", "fsdp", "FSDP", prefetch=False,
           units=_OURS),
    Layout("fsdp:torch", "torch FSDP2 (fully_shard per block)", "fsdp", "fully_shard",
           units=("TransformerBlock",)),
    Layout("tp", "Megatron-style tensor parallelism", "tp", None),
    Layout("fsdp-tp", "FSDP across groups of tensor-parallel ranks", "fsdp-tp", None),
)  # fmt: skip
LAYOUTS: Mapping[str, Layout] = MappingProxyType({layout.name: layout for layout in _LAYOUT_LIST})
FAMILIES = ("single", "ddp", "zero1", "fsdp", "tp", "fsdp-tp")


@dataclass(frozen=True)
class Precision:
    """How a step stores and computes, and how many bytes each kind of tensor takes.

    Attributes:
        name: its key in `PRECISIONS`.
        description: in words.
        weights: the dtype the model is stored in (`fp32` or `bf16`).
        compute: the dtype the matmuls run in.
        autocast: the matmuls run in `compute` under `torch.autocast` (float32 weights).
        param_bytes: the model's own weights (what it computes with, outside FSDP).
        grad_bytes: gradients.
        moment_bytes: each of AdamW's two moments.
        master_bytes: a float32 master copy the optimizer steps (0: none).
        regime: the activations' regime (`bench.plan.activations.REGIMES`).
        compute_bytes: the dtype FSDP gathers weights in (its compute dtype).
        loss_scaling: the step scales the loss (`torch.amp.GradScaler`) and skips the optimizer
            step where the gradients overflow (fp16).
    """

    name: str
    description: str
    weights: str
    compute: str
    autocast: bool
    param_bytes: int
    grad_bytes: int
    moment_bytes: int
    master_bytes: int
    regime: str
    compute_bytes: int
    loss_scaling: bool = False

    @property
    def shard_bytes(self) -> int:
        """Bytes per element of FSDP's local shards: the master dtype (fp32 with masters)."""
        return self.master_bytes or self.param_bytes

    @property
    def runs(self) -> bool:
        """Whether a tool can run it (bench-plan alone predicts `bf16-master`)."""
        return self.master_bytes == 0


PRECISIONS: Mapping[str, Precision] = MappingProxyType(
    {
        "fp32": Precision("fp32", "float32 throughout", "fp32", "fp32", False,
                          4, 4, 4, 0, "fp32", 4),
        "bf16-autocast": Precision(
            "bf16-autocast",
            "float32 weights, gradients and AdamW moments; matmuls in bf16 under torch.autocast",
            "fp32", "bf16", True, 4, 4, 4, 0, "autocast", 2,
        ),
        "fp16": Precision(
            "fp16",
            "float32 weights, gradients and AdamW moments; matmuls in fp16 under torch.autocast; "
            "the loss scaled dynamically (torch.amp.GradScaler), steps that overflow skipped",
            "fp32", "fp16", True, 4, 4, 4, 0, "autocast", 2, loss_scaling=True,
        ),
        "bf16-master": Precision(
            "bf16-master",
            "bf16 weights, gradients and activations; float32 master weights and AdamW moments "
            "(FSDP: float32 shards gathered in bf16)",
            "bf16", "bf16", False, 2, 2, 4, 4, "bf16", 2,
        ),
        "bf16": Precision(
            "bf16",
            "bf16 everywhere, AdamW moments in the parameters' dtype (a model built in bf16, as "
            "the leaderboard's torch_dtype)",
            "bf16", "bf16", False, 2, 2, 2, 0, "bf16", 2,
        ),
    }
)  # fmt: skip


def check_combination(layout: str, precision: str) -> None:
    """Refuse a layout and precision that do not run together: every layout that runs takes
    every precision that runs (zero.FSDP keeps bf16 shards for `bf16`, float32 ones gathered
    in bf16 for `bf16-autocast`), and each compiles (`bench.core.parallel` says how).

    Raises:
        ValueError: an unknown layout, or a precision only bench-plan predicts (`bf16-master`).
    """
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; choose one of {', '.join(LAYOUTS)}")
    if not PRECISIONS[precision].runs:
        raise ValueError(
            f"precision {precision!r} is predicted by bench-plan only; run "
            + ", ".join(name for name, p in PRECISIONS.items() if p.runs)
        )


# The torch dtype of each of `Precision`'s dtype names (imported when one is looked up).
DTYPES = LazyChoices(fp32="torch:float32", bf16="torch:bfloat16", fp16="torch:float16")


def autocast_dtype(precision: str) -> Any:
    """The torch dtype `torch.autocast` runs `precision`'s matmuls in; None where the step needs
    no autocast. Imports torch."""
    spec = PRECISIONS[precision]
    return DTYPES[spec.compute] if spec.autocast else None


def compute_dtype(precision: str) -> Any:
    """The torch dtype `precision`'s matmuls run in (bf16 under both bf16 precisions). Imports
    torch."""
    return DTYPES[PRECISIONS[precision].compute]


def loss_scaled(precision: str) -> bool:
    """Whether a step in `precision` scales its loss and skips steps that overflow (fp16)."""
    return PRECISIONS[precision].loss_scaling


def planned_precision(precision: str, layout: str) -> str:
    """The precision bench-plan predicts a run of `precision` under `layout` as: FSDP gathers
    float32 shards in its compute dtype instead of autocasting, so an autocast precision
    (`bf16-autocast`, `fp16`) under a layout that shards weights keeps `bf16-master`'s bytes
    (16-bit weights and activations over float32 masters); every other run is itself."""
    if PRECISIONS[precision].autocast and LAYOUTS[layout].shards_weights:
        return "bf16-master"
    return precision


# Old layout names, as the commands spelled them before one vocabulary: each reads as its new
# name wherever it meant the same run.
ALIASES: Mapping[str, str] = MappingProxyType(
    {
        "none": "single",
        "naive": "ddp:naive",
        "flat": "ddp:flat",
        "individual": "ddp:individual",
        "bucketed": "ddp",
        "torch-ddp": "ddp:torch",
        "zero": "zero1",
        "bucketed-sharded": "zero1",
        "sharded": "zero1:torch-ddp",
        "torch-zero": "zero1:torch",
        "torch-fsdp": "fsdp:torch",
        "fsdp-no-prefetch": "fsdp:no-prefetch",
    }
)
# Names that meant another run in one command before: (command, name) -> what it meant then.
CHANGED: Mapping[tuple[str, str], str] = MappingProxyType(
    {
        ("bench-zero", "ddp"): "ddp:torch",
        ("bench-plan", "ddp"): "ddp:torch",
        ("bench-plan", "zero1"): "zero1:torch-ddp",
        ("bench-train", "bf16"): "bf16-autocast",
        ("bench-model", "bf16"): "bf16-autocast",
    }
)


def layout_names(
    *, family: Sequence[str] | None = None, runs: bool | None = None, exclude: Sequence[str] = ()
) -> tuple[str, ...]:
    """Canonical layout names, in `LAYOUTS`' order: of the given families and runnability,
    without `exclude`."""
    return tuple(
        name
        for name, layout in LAYOUTS.items()
        if (family is None or layout.family in family)
        and (runs is None or layout.runs == runs)
        and name not in exclude
    )


def resolve(name: str, *, command: str, offered: Sequence[str]) -> tuple[str, str | None]:
    """The canonical name of a layout or precision a command was given, and a note where the
    name meant another run in that command before.

    Args:
        name: what was given: a canonical name or an old one (`ALIASES`, `CHANGED`).
        command: the command (`bench-zero`), for `CHANGED`.
        offered: the canonical names the command offers.

    Returns:
        `(name, note)`: a name the command offers, and None or a one-line note. A name whose
        meaning changed runs its new meaning where the command offers it (with a note saying
        what the old run is called now), and its old meaning where it does not (bench-model's
        `bf16` is `bf16-autocast`, which it is now called).

    Raises:
        ValueError: a name that is neither offered nor an old name of an offered one.
    """
    old = CHANGED.get((command, name))
    if old is not None and name in offered:
        return name, (
            f"{command}: {name!r} now means {_described(name)}, as in every command; what it "
            f"ran here before is {old!r} ({_described(old)})"
        )
    if old is not None and old in offered:
        return old, f"{command}: {name!r} is spelled {old!r} now ({_described(old)})"
    canonical = ALIASES.get(name, name)
    if canonical not in offered:
        raise ValueError(f"{name!r} is not one of {', '.join(offered)}")
    return canonical, None


def parse_name(*, command: str, offered: Sequence[str]) -> Callable[[str], str]:
    """An argparse `type` (and config-file parser) for `command`'s layout or precision option:
    resolves an old name (`resolve`) and prints its note on stderr.

    Give the parser `choices=offered`: `--help` then lists the canonical names only, and an old
    name reads as its new one.
    """

    def name(text: str) -> str:
        try:
            canonical, note = resolve(text, command=command, offered=offered)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
        if note is not None:
            print(note, file=sys.stderr)
        return canonical

    return name


def _described(name: str) -> str:
    spec = LAYOUTS.get(name) or PRECISIONS.get(name)
    return spec.description if spec is not None else name


def choices(offered: Sequence[str], *, command: str) -> list[str]:
    """What a parser accepts for `command` offering `offered`: those, then their old names."""
    old = [alias for alias, new in ALIASES.items() if new in offered]
    old += [name for (owner, name), was in CHANGED.items() if owner == command and was in offered]
    return [*offered, *(name for name in dict.fromkeys(old) if name not in offered)]


# What each tool recorded under an old name: (tool, row key) -> {old value: new value}.
_RECORDED: Mapping[tuple[str, str], Mapping[str, str]] = MappingProxyType(
    {
        ("ddp", "variant"): ALIASES,
        ("zero", "variant"): {**ALIASES, "ddp": "ddp:torch"},
        ("plan", "layout"): {"ddp": "ddp:torch", "zero1": "zero1:torch-ddp"},
        ("plan_leaderboard", "layout"): {"ddp": "ddp:torch", "zero1": "zero1:torch-ddp"},
        ("step", "parallel"): ALIASES,
        ("model", "dtype"): {"bf16": "bf16-autocast"},
        ("residuals", "dtype"): {"bf16": "bf16-autocast"},
        ("train", "parallel"): ALIASES,
        ("train", "precision"): {"bf16": "bf16-autocast"},
    }
)


def renamed_row(tool: str, row: Mapping[str, Any]) -> dict[str, Any]:
    """A row recorded before the one vocabulary, with its layout and precision names in the new
    one (`bench.core.results.load_json` applies it to results of the old schema).

    bench-ddp's `case` labels start with the variant and follow it.
    """
    new = dict(row)
    for (owner, key), renames in _RECORDED.items():
        value = row.get(key)
        if owner == tool and isinstance(value, str) and value in renames:
            new[key] = renames[value]
            case = row.get("case")
            if key == "variant" and isinstance(case, str) and case.startswith(value):
                new["case"] = renames[value] + case[len(value) :]
    return new
