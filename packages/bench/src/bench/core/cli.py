"""Command-line plumbing every `bench-*` tool shares: common options, device choice, the device's
default configuration and its notice, progress, and writing the table / JSON / plot at the end.

A tool describes its command once, as a `Tool`, and its `main` runs it::

    def _add_options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--seq", type=int, nargs="+")

    def _overrides(args: argparse.Namespace) -> dict[str, Any]:
        return {"seqs": distinct(args.seq)}  # configuration field -> option value (None: not given)

    def _run(config: AttnConfig | None, cli: Invocation) -> Run:
        return run_attention(config, device=cli.device, command=cli.command,
                             show_progress=cli.show_progress)

    TOOL = Tool("bench-attn", __doc__, add_options=_add_options, run=_run,
                default=default_attn_config, overrides=_overrides, plot=plot_attention)

    def main(argv: Sequence[str] | None = None) -> int:
        return TOOL.main(argv)

`Tool.config` builds the device's default only when an option changes it (and passes None
otherwise), so the default is built once, by the tool's `run_*` function, which starts with
`config, notes = config_or_default(config, device, default=..., tool=..., describe=...)` and so
announces the small CPU default.

Common options: `--json PATH` (write the run), `--plot PATH` (write a PNG), `--markdown PATH`
(write the printed table), `--device {auto,cpu,cuda,cuda:N}` and `--no-progress`. Under
`torchrun` only the primary rank prints, draws and writes files (`bench.core.launch.is_primary`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Generic, TypeVar

import torch
from tqdm.auto import tqdm

from bench.core.env import command_line
from bench.core.launch import is_primary
from bench.core.results import Run, format_value, save_json

__all__ = [
    "Invocation",
    "Tool",
    "add_common_args",
    "add_timing_args",
    "apply_overrides",
    "as_device",
    "command_line",
    "config_or_default",
    "cpu_default_notice",
    "distinct",
    "emit",
    "live_rows",
    "make_parser",
    "progress",
    "resolve_device",
    "run_command",
    "usage_errors",
]

T = TypeVar("T")
H = TypeVar("H", bound=Hashable)
C = TypeVar("C")


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


def as_device(device: torch.device | str | None) -> torch.device:
    """`device` as a `torch.device`; CUDA when available, else the CPU, when None."""
    return torch.device(device) if device is not None else resolve_device("auto")


def cpu_default_notice(tool: str, what: str) -> str:
    """Print (to stderr) and return the line saying a tool fell back to its small CPU default.

    Args:
        tool: the tool name, e.g. `bench-attn`.
        what: the settings used instead, e.g. `d in (16, 32), seq in (64, 128)`.
    """
    line = f"{tool}: no GPU: running the small CPU default ({what})."
    if is_primary():
        print(line, file=sys.stderr)
    return line


def config_or_default(
    config: C | None,
    device: torch.device,
    *,
    default: Callable[[torch.device], C],
    tool: str,
    describe: Callable[[C], str],
) -> tuple[C, list[str]]:
    """The configuration a `run_*` function measures, and the notes its choice calls for.

    Args:
        config: what the caller asked for; None for the device's default.
        device: the device measured.
        default: the device's default configuration.
        tool: the tool name for the notice, e.g. `bench-attn`.
        describe: what the default runs, in words, for the notice (see `cpu_default_notice`).

    Returns:
        `(config, notes)`: the caller's configuration and no notes, or the device's default and,
        off CUDA, the notice that the small CPU default ran (also printed to stderr).
    """
    if config is not None:
        return config, []
    config = default(device)
    if device.type == "cuda":
        return config, []
    return config, [cpu_default_notice(tool, describe(config))]


def distinct(values: Iterable[H] | None) -> tuple[H, ...] | None:
    """The values of a repeatable option in order without repeats; None when it was not given."""
    return tuple(dict.fromkeys(values)) if values else None


@contextlib.contextmanager
def usage_errors(parser: argparse.ArgumentParser) -> Iterator[None]:
    """Report a `ValueError` raised in the block as a usage error of `parser` (exit status 2)."""
    try:
        yield
    except ValueError as exc:
        parser.error(str(exc))


def apply_overrides(
    default: Callable[[], C], overrides: Mapping[str, Any], *, parser: argparse.ArgumentParser
) -> C | None:
    """The device's default configuration with the options given on the command line applied.

    Args:
        default: builds the device's default configuration (a dataclass); called only when an
            option was given.
        overrides: field name to option value; None stands for an option not given.
        parser: reports a value the configuration refuses as a usage error (exit status 2).

    Returns:
        The changed configuration, or None when no option was given, so that the tool runs (and
        announces) its default.
    """
    given = {name: value for name, value in overrides.items() if value is not None}
    if not given:
        return None
    with usage_errors(parser):
        return replace(default(), **given)


def progress(
    items: Iterable[T], *, desc: str, total: int | None = None, enabled: bool = True
) -> Iterable[T]:
    """`items`, with a tqdm bar on stderr while iterating (plain `items` when not `enabled`)."""
    if not enabled:
        return items
    return tqdm(items, desc=desc, total=total, file=sys.stderr, leave=False, dynamic_ncols=True)


def live_rows(
    columns: Sequence[str], *, title: str | None = None
) -> Callable[[Mapping[str, Any]], None]:
    """A printer of a sweep's rows as they complete: a Markdown header first, then a line per row.

    The lines go to stderr (through tqdm, so that they print above a progress bar), on the
    primary rank only, whether or not a bar is shown; the finished table still goes to stdout
    at the end (`emit`).

    Args:
        columns: the row keys to print, in order.
        title: a line printed before the header.
    """
    started = False

    def show(row: Mapping[str, Any]) -> None:
        nonlocal started
        if not is_primary():
            return
        if not started:
            started = True
            header = [*([title] if title else []), "| " + " | ".join(columns) + " |"]
            header.append("|" + "---|" * len(columns))
            for line in header:
                tqdm.write(line, file=sys.stderr)
        cells = (format_value(row.get(c)) for c in columns)
        tqdm.write("| " + " | ".join(cells) + " |", file=sys.stderr)

    return show


def emit(
    run: Run,
    args: argparse.Namespace,
    *,
    plot: Callable[[Path], Path | Sequence[Path]] | None = None,
) -> None:
    """Finish a tool's run: draw the plot, print the Markdown, write the files asked for.

    Under `torchrun` only the primary rank does any of it; the others return at once.

    Args:
        run: the tool's result.
        args: parsed options holding the common `json`, `plot` and `markdown` values.
        plot: draws the run's figure(s) given the `--plot` path and returns the file(s) written
            (a tool with two figures may write a second file beside the first); called when
            `--plot` was given. A run with nothing plottable prints a warning instead of failing.

    Plot paths are recorded in `run.plots` relative to the JSON file, so `bench-report` finds
    them next to the results.
    """
    if not is_primary():
        return
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


@dataclass(frozen=True)
class Invocation:
    """A tool's parsed command line: its options, the device they name and the command itself.

    Attributes:
        parser: the tool's parser (for usage errors found later).
        args: the parsed options.
        device: the `--device` resolved (see `resolve_device`).
        command: the command line to record in the run.
    """

    parser: argparse.ArgumentParser
    args: argparse.Namespace
    device: torch.device
    command: str

    @property
    def show_progress(self) -> bool:
        """A progress bar unless `--no-progress`, and only on the primary rank under torchrun."""
        return not self.args.no_progress and is_primary()


def run_command(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    measure: Callable[[Invocation], Run],
    *,
    plot: Callable[[Run, Path], Path | Sequence[Path]] | None = None,
) -> int:
    """A tool's whole `main`: parse `argv`, measure, then print and write what was asked (`emit`).

    Args:
        parser: the tool's parser (from `make_parser`, whose `prog` names the command).
        argv: the arguments after the program name; `sys.argv[1:]` when None.
        measure: runs the tool for the parsed command line and returns its `Run`.
        plot: draws the run's figure(s) at the `--plot` path (see `emit`).

    Returns:
        The exit status, 0. A bad option or `--device` ends the command with a usage error.
    """
    args = parser.parse_args(argv)
    with usage_errors(parser):
        device = resolve_device(args.device)
    run = measure(Invocation(parser, args, device, command_line(argv, prog=parser.prog)))
    emit(run, args, plot=None if plot is None else lambda path: plot(run, path))
    return 0


@dataclass(frozen=True)
class Tool(Generic[C]):
    """A `bench-*` command: its options, its configuration and what it measures.

    Attributes:
        prog: the command's name (`bench-attn`), shown in `--help`.
        doc: its help text; the tool module's docstring.
        add_options: adds the tool's own options to a parser that has the common ones.
        run: runs the tool for a configuration (None: the device's default) and the parsed
            command line, and returns its `Run`.
        default: the device's default configuration; None for a tool without one.
        overrides: the configuration fields the options set (None: an option not given); a
            `ValueError` it raises is reported as a usage error.
        plot: draws the run's figure(s) at the `--plot` path (see `emit`).
    """

    prog: str
    doc: str | None
    add_options: Callable[[argparse.ArgumentParser], object]
    run: Callable[[C | None, Invocation], Run]
    default: Callable[[torch.device], C] | None = None
    overrides: Callable[[argparse.Namespace], Mapping[str, Any]] | None = None
    plot: Callable[[Run, Path], Path | Sequence[Path]] | None = None

    def parser(self) -> argparse.ArgumentParser:
        """The command line: the common options and the tool's own."""
        parser = make_parser(self.prog, self.doc)
        self.add_options(parser)
        return parser

    def config(
        self, args: argparse.Namespace, parser: argparse.ArgumentParser, device: torch.device
    ) -> C | None:
        """The device's default with the options applied; None when no option changes it (or
        the tool has no configuration), so that the tool builds and announces its default."""
        if self.default is None or self.overrides is None:
            return None
        default = self.default
        with usage_errors(parser):
            overrides = self.overrides(args)
        return apply_overrides(lambda: default(device), overrides, parser=parser)

    def main(self, argv: Sequence[str] | None = None) -> int:
        """Parse `argv`, measure, print and write what was asked; the exit status (0)."""
        parser = self.parser()

        def measure(cli: Invocation) -> Run:
            return self.run(self.config(cli.args, parser, cli.device), cli)

        return run_command(parser, argv, measure, plot=self.plot)
