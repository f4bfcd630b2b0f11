"""bench-precision's measurement: what low-precision arithmetic does to a sum, and which dtypes
autocast picks (the handout's §1.1.5), as `run_precision()`, and the `TOOL` its command runs.

What it shows and its command line: `bench.commands.precision` (`bench-precision --help`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bench.core.plots import bar_plot
from bench.core.results import Keys, Run
from bench.core.tool import Invocation, Tool, as_device

__all__ = [
    "KEYS",
    "TOOL",
    "ToyModel",
    "accumulation_rows",
    "autocast_rows",
    "plot_precision",
    "run_precision",
]

NUM_ADDS = 1000
ADDEND = 0.01
EXACT_SUM = NUM_ADDS * ADDEND  # 10.0

# (case label, accumulator dtype, addend dtype, cast the addend to the accumulator's dtype first)
_ACCUMULATION_CASES = (
    ("fp32 += fp32", torch.float32, torch.float32, False),
    ("fp16 += fp16", torch.float16, torch.float16, False),
    ("fp32 += fp16", torch.float32, torch.float16, False),
    ("fp32 += fp16.to(fp32)", torch.float32, torch.float16, True),
)

# The handout's toy model sizes.
IN_FEATURES = 20
HIDDEN = 10
OUT_FEATURES = 5
TOY_BATCH = 8


class ToyModel(nn.Module):
    """The handout's mixed-precision toy model: Linear → ReLU → LayerNorm → Linear."""

    def __init__(self, in_features: int = IN_FEATURES, out_features: int = OUT_FEATURES) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, HIDDEN, bias=False)
        self.ln = nn.LayerNorm(HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, out_features, bias=False)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits `(batch, out_features)` of `x` of shape `(batch, in_features)`."""
        x = self.relu(self.fc1(x))
        x = self.ln(x)
        return self.fc2(x)


def accumulation_rows(device: torch.device | str = "cpu") -> list[dict[str, Any]]:
    """The four accumulation loops: rows with `case`, `value` (and `printed` to 8 significant
    digits), `abs_error` and `rel_error` against the exact 10."""
    rows = []
    for label, acc_dtype, add_dtype, cast in _ACCUMULATION_CASES:
        total = torch.tensor(0.0, dtype=acc_dtype, device=device)
        addend = torch.tensor(ADDEND, dtype=add_dtype, device=device)
        for _ in range(NUM_ADDS):
            total += addend.to(acc_dtype) if cast else addend
        value = total.item()
        rows.append(
            {
                "part": "accumulation",
                "case": label,
                "value": value,
                "printed": f"{value:.8g}",  # the table's 4 significant digits would hide the drift
                "abs_error": abs(value - EXACT_SUM),
                "rel_error": abs(value - EXACT_SUM) / EXACT_SUM,
            }
        )
    return rows


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def autocast_rows(device: torch.device | str, dtype: torch.dtype) -> list[dict[str, Any]]:
    """Dtypes seen in one forward and backward of `ToyModel` under `torch.autocast(dtype)`.

    Returns:
        Rows with `autocast` (e.g. `cuda bfloat16`), `tensor` (what was looked at) and `dtype`.
    """
    device = torch.device(device)
    model = ToyModel().to(device)
    x = torch.randn(TOY_BATCH, IN_FEATURES, device=device)
    target = torch.randint(0, OUT_FEATURES, (TOY_BATCH,), device=device)
    seen: dict[str, torch.dtype] = {}

    def record(name: str):
        def hook(module: nn.Module, inputs: Any, output: torch.Tensor) -> None:
            seen.setdefault(name, output.dtype)

        return hook

    hooks = [
        model.fc1.register_forward_hook(record("fc1 output")),
        model.ln.register_forward_hook(record("layer-norm output")),
    ]
    try:
        with torch.autocast(device_type=device.type, dtype=dtype):
            seen["parameters"] = next(model.parameters()).dtype
            logits = model(x)
            seen["logits"] = logits.dtype
            loss = F.cross_entropy(logits, target)
            seen["loss"] = loss.dtype
            loss.backward()
    finally:
        for hook in hooks:
            hook.remove()
    grads = {p.grad.dtype for p in model.parameters()}
    seen["gradients"] = grads.pop() if len(grads) == 1 else None
    label = f"{device.type} {_dtype_name(dtype)}"
    return [
        {"part": "autocast", "autocast": label, "tensor": name, "dtype": _dtype_name(d)}
        for name, d in seen.items()
    ]


COLUMNS = ["part", "case", "printed", "abs_error", "rel_error", "autocast", "tensor", "dtype"]
# Every key of a row, for readers (bench-report).
KEYS = Keys(*COLUMNS, "value")


def run_precision(*, device: torch.device | str | None = None, command: str | None = None) -> Run:
    """Both demonstrations on `device` (CUDA when available, else the CPU).

    Autocast runs with bf16 and fp16 on CUDA and with bf16 on the CPU.

    Returns:
        A `Run` (tool `"precision"`) whose rows are `accumulation_rows` then `autocast_rows`,
        told apart by `part`.
    """
    device = as_device(device)
    dtypes = [torch.bfloat16, torch.float16] if device.type == "cuda" else [torch.bfloat16]
    rows = accumulation_rows(device)
    for dtype in dtypes:
        rows.extend(autocast_rows(device, dtype))
    return Run.create(
        "precision",
        rows,
        device=device,
        config={"num_adds": NUM_ADDS, "addend": ADDEND, "autocast_dtypes": dtypes},
        command=command,
        title=f"Mixed precision: accumulating {ADDEND} × {NUM_ADDS}, and dtypes under autocast",
        columns=COLUMNS,
        group_by="part",
        notes=[f"Exact sum {EXACT_SUM}. Toy model loss: torch.nn.functional.cross_entropy."],
    )


def plot_precision(run: Run, path: Path) -> Path:
    """The accumulation loops' absolute errors, a bar each, on a log scale."""
    return bar_plot(
        [r for r in run.rows if r["part"] == "accumulation"],
        x="case",
        y="abs_error",
        path=path,
        title=f"|sum - {EXACT_SUM}| after {NUM_ADDS} additions of {ADDEND}, "
        f"{run.env.get('device_name')}",
        ylabel="absolute error",
        logy=True,
    )


def _run(config: None, cli: Invocation) -> Run:
    return run_precision(device=cli.device, command=cli.command)


TOOL: Tool[None] = Tool(run=_run, plot=plot_precision)
