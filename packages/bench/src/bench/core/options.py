"""Options written once, as fields of a dataclass, and the command line generated from them:
bench-train's `TrainConfig` and every measuring tool's configuration declare their options so.

A field declares itself with `option(default, help, ...)`, which keeps an `Option` in the field's
metadata: its help, its `Group` in `--help`, its flag, how its text is parsed, the CPU's default
where it differs from the field's, whether a resume may change it. From a dataclass of such
fields:

- `add_options(parser, cls)`: one flag per field (`--context-length`; `--compile` /
  `--no-compile` for a bool; several values for a tuple), in its group, each help ending in its
  default. An option not given is absent from the parsed arguments (`given_options`): no
  default is written here.
- `configured(cls, cuda=, **given)`: the dataclass for a device, the options given over the
  defaults (`device_defaults`: the CPU's where they differ).
- `check_values(config)`: every field among its choices, every float finite.
- `may_change(cls)`: the fields a resumed run may change.

Plain Python (no torch): the commands build their parsers from here before anything heavy.

Example::

    @dataclass(frozen=True)
    class AttnConfig:
        batch: int = option(8, "batch size")
        seqs: tuple[int, ...] = option((1024, 4096), "sequence lengths", flag="seq", cpu=(64,))

    add_options(parser, AttnConfig)          # --batch N, --seq N [N ...]
    given = given_options(parser.parse_args(argv), AttnConfig)
    config = configured(AttnConfig, cuda=False, **given)
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import types
import typing
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = [
    "SAME",
    "Group",
    "Option",
    "add_options",
    "check_values",
    "configured",
    "device_defaults",
    "flag_of",
    "given_options",
    "given_values",
    "kind_of",
    "may_change",
    "option",
    "option_fields",
    "option_of",
    "parse_duration",
    "positive_float",
]

C = TypeVar("C")
# `Option.cpu` of a field whose default is the same on every device.
SAME = type("Same", (), {"__repr__": lambda self: "SAME"})()


@dataclass(frozen=True)
class Group:
    """A group of options in `--help` and in config files.

    Attributes:
        title: its heading.
        about: what its options say, in a line.
        may_change: a resumed run may change its options (they say how to run, not what).
    """

    title: str
    about: str | None = None
    may_change: bool = False


@dataclass(frozen=True)
class Option:
    """How one field appears on the command line and in config files.

    Attributes:
        help: what the option does; its default is added to it.
        group: its `Group` (None: the parser's own options).
        may_change: a resumed run may change it; None: as its group says.
        flag: the flag without its dashes; the field's name with dashes when None.
        aliases: older flags that still read (without dashes), not shown in `--help`.
        choices: the allowed values, or a function returning them (read when needed).
        parse: turns the option's text into its value (each value's, for a tuple); the field's
            type when None.
        several: the option takes several values; None: when the field is a tuple (False for a
            tuple that one word names, through `parse`).
        cpu: the default on a machine without CUDA, where it is not the field's (`SAME`: the
            same; None is a default of its own).
        none: the text that stands for None, where None is a value of its own.
        const: the value of the flag given without one (`--resume` beside `--resume auto`);
            None: the flag always takes its value(s).
        saved: written to config files (False for what only one invocation does).
        default_text: the default in words, for a None that a rule replaces.
        metavar: the value's name in `--help`; by type (N, X, TEXT) when None.
    """

    help: str
    group: Group | None = None
    may_change: bool | None = None
    flag: str | None = None
    aliases: tuple[str, ...] = ()
    choices: Sequence[Any] | Callable[[], Sequence[Any]] | None = None
    parse: Callable[[str], Any] | None = None
    several: bool | None = None
    cpu: Any = SAME
    none: str | None = None
    const: Any = None
    saved: bool = True
    default_text: str | None = None
    metavar: str | None = None

    def allowed(self) -> Sequence[Any] | None:
        """The allowed values, or None for any."""
        return self.choices() if callable(self.choices) else self.choices

    @property
    def resumable(self) -> bool:
        """Whether a resumed run may change it."""
        group = self.group.may_change if self.group is not None else False
        return group if self.may_change is None else self.may_change


def option(default: Any, help: str, **options: Any) -> Any:
    """A dataclass field with its `Option` (keyword arguments: the `Option`'s attributes)."""
    return dataclasses.field(default=default, metadata={"option": Option(help, **options)})


def option_fields(cls: Any) -> dict[str, dataclasses.Field]:
    """The fields of the dataclass `cls` that are options, by name, in order."""
    return {f.name: f for f in dataclasses.fields(cls) if "option" in f.metadata}


def option_of(cls: Any, name: str) -> Option:
    """The `Option` of field `name` of the dataclass `cls`."""
    return option_fields(cls)[name].metadata["option"]


def flag_of(cls: Any, name: str) -> str:
    """The flag of field `name` without its dashes (`context-length`)."""
    return option_of(cls, name).flag or name.replace("_", "-")


def device_defaults(cls: Any, *, cuda: bool) -> dict[str, Any]:
    """The defaults of the fields of `cls` that differ on a CPU (`Option.cpu`): those on a
    machine without CUDA, none with it (the fields' own)."""
    if cuda:
        return {}
    cpu = {name: option_of(cls, name).cpu for name in option_fields(cls)}
    return {name: value for name, value in cpu.items() if value is not SAME}


def configured(cls: type[C], *, cuda: bool, **given: Any) -> C:
    """`cls` with the options `given` (by field name) over the device's defaults.

    Raises:
        ValueError: what the dataclass's own checks refuse.
    """
    return cls(**(device_defaults(cls, cuda=cuda) | given))


def may_change(cls: Any) -> frozenset[str]:
    """The fields of `cls` a resumed run may change."""
    return frozenset(name for name in option_fields(cls) if option_of(cls, name).resumable)


# A duration's parts: hours, minutes, seconds, each at most once and in that order (`1h1h` or
# `30m1h` is a typo, not a sum).
_NUMBER = r"(\d+(?:\.\d*)?|\.\d+)"
_DURATION = re.compile(rf"(?:{_NUMBER}h)?(?:{_NUMBER}m)?(?:{_NUMBER}s)?")
_UNIT_SECONDS = (3600.0, 60.0, 1.0)
_METAVARS = {int: "N", float: "X", str: "TEXT"}


def parse_duration(text: str) -> float:
    """Seconds of a duration such as `20m`, `90s`, `1.5h`, `1h30m` or `1200` (seconds): hours,
    minutes and seconds each at most once, in that order.

    Raises:
        argparse.ArgumentTypeError: not a positive duration in those forms (argparse shows
            its message as it is).
    """
    text = text.strip().lower()
    try:
        seconds = float(text)
    except ValueError:
        match = _DURATION.fullmatch(text)
        if match is None or not any(match.groups()):
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a duration such as 20m, 90s or 1h30m (hours, minutes, "
                "seconds, each at most once, in that order)"
            ) from None
        parts = zip(match.groups(), _UNIT_SECONDS, strict=True)
        seconds = sum(float(number) * unit for number, unit in parts if number is not None)
    if not 0 < seconds < math.inf:
        raise argparse.ArgumentTypeError(f"{text!r}: a duration must be positive and finite")
    return seconds


def positive_float(text: str) -> float:
    """A finite number above 0: the type of a rate or a size that 0 would not describe
    (bench-plan's `--bandwidth` and `--tflops`), refused at once rather than deep in a tool.

    Raises:
        argparse.ArgumentTypeError: not such a number (argparse shows its message as it is).
    """
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number")
    return value


def kind_of(cls: Any, name: str) -> tuple[type, bool]:
    """The value type of a field, its annotation without `| None`, and whether the field is a
    tuple of such values (an option taking several)."""
    hint = typing.get_type_hints(cls)[name]
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    kind = next(k for k in typing.get_args(hint) if k is not type(None)) if union else hint
    if typing.get_origin(kind) is tuple:
        inner = [k for k in typing.get_args(kind) if k is not Ellipsis]
        element = [k for k in typing.get_args(inner[0]) if k is not type(None)] or inner
        return element[0], True
    return typing.get_origin(kind) or kind, False


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        return " ".join(_shown(v) for v in value)
    if isinstance(value, str) and not value.isprintable():
        return repr(value)
    return str(value)


def _help(cls: Any, name: str) -> str:
    """The option's help with its default: in words, per device, or the field's own."""
    opt, default = option_of(cls, name), option_fields(cls)[name].default
    if opt.default_text is not None:
        shown = opt.default_text
    elif opt.cpu is not SAME:
        shown = f"{_shown(default)} with CUDA, {_shown(opt.cpu)} on a CPU"
    elif default is None:
        shown = opt.none
    else:
        shown = _shown(default)
    text = opt.help if shown is None else f"{opt.help} (default: {shown})"
    return text.replace("%", "%%")  # argparse formats help strings with %


def add_options(
    parser: argparse.ArgumentParser,
    cls: Any,
    *,
    names: Collection[str] | None = None,
    into: argparse._ArgumentGroup | None = None,
    defaults: bool = True,
) -> argparse.ArgumentParser:
    """Add a flag for each field of `cls` (or those in `names`), each in its group (or all in
    the group `into`), its help ending in its default (unless not `defaults`).

    Every flag's default is `argparse.SUPPRESS`: an option not given is absent from the parsed
    arguments, and the dataclass supplies its default.
    """
    groups: dict[Group | None, Any] = {None: into or parser}
    for name in option_fields(cls):
        if names is not None and name not in names:
            continue
        opt, (kind, several) = option_of(cls, name), kind_of(cls, name)
        several = several if opt.several is None else opt.several
        if opt.group not in groups:
            groups[opt.group] = into or parser.add_argument_group(opt.group.title, opt.group.about)
        kwargs: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS}
        if kind is bool and not several and opt.parse is None:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = opt.parse or kind
            kwargs["choices"] = opt.allowed()
            kwargs["metavar"] = None if kwargs["choices"] else opt.metavar or _METAVARS.get(kind)
            if several:
                kwargs["nargs"] = "+"
            elif opt.const is not None:
                kwargs |= {"nargs": "?", "const": opt.const}
        text = _help(cls, name) if defaults else opt.help.replace("%", "%%")
        container = groups[opt.group]
        container.add_argument(f"--{flag_of(cls, name)}", help=text, **kwargs)
        for alias in opt.aliases:  # an older spelling: read on, not shown
            container.add_argument(f"--{alias}", help=argparse.SUPPRESS, **kwargs)
    return parser


def given_options(args: argparse.Namespace, cls: Any) -> dict[str, Any]:
    """The fields of `cls` given on a command line `add_options` parsed; several values of a
    tuple field in order without repeats."""
    fields = option_fields(cls)
    given = {name: value for name, value in vars(args).items() if name in fields}
    return {
        name: tuple(dict.fromkeys(value)) if isinstance(value, list) else value
        for name, value in given.items()
    }


def given_values(cls: Any, options: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of `cls` given in `options` (by name): None is a field left out, but for a
    field where None is a value of its own (`Option.none`)."""
    fields = option_fields(cls)
    return {
        name: value
        for name, value in options.items()
        if value is not None or (name in fields and option_of(cls, name).none is not None)
    }


def check_values(config: Any) -> None:
    """Refuse a field of the dataclass `config` whose value (or one of its values) is not among
    its option's choices, or a float that is not finite.

    Raises:
        ValueError: the first such field, by its flag.
    """
    cls = type(config)
    for name in option_fields(cls):
        allowed, value = option_of(cls, name).allowed(), getattr(config, name)
        values = value if isinstance(value, tuple) else (value,)
        bad = [v for v in values if allowed is not None and v is not None and v not in allowed]
        if bad:
            choose = ", ".join(map(str, allowed))
            raise ValueError(f"--{flag_of(cls, name)} {bad[0]!r}: choose one of {choose}")
        if any(isinstance(v, float) and not math.isfinite(v) for v in values):
            raise ValueError(f"--{flag_of(cls, name)} {value}: give a finite number")
