"""The Gluon forward (`fa2.triton.gluon_forward`, chosen by FA2_GLUON_FORWARD=1).

Without a GPU: compiled for sm_90 on the CPU through `packages/fa2/scripts/sm90_screen.py` with
fa2's own launch plans (in a process of its own: this one runs Triton's interpreter, in which
Gluon kernels do not run), it is warp-specialised (a producer and two consumer warpgroups at the
register counts it asks for) and spills nothing, at d = 128 causal and d = 64 not; and a call
that cannot take it warns and runs the Triton forward. On an sm_90 GPU: o and L against a float64
oracle at small ragged shapes, and the gradients through fa2's backward from its L, with the
tolerance of fa2's other GPU tests (`oracle_checks`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from oracle_checks import assert_within_twice_plain, grads, relative_error

from fa2 import FlashAttention2Triton, attention_reference
from fa2.triton import forward
from fa2.triton.gluon_forward import (
    CONSUMER_REGS,
    PRODUCER_REGS,
    gluon_forward_available,
    gluon_importable,
)

SCREEN = Path(__file__).resolve().parents[1] / "scripts" / "sm90_screen.py"
# Two of the screen's cases, one per head dim and causality (each compile takes seconds on a
# CI core; the screen's results page has all four combinations).
CASES = ("bf16 d128 (16, 1, 16384)", "d64 non-causal ragged (1, 16, 4000)")
HOPPER_SHARED_MEMORY = 227 * 1024  # what a block may take on sm_90


@pytest.fixture(autouse=True)
def fresh_plans():
    """Plans built afresh (the environment variable is part of their key, the warnings not)."""
    forward._plans.cache.clear()
    forward._gluon_refusals.clear()
    yield
    forward._plans.cache.clear()


@pytest.mark.skipif(
    not gluon_importable(), reason="no Gluon written for this Triton (fa2 targets 3.6's)"
)
@pytest.mark.parametrize(
    ("setting", "cases"), [("1", CASES), ("persistent", ("bf16 d128 (16, 1, 16384)",))]
)
def test_compiles_for_sm90_warp_specialised_without_spills(tmp_path, setting, cases):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(FA2_GLUON_FORWARD=setting, TRITON_CACHE_DIR=str(tmp_path / "cache"))
    out = tmp_path / "screen.json"
    command = [
        sys.executable, str(SCREEN), "--tiles", "default", "--kernels", "forward",
        "--cases", *cases, "--json", str(out),
    ]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads(out.read_text())["rows"]
    assert {r["case"] for r in rows} == set(cases)
    for row in rows:
        assert "error" not in row, row
        assert row["tile"] == "gluon", row
        assert row["ws"] and row["stack"] == 0, row
        # the consumers' and the producer's budgets are what the kernel requests
        assert {CONSUMER_REGS, PRODUCER_REGS} <= set(row["setmaxnreg"]), row
        assert row["warps"] == 12 and row["smem"] <= HOPPER_SHARED_MEMORY, row


def test_a_call_it_cannot_take_warns_and_runs_the_triton_forward(monkeypatch):
    # Head dim 16: refused on any device (and on the CPU, the device itself is refused).
    monkeypatch.setenv("FA2_GLUON_FORWARD", "1")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    q, k, v = (torch.randn(1, 2, 20, 16, device=device) for _ in range(3))
    with pytest.warns(UserWarning, match="Triton forward runs instead"):
        o = FlashAttention2Triton.apply(q, k, v, True)
    (plan,) = forward._plans.cache.values()
    assert not plan.gluon
    ref, _ = attention_reference(q.double(), k.double(), v.double(), causal=True)
    assert relative_error(o, ref) < 1e-4
    assert not gluon_forward_available(q)


@pytest.mark.parametrize(
    ("shapes", "strides", "refused"),
    [
        # (batch, heads, n) of q, k, v, o and their (batch, head, row) strides at d = 64
        ([(2, 3, 256)] * 4, [(3 * 256 * 64, 256 * 64, 64)] * 4, None),
        ([(2, 3, 200)] * 4, [(3 * 200 * 64, 200 * 64, 64)] * 4, "multiples of 128"),
        ([(2, 3, 256)] * 4, [(256 * 3 * 64, 64, 3 * 64)] * 4, "follow each other"),
        ([(1, 1, 384)] * 4, [(0, 0, 64)] * 4, None),  # one head: its strides never step
    ],
)
def test_the_persistent_grid_takes_whole_tiles_of_rows_that_follow_each_other(
    shapes, strides, refused
):
    from fa2.triton.gluon_forward import persistent_refusal

    reason = persistent_refusal(shapes, strides)
    assert reason is None if refused is None else refused in reason


def test_the_setting_takes_only_its_values(monkeypatch):
    monkeypatch.setenv("FA2_GLUON_FORWARD", "yes")
    q = torch.randn(1, 1, 4, 16)
    with pytest.raises(ValueError, match="FA2_GLUON_FORWARD must be"):
        FlashAttention2Triton.apply(q, q, q, True)


gpu = pytest.mark.skipif(
    not (
        torch.cuda.is_available()
        and torch.cuda.get_device_capability() == (9, 0)
        and gluon_importable()
    ),
    reason="needs an sm_90 GPU and the Triton whose Gluon the kernel is written for",
)

# (batch, heads, n_q, n_k, d, causal, layout): ragged lengths (not multiples of 64 or 128),
# one query, fewer and more keys than queries (top-left causal), (b, s, h, d) strides.
GPU_CASES = [
    (2, 3, 200, 200, 128, True, "bhsd"),
    (2, 3, 333, 333, 64, True, "bshd"),
    (1, 2, 1, 1, 64, True, "bhsd"),
    (1, 2, 300, 100, 128, True, "bhsd"),
    (1, 2, 100, 300, 64, True, "bhsd"),
    (2, 2, 257, 130, 128, False, "bshd"),
    (1, 4, 64, 500, 64, False, "bhsd"),
]


def _inputs(b, h, n_q, n_k, d, layout, dtype):
    def make(n):
        if layout == "bshd":  # (b, s, h, d) storage, seen as (b, h, s, d)
            return torch.randn(b, n, h, d, device="cuda", dtype=dtype).transpose(1, 2)
        return torch.randn(b, h, n, d, device="cuda", dtype=dtype)

    return make(n_q), make(n_k), make(n_k)


# (FA2_GLUON_FORWARD, dtype): each order of the consumers' work in bf16, the default in fp16 too
# ("persistent" at these ragged or strided shapes: refused, so the one-item grid in its mode)
SETTINGS = [
    ("1", torch.bfloat16),
    ("1", torch.float16),
    ("pingpong", torch.bfloat16),
    ("plain", torch.bfloat16),
    ("persistent", torch.bfloat16),
]


def _assert_o_and_lse_within_budget(o, lse, q, k, v, causal):
    """o and L against the float64 oracle, within twice the plain 16-bit reference's error."""
    ref_o, ref_lse = attention_reference(q.double(), k.double(), v.double(), causal=causal)
    plain_o, plain_lse = attention_reference(q, k, v, causal=causal)
    floor = 1e-3  # the 16-bit floor of `assert_within_twice_plain`
    for name, ours, ref, plain in (("o", o, ref_o, plain_o), ("lse", lse, ref_lse, plain_lse)):
        assert torch.isfinite(ours).all(), name
        err, budget = relative_error(ours, ref), 2 * relative_error(plain, ref) + floor
        assert err <= budget, f"{name}: error {err:.2e} > budget {budget:.2e}"


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize(("setting", "dtype"), SETTINGS)
@pytest.mark.parametrize("case", GPU_CASES)
def test_o_and_lse_match_float64(monkeypatch, case, setting, dtype):
    b, h, n_q, n_k, d, causal, layout = case
    monkeypatch.setenv("FA2_GLUON_FORWARD", setting)
    q, k, v = _inputs(b, h, n_q, n_k, d, layout, dtype)
    from fa2.triton.function import run_forward

    o, lse, plan = run_forward(q, k, v, is_causal=causal)
    assert plan.gluon
    _assert_o_and_lse_within_budget(o, lse, q, k, v, causal)


# (batch, heads, n_q, n_k, d, causal, heads a group): whole tiles of (batch, heads, n, d) rows,
# more 128-row tiles than a Hopper GPU has multiprocessors (so that programs take several),
# causal with as many, fewer and more keys than queries, and not causal; (batch, head)s taken
# all together, or in groups (`persistent_group`, made small here) with a smaller last one.
PERSISTENT_CASES = [
    (4, 40, 512, 512, 64, True, None),
    (2, 48, 768, 768, 128, True, 5),
    (3, 20, 384, 640, 128, True, 7),
    (2, 30, 640, 256, 64, True, 1),
    (2, 40, 512, 384, 128, False, 3),
]


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("case", PERSISTENT_CASES)
def test_the_persistent_grid_matches_float64(monkeypatch, case):
    from fa2.triton import gluon_forward

    b, h, n_q, n_k, d, causal, group = case
    monkeypatch.setenv("FA2_GLUON_FORWARD", "persistent")
    if group is not None:  # the keys and values of `group` heads at a time
        monkeypatch.setattr(gluon_forward, "PERSISTENT_GROUP_BYTES", group * 2 * n_k * d * 2)
    q, k, v = _inputs(b, h, n_q, n_k, d, "bhsd", torch.bfloat16)
    from fa2.triton.function import run_forward

    o, lse, plan = run_forward(q, k, v, is_causal=causal)
    assert plan.gluon and plan.persistent_refusal is None
    batch_heads, group_heads = plan.launch.trailing
    assert batch_heads == b * h and (group is None or group_heads == group)
    programs, *rest = plan.launch.grid
    assert rest == [1, 1] and programs <= torch.cuda.get_device_properties(0).multi_processor_count
    assert programs < b * h * n_q // 128  # several items a program
    _assert_o_and_lse_within_budget(o, lse, q, k, v, causal)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("setting", ["1", "pingpong"])
@pytest.mark.parametrize("case", [GPU_CASES[0], GPU_CASES[1], GPU_CASES[5]])
def test_gradients_through_fa2_backward_match_float64(monkeypatch, case, setting):
    b, h, n_q, n_k, d, causal, layout = case
    dtype = torch.bfloat16
    monkeypatch.setenv("FA2_GLUON_FORWARD", setting)
    q, k, v = (t.requires_grad_() for t in _inputs(b, h, n_q, n_k, d, layout, dtype))
    do = torch.randn_like(q)
    ours = grads(FlashAttention2Triton.apply(q, k, v, causal), (q, k, v), do)
    (plan,) = forward._plans.cache.values()
    assert plan.gluon

    def run(dtype):
        ins = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        ref, _ = attention_reference(*ins, causal=causal)
        return grads(ref, ins, do.to(dtype))

    assert_within_twice_plain(ours, run(torch.float64), run(dtype), dtype)
