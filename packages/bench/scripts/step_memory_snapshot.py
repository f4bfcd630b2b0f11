"""What is alive at a bench-step row's peak, by the code that allocated it (one call on two GPUs).

bench-plan predicts the 2026-11-28 leaderboard rows of ZeRO-1 (ours) and FSDP2 (torch-native)
18 % and 22 % low, and the CPU (2 gloo ranks, the same layouts at a tiny size) holds nothing
beyond the terms it counts: parameters, the moments, DDPBucketed's buckets (or FSDP2's gathered
units and root), the activations. So the missing bytes are the GPU's: this script runs the row's
step as bench-step builds it (`bench.tools.step.full_step`), records the CUDA allocator's history
over one step after warm-up, replays it to the step's peak and groups the blocks alive there by
the first frame of the project (or of torch) that allocated them, with the allocator's own
`memory_allocated` at the step's start beside the tensors bench-step attributes.

Run from the repository root on 2 GPUs of >= 140 GB (about 4 minutes for both rows)::

    export PYTHONPATH=$(ls -d $PWD/packages/*/src | paste -sd:)
    python3 packages/bench/scripts/step_memory_snapshot.py --row zero1 --out $OUT
    python3 packages/bench/scripts/step_memory_snapshot.py --row fsdp:torch --out $OUT

Writes `step_memory_snapshot_2x<gpu>_<date>_<row>.{json,md}` (a bench result, one row per group,
MiB) under `--out` and prints the table last. `--layers` shortens the model (the leaderboard's own
depth by default).

On torch 2.11 recording the allocator's history fails inside compiled, checkpointed code
(pytorch/pytorch#179536: "returned NULL without setting an exception"): the compiled rows, and
FSDP2's row even with `--no-compile` (its chunked loss is compiled per checkpointed chunk), stop
there. The ZeRO-1 row with `--no-compile` runs (2026-11-28, 2xH200:
docs/results/step_memory_snapshot_2xh200_2026-11-28.md).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# Two sentinel allocations (their addresses recorded) mark the step's start and end in the
# allocator's trace; the size is only distinctive.
_SENTINEL_BYTES = 7_777_777
# Steps before the recorded one: the compiled step's first call and two warm ones, as bench-step
# measures after its warm-up.
_WARM_STEPS = 3
_MIB = 2**20


def _frame(frames: list[dict]) -> str:
    """The first frame of the project's packages (else torch's, else the first) as file:line."""
    for marker in ("/packages/", "/torch/"):
        for f in frames:
            if marker in f.get("filename", ""):
                name = f["filename"].split(marker)[-1]
                return f"{name}:{f['line']} {f.get('name', '')}"
    return f"{frames[0]['filename']}:{frames[0]['line']}" if frames else "?"


def _live_at_peak(trace: list[dict], marks: tuple[int, int]) -> tuple[int, dict[str, int]]:
    """Replay the trace, and between the two sentinels (their addresses `marks`) find the peak of
    the bytes allocated since recording began and the blocks alive then, grouped by `_frame`
    (those allocated before the window with their own frames)."""
    live: dict[int, tuple[int, str]] = {}
    opened = [i for i, e in enumerate(trace) if e["action"] == "alloc" and e["addr"] == marks[0]]
    closed = [i for i, e in enumerate(trace) if e["action"] == "alloc" and e["addr"] == marks[1]]
    start, end = opened[-1], closed[-1]
    best, best_live, total = -1, {}, 0
    for i, e in enumerate(trace):
        if e["action"] == "alloc":
            live[e["addr"]] = (e["size"], _frame(e.get("frames", [])))
            total += e["size"]
        elif e["action"] in ("free_requested",) and e["addr"] in live:
            total -= live.pop(e["addr"])[0]
        if start < i < end and total > best:
            best, best_live = total, dict(live)
    groups: collections.Counter[str] = collections.Counter()
    for size, frame in best_live.values():
        groups[frame] += size
    return best, dict(groups)


def _worker(
    rank: int, world: int, row: str, layers: int | None, out: str, port: int, compile: bool
) -> None:
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)  # fmt: skip
    import lmcore
    from bench.core.memory import tensor_bytes
    from bench.tools.step.full_step import StepSpec, _build

    native = row == "fsdp:torch"
    config = lmcore.model_config(
        lmcore.LEADERBOARD_2026.size, attention="sdpa" if native else "fa2-triton"
    )
    if layers is not None:
        config = dataclasses.replace(config, num_layers=layers)
    spec = StepSpec(
        config, batch=1, impl="torch-native" if native else "ours", precision="bf16",
        loss="chunked" if native else "fused",
        optimizer="torch-fused" if native else "lmcore-fused",
        activation_checkpointing="blocks", compile=compile, world_size=world,
        parallel="fsdp" if native else "zero1", warmup_ms=1, rep_ms=1,
    )  # fmt: skip
    device = torch.device("cuda", rank)
    torch.cuda.memory._record_memory_history(max_entries=4_000_000, stacks="python")
    step = _build(spec, rank, device)
    for _ in range(_WARM_STEPS):
        step()
    torch.cuda.synchronize()
    params = list(step.module.parameters())
    inner = getattr(step.optimizer, "local_optimizer", step.optimizer)
    buckets = getattr(step.module, "_buckets", [])
    setup = step.before
    at_start: dict[str, int] = {}
    sentinels: list[torch.Tensor] = []  # kept, so that the two have different addresses

    def before() -> None:
        setup()
        torch.cuda.synchronize()
        at_start["allocated"] = torch.cuda.memory_allocated(device)
        sentinels.append(torch.empty(_SENTINEL_BYTES, dtype=torch.uint8, device=device))
        torch.cuda.reset_peak_memory_stats(device)

    step.before = before
    step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated(device)
    sentinels.append(torch.empty(_SENTINEL_BYTES, dtype=torch.uint8, device=device))
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    known = {
        "params": tensor_bytes(params, device),
        "grads (.grad)": tensor_bytes((p.grad for p in params), device),
        "state": tensor_bytes((v for s in inner.state.values() for v in s.values()), device),
        "ddp buckets": tensor_bytes((b.buffer for b in buckets), device),
    }
    replay_peak, groups = _live_at_peak(
        snapshot["device_traces"][rank], (sentinels[0].data_ptr(), sentinels[1].data_ptr())
    )
    if rank == 0:
        _save(row, compile, peak, at_start["allocated"], replay_peak, known, groups, device, out)
    dist.destroy_process_group()


def _save(
    row: str,
    compile: bool,
    peak: int,
    at_start: int,
    replay_peak: int,
    known: dict[str, int],
    groups: dict[str, int],
    device: torch.device,
    out: str,
) -> None:
    """Write the groups as a bench result (`step_memory_snapshot_2x<gpu>_<date>.{json,md}`, one
    row per line of the table, MiB) under `out` and print the table."""
    from bench.core.env import collect_env
    from bench.core.results import Run, result_stem, save_json

    mode = "compiled" if compile else "eager"
    rows = [
        {"what": f"peak (max_memory_allocated), {mode} blocks", "mib": peak / _MIB},
        {"what": "allocated at the step's start", "mib": at_start / _MIB},
        {"what": "peak replayed from the allocator's history", "mib": replay_peak / _MIB},
        *({"what": f"tensors: {k}", "mib": v / _MIB} for k, v in known.items()),
        *(
            {"what": f"alive at the peak, allocated at {frame}", "mib": size / _MIB}
            for frame, size in sorted(groups.items(), key=lambda kv: -kv[1])
            if size >= _MIB
        ),
    ]
    for r in rows:
        r["status"] = "ok"
    env = collect_env(device, command="python3 " + " ".join(sys.argv))
    env["gpu_count"] = 2
    run = Run.create(
        "memory-snapshot", rows, device=device, env=env, command=env["command"],
        config={"row": row, "compile": compile, "world_size": 2, "rank": 0},
        title=f"What is alive at the leaderboard {row} row's peak, by allocating frame "
        f"(rank 0, {mode} blocks, 2 ranks)",
        columns=["what", "mib", "status"],
        notes=[
            "Frames: the first frame of the project (or of torch) in the allocation's Python "
            "stack; `?`: no Python frame. Under DDPBucketed the gradients are views of its "
            "buckets: the same bytes, counted once at the peak.",
        ],
    )  # fmt: skip
    stem = result_stem("step_memory_snapshot", env, num_devices=2)
    name = row.replace(":", "-")
    save_json(run, Path(out) / f"{stem}_{name}.json")
    (Path(out) / f"{stem}_{name}.md").write_text(run.to_markdown())
    print(run.to_markdown(wide=False))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--row", choices=("zero1", "fsdp:torch"), required=True)
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--port", type=int, default=int(os.environ.get("MASTER_PORT", 29533)))
    parser.add_argument(
        "--no-compile",
        dest="compile",
        action="store_false",
        help="eager blocks: on torch 2.11 the allocator's history and compiled, checkpointed "
        "blocks fail together (pytorch/pytorch#179536)",
    )
    args = parser.parse_args()
    worker_args = (2, args.row, args.layers, args.out, args.port, args.compile)
    mp.spawn(_worker, args=worker_args, nprocs=2)


if __name__ == "__main__":
    main()
