"""scripts/script_results.py: a pytest run's counts appended to the day's gpu_tests result, and a
script's command log as a result with the results it wrote attached."""

from __future__ import annotations

import importlib.util
import json
import queue
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from bench.core.results import load_json

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"

# Two pass, one is skipped, one fails: what a pytest run of GPU tests may report.
SAMPLE_TESTS = """
import pytest

def test_one():
    assert 1 + 1 == 2

def test_two():
    assert "a" < "b"

@pytest.mark.skip(reason="needs 2 GPUs")
def test_skipped():
    pass

def test_broken():
    assert 2 + 2 == 5
"""


@pytest.fixture(scope="module")
def script_results():
    spec = importlib.util.spec_from_file_location("script_results", SCRIPTS / "script_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# One test passes, the next never ends: a run a time limit stops.
STUCK_TESTS = """
import time

def test_quick():
    pass

def test_stuck():
    time.sleep(600)
"""


def test_pytests_output_is_passed_on_as_it_comes(tmp_path):
    # A run stopped by a time limit (the GPU machines' per-part limits) must still show how
    # far it got: the first test's line arrives while the second still runs.
    tests = tmp_path / "stuck" / "test_stuck.py"
    tests.parent.mkdir()
    tests.write_text(STUCK_TESTS)
    (tests.parent / "pytest.ini").write_text("[pytest]\n")
    argv = [sys.executable, str(SCRIPTS / "script_results.py"), "tests", "--out", str(tmp_path)]
    argv += ["--gpus", "1", "--", str(tests), "-v", "-p", "no:cacheprovider"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    try:
        while "test_quick PASSED" not in lines.get(timeout=60):
            pass
        assert proc.poll() is None  # test_stuck still running
    finally:
        proc.kill()
        proc.wait()


def test_each_pytest_run_is_a_row_of_the_days_result(script_results, tmp_path):
    tests = tmp_path / "sample" / "test_sample.py"
    tests.parent.mkdir()
    tests.write_text(SAMPLE_TESTS)
    (tests.parent / "pytest.ini").write_text("[pytest]\n")  # its own root: no conftest of ours
    out = tmp_path / "results"
    argv = ["tests", "--out", str(out), "--gpus", "2", "--", str(tests), "-q"]
    argv += ["-p", "no:cacheprovider", "-k", "not two"]
    assert script_results.main(argv) == 1  # pytest's status: a test failed
    assert script_results.main([*argv[:-2], "-k", "one"]) == 0
    (saved,) = out.glob("gpu_tests_cpu_*.json")  # no GPU here: the device is the CPU
    run = load_json(saved)
    first, second = run.rows
    assert (first["passed"], first["failed"], first["skipped"], first["deselected"]) == (1, 1, 1, 1)
    assert first["not_passed"] == ["test_sample::test_broken"] and first["exit_status"] == 1
    assert first["skip_reasons"] == {"needs 2 GPUs": 1}
    assert (second["run"], second["passed"], second["failed"], second["deselected"]) == (2, 1, 0, 3)
    assert second["command"].startswith("python3 -m pytest ") and second["command"].endswith("one")
    assert run.env["git_revision"][:12] == first["revision"]
    text = saved.with_suffix(".md").read_text()
    assert "Run 1: 1 skipped: needs 2 GPUs" in text and "Run 1 failed: test_sample::" in text


def test_a_command_log_becomes_a_result_with_what_it_wrote(script_results, tmp_path):
    log = tmp_path / "log.tsv"
    lines = [
        ("zero", "300", "bench-zero xl", "41", "0", "python3 -m bench zero --size xl"),
        ("ddp", "210", "bench-ddp xl-2025", "12", "1", "python3 -m bench ddp --size xl-2025"),
        ("step", "470", "leaderboard step", "470", "124", "python3 -m bench step --preset x"),
    ]
    log.write_text("".join("\t".join(line) + "\n" for line in lines))
    wrote = tmp_path / "wrote"
    (wrote / "bulk").mkdir(parents=True)
    (wrote / "zero_cpu.md").write_text("### Sharding\n\n| a |\n|---|\n| 1 |\n")
    argv = ["log", str(log), "--topic", "rehearsal", "--title", "A rehearsal", "--out"]
    argv += [str(tmp_path / "out"), "--attach", str(wrote), "--note", "not a measurement"]
    assert script_results.main(argv) == 1  # a command failed
    (saved,) = (tmp_path / "out").glob("rehearsal_cpu_*.json")
    rows = json.loads(saved.read_text())["rows"]
    assert [r["status"] for r in rows] == ["ok", "failed (exit 1)", "timed out (470 s)"]
    assert [r["seconds"] for r in rows] == [41, 12, 470] and rows[1]["part"] == "ddp"
    text = saved.with_suffix(".md").read_text()
    assert text.startswith("### A rehearsal") and "- not a measurement" in text
    assert "#### `zero_cpu.md`\n\n### Sharding" in text


def test_a_plans_command_log_keeps_each_parts_gpus(script_results, tmp_path):
    log = tmp_path / "commands.tsv"
    lines = [
        ("ddp", "330", "whole part", "140", "0", "bash multi_gpu.sh ddp DIR T", "0,1,2,3"),
        ("ddp", "300", "bench-ddp xl", "120", "0", "python3 -m bench ddp --json r/x/d.json", "0-3"),
        ("screen", "300", "whole part", "300", "124", "bash -c 'python3 s.py'", "2"),
    ]
    log.write_text("".join("\t".join(line) + "\n" for line in lines))
    rows = script_results.log_rows(log)
    assert [r["gpus"] for r in rows] == ["0,1,2,3", "0-3", "2"]
    wrote = tmp_path / "r" / "x"
    wrote.mkdir(parents=True)
    (wrote / "d.md").write_text("Command: `bench-ddp --json r/x/d.json`\n")
    (tmp_path / "r" / "earlier").mkdir()  # a folder an earlier call left: not this log's
    (tmp_path / "r" / "earlier" / "e.md").write_text("### earlier\n")
    argv = ["log", str(log), "--topic", "plan", "--title", "A plan", "--out", str(tmp_path)]
    argv += ["--attach", str(tmp_path / "r"), "--within", "x", "--replace", "r/x=DIR"]
    assert script_results.main([*argv, "--gpus", "4"]) == 1  # a part timed out
    (saved,) = tmp_path.glob("plan_cpu_*.json")  # a CPU's result names no count
    header = saved.with_suffix(".md").read_text().split("\n| ", 1)[1].split("\n")[0]
    assert [c.strip() for c in header.split("|")[:3]] == ["part", "name", "gpus"]
    text = saved.with_suffix(".md").read_text()
    assert "--json DIR/d.json" in text and "r/x" not in text  # commands and results alike
    assert "#### `x/d.md`" in text and "earlier" not in text
