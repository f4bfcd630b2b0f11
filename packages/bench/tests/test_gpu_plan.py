"""scripts/gpu_plan.py: plans parse, parts on disjoint GPUs run at once and parts sharing one in
order, each in its own environment and folder, a failing or overrunning part costs no other, and
the summary, the command log and the packed results say what happened."""

from __future__ import annotations

import importlib.util
import sys
import tarfile
from pathlib import Path

import pytest
from gpu_scripts import dry_run

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
PLANS = SCRIPTS / "plans"


@pytest.fixture(scope="module")
def plan():
    spec = importlib.util.spec_from_file_location("gpu_plan", SCRIPTS / "gpu_plan.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def _parts(plan, *entries):
    return plan.parse_plan(entries, text_file="text.txt")


def test_gpu_sets_are_indices_ranges_or_cpu(plan):
    assert plan.parse_gpus("0") == (0,)
    assert plan.parse_gpus("0,2-3") == (0, 2, 3)
    assert plan.parse_gpus("cpu") == ()
    for bad in ("1-0", "0,0", "a", "0-"):
        with pytest.raises(ValueError, match="GPUs"):
            plan.parse_gpus(bad)


def test_entries_name_a_script_part_or_a_command(plan):
    train, screen, again = _parts(plan, "0-1:train-small", "2@300:screen=python3 x.py --n 2",
                                  "0,1:train-small")  # fmt: skip
    assert (train.name, train.gpus, train.script_part) == ("train-small", (0, 1), "train-small")
    assert train.argv[1:] == [
        "packages/bench/scripts/multi_gpu.sh",
        "train-small",
        "DIR",
        "text.txt",
    ]
    assert train.limit_s == plan.script_limit_s("train-small", 2)
    assert (screen.name, screen.limit_s, screen.argv) == (
        "screen",
        300.0,
        ["bash", "-c", "python3 x.py --n 2"],
    )
    assert again.name == "train-small-2"  # a folder of its own


def test_a_script_parts_limit_is_its_commands_and_the_scripts_margin(plan):
    commands = dry_run(SCRIPTS / "multi_gpu.sh", "train-xl-1", "d", "t", env={"GPUS": "4"})
    expected = sum(limit for limit, _, _ in commands) + plan.SCRIPT_MARGIN_S
    assert plan.script_limit_s("train-xl-1", 4) == expected


@pytest.mark.parametrize(
    "entry", ["0:nosuchpart", "0-1", "x:a=true", "0:bad name=true", "wait-for-it"]
)
def test_a_bad_entry_is_refused_with_the_forms_that_work(plan, entry):
    with pytest.raises(ValueError):
        _parts(plan, entry)


def _schedule(plan, *entries, budget=1000.0):
    return {p.name: (start, end) for p, start, end in plan.simulate(
        _parts(plan, *entries), budget_s=budget)}  # fmt: skip


def test_disjoint_gpus_run_at_once_and_shared_ones_in_order(plan):
    times = _schedule(plan, "0@10:a=true", "1@30:b=true", "2,3@20:c=true", "0-3@5:d=true",
                      "1@7:e=true")  # fmt: skip
    assert times["a"] == (0, 10) and times["b"] == (0, 30) and times["c"] == (0, 20)
    assert times["d"] == (30, 35)  # waits for all four GPUs
    assert times["e"] == (35, 42)  # GPU 1 is free at 30, but d came first


def test_wait_holds_every_later_part_and_cpu_parts_hold_no_gpu(plan):
    times = _schedule(plan, "0@10:a=true", "cpu@4:b=true", "wait", "1@3:c=true", "cpu@1:d=true")
    assert times["b"] == (0, 4)
    assert times["c"] == (10, 13) and times["d"] == (10, 11)


def test_parts_the_budget_leaves_no_time_are_not_started(plan):
    times = _schedule(plan, "0@50:a=true", "0@50:b=true", "0@50:c=true", budget=110.0)
    assert times["a"] == (0, 50) and times["b"] == (50, 100)
    assert times["c"] == (None, None)  # 10 s left: under MIN_START_S


def test_the_committed_plans_parse_and_their_first_parts_fit_by_their_limits(plan):
    for path in sorted(PLANS.glob("*.plan")):
        parts = _parts(plan, *plan.read_plan(path))
        schedule = plan.simulate(parts, budget_s=plan.DEFAULT_BUDGET_S)
        started = [p.name for p, start, _ in schedule if start is not None]
        assert started[:2] == [p.name for p in parts[:2]], path.name
        assert all(set(p.gpus) <= {0, 1, 2, 3} for p in parts), path.name  # a 4-GPU machine


# Each part writes when it started and its environment; `slow` leaves a child behind that must
# not outlive it.
ENV = (
    "echo $(date +%s.%N) $CUDA_VISIBLE_DEVICES $GPUS $NCCL_NVLS_ENABLE $MASTER_PORT "
    "$PET_MASTER_PORT ${PYTHONPATH%%:*} > $OUT/env.txt"
)
PLAN = [
    f"0:ok={ENV}; sleep 1; echo '# r' > $OUT/r_x.md; echo {{}} > $OUT/r_x.json",
    f"1,2:bad={ENV}; sleep 1; echo broken >&2; exit 3",
    f"0,1@1:slow={ENV}; sleep 60 & echo $! > $OUT/child.pid; sleep 60",
]


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, ended but not yet reaped by its new parent, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_a_plan_runs_its_parts_side_by_side_and_summarises_them(plan, tmp_path, capsys):
    results, pack = tmp_path / "results", tmp_path / "pack"
    code = plan.main([*PLAN, "--results", str(results), "--pack", str(pack)])
    assert code == 1  # a part failed
    env = {n: (results / n / "env.txt").read_text().split() for n in ("ok", "bad", "slow")}
    started = {name: float(fields.pop(0)) for name, fields in env.items()}
    assert abs(started["ok"] - started["bad"]) < 0.5  # side by side (1 s each)
    assert started["slow"] - started["ok"] >= 1.0  # after both, on GPUs of each
    assert env["ok"][:3] == ["0", "1", "0"] and env["bad"][:3] == ["1,2", "2", "0"]
    ports = [e[3] for e in env.values()]
    assert len(set(ports)) == 3 and all(e[3] == e[4] for e in env.values())
    assert {e[5] for e in env.values()} == {(SCRIPTS.parent / "src").as_posix()}  # no install
    child = (results / "slow" / "child.pid").read_text().strip()
    assert not _alive(int(child))  # stopped with everything it started
    assert "broken" in (results / "bad" / "log.txt").read_text()

    table = capsys.readouterr().out.rstrip().splitlines()[-5:]  # printed last
    rows = {r.split("|")[1].strip(): [c.strip() for c in r.split("|")[2:-1]] for r in table[2:]}
    assert rows["ok"] == ["0", "1", "ok", "—", "env.txt r_x.{json,md}"]
    assert rows["bad"][0] == "1,2" and rows["bad"][2] == "failed (exit 3)"
    assert rows["slow"][0] == "0,1" and rows["slow"][2] == "timed out (1 s)"

    log = [line.split("\t") for line in (results / "commands.tsv").read_text().splitlines()]
    assert [(f[0], f[4], f[6]) for f in log] == [("ok", "0", "0"), ("bad", "3", "1,2"),
                                                 ("slow", "124", "0,1")]  # fmt: skip
    summary = (pack / "summary.md").read_text()
    assert "| bad " in summary and "broken" in summary  # the end of a failed part's log
    with tarfile.open(pack / "results.tgz") as tar:
        names = set(tar.getnames())
    assert {"results/ok/r_x.md", "results/bad/log.txt", "results/commands.tsv"} <= names
    assert sorted(p.name for p in pack.iterdir()) == ["results.tgz", "summary.md"]


def test_pack_cuts_large_archives_into_pieces_and_keeps_within_the_file_count(plan, tmp_path):
    results = tmp_path / "results"
    (results / "part").mkdir(parents=True)
    (results / "part" / "small.md").write_text("# small\n")
    rng = __import__("random").Random(0)
    for i in range(3):  # incompressible, above the size that sends a file to bulk.tgz
        (results / "part" / f"trace{i}.json").write_bytes(rng.randbytes(plan.LARGE_FILE_BYTES + 1))
    piece = plan.LARGE_FILE_BYTES * 2
    notes = plan.pack(results, tmp_path / "a", max_file_bytes=piece, max_files=8)
    written = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert written == ["bulk.tgz.000", "bulk.tgz.001", "results.tgz"]
    joined = tmp_path / "bulk.tgz"
    joined.write_bytes(b"".join((tmp_path / "a" / n).read_bytes() for n in written[:2]))
    with tarfile.open(joined) as tar:
        assert len(tar.getnames()) == 3
    assert any("cat NAME.tgz.*" in note for note in notes)
    notes = plan.pack(results, tmp_path / "b", max_file_bytes=piece, max_files=3)
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["bulk.tgz.000", "results.tgz"]
    assert any("bulk.tgz.001 left out" in note for note in notes)


def test_record_hands_the_command_log_to_script_results(plan, tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(plan.subprocess, "run", lambda argv, **kw: calls.append(argv))
    results = tmp_path / "results"
    parts = _parts(plan, "0-1:one=true", "3:two=true", "2:three=true")
    parts[0].exit_code = parts[2].exit_code = 0  # ran; two never started
    args = plan.build_parser().parse_args(["--results", str(results), "--record", "plan_x"])
    args.device = "cuda"
    plan._record(args, parts, results / "commands.tsv")
    ((*_, script, what, log), *_) = [c[:4] for c in calls]
    assert (Path(script).name, what, log) == (
        "script_results.py",
        "log",
        str(results / "commands.tsv"),
    )
    options = dict(zip(calls[0][4::2], calls[0][5::2], strict=False))
    assert options["--topic"] == "plan_x" and options["--gpus"] == "2"
    assert options["--device"] == "cuda" and options["--attach"] == str(results)
    assert [a for a in calls[0] if a.startswith("--within")] == ["--within=one", "--within=three"]
    command = options["--command"]  # what ran, not how it was recorded
    assert command.startswith("python3 packages/bench/scripts/gpu_plan.py --text TEXT_FILE ")
    assert "--record" not in command


def test_parts_never_write_into_an_earlier_calls_folders(plan, tmp_path):
    results = tmp_path / "results"
    for name in ("a", "a-2", "b"):
        (results / name).mkdir(parents=True)
    parts = _parts(plan, "0:a=true", "1:a=true", "2:b=true", "3:c=true")
    plan.give_fresh_folders(parts, results)
    assert [p.name for p in parts] == ["a-3", "a-2-2", "b-2", "c"]
