"""Environment records and memory readings."""

import json

import pytest
import torch

from bench.core.env import collect_env, command_line
from bench.core.hardware import matmul_format, peak_tflops
from bench.core.memory import memory_in_use, peak_memory, reset_peak_memory, to_mib


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
