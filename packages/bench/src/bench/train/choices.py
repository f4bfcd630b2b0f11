"""The names bench-train's `--precision` and `--parallel` offer (subsets of the harness's one
vocabulary, `bench.core.layouts`), what `--baseline` sets, and the options bench-generate shares:
plain Python (no torch), so that the command lines are built before anything heavy is imported.
`TrainConfig` offers them; the code they select reads them from here too (`bench.train.parallel`
the layouts, `bench.train.generate` the precisions and `SAMPLING`). The model options' names are
the tools' shared ones (`bench.core.model_options`).
"""

from __future__ import annotations

from bench.core.layouts import layout_names

__all__ = ["BASELINES", "PARALLEL_MODES", "PRECISIONS", "SAMPLING"]

# `--precision`: float32; float32 weights computed in bf16 or (with loss scaling) fp16 under
# autocast; the model stored in bf16 (`bench.core.layouts.PRECISIONS` says what each keeps).
PRECISIONS = ("fp32", "bf16-autocast", "fp16", "bf16")
# `--parallel`: every layout that runs but bench-zero's comparisons of optimizers and
# prefetching (see `bench.core.layouts`; `bench.train.parallel` applies them).
PARALLEL_MODES = layout_names(
    runs=True, exclude=("zero1:torch-ddp", "zero1:torch", "fsdp:no-prefetch")
)
# `--baseline NAME`: the options a baseline runs with (given otherwise, they are an error). Its
# loss is its own (`bench.train.baseline`: torch's cross-entropy over checkpointed chunks), so
# `--loss` is refused beside it.
BASELINES = {"torch": {"attention": "sdpa", "optimizer": "torch-fused", "compile": True}}
# bench-train's options that bench-generate takes too (their defaults: the run's).
SAMPLING = ("generate", "prompt", "temperature", "top_p", "seed")
