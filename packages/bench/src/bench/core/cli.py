"""The command line of every `bench-*` command, built before anything heavy is imported.

A command is two modules. Its *command* module (`bench.commands.<name>`) is the tool's spec: the
help text with examples, the configuration (a dataclass whose fields declare the options,
`bench.core.options`) and the vocabularies they offer; it imports only the standard library and
light plumbing such as this module (no torch, no matplotlib). Its *implementation* (a tool in
`bench.tools`, or the trainer in `bench.train`) is named by a string and imported only once the
command line has parsed. So `--help` and every usage error argparse reports take a fraction of a
second, not the seconds torch's import takes (`tests/test_commands.py` checks every command in
a fresh interpreter). A command module::

    \"\"\"bench-attn: attention alone, implementation beside implementation. (The help.)\"\"\"
    from bench.core.cli import Command
    from bench.core.options import option

    IMPLS = ("naive", "compiled", "fa2-pytorch", "fa2-triton", "sdpa")  # the tool imports these

    @dataclass(frozen=True)
    class AttnConfig:
        impls: tuple[str, ...] = option(("naive", "sdpa"), "implementations", choices=IMPLS)

    COMMAND = Command("bench-attn", __doc__, config=AttnConfig, run="bench.tools.attn:TOOL")
    main = COMMAND.main  # the console script's target

The implementation is a `Runner`, `run(parser, args, argv) -> exit status`: for a measuring tool,
a `bench.core.tool.Tool`, which adds the common options' behaviour (device, the device's default
configuration and the options that change it, the table, JSON and plot at the end).

Common options (`add_common_args`, on every tool's command): `--json PATH` (write the run),
`--csv PATH` (write its rows), `--plot PATH` (write a PNG), `--markdown PATH` (write the full
table), `--wide` (print every column), `--device {auto,cpu,cuda,cuda:N}` and `--no-progress`.

A usage error is two lines (`Parser.error`): what is wrong, and where the options are listed,
not argparse's usage block of every option before it.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import typing
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from bench.core import options
from bench.core.ranks import DEFAULT_TIMEOUT_S
from ddp import bucket_bytes

if TYPE_CHECKING:
    import torch

__all__ = [
    "Command",
    "LazyChoices",
    "Parser",
    "Runner",
    "add_common_args",
    "add_timeout_arg",
    "add_timing_args",
    "bucket_size_mb",
    "distinct",
    "resolve_device",
    "usage_errors",
]

H = TypeVar("H", bound=Hashable)

# What a command runs once its command line has parsed: `(parser, args, argv) -> exit status`.
# `argv` is what was parsed (None: `sys.argv[1:]`), for recording the command line.
Runner = Callable[[argparse.ArgumentParser, argparse.Namespace, Sequence[str] | None], int]


class Parser(argparse.ArgumentParser):
    """argparse's parser whose usage error is the error and a pointer to `--help` (exit status
    2), not argparse's usage block of every option (two dozen lines for bench-train) above it."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n({self.prog} --help lists the options)\n")


@dataclass(frozen=True)
class Command:
    """A `bench-*` command: its help, its options, and the implementation that runs them.

    Attributes:
        prog: the command's name (`bench-attn`), shown in `--help`.
        doc: its help text with examples; the command module's docstring.
        config: the configuration's dataclass: a flag for each of its option fields
            (`bench.core.options.add_options`); None for a command without one.
        add_options: adds the options that are no field of `config` (a preset, a study, a
            file to write) to the parser; None for none.
        run: `"module:name"` of the `Runner` to import and call once the options have parsed
            (a tool's `TOOL`, or a function).
        common: add the common options (`add_common_args`) first: every measuring tool does.
        epilog: text after the options in `--help` (examples, when the description is long).
        check: finds usage errors among the parsed options that need nothing heavy (options
            that need each other), before the implementation is imported; raises `ValueError`,
            reported as a usage error.
    """

    prog: str
    doc: str | None
    run: str
    config: type | None = None
    add_options: Callable[[argparse.ArgumentParser], object] | None = None
    common: bool = True
    epilog: str | None = None
    check: Callable[[argparse.Namespace], object] | None = None

    def __post_init__(self) -> None:
        module, _, name = self.run.partition(":")
        if not module or not name:
            raise ValueError(f"{self.prog}: run must be 'module:name', got {self.run!r}")

    def parser(self) -> argparse.ArgumentParser:
        """The command line: the common options (unless not `common`), the configuration's, then
        the command's own."""
        parser = Parser(
            prog=self.prog,
            description=self.doc,
            epilog=self.epilog,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        if self.common:
            add_common_args(parser)
        if self.config is not None:
            options.add_options(parser, self.config)
        if self.add_options is not None:
            self.add_options(parser)
        return parser

    def runner(self) -> Runner:
        """The implementation `run` names, imported now (with everything heavy it needs)."""
        module, _, name = self.run.partition(":")
        return getattr(importlib.import_module(module), name)

    def main(self, argv: Sequence[str] | None = None) -> int:
        """Parse `argv` (`sys.argv[1:]` when None), then import and call the implementation.

        Returns:
            The implementation's exit status. `--help` and usage errors (argparse's and
            `check`'s) exit (`SystemExit`) before the implementation is imported.
        """
        parser = self.parser()
        args = parser.parse_args(argv)
        if self.check is not None:
            with usage_errors(parser):
                self.check(args)
        return self.runner()(parser, args, argv)


def add_common_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add `--json`, `--csv`, `--plot`, `--markdown`, `--wide`, `--device` and `--no-progress` to
    `parser`."""
    out = parser.add_argument_group("output")
    out.add_argument("--json", type=Path, metavar="PATH", help="write rows and metadata as JSON")
    out.add_argument("--csv", type=Path, metavar="PATH", help="write the rows as CSV")
    out.add_argument("--plot", type=Path, metavar="PATH", help="write a PNG plot of the rows")
    out.add_argument("--markdown", type=Path, metavar="PATH", help="write every column's table")
    out.add_argument("--wide", action="store_true", help="print every column, not 120 characters")
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


def add_timeout_arg(container: Any, *, scope: str) -> None:
    """Add `--timeout S` to a parser or group: seconds `scope` may take before ranks are stopped.

    Without it a run has no bound (`bench.core.ranks.DEFAULT_TIMEOUT_S`): long runs are not
    killed by a default.
    """
    container.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        metavar="S",
        help=f"seconds {scope} before the ranks are stopped (default: no limit)",
    )


def bucket_size_mb(text: str) -> float | None:
    """A `--*-bucket-mb` value in ddp's bucket vocabulary: MiB, finite and at least 0, or `none`
    for one bucket (`ddp.bucket_bytes` checks it)."""
    value = None if text.lower() == "none" else float(text)
    try:
        bucket_bytes(value)
    except (TypeError, ValueError):
        raise ValueError(text) from None
    return value


class LazyChoices(Mapping[str, Any]):
    """An option's choices: the names a command line offers, each standing for an object that is
    imported only when a run looks it up (a torch dtype, an optimizer class).

    The names (keys) are what the parser needs (`choices=list(DTYPES)`), and reading them imports
    nothing; `DTYPES["bf16"]` imports torch then. A name given None stands for no object (fp32
    without autocast, say).

    Args:
        targets: name → `"module:attribute"` (or None).

    Example::

        >>> DTYPES = LazyChoices(fp32="torch:float32", bf16="torch:bfloat16")
        >>> list(DTYPES), DTYPES["bf16"]
        (['fp32', 'bf16'], torch.bfloat16)
    """

    def __init__(self, **targets: str | None) -> None:
        for name, target in targets.items():
            if target is not None and not all(target.partition(":")[::2]):
                raise ValueError(f"{name}: give 'module:attribute' or None, got {target!r}")
        self._targets = targets

    def __getitem__(self, name: str) -> Any:
        target = self._targets[name]
        if target is None:
            return None
        module, _, attribute = target.partition(":")
        return getattr(importlib.import_module(module), attribute)

    def __contains__(self, name: object) -> bool:
        return name in self._targets  # a name, without importing what it stands for

    def __iter__(self) -> Iterator[str]:
        return iter(self._targets)

    def __len__(self) -> int:
        return len(self._targets)

    def __repr__(self) -> str:
        return f"LazyChoices({', '.join(f'{k}={v!r}' for k, v in self._targets.items())})"


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


def resolve_device(name: str = "auto") -> torch.device:
    """The device a `--device` value names; `auto` is CUDA when available, else the CPU.

    Imports torch: call it once the command line has parsed.

    Raises:
        ValueError: if CUDA is asked for on a machine without it, or the name is not a device.
    """
    import torch

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
