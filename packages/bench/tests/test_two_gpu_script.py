"""scripts/two_gpu.sh: every command of every part parses (also under TINY=1, the CPU
rehearsal), each part fits one call, and the runs it compares are comparable."""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
from pathlib import Path

import pytest
from gpu_scripts import dry_run

from bench.__main__ import commands as bench_commands
from bench.commands.step import depth_reduced_argv
from bench.commands.train import COMMAND as TRAIN

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
SCRIPT = SCRIPTS / "two_gpu.sh"
ROOT = SCRIPTS.parents[2]
CALL_LIMIT_S = 540  # one device call is 600 s; leave a minute for start-up and copying
ALTERNATIVE = "or: "  # a command that runs only in place of the one before it


def _script_results():
    spec = importlib.util.spec_from_file_location("script_results", SCRIPTS / "script_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _parts() -> list[str]:
    env = {**os.environ, "DRY_RUN": "1"}
    out = subprocess.run(["bash", str(SCRIPT), "list"], capture_output=True, text=True, env=env)
    return out.stdout.split()


def _commands(part: str, *, tiny: bool = False) -> list[tuple[int, str, list[str]]]:
    return dry_run(SCRIPT, part, "results", "shakespeare.txt", env={"TINY": str(int(tiny))})


def _parsed(argv: list[str]):
    """The parsed options of a bench command line (`python3 -m bench NAME ...`)."""
    assert argv[:3] == ["python3", "-m", "bench"], argv
    module = bench_commands()["bench-" + argv[3]].partition(":")[0]
    return importlib.import_module(module).COMMAND.parser().parse_args(argv[4:])


@pytest.mark.parametrize("tiny", [False, True], ids=["gpu", "tiny"])
@pytest.mark.parametrize("part", _parts())
def test_every_command_parses_and_the_part_fits_one_call(part, tiny):
    commands = _commands(part, tiny=tiny)
    assert commands
    budget = sum(limit for limit, name, _ in commands if not name.startswith(ALTERNATIVE))
    assert budget <= CALL_LIMIT_S, part
    for (limit, name, argv), before in zip(commands, [None, *commands], strict=False):
        if name.startswith(ALTERNATIVE):
            assert before is not None and limit <= before[0], name
        if argv[:2] == ["python3", "packages/bench/scripts/script_results.py"]:
            args = _script_results().build_parser().parse_args(argv[2:])
            assert args.out == Path("results") and args.gpus == 2
            pytest_args = args.pytest_args[1:]  # after "--"
            valued = {i + 1 for i, a in enumerate(pytest_args) if a in ("-m", "-p")}
            assert pytest_args[pytest_args.index("-m") + 1] == "gpu"
            paths = [a for i, a in enumerate(pytest_args) if i not in valued and a[0] != "-"]
            assert paths and all((ROOT / p).is_dir() for p in paths), paths
            continue
        args = _parsed(argv)
        if argv[3] == "train":
            assert Path(args.out).parent == Path("results/bulk/train_runs"), name
        elif argv[3] != "train-results":
            assert args.json is not None and args.json.parent == Path("results"), name
            assert "dryrun" in args.json.name
        if tiny and argv[3] not in ("plan", "train-results"):
            assert args.device == "cpu", name  # the rehearsal never asks for a GPU


def test_the_train_runs_of_a_size_differ_only_in_their_parallel_mode():
    runs = [argv for part in ("train-small", "train-xl-1", "train-xl-2") for _, _, argv in
            _commands(part) if argv[3] == "train"]  # fmt: skip
    by_size: dict[str, list] = {}
    for argv in runs:
        args = TRAIN.parser().parse_args(argv[4:])
        by_size.setdefault(args.size, []).append(args)
    assert sorted(by_size) == ["small", "xl"]
    for size, parsed in by_size.items():
        modes = {a.parallel: a.nproc for a in parsed}
        assert modes == {
            "single": 1,
            "ddp": 2,
            "ddp:torch": 2,
            "zero1": 2,
            "fsdp": 2,
            "fsdp:torch": 2,
        }, size
        same = {
            (a.batch_size, a.steps, a.seed, a.context_length, a.data, a.compile) for a in parsed
        }
        assert len(same) == 1 and not parsed[0].checkpoint, size


def test_the_step_part_runs_what_bench_step_prints_where_the_preset_is_refused():
    plan, preset, instead = _commands("step")
    assert _parsed(preset[2]).preset == "leaderboard-2026"
    assert instead[1].startswith(ALTERNATIVE)
    printed = depth_reduced_argv(num_gpus=2)
    assert instead[2][4 : 4 + len(printed) - 1] == printed[1:]
    args = _parsed(plan[2])
    assert (args.layouts, args.dp, args.batches) == (["zero1", "fsdp"], 2, [1])  # per rank


def test_nvlink_multicast_is_off_before_any_part_runs():
    lines = SCRIPT.read_text().splitlines()
    exported = next(
        i for i, line in enumerate(lines) if line.startswith("export NCCL_NVLS_ENABLE=0 ")
    )
    assert exported < lines.index('case "$part" in')


def test_the_train_parts_need_the_text(tmp_path):
    proc = subprocess.run(
        ["bash", str(SCRIPT), "train-small", str(tmp_path / "out")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "need TEXT_FILE" in proc.stderr


def test_an_unknown_part_is_refused():
    proc = subprocess.run(["bash", str(SCRIPT), "part9"], capture_output=True, text=True)
    assert proc.returncode == 2 and "zero train-small" in proc.stderr
