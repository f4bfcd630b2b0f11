"""Options written once, as fields of a dataclass, and what is generated from them: the command
line, config files, and the list of options a resumed run may change.

A field declares itself with `option(default, help, group=...)`, which keeps an `Option` in the
field's metadata: its help, its `Group`, its flag, how its text is parsed, its default per
device, whether a resume may change it. From a dataclass of such fields:

- `add_options(parser, cls)`: one flag per field (`--context-length`; `--compile` /
  `--no-compile` for a bool), in its group, each help ending in its default. An option not
  given is absent from the parsed arguments (`given_options`): no default is written here.
- `read_config_file(cls, path)`: options from a TOML or JSON file, each under its flag's name
  without the dashes (`context-length = 512`); `write_config_file(config, path)` writes one.
- `may_change(cls)`: the fields a resumed run may change; `device_defaults(cls, cuda=)` the
  defaults that depend on the device.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import math
import re
import tomllib
import typing
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "Group",
    "Option",
    "add_options",
    "check_values",
    "device_defaults",
    "given_options",
    "given_values",
    "may_change",
    "option",
    "option_of",
    "parse_duration",
    "read_config_file",
    "write_config_file",
]


@dataclass(frozen=True)
class Group:
    """A group of options in `--help` and in config files.

    Attributes:
        title: its heading.
        about: what its options say, in a line.
        may_change: a resumed run may change its options (they say how to run, not what).
    """

    title: str
    about: str
    may_change: bool = False


@dataclass(frozen=True)
class Option:
    """How one field appears on the command line and in config files.

    Attributes:
        help: what the option does; its default is added to it.
        group: its `Group`.
        may_change: a resumed run may change it; None: as its group says.
        flag: the flag without its dashes; the field's name with dashes when None.
        choices: the allowed values, or a function returning them (read when needed).
        parse: turns the option's text into its value; the field's type when None.
        device_default: the default (CUDA, CPU) of a field whose default is None.
        none: the text that stands for None, where None is a value of its own.
        saved: written to config files (False for what only one invocation does).
        default_text: the default in words, for a None that a rule replaces.
        metavar: the value's name in `--help`; by type (N, X, TEXT) when None.
    """

    help: str
    group: Group
    may_change: bool | None = None
    flag: str | None = None
    choices: Sequence[str] | Callable[[], Sequence[str]] | None = None
    parse: Callable[[str], Any] | None = None
    device_default: tuple[Any, Any] | None = None
    none: str | None = None
    saved: bool = True
    default_text: str | None = None
    metavar: str | None = None

    def allowed(self) -> Sequence[str] | None:
        """The allowed values, or None for any."""
        return self.choices() if callable(self.choices) else self.choices

    @property
    def resumable(self) -> bool:
        """Whether a resumed run may change it."""
        return self.group.may_change if self.may_change is None else self.may_change


def option(default: Any, help: str, *, group: Group, **options: Any) -> Any:
    """A dataclass field with its `Option` (keyword arguments: the `Option`'s attributes)."""
    return dataclasses.field(default=default, metadata={"option": Option(help, group, **options)})


def _fields(cls: Any) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls) if "option" in f.metadata}


def option_of(cls: Any, name: str) -> Option:
    """The `Option` of field `name` of the dataclass `cls`."""
    return _fields(cls)[name].metadata["option"]


def flag_of(cls: Any, name: str) -> str:
    """The flag of field `name` without its dashes (`context-length`)."""
    return option_of(cls, name).flag or name.replace("_", "-")


def device_defaults(cls: Any, *, cuda: bool) -> dict[str, Any]:
    """The defaults of the fields of `cls` that depend on the device (`Option.device_default`),
    for CUDA or else a CPU."""
    pairs = {name: option_of(cls, name).device_default for name in _fields(cls)}
    return {name: pair[0 if cuda else 1] for name, pair in pairs.items() if pair is not None}


def may_change(cls: Any) -> frozenset[str]:
    """The fields of `cls` a resumed run may change."""
    return frozenset(name for name in _fields(cls) if option_of(cls, name).resumable)


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)([hms])")
_METAVARS = {int: "N", float: "X", str: "TEXT"}


def parse_duration(text: str) -> float:
    """Seconds of a duration such as `20m`, `90s`, `1.5h`, `1h30m` or `1200` (seconds).

    Raises:
        argparse.ArgumentTypeError: not a positive duration in those forms (argparse shows
            its message as it is).
    """
    text = text.strip().lower()
    try:
        seconds = float(text)
    except ValueError:
        parts = _DURATION_PART.findall(text)
        if not parts or "".join(number + unit for number, unit in parts) != text:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a duration such as 20m, 90s or 1h30m"
            ) from None
        seconds = sum(float(number) * _UNITS[unit] for number, unit in parts)
    if not 0 < seconds < math.inf:
        raise argparse.ArgumentTypeError(f"{text!r}: a duration must be positive and finite")
    return seconds


def _kind(cls: Any, name: str) -> type:
    """The value type of a field: its annotation without `| None`."""
    hint = typing.get_type_hints(cls)[name]
    kinds = [k for k in typing.get_args(hint) if k is not type(None)] or [hint]
    return kinds[0]


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, str) and not value.isprintable():
        return repr(value)
    return str(value)


def _help(cls: Any, name: str) -> str:
    """The option's help with its default: in words, per device, or the field's own."""
    opt, default = option_of(cls, name), _fields(cls)[name].default
    if opt.default_text is not None:
        shown = opt.default_text
    elif opt.device_default is not None:
        cuda, cpu = map(_shown, opt.device_default)
        shown = f"{cuda} with CUDA, {cpu} on a CPU"
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
    groups: dict[Group, argparse._ArgumentGroup] = {}
    for name in _fields(cls):
        if names is not None and name not in names:
            continue
        opt, kind = option_of(cls, name), _kind(cls, name)
        if opt.group not in groups:
            groups[opt.group] = into or parser.add_argument_group(opt.group.title, opt.group.about)
        kwargs: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS}
        kwargs["help"] = _help(cls, name) if defaults else opt.help.replace("%", "%%")
        if kind is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = opt.parse or kind
            kwargs["choices"] = opt.allowed()
            kwargs["metavar"] = None if kwargs["choices"] else opt.metavar or _METAVARS[kind]
        groups[opt.group].add_argument(f"--{flag_of(cls, name)}", **kwargs)
    return parser


def check_values(config: Any) -> None:
    """Refuse a field of the dataclass `config` whose value is not among its option's choices,
    or a float that is not finite.

    Raises:
        ValueError: the first such field, by its flag.
    """
    cls = type(config)
    for name in _fields(cls):
        allowed, value = option_of(cls, name).allowed(), getattr(config, name)
        if allowed is not None and value is not None and value not in allowed:
            raise ValueError(
                f"--{flag_of(cls, name)} {value!r}: choose one of {', '.join(allowed)}"
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"--{flag_of(cls, name)} {value}: give a finite number")


def given_options(args: argparse.Namespace, cls: Any) -> dict[str, Any]:
    """The fields of `cls` given on a command line `add_options` parsed."""
    return {name: value for name, value in vars(args).items() if name in _fields(cls)}


def given_values(cls: Any, options: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of `cls` given in `options` (by name): None is a field left out, but for a
    field where None is a value of its own (`Option.none`)."""
    fields = _fields(cls)
    return {
        name: value
        for name, value in options.items()
        if value is not None or (name in fields and option_of(cls, name).none is not None)
    }


def _from_file(cls: Any, name: str, value: Any, where: str) -> Any:
    """A config file's value for field `name`, converted as its flag would convert text."""
    opt, kind = option_of(cls, name), _kind(cls, name)
    if value is None:
        return None
    if isinstance(value, str) and kind is not bool and (kind is not str or opt.parse):
        try:
            return (opt.parse or kind)(value)
        except (TypeError, ValueError, argparse.ArgumentTypeError) as error:
            raise ValueError(f"{where}: {flag_of(cls, name)} = {value!r}: {error}") from None
    if kind is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, kind) and (kind is bool or not isinstance(value, bool)):
        return value
    raise ValueError(f"{where}: {flag_of(cls, name)} = {value!r} is not a {kind.__name__}")


def read_config_file(cls: Any, path: str | Path) -> dict[str, Any]:
    """The options of a TOML (`.toml`) or JSON (`.json`) config file, by field name.

    Keys are the flags without their dashes (`context-length`); values are as on the command
    line (`bucket-mb = "none"`, `time-budget = "20m"`) or of the option's type.

    Raises:
        ValueError: a missing or unreadable file, an unknown key (the nearest one named), or a
            value of the wrong type.
    """
    path = Path(path)
    where = f"--config {path}"
    if not path.is_file():
        raise ValueError(f"{where}: no such file")
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix == ".toml":
            data = tomllib.loads(text)
        elif path.suffix == ".json":
            data = json.loads(text)
        else:
            raise ValueError(f"{where}: give a .toml or .json file")
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{where}: {error}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a table of options at the top level")
    by_flag = {flag_of(cls, name): name for name in _fields(cls)}
    options = {}
    for key, value in data.items():
        if key not in by_flag:
            near = difflib.get_close_matches(key, by_flag, n=1)
            hint = f"; did you mean {near[0]!r}" if near else ""
            raise ValueError(
                f"{where}: unknown option {key!r}{hint} (keys are the flags without dashes)"
            )
        options[by_flag[key]] = _from_file(cls, by_flag[key], value, where)
    return options


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # inf, -inf, nan: TOML's spelling too
    if isinstance(value, int | float):
        return repr(value)
    # A JSON string is a TOML basic string, but for DEL, which TOML wants escaped.
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


def write_config_file(config: Any, path: str | Path, *, header: Sequence[str] = ()) -> Path:
    """Write the dataclass `config` as TOML; `read_config_file` reads it back to the same.

    Options at None (a rule's default) are left out, but for those where None is a value of
    its own (written as its `Option.none` text); options not `saved` are never written.
    """
    cls, lines = type(config), [f"# {line}" for line in header]
    groups: dict[Group, list[str]] = {}
    for name in _fields(cls):
        opt, value = option_of(cls, name), getattr(config, name)
        entries = groups.setdefault(opt.group, [])
        if opt.saved and (value is not None or opt.none is not None):
            entries.append(f"{flag_of(cls, name)} = {_toml(opt.none if value is None else value)}")
    for group, entries in groups.items():
        if entries:
            lines += ["", f"# {group.title}: {group.about}", *entries]
    path = Path(path)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
