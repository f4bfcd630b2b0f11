"""bench-train's config files: its options (`TrainConfig`'s fields, `bench.core.options`) as a
TOML or JSON file that `--config` reads and every run writes (`config.toml` in its `--out`).

Keys are the flags without their dashes (`context-length = 512`); values are as on the command
line (`bucket-mb = "none"`, `time-budget = "20m"`) or of the option's type. A run's summary and
its checkpoints record the configuration too, with the vocabulary's version (`NAMES_VERSION`);
`recorded_config` reads one back in the current names.
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.core.layouts import renamed_row
from bench.core.options import Group, flag_of, kind_of, option_fields, option_of
from bench.train.config import CONFIG_FILE

__all__ = [
    "NAMES_VERSION",
    "read_config_file",
    "recorded_config",
    "write_config_file",
    "write_run_config",
]

_RUN_CONFIG_HEADER = (
    "bench-train's resolved configuration: `bench-train --config FILE` repeats this run",
    "(add --out DIR to write elsewhere, or --resume to continue it; flags win over the file).",
)


def _from_file(cls: Any, name: str, value: Any, where: str) -> Any:
    """A config file's value for field `name`, converted as its flag would convert text."""
    opt, (kind, _) = option_of(cls, name), kind_of(cls, name)
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
    by_flag = {flag_of(cls, name): name for name in option_fields(cls)}
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
    for name in option_fields(cls):
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


def write_run_config(config: Any) -> Path:
    """Write a run's resolved options (a `TrainConfig`) to `config.toml` in its `--out`, which
    `bench-train --config` reads back; its path."""
    path = Path(config.out) / CONFIG_FILE
    return write_config_file(config, path, header=_RUN_CONFIG_HEADER)


# The vocabulary's version. bench-train's summaries and checkpoints record it under `names`
# (results, under their schema: `bench.core.results.SCHEMA`); a record without it holds the names
# from before (`none`, `bucketed`, `zero`, `torch-fsdp`; `bf16` for autocast).
NAMES_VERSION = 2


def recorded_config(record: Mapping[str, Any]) -> dict[str, Any]:
    """The configuration in a bench-train record (a summary, or a checkpoint's `extra`), in the
    current names whatever version wrote it."""
    config = dict(record["config"])
    return config if record.get("names") == NAMES_VERSION else renamed_row("train", config)
