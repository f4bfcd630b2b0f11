"""bench-train: train `lmcore.TransformerLM` on a text or token file with every part of the project.

One owner per concern, in the order a run meets them:

- `config`: `TrainConfig`, every option once (default, help, group, whether a resume may change
  it; the command line is generated from it by `bench.core.options`); `config_checks`: what
  `TrainConfig.validate` refuses, alone and together; `config_files`: the config files
  `--config` reads and every run writes; `choices`: the names `--precision`, `--parallel`
  and `--baseline` offer (subsets of `bench.core.layouts`);
- `data` (token files, the cache, `Batches`) and `tokenizer` (bytes, BPE);
- `lm`: the model, its loss and its optimizer as lmcore makes them (where new lmcore options
  plug in);
- `parallel`: the one reader of `--parallel` in the trainer: who writes which checkpoint,
  gathering the full weights (wrapping and the optimizer are `bench.core.parallel`'s);
- `checkpoint`: resume checks, saving and restoring; `record`: metrics, TensorBoard, speed, MFU,
  the profiler; `baseline`: torch's own step (`--baseline torch`, on bench-step's torch-native
  model);
- `loop`: `Trainer`, which builds the parts once and steps; `run`: the `bench-train` entry
  point and the run's outputs; `generate`: `bench-generate`, sampling from a saved run;
  `summary`: a finished run's folder read back, and the speed table; `results` and `scaling`:
  `bench-train-results`' result files.

The trainer and the tools (`bench.tools`) never import each other; both build on `bench.core`.
"""

import importlib
from typing import Any

# Imported on first use (PEP 562), so that the command lines can read `bench.train.config` (the
# options) without importing torch. lmcore and ddp carry the same few lines on purpose: the
# packages are independent by design, so none imports a shared loader from another.
_MODULE_OF = {
    "TrainConfig": "bench.train.config",
    "Trainer": "bench.train.loop",
    "load_run": "bench.train.generate",
    "sample": "bench.train.generate",
    "prepare": "bench.train.run",
    "run_train": "bench.train.run",
}

__all__ = ["TrainConfig", "Trainer", "load_run", "prepare", "run_train", "sample"]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_MODULE_OF})
