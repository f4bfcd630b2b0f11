"""Profiling and benchmarking harness for the cs336sys packages.

The shared plumbing every tool is built from:

- `bench.env`: where a measurement ran (`collect_env`, `command_line`).
- `bench.timing`: device-synchronised timers (`elapsed_ms`, `time_fn`, `time_with_setup`,
  `do_bench`, `summarize`).
- `bench.memory`: peak and current device memory (`reset_peak_memory`, `peak_memory`, ...).
- `bench.oom`: a measurement that runs out of memory marks its row `OOM` (`guarded`).
- `bench.results`: tidy rows + metadata (`Run`), Markdown tables, JSON (`save_json`, `load_json`).
- `bench.plots`: PNG plots drawn from rows (`line_plot`, `bar_plot`, `hbar_plot`,
  `stacked_bar_plot`).
- `bench.cli`: options and output handling shared by every `bench-*` command.
- `bench.attention_impls`, `bench.nvtx`, `bench.memviz`, `bench.hardware`: attention
  implementations by name, NVTX ranges, the offline memory-snapshot view, GPU peak FLOP/s.

The tools are modules with a `main` (the `bench-*` entry points, also `python -m bench.<tool>`)
and a plain function: `bench.model` (`run_model`, `run_warmup_study`), `bench.attn`
(`run_attention`), `bench.flash` (`run_flash`), `bench.precision` (`run_precision`),
`bench.allreduce`, `bench.ddp`, `bench.zero`, and `bench.report` (`build_report`).
"""

import importlib
from typing import Any

from bench.cli import (
    add_common_args,
    add_timing_args,
    cpu_default_notice,
    emit,
    make_parser,
    progress,
    resolve_device,
)
from bench.env import collect_env, command_line
from bench.hardware import peak_tflops
from bench.memory import (
    free_memory,
    memory_in_use,
    peak_memory,
    reset_peak_memory,
    to_mib,
)
from bench.oom import OK, OOM, Outcome, Unavailable, guarded, skipped
from bench.plots import Bars, bar_plot, hbar_plot, line_plot, stacked_bar_plot
from bench.results import SCHEMA, Run, load_json, result_stem, save_json, to_markdown
from bench.timing import (
    Summary,
    do_bench,
    elapsed_ms,
    summarize,
    synchronize,
    time_fn,
    time_with_setup,
)

# The tools' functions load on first use (PEP 562): importing them here would import each tool
# module before `python -m bench.<tool>` runs it as `__main__` (a second, divergent copy), and
# would make every `import bench` pay for lmcore and fa2.
_LAZY = {
    "IMPL_NAMES": "bench.attention_impls",
    "attention_impl": "bench.attention_impls",
    "AttnConfig": "bench.attn",
    "run_attention": "bench.attn",
    "PRESETS": "bench.flash",
    "FlashCase": "bench.flash",
    "attention_flops": "bench.flash",
    "run_flash": "bench.flash",
    "render_memory_snapshot": "bench.memviz",
    "ModelBenchConfig": "bench.model",
    "ModelShape": "bench.model",
    "run_model": "bench.model",
    "run_warmup_study": "bench.model",
    "annotated_attention": "bench.nvtx",
    "nvtx_range": "bench.nvtx",
    "run_precision": "bench.precision",
    "build_report": "bench.report",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'bench' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "IMPL_NAMES",
    "OK",
    "OOM",
    "PRESETS",
    "SCHEMA",
    "AttnConfig",
    "Bars",
    "FlashCase",
    "ModelBenchConfig",
    "ModelShape",
    "Outcome",
    "Run",
    "Summary",
    "Unavailable",
    "add_common_args",
    "add_timing_args",
    "annotated_attention",
    "attention_flops",
    "attention_impl",
    "bar_plot",
    "build_report",
    "collect_env",
    "command_line",
    "cpu_default_notice",
    "do_bench",
    "elapsed_ms",
    "emit",
    "free_memory",
    "guarded",
    "hbar_plot",
    "line_plot",
    "load_json",
    "make_parser",
    "memory_in_use",
    "nvtx_range",
    "peak_memory",
    "peak_tflops",
    "progress",
    "render_memory_snapshot",
    "reset_peak_memory",
    "resolve_device",
    "result_stem",
    "run_attention",
    "run_flash",
    "run_model",
    "run_precision",
    "run_warmup_study",
    "save_json",
    "skipped",
    "stacked_bar_plot",
    "summarize",
    "synchronize",
    "time_fn",
    "time_with_setup",
    "to_markdown",
    "to_mib",
]
