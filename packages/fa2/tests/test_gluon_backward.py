"""The Gluon single-pass backward for Hopper (`fa2.triton.gluon_backward`, FA2_BACKWARD=gluon).

On the CPU: the kernel compiles for sm_90 warp-specialised and without spills in both ways of
adding dQ (atomics; TMA bulk reductions, whose PTX must hold the reductions, their waits and the
proxy fence), compiled by Triton and its ptxas in a process of its own (the test process runs
Triton's interpreter, which cannot compile and does not run Gluon); the selector falls back to
the Triton backward, saying why, where the kernel cannot run; and where it can, the plan hands
it its views and assembles the gradients in the caller's layout (checked with a float64
stand-in for the kernel). On an H100/H200 (`gpu`): its gradients against a float64 oracle with
the tolerance of fa2's other GPU tests, at ragged lengths, causal or not, head dims 64 and 128,
in both ways of adding dQ.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from oracle_checks import assert_within_twice_plain, grads

from fa2 import FlashAttention2Triton, attention_reference, flash_attn_func
from fa2.triton import configs, gluon_backward
from fa2.triton.backward import backward_plan
from fa2.triton.function import run_forward
from fa2.triton.launch import head_strides

SCREEN = Path(__file__).resolve().parents[1] / "scripts" / "gluon_sm90_screen.py"
HOPPER = (  # an sm_90 GPU and the Triton whose Gluon the kernel is written for
    torch.cuda.is_available()
    and torch.cuda.get_device_capability() == (9, 0)
    and gluon_backward.HAVE_GLUON
)
SMEM_PER_BLOCK = 227 * 1024  # the most shared memory a Hopper block may have


@pytest.mark.skipif(
    not gluon_backward.HAVE_GLUON, reason="no Gluon written for this Triton (fa2 targets 3.6's)"
)
def test_compiles_for_sm90_warp_specialised_without_spills(tmp_path):
    """The heaviest case (d 128, causal: the most registers live) through the compile screen,
    dQ added by atomics and by TMA bulk reductions (DQ_BULK)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")  # compile afresh, write nothing home
    out = tmp_path / "screen.json"
    cases = ["d128-causal", "d128-causal-bulk"]
    command = [sys.executable, str(SCREEN), "--cases", *cases, "--json", str(out)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    atomic, bulk = json.loads(out.read_text())["rows"]
    for row in (atomic, bulk):
        assert row["ws"], row  # a warp_specialize region: the partitions exist
        # 8 compute warps + the loader and reducer warps, padded to a third warpgroup
        assert row["warps"] == gluon_backward.COMPUTE_WARPS + 4, row
        # the workers' caps as asked, the compute warpgroups' within the 240 a thread may have
        assert {gluon_backward.LOADER_REGS, gluon_backward.REDUCER_REGS} <= set(row["setmaxnreg"])
        assert max(row["setmaxnreg"]) <= 240, row
        assert row["stack"] == 0 and row["spill_stores"] == 0, row
        assert row["smem"] <= SMEM_PER_BLOCK, row
    assert atomic["vector_atomics"] and not atomic["bulk_reduce"], atomic  # 16 bytes at a time
    # dQ by bulk reductions only, each group waited for (reads) before dq_smem is released,
    # and one more proxy fence than the atomic form: the partial's stores before the TMA reads
    assert bulk["bulk_reduce"] and not bulk["vector_atomics"], bulk
    assert bulk["bulk_commit"] > atomic["bulk_commit"], (atomic, bulk)
    assert bulk["bulk_wait_read"] > atomic["bulk_wait_read"], (atomic, bulk)
    assert bulk["proxy_fence"] == atomic["proxy_fence"] + 1, (atomic, bulk)


def test_the_selector_reads_fa2_backward(monkeypatch):
    monkeypatch.delenv("FA2_BACKWARD", raising=False)
    assert not configs.gluon_backward_requested()
    monkeypatch.setenv("FA2_BACKWARD", "Gluon")
    assert configs.gluon_backward_requested() and configs.backward_form() == "gluon"
    assert "Gluon" in configs.tile_settings()  # a plan is built per setting
    monkeypatch.setenv("FA2_BACKWARD", "gluon-bulk")
    assert configs.gluon_backward_requested() and configs.backward_form() == "gluon-bulk"
    monkeypatch.setenv("FA2_BACKWARD", "cudnn")
    with pytest.raises(ValueError, match="FA2_BACKWARD must be one of triton, gluon"):
        configs.gluon_backward_requested()


@pytest.mark.skipif(HOPPER, reason="checks the fallback where the kernel cannot run")
def test_falls_back_to_the_triton_backward_saying_why(monkeypatch):
    """Where the kernel cannot run (here: Triton's interpreter, or a GPU other than sm_90), the
    backward plan keeps the Triton kernels and warns once, naming the reason."""
    monkeypatch.setenv("FA2_BACKWARD", "gluon")
    monkeypatch.setattr("fa2.triton.backward._gluon_warned", set())
    device = "cuda" if torch.cuda.is_available() else "cpu"
    q, k, v, do = (torch.randn(1, 1, 20, 16, device=device) for _ in range(4))
    reason = gluon_backward.unsupported_reason(q)
    assert reason is not None
    o, lse, plan = run_forward(q, k, v, True)
    with pytest.warns(UserWarning, match="FA2_BACKWARD=gluon: the Gluon backward cannot run"):
        bwd = backward_plan(plan, q, k, v, o, lse, do, False)
    assert not bwd.gluon and bwd.launches  # the Triton passes
    strided = torch.randn(1, 1, 20, 32, device=device)[..., :16]  # another plan, same reason
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="FA2_BACKWARD")
        assert not backward_plan(plan, q, k, v, o, lse, strided, False).gluon  # said once


def test_a_deterministic_backward_never_takes_it(monkeypatch):
    monkeypatch.setenv("FA2_BACKWARD", "gluon")
    monkeypatch.setattr("fa2.triton.backward._gluon_warned", set())
    monkeypatch.setattr(gluon_backward, "unsupported_reason", lambda *tensors: None)
    # a length of its own: plans are cached by shape, and another test's may refuse the kernel
    q, k, v, do = (torch.randn(1, 1, 23, 16) for _ in range(4))
    o, lse, plan = run_forward(q, k, v, True)
    with pytest.warns(UserWarning, match=r"deterministic backward \(deterministic=True\)"):
        assert not backward_plan(plan, q, k, v, o, lse, do, True).gluon
    assert backward_plan(plan, q, k, v, o, lse, do, False).gluon


@pytest.mark.parametrize("layout, form", [("bhsd", "gluon"), ("bshd", "gluon-bulk")])
def test_the_plan_hands_the_kernel_its_views_and_assembles_the_gradients(monkeypatch, layout, form):
    """The host side, without the kernel: where the plan takes the Gluon path it hands
    `gluon_backward.launch` (here a float64 stand-in) the (..., heads, n, d) views with their
    strides and the way of adding dQ that FA2_BACKWARD names, and returns dq cast into q's
    layout and the dk, dv it wrote, in the caller's."""
    monkeypatch.setenv("FA2_BACKWARD", form)
    monkeypatch.setattr(gluon_backward, "unsupported_reason", lambda *tensors: None)
    calls = []

    def stand_in(q, k, v, o, lse, do, dk, dv, strides, *, scale, causal, dq_bulk):
        views = (q, k, v, o, do, dk)
        assert list(strides) == [head_strides(t) for t in views]
        ins = [t.detach().double().requires_grad_() for t in (q, k, v)]
        with torch.enable_grad():  # a backward runs without
            out, _ = attention_reference(*ins, causal=causal, scale=scale)
            dq, dk_ref, dv_ref = torch.autograd.grad(out, ins, do.double())
        dk.copy_(dk_ref)
        dv.copy_(dv_ref)
        calls.append((causal, dq_bulk))
        return dq.float()

    monkeypatch.setattr(gluon_backward, "launch", stand_in)
    shape = (2, 3, 19, 16) if layout == "bhsd" else (2, 19, 3, 16)
    q, k, v = (torch.randn(shape).requires_grad_() for _ in range(3))
    do = torch.randn(shape)
    o = FlashAttention2Triton.apply(q, k, v, True, None, False, None, False, (-1, -1), 0.0, layout)
    ours = grads(o, (q, k, v), do)
    assert calls == [(True, form == "gluon-bulk")]
    to_bhsd = (lambda t: t) if layout == "bhsd" else (lambda t: t.transpose(1, 2))
    oracle, plain = _oracle_and_plain(*(to_bhsd(t) for t in (q, k, v, do)), causal=True)
    oracle, plain = ([to_bhsd(t) for t in ts] for ts in (oracle, plain))
    assert_within_twice_plain(ours, oracle, plain, torch.float32)


def _oracle_and_plain(q, k, v, do, causal):
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    o64 = attention_reference(q64, k64, v64, causal=causal)[0]
    oracle = grads(o64, (q64, k64, v64), do.double())
    qp, kp, vp = (t.detach().clone().requires_grad_() for t in (q, k, v))
    plain = grads(attention_reference(qp, kp, vp, causal=causal)[0], (qp, kp, vp), do)
    return oracle, plain


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="needs an sm_90 GPU (H100, H200)")
@pytest.mark.parametrize("form", ["gluon", "gluon-bulk"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize(
    "n_q, n_k", [(1, 1), (64, 64), (200, 200), (130, 77), (77, 300), (384, 384)], ids=str
)
def test_matches_the_oracle_through_the_autograd_function(monkeypatch, form, causal, d, n_q, n_k):
    """FA2_BACKWARD=gluon or gluon-bulk (dQ by TMA bulk reductions, the ragged last query tile
    clipped by the descriptor) with deterministic=False: the Gluon kernel runs (no fallback
    warning) and o, dq, dk, dv stay within twice plain PyTorch's bf16 error of float64's."""
    monkeypatch.setenv("FA2_BACKWARD", form)
    make = lambda n: torch.randn(2, 3, n, d, device="cuda", dtype=torch.bfloat16)  # noqa: E731
    q, k, v = (t.requires_grad_() for t in (make(n_q), make(n_k), make(n_k)))
    do = torch.randn_like(q)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="FA2_BACKWARD")  # a fallback would warn
        o = FlashAttention2Triton.apply(q, k, v, causal, None, False, None, False)
        ours = grads(o, (q, k, v), do)
    assert_within_twice_plain(ours, *_oracle_and_plain(q, k, v, do, causal), torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="needs an sm_90 GPU (H100, H200)")
@pytest.mark.parametrize("dq_bulk", [False, True])
@pytest.mark.parametrize("d", [64, 128])
def test_matches_the_oracle_called_directly_in_fp16_on_strided_inputs(d, dq_bulk):
    """`gluon_backward` on (batch, heads, n, d) views of (batch, n, heads, d) tensors (the
    strides flash-attn's layout gives), fp16, a ragged length, with the forward's lse, dQ
    added either way."""
    n = 333
    shape = (2, n, 4, d)
    make = lambda: torch.randn(shape, device="cuda", dtype=torch.float16).transpose(1, 2)  # noqa: E731
    q, k, v, do = make(), make(), make(), make()
    o, lse = FlashAttention2Triton.apply(q, k, v, True, None, True)
    dq, dk, dv = gluon_backward.gluon_backward(
        q, k, v, o, lse, do, scale=d**-0.5, causal=True, dq_bulk=dq_bulk
    )
    ours = [o, dq, dk, dv]
    assert_within_twice_plain(ours, *_oracle_and_plain(q, k, v, do, True), torch.float16)


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="needs an sm_90 GPU (H100, H200)")
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize(
    "n_q, n_k", [(1, 1), (200, 200), (130, 77), (77, 300), (1000, 1000)], ids=str
)
def test_the_ordered_form_matches_the_oracle_and_repeats_its_bits(causal, d, n_q, n_k):
    """`deterministic=True`: the key tiles add into each dQ tile one at a time in a fixed order
    (semaphores), so two calls give the same bits, within the oracle's tolerance; 1000 rows
    are 8 key tiles and 16 query tiles, so each dQ tile takes several ordered additions."""
    make = lambda n: torch.randn(2, 3, n, d, device="cuda", dtype=torch.bfloat16)  # noqa: E731
    q, k, v = make(n_q), make(n_k), make(n_k)
    do = torch.randn_like(q)
    o, lse = FlashAttention2Triton.apply(q, k, v, causal, None, True)
    call = lambda: gluon_backward.gluon_backward(  # noqa: E731
        q, k, v, o, lse, do, scale=d**-0.5, causal=causal, deterministic=True
    )
    first, second = call(), call()
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)
    assert_within_twice_plain([o, *first], *_oracle_and_plain(q, k, v, do, causal), torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="needs an sm_90 GPU (H100, H200)")
def test_flash_attn_layout_takes_it_with_equal_lengths(monkeypatch):
    """flash_attn_func's (batch, seq, heads, d) tensors, causal, deterministic=False (its
    default): the plan reads them in place through the Gluon kernel."""
    monkeypatch.setenv("FA2_BACKWARD", "gluon")
    q, k, v = (
        torch.randn(2, 257, 4, 128, device="cuda", dtype=torch.bfloat16).requires_grad_()
        for _ in range(3)
    )
    do = torch.randn_like(q)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="FA2_BACKWARD")  # a fallback would warn
        ours = grads(flash_attn_func(q, k, v, causal=True), (q, k, v), do)
    bhsd = [t.transpose(1, 2) for t in (q, k, v, do)]
    oracle, plain = _oracle_and_plain(*bhsd, causal=True)
    oracle, plain = ([t.transpose(1, 2) for t in ts] for ts in (oracle, plain))
    assert_within_twice_plain(ours, oracle, plain, torch.bfloat16)
