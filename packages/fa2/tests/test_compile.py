"""The Triton path inside torch.compile: any strides the eager path takes, fake-tensor planning,
and `import fa2` without torch's compiler stack. On a GPU: a Transformer under torch.compile."""

import importlib.util
import math
import os
import subprocess
import sys

import pytest
import torch

from fa2 import FlashAttention2Triton, attention_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# aot_eager traces the Function and the custom ops as inductor does, without a C++ build.
BACKEND = "inductor" if DEVICE == "cuda" else "aot_eager"


def _transposed(batch, seq, heads, d, dtype=torch.float32):
    """(batch, heads, seq, d) views of (batch, seq, heads, d) tensors, as a Transformer makes."""
    x = torch.randn(batch, seq, heads, d, device=DEVICE, dtype=dtype)
    return x.transpose(1, 2).detach().requires_grad_()


def _grads_vs_oracle(q, k, v, o, causal):
    q2, k2, v2 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref, _ = attention_reference(q2, k2, v2, causal=causal)
    ref.sum().backward()
    return [(o, ref)] + [(a.grad, b.grad) for a, b in ((q, q2), (k, k2), (v, v2))]


def _error(x, ref):
    return ((x.double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("kv_heads", [3, 1], ids=["mha", "mqa"])
def test_compiled_function_takes_transposed_inputs(kv_heads):
    fn = torch.compile(FlashAttention2Triton.apply, backend=BACKEND, fullgraph=True)
    q = _transposed(2, 40, 3, 16)
    k, v = _transposed(2, 40, kv_heads, 16), _transposed(2, 40, kv_heads, 16)
    assert not q.is_contiguous()
    o = fn(q, k, v, True)
    o.sum().backward()
    if kv_heads != 3:  # the oracle sees the key/value heads repeated
        k2, v2 = (t.detach().repeat_interleave(3, 1).requires_grad_() for t in (k, v))
        o2 = FlashAttention2Triton.apply(q.detach(), k2, v2, True)
        o2.sum().backward()
        torch.testing.assert_close(k.grad, k2.grad.unflatten(1, (1, 3)).sum(2))
        return
    for x, ref in _grads_vs_oracle(q, k, v, o, True):
        assert _error(x, ref) < 1e-5


def test_compiled_single_pass_backward_takes_transposed_inputs():
    fn = torch.compile(FlashAttention2Triton.apply, backend=BACKEND, fullgraph=True)
    q, k, v = (_transposed(2, 40, 3, 16) for _ in range(3))
    o = fn(q, k, v, True, None, False, None, False)  # deterministic=False
    o.sum().backward()
    for x, ref in _grads_vs_oracle(q, k, v, o, True):
        assert _error(x, ref) < 1e-5


def _fake_inputs(mode, symbolic):
    """Fake q, k, v transposed from (batch, seq, heads, d), with symbolic sizes if asked (all
    but the head dim, a constant of the model)."""
    from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext

    dims = [DimDynamic.DYNAMIC if symbolic else DimDynamic.STATIC] * 3 + [DimDynamic.STATIC]
    context = StatelessSymbolicContext(dynamic_sizes=dims)
    real = [torch.randn(4, 256, heads, 64) for heads in (12, 4, 4)]
    return [mode.from_tensor(t, symbolic_context=context).transpose(1, 2) for t in real]


def _packed_window_softcap(q, k, v, cu, longest):
    """The Triton path over packed sequences with a causal window and a softcap (what a packed
    training batch of a Gemma-2-like model asks for)."""
    from fa2.api import attend

    return attend(
        q, k, v, causal=True, scale=None, window_size=(9, -1), softcap=20.0, layout="thd",
        implementation="triton", cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=longest,
        max_seqlen_k=longest, bottom_right=True,
    )  # fmt: skip


def test_compiled_packed_sequences_with_window_and_softcap():
    # On a GPU, Inductor traces into the triton_op (the per-call grid over the longest sequence).
    from fa2 import varlen_attention_reference

    cu = torch.tensor([0, 1, 18, 58, 61], dtype=torch.int32, device=DEVICE)
    fn = torch.compile(_packed_window_softcap, backend=BACKEND, fullgraph=True)
    q, k = (torch.randn(61, n, 16, device=DEVICE, requires_grad=True) for n in (4, 2))
    v = torch.randn(61, 2, 16, device=DEVICE, requires_grad=True)
    o = fn(q, k, v, cu, 40)
    do = torch.randn_like(o)
    grads = torch.autograd.grad(o, (q, k, v), do)
    ins = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref, _ = varlen_attention_reference(
        *ins, cu.cpu(), cu.cpu(), causal=True, window_size=(9, -1), softcap=20.0,
        bottom_right=True,
    )  # fmt: skip
    oracle = (ref, *torch.autograd.grad(ref, ins, do.double()))
    for x, r in zip((o, *grads), oracle, strict=True):
        assert _error(x, r) < 1e-5


@pytest.mark.skipif(DEVICE == "cuda", reason="a device-side assert ends the CUDA context")
def test_compiled_packed_calls_check_the_offsets_on_every_run():
    # The graph holds device-side assertions of the offsets' values: a later run with bad ones
    # (same shapes and dtype, so no retrace) stops instead of reading or writing past the end.
    cu = torch.tensor([0, 1, 18, 58, 61], dtype=torch.int32, device=DEVICE)
    fn = torch.compile(_packed_window_softcap, backend=BACKEND, fullgraph=True)
    q, k, v = (torch.randn(61, 2, 16, device=DEVICE) for _ in range(3))
    fn(q, k, v, cu, 40)
    with pytest.raises(RuntimeError, match="fa2: cu_seqlens_q must start at 0"):
        fn(q, k, v, torch.tensor([0, 1, 18, 58, 64], dtype=torch.int32, device=DEVICE), 40)


def test_compiled_self_attention_takes_one_tensor_as_queries_keys_and_values():
    # attend(x, x, x): Dynamo refuses an autograd Function given one tensor twice
    from fa2 import flash_attention

    def self_attention(x):
        return flash_attention(x, x, x, causal=True, implementation="triton")

    x = _transposed(2, 24, 2, 16)
    o = torch.compile(self_attention, backend=BACKEND, fullgraph=True)(x)
    do = torch.randn_like(o)
    (grad,) = torch.autograd.grad(o, x, do)
    x2 = x.detach().double().requires_grad_()
    ref, _ = attention_reference(x2, x2, x2, causal=True)
    (ref_grad,) = torch.autograd.grad(ref, x2, do.double())  # the three gradients summed
    assert _error(o, ref) < 1e-5 and _error(grad, ref_grad) < 1e-5


@pytest.mark.parametrize("symbolic", [False, True], ids=["static", "symbolic"])
def test_launch_plans_build_from_fake_tensors(symbolic, monkeypatch):
    # What torch.compile does with the `triton_op` bodies on a GPU: plan the launches on fake
    # tensors (strides (196608, 64, 768, 1) here), possibly with symbolic sizes. As Inductor
    # would (it sets its fake mode), on a device taken to have a TMA unit: tiles may read
    # through descriptors, the strides being whole 16 bytes for every size (d = 64 is static).
    from torch._inductor.virtualized import V
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from fa2.checks import Call
    from fa2.masks import make_band
    from fa2.triton import launch
    from fa2.triton.backward import BackwardPlan
    from fa2.triton.forward import ForwardPlan

    monkeypatch.setattr(launch, "tma_capable", lambda device: True)
    mode = FakeTensorMode(shape_env=ShapeEnv())
    q, k, v = _fake_inputs(mode, symbolic)
    call = Call(make_band(causal=True), 0.0, 0.125, "bhsd")
    with mode, V.set_fake_mode(mode):
        forward = ForwardPlan(q, k, v, call, "tf32x3", True, traced=True)
        assert forward.copies is None  # read in place, not copied
        assert forward.meta["GROUP"] == 3 and not forward.meta["LARGE"]
        o, lse = forward.outputs(q)
        args = (forward, q, k, v, o, lse, torch.empty_like(o))
        backward = BackwardPlan(*args, True, True)
        assert backward.copies is None
        single = BackwardPlan(*args, False, True)  # deterministic=False: fp32 takes one pass
        assert "fused" in single.launches and not single.tma_reduce  # traced: no TMA reduce
    assert forward.tma_loads and all(backward.tma_loads.values())
    with mode:  # traced by another backend, which does not keep its inputs aligned
        assert not ForwardPlan(q, k, v, call, "tf32x3", True, traced=True).tma_loads
    # strides of q as the kernels index it: (batch, head, row)
    assert [int(s) for s in forward.ints[:3]] == [256 * 12 * 64, 64, 12 * 64]


def test_traced_launches_pass_no_tensor_twice(monkeypatch):
    # torch.compile functionalizes each traced launch by cloning the pointers a kernel may
    # write, one clone per argument slot: a tensor passed in two slots (L also standing in for
    # the unused cu_seqlens pointers) came back as the wrong slot's unwritten clone, and the
    # compiled backward read garbage for L (NaN gradients on the GPU).
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from fa2.checks import Call
    from fa2.masks import make_band
    from fa2.triton import launch
    from fa2.triton.backward import BackwardPlan
    from fa2.triton.forward import ForwardPlan

    launched = []
    monkeypatch.setattr(
        launch.CachedLaunch,
        "traceable",
        lambda self, tensors, scalars, grid=None: launched.append(tensors),
    )
    mode = FakeTensorMode(shape_env=ShapeEnv())
    q, k, v = _fake_inputs(mode, False)
    call = Call(make_band(causal=True), 0.0, 0.125, "bhsd")
    with mode:
        forward = ForwardPlan(q, k, v, call, "tf32x3", True, traced=True)
        o, lse = forward(q, k, v, 0.125, None, None, True)
        backward = BackwardPlan(forward, q, k, v, o, lse, torch.empty_like(o), True, True)
        backward(q, k, v, o, lse, torch.empty_like(o), 0.125, None, None, True)
    assert len(launched) == 3  # forward, dQ, dK/dV
    for tensors in launched:
        assert len({id(t) for t in tensors}) == len(tensors)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
def test_the_traceable_ops_define_on_a_host_with_triton():
    # On a GPU host (no interpreter) the ops are `triton_op`s, whose schema torch infers from
    # their functions' signatures: defining them must work, with the tensors and options typed.
    code = (
        "import fa2.triton.ops as ops\n"
        "assert ops.TRACEABLE\n"
        "print(ops.forward_op._opoverload._schema)\n"
        "print(ops.backward_op._opoverload._schema)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    forward, backward = run.stdout.splitlines()
    assert "Tensor? cu_seqlens_q" in forward and "bool same_lengths) -> (Tensor, Tensor)" in forward
    assert "bool deterministic) -> (Tensor, Tensor, Tensor)" in backward


def test_import_does_not_load_the_compiler_stack():
    # `import fa2` stays cheap: torch.compile's modules load only when something compiles.
    code = (
        "import sys, torch\n"
        "before = set(sys.modules)\n"
        "import fa2\n"
        "heavy = ('torch._dynamo', 'torch._inductor', 'triton', 'fa2.triton.ops')\n"
        "print(sorted(m for m in heavy if m in sys.modules and m not in before))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"


@pytest.mark.gpu
@pytest.mark.parametrize(
    "dtype, deterministic",
    [(torch.bfloat16, True), (torch.float32, True), (torch.float32, False)],
    ids=str,
)
def test_compiled_transposed_layout_on_gpu(dtype, deterministic):
    fn = torch.compile(FlashAttention2Triton.apply, fullgraph=True)
    q, k, v = (_transposed(4, 256, 12, 64, dtype) for _ in range(3))
    o = fn(q, k, v, True, None, False, None, deterministic)
    o.sum().backward()
    budget = 1e-2 if dtype == torch.bfloat16 else 1e-5
    for x, ref in _grads_vs_oracle(q, k, v, o, True):
        assert _error(x, ref) < budget


@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 128])
def test_compiled_graph_reads_through_tma_and_copes_with_misaligned_inputs(d, monkeypatch):
    # Traced with aligned inputs, the graph's kernels read through TMA descriptors where the
    # default tiles do (Hopper: the dQ pass at d=64, the forward at d=128); run again with
    # inputs one element off 16 bytes, which Inductor must copy before those kernels see them.
    from fa2.triton import launch

    traced_tma = []
    traceable = launch.CachedLaunch.traceable

    def recording(self, tensors, scalars, grid=None):
        traced_tma.append(self.options.get("TMA", False))
        return traceable(self, tensors, scalars, grid)

    monkeypatch.setattr(launch.CachedLaunch, "traceable", recording)
    torch._dynamo.reset()  # static shapes (after other tests' recompiles they turn dynamic)
    fn = torch.compile(FlashAttention2Triton.apply, fullgraph=True)
    shape = (2, 3, 256, d)
    size = math.prod(shape)
    flat = torch.randn(3 * size + 8, device="cuda", dtype=torch.bfloat16)
    for offset in (0, 1):
        q, k, v = (flat[offset + i * size : offset + (i + 1) * size].view(shape) for i in range(3))
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        assert (q.data_ptr() % 16 == 0) == (offset == 0)
        o = fn(q, k, v, True)
        o.sum().backward()
        for x, ref in _grads_vs_oracle(q, k, v, o, True):
            assert _error(x, ref) < 1e-2
    assert any(traced_tma) == launch.tma_capable(flat.device)


@pytest.mark.gpu
@pytest.mark.parametrize("mode, num_kv_heads", [("autocast", None), ("bf16-weights", 4)])
def test_transformer_trains_under_torch_compile(mode, num_kv_heads):
    lmcore = pytest.importorskip("lmcore")

    def make():
        torch.manual_seed(0)
        model = lmcore.TransformerLM(
            vocab_size=1000, context_length=256, d_model=768, num_layers=2, num_heads=12,
            d_ff=2048, attention="fa2-triton", num_kv_heads=num_kv_heads,
        ).cuda()  # fmt: skip
        return model.to(torch.bfloat16) if mode == "bf16-weights" else model

    tokens = torch.randint(0, 1000, (4, 256), device="cuda")
    results = []
    for compiled in (False, True):
        model = make()
        run = torch.compile(model) if compiled else model
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=mode == "autocast"):
            logits = run(tokens)
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tokens.flatten())
        loss.backward()
        results.append((loss.detach(), [p.grad.float() for p in model.parameters()]))
    (loss, grads), (loss_c, grads_c) = results
    torch.testing.assert_close(loss_c, loss, atol=2e-2, rtol=1e-2)
    for g, gc in zip(grads, grads_c, strict=True):
        assert _error(gc, g.double()) < 5e-2
