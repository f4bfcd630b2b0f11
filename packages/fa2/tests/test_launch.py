"""The Triton path's launch plans: layouts read in place or copied, plans reused across calls,
misaligned tensors, tiles read through TMA descriptors, and (on a GPU) the cached-binary launch
agreeing with Triton's own."""

import sys

import pytest
import torch

from fa2 import FlashAttention2Triton, attention_reference, varlen_attention_reference
from fa2.api import attend
from fa2.triton import launch
from fa2.triton.launch import head_strides

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _oracle_grads(q, k, v, causal, do):
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    o, _ = attention_reference(q64, k64, v64, causal=causal)
    return (o, *torch.autograd.grad(o, (q64, k64, v64), do.double()))


def _assert_matches_oracle(q, k, v, causal, do=None, tol=1e-5):
    do = torch.randn_like(q) if do is None else do
    o = FlashAttention2Triton.apply(q, k, v, causal)
    ours = (o, *torch.autograd.grad(o, (q, k, v), do))
    oracle = _oracle_grads(q, k, v, causal, do)
    for name, x, ref in zip(("o", "dq", "dk", "dv"), ours, oracle, strict=True):
        err = ((x.double() - ref).norm() / ref.norm()).item()
        assert err < tol, f"{name}: relative error {err:.2e}"


def test_head_strides_reads_mergeable_layouts_in_place():
    assert head_strides(torch.randn(4, 3, 10, 8)) == (240, 80, 8)
    assert head_strides(torch.randn(6, 10, 8)[::2]) == (0, 160, 8)  # every other head
    assert head_strides(torch.randn(6, 10, 16)[:, :, :8]) == (0, 160, 16)  # padded rows
    assert head_strides(torch.randn(10, 8)) == (0, 0, 8)
    assert head_strides(torch.randn(1, 8).expand(10, 8)) == (0, 0, 0)  # one row, broadcast
    # (batch, seq, heads, d) transposed to (batch, heads, seq, d), as in every Transformer
    assert head_strides(torch.randn(2, 10, 3, 8).transpose(1, 2)) == (240, 8, 24)
    assert head_strides(torch.randn(4, 2, 5, 10, 8)) == (400, 80, 8)  # two batch dims merged


def test_head_strides_refuses_layouts_the_kernels_cannot_index():
    assert head_strides(torch.randn(2, 8, 10).transpose(1, 2)) is None  # d not contiguous
    assert head_strides(torch.randn(3, 4, 2, 10, 8).transpose(0, 1)) is None  # batch unmergeable
    assert head_strides(torch.randn(4, 2, 5, 10, 8)[::2]) is None


def test_head_strides_works_on_fake_tensors():
    # torch.compile plans its launches on fake tensors, where an impossible `view` raises
    # ValueError rather than RuntimeError: the layout must be read from the strides alone.
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(4, 256, 12, 64).transpose(1, 2)  # strides (196608, 64, 768, 1)
        assert head_strides(q) == (196608, 64, 768)
        assert head_strides(torch.empty(3, 4, 2, 10, 8).transpose(0, 1)) is None


def _leaf(t):
    return t.detach().requires_grad_()


@pytest.mark.parametrize("causal", [False, True])
def test_strided_views_along_batch_and_rows(causal):
    # Every other batch entry, and rows padded to 2x the head dim: both read in place.
    q = _leaf(torch.randn(4, 40, 32, device=DEVICE)[::2, :, :16])
    k, v = (_leaf(torch.randn(4, 33, 16, device=DEVICE)[1::2]) for _ in range(2))
    assert head_strides(q) == (0, 2 * 40 * 32, 32)
    _assert_matches_oracle(q, k, v, causal)


def test_gradient_of_sum_arrives_expanded_and_still_works():
    q, k, v = (_leaf(torch.randn(2, 37, 16, device=DEVICE)) for _ in range(3))
    FlashAttention2Triton.apply(q, k, v, True).sum().backward()
    _, dq, dk, dv = _oracle_grads(q, k, v, True, torch.ones(2, 37, 16, device=DEVICE))
    for x, ref in ((q.grad, dq), (k.grad, dk), (v.grad, dv)):
        assert ((x.double().cpu() - ref.cpu()).norm() / ref.norm()).item() < 1e-5


@pytest.mark.parametrize("copied", ["expanded-do", "strided-q"])
def test_packed_sequences_read_through_a_copy(copied):
    # A layout the kernels cannot index is copied; the copy of a packed tensor has no batch
    # dim, so sequence b must start at its offset, not b whole copies further on. `.sum()`'s
    # gradient arrives expanded (all strides 0); features every other element are strided.
    cu = torch.tensor([0, 5, 6, 26], dtype=torch.int32, device=DEVICE)
    q = torch.randn(26, 2, 32, device=DEVICE)
    q = _leaf(q[..., ::2] if copied == "strided-q" else q[..., :16].contiguous())
    k, v = (_leaf(torch.randn(26, 2, 16, device=DEVICE)) for _ in range(2))
    o = attend(
        q, k, v, implementation="triton", layout="thd", cu_seqlens_q=cu, cu_seqlens_k=cu,
        max_seqlen_q=20, max_seqlen_k=20, causal=True, bottom_right=True, scale=None,
        window_size=(-1, -1), softcap=0.0,
    )  # fmt: skip
    do = torch.ones(1, device=DEVICE).expand_as(o) if copied == "expanded-do" else None
    do = torch.randn_like(o) if do is None else do
    ours = (o, *torch.autograd.grad(o, (q, k, v), do))
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref, _ = varlen_attention_reference(
        q64, k64, v64, cu.cpu(), cu.cpu(), causal=True, bottom_right=True
    )
    oracle = (ref, *torch.autograd.grad(ref, (q64, k64, v64), do.double().cpu()))
    for name, x, expected in zip(("o", "dq", "dk", "dv"), ours, oracle, strict=True):
        err = ((x.double().cpu() - expected).norm() / expected.norm()).item()
        assert err < 1e-5, f"{name}: relative error {err:.2e}"


def test_packed_self_attention_through_a_front_door_takes_the_equal_lengths_kernels():
    # One offsets tensor for both sides: `attend` hands k's on as a view of q's (for Dynamo),
    # which is still the same memory, so each sequence has as many queries as keys and the
    # kernels need no per-sequence diagonal offset (BOTTOM_RIGHT off).
    from fa2.triton import forward

    cu = torch.tensor([0, 3, 10], dtype=torch.int32, device=DEVICE)
    q, k, v = (_leaf(torch.randn(10, 1, 16, device=DEVICE)) for _ in range(3))
    o = attend(
        q, k, v, implementation="triton", layout="thd", cu_seqlens_q=cu, cu_seqlens_k=cu,
        max_seqlen_q=7, max_seqlen_k=7, causal=True, bottom_right=True, scale=None,
        window_size=(-1, -1), softcap=0.0,
    )  # fmt: skip
    plan = next(p for key, p in forward._plans.cache.items() if key[0] == q.shape)
    assert not plan.meta["BOTTOM_RIGHT"]
    ref, _ = varlen_attention_reference(
        *(t.detach().double() for t in (q, k, v)), cu.cpu(), cu.cpu(), causal=True
    )
    torch.testing.assert_close(o.double().cpu(), ref, atol=1e-5, rtol=0)


def test_plans_are_reused_for_new_data_of_the_same_shape():
    from fa2.triton import forward

    for _ in range(2):  # the second call runs the plans the first one built
        q, k, v = (_leaf(torch.randn(3, 29, 16, device=DEVICE)) for _ in range(3))
        _assert_matches_oracle(q, k, v, causal=False)
    shape_plans = [p for key, p in forward._plans.cache.items() if key[0] == (3, 29, 16)]
    assert len(shape_plans) == 1
    assert len(shape_plans[0].backward_plans) == 1


def _python_calls(fn) -> int:
    """Python function calls `fn()` makes (C functions not counted)."""
    calls = 0

    def count(frame, event, arg):
        nonlocal calls
        calls += event == "call"

    sys.setprofile(count)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls


def test_apply_takes_the_front_doors_cached_path(monkeypatch):
    """`FlashAttention2Triton.apply`, as the course's adapters and the 2025 leaderboard harness
    call it, is the path the front doors end in: once a call's plans exist, a like call
    validates nothing, builds no plan, and runs no more Python than `flash_attention`."""
    from fa2 import flash_attention
    from fa2.triton import forward, function

    monkeypatch.setattr(launch.CachedLaunch, "__call__", lambda self, *args: None)  # host only
    q, k, v = (_leaf(torch.randn(2, 3, 40, 16, device=DEVICE)) for _ in range(3))
    do = torch.randn_like(q)
    apply = lambda: torch.autograd.grad(FlashAttention2Triton.apply(q, k, v, True), (q, k, v), do)  # noqa: E731
    front = lambda: torch.autograd.grad(  # noqa: E731
        flash_attention(q, k, v, causal=True, implementation="triton"), (q, k, v), do
    )
    apply(), front()  # build the plans (both doors share them)
    plans = dict(forward._plans.cache)
    monkeypatch.setattr(function, "_check", lambda *a, **k: pytest.fail("validated again"))
    apply_calls, front_calls = _python_calls(apply), _python_calls(front)
    assert forward._plans.cache == plans  # no plan built, none replaced
    assert apply_calls <= front_calls, (apply_calls, front_calls)


def test_inputs_not_aligned_to_16_bytes():
    def misaligned(*shape):
        flat = torch.randn(torch.Size(shape).numel() + 1, device=DEVICE)
        return _leaf(flat[1:].view(shape))  # 4 bytes past an aligned address

    q, k, v = misaligned(2, 30, 16), misaligned(2, 30, 16), misaligned(2, 30, 16)
    assert q.data_ptr() % 16
    _assert_matches_oracle(q, k, v, causal=True)


@pytest.mark.gpu
def test_cached_binary_launch_matches_tritons_own_launch():
    from fa2.triton import forward

    q, k, v = (torch.randn(2, 4, 300, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    first = FlashAttention2Triton.apply(q, k, v, True)  # through Triton: compiles, keeps binary
    plan = next(p for key, p in forward._plans.cache.items() if key[0] == q.shape)
    assert plan.launch._binary is not None
    plan.launch.kernel = None  # the next call must not go through Triton's launch path
    again = FlashAttention2Triton.apply(q, k, v, True)  # straight to the binary
    torch.testing.assert_close(again, first, rtol=0, atol=0)
    _assert_matches_oracle(*(_leaf(t.float()) for t in (q, k, v)), causal=True)


def test_row_offsets_switch_to_int64_where_they_could_overflow(monkeypatch):
    # The kernels' int64 row offsets, exercised at a small size by lowering the threshold.
    from fa2.triton import forward

    monkeypatch.setattr(launch, "INT32_MAX", 100)
    q, k, v = (_leaf(torch.randn(2, 43, 16, device=DEVICE)) for _ in range(3))
    _assert_matches_oracle(q, k, v, causal=True)
    plan = next(p for key, p in forward._plans.cache.items() if key[0] == (2, 43, 16))
    assert plan.meta["LARGE"]


@pytest.mark.gpu
@pytest.mark.parametrize("long", ["keys", "queries"])
def test_rows_past_int32_offsets_read_in_place(long):
    # Packed QKV of 175,000 tokens with 3 x 4096 features: (n - 1) * row stride > 2**31.
    packed = torch.randn(175_000, 3 * 4096, device="cuda", dtype=torch.bfloat16)
    assert (packed.shape[0] - 1) * packed.stride(0) > 2**31
    few = slice(packed.shape[0] - 128, None)  # the last 128 tokens
    q_rows, kv_rows = (few, slice(None)) if long == "keys" else (slice(None), few)
    q = _leaf(packed[q_rows, 0:64])
    k, v = _leaf(packed[kv_rows, 4096:4160]), _leaf(packed[kv_rows, 8192:8256])
    assert k.stride(0) == 3 * 4096
    _assert_matches_oracle(q, k, v, causal=False, tol=1e-2)


def test_grouped_heads_in_transposed_layouts_are_read_in_place():
    # (batch, seq, heads, d) projections viewed as (batch, heads, seq, d); 4 query heads
    # share 2 key/value heads. Nothing is copied, forward or backward.
    from fa2.triton import forward

    def heads(n):
        return _leaf(torch.randn(2, 31, n, 16, device=DEVICE).transpose(1, 2))

    q, k, v = heads(4), heads(2), heads(2)
    o = FlashAttention2Triton.apply(q, k, v, True)
    do = torch.randn_like(o)
    o.backward(do)
    fwd = next(p for key, p in forward._plans.cache.items() if key[0] == q.shape)
    (bwd,) = fwd.backward_plans.values()
    assert fwd.copies is None and bwd.copies is None
    k2, v2 = (t.detach().repeat_interleave(2, 1) for t in (k, v))
    ref_o, dq, dk, dv = _oracle_grads(q, k2, v2, True, do)
    shared = lambda g: g.unflatten(1, (2, 2)).sum(2)  # noqa: E731  sum over sharing heads
    for x, ref in ((o, ref_o), (q.grad, dq), (k.grad, shared(dk)), (v.grad, shared(dv))):
        assert ((x.double() - ref).norm() / ref.norm()).item() < 1e-5


def test_fast_launch_path_is_left_only_while_a_profiler_hooks_launches():
    # Triton 3.6 keeps its launch hooks as chains that are empty, not None, when unset.
    from triton import knobs

    assert not launch._hooked()
    hook = lambda *args: None  # noqa: E731
    chain = knobs.runtime.launch_enter_hook
    if hasattr(chain, "add"):
        chain.add(hook)
        try:
            assert launch._hooked()
        finally:
            chain.remove(hook)
    else:  # an older Triton: a single hook or None
        knobs.runtime.launch_enter_hook = hook
        try:
            assert launch._hooked()
        finally:
            knobs.runtime.launch_enter_hook = None
    assert not launch._hooked()


@pytest.fixture
def tma_tiles(monkeypatch):
    """Every kernel takes a tile that reads through TMA descriptors (on the CPU, Triton's
    interpreter runs the descriptors too)."""
    from fa2.triton import backward, forward

    monkeypatch.setattr(launch, "tma_capable", lambda device: True)
    for module in (forward, backward):
        chosen = module.choose_tile
        monkeypatch.setattr(
            module, "choose_tile", lambda table, _c=chosen, **kw: _c(table, **kw)._replace(tma=True)
        )
    forward._plans.cache.clear()  # the backward plans hang on the forward plans
    yield
    forward._plans.cache.clear()


@pytest.mark.parametrize("deterministic", [True, False])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [16, 24])
def test_tiles_read_through_tma_descriptors(tma_tiles, d, causal, deterministic):
    # Ragged rows and (d = 24) padded columns, which the copy unit fills with 0; grouped heads
    # in the transposed (batch, seq, heads, d) layout; deterministic=False: the single pass.
    from fa2.triton import forward

    q = _leaf(torch.randn(2, 45, 4, d, device=DEVICE).transpose(1, 2))
    k, v = (_leaf(torch.randn(2, 38, 2, d, device=DEVICE).transpose(1, 2)) for _ in range(2))
    o = FlashAttention2Triton.apply(q, k, v, causal, None, False, None, deterministic)
    do = torch.randn_like(o)
    grads = torch.autograd.grad(o, (q, k, v), do)
    (fwd,) = forward._plans.cache.values()
    (bwd,) = fwd.backward_plans.values()
    assert fwd.launch.options["TMA"]
    assert all(launch.options.get("TMA", True) for launch in bwd.launches.values())
    k2, v2 = (t.detach().repeat_interleave(2, 1) for t in (k, v))
    ref_o, dq, dk, dv = _oracle_grads(q, k2, v2, causal, do)
    shared = lambda g: g.unflatten(1, (2, 2)).sum(2)  # noqa: E731  sum over sharing heads
    for x, ref in zip((o, *grads), (ref_o, dq, shared(dk), shared(dv)), strict=True):
        assert ((x.double() - ref).norm() / ref.norm()).item() < 1e-5


def test_tma_tiles_take_plain_loads_for_misaligned_tensors(tma_tiles):
    from fa2.triton import forward

    flat = torch.randn(3 * 2 * 30 * 16 + 4, device=DEVICE)
    q, k, v = (_leaf(flat[1 + i * 960 : 1 + (i + 1) * 960].view(2, 30, 16)) for i in range(3))
    assert q.data_ptr() % 16
    _assert_matches_oracle(q, k, v, causal=True)  # builds the plans
    plan = next(p for key, p in forward._plans.cache.items() if key[0] == q.shape)
    plain = plan.launch.unaligned
    assert plan.launch.options["TMA"] and not plain.options["TMA"]
    calls = []
    plan.launch.unaligned = lambda *args: (calls.append(1), plain(*args))
    _assert_matches_oracle(q, k, v, causal=True)
    assert calls == [1]


def _default_tile(table, head_dim_block, dtype, seq_len):
    """The tile `configs.choose_tile` launches with by default (no autotuning run)."""
    from fa2.triton import configs

    return configs.choose_tile(
        table, head_dim_block=head_dim_block, dtype=dtype, precision="tf32x3",
        seq_len=seq_len, key=lambda: (), run=None,
    )  # fmt: skip


def test_short_sequences_take_the_short_tiles_and_symbolic_lengths_add_no_guard(monkeypatch):
    # A table may hold a `_short` list for sequences of at most SHORT_SEQ tokens. Traced with
    # dynamic shapes, a length that could pass it keeps the general list without guarding on
    # it (which would specialise the compiled graph).
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import (
        DimDynamic,
        ShapeEnv,
        StatelessSymbolicContext,
    )

    from fa2.triton import configs

    monkeypatch.setattr(configs, "_families", lambda *args: ["family"])
    general, short = configs.Tile(64, 32, 4, 2), configs.Tile(32, 16, 4, 2)
    table = {"family": [general], "family_short": [short]}

    def choose(seq_len):
        return _default_tile(table, 64, torch.bfloat16, seq_len)

    assert choose(configs.SHORT_SEQ) == short and choose(configs.SHORT_SEQ + 1) == general
    assert _default_tile({"family": [general]}, 64, torch.bfloat16, 16) == general  # no short list
    shape_env = ShapeEnv()
    context = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.STATIC])
    fake = FakeTensorMode(shape_env=shape_env).from_tensor(
        torch.randn(100, 8), symbolic_context=context
    )
    n = fake.shape[0]
    assert not isinstance(n, int)
    assert choose(torch.sym_max(n, n + 1)) == general
    assert not shape_env.guards


def test_tiles_are_looked_up_by_head_dim_width_and_length(monkeypatch):
    # As on a GPU (not the interpreter's single tile): head dims up to 32 take a "_d32" list
    # where a table has one and share the d=64 list otherwise; short sequences at d=128 take
    # the forward's "_short" list.
    from fa2.triton import configs
    from fa2.triton.configs import DKDV, DQ, FORWARD

    monkeypatch.setattr(configs, "INTERPRET", False)

    def chosen(table, d, dtype=torch.float32, seq_len=8192):
        return _default_tile(table, configs.block_d(d), dtype, seq_len)

    assert chosen(DKDV, 16) == chosen(DKDV, 32) == DKDV["tf32_d32"][0]
    assert chosen(DKDV, 64) == DKDV["tf32_d64"][0] != DKDV["tf32_d32"][0]
    assert chosen(DQ, 32) == DQ["tf32_d64"][0]
    assert chosen(FORWARD, 128, torch.bfloat16) == FORWARD["16bit_d128"][0]
    short = chosen(FORWARD, 128, torch.bfloat16, seq_len=2048)
    assert short == FORWARD["16bit_d128_short"][0] != FORWARD["16bit_d128"][0]


def test_tma_needs_every_stride_in_whole_16_bytes(monkeypatch):
    from fa2.triton.launch import read_layouts, tma_layouts

    cpu = torch.randn(2, 8, 16)
    assert not tma_layouts((cpu,), [(128, 16, 1)], traced=False)  # no copy unit on a CPU
    monkeypatch.setattr(launch, "tma_capable", lambda device: True)
    for d, ok in ((8, True), (6, False), (12, False)):
        t = torch.randn(2, 3, 10, d, dtype=torch.bfloat16)
        assert tma_layouts((t,), read_layouts((t,))[1], traced=False) == ok, d
    every_other_row = torch.randn(2, 3, 20, 8, dtype=torch.bfloat16)[:, :, ::2]
    assert tma_layouts((every_other_row,), read_layouts((every_other_row,))[1], traced=False)
    # The gradient of o.sum(): one row repeated (row stride 0), left to plain loads.
    repeated = torch.ones(1, 1, 1, 8, dtype=torch.bfloat16).expand(2, 3, 10, 8)
    assert not tma_layouts((repeated,), read_layouts((repeated,))[1], traced=False)


def test_traced_tensors_take_tma_only_where_inductor_keeps_them_aligned(monkeypatch):
    # A compiled graph launches without checking pointers, so a traced (fake) tensor counts as
    # aligned only when its storage offset is whole 16 bytes and Inductor, which copies
    # misaligned inputs when the graph runs, is the compiler.
    from torch._inductor.virtualized import V
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import (
        DimDynamic,
        ShapeEnv,
        StatelessSymbolicContext,
    )

    from fa2.triton.launch import aligned_when_run, read_layouts, tma_layouts

    monkeypatch.setattr(launch, "tma_capable", lambda device: True)
    flat = torch.randn(1 + 8 + 2 * 3 * 10 * 8, dtype=torch.bfloat16)
    real = {offset: flat[offset : offset + 480].view(2, 3, 10, 8) for offset in (1, 8)}
    assert aligned_when_run(real[8]) == (real[8].data_ptr() % 16 == 0)
    mode = FakeTensorMode()  # static shapes, offsets and strides
    fake = {offset: mode.from_tensor(t) for offset, t in real.items()}
    assert fake[1].storage_offset() == 1 and fake[8].storage_offset() == 8
    assert not aligned_when_run(fake[8])  # another backend (aot_eager): no promise
    strides = read_layouts((fake[8],))[1]
    assert not tma_layouts((fake[8],), strides, traced=True)
    with V.set_fake_mode(mode):
        assert aligned_when_run(fake[8]) and not aligned_when_run(fake[1])
        assert tma_layouts((fake[8],), strides, traced=True)
        assert not tma_layouts((fake[1],), strides, traced=True)
    # Dynamic shapes (all but the head dim): symbolic sizes, strides and storage offset; only
    # what holds for every size counts (the strides here, 16 bytes times a size; not the
    # offset, nor strides of a symbolic head dim).
    dynamic = FakeTensorMode(shape_env=ShapeEnv())
    for d_dim, ok in ((DimDynamic.STATIC, True), (DimDynamic.DYNAMIC, False)):
        context = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC] * 3 + [d_dim])
        t = dynamic.from_tensor(
            torch.randn(2, 3, 10, 8, dtype=torch.bfloat16), symbolic_context=context
        )
        with V.set_fake_mode(dynamic):
            assert tma_layouts((t,), read_layouts((t,))[1], traced=True) == ok
    static_d = StatelessSymbolicContext(
        dynamic_sizes=[DimDynamic.DYNAMIC] * 3 + [DimDynamic.STATIC]
    )
    sliced = dynamic.from_tensor(real[8], symbolic_context=static_d)
    assert not isinstance(sliced.storage_offset(), int)
    with V.set_fake_mode(dynamic):
        assert not tma_layouts((sliced,), read_layouts((sliced,))[1], traced=True)


def test_a_launch_missing_a_constexpr_fails_without_a_gpu_too():
    """A compiled kernel's launch reads every constexpr by name (`CachedLaunch`); the
    interpreter's kernels are checked against their signature, so CI fails where a GPU would."""
    from fa2.triton.backward import _delta_kernel

    meta = dict(HEAD_DIM=64, BLOCK_D=64, LARGE=False, BLOCK_M=16)
    with pytest.raises(KeyError, match="ZERO_DQ"):
        launch.CachedLaunch(_delta_kernel, (1, 1), meta, num_warps=4, num_stages=1)
    launch.CachedLaunch(_delta_kernel, (1, 1), dict(meta, ZERO_DQ=True), num_warps=4, num_stages=1)
