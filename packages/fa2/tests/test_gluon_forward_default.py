"""The Gluon forward as the default for long sequences on Hopper (FA2_GLUON_FORWARD unset), and
its opaque op under torch.compile.

On the CPU: the setting's values, that an unset setting never warns where the Gluon forward
cannot run, and the lengths the default takes at each head dim. On an sm_90 GPU: a long
sequence takes it by default, a short one does not, and a compiled call runs it as
`fa2::gluon_forward` with the same bits as the eager call, gradients included.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from fa2 import FlashAttention2Triton, attention_reference
from fa2.triton import configs, forward
from fa2.triton.configs import SHORT_SEQ


@pytest.mark.parametrize(
    ("text", "mode"),
    [(None, "auto"), ("", "auto"), ("auto", "auto"), ("0", None), ("1", "overlap"),
     ("pingpong", "pingpong"), ("plain", "plain"), ("persistent", "persistent")],
)  # fmt: skip
def test_the_setting_reads(monkeypatch, text, mode):
    if text is None:
        monkeypatch.delenv("FA2_GLUON_FORWARD", raising=False)
    else:
        monkeypatch.setenv("FA2_GLUON_FORWARD", text)
    assert configs.gluon_forward_requested() == mode


@pytest.mark.parametrize(
    ("version", "written_for"), [("3.6.0", True), ("3.9.0", False), ("4.6", False)]
)
def test_gluon_kernels_run_only_on_the_triton_they_are_written_for(
    monkeypatch, version, written_for
):
    import triton

    monkeypatch.setattr(triton, "__version__", version)
    assert configs.gluon_triton() is written_for


@pytest.mark.parametrize(
    ("head_dim", "seq_len", "taken"),
    [(64, SHORT_SEQ, False), (64, SHORT_SEQ + 1, True), (128, 2047, False), (128, 2048, True),
     (128, 32768, True), (32, 32768, False), (256, 32768, False)],
)  # fmt: skip
def test_the_default_takes_the_lengths_where_it_measured_faster(head_dim, seq_len, taken):
    assert configs.gluon_forward_default(head_dim, seq_len) is taken


@pytest.mark.parametrize(("seq_len", "persistent"), [(512, True), (2048, True), (2049, False)])
def test_the_default_runs_short_sequences_in_the_persistent_grid(seq_len, persistent):
    assert configs.gluon_persistent_default(seq_len) is persistent
    # a traced length takes it only where it is known to be short (no guard)
    assert not configs.gluon_persistent_default(_symbolic_length())


def test_unset_it_falls_back_silently(monkeypatch):
    # On the CPU (or any GPU but sm_90) the Gluon forward cannot run: no warning, Triton runs.
    monkeypatch.delenv("FA2_GLUON_FORWARD", raising=False)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    q, k, v = (torch.randn(1, 1, 24, 16, device=device) for _ in range(3))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        FlashAttention2Triton.apply(q, k, v, True)
    assert not [w for w in caught if "FA2_GLUON_FORWARD" in str(w.message)]
    assert not any(plan.gluon for plan in forward._plans.cache.values())


hopper = pytest.mark.skipif(
    not (
        torch.cuda.is_available()
        and torch.cuda.get_device_capability() == (9, 0)
        and configs.gluon_triton()
    ),
    reason="needs an sm_90 GPU and the Triton whose Gluon the kernel is written for",
)
LONG = SHORT_SEQ + 64  # the shortest sequences the default gives the Gluon forward, plus a tile


def _qkv(n: int, d: int = 64) -> tuple[torch.Tensor, ...]:
    return tuple(
        torch.randn(1, 2, n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3)
    )


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize(
    ("n", "d", "gluon"),
    [(LONG, 64, True), (SHORT_SEQ, 64, False), (2048, 128, True), (2047, 128, False)],
)
def test_long_sequences_take_it_by_default(monkeypatch, n, d, gluon):
    monkeypatch.delenv("FA2_GLUON_FORWARD", raising=False)
    from fa2.triton.function import run_forward

    q, k, v = (t.detach() for t in _qkv(n, d))
    _, _, plan = run_forward(q, k, v, is_causal=True)
    assert plan.gluon is gluon


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize(("layout", "persistent"), [("bhsd", True), ("bshd", False)])
def test_at_2048_tokens_the_default_runs_the_persistent_grid_where_rows_allow(
    monkeypatch, layout, persistent
):
    monkeypatch.delenv("FA2_GLUON_FORWARD", raising=False)
    from fa2.triton.function import run_forward

    q, k, v = (t.detach() for t in _qkv(2048, 128))
    if layout == "bshd":  # (b, s, h, d) storage: heads' rows interleave, one tile a program
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    o, _, plan = run_forward(q, k, v, is_causal=True)
    assert plan.gluon and (plan.persistent_refusal is None) is persistent
    assert (plan.launch.grid[1] == 1) is persistent  # (programs, 1, 1) or (tiles, heads, 1)
    ref, _ = attention_reference(q.double(), k.double(), v.double(), causal=True)
    assert ((o.double() - ref).norm() / ref.norm()).item() < 2e-2


@pytest.mark.gpu
@hopper
def test_compiled_it_runs_as_its_opaque_op_with_the_eager_bits(monkeypatch):
    from compiled_checks import eager_and_compiled

    from fa2 import flash_attention

    monkeypatch.delenv("FA2_GLUON_FORWARD", raising=False)
    q, k, v = _qkv(LONG)

    def attend(q, k, v):
        return flash_attention(q, k, v, causal=True)

    eager, compiled, (code, *_) = eager_and_compiled(attend, (q, k, v), torch.randn_like(q))
    assert "fa2.gluon_forward" in code
    for got, want in zip(compiled, eager, strict=True):
        assert torch.equal(got, want)


def test_a_symbolic_head_dim_takes_the_default_only_where_known():
    # torch.compile(dynamic=True) traces the head dim as a symbol too; the default must not
    # hash it (a dict lookup raised "unhashable type: non-nested SymInt" on Hopper)
    assert not configs.gluon_forward_default(_symbolic_length(), 32768)
    assert configs.gluon_forward_min_seq(_symbolic_length()) is None
    assert configs.gluon_forward_min_seq(128) == configs.GLUON_FORWARD_MIN_SEQ[128]


def _symbolic_length() -> torch.SymInt:
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    return ShapeEnv().create_unbacked_symint()


@pytest.mark.parametrize("on_hopper", [True, False])
def test_a_symbolic_length_on_hopper_is_said_once_per_kernel(monkeypatch, on_hopper):
    # A compiled model whose lengths dynamo made symbolic runs the Triton kernels; on Hopper,
    # where the Gluon ones are the default, that is said once per kernel, elsewhere never.
    monkeypatch.setattr(configs, "INTERPRET", False)
    monkeypatch.setattr(
        configs, "device_capability", lambda device: (9, 0) if on_hopper else (8, 0)
    )
    monkeypatch.setattr(configs, "_symbolic_warned", set())
    device = torch.device("cuda", 0)
    symbolic = (1, 32, _symbolic_length(), 128)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert configs.symbolic_shapes_refusal((1, 32, 4096, 128), device, "forward") is None
        for kernel in ("forward", "backward", "forward", "backward"):
            reason = configs.symbolic_shapes_refusal(symbolic, device, kernel)
            assert reason is not None and "dynamic shapes" in reason
    said = [str(w.message) for w in caught if "dynamic shapes" in str(w.message)]
    if on_hopper:
        assert len(said) == 2
        assert "its forward runs" in said[0] and "its backward runs" in said[1]
        assert all("dynamic=False" in text for text in said)
    else:
        assert not said


@pytest.mark.gpu
@hopper
def test_compiled_with_dynamic_lengths_it_says_why_the_triton_kernels_run(monkeypatch):
    from fa2 import flash_attention

    monkeypatch.delenv("FA2_GLUON_FORWARD", raising=False)
    monkeypatch.setattr(configs, "_symbolic_warned", set())
    q, k, v = _qkv(2048, 128)
    attend = torch.compile(lambda q, k, v: flash_attention(q, k, v, causal=True), dynamic=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        attend(q, k, v).sum().backward()
    said = [str(w.message) for w in caught if "dynamic shapes" in str(w.message)]
    assert any("its forward runs" in text for text in said)
    # The backward's plan is made when it runs, from the saved tensors' sizes, which are
    # ints then: it takes the Gluon kernel, and says nothing.
    assert not any("its backward runs" in text for text in said)
