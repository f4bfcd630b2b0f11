"""Options written once (`bench.core.options`): a dataclass's fields make the command line, its
defaults per device, and nothing given is nothing set."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import pytest

from bench.core.options import (
    Group,
    add_options,
    check_values,
    configured,
    given_options,
    option,
)

GRID = Group("grid", "the cells")


def _even(text: str) -> int:
    value = int(text)
    if value % 2:
        raise argparse.ArgumentTypeError(f"{text} is odd")
    return value


@dataclass(frozen=True)
class Sweep:
    sizes: tuple[int, ...] = option((64, 128), "sizes", group=GRID, flag="size", cpu=(8,))
    impls: tuple[str, ...] = option(("a",), "impls", choices=("a", "b", "c"))
    steps: int = option(20, "timed steps", cpu=3, aliases=("repeats",))
    causal: bool = option(False, "causal")
    width: int | None = option(None, "width", parse=_even, default_text="the size's")


def _parser() -> argparse.ArgumentParser:
    return add_options(argparse.ArgumentParser(prog="sweep"), Sweep)


def test_tuples_take_several_values_once_each_and_bools_a_negative_flag():
    args = _parser().parse_args(["--size", "16", "32", "16", "--impls", "b", "--causal"])
    assert given_options(args, Sweep) == {"sizes": (16, 32), "impls": ("b",), "causal": True}
    assert given_options(_parser().parse_args(["--no-causal"]), Sweep) == {"causal": False}


def test_nothing_given_is_nothing_set_and_the_device_picks_the_defaults():
    assert given_options(_parser().parse_args([]), Sweep) == {}
    assert configured(Sweep, cuda=True) == Sweep()
    assert configured(Sweep, cuda=False) == Sweep(sizes=(8,), steps=3)
    assert configured(Sweep, cuda=False, steps=7).steps == 7


def test_help_states_each_default_once_per_device_and_hides_old_spellings():
    text = " ".join(_parser().format_help().split())
    assert "sizes (default: 64 128 with CUDA, 8 on a CPU)" in text
    assert "width (default: the size's)" in text and "grid: the cells" in text
    assert "--repeats" not in text
    assert given_options(_parser().parse_args(["--repeats", "5"]), Sweep) == {"steps": 5}


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--impls", "d"], "invalid choice: 'd'"), (["--width", "3"], "3 is odd")],
)
def test_bad_values_are_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit):
        _parser().parse_args(argv)
    assert message in capsys.readouterr().err


def test_check_values_reads_each_value_of_a_tuple():
    check_values(Sweep(impls=("a", "c")))
    with pytest.raises(ValueError, match=r"--impls 'z': choose one of a, b, c"):
        check_values(Sweep(impls=("a", "z")))
