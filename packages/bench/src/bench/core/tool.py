"""What a measuring `bench-*` tool does once its command line has parsed: resolve the device,
build the configuration (the device's default, or it with the options applied), measure, then
print the table and write the JSON, CSV, Markdown and plot asked for.

A tool's configuration is a dataclass of option fields (`bench.core.options`), declared in its
command module (`bench.commands.<name>`, the tool's spec), which generates the command line from
it. The tool module ends with its `Tool`, which the command names as its implementation::

    def _run(config: AttnConfig | None, cli: Invocation) -> Run:
        return run_attention(config, device=cli.device, command=cli.command,
                             show_progress=cli.show_progress)

    TOOL = Tool(run=_run, config=AttnConfig, preset=_grid, plot=plot_attention)

`Tool.config` builds the configuration only when an option changes it (and passes None
otherwise), so the default is built once, by the tool's `run_*` function, which starts with
`config, notes = config_or_default(config, device, cls=..., tool=..., describe=...)` and so
announces the small CPU default. Under `torchrun` only the primary rank prints, draws and writes
files (`bench.core.ranks.is_primary`).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import torch
from tqdm.auto import tqdm

from bench.core.cli import resolve_device, usage_errors
from bench.core.env import command_line
from bench.core.options import configured, given_options
from bench.core.ranks import is_primary
from bench.core.results import Run, format_value, save_csv, save_json

__all__ = [
    "Invocation",
    "Tool",
    "as_device",
    "config_or_default",
    "cpu_default_notice",
    "device_config",
    "emit",
    "live_rows",
    "progress",
]

T = TypeVar("T")
C = TypeVar("C")


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


def device_config(cls: type[C], device: torch.device | str) -> C:
    """The configuration `cls` at its defaults for `device` (the CPU's where they differ,
    `bench.core.options.Option.cpu`)."""
    return configured(cls, cuda=torch.device(device).type == "cuda")


def config_or_default(
    config: C | None,
    device: torch.device,
    *,
    cls: type[C],
    tool: str,
    describe: Callable[[C], str],
) -> tuple[C, list[str]]:
    """The configuration a `run_*` function measures, and the notes its choice calls for.

    Args:
        config: what the caller asked for; None for the device's default.
        device: the device measured.
        cls: the configuration's dataclass (`device_config` builds its default).
        tool: the tool name for the notice, e.g. `bench-attn`.
        describe: what the default runs, in words, for the notice (see `cpu_default_notice`).

    Returns:
        `(config, notes)`: the caller's configuration and no notes, or the device's default and,
        off CUDA, the notice that the small CPU default ran (also printed to stderr).
    """
    if config is not None:
        return config, []
    config = device_config(cls, device)
    if device.type == "cuda":
        return config, []
    return config, [cpu_default_notice(tool, describe(config))]


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
    """Finish a tool's run: draw the plot, print the Markdown (the brief table that fits 120
    characters, every column with `--wide`), write the files asked for (`--json`, `--csv`,
    `--markdown`: every column).

    Under `torchrun` only the primary rank does any of it; the others return at once.

    Args:
        run: the tool's result.
        args: parsed options holding the common `json`, `csv`, `plot` and `markdown` values.
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
    print(run.to_markdown(wide=getattr(args, "wide", True)))
    if args.markdown is not None:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(run.to_markdown() + "\n")
    if args.json is not None:
        save_json(run, args.json)
    if args.csv is not None:
        save_csv(run, args.csv)


@dataclass(frozen=True)
class Invocation:
    """A tool's parsed command line: its options, the device they name and the command itself.

    Attributes:
        parser: the tool's parser (for usage errors found later).
        args: the parsed options.
        device: the `--device` resolved (see `bench.core.cli.resolve_device`).
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


@dataclass(frozen=True)
class Tool(Generic[C]):
    """What a measuring command runs once its options have parsed (a `bench.core.cli.Runner`).

    Attributes:
        run: runs the tool for a configuration (None: the device's default) and the parsed
            command line, and returns its `Run`.
        config: the configuration's dataclass, whose option fields the command line offers
            (`bench.core.options`); None for a tool without one.
        preset: the fields given, as options that are no field of `config` shape them
            (`--grid handout` sets a grid the options given change; explicit dimensions make a
            model shape): `(args, given fields) -> fields`; None when there is none.
        plot: draws the run's figure(s) at the `--plot` path (see `emit`).
    """

    run: Callable[[C | None, Invocation], Run]
    config: type[C] | None = None
    preset: Callable[[argparse.Namespace, dict[str, Any]], dict[str, Any]] | None = None
    plot: Callable[[Run, Path], Path | Sequence[Path]] | None = None

    def configure(
        self,
        args: argparse.Namespace,
        parser: argparse.ArgumentParser,
        device: torch.device | str,
    ) -> C | None:
        """The device's default with the options applied; None when no option changes it (or
        the tool has no configuration), so that the tool builds and announces its default. A
        value the configuration refuses is a usage error of `parser`."""
        if self.config is None:
            return None
        with usage_errors(parser):
            given = given_options(args, self.config)
            if self.preset is not None:
                given = self.preset(args, given)
            cuda = torch.device(device).type == "cuda"
            return configured(self.config, cuda=cuda, **given) if given else None

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        args: argparse.Namespace,
        argv: Sequence[str] | None = None,
    ) -> int:
        """Resolve `--device`, measure, print and write what was asked; the exit status (0).

        A bad `--device` or option value ends the command with a usage error of `parser`.
        """
        with usage_errors(parser):
            device = resolve_device(args.device)
        cli = Invocation(parser, args, device, command_line(argv, prog=parser.prog))
        run = self.run(self.configure(args, parser, device), cli)
        plot = self.plot
        emit(run, args, plot=None if plot is None else lambda path: plot(run, path))
        return 0
