"""Profiling and benchmarking harness for the cs336sys packages.

The shared plumbing every tool is built from:

- `bench.env`: where a measurement ran and which code it ran (`collect_env`, `code_version`,
  `command_line`).
- `bench.timing`: device-synchronised timers (`elapsed_ms`, `time_fn`, `time_with_setup`,
  `do_bench`, `summarize`).
- `bench.memory`: peak and current device memory (`reset_peak_memory`, `peak_memory`, ...).
- `bench.oom`: a measurement that runs out of memory marks its row `OOM` (`guarded`).
- `bench.results`: tidy rows + metadata (`Run`), Markdown tables, JSON (`save_json`, `load_json`).
- `bench.plots`: PNG plots drawn from rows (`line_plot`, `bar_plot`, `hbar_plot`,
  `stacked_bar_plot`).
- `bench.cli`: options, device choice, the device's default and output handling shared by
  every `bench-*` command (`run_command`, `emit`, `apply_overrides`, `config_or_default`).
- `bench.launch`: runs a worker on several ranks in a process group, spawned or under
  `torchrun` (`launch`, `is_primary`, `all_ranks_ok`).
- `bench.distributed`: what the multi-rank tools share on top of it (cases guarded on all
  ranks, slowest-rank summaries); `bench.training`: the training set-up of bench-ddp and
  bench-zero.
- `bench.attention_impls`, `bench.nvtx`, `bench.memviz`, `bench.hardware`: attention
  implementations by name, NVTX ranges, the offline memory-snapshot view, GPU peak FLOP/s.

The tools are modules with a `main` (the `bench-*` entry points, also `python -m bench.<tool>`)
and a plain function: `bench.model` (`run_model`, `run_warmup_study`), `bench.attn`
(`run_attention`), `bench.flash` (`run_flash`), `bench.precision` (`run_precision`),
`bench.allreduce` (`run_allreduce`), `bench.ddp` (`run_ddp`), `bench.zero` (`run_zero`), and
`bench.report` (`build_report`).
"""

import importlib
from typing import Any

from bench.cli import (
    Invocation,
    add_common_args,
    add_timing_args,
    apply_overrides,
    as_device,
    config_or_default,
    cpu_default_notice,
    distinct,
    emit,
    make_parser,
    progress,
    resolve_device,
    run_command,
    usage_errors,
)
from bench.env import code_version, collect_env, command_line
from bench.hardware import peak_tflops
from bench.launch import all_ranks_ok, is_primary, launch
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

# The package version; pyproject.toml reads it from here (hatch's version source).
__version__ = "0.1.0"

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
    "run_allreduce": "bench.allreduce",
    "run_ddp": "bench.ddp",
    "run_zero": "bench.zero",
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
    "Invocation",
    "ModelBenchConfig",
    "ModelShape",
    "Outcome",
    "Run",
    "Summary",
    "Unavailable",
    "add_common_args",
    "add_timing_args",
    "all_ranks_ok",
    "annotated_attention",
    "apply_overrides",
    "as_device",
    "attention_flops",
    "attention_impl",
    "bar_plot",
    "build_report",
    "code_version",
    "collect_env",
    "command_line",
    "config_or_default",
    "cpu_default_notice",
    "distinct",
    "do_bench",
    "elapsed_ms",
    "emit",
    "free_memory",
    "guarded",
    "hbar_plot",
    "is_primary",
    "launch",
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
    "run_allreduce",
    "run_attention",
    "run_command",
    "run_ddp",
    "run_flash",
    "run_model",
    "run_precision",
    "run_warmup_study",
    "run_zero",
    "save_json",
    "skipped",
    "stacked_bar_plot",
    "summarize",
    "synchronize",
    "time_fn",
    "time_with_setup",
    "to_markdown",
    "to_mib",
    "usage_errors",
]
