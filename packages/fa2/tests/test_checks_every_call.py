"""What the Triton path's cached launch plans must not skip: packed-sequence arguments and the
scale are checked on every call, and window sides of any size give the PyTorch path's result.

On a CPU the kernels run in Triton's interpreter (shapes stay small)."""

import subprocess
import sys

import pytest
import torch

from fa2 import checks
from fa2.api import attend
from fa2.triton.function import MAX_MASKED_SEQ

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
LENGTHS = [5, 1, 14]  # 20 tokens; the longest sequence 14


def _cu(values, dtype=torch.int32):
    return torch.tensor(values, dtype=dtype, device=DEVICE)


def _packed(q, cu_q, max_q, *, implementation="triton", cu_k=None, max_k=None):
    cu_k = cu_q if cu_k is None else cu_k
    return attend(
        q, q, q, causal=True, scale=None, window_size=(-1, -1), softcap=0.0, layout="thd",
        implementation=implementation, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
        max_seqlen_q=max_q, max_seqlen_k=max_q if max_k is None else max_k, bottom_right=True,
    )  # fmt: skip


@pytest.mark.parametrize(
    "cu, max_len, error, match",
    [
        (_cu([0, 5, 6, 20], torch.int64), 14, ValueError, "int32"),
        (_cu([1, 5, 6, 20]), 14, ValueError, "start at 0"),
        (_cu([0, 5, 6, 17]), 14, ValueError, "end at the number of tokens"),
        (_cu([0, 5, 6, 23]), 14, ValueError, "end at the number of tokens"),  # past the end
        (_cu([0, 6, 5, 20]), 14, ValueError, "never decrease"),
        (_cu([0, 5, 6, 20]), 13, ValueError, "longer than max_seqlen_q = 13"),
        (_cu([0, 5, 6, 20]), -1, TypeError, "non-negative int"),
    ],
    ids=["int64", "start", "end-short", "past-end", "decreasing", "max-seqlen-low", "negative"],
)
def test_packed_arguments_are_checked_on_every_call(cu, max_len, error, match):
    # Before: a first valid call built the launch plan, whose key leaves the offsets and
    # max_seqlen out, and later calls with the same q, k, v ran unchecked (rows never written,
    # or memory corrupted past the end).
    if DEVICE == "cuda" and error is ValueError and cu.dtype == torch.int32:
        pytest.skip("bad values on a GPU end the CUDA context: see the GPU test below")
    q = torch.randn(20, 2, 16, device=DEVICE)
    _packed(q, _cu([0, 5, 6, 20]), 14)
    for implementation in ("pytorch", "triton"):
        with pytest.raises(error, match=match):
            _packed(q, cu, max_len, implementation=implementation)


def test_a_plan_serves_each_call_with_its_own_scale():
    # Before: a call without a scale after one with a scale got that earlier call's scale from
    # the cached plan, in o, the logsumexp and the backward (found by test_differential).
    q, k, v = (torch.randn(1, 2, 37, 16, device=DEVICE, requires_grad=True) for _ in range(3))
    do = torch.randn_like(q)
    options = dict(causal=True, window_size=(-1, -1), softcap=0.0, layout="bhsd", return_lse=True)
    results = {}
    for scale in (0.3, None):
        for implementation in ("triton", "pytorch"):
            o, lse = attend(q, k, v, scale=scale, implementation=implementation, **options)
            results[implementation] = (o, lse, *torch.autograd.grad(o, (q, k, v), do))
        for x, ref in zip(results["triton"], results["pytorch"], strict=True):
            torch.testing.assert_close(x, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "window",
    [(4, 2**31 - 1), (2**31 - 1, -1), (2**31, -1), (-1, 2**31), (2**40, 3), (2**31 - 2, 0)],
    ids=lambda window: f"{window[0]},{window[1]}",
)
def test_window_sides_near_and_past_2_31_give_the_pytorch_paths_result(window):
    # Before: (4, 2**31 - 1) gave NaN, (2**31 - 1, -1) wrong dK/dV, >= 2**31 failed in the
    # kernel: int32 row arithmetic. A side longer than the sequences is now unbounded.
    q = torch.randn(1, 1, 40, 16, device=DEVICE, requires_grad=True)
    k, v = (torch.randn(1, 1, 33, 16, device=DEVICE, requires_grad=True) for _ in range(2))
    do = torch.randn_like(q)
    results = []
    for implementation, dtype in (("triton", torch.float32), ("pytorch", torch.float64)):
        ins = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        o = attend(
            *ins, causal=False, scale=None, window_size=window, softcap=0.0, layout="bhsd",
            implementation=implementation, bottom_right=True,
        )  # fmt: skip
        results.append((o, *torch.autograd.grad(o, ins, do.to(dtype))))
    for x, ref in zip(*results, strict=True):
        torch.testing.assert_close(x.double(), ref, atol=1e-5, rtol=1e-5)


def test_masks_over_sequences_past_the_int32_limit_are_refused():
    # 2**29 + 1 rows of one broadcast row (no memory): refused before any kernel runs.
    n = MAX_MASKED_SEQ + 1
    q = torch.randn(1, 1, 16, device=DEVICE).expand(1, n, 16)
    with pytest.raises(ValueError, match="int32 row arithmetic"):
        attend(q, q, q, causal=True, scale=None, window_size=(-1, -1), softcap=0.0,
               layout="bhsd", implementation="triton")  # fmt: skip


def test_device_offsets_are_asserted_once_per_tensor_and_version(monkeypatch):
    # The eager GPU path: device-side assertions (no host sync), issued again only for another
    # tensor, an in-place change (the version counter) or other totals. Run here on CPU
    # tensors, where torch._assert_async raises at once.
    issued = []
    real = checks._assert_offsets
    monkeypatch.setattr(checks, "_assert_offsets", lambda *a: (issued.append(a), real(*a)))
    cu = torch.tensor([0, 5, 6, 20], dtype=torch.int32)
    for _ in range(3):
        checks._assert_offsets_once("cu_seqlens_q", cu, 20, 14)
    assert len(issued) == 1
    checks._assert_offsets_once("cu_seqlens_q", cu, 20, 15)  # another max_seqlen
    assert len(issued) == 2
    cu[1] = 4  # an in-place change bumps the version counter
    checks._assert_offsets_once("cu_seqlens_q", cu, 20, 15)
    assert len(issued) == 3
    checks._assert_offsets_once("cu_seqlens_q", cu.clone(), 20, 15)  # another tensor
    assert len(issued) == 4
    cu[3] = 25
    with pytest.raises(RuntimeError, match="fa2: cu_seqlens_q must start at 0"):
        checks._assert_offsets_once("cu_seqlens_q", cu, 20, 14)


def test_offsets_fa2_vouches_for_get_no_device_assertions(monkeypatch):
    # flash_attn_with_kvcache's rows at one length: offsets built each call from a length
    # checked on the host, read by every layer of a decoding step, asserted never.
    from fa2.kvcache import _uniform_offsets

    issued = []
    monkeypatch.setattr(checks, "_assert_offsets", lambda *a: issued.append(a))
    batch, seqlen_q, seqlen_cache = 3, 1, 40
    cu_q, cu_k = _uniform_offsets(batch, seqlen_q, seqlen_cache, 17, torch.device("cpu"))
    for _ in range(2):  # as attend passes them (see kvcache's call)
        checks._assert_offsets_once("cu_seqlens_q", cu_q, batch * seqlen_q, seqlen_q)
        checks._assert_offsets_once("cu_seqlens_k", cu_k, batch * seqlen_cache, seqlen_cache)
    assert not issued
    cu_k += 0  # changed in place: no longer vouched for
    checks._assert_offsets_once("cu_seqlens_k", cu_k, batch * seqlen_cache, seqlen_cache)
    assert len(issued) == 1


def test_a_vouched_pair_survives_a_full_record(monkeypatch):
    # With the record one short of full, vouching for the kv-cache's pair of offsets must keep
    # both: emptying the record for the second once dropped the first (a flaky assertion).
    from fa2.kvcache import _uniform_offsets

    monkeypatch.setattr(checks, "_CHECKED_OFFSETS", {})
    others = [
        torch.arange(i + 2, dtype=torch.int32) for i in range(checks._MAX_CHECKED_OFFSETS - 1)
    ]
    for cu in others:
        checks.vouch_for_offsets(cu, total=int(cu[-1]), max_seqlen=1)
    issued = []
    monkeypatch.setattr(checks, "_assert_offsets", lambda *a: issued.append(a))
    cu_q, cu_k = _uniform_offsets(3, 1, 40, 17, torch.device("cpu"))
    checks._assert_offsets_once("cu_seqlens_q", cu_q, 3, 1)
    checks._assert_offsets_once("cu_seqlens_k", cu_k, 3 * 40, 40)
    assert not issued
    assert len(checks._CHECKED_OFFSETS) <= checks._MAX_CHECKED_OFFSETS


def test_one_offsets_tensor_for_both_sides_is_checked_once(monkeypatch):
    # Self-attention passes one tensor, which the front doors hand on as a view of itself
    # (fa2.api._distinct): a new object each call, which must not cost a second check.
    checked = []
    monkeypatch.setattr(checks, "_raise_on_bad_offsets", lambda *a: checked.append(a[0]))
    q = torch.randn(20, 2, 16)
    cu = torch.tensor([0, 5, 6, 20], dtype=torch.int32)
    checks.check_varlen(q, q, cu, cu.view(cu.shape), 14, 14)
    assert checked == ["cu_seqlens_q"]
    checks.check_varlen(q, q, cu, cu.clone(), 14, 14)  # equal values, other memory: both
    checks.check_varlen(q, q, cu, cu.view(cu.shape), 14, 15)  # another max_seqlen_k: both
    assert len(checked) == 5


@pytest.mark.gpu
@pytest.mark.parametrize("cu, max_len", [([0, 5, 6, 23], 14), ([0, 5, 6, 20], 13)])
def test_bad_offsets_on_a_gpu_stop_the_process_with_the_reason(cu, max_len):
    # A device-side assert ends the CUDA context, so the call runs in a process of its own.
    code = f"""
import torch
from fa2 import flash_attn_varlen_func
q = torch.randn(20, 2, 16, device="cuda", dtype=torch.bfloat16)
good = torch.tensor([0, 5, 6, 20], dtype=torch.int32, device="cuda")
flash_attn_varlen_func(q, q, q, good, good, 14, 14, causal=True)
bad = torch.tensor({cu}, dtype=torch.int32, device="cuda")
flash_attn_varlen_func(q, q, q, bad, bad, {max_len}, {max_len}, causal=True)
torch.cuda.synchronize()
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode != 0
    assert "device-side assert" in run.stderr or "fa2: cu_seqlens_q" in run.stderr
