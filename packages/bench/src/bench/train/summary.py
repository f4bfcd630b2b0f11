"""What a finished bench-train run left in its folder, read back: its summary (`read_summary`), the
machine it ran on (`run_env`), and several runs' speed side by side (`speed_comparison`,
`plot_speed`). `bench.train.results` and `bench.train.scaling` build their result files on it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from bench.core.plots import hbar_plot
from bench.core.results import Run
from bench.train.config_files import recorded_config
from bench.train.run import SUMMARY

__all__ = ["plot_speed", "read_summaries", "read_summary", "run_env", "speed_comparison"]


def read_summary(folder: str | Path) -> dict[str, Any]:
    """A finished run's `summary.json` (in its output folder), its configuration in the current
    names (`bench.train.config_files.recorded_config`).

    Raises:
        ValueError: the folder holds no readable `summary.json` (the message names it).
    """
    path = Path(folder) / SUMMARY
    if not path.is_file():
        raise ValueError(
            f"{folder} holds no {SUMMARY}: not the folder of a finished bench-train run (a run "
            "writes it last; one that stopped early finishes with bench-train --resume)"
        )
    try:
        summary = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} is not readable: {error}") from None
    return {**summary, "config": recorded_config(summary)}


def read_summaries(runs: Sequence[tuple[str, str | Path]]) -> dict[str, dict[str, Any]]:
    """The summaries of labelled run folders (`read_summary`), by label, in the order given.

    Raises:
        ValueError: a label given twice (the table would hold only one of its runs), or a
            folder that is not a finished run's.
    """
    labels = [label for label, _ in runs]
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    if repeated:
        raise ValueError(
            f"the label {', '.join(map(repr, repeated))} names several runs; give each "
            "LABEL=RUN a label of its own"
        )
    return {label: read_summary(folder) for label, folder in runs}


def run_env(summary: dict[str, Any]) -> dict[str, Any]:
    """The `collect_env` record of the machine a run's `summary.json` was written on (`env`).

    Summaries from before the record was stored whole rebuild the part they kept.
    """
    if "env" in summary:
        return summary["env"]
    device = summary["config"]["device"]
    return {
        "device": device,
        "device_type": torch.device(device).type,
        "device_name": summary["device_name"],
        **summary["versions"],
        "date": summary["date"],
        "command": summary["command"],
        "git_revision": summary["git_revision"],
        "git_dirty": summary["git_dirty"],
        "packages": summary["packages"],
    }


def speed_comparison(
    runs: Sequence[tuple[str, str | Path]], *, baseline: str, command: str | None = None
) -> Run:
    """One table of finished runs' speed side by side, with each run's ratio to `baseline`.

    Args:
        runs: (label, output folder) of runs whose `summary.json` to read, in table order.
        baseline: the label of the run the `vs_baseline` ratios divide by (tokens/s).
        command: the command line to record; the process's own when None.

    Returns:
        A `Run` (tool `"train_speed"`): a row per run with `tokens_per_s`, `mfu`, `vs_baseline`,
        `final_train_loss`, `final_val_loss`, the first step's time and what the run used
        (attention, compile, optimizer, `--pack`). Its environment is the baseline run's
        (device, versions, date, git revision), so the table can be built on any machine from
        run folders copied off the GPU.

    Raises:
        ValueError: `baseline` is not one of the labels, a label is repeated, or a folder is
            not a finished run's.
    """
    summaries = read_summaries(runs)
    if baseline not in summaries:
        raise ValueError(f"baseline {baseline!r} is not one of the runs {list(summaries)}")
    reference = summaries[baseline]["tokens_per_s"]
    rows = []
    for label, summary in summaries.items():
        c = summary["config"]
        rows.append(
            {
                "run": label,
                "attention": c["attention"],
                "compile": c["compile"],
                "optimizer": c["optimizer"],
                "pack": c.get("pack", False),  # recorded since --pack exists
                "step": "torch-native" if c["baseline"] else "bench.core.step",
                "tokens_per_s": summary["tokens_per_s"],
                "mfu": summary["mfu"],
                "vs_baseline": summary["tokens_per_s"] / reference,
                "first_step_s": summary.get("first_step_s"),
                "final_train_loss": summary["final_train_loss"],
                "final_val_loss": summary["final_val_loss"],
            }
        )
    first = summaries[runs[0][0]]
    c = first["config"]
    title = (
        f"bench-train speed: {c['size']}, context {c['context_length']}, batch {c['batch_size']}, "
        f"{c['precision']}, {first['world_size']} rank(s)"
    )
    notes = [
        f"tokens/s and MFU over the steps after the first logged interval of each run; "
        f"vs_baseline = tokens/s over the `{baseline}` run's; first_step_s: the first step's "
        "wall time, compilation included.",
        "MFU: lmcore.training_flops per step (6·N_matmul + 12·L·T·d per token, PaLM appendix B) "
        "/ step time / the GPU's dense bf16 peak (bench.core.hardware).",
    ]
    return Run.create(
        "train_speed",
        rows,
        device=c["device"],
        config={"runs": {label: str(d) for label, d in runs}, "baseline": baseline},
        command=command,
        title=title,
        notes=notes,
        env=run_env(summaries[baseline]),
    )


def plot_speed(run: Run, path: str | Path) -> Path:
    """Bars of tokens/s per run of a `speed_comparison`."""
    return hbar_plot(
        run.rows,
        label="run",
        values=(("tokens_per_s", "tokens/s"),),
        path=path,
        title=run.title,
        xlabel="tokens per second (higher is better)",
    )
