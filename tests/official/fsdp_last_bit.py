"""Does even the ideal two-rank gradient differ from the full-batch one in the last bit?

The spring-2026 suite's `test_fsdp_correctness[fp32]` trains the suite's toy model (its
`ToyFSDPModel`, built from the reference `cs336_basics` layers) for three SGD steps, once on the
whole batch of 20 in one process and once with FSDP on two ranks of 10 each, and compares the
parameters with `torch.equal`. An FSDP that is exact to the last rounding computes each rank's
mean-loss gradient on its half, `g0` and `g1`, and averages them: `(g0 + g1) / 2`. The
full-batch gradient sums the same 20 rows in another order (the matmuls of the backward reduce
over the batch in blocks chosen by the CPU's BLAS), so the two can differ in the last bit; a
parameter that differs after the SGD step fails `torch.equal`.

This script measures it without any FSDP: in one process it computes, for each of the test's
three steps (same seeds, same data, same shuffles, starting from the full-batch model's
parameters), the full-batch gradient and `(g0 + g1) / 2` from the two halves, and counts the
elements that differ, by how much (absolute and in units in the last place) and whether the
difference survives the SGD update (lr 0.01). The suite's model and data come from the checkout
itself (`tests/test_fsdp.py`), nothing of it is copied here::

    uv run --with einops --with einx --with jaxtyping python tests/official/fsdp_last_bit.py \\
        ../a2 --json docs/results/fsdp_last_bit_cpu_<date>.json --markdown ...md
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

COLUMNS = [
    "threads",
    "step",
    "parameter",
    "numel",
    "grad_differ",
    "grad_max_abs",
    "grad_max_ulp",
    "param_differ",
    "param_max_abs",
]
_SEED_MODEL, _SEED_DATA, _BATCH, _SEQ, _VOCAB, _LR, _STEPS = 42, 123, 20, 8, 100, 0.01, 3


def _suite_model(checkout: Path) -> type[nn.Module]:
    """The suite's `ToyFSDPModel`, imported from the checkout (its tests and `cs336-basics`)."""
    sys.path[:0] = [str(checkout), str(checkout / "cs336-basics")]
    return importlib.import_module("tests.test_fsdp").ToyFSDPModel


def _grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    """The mean cross-entropy's gradient of the last position's logits, as the test's loss."""
    model.zero_grad(set_to_none=True)
    nn.CrossEntropyLoss()(model(x)[:, -1, :].float(), y).backward()
    return [p.grad.detach().clone() for p in model.parameters()]


def _ulp(a: torch.Tensor, b: torch.Tensor) -> int:
    """Largest distance between `a` and `b` in units in the last place of fp32."""
    ia, ib = a.view(torch.int32).long(), b.view(torch.int32).long()
    # map the sign-magnitude bit patterns onto a monotone integer line
    ia = torch.where(ia < 0, -(ia & 0x7FFFFFFF), ia)
    ib = torch.where(ib < 0, -(ib & 0x7FFFFFFF), ib)
    return int((ia - ib).abs().max().item()) if a.numel() else 0


def measure(model_cls: type[nn.Module], *, threads: int) -> list[dict[str, Any]]:
    """One row per step and parameter: how `(g0 + g1) / 2` differs from the full gradient."""
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(_SEED_MODEL)
    model = model_cls(vocab_size=_VOCAB, d_model=64, d_ff=128)
    torch.manual_seed(_SEED_DATA)
    x = torch.randint(0, _VOCAB, (_BATCH, _SEQ))
    y = torch.randint(0, _VOCAB, (_BATCH,))
    half = _BATCH // 2
    rows = []
    for step in range(_STEPS):
        full = _grads(model, x, y)
        g0 = _grads(model, x[:half], y[:half])
        g1 = _grads(model, x[half:], y[half:])
        names = [n for n, _ in model.named_parameters()]
        with torch.no_grad():
            for name, p, g, a, b in zip(names, model.parameters(), full, g0, g1, strict=True):
                ideal = (a + b) / 2
                after_full, after_ideal = p - _LR * g, p - _LR * ideal
                rows.append(
                    {
                        "threads": threads,
                        "step": step,
                        "parameter": name,
                        "numel": p.numel(),
                        "grad_differ": int((g != ideal).sum()),
                        "grad_max_abs": float((g - ideal).abs().max()),
                        "grad_max_ulp": _ulp(g, ideal),
                        "param_differ": int((after_full != after_ideal).sum()),
                        "param_max_abs": float((after_full - after_ideal).abs().max()),
                    }
                )
            for p, g in zip(model.parameters(), full, strict=True):
                p -= _LR * g  # the full-batch model's SGD step, as the test's baseline takes
        torch.manual_seed(_SEED_MODEL + step)  # the test's shuffle
        perm = torch.randperm(_BATCH)
        x, y = x[perm], y[perm]
    return rows


def main(argv: list[str] | None = None) -> int:
    """Entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(
        prog="tests/official/fsdp_last_bit.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("checkout", type=Path, help="a checkout of the spring-2026 suite")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="CPU threads")
    parser.add_argument("--json", type=Path, help="write the rows as a bench result")
    parser.add_argument("--markdown", type=Path, help="write them as a Markdown table")
    args = parser.parse_args(argv)
    model_cls = _suite_model(args.checkout.resolve())
    rows = [r for t in args.threads for r in measure(model_cls, threads=t)]
    from bench.core.results import Run, save_json

    differ = [r for r in rows if r["param_differ"]]
    summary = (
        f"{len(differ)} of {len(rows)} (threads, step, parameter) cells differ after the SGD "
        f"step; largest gradient difference {max(r['grad_max_ulp'] for r in rows)} ulp, "
        f"largest parameter difference {max(r['param_max_abs'] for r in rows):.3g}."
    )
    run = Run.create(
        "fsdp_last_bit",
        rows,
        device="cpu",
        config={"threads": args.threads, "batch": _BATCH, "seq": _SEQ, "lr": _LR},
        command=" ".join(["python tests/official/fsdp_last_bit.py", "<checkout>"])
        + f" --threads {' '.join(map(str, args.threads))}",
        title="The ideal two-rank gradient (g0 + g1) / 2 against the full-batch gradient, "
        "spring-2026 test_fsdp_correctness's model, data and steps",
        columns=COLUMNS,
        notes=[
            summary,
            "grad_differ / param_differ: elements that differ (gradient; parameter after the "
            "SGD step, lr 0.01); grad_max_ulp: in units in the last place of fp32. Each step "
            "starts from the full-batch model's parameters.",
        ],
    )
    print(run.to_markdown())
    if args.json:
        save_json(run, args.json)
    if args.markdown:
        args.markdown.write_text(run.to_markdown() + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
