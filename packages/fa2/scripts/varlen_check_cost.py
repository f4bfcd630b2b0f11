"""What checking packed sequences on every call costs: host time per call of the forward.

Run from the repository root on a CUDA machine (no install needed)::

    export PYTHONPATH=$(ls -d $PWD/packages/*/src | paste -sd:)
    python3 packages/fa2/scripts/varlen_check_cost.py --out $OUT

Times, per call, `flash_attn_varlen_func`'s forward (no autograd) on a small packed batch
(where host time dominates), three ways: the same offsets tensor every call (host checks only:
its values were asserted once), a fresh offsets tensor every call (the device-side assertions
of `fa2.checks.check_varlen` every call), and the bare kernels of `run_forward`'s plan (no
check at all); and `check_varlen` alone for the same and for fresh offsets. Host time is
`time.perf_counter` around a loop of calls without synchronising (what a training step's
CPU pays), device time a CUDA-event pair around the same loop. Writes
`varlen_check_cost.json` (rows with device, versions, date, command) under `--out` and prints a
table. On a CPU it runs through Triton's interpreter (TRITON_INTERPRET=1; a rehearsal, not a
measurement).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

from fa2 import flash_attn_varlen_func
from fa2.checks import check_varlen

LENGTHS = (100, 37, 1, 512, 300)  # five documents, 950 tokens
HEADS, HEAD_DIM = 8, 64


def _offsets(device: torch.device) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(LENGTHS).cumsum(0).tolist()], dtype=torch.int32).to(
        device
    )


def _time(fn, calls: int, device: torch.device) -> tuple[float, float | None]:
    """(host µs per call, device µs per call or None on a CPU) of `calls` calls of `fn`."""
    fn()  # compile, build the plan
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
    began = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - began) / calls * 1e6
    if not cuda:
        return host, None
    end.record()
    torch.cuda.synchronize()
    return host, start.elapsed_time(end) / calls * 1e3


def _revision() -> str | None:
    """The checkout's commit (BENCH_GIT_REVISION where the sources are a copy without git)."""
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True)
    except OSError:
        done = None
    if done is not None and done.returncode == 0:
        return done.stdout.strip()
    return os.environ.get("BENCH_GIT_REVISION")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--calls", type=int, default=200, help="calls per timing (200)")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    total, longest = sum(LENGTHS), max(LENGTHS)
    q, k, v = (torch.randn(total, HEADS, HEAD_DIM, device=device, dtype=dtype) for _ in range(3))
    same = _offsets(device)
    # Made ahead, so that making them is not timed; each used once (two cases, a warm-up each).
    queue = iter([_offsets(device) for _ in range(2 * (args.calls + 1))])

    def attention(cu):
        return flash_attn_varlen_func(q, k, v, cu, cu, longest, longest, causal=True)

    from fa2.triton.function import run_forward

    _, _, plan = run_forward(q, k, v, True, None, None, (-1, -1), 0.0, "thd", same, same,
                             longest, longest, True)  # fmt: skip
    scale = HEAD_DIM**-0.5
    cases = {
        "forward, the same offsets every call": lambda: attention(same),
        "forward, fresh offsets every call": lambda: attention(next(queue)),
        "forward kernels alone (the cached plan, no check)": lambda: plan(
            q, k, v, scale, (same, same), (longest, longest), False
        ),
        "check_varlen, the same offsets": lambda: check_varlen(q, k, same, same, longest, longest),
        "check_varlen, fresh offsets": lambda: (
            lambda cu: check_varlen(q, k, cu, cu, longest, longest)
        )(next(queue)),
    }
    with torch.no_grad():
        rows = []
        for name, fn in cases.items():
            host, gpu = _time(fn, args.calls, device)
            rows.append({"case": name, "host_us": round(host, 2),
                         "device_us": None if gpu is None else round(gpu, 2)})  # fmt: skip
    import triton

    meta = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "git_revision": _revision(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "date": datetime.date.today().isoformat(),
        "command": " ".join(sys.argv),
        "shape": {"lengths": LENGTHS, "heads": HEADS, "head_dim": HEAD_DIM, "dtype": str(dtype)},
        "calls": args.calls,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "varlen_check_cost.json").write_text(
        json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n"
    )
    print(f"{meta['device']}, torch {meta['torch']}, {meta['date']}; µs per call")
    print("| case | host µs | device µs |\n| --- | --- | --- |")
    for row in rows:
        print(f"| {row['case']} | {row['host_us']} | {row['device_us']} |")


if __name__ == "__main__":
    main()
