"""bench-matrix's implementation: every (size, attention, parallel mode) a short bench-train run
of its own, the rows read from their summaries, the final losses set against each other, and the
matrix's files (what it does: `bench.commands.matrix`; its options: `bench.train.matrix_config`).

A cell is `run_train` of its `TrainConfig` in `cells/<size>_<attention>_<parallel>` under the
matrix's folder: one rank in this process (its peak memory counted from its own start), or the
ranks bench-train starts itself. The token cache is the matrix's (`cache/`), so text is
tokenised once. A cell's state decides what runs: a summary of the same options is read back
(`reused`); a checkpoint without a summary continues (`resumed`); nothing, or a failed run's
leftovers without a checkpoint, trains afresh (`trained`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from bench.core.cli import resolve_device, usage_errors
from bench.core.env import command_line
from bench.core.memory import free_memory, reset_peak_memory
from bench.core.oom import OK, OOM
from bench.core.options import configured, given_options, may_change
from bench.core.plots import bar_plot
from bench.core.results import Keys, Run, save_csv, save_json
from bench.core.tool import emit
from bench.train.checkpoint import CHECKPOINT
from bench.train.config import TrainConfig
from bench.train.config_files import recorded_config
from bench.train.matrix_config import MatrixConfig
from bench.train.run import SUMMARY, run_train

__all__ = [
    "COLUMNS",
    "KEYS",
    "cell_folder",
    "compare_losses",
    "matrix_cells",
    "plot_matrix",
    "run_matrix",
    "run_parsed",
]

COLUMNS = [
    "size", "attention", "parallel", "ranks", "tokens_per_s", "step_ms", "peak_memory_mib",
    "final_train_loss", "final_val_loss", "loss_diff", "loss_agrees", "first_step_s", "mfu",
    "skipped_steps", "run", "status",
]  # fmt: skip
KEYS = Keys(*COLUMNS)
# The matrix's files in its folder: the rows (JSON, CSV), the table, and the plots.
FILES = ("matrix.json", "matrix.csv", "matrix.md")
PLOTS = {
    "time": ("step_ms", "ms per optimizer step"),
    "memory": ("peak_memory_mib", "peak memory of the busiest rank (MiB)"),
    "throughput": ("tokens_per_s", "tokens per second, all ranks"),
}
_SUMMARY_KEYS = ("tokens_per_s", "peak_memory_mib", "final_train_loss", "final_val_loss",
                 "first_step_s", "mfu", "skipped_steps")  # fmt: skip


def cell_folder(out: str | Path, size: str, attention: str, parallel: str) -> Path:
    """The folder of a cell's bench-train run (a layout's `:` is a `-` there)."""
    return Path(out) / "cells" / f"{size}_{attention}_{parallel.replace(':', '-')}"


def cell_config(matrix: MatrixConfig, cell: tuple[str, str, str], device: str) -> TrainConfig:
    """The bench-train run of one cell: the matrix's training options, the cell's size,
    attention and mode, a log line every fifth of the run (tokens/s leaves out the first
    interval, which holds the warm-up) and one evaluation, at the end."""
    size, attention, parallel = cell
    folder = cell_folder(matrix.out, *cell)
    resume = (folder / CHECKPOINT).is_file() and not (folder / SUMMARY).is_file()
    return TrainConfig.create(
        data=matrix.data, out=str(folder), cache_dir=str(Path(matrix.out) / "cache"),
        size=size, attention=attention, parallel=parallel, device=device,
        nproc=1 if parallel == "single" else matrix.nproc, steps=matrix.steps,
        batch_size=matrix.batch_size, context_length=matrix.context_length,
        precision=matrix.precision, tokenizer=matrix.tokenizer, seed=matrix.seed,
        compile=matrix.compile, log_every=max(1, matrix.steps // 5),
        eval_every=0, generate=0, progress=False, resume=resume,
    )  # fmt: skip


def _finished(config: TrainConfig) -> dict[str, Any] | None:
    """The cell's summary when its run finished with these options; None when it has none.

    Raises:
        ValueError: the folder holds a finished run of other options.
    """
    path = Path(config.out) / SUMMARY
    if not path.is_file():
        return None
    summary = json.loads(path.read_text())
    saved, mine = recorded_config(summary), dataclasses.asdict(config)
    differ = sorted(k for k in mine if k not in may_change(TrainConfig) and saved.get(k) != mine[k])
    differ = [k for k in differ if k not in ("resume", "stop_after")]
    if differ:
        raise ValueError(
            f"{config.out} holds a finished run of other options ({', '.join(differ)}); give "
            "the matrix another --out, or the options it ran with"
        )
    return summary


Cell = tuple[tuple[str, str, str], TrainConfig, dict[str, Any] | None]


def matrix_cells(matrix: MatrixConfig, *, device: torch.device | str) -> list[Cell]:
    """Every cell's (size, attention, parallel), bench-train options and, where it finished,
    summary: checked before any cell runs.

    Raises:
        ValueError: options bench-train refuses, or a cell's folder holding a finished run of
            other options.
    """
    out = []
    for cell in matrix.cells:
        config = cell_config(matrix, cell, str(device))
        out.append((cell, config, _finished(config)))
    return out


def _run_cell(config: TrainConfig, command: str) -> tuple[dict[str, Any] | None, str, str]:
    """(summary, how it ran, status) of a cell that has not finished; a failure is a status,
    not an exception."""
    how = "resumed" if config.resume else "trained"
    if not config.resume:  # a failed run's leftovers (no checkpoint): start it again
        shutil.rmtree(config.out, ignore_errors=True)
    device = torch.device(config.device)
    reset_peak_memory(device)
    try:
        summary = run_train(config, command=command)
    except torch.OutOfMemoryError:
        return None, how, OOM
    except Exception as error:
        message = str(error).strip().splitlines()[-1] if str(error).strip() else repr(error)
        status = OOM if "out of memory" in message.lower() else f"failed: {message}"
        return None, how, status
    finally:
        free_memory(device)
    return summary, how, OK


def _row(cell: tuple[str, str, str], config: TrainConfig, summary: dict | None) -> dict:
    size, attention, parallel = cell
    row: dict[str, Any] = {"size": size, "attention": attention, "parallel": parallel,
                           "ranks": config.nproc}  # fmt: skip
    if summary is not None:
        row.update({key: summary.get(key) for key in _SUMMARY_KEYS})
        tokens = config.batch_size * config.context_length  # per optimizer step, all ranks
        speed = summary.get("tokens_per_s")
        row["step_ms"] = tokens / speed * 1e3 if speed else None
    return row


def compare_losses(rows: Sequence[dict[str, Any]], *, tolerance: float) -> list[str]:
    """Set each row's `loss_diff` (its final training loss relative to its reference's: the
    `single` row of its size and attention, else the first that finished) and `loss_agrees`
    (within `tolerance`), in place; return a sentence per disagreement."""
    out = []
    for key in dict.fromkeys((r["size"], r["attention"]) for r in rows):
        group = [r for r in rows if (r["size"], r["attention"]) == key]
        done = [r for r in group if r.get("final_train_loss") is not None]
        ref = next((r for r in done if r["parallel"] == "single"), done[0] if done else None)
        for row in done:
            diff = (row["final_train_loss"] - ref["final_train_loss"]) / ref["final_train_loss"]
            row["loss_diff"], row["loss_agrees"] = diff, abs(diff) <= tolerance
            if not row["loss_agrees"]:
                out.append(
                    f"DISAGREES: {key[0]} {key[1]} under {row['parallel']} ends at loss "
                    f"{row['final_train_loss']:.4f}, {diff:+.2%} from {ref['parallel']}'s "
                    f"{ref['final_train_loss']:.4f} (tolerance {tolerance:.2%})"
                )
    return out


def run_matrix(
    matrix: MatrixConfig,
    *,
    device: torch.device | str,
    command: str | None = None,
    cells: list[Cell] | None = None,
) -> Run:
    """Run (or read back) every cell of `matrix` on `device`, write the matrix's files into its
    folder (the rows after every cell, so that a matrix stopped midway leaves the cells it
    finished; the plots at the end), and return the run (tool `"matrix"`, a row per cell).

    Args:
        cells: `matrix_cells(matrix, device=device)`, checked already (made here when None).
    """
    command = command if command is not None else command_line()
    out, rows = Path(matrix.out), []
    for cell, config, summary in cells or matrix_cells(matrix, device=device):
        summary, how, status = (
            (summary, "reused", OK) if summary is not None else _run_cell(config, command)
        )
        rows.append({**_row(cell, config, summary), "run": how, "status": status})
        run = _matrix_run(matrix, rows, device=device, command=command)
        save_json(run, out / FILES[0])
        save_csv(run, out / FILES[1])
        (out / FILES[2]).write_text(run.to_markdown() + "\n")
    run.plots.extend(p.name for p in plot_matrix(run, out / "matrix.png"))
    save_json(run, out / FILES[0])
    return run


def _matrix_run(
    matrix: MatrixConfig, rows: list[dict[str, Any]], *, device: torch.device | str, command: str
) -> Run:
    """The rows so far as a run, their losses compared, with the notes that explain them."""
    disagreements = compare_losses(rows, tolerance=matrix.loss_tolerance)
    failed = [f"{r['size']} {r['attention']} {r['parallel']}: {r['status']}" for r in rows
              if r["status"] != OK]  # fmt: skip
    notes = [
        f"Each cell: bench-train for {matrix.steps} steps, global batch {matrix.batch_size} x "
        f"{matrix.context_length} tokens, {matrix.precision}, seed {matrix.seed}, "
        f"{'compiled where it can be' if matrix.compile else 'eager'}, on {matrix.data}; its run "
        f"folder in {Path(matrix.out) / 'cells'}.",
        "tokens_per_s: the summary's, over the logged intervals after the first (warm-up); "
        "step_ms: the global tokens of one step over it; peak_memory_mib: the busiest rank's "
        "(CUDA only); loss_diff: the final training loss relative to the same size and "
        "attention's single-rank cell (else the first mode), flagged beyond "
        f"{matrix.loss_tolerance:.2%} (loss_agrees); run: trained, resumed or reused.",
        *disagreements,
        *(f"Not finished: {line}" for line in failed),
    ]
    return Run.create(
        "matrix", rows, device=device, config=dataclasses.asdict(matrix), command=command,
        title=f"bench-matrix: {len(rows)} of {len(matrix.cells)} training runs, attention x "
        "parallel mode x size", columns=COLUMNS, notes=notes,
    )  # fmt: skip


def plot_matrix(run: Run, path: Path) -> list[Path]:
    """`<stem>_time.png`, `<stem>_memory.png` and `<stem>_throughput.png` beside `path`: a bar
    per parallel mode, a group per attention kernel, a panel per size; a quantity no cell
    measured (memory on a CPU) is left out."""
    written = []
    for name, (key, label) in PLOTS.items():
        target = path.with_name(f"{path.stem}_{name}{path.suffix or '.png'}")
        try:
            written.append(bar_plot(
                run.rows, x="attention", y=key, series="parallel", panels="size", path=target,
                ylabel=label, title=run.plot_title,
            ))  # fmt: skip
        except ValueError:  # no cell has the quantity (memory off CUDA)
            continue
    return written


def run_parsed(
    parser: argparse.ArgumentParser, args: argparse.Namespace, argv: Sequence[str] | None = None
) -> int:
    """What `bench-matrix` runs once its options have parsed: the matrix, its files, the table
    and the common outputs asked for; exit status 1 where a cell did not finish or its loss
    disagrees, else 0. A missing --data or a bad option is a usage error."""
    with usage_errors(parser):
        device = resolve_device(args.device)
        given = given_options(args, MatrixConfig)
        if given.get("data") is None:
            raise ValueError("give --data FILE: the text every cell trains on")
        matrix = configured(MatrixConfig, cuda=device.type == "cuda", **given)
        cells = matrix_cells(matrix, device=device)
    command = command_line(argv, prog=parser.prog)
    run = run_matrix(matrix, device=device, command=command, cells=cells)
    emit(run, args, plot=lambda path: plot_matrix(run, path))
    bad = [r for r in run.rows if r["status"] != OK or r.get("loss_agrees") is False]
    return 1 if bad else 0
