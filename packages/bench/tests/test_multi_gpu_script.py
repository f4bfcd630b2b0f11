"""scripts/multi_gpu.sh (and two_gpu.sh, the same on 2 GPUs): every command of every part parses
on 2 and on 4 GPUs (also under TINY=1, the CPU rehearsal), each part fits one call, and the runs
it compares are comparable whatever the GPU count."""

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
SCRIPT = SCRIPTS / "multi_gpu.sh"
TWO_GPU = SCRIPTS / "two_gpu.sh"
ROOT = SCRIPTS.parents[2]
CALL_LIMIT_S = 540  # one device call is 600 s; leave a minute for start-up and copying
ALTERNATIVE = "or: "  # a command that runs only in place of the one before it
TRAIN_PARTS = ("train-small", "train-xl-1", "train-xl-2")


def _script_results():
    spec = importlib.util.spec_from_file_location("script_results", SCRIPTS / "script_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _parts() -> list[str]:
    env = {**os.environ, "DRY_RUN": "1"}
    out = subprocess.run(["bash", str(SCRIPT), "list"], capture_output=True, text=True, env=env)
    return out.stdout.split()


def _commands(part: str, *, gpus: int = 2, tiny: bool = False) -> list[tuple[int, str, list[str]]]:
    env = {"TINY": str(int(tiny)), "GPUS": str(gpus)}
    return dry_run(SCRIPT, part, "results", "shakespeare.txt", env=env)


def _parsed(argv: list[str]):
    """The parsed options of a bench command line (`python3 -m bench NAME ...`)."""
    assert argv[:3] == ["python3", "-m", "bench"], argv
    module = bench_commands()["bench-" + argv[3]].partition(":")[0]
    return importlib.import_module(module).COMMAND.parser().parse_args(argv[4:])


def _check_pytest_command(argv: list[str], gpus: int) -> None:
    args = _script_results().build_parser().parse_args(argv[2:])
    assert args.out == Path("results") and args.gpus == gpus
    pytest_args = args.pytest_args[1:]  # after "--"
    valued = {i + 1 for i, a in enumerate(pytest_args) if a in ("-m", "-p")}
    assert pytest_args[pytest_args.index("-m") + 1] == "gpu"
    paths = [a for i, a in enumerate(pytest_args) if i not in valued and a[0] != "-"]
    assert paths and all((ROOT / p).is_dir() for p in paths), paths


# Every part on 2 and 4 GPUs but the leaderboard step, a two-GPU part (its preset's ranks).
PART_GPUS = [(p, g) for p in _parts() for g in (2, 4) if (p, g) != ("step", 4)]


@pytest.mark.parametrize("tiny", [False, True], ids=["gpu", "tiny"])
@pytest.mark.parametrize(("part", "gpus"), PART_GPUS, ids=[f"{p}-{g}gpus" for p, g in PART_GPUS])
def test_every_command_parses_and_the_part_fits_one_call(part, gpus, tiny):
    commands = _commands(part, gpus=gpus, tiny=tiny)
    assert commands
    budget = sum(limit for limit, name, _ in commands if not name.startswith(ALTERNATIVE))
    assert budget <= CALL_LIMIT_S, part
    for (limit, name, argv), before in zip(commands, [None, *commands], strict=False):
        if name.startswith(ALTERNATIVE):
            assert before is not None and limit <= before[0], name
        if argv[:2] == ["python3", "packages/bench/scripts/script_results.py"]:
            _check_pytest_command(argv, gpus)
            continue
        if argv[:2] == ["python3", "packages/bench/scripts/ddp_overlap.py"]:
            assert argv[2:4] == ["--out", f"results/ddp_overlap_dryrun_{argv[3][-10:]}"]
            assert argv[4:] == (["--tiny"] if tiny else [])
            continue
        args = _parsed(argv)
        if argv[3] == "train":
            assert Path(args.out).parent == Path("results/bulk/train_runs"), name
            assert args.nproc == (1 if args.parallel == "single" else gpus), name
        elif argv[3] != "train-results":
            assert args.json is not None and args.json.parent == Path("results"), name
            assert "dryrun" in args.json.name
        if argv[3] in ("zero", "ddp"):
            assert args.nproc == gpus, name
        if tiny and argv[3] not in ("plan", "train-results"):
            assert args.device == "cpu", name  # the rehearsal never asks for a GPU


def test_the_train_runs_of_a_size_differ_only_in_their_parallel_mode_and_ranks():
    runs = [(gpus, argv) for gpus in (2, 4) for part in TRAIN_PARTS
            for _, _, argv in _commands(part, gpus=gpus) if argv[3] == "train"]  # fmt: skip
    by_size: dict[str, list] = {}
    for gpus, argv in runs:
        args = TRAIN.parser().parse_args(argv[4:])
        by_size.setdefault(args.size, []).append((gpus, args))
    assert sorted(by_size) == ["small", "xl"]
    modes = ["ddp", "zero1", "fsdp", "fsdp:torch", "ddp:torch"]
    for size, parsed in by_size.items():
        ranks = sorted({(a.parallel, a.nproc) for _, a in parsed})
        assert ranks == sorted([("single", 1), *((m, n) for m in modes for n in (2, 4))]), size
        # the same batches: global batch, steps, seed, data; a folder per mode and rank count
        same = {
            (a.batch_size, a.steps, a.seed, a.context_length, a.data, a.compile) for _, a in parsed
        }
        assert len(same) == 1 and not parsed[0][1].checkpoint, size
        folders = {Path(a.out).name for _, a in parsed}
        assert folders == {f"{size}-{mode.replace(':', '-')}-x{n}" for mode, n in ranks}, size


def test_the_scaling_table_labels_each_run_by_its_folder():
    (*_, (_, name, argv)) = _commands("train-table", gpus=4)
    args = _parsed(argv)
    assert name == "scaling table"
    labels = [label for label, _ in args.scaling]
    assert labels == [Path(folder).name for _, folder in args.scaling]
    assert "small-single-x1" in labels and "xl-fsdp-torch-x4" in labels


def test_allreduce_takes_every_even_rank_count_and_both_backends_to_1_gb():
    for gpus, world_sizes in ((2, [2]), (4, [2, 4]), (6, [2, 4, 6])):
        ((_, _, argv),) = _commands("allreduce", gpus=gpus)
        args = _parsed(argv)
        assert args.world_sizes == world_sizes
        assert sorted(args.backends) == ["gloo", "nccl"] and args.full
        assert args.sizes_mb == [1, 10, 100, 1000]


def test_the_2025_xl_rows_run_only_beside_the_2_gpu_results_they_continue():
    for part in ("zero", "ddp"):
        sizes = {
            gpus: [_parsed(a).size for _, _, a in _commands(part, gpus=gpus)] for gpus in (2, 4)
        }
        assert sizes == {2: ["xl", "xl-2025"], 4: ["xl"]}, part


def test_one_gpu_runs_the_single_reference_and_refuses_the_parts_that_need_two():
    train = _commands("train-xl-1", gpus=1)
    assert [name for _, name, _ in train] == ["bench-train xl single x1", "scaling table"]
    for part in ("allreduce", "zero", "ddp", "ddp-overlap", "step"):
        proc = subprocess.run(
            ["bash", str(SCRIPT), part, "results"],
            capture_output=True,
            text=True,
            env={**os.environ, "DRY_RUN": "1", "GPUS": "1"},
        )
        assert proc.returncode == 2 and "needs 2 GPUs" in proc.stderr, part


def test_two_gpu_sh_is_multi_gpu_sh_on_two_gpus():
    env = {**os.environ, "DRY_RUN": "1", "GPUS": "4"}  # two_gpu.sh sets its own count
    for part in ("train-small", "ddp"):
        two = subprocess.run(["bash", str(TWO_GPU), part, "r", "t"], capture_output=True, env=env)
        assert (
            two.stdout
            == subprocess.run(
                ["bash", str(SCRIPT), part, "r", "t"],
                capture_output=True,
                env={**env, "GPUS": "2"},
            ).stdout
        )


def test_the_step_part_runs_what_bench_step_prints_where_the_preset_is_refused():
    plan, preset, instead = _commands("step")
    assert _parsed(preset[2]).preset == "leaderboard-2026"
    assert instead[1].startswith(ALTERNATIVE)
    printed = depth_reduced_argv(num_gpus=2)
    assert instead[2][4 : 4 + len(printed) - 1] == printed[1:]
    args = _parsed(plan[2])
    assert (args.layouts, args.dp, args.batches) == (["zero1", "fsdp"], 2, [1])  # per rank


def test_the_gpu_count_comes_from_the_visible_gpus():
    env = {k: v for k, v in os.environ.items() if k != "GPUS"}
    for visible, world_size in (("0,1,2", 3), ("5", None)):
        proc = subprocess.run(
            ["bash", str(SCRIPT), "ddp", "r"],
            capture_output=True,
            text=True,
            env={**env, "DRY_RUN": "1", "CUDA_VISIBLE_DEVICES": visible},
        )
        if world_size is None:
            assert proc.returncode == 2  # one GPU: ddp needs two
        else:
            assert f"--nproc {world_size} " in proc.stdout


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
        env={**os.environ, "GPUS": "2"},
    )
    assert proc.returncode == 2 and "need TEXT_FILE" in proc.stderr


def test_an_unknown_part_is_refused():
    proc = subprocess.run(["bash", str(TWO_GPU), "part9"], capture_output=True, text=True)
    assert proc.returncode == 2 and "zero train-small" in proc.stderr


FAKE_PYTHON = """#!/usr/bin/env bash
# python3 for the train parts' claims: logs its call; a bench-train run writes its summary
echo "$*" >>"$FAKE_LOG"
if [ "$3" = train ]; then
    out=$(sed -n 's/.* --out \\([^ ]*\\).*/\\1/p' <<<"$*")
    sleep "$FAKE_SECONDS"
    mkdir -p "$out" && echo {} >"$out/summary.json"
fi
"""


def _train_xl_1(tmp_path: Path, *, parts: int, seconds: float) -> tuple[list[str], str, Path]:
    """Run `parts` copies of `train-xl-1` at once on 2 GPUs with a fake python3 whose runs take
    `seconds`: the run folders each trained, the parts' stderr, and the runs' folder."""
    fake = tmp_path / "bin" / "python3"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    text = tmp_path / "text.txt"
    text.write_text("to be or not to be")
    env = {
        **os.environ,
        "PATH": f"{fake.parent}:{os.environ['PATH']}",
        "FAKE_LOG": str(tmp_path / "calls.txt"),
        "FAKE_SECONDS": str(seconds),
        "MULTI_GPU_BULK": str(tmp_path / "bulk"),
        "GPUS": "2",
    }
    argv = ["bash", str(SCRIPT), "train-xl-1", str(tmp_path / "out"), str(text)]
    procs = [
        subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True) for _ in range(parts)
    ]
    errors = "".join(p.communicate()[1] for p in procs)
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    trained = [c.split(" --out ")[1].split()[0] for c in calls if c.startswith("-m bench train ")]
    return sorted(Path(t).name for t in trained), errors, tmp_path / "bulk" / "train_runs"


def test_parts_sharing_the_run_folders_run_each_run_once(tmp_path):
    trained, _, runs = _train_xl_1(tmp_path, parts=2, seconds=1)
    assert trained == ["xl-ddp-x2", "xl-single-x1", "xl-zero1-x2"]
    assert not list(runs.glob("*.running"))  # every claim released


def test_a_run_a_live_part_holds_is_left_to_it_and_a_killed_parts_taken_over(tmp_path):
    runs = tmp_path / "bulk" / "train_runs"
    # alive; no such process; claimed this instant (its pid not written yet)
    for folder, pid in (
        ("xl-single-x1", os.getpid()),
        ("xl-ddp-x2", 999_999_999),
        ("xl-zero1-x2", None),
    ):
        (runs / f"{folder}.running").mkdir(parents=True)
        if pid is not None:
            (runs / f"{folder}.running" / "pid").write_text(f"{pid}\n")
    trained, errors, _ = _train_xl_1(tmp_path, parts=1, seconds=0)
    assert trained == ["xl-ddp-x2"]
    assert "bench-train xl single x1: another part runs it" in errors
    assert "bench-train xl zero1 x2: another part runs it" in errors
    held = sorted(p.name for p in runs.glob("*.running"))
    assert held == ["xl-single-x1.running", "xl-zero1-x2.running"]  # still theirs
