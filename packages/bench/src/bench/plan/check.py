"""bench-plan's predictions beside the measurements committed in a results folder.

`check_results(folder)` reads every bench-model, bench-zero and (once it exists) bench-step
result there, builds the `TrainingPlan` each row ran (the dimensions the row records; the tool's
own step: bench-model keeps no logits and steps lmcore's foreach AdamW, bench-zero holds the
logits and steps the optimizer it records), and sets the prediction beside each measured
quantity: bench-model's peak, bench-zero's parameter, gradient and optimizer-state bytes and its
three peaks (after set-up, before and after the optimizer step). Where the predicted peak holds
activations, it also states the activations the measurement implies (the measured peak minus
the predicted non-activation terms). A row the model cannot cover (a CPU run without a peak, a
variant or attention it does not know, a row that lacks its configuration) gets a row saying why.

Sizes: results recorded before the 2026 sizes call the 1600-wide model `xl` (lmcore now names it
`xl-2025`, and `xl` is 2560 wide). Rows are read by the dimensions they record; a row that
records none is read by its name as of its date.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import lmcore
from bench.core.layouts import LAYOUTS as ALL_LAYOUTS
from bench.core.memory import MIB
from bench.core.results import Run, load_json
from bench.core.shapes import size_label
from bench.plan.activations import ATTENTION_KINDS
from bench.plan.memory import LAYOUTS, Phase, TrainingPlan, estimate_memory

__all__ = [
    "CHECK_COLUMNS",
    "KNOWN_GAPS",
    "STEP_KEYS",
    "CheckResult",
    "check_results",
    "dims_on",
    "known_gap",
    "recorded_size_label",
]

CHECK_COLUMNS = [
    "source",
    "config",
    "quantity",
    "measured_mib",
    "predicted_mib",
    "error_pct",
    "phase",
    "note",
]


# Measured peaks the prediction misses by more than the model's error, each with why: (result,
# text of the row's configuration) -> the reason, which the check writes in the row's note; its
# headline states the peaks' errors without them and with them.
KNOWN_GAPS: Mapping[tuple[str, str], str] = MappingProxyType(
    {
        ("step_leaderboard_2xh200_2026-11-28", "ZERO1 2"): "the layout's bytes are predicted: "
        "the same row with eager blocks peaks at 63,530 MiB, 2 % above the prediction, its "
        "parameters, buckets (the gradients are their views), moments and block inputs as "
        "counted (step_memory_snapshot_2xh200_2026-11-28); the 12.6 GiB more of the compiled "
        "row come with compiled, checkpointed blocks, whose allocations torch 2.11 cannot "
        "record (pytorch#179536)",
        ("step_leaderboard_2xh200_2026-11-28", "FSDP:TORCH 2"): "a run whose rows shared "
        "processes: the same configuration, each row in processes of its own, peaks at 41,854 "
        "MiB, not 57,373 (step_leaderboard_2xh200_2026-11-28_cold_blocks)",
        ("step_leaderboard_4xh200_2026-11-28", "FSDP:TORCH 4"): "the torch-native peak differed "
        "from run to run (REPORT.md): the same configuration measured again peaks at 30,127 MiB, "
        "not 37,897 (step_leaderboard_4xh200_2026-11-28_selective)",
    }
)


def known_gap(row: Mapping[str, Any]) -> str | None:
    """The text of `KNOWN_GAPS` that names this check row (its `source` and `config`), or
    None."""
    return next(
        (text for source, text in KNOWN_GAPS if row["source"] == source and text in row["config"]),
        None,
    )


def recorded_size_label(name: str | None, dims: Sequence[int]) -> str:
    """`size_label` of a size as a result recorded it, naming the 2025 `xl` by its new name.

    Results recorded before the 2026 sizes call the 1600-wide model `xl`; lmcore now names it
    `xl-2025` (the 2026 `xl` is 2560 wide). A row is read by the dimensions it records, so a
    1600/6400/48/25 model recorded as `xl` is `xl-2025 (1600/6400/48L/25H; recorded as xl)`.
    """
    if name == "xl" and tuple(dims) == _XL_2025:
        return size_label("xl-2025", dims)[:-1] + "; recorded as xl)"
    return size_label(name, dims)


_XL_2025 = (1600, 6400, 48, 25)
# The day the 2026 sizes replaced `xl`: a row that records no dimensions and says `xl` before it
# means the 1600-wide model.
_XL_RENAMED_ON = "2026-11-26"


def dims_on(name: str, date: str) -> tuple[int, int, int, int]:
    """The dimensions (d_model, d_ff, layers, heads) a size name meant on `date`, an ISO date
    or timestamp: for rows that record none.

    Raises:
        KeyError: `name` is no size of lmcore's.
    """
    if name == "xl" and date[:10] < _XL_RENAMED_ON:
        return _XL_2025
    size = lmcore.MODEL_SIZES[name]
    return (size.d_model, size.d_ff, size.num_layers, size.num_heads)


# What the model leaves out of a bench-zero variant it predicts as another of its family.
_ZERO_CAVEATS: Mapping[str, str] = {
    "zero1:torch": "torch's ZeroRedundancyOptimizer (it broadcasts each parameter in place: no "
    "staging)",
    "fsdp:torch": "torch FSDP2 (modelled as zero.FSDP)",
}


def _check_row(
    source: str, config: str, quantity: str, measured: float | None, predicted: float | None,
    phase: str | None, note: str,
) -> dict[str, Any]:  # fmt: skip
    error = None
    if measured is not None and predicted is not None and measured:
        error = 100 * (predicted - measured) / measured
    return {
        "source": source,
        "config": config,
        "quantity": quantity,
        "measured_mib": measured,
        "predicted_mib": predicted,
        "error_pct": error,
        "phase": phase,
        "note": note,
    }


def _model_config(row: Mapping[str, Any], run: Run) -> tuple[lmcore.ModelConfig, str] | str:
    """The `ModelConfig` a bench-model row ran, and its label; or what the row lacks."""
    dims = [row.get(k) for k in ("d_model", "d_ff", "num_layers", "num_heads")]
    name = row.get("size")
    if any(d is None for d in dims):
        if name is None or (name not in lmcore.MODEL_SIZES and name != "xl"):
            return "records neither its dimensions nor a known size"
        dims = list(dims_on(name, run.date))
    ctx = row.get("ctx") or row.get("context_length")
    vocab = row.get("vocab_size") or run.config.get("vocab_size")
    if ctx is None or vocab is None:
        return "records no context length or vocabulary"
    attention = row.get("attention", "naive")
    if attention not in ATTENTION_KINDS:
        return f"attention {attention!r} is not modelled"
    config = lmcore.ModelConfig(
        vocab_size=vocab, context_length=ctx, d_model=dims[0], d_ff=dims[1],
        num_layers=dims[2], num_heads=dims[3], attention=attention,
        num_kv_heads=row.get("num_kv_heads"),
    )  # fmt: skip
    return config, recorded_size_label(name, dims)


def _activation_like(phase: Phase) -> int:
    names = ("activations", "autocast weight cache", "loss", "backward working set")
    return sum(phase.bytes_of(n) for n in names)


def _check_model_row(source: str, run: Run, row: Mapping[str, Any]) -> list[dict[str, Any]]:
    """bench-model's peak (and the activations it implies) against the prediction."""
    found = _model_config(row, run)
    label = str(row.get("size"))
    if isinstance(found, str):
        return [_check_row(source, label, "peak", row.get("peak_mib"), None, None, found)]
    config, label = found
    label = (
        f"{label}, ctx {config.context_length}, batch {row['batch']}, {row['mode']}, "
        f"{row['dtype']}, {config.attention}"
    )
    if row.get("status", "ok") != "ok" or row.get("peak_mib") is None:
        why = "no peak recorded (CPU run)" if row.get("status", "ok") == "ok" else row["status"]
        return [_check_row(source, label, "peak", None, None, None, why)]
    # Rows recorded before bench-model had these options ran its defaults.
    plan = TrainingPlan(
        config, batch=row["batch"], mode=row["mode"], hold_logits=False,
        optimizer=row.get("optimizer") or "lmcore", loss=row.get("loss") or "materialized",
        activation_checkpointing=row.get("activation_checkpointing") or "none",
        precision="fp32" if row["dtype"] == "fp32" else "bf16-autocast",
    )  # fmt: skip
    estimate = estimate_memory(plan)
    peak = estimate.peak
    notes = []
    if row.get("compiled"):
        notes.append("compiled: the model predicts eager residuals")
    if "--profile" in (run.command or ""):
        notes.append("under torch.profiler")
    measured = row["peak_mib"]
    out = [_check_row(source, label, "peak", measured, peak.total / MIB, peak.name,
                      "; ".join(notes) or "peak only: no breakdown recorded")]  # fmt: skip
    acts = _activation_like(peak)
    if acts:
        implied = measured - (peak.total - acts) / MIB
        share = acts / peak.total
        out.append(
            _check_row(
                source,
                label,
                "activations (implied)",
                implied,
                acts / MIB,
                peak.name,
                f"measured peak − predicted non-activation terms; "
                f"{share:.0%} of the predicted peak",
            )
        )
        out[-1]["share"] = share
    return out


def _check_zero_run(source: str, run: Run) -> list[dict[str, Any]]:
    """bench-zero's breakdown and peaks against the prediction, per variant."""
    cfg = run.config
    shape = cfg.get("shape") or {}
    dims = [shape.get(k) for k in ("d_model", "d_ff", "num_layers", "num_heads")]
    name = shape.get("name") or cfg.get("size")
    if any(d is None for d in dims):
        if name is None:
            return [_check_row(source, "?", "run", None, None, None, "records no model")]
        dims = list(dims_on(name, run.date))
    world = cfg.get("nproc", cfg.get("world_size", 2))  # `world_size` before the one vocabulary
    # a vocabulary left out is the size's own (recorded as None since sizes keep their own)
    vocab = cfg.get("vocab_size") or lmcore.MODEL_SIZES[name].vocab_size
    model = lmcore.ModelConfig(
        vocab_size=vocab, context_length=cfg["context_length"], d_model=dims[0],
        d_ff=dims[1], num_layers=dims[2], num_heads=dims[3],
    )  # fmt: skip
    label = (
        f"{recorded_size_label(name, dims)}, ctx {model.context_length}, batch {cfg['batch']}/rank"
    )
    out = []
    on_cuda = run.env.get("device_type") == "cuda"
    for row in run.rows:
        variant = row.get("variant")
        what = (
            f"{label}, {variant}"
            + (f" {row['compute_dtype']}" if row.get("compute_dtype") else "")
            + (" bf16 storage" if row.get("storage_dtype") == "bf16" else "")
            + (f" {row['bucket_mb']:g} MB" if row.get("bucket_mb") is not None else "")
        )
        if variant not in LAYOUTS:
            out.append(_check_row(source, what, "all", None, None, None, "variant not modelled"))
            continue
        if row.get("status") != "ok":
            out.append(_check_row(source, what, "all", None, None, None, str(row.get("status"))))
            continue
        caveat = _ZERO_CAVEATS.get(variant, "")
        precision = "bf16-master" if row.get("compute_dtype") == "bf16" else "fp32"
        if row.get("storage_dtype") == "bf16":
            precision = "bf16"
        options = {"head_units": _head_units(row)}
        if ALL_LAYOUTS[variant].optimizer == "ShardedOptimizer":
            options["zero_bucket_mb"] = row.get("bucket_mb")
        plan = TrainingPlan(
            model, batch=cfg["batch"] * world, layout=variant, dp=world, precision=precision,
            optimizer=cfg.get("optimizer", "torch"), **options,
        )  # fmt: skip
        estimate = estimate_memory(plan)
        end = estimate.phase("backward end")
        step = estimate.phase("optimizer step")
        predicted = {
            "param": end.bytes_of("parameters"),
            "grad": step.bytes_of("gradients"),
            "state": step.bytes_of("optimizer state") + step.bytes_of("master weights"),
        }
        for key, value in predicted.items():
            out.append(
                _check_row(
                    source,
                    what,
                    f"{key}",
                    row.get(f"{key}_mib"),
                    value / MIB,
                    None,
                    caveat or "tensor bytes on the busiest rank",
                )
            )
        if not on_cuda:
            continue
        before = max((p for p in estimate.phases if p.name != "optimizer step"),
                     key=lambda p: p.total)  # fmt: skip
        setup = estimate.phase("after set-up")
        if ALL_LAYOUTS[variant].shards_weights:
            # bench-zero builds the whole model on the device in float32, then shards it: the
            # set-up's peak is that model, not the shards left after it.
            whole = TrainingPlan(
                model, batch=cfg["batch"], layout="single", dp=1, precision="fp32",
                optimizer=cfg.get("optimizer", "torch"),
            )  # fmt: skip
            built = estimate_memory(whole).phase("after set-up")
            setup = built if built.total > setup.total else setup
        peaks = {
            "init": setup,
            "before_step": before,
            "after_step": estimate.peak,
        }
        for key, phase in peaks.items():
            out.append(
                _check_row(
                    source,
                    what,
                    f"{key} peak",
                    row.get(f"{key}_mib"),
                    phase.total / MIB,
                    phase.name,
                    caveat,
                )
            )
    return out


def _head_units(row: Mapping[str, Any]) -> bool:
    """Whether an FSDP row's embedding and LM head were units of their own: the units it
    records (`fsdp_units`); a row recorded before it recorded them had them in the root."""
    return "LMHead" in (row.get("fsdp_units") or ())


def _moment_bytes(row: Mapping[str, Any]) -> int | None:
    """Bytes of AdamW's moments a bench-step row kept: its `moment_dtype`; in a row recorded
    before it recorded them, float32 for lmcore's fused AdamW (its default then), else the
    parameters' dtype (None: the plan's own)."""
    dtype = row.get("moment_dtype")
    if dtype is not None:
        return {"fp32": 4, "bf16": 2}[dtype]
    return 4 if row.get("optimizer") == "lmcore-fused" else None


# The keys a bench-step row must carry to be predicted: the model's dimensions, the context, the
# batch per rank, a precision, attention, loss, optimizer and checkpointing in bench-plan's
# vocabulary, a layout of `single`, `ddp`, `zero1` or `fsdp` over `world_size` ranks, and the
# measured peak. The torch-native row's loss is bench-plan's `chunked`. Rows may also record
# `moment_dtype` and `fsdp_units` (`_moment_bytes`, `_head_units`).
STEP_KEYS = (
    "d_model", "d_ff", "num_layers", "num_heads", "vocab_size", "ctx", "batch", "precision",
    "attention", "loss", "optimizer", "activation_checkpointing", "layout", "world_size",
    "peak_mib",
)  # fmt: skip


def _check_step_row(source: str, run: Run, row: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A bench-step row, when it records `STEP_KEYS` (and optionally `param_mib`, `grad_mib`,
    `state_mib`)."""
    missing = [k for k in STEP_KEYS if row.get(k) is None]
    label = str(row.get("size") or row.get("impl") or "?")
    if missing:
        return [_check_row(source, label, "peak", row.get("peak_mib"), None, None,
                           f"lacks {', '.join(missing)}")]  # fmt: skip
    dims = [row["d_model"], row["d_ff"], row["num_layers"], row["num_heads"]]
    config = lmcore.ModelConfig(
        vocab_size=row["vocab_size"], context_length=row["ctx"], d_model=dims[0], d_ff=dims[1],
        num_layers=dims[2], num_heads=dims[3], attention=row["attention"],
        num_kv_heads=row.get("num_kv_heads"),
    )  # fmt: skip
    world = row["world_size"]
    try:
        plan = TrainingPlan(
            config, batch=row["batch"] * world, layout=row["layout"], dp=world,
            precision=row["precision"], activation_checkpointing=row["activation_checkpointing"],
            loss=row["loss"], optimizer=row["optimizer"], moment_bytes=_moment_bytes(row),
            head_units=_head_units(row), compiled=bool(row.get("compiled")),
        )  # fmt: skip
    except ValueError as err:
        return [_check_row(source, label, "peak", row["peak_mib"], None, None, str(err))]
    estimate = estimate_memory(plan)
    impl = f"{row['impl']}, " if row.get("impl") else ""
    label = f"{recorded_size_label(row.get('size'), dims)}, {impl}{plan.describe()}"
    peak = _check_row(source, label, "peak", row["peak_mib"], estimate.peak.total / MIB,
                      estimate.peak.name, "")  # fmt: skip
    gap = known_gap(peak)
    out = [{**peak, "note": KNOWN_GAPS[source, gap]} if gap else peak]
    step = estimate.phase("optimizer step") if plan.mode == "train-step" else estimate.peak
    for key, names in (("param", ("parameters",)), ("grad", ("gradients",)),
                       ("state", ("optimizer state", "master weights"))):  # fmt: skip
        if row.get(f"{key}_mib") is None:
            continue
        if key == "grad" and row.get("peak_phase") != "optimizer":
            # bench-step's grad_mib is the gradients alive at the peak (a split of it), all of
            # them only when the peak is the optimizer step's: not the tensor total predicted.
            note = f"the gradients alive at a {row.get('peak_phase')} peak, not all of them"
            out.append(_check_row(source, label, key, row[f"{key}_mib"], None, None, note))
            continue
        value = sum(step.bytes_of(n) for n in names) / MIB
        out.append(_check_row(source, label, key, row[f"{key}_mib"], value, step.name, ""))
    return out


@dataclass(frozen=True)
class CheckResult:
    """`check_results`' answer.

    Attributes:
        rows: per measured quantity, `CHECK_COLUMNS`.
        notes: the headline (errors of the tensors, the peaks and the activations) and what was
            read.
        files: the result files read.
    """

    rows: list[dict[str, Any]]
    notes: list[str]
    files: list[str]


def check_results(folder: str | Path) -> CheckResult:
    """Predict every bench-model, bench-zero and bench-step row of the results in `folder`.

    Reads each `*.json` at the top of `folder` (superseded results in sub-folders are not read)
    that is a bench result of tool `model`, `warmup` (bench-model rows), `zero` or `step`.

    Returns:
        Per measured quantity, the measurement and the prediction in MiB, the error in % of the
        measurement, the predicted phase, and what differs; rows the model cannot cover say why
        instead of a prediction. The notes give the headline.

    Raises:
        ValueError: `folder` is not a directory.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"{folder}: not a directory of result files")
    rows: list[dict[str, Any]] = []
    read = []
    for path in sorted(folder.glob("*.json")):
        try:
            run = load_json(path)
        except (ValueError, KeyError, TypeError):
            continue  # not a bench result (a GPU test record, say)
        source = path.stem
        if run.tool in ("model", "warmup"):
            for row in run.rows:
                rows += _check_model_row(source, run, row)
        elif run.tool == "zero":
            rows += _check_zero_run(source, run)
        elif run.tool == "step":
            for row in run.rows:
                rows += _check_step_row(source, run, row)
        else:
            continue
        read.append(path.name)
    rows = _collapse_unmeasured(rows)
    notes = _check_headline(rows)
    notes.append(
        f"Read {len(read)} result files ({', '.join(read) or 'none'}); bench-model rows are "
        "predicted as single-GPU steps of lmcore's eager model with the step bench-model runs "
        "(logits not held; the loss, AdamW and checkpointing the row records, else the "
        "materialised loss, lmcore's foreach AdamW, none), bench-zero rows as the layout of their "
        "variant with the optimizer they record. Errors: (predicted − measured) / measured."
    )
    return CheckResult(rows, notes, read)


def _collapse_unmeasured(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per file and reason for the rows with nothing measured (a CPU run's, say)."""
    out, seen = [], {}
    for row in rows:
        if row["measured_mib"] is not None or row["predicted_mib"] is not None:
            out.append(row)
            continue
        key = (row["source"], row["note"])
        if key in seen:
            seen[key]["count"] += 1
            continue
        seen[key] = dict(row, count=1)
        out.append(seen[key])
    for row in seen.values():
        if row.pop("count") > 1:
            row["config"] = f"{row['config']} and the other rows of the file"
    return out


def _spread(values: Sequence[float]) -> str:
    if not values:
        return "none"
    return (
        f"{min(values):+.1f} % to {max(values):+.1f} % (median {statistics.median(values):+.1f} "
        f"%, {len(values)} values)"
    )


def _check_headline(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The check's headline: errors of the tensors, of the peaks and of the activations."""

    def errors(select) -> list[float]:
        return [r["error_pct"] for r in rows if r["error_pct"] is not None and select(r)]

    tensors = errors(lambda r: r["quantity"] in ("param", "grad", "state"))

    def is_peak(r: Mapping[str, Any]) -> bool:
        return r["quantity"] == "peak" or r["quantity"].endswith(" peak")

    peaks = errors(lambda r: is_peak(r) and not known_gap(r))
    with_gaps = errors(is_peak)
    activation_rows = [
        r for r in rows if r["quantity"].startswith("activations") and r["error_pct"] is not None
    ]
    large = [r["error_pct"] for r in activation_rows if r["share"] >= 0.25]
    small = [r["error_pct"] for r in activation_rows if r["share"] < 0.25]
    act_mib = [r["measured_mib"] - r["predicted_mib"] for r in activation_rows]
    worst = max((abs(e) for e in tensors), default=math.nan)
    uncovered = sum(1 for r in rows if r["predicted_mib"] is None)
    return [
        f"Parameters, gradients and optimizer state (bench-zero's tensor sizes): largest error "
        f"{worst:.2f} % ({len(tensors)} values; target: within 10 %).",
        f"Peaks (max_memory_allocated, bench-model, bench-zero and bench-step): "
        f"{_spread(peaks)}"
        + (
            f"; with the {len(with_gaps) - len(peaks)} known gaps (their notes say why) "
            f"{_spread(with_gaps)}"
            if len(with_gaps) > len(peaks)
            else ""
        )
        + ".",
        "Activations (the measured peak minus the predicted non-activation terms, against the "
        f"predicted activations, loss and working set at the peak): {_spread(large)} where they "
        f"are at least a quarter of the peak; {_spread(small)} where they are less (no-grad "
        "forwards, peaks at the end of backward: a few hundred MiB beside gigabytes of weights); "
        f"in MiB {min(act_mib, default=0):+,.0f} to {max(act_mib, default=0):+,.0f}. The "
        "remainder is what the model leaves out: the CUDA caching allocator's rounding (it does "
        "not split a cached block when less than 1 MiB would remain, so an allocation can hold "
        "up to 1 MiB more than its tensor), cuBLAS workspaces, and the transients it only "
        "estimates.",
        f"Rows without a prediction: {uncovered}; the note says why.",
    ]
