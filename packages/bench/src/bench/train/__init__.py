"""bench-train: train `lmcore.TransformerLM` on a text or token file with every part of the project.

One owner per concern, in the order a run meets them:

- `config`: `TrainConfig`, every option once (default, help, group, whether a resume may change
  it); `options`: the command line and config files generated from it; `choices`: the names
  `--precision`, `--parallel` and `--baseline` offer;
- `data` (token files, the cache, `Batches`) and `tokenizer` (bytes, BPE);
- `lm`: the model, its loss and its optimizer as lmcore makes them (where new lmcore options
  plug in);
- `parallel`: the one reader of `--parallel`: wrapping and compiling, the optimizer, who writes
  which checkpoint, gathering the full weights;
- `checkpoint`: resume checks, saving and restoring; `record`: metrics, TensorBoard, speed, MFU,
  the profiler; `baseline`: torch's own step (`--baseline torch`);
- `loop`: `Trainer`, which builds the parts once and steps; `run`: the `bench-train` entry
  point and the run's outputs; `generate`: `bench-generate`, sampling from a saved run;
  `results`: `bench-train-results`, result files and the speed table from run folders.

The trainer and the tools (`bench.tools`) never import each other; both build on `bench.core`.
"""

import importlib
from typing import Any

# Imported on first use (PEP 562), so that the command lines can read `bench.train.config` (the
# options) without importing torch.
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
