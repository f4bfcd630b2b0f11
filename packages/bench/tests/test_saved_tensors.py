"""Residuals of one TransformerBlock: the saved-tensor log against a count by hand."""

import pytest
import torch

from bench.commands.model import main
from bench.tools.model.residuals import (
    RESIDUAL_COLUMNS,
    SavedTensorLog,
    measure_block,
    run_residual_study,
)
from lmcore import ModelSize, RotaryEmbedding, TransformerBlock

# Odd sizes, so that no two counts coincide: batch, sequence, width, heads, feed-forward width.
B, S, D, H, F = 2, 7, 12, 3, 20
FP32 = 4  # bytes


def _block() -> TransformerBlock:
    config = ModelSize(d_model=D, d_ff=F, num_layers=1, num_heads=H).config(context_length=S)
    rope = RotaryEmbedding(config.head_dim, S, theta=config.rope_theta)
    return TransformerBlock(config, rope=rope)


def _held_by_hand() -> int:
    """What one fp32 block with naive attention keeps for backward, storage by storage.

    Autograd saves only what a backward formula reads, and a storage saved twice is held once:

    - ln1 (RMSNorm): its input x (BSD), rsqrt(mean(x²) + eps) (BS) and x · rsqrt (BSD); the gain
      is a weight. Its output (BSD) is saved by q_proj and again by k_proj and v_proj.
    - RoPE saves only its cos/sin tables (buffers, not residuals).
    - Attention: the rotated q and k (BSD each) for the score matmul, the causal mask (S² bool
      bytes) for masked_fill, the softmax output (BHS²) for the softmax and again for the
      output matmul, v made contiguous for it (BSD), the heads merged back (BSD) for output_proj.
    - ln2 as ln1 (2·BSD + BS), its output (BSD) for w1 and w3.
    - SwiGLU: w1's output (BSF) for SiLU, SiLU's output and w3's output (BSF each) for the
      product, the product (BSF) for w2.
    """
    floats = (2 * B * S * D + B * S) + B * S * D  # ln1, and its output for q/k/v_proj
    floats += 2 * B * S * D + B * H * S * S + B * S * D + B * S * D  # q, k, softmax, v, merged
    floats += (2 * B * S * D + B * S) + B * S * D  # ln2, and its output for w1/w3
    floats += 4 * B * S * F  # SwiGLU
    return floats * FP32 + S * S  # + the bool mask


def _saved_twice_by_hand() -> int:
    """Saves of a storage already saved: what the handout's hook adds on top of `held`."""
    floats = 2 * (B * S + B * S * D)  # each RMSNorm's mul saves x and rsqrt again
    floats += 2 * B * S * D  # k_proj and v_proj save q_proj's input again
    floats += B * H * S * S  # the output matmul saves the softmax output again
    floats += B * S * D  # w3 saves w1's input again
    return floats * FP32


def test_one_block_saves_what_the_hand_count_says():
    torch.manual_seed(0)
    block = _block()
    x = torch.randn(B, S, D, requires_grad=True)
    result = measure_block(block, x)
    assert result.log.held_bytes == _held_by_hand()
    assert result.log.saved_bytes == _held_by_hand() + _saved_twice_by_hand()
    weights = 2 * D + 4 * D * D + 3 * D * F  # two gains, q/k/v/output, w1/w2/w3
    assert result.param_grad_bytes == weights * FP32
    assert result.input_grad_bytes == B * S * D * FP32
    assert result.grad_from_memory_bytes is None  # no allocator to read on a CPU


def test_operations_are_ranked_and_their_shares_add_up():
    torch.manual_seed(1)
    block = _block()
    result = measure_block(block, torch.randn(B, S, D, requires_grad=True))
    ranked = result.log.by_operation()
    sizes = [nbytes for _, nbytes, _ in ranked]
    assert sizes == sorted(sizes, reverse=True)
    assert sum(sizes) == result.log.held_bytes
    top = dict((op, nbytes) for op, nbytes, _ in ranked[:2])
    # the product saves SiLU's and w3's outputs; the two matmuls save q, k and v
    assert top == {"ffn mul": 2 * B * S * F * FP32, "attn matmul": 3 * B * S * D * FP32}


def test_checkpointing_keeps_only_the_input():
    torch.manual_seed(2)
    block = _block()
    x = torch.randn(B, S, D, requires_grad=True)
    plain = measure_block(block, x)
    kept = measure_block(block, x, checkpointed=True)
    assert kept.log.held_bytes == B * S * D * FP32
    assert kept.grad_bytes == plain.grad_bytes
    assert {r.function for r in kept.log.records} == {"checkpoint"}


def test_the_log_leaves_weights_out_and_needs_an_input_that_requires_grad():
    linear = torch.nn.Linear(5, 3, bias=False)
    with SavedTensorLog(linear) as log:
        linear(torch.randn(4, 5, requires_grad=True)).sum()
    assert [r.shape for r in log.records] == [(4, 5)]
    with pytest.raises(ValueError, match="require grad"):
        measure_block(linear, torch.randn(4, 5))


def test_study_rows_and_cli(capsys):
    shape = ("odd", ModelSize(d_model=D, d_ff=F, num_layers=1, num_heads=H))
    run = run_residual_study(
        [shape], context_lengths=(S,), batch=B, dtypes=("fp32", "bf16-autocast")
    )
    assert run.tool == "residuals" and run.columns == RESIDUAL_COLUMNS
    blocks = {(r["dtype"], r["checkpointing"]): r for r in run.rows if r["kind"] == "block"}
    assert set(blocks) == {(d, c) for d in ("fp32", "bf16-autocast") for c in ("none", "block")}
    assert blocks[("fp32", "none")]["mib"] * 2**20 == pytest.approx(_held_by_hand())
    ops = [r for r in run.rows if r["kind"] == "operation" and r["dtype"] == "fp32"]
    assert [r["rank"] for r in ops if r["checkpointing"] == "none"] == [1, 2, 3, 4, 5]
    argv = ["--d-model", str(D), "--d-ff", str(F), "--num-layers", "1", "--num-heads", str(H)]
    argv += ["--context-length", str(S), "--batch", str(B), "--study", "residuals"]
    assert main([*argv, "--device", "cpu", "--no-progress"]) == 0
    assert "all saved tensors" in capsys.readouterr().out
