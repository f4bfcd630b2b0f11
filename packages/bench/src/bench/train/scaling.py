"""bench-train-results' scaling table: finished bench-train runs of the same training on one rank
and on several, side by side (`train_scaling_<devices>_<date>.{md,json,png}`).

A run's reference is the one-rank run of the same model among the runs (the one with
`--parallel single` where there are several). Against it each run gets:

- `speedup`: its tokens/s over the reference's, and `scaling_eff`: the speedup over the ranks
  (1: every rank as fast as one process alone);
- `loss_diff`: its final training loss minus the reference's, and `max_loss_diff`: the largest
  absolute difference over the steps both logged. With the same seed and global batch the
  ranks train together on exactly the batch one process does (`bench.train.data.Batches`), so
  the losses differ only by the order of floating-point sums (all-reduces, sharded steps) and
  the rounding of gradients reduced in bf16.

Comparisons hold only between runs that trained alike: every run must agree with its reference
on `SAME` (the data, tokenizer, batch, schedule, seed, precision and the step's
implementation), else the table is refused with the differences listed. Everything is read
from the run folders, so the table can be built on any machine from folders copied off the GPUs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.core.results import Run, result_stem, save_csv, save_json
from bench.train.record import logged_losses
from bench.train.summary import plot_speed, read_summaries, run_env

__all__ = [
    "COLUMNS",
    "MODEL",
    "SAME",
    "TITLE_SETTINGS",
    "differences",
    "scaling_comparison",
    "scaling_result",
    "scaling_title",
]

# The options that name the model: runs that share them are compared with each other.
MODEL = ("size", "d_model", "num_layers", "num_heads", "num_kv_heads", "d_ff", "context_length")
# The options a run must share with its reference for tokens/s and losses to compare.
SAME = (
    "tokenizer",
    "vocab_size",
    "batch_size",
    "grad_accum",
    "steps",
    "lr",
    "min_lr",
    "warmup_steps",
    "weight_decay",
    "grad_clip",
    "seed",
    "precision",
    "attention",
    "loss",
    "optimizer",
    "compile",
    "activation_checkpointing",
)
# The settings a table's title names (config key, how it reads): those every run shares once,
# the others per size (a table may hold sizes trained at different batches and lengths).
TITLE_SETTINGS = (
    ("context_length", "context {}"),
    ("batch_size", "global batch {}"),
    ("precision", "{}"),
    ("steps", "{} steps"),
)
COLUMNS = (
    "run",
    "size",
    "parallel",
    "ranks",
    "tokens_per_s",
    "mfu",
    "speedup",
    "scaling_eff",
    "peak_memory_mib",
    "final_train_loss",
    "loss_diff",
    "max_loss_diff",
    "final_val_loss",
)


def _and(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def scaling_title(summaries: Iterable[Mapping[str, Any]]) -> str:
    """The title of a scaling table of runs with these `summary.json`s: the sizes, each of
    `TITLE_SETTINGS` that all runs share, the rank counts, then per size the settings that
    differ between sizes (`bench-train scaling: small, xl, context 256, bf16-autocast, 1, 2 and
    4 ranks; small: global batch 32, 200 steps; xl: global batch 8, 100 steps`)."""
    summaries = list(summaries)
    configs = [s["config"] for s in summaries]
    sizes = list(dict.fromkeys(str(c["size"]) for c in configs))

    def values(key: str, size: str | None = None) -> list[str]:
        found = (c.get(key) for c in configs if size is None or str(c["size"]) == size)
        return [str(v) for v in dict.fromkeys(found)]

    shared = [(k, text) for k, text in TITLE_SETTINGS if len(values(k)) == 1]
    differing = [(k, text) for k, text in TITLE_SETTINGS if (k, text) not in shared]
    ranks = [str(n) for n in sorted({s["world_size"] for s in summaries})]
    rank_text = f"{_and(ranks)} rank{'s' if ranks != ['1'] else ''}"
    title = ", ".join([*sizes, *(text.format(values(k)[0]) for k, text in shared), rank_text])
    for size in sizes if differing else ():
        per_size = [text.format(" or ".join(values(k, size))) for k, text in differing]
        title += f"; {size}: {', '.join(per_size)}"
    return f"bench-train scaling: {title}"


def _model(config: Mapping[str, Any]) -> tuple[Any, ...]:
    return tuple(config.get(key) for key in MODEL)


def differences(
    config: Mapping[str, Any], reference: Mapping[str, Any], *, keys: Sequence[str] = SAME
) -> list[str]:
    """The options of `keys` (and the data file's name) on which `config` differs from
    `reference`, each as `--flag ours vs theirs`."""
    keys = [k for k in keys if config.get(k) != reference.get(k)]
    found = [f"--{k.replace('_', '-')} {config.get(k)} vs {reference.get(k)}" for k in keys]
    if Path(str(config["data"])).name != Path(str(reference["data"])).name:
        found.append(f"--data {config['data']} vs {reference['data']}")
    return found


def _reference(label: str, summaries: Mapping[str, dict[str, Any]]) -> str | None:
    """The label of `label`'s one-rank run of the same model (`--parallel single` first)."""
    model = _model(summaries[label]["config"])
    alone = [
        other
        for other, s in summaries.items()
        if s["world_size"] == 1 and _model(s["config"]) == model
    ]
    alone.sort(key=lambda other: summaries[other]["config"]["parallel"] != "single")
    return alone[0] if alone else None


def _row(label: str, summary: dict[str, Any], reference: dict[str, Any] | None) -> dict[str, Any]:
    c, ranks = summary["config"], summary["world_size"]
    row = dict.fromkeys(COLUMNS) | {
        "run": label,
        "size": c["size"],
        "parallel": c["parallel"],
        "ranks": ranks,
        "tokens_per_s": summary["tokens_per_s"],
        "mfu": summary.get("mfu"),
        "peak_memory_mib": summary.get("peak_memory_mib"),
        "final_train_loss": summary["final_train_loss"],
        "final_val_loss": summary["final_val_loss"],
    }
    if reference is None:
        return row
    speedup = summary["tokens_per_s"] / reference["tokens_per_s"]
    row |= {"speedup": speedup, "scaling_eff": speedup / ranks}
    row["loss_diff"] = summary["final_train_loss"] - reference["final_train_loss"]
    return row


def scaling_comparison(
    runs: Sequence[tuple[str, str | Path]], *, command: str | None = None
) -> Run:
    """One table of finished runs on one and several ranks, each against its one-rank reference.

    Args:
        runs: (label, output folder) of finished runs, in table order.
        command: the command line to record; the process's own when None.

    Returns:
        A `Run` (tool `"train_scaling"`), a row per run with `COLUMNS` (see the module
        docstring); a model without a one-rank run leaves its rows' comparisons empty, and a
        note says so. Its environment is the first reference's (else the first run's), so the
        table can be built on any machine.

    Raises:
        ValueError: no runs, a label given twice, a folder that is not a finished run's, or
            a run that trained otherwise than its reference (the options that differ are
            named).
    """
    if not runs:
        raise ValueError("give at least one LABEL=RUN to --scaling")
    summaries = read_summaries(runs)
    folders = dict(runs)
    references = {label: _reference(label, summaries) for label in summaries}
    problems = []
    for label, ref in references.items():
        if ref is not None:
            diffs = differences(summaries[label]["config"], summaries[ref]["config"])
            problems += [f"{label} against {ref}: {', '.join(diffs)}"] if diffs else []
    if problems:
        raise ValueError("runs that trained otherwise cannot be compared: " + "; ".join(problems))
    rows, missing = [], []
    for label, summary in summaries.items():
        ref = references[label]
        rows.append(_row(label, summary, None if ref is None else summaries[ref]))
        if ref is None:
            missing.append(label)
            continue
        ours, theirs = logged_losses(folders[label]), logged_losses(folders[ref])
        common = ours.keys() & theirs.keys()
        if common:
            rows[-1]["max_loss_diff"] = max(abs(ours[s] - theirs[s]) for s in common)
    first = summaries[next((r for r in references.values() if r), runs[0][0])]
    notes = [
        "speedup: tokens/s over the one-rank run of the same model (with --parallel single where "
        "there is one); scaling_eff = speedup / ranks. tokens/s after each run's first logged "
        "interval (bench-train's summary); mfu: its model FLOP utilisation (the training "
        "FLOPs over the data-sheet dense peak of all the GPUs in use); peak_memory_mib: the "
        "busiest rank's peak allocation over the run (CUDA only).",
        "loss_diff: final training loss minus the one-rank run's; max_loss_diff: the largest "
        "absolute difference over the steps both logged. Same seed, same global batch: the "
        "ranks train together on the batch one process trains on, so only the order of "
        "floating-point sums and the rounding of gradients reduced in bf16 tell them apart.",
    ]
    if missing:
        notes.append(f"No one-rank run of the same model for {', '.join(missing)}: no ratios.")
    return Run.create(
        "train_scaling",
        rows,
        device=first["config"]["device"],
        config={"runs": {label: str(folder) for label, folder in runs}},
        command=command,
        title=scaling_title(summaries.values()),
        columns=list(COLUMNS),
        notes=notes,
        env=run_env(first),
    )


def scaling_result(
    runs: Sequence[tuple[str, str | Path]], out: str | Path, *, notes: Sequence[str] = ()
) -> Path:
    """Write `train_scaling_*` (`.md`, `.json`, `.png`) for the (label, run folder) pairs under
    `out`, named for the most ranks any run used (`train_scaling_2xh100_<date>`); returns the
    `.md`.

    Raises:
        ValueError: see `scaling_comparison`.
    """
    run = scaling_comparison(runs)
    run.notes.extend(notes)
    ranks = max(row["ranks"] for row in run.rows)
    stem = Path(out) / result_stem("train_scaling", run.env, num_devices=ranks)
    run.plots.append(plot_speed(run, stem.with_suffix(".png")).name)  # tokens/s per run
    save_json(run, stem.with_suffix(".json"))
    save_csv(run, stem.with_suffix(".csv"))
    stem.with_suffix(".md").write_text(run.to_markdown() + "\n")
    return stem.with_suffix(".md")
