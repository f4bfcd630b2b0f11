"""Command-line plumbing every `bench-*` tool shares: common options, device choice, progress,
the CPU-default notice, and writing the table / JSON / plot at the end.

A tool's `main` reads like this::

    def main(argv: Sequence[str] | None = None) -> int:
        parser = make_parser("bench-attn", __doc__)
        parser.add_argument("--seq", type=int, nargs="+")
        args = parser.parse_args(argv)
        device = resolve_device(args.device)
        run = run_attention(..., device=device, command=command_line(argv, prog="bench-attn"),
                            show_progress=not args.no_progress)
        emit(run, args, plot=lambda path: line_plot(run.rows, ..., path=path))
        return 0

Common options: `--json PATH` (write the run), `--plot PATH` (write a PNG), `--markdown PATH`
(write the printed table), `--device {auto,cpu,cuda,cuda:N}` and `--no-progress`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TypeVar

import torch
from tqdm.auto import tqdm

from bench.env import command_line
from bench.results import Run, save_json

__all__ = [
    "add_common_args",
    "add_timing_args",
    "command_line",
    "cpu_default_notice",
    "emit",
    "make_parser",
    "progress",
    "resolve_device",
]

T = TypeVar("T")


def add_common_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add `--json`, `--plot`, `--markdown`, `--device` and `--no-progress` to `parser`."""
    out = parser.add_argument_group("output")
    out.add_argument("--json", type=Path, metavar="PATH", help="write rows and metadata as JSON")
    out.add_argument("--plot", type=Path, metavar="PATH", help="write a PNG plot of the rows")
    out.add_argument("--markdown", type=Path, metavar="PATH", help="write the printed table")
    out.add_argument("--no-progress", action="store_true", help="no progress bar (e.g. in CI logs)")
    parser.add_argument(
        "--device",
        default="auto",
        help="auto (CUDA when available, else CPU), cpu, cuda or cuda:N (default: auto)",
    )
    return parser


def add_timing_args(
    parser: argparse.ArgumentParser, *, warmup: int | None, steps: int | None
) -> argparse.ArgumentParser:
    """Add `--warmup W` (untimed calls first) and `--steps N` (timed calls) with these defaults.

    A default of None leaves the choice to the tool (typically one for CUDA, one for the CPU).
    """

    def shown(default: int | None) -> str:
        return "depends on the device" if default is None else str(default)

    parser.add_argument(
        "--warmup",
        type=int,
        default=warmup,
        metavar="W",
        help=f"untimed steps first ({shown(warmup)})",
    )
    parser.add_argument(
        "--steps", type=int, default=steps, metavar="N", help=f"timed steps ({shown(steps)})"
    )
    return parser


def make_parser(prog: str, description: str | None) -> argparse.ArgumentParser:
    """An `ArgumentParser` for a tool, with the common options already added.

    Args:
        prog: the entry-point name (`bench-attn`), shown in `--help`.
        description: the tool's help text; its module docstring is the usual choice.
    """
    parser = argparse.ArgumentParser(
        prog=prog,
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return add_common_args(parser)


def resolve_device(name: str = "auto") -> torch.device:
    """The device a `--device` value names; `auto` is CUDA when available, else the CPU.

    Raises:
        ValueError: if CUDA is asked for on a machine without it, or the name is not a device.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ValueError(f"--device {name!r} is not a device; use auto, cpu or cuda:N") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name} asked for CUDA but none is available; use --device cpu")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"--device {name}: only cpu and cuda are supported")
    return device


def cpu_default_notice(tool: str, what: str) -> str:
    """Print (to stderr) and return the line saying a tool fell back to its small CPU default.

    Args:
        tool: the tool name, e.g. `bench-attn`.
        what: the settings used instead, e.g. `d in (16, 32), seq in (64, 128)`.
    """
    line = f"{tool}: no GPU: running the small CPU default ({what})."
    print(line, file=sys.stderr)
    return line


def progress(
    items: Iterable[T], *, desc: str, total: int | None = None, enabled: bool = True
) -> Iterable[T]:
    """`items`, with a tqdm bar on stderr while iterating (plain `items` when not `enabled`)."""
    if not enabled:
        return items
    return tqdm(items, desc=desc, total=total, file=sys.stderr, leave=False, dynamic_ncols=True)


def emit(
    run: Run,
    args: argparse.Namespace,
    *,
    plot: Callable[[Path], Path | Sequence[Path]] | None = None,
) -> None:
    """Finish a tool's run: draw the plot, print the Markdown, write the files asked for.

    Args:
        run: the tool's result.
        args: parsed options holding the common `json`, `plot` and `markdown` values.
        plot: draws the run's figure(s) given the `--plot` path and returns the file(s) written
            (a tool with two figures may write a second file beside the first); called when
            `--plot` was given. A run with nothing plottable prints a warning instead of failing.

    Plot paths are recorded in `run.plots` relative to the JSON file, so `bench-report` finds
    them next to the results.
    """
    if args.plot is not None and plot is not None:
        try:
            written = plot(args.plot)
        except ValueError as exc:
            print(f"no plot written: {exc}", file=sys.stderr)
        else:
            base = args.json.parent if args.json is not None else Path.cwd()
            for path in [written] if isinstance(written, Path) else written:
                run.plots.append(Path(os.path.relpath(path.resolve(), base.resolve())).as_posix())
    text = run.to_markdown()
    print(text)
    if args.markdown is not None:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text + "\n")
    if args.json is not None:
        save_json(run, args.json)
