"""Activation checkpointing: the spec parser, what autograd keeps, what is recomputed, and that no
gradient changes."""

import copy
import io
import math
import weakref

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from lmcore import (
    KEPT_ATTENTION_OPS,
    ActivationCheckpointing,
    BlockStack,
    CheckpointedBlockStack,
    TransformerLM,
    apply_activation_checkpointing,
    cross_entropy,
    memory_optimal_segment_size,
    peak_activation_bytes,
    saved_activation_bytes,
)

NUM_BLOCKS = 5  # odd, so that segments of 2 and 3 leave a shorter last one
POLICIES = [
    "none", "blocks", "every:2", "segments:2", "segments:3", "nested", "nested:2", "selective"
]  # fmt: skip


@pytest.fixture
def model(tiny_config) -> TransformerLM:
    torch.manual_seed(0)
    config = tiny_config.__class__(**{**tiny_config.__dict__, "num_layers": NUM_BLOCKS})
    return TransformerLM.from_config(config)


def _gradients(model: TransformerLM, tokens: torch.Tensor) -> list[torch.Tensor]:
    model.zero_grad()
    cross_entropy(model(tokens[:, :-1]), tokens[:, 1:]).backward()
    return [p.grad for p in model.parameters()]


# ---- the spec strings ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "plan"),
    [
        ("none", (0, 1, 2, 3, 4)),
        ("blocks", ((0,), (1,), (2,), (3,), (4,))),
        ("every:1", ((0,), (1,), (2,), (3,), (4,))),
        ("every:2", (0, (1,), 2, (3,), 4)),
        ("segments:2", ((0, 1), (2, 3), (4,))),
        ("segments:5", ((0, 1, 2, 3, 4),)),
        ("nested:2", (((0,), (1,)), ((2,), (3,)), ((4,),))),
        ("nested:3", (((0,), (1,), (2,)), ((3,), (4,)))),
        ("selective", ((0,), (1,), (2,), (3,), (4,))),
    ],
)
def test_spec_strings_parse_to_their_plans(spec, plan):
    policy = ActivationCheckpointing.parse(spec)
    assert policy.plan(NUM_BLOCKS) == plan
    assert str(policy) == spec
    assert ActivationCheckpointing.parse(policy) is policy


@pytest.mark.parametrize(
    "spec",
    [
        "",
        "all",
        "segments",
        "every",
        "segments:0",
        "every:-1",
        "nested:x",
        "blocks:2",
        "selective:2",
    ],
)
def test_bad_spec_strings_say_what_is_accepted(spec):
    with pytest.raises(ValueError, match=r"segments|K"):
        ActivationCheckpointing.parse(spec)


@pytest.mark.parametrize(("num_blocks", "k"), [(4, 2), (9, 3), (16, 4), (32, 6), (34, 6)])
def test_nested_picks_segments_of_about_the_square_root(num_blocks, k):
    assert ActivationCheckpointing.parse("nested").nested_segment_size(num_blocks) == k
    assert abs(k - math.sqrt(num_blocks)) < 1


# ---- the model: gradients, recomputation, parameters ----------------------------------------


@pytest.mark.parametrize("policy", POLICIES)
def test_gradients_are_unchanged(model, policy):
    tokens = torch.randint(0, model.config.vocab_size, (3, 20))
    expected = _gradients(model, tokens)
    checkpointed = apply_activation_checkpointing(copy.deepcopy(model), policy=policy)
    actual = _gradients(checkpointed, tokens)
    names = list(model.state_dict())  # parameters only: the model has no persistent buffers
    # Recomputation repeats the same float32 operations, so the results are identical.
    for name, a, e in zip(names, actual, expected, strict=True):
        assert torch.equal(a, e), name


@pytest.mark.parametrize(
    ("policy", "runs"),
    [
        ("none", [1, 1, 1, 1, 1]),
        ("blocks", [2, 2, 2, 2, 2]),
        ("every:2", [1, 2, 1, 2, 1]),
        ("segments:2", [2, 2, 2, 2, 2]),
        # forward, the outer recomputation, the inner one; the outer recomputation stops
        # once it has what the segment's backward needs: the last block's input (early stop)
        ("nested:2", [3, 2, 3, 2, 2]),
    ],
)
def test_blocks_run_forward_again_in_backward(model, policy, runs):
    calls = [0] * len(model.layers)
    for index, layer in enumerate(model.layers):
        layer.register_forward_pre_hook(lambda *_, i=index: calls.__setitem__(i, calls[i] + 1))
    apply_activation_checkpointing(model, policy=policy)
    _gradients(model, torch.randint(0, model.config.vocab_size, (2, 10)))
    assert calls == runs


@pytest.mark.parametrize("policy", ["segments:2", "nested", "selective"])
def test_parameters_names_and_state_dict_keys_are_unchanged(model, policy):
    names, keys = [n for n, _ in model.named_parameters()], list(model.state_dict())
    blocks = list(model.layers)
    apply_activation_checkpointing(model, policy=policy)
    assert [n for n, _ in model.named_parameters()] == names
    assert list(model.state_dict()) == keys
    assert list(model.layers) == blocks and isinstance(model.layers, CheckpointedBlockStack)


def test_every_keyword_is_the_every_spec(model):
    apply_activation_checkpointing(model, every=2)
    assert str(model.layers.policy) == "every:2"


def test_applying_twice_is_rejected(model):
    apply_activation_checkpointing(model, policy="segments:2")
    with pytest.raises(RuntimeError, match="already applied"):
        apply_activation_checkpointing(model)


@pytest.mark.parametrize("every", [0, -2, 1.5])
def test_bad_every_is_rejected(model, every):
    with pytest.raises(ValueError, match="every"):
        apply_activation_checkpointing(model, every=every)


def test_a_model_without_a_block_stack_is_rejected():
    with pytest.raises(TypeError, match="BlockStack"):
        apply_activation_checkpointing(nn.Linear(2, 2))


# ---- what autograd keeps ----------------------------------------------------------------------


def _saved_by_the_stack(model: TransformerLM, x: torch.Tensor) -> list[torch.Tensor]:
    """The non-empty tensors autograd keeps when the blocks run on `x` (the handout's hooks)."""
    saved = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.numel() and not isinstance(t, nn.Parameter):
            saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.layers(x)
    return saved


def _block_inputs(model: TransformerLM) -> list[torch.Tensor]:
    inputs: list[torch.Tensor] = []
    for layer in model.layers:
        layer.register_forward_pre_hook(lambda _, args: inputs.append(args[0]))
    return inputs


@pytest.mark.parametrize(
    ("policy", "first_blocks"),
    [("segments:2", [0, 2, 4]), ("segments:3", [0, 3]), ("blocks", [0, 1, 2, 3, 4])],
)
def test_only_the_segment_inputs_stay_saved(model, policy, first_blocks):
    inputs = _block_inputs(model)
    apply_activation_checkpointing(model, policy=policy)
    x = torch.randn(2, 7, model.config.d_model, requires_grad=True)
    saved = _saved_by_the_stack(model, x)
    expected = [inputs[i] for i in first_blocks]
    assert len(saved) == len(expected)
    for got, want in zip(saved, expected, strict=True):
        assert got.untyped_storage()._cdata == want.untyped_storage()._cdata
        assert torch.equal(got, want)


def test_nested_keeps_only_the_outer_segment_inputs(model):
    inputs = _block_inputs(model)
    apply_activation_checkpointing(model, policy="nested:2")
    saved = _saved_by_the_stack(model, torch.randn(2, 7, model.config.d_model))
    assert [t.untyped_storage()._cdata for t in saved] == [
        inputs[i].untyped_storage()._cdata for i in (0, 2, 4)
    ]


def test_without_checkpoints_every_block_keeps_its_activations(model):
    x = torch.randn(2, 7, model.config.d_model, requires_grad=True)
    saved_bytes = sum(t.untyped_storage().nbytes() for t in _saved_by_the_stack(model, x))
    assert saved_bytes > NUM_BLOCKS * 5 * x.numel() * x.element_size()


# ---- peak memory: live tensors counted as they are created and freed ---------------------------


class _Ledger:
    """Counts live tensors of two kinds as weak references die: block activations and outputs."""

    def __init__(self) -> None:
        self.live = {"activations": 0, "outputs": 0}
        self.peak = dict(self.live)

    def track(self, tensor: torch.Tensor, kind: str) -> None:
        self.live[kind] += 1
        self.peak[kind] = max(self.peak[kind], self.live[kind])
        weakref.finalize(tensor, self._release, kind)

    def _release(self, kind: str) -> None:
        self.live[kind] -= 1


class _SaveActivations(torch.autograd.Function):
    """A block's stand-in: saves a fresh tensor (its activations), returns a fresh output."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, ledger: _Ledger) -> torch.Tensor:
        activations = x.detach().repeat(4)
        ledger.track(activations, "activations")
        ctx.save_for_backward(activations)
        out = x * 2
        ledger.track(out, "outputs")
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (activations,) = ctx.saved_tensors  # unpacked: recomputed here under a checkpoint
        return grad * 2 + 0 * activations[: grad.numel()], None


class _Block(nn.Module):
    def __init__(self, ledger: _Ledger) -> None:
        super().__init__()
        self.ledger = ledger

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _SaveActivations.apply(x, self.ledger)


def _peaks(policy: str, num_blocks: int) -> dict[str, int]:
    ledger = _Ledger()
    stack = BlockStack(_Block(ledger) for _ in range(num_blocks))
    stack = CheckpointedBlockStack(stack, policy)
    stack(torch.randn(3, requires_grad=True)).sum().backward()
    assert ledger.live["activations"] == 0
    return ledger.peak


@pytest.mark.parametrize(
    ("policy", "activations"),
    [("none", 16), ("blocks", 1), ("segments:2", 2), ("segments:5", 5), ("nested", 1)],
)
def test_peak_block_activations_are_one_segments_worth(policy, activations):
    assert _peaks(policy, 16)["activations"] == activations


def test_nested_holds_about_twice_the_square_root_of_the_blocks_inputs():
    for num_blocks in (16, 36):
        nested, blocks = _peaks("nested", num_blocks), _peaks("blocks", num_blocks)
        assert blocks["outputs"] >= num_blocks
        assert nested["outputs"] <= 2 * math.isqrt(num_blocks) + 2


# ---- the memory model and the measure ----------------------------------------------------------


def test_peak_model_of_the_simple_policies():
    a, b = 100, 3
    assert peak_activation_bytes("none", 8, input_bytes=b, saved_bytes=a) == 8 * a
    assert peak_activation_bytes("blocks", 8, input_bytes=b, saved_bytes=a) == 7 * b + a
    # segments of 3, 3, 2: the second segment's backward holds one input and 3 blocks
    assert peak_activation_bytes("segments:3", 8, input_bytes=b, saved_bytes=a) == b + 3 * a
    # nested:3 over 3, 3, 2: two outer inputs held, then 1 inner input and one block
    assert peak_activation_bytes("nested:3", 8, input_bytes=b, saved_bytes=a) == 3 * b + a
    # selective: each earlier block keeps its input and attention output, the last recomputes
    kept = 7
    assert (
        peak_activation_bytes("selective", 8, input_bytes=b, saved_bytes=a, kept_bytes=kept)
        == 7 * (b + kept) + a
    )
    # what other policies keep does not grow
    assert peak_activation_bytes("blocks", 8, input_bytes=b, saved_bytes=a, kept_bytes=kept) == (
        7 * b + a
    )
    with pytest.raises(ValueError, match="kept_bytes"):
        peak_activation_bytes("selective", 8, input_bytes=b, saved_bytes=a, kept_bytes=-1)


@pytest.mark.parametrize(
    ("num_blocks", "input_bytes", "saved_bytes", "k"),
    [
        (32, 80, 3651, 1),  # the handout's xl: residuals dominate, one block per checkpoint
        (32, 80, 1040, 2),
        (32, 100, 100, 6),
        (100, 1, 1, 10),
    ],
)
def test_memory_optimal_segment_size(num_blocks, input_bytes, saved_bytes, k):
    got = memory_optimal_segment_size(num_blocks, input_bytes=input_bytes, saved_bytes=saved_bytes)
    assert got == k

    def peak(size: int) -> int:
        spec = f"segments:{size}"
        return peak_activation_bytes(
            spec, num_blocks, input_bytes=input_bytes, saved_bytes=saved_bytes
        )

    assert all(peak(k) <= peak(other) for other in range(1, num_blocks + 1))
    assert abs(k - math.sqrt(num_blocks * input_bytes / saved_bytes)) < 1.5


def test_saved_activation_bytes_counts_each_storage_once_and_skips_parameters():
    linear = nn.Linear(6, 4)
    x = torch.randn(5, 6, requires_grad=True)
    # linear saves x (and its weight, a parameter); x * x saves x twice: one storage in all
    assert saved_activation_bytes(lambda t: linear(t) * linear(t), x) > 0
    assert saved_activation_bytes(lambda t: (t * t).sum(), x) == x.numel() * 4
    assert saved_activation_bytes(linear, x) == x.numel() * 4


def test_saved_activation_bytes_leaves_out_buffers(tiny_model):
    block = tiny_model.layers[0]
    x = torch.randn(2, 7, tiny_model.config.d_model, requires_grad=True)
    params = {p.untyped_storage()._cdata for p in block.parameters()}
    storages: dict[int, int] = {}

    def pack(t):
        if t.untyped_storage()._cdata not in params:
            storages[t.untyped_storage()._cdata] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        block(x)
    rope = block.attn.rope
    tables = {
        t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in (rope.cos, rope.sin)
    }
    assert tables.keys() <= storages.keys()  # RoPE saves its tables for backward
    assert saved_activation_bytes(block, x) == sum(storages.values()) - sum(tables.values())


def test_saved_activation_bytes_measures_a_big_block_on_the_meta_device():
    with torch.device("meta"):
        model = TransformerLM(10, 256, 64, 1, 4, 128)
        x = torch.empty(2, 256, 64, requires_grad=True)
    saved = saved_activation_bytes(model.layers[0], x)
    # the naive backend keeps two (batch, heads, seq, seq) float32 score matrices, and more
    assert saved > 2 * 2 * 4 * 256 * 256 * 4


@pytest.mark.gpu
@pytest.mark.parametrize("policy", ["segments:2", "segments:3", "segments:4", "nested", "none"])
def test_measured_peaks_follow_the_memory_model(policy):
    """The derivation on a GPU: 32 `medium`-wide blocks (frozen, so that no weight gradient
    grows during backward), batch 4, context 512, bf16 autocast, SDPA. A and b are measured on
    one block; each policy's measured peak, less the model's prediction, must equal blocks'
    (the transients of one block's backward, the same for every policy) to within half a
    block's activations."""
    torch.manual_seed(0)
    with torch.device("cuda"):
        blocks = TransformerLM(10_000, 512, 1024, 32, 16, 4096, attention="sdpa").layers
        x = torch.randn(4, 512, 1024, requires_grad=True)
    blocks.requires_grad_(False)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        saved = saved_activation_bytes(blocks[0], x)
    input_bytes = x.numel() * x.element_size()

    def offset(spec: str) -> int:
        stack = blocks if spec == "none" else CheckpointedBlockStack(blocks, spec)
        x.grad = None
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = stack(x)
        out.float().square().mean().backward()
        torch.cuda.synchronize()
        measured = torch.cuda.max_memory_allocated() - base
        return measured - peak_activation_bytes(
            spec, 32, input_bytes=input_bytes, saved_bytes=saved
        )

    assert abs(offset(policy) - offset("blocks")) <= saved / 2, (saved, input_bytes)


# ---- selective: attention's output kept ------------------------------------------------------


class _OpCounter(TorchDispatchMode):
    """Counts the attention ops selective keeps and the matmuls, as they are dispatched."""

    def __init__(self) -> None:
        super().__init__()
        self.attention = self.matmuls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.name() in KEPT_ATTENTION_OPS:
            self.attention += 1
        elif func.name() == "aten::mm":
            self.matmuls += 1
        return func(*args, **(kwargs or {}))


def _selective_model(tiny_config, attention: str, policy: str) -> TransformerLM:
    torch.manual_seed(0)
    config = tiny_config.__class__(**{**tiny_config.__dict__, "attention": attention})
    return apply_activation_checkpointing(TransformerLM.from_config(config), policy=policy)


@pytest.mark.parametrize("attention", ["sdpa", "fa2-triton"])
def test_selective_recomputes_blocks_but_not_attention(tiny_config, attention):
    tokens = torch.randint(0, tiny_config.vocab_size, (2, 17))
    counts, grads = {}, {}
    for policy in ("none", "blocks", "selective"):
        model = _selective_model(tiny_config, attention, policy)
        with _OpCounter() as counter:
            grads[policy] = _gradients(model, tokens)
        counts[policy] = (counter.attention, counter.matmuls)
    blocks = tiny_config.num_layers
    assert counts["none"][0] == counts["selective"][0] == blocks
    assert counts["blocks"][0] == 2 * blocks
    # the projections and the feed-forward network are recomputed as under `blocks`
    assert counts["selective"][1] == counts["blocks"][1] > counts["none"][1]
    for got, want in zip(grads["selective"], grads["none"], strict=True):
        assert torch.equal(got, want)


@pytest.mark.parametrize("attention", ["sdpa", "fa2-triton"])
def test_selective_keeps_attention_output_under_compile(tiny_config, attention):
    """Compiled with the checkpoint inside, a block keeps its input, the attention output and
    the logsumexp (nothing else), and its gradients are eager's."""
    model = _selective_model(tiny_config, attention, "selective")
    x = torch.randn(2, 16, tiny_config.d_model, requires_grad=True)
    got, want = _compiled_block_keeps_attention(model, x, backend="aot_eager")
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)


def _compiled_block_keeps_attention(
    model: TransformerLM, x: torch.Tensor, **compile_options
) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """Compile the first block of a `selective` model and check it keeps x, the attention output
    and the logsumexp (fp32), nothing else; the gradients of x and the block's weights from the
    compiled block and from an eager copy, for one random output gradient."""
    reference = copy.deepcopy(model).layers[0]
    block = model.layers[0]
    block.compile(fullgraph=True, **compile_options)
    batch, seq, _ = x.shape
    lse = batch * seq * model.config.num_heads * 4
    assert saved_activation_bytes(block, x) == 2 * x.numel() * x.element_size() + lse
    out = block(x)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, [x, *block.parameters()], grad)
    return got, torch.autograd.grad(reference(x), [x, *reference.parameters()], grad)


@pytest.mark.gpu
def test_selective_keeps_fa2_output_when_inductor_compiles_it():
    """On a GPU fa2 is a `triton_op` that inductor inlines; the kept output must survive that:
    a compiled bf16 block keeps its input, the attention output and the logsumexp only, and its
    gradients are the eager block's."""
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = TransformerLM(97, 256, 256, 2, 4, 512, attention="fa2-triton")
        x = torch.randn(2, 256, 256, requires_grad=True, dtype=torch.bfloat16)
    model.to(torch.bfloat16)
    apply_activation_checkpointing(model, policy="selective")
    got, want = _compiled_block_keeps_attention(model, x)
    # bf16, compiled (fused) against eager: a few elements round differently, so the whole
    # gradient is compared, not each element
    for g, w in zip(got, want, strict=True):
        assert ((g - w).float().norm() / w.float().norm()).item() < 1e-2


def test_a_selective_model_pickles_whole(tiny_config):
    """`torch.save(model)` and `torch.load` (a whole module, not its state dict), as users do:
    the loaded model checkpoints its own blocks and computes the same."""
    model = _selective_model(tiny_config, "sdpa", "selective")
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    tokens = torch.randint(0, tiny_config.vocab_size, (2, 9))
    assert torch.equal(loaded(tokens), model(tokens))
    assert all(block.forward.args[0] is block for block in loaded.layers)
    with _OpCounter() as counter:
        _gradients(loaded, tokens)
    assert counter.attention == tiny_config.num_layers  # still kept: one forward a block


def test_selective_leaves_decoding_and_no_grad_forwards_alone(tiny_config):
    model = _selective_model(tiny_config, "sdpa", "selective")
    plain = _selective_model(tiny_config, "sdpa", "none")
    tokens = torch.randint(0, tiny_config.vocab_size, (2, 9))
    with torch.no_grad(), _OpCounter() as counter:
        assert torch.equal(model(tokens), plain(tokens))
    assert counter.attention == 2 * tiny_config.num_layers  # once per block, in each model
