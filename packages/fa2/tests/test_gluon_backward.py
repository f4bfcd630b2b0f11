"""The Gluon single-pass backward for Hopper (`fa2.triton.gluon_backward`; FA2_BACKWARD).

On the CPU: the kernel compiles for sm_90 warp-specialised, adding dQ with TMA bulk reductions
as they come or in a fixed order (whose PTX must hold the semaphore's acquire loads, the
completion waits and the release counts), compiled by Triton and its ptxas in a process of its
own (the test process runs Triton's interpreter, which cannot compile and does not run Gluon);
the setting's values and where "auto" asks for the kernel; the selector falls back to the
Triton backward where the kernel cannot run, saying why only where FA2_BACKWARD=gluon asks for
it; and where it can run, the plan hands it its views and the call's order and assembles the
gradients in the caller's layout (checked with a float64 stand-in for the kernel). On an
H100/H200 (`gpu`): its gradients against a float64 oracle with the tolerance of fa2's other GPU
tests, at ragged lengths, causal or not, head dims 64 and 128, in both orders; the ordered
form's bits repeat; head dim 128 takes it by default, and a compiled call runs it as
`fa2::gluon_backward` with the eager call's bits.
"""

from __future__ import annotations

import functools
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
def test_compiles_for_sm90_warp_specialised(tmp_path):
    """The heaviest case (d 128, causal: the most registers live) through the compile screen,
    dQ's additions as they come and in a fixed order (DQ_ORDERED), and d 64 at 128 queries a
    step (`launch(block_m=128)`)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")  # compile afresh, write nothing home
    out = tmp_path / "screen.json"
    cases = ["d128-causal", "d128-causal-ordered", "d64-causal-m128"]
    command = [sys.executable, str(SCREEN), "--cases", *cases, "--json", str(out)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    unordered, ordered, wide = json.loads(out.read_text())["rows"]
    for row in (unordered, ordered, wide):
        assert row["ws"], row  # a warp_specialize region: the partitions exist
        # 8 compute warps + the loader and reducer warps, padded to a third warpgroup
        assert row["warps"] == gluon_backward.COMPUTE_WARPS + 4, row
        # the workers' caps as asked, the compute warpgroups' within the 240 a thread may have
        assert {gluon_backward.LOADER_REGS, gluon_backward.REDUCER_REGS} <= set(row["setmaxnreg"])
        assert max(row["setmaxnreg"]) <= 240, row
        assert row["smem"] <= SMEM_PER_BLOCK, row
        # dQ by bulk reductions, each group's reads waited for before dq_smem is released
        assert row["bulk_reduce"] and row["bulk_wait_read"] > row["bulk_reduce"], row
    assert unordered["stack"] == 0 and unordered["spill_stores"] == 0, unordered
    assert not (unordered["bulk_wait_all"] or unordered["acquire"] or unordered["release"])
    # The ordered form: a turn waited for (acquire), the additions' completion waited for,
    # then counted (release), each followed or preceded by a global proxy fence.
    assert ordered["acquire"] and ordered["bulk_wait_all"] and ordered["release"], ordered
    assert ordered["proxy_fence"] == unordered["proxy_fence"] + 2, (unordered, ordered)
    # Its spin loop leaves ptxas a few spills in the compute warps (13 stores, 40 bytes of
    # stack when this was written: docs/design/fa2.md, "The ordered form"); no more than that.
    assert ordered["stack"] <= 64, ordered
    # 128 queries a step: ptxas spills a few values the compute warps keep across the loop for
    # its end (12 stores, 32 bytes of stack before the causal mask became a branch, 13 and 40
    # after, one reload inside the loop: docs/design/fa2.md, "The Gluon single pass"); no
    # more than that.
    assert wide["stack"] <= 40, wide


def _launch_on_cpu_tensors(head_dim: int, **options) -> None:
    """`gluon_backward.launch` on small CPU tensors: for the checks it makes before a launch."""
    q, k, v, o, do = (torch.randn(1, 1, 8, head_dim) for _ in range(5))
    strides = tuple(head_strides(t) for t in (q, k, v, o, do, q))
    gluon_backward.launch(
        q, k, v, o, torch.randn(1, 1, 8), do, k.clone(), v.clone(), strides, scale=1.0,
        causal=True, **options,
    )  # fmt: skip


def test_a_query_tile_the_head_dim_does_not_take_is_refused():
    """128 queries a step only at head dim 64 (`BLOCK_MS`): refused before any launch."""
    with pytest.raises(ValueError, match="block_m=128 is not a query tile of head dim 128"):
        _launch_on_cpu_tensors(128, block_m=128)


def test_the_ordered_form_launched_lowest_first_is_refused():
    """Ordered dQ launched lowest key tile first can wait on a program never started: refused."""
    with pytest.raises(ValueError, match="deterministic=True needs highest_first"):
        _launch_on_cpu_tensors(64, deterministic=True, highest_first=False)


@pytest.mark.parametrize(
    ("text", "form"), [(None, "auto"), ("", "auto"), ("Gluon", "gluon"), ("triton", "triton")]
)
def test_the_setting_reads(monkeypatch, text, form):
    if text is None:
        monkeypatch.delenv("FA2_BACKWARD", raising=False)
    else:
        monkeypatch.setenv("FA2_BACKWARD", text)
        assert text in configs.tile_settings()  # a plan is built per setting
    assert configs.backward_form() == form


def test_a_setting_it_does_not_know_is_refused(monkeypatch):
    monkeypatch.setenv("FA2_BACKWARD", "gluon-bulk")
    with pytest.raises(ValueError, match="FA2_BACKWARD must be one of auto, triton, gluon"):
        configs.backward_form()


@pytest.mark.parametrize(
    ("head_dim", "seq_len", "taken"),
    [(128, 128, True), (128, 32768, True), (64, 4096, False), (64, 8192, True),
     (64, 16384, True), (32, 32768, False), (256, 32768, False)],
)  # fmt: skip
def test_auto_asks_for_it_where_it_measured_faster(monkeypatch, head_dim, seq_len, taken):
    monkeypatch.delenv("FA2_TILES", raising=False)
    assert configs.gluon_backward_default(head_dim, seq_len) is taken


@pytest.mark.parametrize(
    ("batch_heads", "seq", "head_dim", "group"),
    [(128, 2048, 128, 4), (16, 16384, 128, 1), (16, 16384, 64, 1), (6, 512, 64, 2),
     (1, 512, 64, 1), (64, 100, 128, 64)],
)  # fmt: skip
def test_the_launch_interleaves_as_many_heads_as_fit_its_bytes(batch_heads, seq, head_dim, group):
    """A power of two that divides batch x heads, their Q, dO, K and V (2 bytes an element)
    within GROUP_BYTES: 4 heads of 2 MiB at 2,048 tokens, one head of 8 or 16 MiB at 16k."""
    assert gluon_backward.interleaved_heads(batch_heads, seq, seq, head_dim, 2) == group
    per_head = 4 * seq * head_dim * 2
    assert group * per_head <= max(gluon_backward.GROUP_BYTES, per_head)


@pytest.mark.parametrize(
    ("batch_heads", "n_k", "group", "tail_heads"),
    [(64, 32768, 1, 1), (16, 16384, 1, 2), (32, 8192, 1, 4), (128, 2048, 4, 16),
     (6, 300, 3, 6), (2, 100, 1, 2)],
)  # fmt: skip
def test_the_reversed_tail_holds_about_256_key_tiles(batch_heads, n_k, group, tail_heads):
    """As many heads as hold REVERSED_KEY_TILES key tiles, in whole groups, at most all;
    none where not causal."""
    assert gluon_backward.reversed_groups(batch_heads, n_k, group) * group == tail_heads
    assert gluon_backward.reversed_groups(batch_heads, n_k, group, causal=False) == 0


@pytest.mark.parametrize(
    ("batch_heads", "key_tiles", "group", "reversed"),
    [(16, 9, 1, 2), (8, 5, 2, 1), (8, 5, 2, 4), (6, 4, 3, 0), (6, 4, 1, 6), (1, 1, 1, 1)],
)  # fmt: skip
def test_the_ordered_launch_waits_only_for_programs_launched_before(
    batch_heads, key_tiles, group, reversed
):
    """Ordered, a key tile waits for the higher ones of its head (the lower ones in the
    reversed tail), which must have been launched before it: waiting for one launched later can
    hang the GPU once the waiting programs fill it. Every (head, key tile) once, each head in
    one direction, and the tail's ranks interleaved so that the grid ends on its shortest
    programs (causal: the highest key tiles)."""
    order = gluon_backward.launch_order(
        batch_heads, key_tiles, group=group, reversed=reversed, highest_first=True
    )
    assert sorted((bh, n) for bh, n, _ in order) == [
        (bh, n) for bh in range(batch_heads) for n in range(key_tiles)
    ]
    launched = {}
    for position, (bh, n, descend) in enumerate(order):
        launched[bh, n] = position
        waits_for = range(n) if descend else range(n + 1, key_tiles)
        assert all((bh, m) in launched for m in waits_for), (bh, n, descend)
    tail = {bh for bh, _, descend in order if descend}
    assert len(tail) == reversed * group
    assert all(descend == (bh in tail) for bh, _, descend in order)
    if tail:
        assert [n for _, n, _ in order[-len(tail) :]] == [key_tiles - 1] * len(tail)


def _run_launch_model(*options: str) -> str:
    command = [
        sys.executable, str(SCREEN.parent / "launch_tail_model.py"), "--shapes", "1,4,2048,64",
        "--sms", "8", "--seeds", "3", *options,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_launch_model_finds_the_tail_evens_out_the_ordered_launch():
    """The list-scheduler model (`scripts/launch_tail_model.py`) on 8 multiprocessors: the
    ordered launch without its tail ends later than with it (every head of 4 in the tail: 16
    key tiles a head)."""
    cells = [line.strip("|").split("|") for line in _run_launch_model().splitlines()[2:]]
    rows = {order.strip(): (int(tail), float(end)) for _, order, tail, end in cells}
    assert rows["ordered, no tail"][1] > rows["ordered"][1] >= 1
    assert rows["ordered"][0] == 4 and rows["ordered, no tail"][0] == 0


def test_the_launch_model_writes_its_page(tmp_path):
    pytest.importorskip("matplotlib")  # bench's dependency; fa2 alone has no plots
    _run_launch_model("--out", str(tmp_path / "model"))
    rows = json.loads((tmp_path / "model.json").read_text())["rows"]
    assert {r["order"] for r in rows} == {
        "unordered",
        "ordered, no tail",
        "ordered",
        "ordered, tail x2",
    }
    assert (tmp_path / "model.md").exists() and (tmp_path / "model.png").exists()


def test_the_variants_script_times_every_variant_in_every_position():
    """`scripts/gluon_bwd_variants.py` times its rows in interleaved rounds, forwards then
    backwards, so that a drift over the run does not favour the rows timed last."""
    done = subprocess.run(
        [
            sys.executable, "-c",
            "import sys; sys.path.insert(0, sys.argv[1]); import gluon_bwd_variants as v; "
            "print(' '.join(v.serpentine(['a', 'b', 'c'], 3)))",
            str(SCREEN.parent),
        ],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.split() == ["a", "b", "c", "c", "b", "a", "a", "b", "c"]


def test_the_unordered_launch_starts_each_head_at_its_longest_key_tile():
    order = gluon_backward.launch_order(8, 3, group=2, reversed=2, highest_first=False)
    assert [n for _, n, _ in order[:4]] == [0, 0, 1, 1]
    assert not any(descend for *_, descend in order)


def test_auto_takes_128_queries_a_step_at_head_dim_64():
    assert configs.gluon_backward_block_m(64) == 128 and configs.gluon_backward_block_m(128) == 64
    for d, block_m in configs.GLUON_BACKWARD_BLOCK_M.items():
        assert block_m in gluon_backward.BLOCK_MS[d]


def test_auto_leaves_it_where_backward_tiles_are_forced(monkeypatch):
    monkeypatch.setenv("FA2_TILES", "forward=64x64/4w/2s")  # a forward tile: still asked for
    assert configs.gluon_backward_default(128, 4096)
    monkeypatch.setenv("FA2_TILES", "dq=64x64/4w/2s")
    assert not configs.gluon_backward_default(128, 4096)


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


@pytest.mark.parametrize("form", [None, "gluon"])
def test_both_orders_take_it_where_it_can_run(monkeypatch, form):
    """Unset (auto) at head dim 128, or forced: deterministic or not, the plan takes the
    kernel (in the call's order) and warns of nothing; FA2_BACKWARD=triton keeps the Triton
    kernels."""
    if form is None:
        monkeypatch.delenv("FA2_BACKWARD", raising=False)
    else:
        monkeypatch.setenv("FA2_BACKWARD", form)
    monkeypatch.setattr(
        gluon_backward, "unsupported_reason", lambda *tensors, pointers, strides: None
    )
    # a length of its own: plans are cached by shape, and another test's may refuse the kernel
    q, k, v, do = (torch.randn(1, 1, 23, 128) for _ in range(4))
    o, lse, plan = run_forward(q, k, v, True)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="FA2_BACKWARD")
        for deterministic in (True, False):
            bwd = backward_plan(plan, q, k, v, o, lse, do, deterministic)
            assert bwd.gluon and bwd.deterministic is deterministic
    monkeypatch.setenv("FA2_BACKWARD", "triton")
    o, lse, plan = run_forward(q, k, v, True)  # (the setting is part of the plan's key)
    assert not backward_plan(plan, q, k, v, o, lse, do, True).gluon


def test_unset_it_falls_back_silently_where_it_cannot_run(monkeypatch):
    monkeypatch.delenv("FA2_BACKWARD", raising=False)
    monkeypatch.setattr("fa2.triton.backward._gluon_warned", set())
    device = "cuda" if torch.cuda.is_available() else "cpu"
    q, k, v, do = (torch.randn(1, 1, 21, 128, device=device) for _ in range(4))  # fp32
    o, lse, plan = run_forward(q, k, v, True)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="FA2_BACKWARD")
        assert not backward_plan(plan, q, k, v, o, lse, do, True).gluon


def _float64_launch(calls: list):
    """A stand-in for `gluon_backward.launch`: the gradients in float64 by their formulas (no
    autograd, which does not record inside a custom op), dk and dv written, dq returned in
    fp32; it checks the strides and the query tile it is handed (the head dim's default,
    `configs.gluon_backward_block_m`) and records (causal, deterministic)."""

    def launch(q, k, v, o, lse, do, dk, dv, strides, *, scale, causal, deterministic, block_m):
        assert list(strides) == [head_strides(t) for t in (q, k, v, o, do, dk)]
        assert block_m == configs.gluon_backward_block_m(q.shape[-1])
        q64, k64, v64, do64 = (t.double() for t in (q, k, v, do))
        s = q64 @ k64.transpose(-1, -2) * scale
        if causal:  # top-left: query i sees keys j <= i
            n_q, n_k = s.shape[-2:]
            s = s.masked_fill(torch.ones(n_q, n_k, dtype=torch.bool).triu(1), float("-inf"))
        p = torch.softmax(s, dim=-1)
        dp = do64 @ v64.transpose(-1, -2)
        ds = p * (dp - (dp * p).sum(-1, keepdim=True))
        dk.copy_(ds.transpose(-1, -2) @ q64 * scale)
        dv.copy_(p.transpose(-1, -2) @ do64)
        calls.append((causal, deterministic))
        return (ds @ k64 * scale).float()

    return launch


@pytest.mark.parametrize(
    "layout, deterministic, expanded", [("bhsd", True, False), ("bshd", False, False),
                                        ("bshd", True, True)]
)  # fmt: skip
def test_the_plan_hands_the_kernel_its_views_and_assembles_the_gradients(
    monkeypatch, layout, deterministic, expanded
):
    """The host side, without the kernel: where the plan takes the Gluon path it hands
    `gluon_backward.launch` (here a float64 stand-in) the (..., heads, n, d) views with their
    strides and the order the call asks for, and returns dq cast into q's layout and the dk,
    dv it wrote, in the caller's. An expanded output gradient (what `out.sum()` gives, every
    stride 0) reaches the kernel as a contiguous copy."""
    monkeypatch.setenv("FA2_BACKWARD", "gluon")
    monkeypatch.setattr(
        gluon_backward, "unsupported_reason", lambda *tensors, pointers, strides: None
    )
    calls = []
    monkeypatch.setattr(gluon_backward, "launch", _float64_launch(calls))
    shape = (2, 3, 19, 16) if layout == "bhsd" else (2, 19, 3, 16)
    q, k, v = (torch.randn(shape).requires_grad_() for _ in range(3))
    do = torch.randn(()).expand(shape) if expanded else torch.randn(shape)
    o = FlashAttention2Triton.apply(
        q, k, v, True, None, False, None, deterministic, (-1, -1), 0.0, layout
    )
    ours = grads(o, (q, k, v), do)
    assert calls == [(True, deterministic)]
    to_bhsd = (lambda t: t) if layout == "bhsd" else (lambda t: t.transpose(1, 2))
    oracle, plain = _oracle_and_plain(*(to_bhsd(t) for t in (q, k, v, do)), causal=True)
    oracle, plain = ([to_bhsd(t) for t in ts] for ts in (oracle, plain))
    assert_within_twice_plain(ours, oracle, plain, torch.float32)


def test_the_backward_op_hands_a_gluon_plan_to_its_opaque_op(monkeypatch):
    """The path torch.compile's graphs take, on the CPU (the ops opaque, the kernel a float64
    stand-in): under a TorchDispatchMode fa2 runs through its ops, and `fa2::triton_backward`,
    whose plan takes the Gluon backward, hands the call to `fa2::gluon_backward`, which runs
    it from an eager plan cached under its own name; the gradients match the oracle's."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from fa2.triton import forward

    class Ops(TorchDispatchMode):  # records the ops the autograd Function dispatches
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(str(func))
            return func(*args, **(kwargs or {}))

    monkeypatch.setenv("FA2_BACKWARD", "gluon")
    monkeypatch.setattr(
        gluon_backward, "unsupported_reason", lambda *tensors, pointers, strides: None
    )
    calls = []
    monkeypatch.setattr(gluon_backward, "launch", _float64_launch(calls))
    q, k, v = (torch.randn(1, 2, 29, 16).requires_grad_() for _ in range(3))
    do = torch.randn(1, 2, 29, 16)
    with Ops() as mode:
        o = FlashAttention2Triton.apply(q, k, v, True)
        ours = grads(o, (q, k, v), do)
    assert "fa2.triton_backward.default" in mode.names and calls == [(True, True)]
    assert any("fa2::gluon_backward" in key[-2] for key in forward._plans.cache)
    assert_within_twice_plain(ours, *_oracle_and_plain(q, k, v, do, True), torch.float32)


def _oracle_and_plain(q, k, v, do, causal):
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    o64 = attention_reference(q64, k64, v64, causal=causal)[0]
    oracle = grads(o64, (q64, k64, v64), do.double())
    qp, kp, vp = (t.detach().clone().requires_grad_() for t in (q, k, v))
    plain = grads(attention_reference(qp, kp, vp, causal=causal)[0], (qp, kp, vp), do)
    return oracle, plain


# (head dim, queries a step): every query tile each head dim takes (`BLOCK_MS`)
QUERY_TILES = [(d, m) for d in gluon_backward.HEAD_DIMS for m in gluon_backward.BLOCK_MS[d]]
QUERY_TILE_IDS = [f"d{d}-block_m{m}" for d, m in QUERY_TILES]


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="needs an sm_90 GPU (H100, H200)")
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("d", "block_m"), QUERY_TILES, ids=QUERY_TILE_IDS)
@pytest.mark.parametrize(
    "n_q, n_k", [(1, 1), (64, 64), (200, 200), (130, 77), (77, 300), (384, 384)], ids=str
)
def test_matches_the_oracle_through_the_autograd_function(
    monkeypatch, deterministic, causal, d, block_m, n_q, n_k
):
    """FA2_BACKWARD=gluon in both orders (the ragged last query tile clipped by the
    descriptor), at each query tile the head dim takes (the plan's launch given `block_m`):
    the Gluon kernel runs (no fallback warning) and o, dq, dk, dv stay within twice plain
    PyTorch's bf16 error of float64's."""
    monkeypatch.setenv("FA2_BACKWARD", "gluon")
    launch = functools.partial(gluon_backward.launch, block_m=block_m)
    monkeypatch.setattr(gluon_backward, "launch", launch)
    make = lambda n: torch.randn(2, 3, n, d, device="cuda", dtype=torch.bfloat16)  # noqa: E731
    q, k, v = (t.requires_grad_() for t in (make(n_q), make(n_k), make(n_k)))
    do = torch.randn_like(q)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="FA2_BACKWARD")  # a fallback would warn
        o = FlashAttention2Triton.apply(q, k, v, causal, None, False, None, deterministic)
        ours = grads(o, (q, k, v), do)
    assert_within_twice_plain(ours, *_oracle_and_plain(q, k, v, do, causal), torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="needs an sm_90 GPU (H100, H200)")
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("d", [64, 128])
def test_matches_the_oracle_called_directly_in_fp16_on_strided_inputs(d, deterministic):
    """`gluon_backward` on (batch, heads, n, d) views of (batch, n, heads, d) tensors (the
    strides flash-attn's layout gives), fp16, a ragged length, with the forward's lse, in
    both orders."""
    n = 333
    shape = (2, n, 4, d)
    make = lambda: torch.randn(shape, device="cuda", dtype=torch.float16).transpose(1, 2)  # noqa: E731
    q, k, v, do = make(), make(), make(), make()
    o, lse = FlashAttention2Triton.apply(q, k, v, True, None, True)
    dq, dk, dv = gluon_backward.gluon_backward(
        q, k, v, o, lse, do, scale=d**-0.5, causal=True, deterministic=deterministic
    )
    ours = [o, dq, dk, dv]
    assert_within_twice_plain(ours, *_oracle_and_plain(q, k, v, do, True), torch.float16)


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="needs an sm_90 GPU (H100, H200)")
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("d", "block_m"), QUERY_TILES, ids=QUERY_TILE_IDS)
@pytest.mark.parametrize(
    "n_q, n_k", [(1, 1), (200, 200), (130, 77), (77, 300), (1000, 1000)], ids=str
)
@pytest.mark.parametrize("dq_slots", [1, 2])
def test_the_ordered_form_matches_the_oracle_and_repeats_its_bits(
    causal, d, block_m, n_q, n_k, dq_slots
):
    """`deterministic=True`: the key tiles add into each dQ tile one at a time in a fixed order
    (semaphores), so two calls give the same bits, within the oracle's tolerance; 1000 rows
    are 8 key tiles and 16 query tiles of 64 (8 of 128), so each dQ tile takes several ordered
    additions. With one dQ partial buffer (the default) and two (`dq_slots=2`), at each query
    tile the head dim takes (`block_m`). The bits are the same in every launch order
    (`group_heads`: the default's, one head at a time, 3 or all 6 heads' key tiles
    interleaved; no reversed tail, whose heads add in the other order): the semaphores, not
    the launch, fix the order of the additions."""
    make = lambda n: torch.randn(2, 3, n, d, device="cuda", dtype=torch.bfloat16)  # noqa: E731
    q, k, v = make(n_q), make(n_k), make(n_k)
    do = torch.randn_like(q)
    o, lse = FlashAttention2Triton.apply(q, k, v, causal, None, True)

    def call(group_heads=None):
        dk, dv = torch.empty_like(k), torch.empty_like(v)
        strides = tuple(tuple(t.stride()[:3]) for t in (q, k, v, o, do, dk))
        dq = gluon_backward.launch(
            q, k, v, o, lse, do, dk, dv, strides, scale=d**-0.5, causal=causal,
            deterministic=True, dq_slots=dq_slots, block_m=block_m, group_heads=group_heads,
            reversed_heads=0,
        )  # fmt: skip
        return dq.to(q.dtype), dk, dv

    first = call()
    for again in (call(), call(group_heads=1), call(group_heads=3), call(group_heads=6)):
        for a, b in zip(first, again, strict=True):
            assert torch.equal(a, b)
    assert_within_twice_plain([o, *first], *_oracle_and_plain(q, k, v, do, causal), torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="needs an sm_90 GPU (H100, H200)")
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_q, n_k", [(130, 77), (77, 300), (1000, 1000)], ids=str)
@pytest.mark.parametrize(("reversed_heads", "group_heads"), [(2, 1), (6, 1), (4, 2)], ids=str)
@pytest.mark.parametrize(("d", "block_m"), QUERY_TILES, ids=QUERY_TILE_IDS)
def test_the_reversed_tail_matches_the_oracle_and_repeats_its_bits(
    causal, n_q, n_k, reversed_heads, group_heads, d, block_m
):
    """`reversed_heads`: the launch's last heads take their key tiles lowest first, ranks of
    every tail head interleaved, and visit their query tiles from the last down, their dQ
    additions ordered from the bottom up; two of the six heads, all six, or two groups of two.
    Within the oracle's tolerance, and the same bits twice."""
    make = lambda n: torch.randn(2, 3, n, d, device="cuda", dtype=torch.bfloat16)  # noqa: E731
    q, k, v = make(n_q), make(n_k), make(n_k)
    do = torch.randn_like(q)
    o, lse = FlashAttention2Triton.apply(q, k, v, causal, None, True)

    def call():
        dk, dv = torch.empty_like(k), torch.empty_like(v)
        strides = tuple(tuple(t.stride()[:3]) for t in (q, k, v, o, do, dk))
        dq = gluon_backward.launch(
            q, k, v, o, lse, do, dk, dv, strides, scale=d**-0.5, causal=causal,
            deterministic=True, group_heads=group_heads, reversed_heads=reversed_heads,
            block_m=block_m,
        )  # fmt: skip
        return dq.to(q.dtype), dk, dv

    first = call()
    for a, b in zip(first, call(), strict=True):
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


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="needs an sm_90 GPU (H100, H200)")
@pytest.mark.parametrize(
    ("d", "n", "gluon"), [(128, 300, True), (64, 4096, False), (64, 8192, True)]
)
def test_it_is_the_default_where_it_measured_faster(monkeypatch, d, n, gluon):
    monkeypatch.delenv("FA2_BACKWARD", raising=False)
    monkeypatch.delenv("FA2_TILES", raising=False)
    q, k, v, do = (torch.randn(1, 2, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    o, lse, plan = run_forward(q, k, v, True)
    assert backward_plan(plan, q, k, v, o, lse, do, True).gluon is gluon


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="needs an sm_90 GPU (H100, H200)")
def test_the_head_dim_64_default_matches_the_oracle(monkeypatch):
    # from 8,192 tokens at d = 64 the default is the ordered pass at 128 queries a step
    monkeypatch.delenv("FA2_BACKWARD", raising=False)
    monkeypatch.delenv("FA2_TILES", raising=False)
    q, k, v, do = (
        torch.randn(1, 2, 8192, 64, device="cuda", dtype=torch.bfloat16) for _ in range(4)
    )
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    ours = grads(FlashAttention2Triton.apply(q, k, v, True), (q, k, v), do)
    oracle, plain = _oracle_and_plain(q, k, v, do, causal=True)
    assert_within_twice_plain(ours, oracle, plain, torch.bfloat16)
    again = grads(FlashAttention2Triton.apply(q, k, v, True), (q, k, v), do)
    assert all(torch.equal(a, b) for a, b in zip(again, ours, strict=True))


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="needs an sm_90 GPU (H100, H200)")
def test_compiled_it_runs_as_its_opaque_op_with_the_eager_bits(monkeypatch):
    """torch.compile of a deterministic call at head dim 128 (the default's case): the compiled
    code calls `fa2::gluon_backward`, and its gradients have the eager call's bits."""
    from compiled_checks import eager_and_compiled

    from fa2 import flash_attention

    monkeypatch.delenv("FA2_BACKWARD", raising=False)
    q, k, v = (
        torch.randn(2, 4, 700, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3)
    )

    def attend(q, k, v):
        return flash_attention(q, k, v, causal=True)

    eager, compiled, codes = eager_and_compiled(attend, (q, k, v), torch.randn_like(q))
    assert any("fa2.gluon_backward" in code for code in codes)
    for got, want in zip(compiled, eager, strict=True):
        assert torch.equal(got, want)
