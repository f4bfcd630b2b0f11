"""bench-train-results' precision table: finished bench-train runs of the same training in other
precisions side by side (`train_precision_<device>_<date>.{md,json,csv,png}`), e.g. fp16 with
loss scaling against bf16 autocast.

The first run is the reference. Every run must have trained like it but for the precision (the
`bench.train.scaling.SAME` options, the model and the data), else the table is refused with the
differences listed. Per run: tokens/s, the final training and validation losses and their
differences from the reference's, the largest difference of the training losses over the steps
both logged, and fp16's skipped steps and final loss scale. The figure draws each run's
training and validation losses over the steps; the notes say, from the rows, how far each run's
final validation loss ends from the reference's.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from bench.core.plots import line_plot
from bench.core.results import Run, result_stem, save_csv, save_json
from bench.train.record import logged_losses, read_metrics
from bench.train.scaling import MODEL, SAME, differences
from bench.train.summary import read_summary, run_env

__all__ = ["COLUMNS", "plot_precisions", "precision_comparison", "precision_result"]

COLUMNS = (
    "run", "precision", "steps", "tokens_per_s", "final_train_loss", "loss_diff",
    "max_loss_diff", "final_val_loss", "val_diff", "skipped_steps", "loss_scale",
)  # fmt: skip


# What runs compared across precisions share: everything a scaling comparison holds equal but
# the precision, and the model.
_COMPARED = tuple(k for k in (*SAME, *MODEL) if k != "precision")


def precision_comparison(
    runs: Sequence[tuple[str, str | Path]], *, command: str | None = None
) -> Run:
    """One table of finished runs in several precisions, each against the first.

    Args:
        runs: (label, output folder) of finished runs, the reference first.
        command: the command line to record; the process's own when None.

    Returns:
        A `Run` (tool `"train_precision"`), a row per run with `COLUMNS`; its environment is the
        reference run's.

    Raises:
        ValueError: fewer than two runs, or one that trained otherwise than the reference.
    """
    if len(runs) < 2:
        raise ValueError("give at least two LABEL=RUN to --precision: the reference first")
    summaries = {label: read_summary(folder) for label, folder in runs}
    ref_label = runs[0][0]
    ref = summaries[ref_label]
    problems = [
        f"{label}: {', '.join(diffs)}"
        for label, s in summaries.items()
        if (diffs := differences(s["config"], ref["config"], keys=_COMPARED))
    ]
    if problems:
        raise ValueError("runs that trained otherwise cannot be compared: " + "; ".join(problems))
    theirs = logged_losses(dict(runs)[ref_label])
    rows, notes = [], []
    for label, folder in runs:
        s = summaries[label]
        ours = logged_losses(folder)
        common = ours.keys() & theirs.keys()
        row = {
            "run": label, "precision": s["config"]["precision"], "steps": s["steps"],
            "tokens_per_s": s["tokens_per_s"], "final_train_loss": s["final_train_loss"],
            "loss_diff": s["final_train_loss"] - ref["final_train_loss"],
            "max_loss_diff": max((abs(ours[k] - theirs[k]) for k in common), default=None),
            "final_val_loss": s["final_val_loss"],
            "val_diff": s["final_val_loss"] - ref["final_val_loss"],
            "skipped_steps": s.get("skipped_steps"), "loss_scale": s.get("loss_scale"),
        }  # fmt: skip
        rows.append(row)
        if label != ref_label:
            relative = row["val_diff"] / ref["final_val_loss"]
            skipped = row["skipped_steps"]
            notes.append(
                f"{label} ({row['precision']}) ends at validation loss "
                f"{row['final_val_loss']:.4f}, {relative:+.2%} from {ref_label}'s "
                f"{ref['final_val_loss']:.4f} after {row['steps']} steps"
                + ("" if skipped is None else f", {skipped} of them skipped for overflow")
                + "."
            )
    c = ref["config"]
    notes.insert(0, (
        "loss_diff, val_diff: final losses minus the first run's; max_loss_diff: the largest "
        "absolute difference of the training losses over the steps both logged; skipped_steps, "
        "loss_scale: fp16's optimizer steps skipped for inf or NaN gradients and its final "
        "loss scale."
    ))  # fmt: skip
    return Run.create(
        "train_precision", rows, device=c["device"],
        config={"runs": {label: str(folder) for label, folder in runs}}, command=command,
        title=f"bench-train precisions: {c['size']}, context {c['context_length']}, batch "
        f"{c['batch_size']}, {c['attention']}, {ref['steps']} steps",
        columns=list(COLUMNS), notes=notes, env=run_env(ref),
    )  # fmt: skip


def plot_precisions(run: Run, path: str | Path) -> Path:
    """Each run's training and validation losses over the steps, each a line of its own."""
    rows = []
    for label, folder in run.config["runs"].items():
        for record in read_metrics(folder):
            rows.append({"step": record["step"], "loss": record["loss"], "series": label})
            if record.get("val_loss") is not None:
                rows.append({"step": record["step"], "loss": record["val_loss"],
                             "series": f"{label} (validation)"})  # fmt: skip
    return line_plot(rows, x="step", y="loss", series="series", path=path, title=run.plot_title,
                     ylabel="cross-entropy loss (nats/token)")  # fmt: skip


def precision_result(
    runs: Sequence[tuple[str, str | Path]], out: str | Path, *, notes: Sequence[str] = ()
) -> Path:
    """Write `train_precision_*` (`.md`, `.json`, `.csv`, `.png`) for the runs under `out`;
    returns the `.md`.

    Raises:
        ValueError: see `precision_comparison`.
    """
    run = precision_comparison(runs)
    run.notes.extend(notes)
    stem = Path(out) / result_stem("train_precision", run.env)
    run.plots.append(plot_precisions(run, stem.with_suffix(".png")).name)
    save_json(run, stem.with_suffix(".json"))
    save_csv(run, stem.with_suffix(".csv"))
    stem.with_suffix(".md").write_text(run.to_markdown() + "\n")
    return stem.with_suffix(".md")
