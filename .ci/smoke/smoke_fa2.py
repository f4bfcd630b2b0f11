"""fa2 installed alone: forward and backward on the CPU, through the front door (tiled PyTorch)
and through the Triton kernels in Triton's CPU interpreter, against a float64 softmax."""

import os

# Read by Triton when it is first imported; without a GPU the kernels run in its interpreter.
os.environ.setdefault("TRITON_INTERPRET", "1")

import torch
from installed import check_installed, report

fa2 = check_installed("fa2")


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal softmax attention in float64, the key index ≤ the query index."""
    scores = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    n_q, n_k = scores.shape[-2:]
    mask = torch.ones(n_q, n_k, dtype=torch.bool).tril()
    return scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v


torch.manual_seed(0)
# (batch, heads, seq, head_dim), a sequence length that is no multiple of any tile.
q, k, v = (torch.randn(1, 2, 37, 16) for _ in range(3))
grad_out = torch.randn(1, 2, 37, 16)
q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
reference(q64, k64, v64).backward(grad_out.double())

paths = {
    "flash_attention": lambda a, b, c: fa2.flash_attention(a, b, c, causal=True),
    "FlashAttention2Triton": lambda a, b, c: fa2.FlashAttention2Triton.apply(a, b, c, True),
}
for name, attend in paths.items():
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = attend(*leaves)
    out.backward(grad_out)
    expected = [reference(q64, k64, v64).detach(), q64.grad, k64.grad, v64.grad]
    got = [out, *(t.grad for t in leaves)]
    for label, a, b in zip(("out", "dq", "dk", "dv"), got, expected, strict=True):
        torch.testing.assert_close(a.double(), b, atol=2e-4, rtol=2e-4, msg=f"{name} {label}")

report("fa2", "flash_attention and FlashAttention2Triton forward+backward match float64")
