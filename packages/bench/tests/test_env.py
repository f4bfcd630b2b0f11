"""Environment records and memory readings."""

import importlib
import json
import subprocess
from pathlib import Path

import pytest
import torch

import bench
import bench.core.env
from bench.core.env import code_version, collect_env, command_line
from bench.core.hardware import GPUS, find_gpu, gpu_named, matmul_format, peak_tflops
from bench.core.memory import memory_in_use, peak_memory, reset_peak_memory, to_mib
from bench.core.results import code_line


def test_collect_env_has_versions_and_is_json_ready():
    env = collect_env("cpu", command="bench-x --a 1")
    assert env["torch"] == torch.__version__
    assert env["device_type"] == "cpu"
    assert env["command"] == "bench-x --a 1"
    json.dumps(env)


def test_command_line_quotes_arguments():
    assert command_line(["--json", "a b.json"], prog="bench-x") == "bench-x --json 'a b.json'"


def test_memory_readings_are_none_on_cpu():
    reset_peak_memory("cpu")
    assert peak_memory("cpu") is None
    assert memory_in_use("cpu") is None
    assert to_mib(None) is None
    assert to_mib(3 << 20) == 3.0


@pytest.mark.gpu
def test_peak_memory_sees_a_freed_allocation_on_cuda():
    reset_peak_memory("cuda")
    base = memory_in_use("cuda")
    x = torch.randn(1 << 20, device="cuda")  # 4 MiB of float32
    del x
    assert memory_in_use("cuda") == base
    assert peak_memory("cuda") >= base + (4 << 20)


def test_peak_tflops_by_device_name_and_format():
    assert peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == 989.4
    assert peak_tflops("NVIDIA H100 PCIe", "bf16") == 756.0
    assert peak_tflops("NVIDIA H200", "fp32") == 66.9
    assert peak_tflops("AMD EPYC 7R13", "bf16") is None
    assert peak_tflops("Tesla T4", "fp16") == 65.0
    assert peak_tflops("Tesla T4", "bf16") is None  # Turing has no bf16 tensor cores


@pytest.mark.parametrize(
    ("device_name", "gpu"),
    [
        ("Tesla T4", "T4"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA L40S", None),  # not an L4
        ("NVIDIA A10G", "A10G"),
        ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA A100 80GB PCIe", "A100-80GB"),
        ("NVIDIA GeForce RTX 4090", "RTX-4090"),
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA H100 NVL", "H100-NVL"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA B200", "B200"),
    ],
)
def test_a_device_name_finds_its_gpu_by_whole_words(device_name, gpu):
    found = find_gpu(device_name)
    assert (found and found.name) == gpu


def test_every_gpu_has_its_memory_capability_and_source():
    for gpu in GPUS:
        assert gpu.memory_gb > 0 and gpu.capability >= (7, 5) and gpu.source
        assert gpu_named(gpu.name.lower()) is gpu
        dense = [gpu.peaks.get(f) for f in ("bf16", "fp16", "tf32", "fp32") if f in gpu.peaks]
        assert dense == sorted(dense, reverse=True)  # 16-bit ≥ TF32 ≥ fp32
    with pytest.raises(ValueError, match="no bf16 matmul rate for the T4"):
        gpu_named("T4").tflops("bf16")
    with pytest.raises(ValueError, match="unknown GPU 'V100'"):
        gpu_named("V100")


def test_matmul_format_follows_tf32_switch():
    matmul = torch.backends.cuda.matmul
    before = matmul.allow_tf32
    try:
        assert matmul_format(torch.bfloat16) == "bf16"
        matmul.allow_tf32 = False
        assert matmul_format(torch.float32) == "fp32"
        matmul.allow_tf32 = True
        assert matmul_format(torch.float32) == "tf32"
    finally:
        matmul.allow_tf32 = before


def test_collect_env_records_the_code_measured():
    env = collect_env("cpu")
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"],
        cwd=Path(bench.__file__).parent,
        capture_output=True,
        text=True,
    )
    if head.returncode != 0:
        pytest.skip("bench's sources are not in a git checkout here")
    assert env["git_revision"] == head.stdout.strip()
    assert isinstance(env["git_dirty"], bool)
    assert env["packages"] == {
        f"cs336sys-{name}": importlib.import_module(name).__version__
        for name in ("lmcore", "fa2", "ddp", "zero", "bench")
    }


def test_code_version_outside_a_git_checkout_is_none(monkeypatch, tmp_path):
    monkeypatch.setattr(bench.core.env, "__file__", str(tmp_path / "env.py"))
    code = bench.core.env.code_version()
    assert code["git_revision"] is None and code["git_dirty"] is None
    assert code["packages"]["cs336sys-bench"] == bench.__version__


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, "Code: revision not recorded."),
        (
            {
                "git_revision": "0123456789abcdef0",
                "git_dirty": True,
                "packages": {"cs336sys-fa2": "0.1.0"},
            },
            "Code: `0123456789ab` (uncommitted changes); fa2 0.1.0.",
        ),
        (
            {
                "git_revision": "fedcba9876543210f",
                "git_revision_source": "commit that added the file",
                "git_dirty": None,
            },
            "Code: `fedcba987654` (commit that added the file).",
        ),
    ],
)
def test_code_line_names_revision_dirtiness_and_versions(env, expected):
    assert code_line(env) == expected


def test_a_named_revision_wins_over_the_checkouts_git_metadata(monkeypatch):
    monkeypatch.setenv("BENCH_GIT_REVISION", "abcdef0123456789")
    version = code_version()
    assert version["git_revision"] == "abcdef0123456789"
    assert version["git_dirty"] is None
    assert "BENCH_GIT_REVISION" in version["git_revision_source"]
    assert code_line(version).startswith("Code: `abcdef012345` (named by BENCH_GIT_REVISION")
