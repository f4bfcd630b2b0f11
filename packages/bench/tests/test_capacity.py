"""bench.core's memory model against hand computations, against the tensors a real lmcore model's
autograd graph holds, and against bench-zero's measured tensor sizes."""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch

import lmcore
import zero
from bench.plan.activations import (
    block_backward_working_set,
    block_residuals,
    combined_formula,
    head_residuals,
    loss_chunk_tokens,
    loss_memory,
    total_bytes,
)
from bench.plan.fit import (
    checkpointing_candidates,
    largest_batch,
    largest_seq_len,
    least_memory,
    least_recompute_fit,
    parse_memory,
)
from bench.plan.memory import Checkpointing, TrainingPlan, estimate_memory
from bench.plan.params import model_parameters

# A model small enough to count by hand: V=11, d=8, f=12, 2 layers of 2 heads (head dim 4).
HAND = lmcore.ModelConfig(
    vocab_size=11, context_length=4, d_model=8, num_layers=2, num_heads=2, d_ff=12
)
HAND_PARAMS = (
    11 * 8  # token embedding
    + 2 * (8 + 4 * 8 * 8 + 8 + 3 * 8 * 12)  # per block: ln1, q k v o, ln2, w1 w2 w3 = 560
    + 8  # final norm
    + 8 * 11  # LM head
)  # = 1304


def test_parameter_list_is_the_models():
    params = model_parameters(HAND)
    assert sum(p.numel for p in params) == HAND_PARAMS == lmcore.count_parameters(HAND)
    roles = {p.name.split(".")[-2]: p.role for p in params}
    assert roles["q_proj"] == "column" and roles["output_proj"] == "row"
    assert roles["w2"] == "row" and roles["token_embeddings"] == "vocab"
    assert [p.block for p in params if p.kind == "norm"] == [0, 0, 1, 1, None]


def test_single_device_fp32_step_by_hand():
    # fp32, lmcore's foreach AdamW: at the optimizer step the weights (4 B), gradients (4 B),
    # two moments (8 B) and sqrt(v) (4 B) are alive, 20 B per parameter, plus RoPE's cos and sin
    # tables (2 × context 4 × head_dim/2 2 × 4 B = 64 B).
    estimate = estimate_memory(TrainingPlan(HAND, batch=2))
    step = estimate.phase("optimizer step")
    assert step.bytes_of("parameters") == 4 * 1304
    assert step.bytes_of("gradients") == 4 * 1304
    assert step.bytes_of("optimizer state") == 8 * 1304
    assert step.bytes_of("optimizer temporaries") == 4 * 1304
    assert step.total == 20 * 1304 + 64
    fused = estimate_memory(TrainingPlan(HAND, batch=2, optimizer="lmcore-fused"))
    assert fused.phase("optimizer step").total == 16 * 1304 + 64
    # bf16: moments in the parameters' dtype, as bench runs every AdamW; float32 ones named
    for moments, state in ((None, 4), (4, 8)):
        plan = TrainingPlan(HAND, batch=2, precision="bf16", optimizer="lmcore-fused",
                            moment_bytes=moments)  # fmt: skip
        step = estimate_memory(plan).phase("optimizer step")
        assert step.bytes_of("optimizer state") == state * 1304


def test_block_residuals_by_hand():
    # fp32, naive attention, b=2, s=4 (T=8 tokens), d=8, f=12, h=2:
    #   norms: input, x·rms, output: 3 × 4·T·d, twice          = 6 × 256 = 1536
    #          rsqrt: 4·T, twice                               = 64
    #   attention: q, k, contiguous v, merged output: 4·4·T·d  = 1024
    #              softmax output 4·b·h·s² = 4·2·2·16          = 256
    #              causal mask s² (bool)                       = 16
    #   FFN: w1 x, SiLU, w3 x, product: 4 × 4·T·f = 4 × 384    = 1536
    residuals = block_residuals(HAND, batch=2, seq_len=4, regime="fp32")
    assert total_bytes(residuals) == 1536 + 64 + 1024 + 256 + 16 + 1536
    assert combined_formula(residuals) == "40·T·d + 8·T + s² + 4·b·h·s² + 16·T·f"


def test_checkpointing_forms():
    assert Checkpointing.parse("none", 3).segments == ((0, 1, "plain"), (1, 2, "plain"),
                                                       (2, 3, "plain"))  # fmt: skip
    assert Checkpointing.parse("every:2", 4).segments == (
        (0, 1, "plain"), (1, 2, "segment"), (2, 3, "plain"), (3, 4, "segment"),
    )  # fmt: skip
    assert Checkpointing.parse("segments:3", 7).segments == (
        (0, 3, "segment"), (3, 6, "segment"), (6, 7, "segment"),
    )  # fmt: skip
    assert Checkpointing.parse("nested", 9).segments == (
        (0, 3, "nested"), (3, 6, "nested"), (6, 9, "nested"),
    )  # fmt: skip
    assert Checkpointing.parse("blocks", 5).recomputed_block_forwards == 5
    assert Checkpointing.parse("nested:2", 5).recomputed_block_forwards == 10
    for bad in ("segments", "every:0", "blocks:2", "sqrt", "segments:x"):
        with pytest.raises(ValueError):
            Checkpointing.parse(bad, 4)


@pytest.mark.parametrize("num_layers", [1, 2, 5, 7, 12, 30, 48])
def test_nested_runs_are_the_segments_lmcore_applies(num_layers):
    """The planner reads lmcore's plan, so bare `nested` splits where lmcore's rule does."""
    k = lmcore.ActivationCheckpointing.parse("nested").nested_segment_size(num_layers)
    runs = Checkpointing.parse("nested", num_layers).segments
    assert [b - a for a, b, _ in runs[:-1]] == [k] * (len(runs) - 1)
    assert runs[-1][1] == num_layers and {kind for *_, kind in runs} == {"nested"}


def test_checkpointed_forward_keeps_only_the_checkpoints():
    # Every block checkpointed: the forward keeps each block's input X = 4·T·d = 256 B (fp32),
    # and backward rebuilds one block (A_block = 4432 B by hand, above) at a time.
    plan = TrainingPlan(HAND, batch=2, activation_checkpointing="blocks", mode="forward-backward")
    estimate = estimate_memory(plan)
    head = total_bytes(head_residuals(HAND, batch=2, seq_len=4, regime="fp32"))
    assert estimate.phase("forward end").bytes_of("activations") == 2 * 256 + head
    worst = max((p for p in estimate.phases if p.name.startswith("backward, block")),
                key=lambda p: p.total)  # fmt: skip
    # block 1 (the first through backward): X of block 0, its own X and rebuilt residuals, ids
    assert worst.bytes_of("activations") in (2 * 256 + 4432 + 8 * 8, 256 + 4432 + 8 * 8)


def test_selective_keeps_each_blocks_attention_output_beside_its_checkpoint():
    # SDPA, fp32, T = 8 tokens: K = the attention output 4·T·d = 256 B and the logsumexp
    # 4·b·h·s = 64 B, kept beside each block's X; backward rebuilds the rest of one block.
    config = dataclasses.replace(HAND, attention="sdpa")
    ckpt = Checkpointing.parse("selective", 2)
    assert ckpt.segments == ((0, 1, "selective"), (1, 2, "selective"))
    assert ckpt.recomputed_block_forwards == 2
    assert (ckpt.recomputed_attention_forwards("sdpa"), ckpt.recomputed_attention_forwards(
        "naive")) == (0, 2)  # fmt: skip

    def estimate(policy: str, model: lmcore.ModelConfig = config):
        return estimate_memory(TrainingPlan(model, batch=2, activation_checkpointing=policy,
                                            mode="forward-backward"))  # fmt: skip

    def worst_backward(e) -> tuple[int, int]:  # (its block, its activations)
        phase = next(p for p in e.phases if p.name.startswith("backward, block"))
        return int(phase.name.split()[-1]), phase.bytes_of("activations")

    blocks, selective = estimate("blocks"), estimate("selective")
    forward = [e.phase("forward end").bytes_of("activations") for e in (blocks, selective)]
    assert forward[1] - forward[0] == 2 * (256 + 64)
    # backward of block i: the blocks before it keep K each, beyond blocks' X
    (i, theirs), (j, ours) = worst_backward(blocks), worst_backward(selective)
    assert i == j and ours - theirs == i * (256 + 64)
    # a backend whose output cannot be kept: selective predicts what blocks does
    naive = dataclasses.replace(HAND, attention="naive")
    assert estimate("selective", naive).peak.total == estimate("blocks", naive).peak.total


def test_materialized_loss_by_hand():
    # T = 8 tokens, V = 11, fp32, logits held: logits 4·T·V, logits − max 4·T·V, exp 4·T·V,
    # targets 8·T, logsumexp input 4·T; backward adds one fp32 gradient 4·T·V.
    loss = loss_memory(HAND, batch=2, seq_len=4, regime="fp32", loss="materialized")
    tv = 8 * 11
    assert loss.saved_bytes == 12 * tv + 12 * 8
    assert loss.backward_peak == 16 * tv + 12 * 8


def test_fused_loss_by_hand():
    # T = 8, d = 8, V = 11, fp32, chunks of 3 tokens: the forward holds the head's input 4·T·d,
    # a float32 loss per token 4·T, dh 4·T·d, dW's float32 accumulator 4·V·d and a chunk of
    # logits 4·3·V beside the targets 8·T; dh and dW (no rounded copy in fp32) wait for backward.
    fused = loss_memory(HAND, batch=2, seq_len=4, regime="fp32", loss="fused", chunk_tokens=3)
    td, vd = 8 * 8, 11 * 8
    assert fused.saved_bytes == 8 * 8  # the targets
    assert fused.held == 4 * td + 4 * vd
    assert fused.forward_peak == 8 * 8 + 4 * td + 4 * 8 + 4 * td + 4 * vd + 4 * 3 * 11
    assert fused.backward_peak == 8 * 8 + 4 * td + 4 * vd
    # bf16: dW's float32 accumulator and its bf16 rounding together at the end of the forward
    bf16 = loss_memory(HAND, batch=2, seq_len=4, regime="bf16", loss="fused", chunk_tokens=1)
    assert bf16.held == 2 * td + 2 * vd
    assert bf16.forward_peak == 8 * 8 + 2 * td + 4 * 8 + 2 * td + 4 * vd + 2 * vd


def test_chunked_loss_by_hand():
    # the torch-native loss: a bf16 chunk of logits and its float32 copy in the forward; in
    # backward the chunk again, its float32 gradient, dh, and dW's sum beside this chunk's
    chunked = loss_memory(HAND, batch=2, seq_len=4, regime="bf16", loss="chunked", chunk_tokens=3)
    assert (chunked.held, chunked.saved_bytes) == (0, 8 * 8)
    assert chunked.forward_peak == 8 * 8 + (2 + 4) * 3 * 11
    assert chunked.backward_peak == 8 * 8 + (2 + 4) * 3 * 11 + 2 * 8 * 8 + 2 * 2 * 11 * 8


def test_loss_chunks_follow_lmcore():
    # 1 GiB of bf16 logits: 3,456 of the leaderboard's 32,768 tokens (a multiple of 128)
    assert loss_chunk_tokens(32_768, 151_936, 2) == 3456
    assert loss_chunk_tokens(8, 11, 4) == lmcore.chunk_rows(8, 11, torch.float32) == 8


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fused_loss_holds_what_lmcore_saves(dtype):
    """What autograd keeps of lmcore's fused loss, dh and dW in their inputs' dtypes, is what
    the model holds for its backward."""
    torch.manual_seed(0)
    hidden = torch.randn(2, 4, 8, dtype=dtype, requires_grad=True)  # (batch, seq, d)
    weight = torch.randn(11, 8, dtype=dtype, requires_grad=True)  # (V, d)
    targets = torch.randint(11, (2, 4))
    saved = lmcore.saved_activation_bytes(
        lambda h, w: lmcore.fused_linear_cross_entropy(h, w, targets), hidden, weight
    )
    regime = "fp32" if dtype == torch.float32 else "bf16"
    loss = loss_memory(HAND, batch=2, seq_len=4, regime=regime, loss="fused")
    assert saved == loss.held


def _graph_residual_bytes(root: torch.autograd.graph.Node, exclude: set[int]) -> int:
    """Bytes of the distinct storages the autograd graph under `root` keeps for backward (0-d
    tensors and storages in `exclude` left out)."""
    seen: dict[int, int] = {}
    nodes, stack = set(), [root]
    while stack:
        node = stack.pop()
        if node is None or node in nodes:
            continue
        nodes.add(node)
        tensors = []
        for name in dir(node):
            if name.startswith("_saved_"):
                with contextlib.suppress(RuntimeError):
                    value = getattr(node, name)
                    tensors += value if isinstance(value, tuple | list) else [value]
        for t in tensors:
            if isinstance(t, torch.Tensor) and t.dim() > 0:
                key = t.untyped_storage().data_ptr()
                if key not in exclude:
                    seen[key] = t.untyped_storage().nbytes()
        stack += [n for n, _ in node.next_functions]
    return sum(seen.values())


@pytest.mark.parametrize(
    ("regime", "attention", "kv_heads"),
    [
        ("fp32", "naive", None),
        ("fp32", "naive", 1),
        ("fp32", "sdpa", None),
        ("fp32", "sdpa", 1),
        ("bf16", "naive", None),
        ("bf16", "sdpa", 1),
        # CPU autocast keeps softmax in bf16 (CUDA's runs it in fp32), so the autocast case uses
        # a fused kernel, where the two agree.
        ("autocast", "sdpa", None),
    ],
)
def test_residuals_equal_what_the_autograd_graph_holds(regime, attention, kv_heads):
    torch.manual_seed(0)
    config = lmcore.ModelConfig(
        vocab_size=37, context_length=12, d_model=24, num_layers=2, num_heads=4, d_ff=40,
        attention=attention, num_kv_heads=kv_heads,
    )  # fmt: skip
    model = lmcore.TransformerLM.from_config(config)
    if regime == "bf16":
        model = model.to(torch.bfloat16)
    b, s = 3, 11
    x, y = torch.randint(37, (b, s)), torch.randint(37, (b, s))
    exclude = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=regime == "autocast")
    with autocast:
        loss = lmcore.cross_entropy(model(x), y)
    held = _graph_residual_bytes(loss.grad_fn, exclude)
    kw = {"batch": b, "seq_len": s, "regime": regime}
    predicted = (
        config.num_layers * total_bytes(block_residuals(config, **kw))
        + total_bytes(head_residuals(config, **kw))
        + loss_memory(config, **kw, loss="materialized", hold_logits=False).saved_bytes
    )
    assert held == predicted


def test_fsdp_shards_by_hand():
    # 3 ranks: every weight flattened and padded to a multiple of 3, norm gains whole.
    #   embedding 88 -> 30; q, k, v, o 64 -> 22 each; w1, w2, w3 96 -> 32 each; head 88 -> 30
    plan = TrainingPlan(HAND, batch=3, layout="fsdp", dp=3)
    per_device = 30 + 2 * (4 * 22 + 3 * 32 + 2 * 8) + 8 + 30
    step = estimate_memory(plan).phase("optimizer step")
    assert step.bytes_of("parameters") == 4 * per_device
    assert step.bytes_of("gradients") == 4 * per_device
    assert step.bytes_of("optimizer state") == 8 * per_device


def test_zero1_shards_optimizer_state_by_owner():
    plan = TrainingPlan(HAND, batch=4, layout="zero1", dp=2, optimizer="lmcore-fused")
    step = estimate_memory(plan).phase("optimizer step")
    sizes = [p.numel for p in model_parameters(HAND)]
    owners = zero.partition_by_numel(sizes, 2)
    busiest = max(sum(n for n, o in zip(sizes, owners, strict=True) if o == r) for r in (0, 1))
    assert HAND_PARAMS / 2 <= busiest <= HAND_PARAMS / 2 + max(sizes)
    assert step.bytes_of("optimizer state") == 8 * busiest
    assert step.bytes_of("parameters") == step.bytes_of("gradients") == 4 * HAND_PARAMS


def test_tensor_parallel_splits_by_hand():
    # TP 2: q, k, v, w1, w3 split by rows, o and w2 by columns, embedding and head by vocabulary
    # (11 -> 6 rows each), norms whole.
    plan = TrainingPlan(HAND, batch=2, layout="tp", tp=2)
    per_device = 6 * 8 + 2 * (8 + 4 * 32 + 8 + 3 * 48) + 8 + 6 * 8
    step = estimate_memory(plan).phase("optimizer step")
    assert step.bytes_of("parameters") == 4 * per_device


def test_mixed_precision_master_weights():
    # bf16-master: bf16 weights and gradients (2 B each), fp32 masters (4 B) and moments (8 B)
    step = estimate_memory(
        TrainingPlan(HAND, batch=2, precision="bf16-master", optimizer="lmcore-fused")
    ).phase("optimizer step")
    assert step.total - 64 == (2 + 2 + 4 + 8) * HAND_PARAMS


def test_largest_batch_and_context_fit_and_the_next_does_not():
    config = lmcore.model_config("tiny", context_length=64)
    plan = TrainingPlan(config, batch=2, layout="ddp", dp=2)
    memory = estimate_memory(plan).peak.total * 3
    batch = largest_batch(plan, memory)
    assert batch % 2 == 0
    assert estimate_memory(dataclasses.replace(plan, batch=batch)).fits(memory)
    assert not estimate_memory(dataclasses.replace(plan, batch=batch + 2)).fits(memory)
    seq = largest_seq_len(plan, memory)
    longer = dataclasses.replace(config, context_length=seq + 1)
    assert not estimate_memory(dataclasses.replace(plan, model=longer, seq_len=seq + 1)).fits(
        memory
    )
    assert largest_batch(plan, 1000) is None


def test_least_recompute_fit_picks_the_cheapest_form_that_fits():
    plan = TrainingPlan(HAND, batch=2, mode="forward-backward")
    peaks = {
        c: estimate_memory(dataclasses.replace(plan, activation_checkpointing=c)).peak.total
        for c in checkpointing_candidates(2)
    }
    assert set(peaks) == {"none", "every:2", "blocks", "selective", "segments:2", "nested"}
    # enough for everything: nothing recomputed
    assert least_recompute_fit(plan, max(peaks.values())).plan.activation_checkpointing == "none"
    # just enough for the smallest peak: some checkpointing, and one with that peak
    smallest = min(peaks.values())
    chosen = least_recompute_fit(plan, smallest)
    assert chosen.peak.total == smallest and chosen.plan.activation_checkpointing != "none"
    assert least_recompute_fit(plan, smallest - 1) is None


def test_least_recompute_prefers_keeping_attention_where_it_fits():
    # a fused attention at a long context: selective recomputes the blocks without their
    # attention, fewer FLOPs than blocks for the memory of one attention output more per block
    config = lmcore.ModelConfig(vocab_size=11, context_length=256, d_model=16, num_layers=4,
                                num_heads=2, d_ff=16, attention="sdpa")  # fmt: skip
    plan = TrainingPlan(config, batch=2, mode="forward-backward", loss="fused")
    forms = ["blocks", "selective"]
    peaks = {
        c: estimate_memory(dataclasses.replace(plan, activation_checkpointing=c)).peak.total
        for c in forms
    }
    assert peaks["selective"] > peaks["blocks"]
    chosen = least_recompute_fit(plan, peaks["selective"], candidates=forms)
    assert chosen.plan.activation_checkpointing == "selective"
    chosen = least_recompute_fit(plan, peaks["selective"] - 1, candidates=forms)
    assert chosen.plan.activation_checkpointing == "blocks"


def test_least_memory_balances_checkpoints_against_one_recomputed_segment():
    # One level of recomputation over L blocks: segments of K blocks keep ⌈L/K⌉ inputs X and
    # rebuild K blocks' residuals A at once, about (L/K)·X + K·A, least near K = √(L·X/A).
    # Here A ≈ 14·X (fp32, a fused attention kernel, d = f) and L = 128: K ≈ 3, so neither every
    # block (K = 1) nor one segment (K = L) is best.
    config = lmcore.ModelConfig(vocab_size=11, context_length=64, d_model=8, num_layers=128,
                                num_heads=2, d_ff=8, attention="sdpa")  # fmt: skip
    plan = TrainingPlan(config, batch=2, mode="forward-backward", loss="fused")
    single_level = ["blocks", *(f"segments:{k}" for k in (2, 3, 4, 8, 128))]
    best = least_memory(plan, candidates=single_level)
    peaks = {
        c: estimate_memory(dataclasses.replace(plan, activation_checkpointing=c)).peak.total
        for c in single_level
    }
    assert best.peak.total == min(peaks.values())
    assert best.plan.activation_checkpointing not in ("blocks", "segments:128")


def test_plan_refuses_what_does_not_exist():
    with pytest.raises(ValueError, match="does not split over 2"):
        TrainingPlan(HAND, batch=3, layout="ddp", dp=2)
    with pytest.raises(ValueError, match="no data-parallel ranks"):
        TrainingPlan(HAND, batch=2, dp=2)
    with pytest.raises(ValueError, match="tp=3 must divide"):
        TrainingPlan(HAND, batch=2, layout="tp", tp=3)
    with pytest.raises(ValueError, match="bf16-master"):
        TrainingPlan(HAND, batch=2, layout="fsdp", precision="bf16-autocast")
    with pytest.raises(ValueError, match="precision must be one of"):
        TrainingPlan(HAND, batch=2, precision="fp8")
    with pytest.raises(ValueError, match="unknown attention"):
        estimate_memory(TrainingPlan(dataclasses.replace(HAND, attention="mine"), batch=2))


def test_parse_memory():
    assert parse_memory("80GB") == 80 * 10**9
    assert parse_memory("80 GiB") == 80 * 2**30
    assert parse_memory("1.5tb") == 1.5e12
    for bad in ("80", "-3GB", "lots", "80XB"):
        with pytest.raises(ValueError, match="memory size"):
            parse_memory(bad)


def test_tensor_sizes_equal_bench_zeros_measured_ones(zero_run):
    # bench-zero on 2 gloo ranks reports the bytes of each rank's parameter, gradient and
    # optimizer-state tensors (the largest rank); the plan of each variant predicts them.
    config = zero_run.config
    model = lmcore.model_config(
        config["size"], context_length=config["context_length"], vocab_size=config["vocab_size"]
    )
    layouts = ("ddp:torch", "zero1:torch-ddp", "fsdp", "fsdp:no-prefetch")
    # bench-zero counts whole storages, and on the CPU two kinds of 4-byte bookkeeping ride
    # along: torch AdamW's step counter per parameter (on the GPU it lives on the host) and
    # zero.FSDP's "any rank had a gradient" flag beside each replicated gain's gradient. So the
    # measured bytes may exceed the prediction by at most 4 B per parameter tensor.
    slack = 4 * len(model_parameters(model))
    checked = 0
    for row in zero_run.rows:
        if row["variant"] not in layouts:
            continue
        precision = "bf16-master" if row["compute_dtype"] == "bf16" else "fp32"
        if row["storage_dtype"] == "bf16":  # the model stored in bf16, moments too
            precision = "bf16"
        plan = TrainingPlan(
            model, batch=config["batch"] * 2, layout=row["variant"], dp=2, precision=precision
        )  # fmt: skip
        step = estimate_memory(plan).phase("optimizer step")
        assert row["param_mib"] * 2**20 == step.bytes_of("parameters"), row
        for key, name in (("grad", "gradients"), ("state", "optimizer state")):
            extra = row[f"{key}_mib"] * 2**20 - step.bytes_of(name)
            assert 0 <= extra <= slack, (row, key, extra)
        checked += 1
    # ddp:torch, zero1:torch-ddp at two caps, both fsdp rows in three dtypes (bf16 storage)
    assert checked == 9


def test_fsdp_gathers_the_embedding_and_head_around_their_own_passes():
    """zero.FSDP's units (`Layout.units`): the LM head gathered at the loss alone (the blocks
    freed), the embedding and its full gradient at the end of the backward; FSDP2's root keeps
    both gathered throughout, as a row recorded before the units did (`head_units=False`), but
    FSDP2 reshards every block after its forward: at the loss only the root is gathered, then
    the last block, which the root's pre-backward prefetches."""
    common = {"batch": 2, "dp": 2, "precision": "bf16", "loss": "fused"}
    ours = estimate_memory(TrainingPlan(HAND, layout="fsdp", **common))
    theirs = estimate_memory(TrainingPlan(HAND, layout="fsdp:torch", **common))
    before = estimate_memory(TrainingPlan(HAND, layout="fsdp", head_units=False, **common))
    vd = 2 * 11 * 8  # one bf16 V × d weight (88 elements split evenly over 2 ranks)
    block = 2 * (4 * 8 * 8 + 3 * 8 * 12)  # one block's bf16 matrices

    def buffers(estimate, phase):
        return estimate.phase(phase).bytes_of("communication buffers")

    assert buffers(ours, "forward end") == vd
    assert buffers(ours, "backward, loss") == vd + block  # and the last block prefetched
    assert buffers(ours, "backward end") == 2 * vd
    assert buffers(theirs, "forward end") == 2 * vd  # the root alone
    assert buffers(theirs, "backward, loss") == 2 * vd + block  # and the last block prefetched
    assert buffers(theirs, "backward end") == 2 * 2 * vd  # the root and its gradients
    assert buffers(before, "forward end") == 2 * vd + 3 * block  # zero.FSDP's root, 3 units
    assert buffers(before, "backward end") == buffers(theirs, "backward end")


# (layers, batch, the block whose backward is the worst): the first and last block at once, the
# first, one between, the last
@pytest.mark.parametrize(
    ("layers", "batch", "worst"), [(1, 2, 0), (2, 2, 0), (3, 2, 1), (3, 64, 2)]
)
def test_fsdp2_holds_one_block_more_only_where_torch_prefetches_or_reduces(layers, batch, worst):
    """FSDP2 while block i runs its backward (torch's `_fsdp_param_group.py`): block i
    gathered, plus block i - 1's prefetched all-gather unless i is the first block; block i's
    full-size gradients, plus block i + 1's reduce-scatter input unless i is the last block;
    the shards of the blocks after i, not block i's (its reduce-scatter comes after)."""
    config = dataclasses.replace(HAND, num_layers=layers)
    plan = TrainingPlan(config, batch=batch, dp=2, layout="fsdp:torch", precision="bf16",
                        activation_checkpointing="blocks")  # fmt: skip
    (phase,) = [p for p in estimate_memory(plan).phases if p.name.startswith("backward, block")]
    assert phase.name == f"backward, block {worst}"
    vd = 2 * 11 * 8  # one bf16 V × d weight, full-size
    block = 2 * (4 * 8 * 8 + 3 * 8 * 12)  # one block's bf16 matrices, full-size
    shard = 2 * (8 + 8 + (4 * 8 * 8 + 3 * 8 * 12) // 2)  # its norm gains whole, the rest halved
    units = (1 + (worst > 0)) + (1 + (worst < layers - 1))
    # the root (embedding, head) gathered, the head's full-size gradient, the units
    assert phase.bytes_of("communication buffers") == 2 * vd + vd + units * block
    assert phase.bytes_of("gradients") == 2 * 8 + (layers - 1 - worst) * shard  # final norm


def _inductor_partition(gm: torch.fx.GraphModule, inputs: list) -> object:
    """A torch.compile backend that partitions the joint graph as inductor does (its min-cut
    partitioner, its decompositions) and runs the two graphs without generating kernels: what
    a block compiled by inductor keeps for backward, measured on the CPU."""
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    from torch._inductor.decomposition import select_decomp_table

    def run(graph: torch.fx.GraphModule, _: list) -> object:
        return make_boxed_func(graph.forward)

    return aot_module_simplified(
        gm, inputs, fw_compiler=run, bw_compiler=run,
        partition_fn=min_cut_rematerialization_partition, decompositions=select_decomp_table(),
    )  # fmt: skip


@pytest.mark.parametrize(("dtype", "kv_heads"), [(torch.bfloat16, None), (torch.float32, 1)])
def test_a_compiled_blocks_residuals_are_what_inductors_partition_keeps(dtype, kv_heads):
    config = lmcore.ModelConfig(
        vocab_size=37, context_length=24, d_model=32, num_layers=1, num_heads=4, d_ff=88,
        attention="sdpa", num_kv_heads=kv_heads,
    )  # fmt: skip
    torch.manual_seed(0)
    block = lmcore.TransformerLM.from_config(config).layers[0].to(dtype)
    x = torch.randn(3, 24, 32, dtype=dtype, requires_grad=True)  # (batch, seq, d)
    torch._dynamo.reset()
    kept = lmcore.saved_activation_bytes(torch.compile(block, backend=_inductor_partition), x)
    regime = "bf16" if dtype == torch.bfloat16 else "fp32"
    predicted = block_residuals(config, batch=3, seq_len=24, regime=regime, compiled=True)
    assert kept == total_bytes(predicted)
    eager = block_residuals(config, batch=3, seq_len=24, regime=regime)
    assert total_bytes(predicted) < total_bytes(eager)


def test_a_compiled_checkpointed_block_recomputes_beside_its_input_and_one_ffn_gradient():
    """A block compiled by inductor under `blocks` checkpointing: its recomputed residuals
    include its input, the tensor the checkpoint kept (counted once), and its backward adds one
    `T·f` and one `T·d` gradient beyond them (`block_backward_working_set`); eager blocks, and
    compiled ones whose partition is not known (naive attention), keep the eager estimate."""
    config = dataclasses.replace(HAND, attention="sdpa")
    plan = TrainingPlan(config, batch=2, precision="bf16", activation_checkpointing="blocks",
                        compiled=True)  # fmt: skip
    (phase,) = [p for p in estimate_memory(plan).phases if p.name.startswith("backward, block")]
    i = int(phase.name.rsplit(" ", 1)[1])
    tokens = 2 * 4
    x = 2 * tokens * 8  # a checkpoint's input, bf16
    kept = total_bytes(block_residuals(config, batch=2, seq_len=4, regime="bf16", compiled=True))
    assert phase.bytes_of("activations") == i * x + kept + 8 * tokens  # and the token ids
    assert phase.bytes_of("backward working set") == 2 * tokens * (12 + 8)
    kw = {"batch": 2, "seq_len": 4, "regime": "bf16"}
    eager = block_backward_working_set(config, **kw)
    assert eager.num_bytes == 2 * 3 * tokens * 12 + 4 * tokens * 8  # 3 T·f and 2 T·d gradients
    naive = dataclasses.replace(config, attention="naive")
    assert block_backward_working_set(naive, **kw, compiled=True) == block_backward_working_set(
        naive, **kw
    )


@pytest.mark.gpu
def test_cuda_a_compiled_checkpointed_blocks_backward_peaks_as_predicted():
    """On CUDA, the backward of one compiled block under a non-reentrant checkpoint rises above
    what was alive before it (the checkpoint's input, the output and its gradient) by the
    recomputed residuals less that input, one `T·f` gradient and w2's weight gradient
    (`block_backward_working_set`'s moment), not by the eager estimate's three `T·f`."""
    from torch.utils.checkpoint import checkpoint

    config = lmcore.ModelConfig(
        vocab_size=37, context_length=4096, d_model=256, num_layers=1, num_heads=4, d_ff=688,
        attention="sdpa",
    )  # fmt: skip
    torch.manual_seed(0)
    block = lmcore.TransformerLM.from_config(config).layers[0].to("cuda", torch.bfloat16)
    block.compile()
    x = torch.randn(2, 4096, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)
    for _ in range(2):  # compile, and the libraries' workspaces
        checkpoint(block, x, use_reentrant=False).backward(dy)
    for p in block.parameters():
        p.grad = None
    y = checkpoint(block, x, use_reentrant=False)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    y.backward(dy)
    torch.cuda.synchronize()
    rise = torch.cuda.max_memory_allocated() - before
    kw = {"batch": 2, "seq_len": 4096, "regime": "bf16"}
    saved = total_bytes(block_residuals(config, **kw, compiled=True))
    x_bytes, w2 = 2 * x.numel(), 2 * 256 * 688
    working = block_backward_working_set(config, **kw, compiled=True).num_bytes
    predicted = saved - x_bytes + working - x_bytes + w2  # dy is alive before: not a rise
    assert abs(rise - predicted) <= 0.05 * predicted, (rise, predicted)


@pytest.mark.parametrize("layout", ["single", "fsdp", "fsdp:torch"])
def test_while_the_blocks_run_backward_the_embeddings_gradient_does_not_exist_yet(layout):
    # HAND in fp32: the head's 88 and the final norm's 8 elements, and 560 per block, whole on
    # one device or split over 2 (norm gains whole); FSDP2's root holds the head's gradient
    # full-size until the end, not as a shard, and block i's shard comes after its backward
    dp = 1 if layout == "single" else 2
    estimate = estimate_memory(TrainingPlan(HAND, batch=2, dp=dp, layout=layout))
    (phase,) = [p for p in estimate.phases if p.name.startswith("backward, block")]
    i = int(phase.name.rsplit(" ", 1)[1])
    block = 560 if dp == 1 else 2 * 8 + (560 - 2 * 8) // 2
    head = {"single": 88, "fsdp": 44, "fsdp:torch": 0}[layout]
    after = 2 - i - (layout == "fsdp:torch")  # blocks whose gradients exist
    assert phase.bytes_of("gradients") == 4 * (head + 8 + after * block)
