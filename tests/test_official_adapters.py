"""The official CS336 suites' adapters bind to this project's real classes; the runner prepares a
checkout's tests with them (a fake checkout here: no network, no course code)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from spawn_ranks import free_port
from torch import nn

import ddp
import fa2
import zero

OFFICIAL = Path(__file__).resolve().parent / "official"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"_official_{name}", OFFICIAL / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


adapters = _load("adapters")
runner = _load("run")


def test_every_adapter_of_both_suites_is_defined_once():
    defined = runner.adapter_names(runner.ADAPTERS)
    assert len(defined) == len(set(defined))
    for suite, names in adapters.SUITES.items():
        assert set(names) <= set(defined), suite
    assert set(defined) == {n for names in adapters.SUITES.values() for n in names}


def test_flash_attention_adapters_are_fa2s_autograd_functions():
    pytorch = adapters.get_flashattention_autograd_function_pytorch()
    assert pytorch is fa2.FlashAttention2PyTorch
    assert adapters.get_flashattention_autograd_function_triton() is fa2.FlashAttention2Triton
    assert issubclass(pytorch, torch.autograd.Function)
    q, k, v = (torch.randn(2, 33, 16, requires_grad=True) for _ in range(3))
    o = pytorch.apply(q, k, v, True)  # positional is_causal, as the suites call it
    reference = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(o, reference, rtol=1e-4, atol=1e-5)
    lse = [t for t in o.grad_fn.saved_tensors if t.shape == (2, 33)]
    assert len(lse) == 1  # the suites look for exactly one (batch, queries) tensor


@pytest.fixture
def one_rank():
    """A gloo process group of one rank, in this process."""
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_parallel_adapters_bind_to_ddp_and_zero(one_rank):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(11, 8), nn.Linear(8, 5))
    x = torch.randint(0, 11, (3, 4))
    for get, after in (
        (adapters.get_ddp, adapters.ddp_on_after_backward),
        (
            adapters.get_ddp_individual_parameters,
            adapters.ddp_individual_parameters_on_after_backward,
        ),
    ):
        wrapped = get(model)
        assert isinstance(wrapped, ddp.DDPIndividualParameters)
        wrapped(x).sum().backward()
        after(wrapped, None)
    bucketed = adapters.get_ddp_bucketed(model, 0.0001)
    assert isinstance(bucketed, ddp.DDPBucketed)
    adapters.ddp_bucketed_on_train_batch_start(bucketed, None)
    bucketed(x).sum().backward()
    adapters.ddp_bucketed_on_after_backward(bucketed, None)
    optimizer = adapters.get_sharded_optimizer(model.parameters(), torch.optim.AdamW, lr=0.1)
    assert isinstance(optimizer, zero.ShardedOptimizer)
    optimizer.step()

    plain = nn.Sequential(nn.Embedding(11, 8), nn.Linear(8, 5))
    fsdp = adapters.get_fsdp(plain, compute_dtype=torch.bfloat16)
    assert isinstance(fsdp, zero.FSDP) and fsdp.compute_dtype == torch.bfloat16
    fsdp(x).sum().backward()
    adapters.fsdp_on_after_backward(fsdp, None)
    full = adapters.fsdp_gather_full_params(fsdp)
    assert {name: t.shape for name, t in full.items()} == {
        "0.weight": (11, 8),
        "1.weight": (5, 8),
        "1.bias": (5,),
    }


def _fake_checkout(root: Path, *, version: str, names: list[str]) -> Path:
    (root / "tests" / "fixtures").mkdir(parents=True)
    (root / "tests" / "__init__.py").write_text("")
    (root / "tests" / "fixtures" / "data.txt").write_text("x")
    body = "\n\n".join(f"def {n}(*args, **kwargs):\n    raise NotImplementedError" for n in names)
    (root / "tests" / "adapters.py").write_text(body + "\n")
    (root / "pyproject.toml").write_text(
        f'[project]\nname = "cs336-systems"\nversion = "{version}"\n'
    )
    return root


def test_runner_puts_our_adapters_in_a_scratch_copy(tmp_path):
    checkout = _fake_checkout(
        tmp_path / "a2", version="26.1.1", names=list(adapters.SUITES["spring2026"])
    )
    scratch = runner.prepare(checkout, tmp_path / "scratch")
    assert (scratch / "tests" / "adapters.py").read_text() == runner.ADAPTERS.read_text()
    assert (scratch / "tests" / "fixtures" / "data.txt").is_file()
    assert (scratch / "pyproject.toml").is_file()
    assert "NotImplementedError" in (checkout / "tests" / "adapters.py").read_text()  # untouched
    assert runner.describe(checkout)["suite"] == "spring2026"
    old = _fake_checkout(tmp_path / "old", version="1.0.5", names=["get_ddp_bucketed"])
    assert runner.describe(old)["suite"] == "spring2025"


def test_runner_refuses_a_suite_with_adapters_we_lack(tmp_path):
    checkout = _fake_checkout(tmp_path / "a2", version="27.0.0", names=["get_tensor_parallel"])
    with pytest.raises(ValueError, match="get_tensor_parallel"):
        runner.prepare(checkout, tmp_path / "scratch")
    with pytest.raises(FileNotFoundError, match="assignment2-systems"):
        runner.prepare(tmp_path, tmp_path / "scratch2")


def test_runner_reads_junit_outcomes(tmp_path):
    junit = tmp_path / "junit.xml"
    junit.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_fsdp" name="test_a[fp32]" time="1.5">'
        '<failure message="torch.multiprocessing.spawn.ProcessRaisedException: ">'
        "E   torch.multiprocessing.spawn.ProcessRaisedException: \n"
        "E   AssertionError: Step 0: Parameter w mismatch. Max diff: 1.5e-08"
        "</failure></testcase>"
        '<testcase classname="tests.test_attention" name="test_b" time="0.1">'
        '<skipped message="A GPU must be available" /></testcase>'
        '<testcase classname="tests.test_ddp" name="test_c" time="2" />'
        "</testsuite></testsuites>"
    )
    rows = runner.outcomes(junit)
    assert [(r["test"], r["outcome"]) for r in rows] == [
        ("test_fsdp::test_a[fp32]", "failed"),
        ("test_attention::test_b", "skipped"),
        ("test_ddp::test_c", "passed"),
    ]
    assert rows[0]["message"] == "AssertionError: Step 0: Parameter w mismatch. Max diff: 1.5e-08"
