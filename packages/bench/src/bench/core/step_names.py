"""The names bench-step's options offer for its steps (`bench.core.full_step` says what each
runs), in a module of their own so that the command offers them without importing torch."""

from __future__ import annotations

__all__ = ["PARALLEL", "PRECISIONS"]

# float32 throughout; float32 weights under bf16 autocast; the model built in bf16 (the
# leaderboard's `torch_dtype`: AdamW's moments in the parameters' dtype, but lmcore-fused's,
# which are float32).
PRECISIONS = ("fp32", "bf16-autocast", "bf16")
# Ours on several ranks: zero.FSDP, or ZeRO-1 (DDPBucketed + ShardedOptimizer).
PARALLEL = ("none", "fsdp", "zero")
