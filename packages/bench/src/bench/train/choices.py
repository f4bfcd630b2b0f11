"""The names bench-train's `--precision`, `--parallel` and `--baseline` offer, and what a baseline
sets: plain Python (no torch), so that the command line is built before anything heavy is
imported. `TrainConfig` offers them (and turns `--precision` into a dtype); the code they select
reads them from here too (`bench.train.parallel` the modes, `bench.train.generate` the
precisions).
The model options' names are the tools' shared ones (`bench.core.model_options`).
"""

from __future__ import annotations

from bench.core.cli import LazyChoices

__all__ = ["BASELINES", "PARALLEL_MODES", "PRECISIONS"]

PRECISIONS = LazyChoices(fp32=None, bf16="torch:bfloat16")  # None: no autocast, fp32 throughout
# `--parallel`: see `bench.train.parallel`.
PARALLEL_MODES = (
    "none",
    "naive",
    "flat",
    "individual",
    "bucketed",
    "torch-ddp",
    "zero",
    "fsdp",
    "torch-fsdp",
)
# `--baseline NAME`: the options a baseline runs with (given otherwise, they are an error).
BASELINES = {
    "torch": {
        "attention": "sdpa",
        "optimizer": "torch-fused",
        "loss": "materialized",
        "compile": True,
    }
}
