"""What the multi-rank benchmarks (bench-allreduce, bench-ddp, bench-zero) share, on
`bench.core.launch`.

On each rank:

- `guarded_on_all_ranks(fn, device=)`: `bench.core.oom.guarded`, with the ranks agreeing on the
  outcome (one all-reduce of a flag), so that a rank that ran out of memory and the ranks that
  did not record the same status and go on to the next measurement together, rather than one
  of them starting collectives alone.
- `measure_cases(measure, cases, config, device=)`: one launch of `config.nproc` ranks that
  runs `measure(case, config, rank, device)` for every case in turn, each guarded on all ranks,
  and hands back every rank's result per case.

After the launch, `slowest_rank(per_rank)`: a step (an iteration, a collective) lasts as long as
its slowest rank, so a step's time is the largest over the ranks, summarised over the steps.

On the command line, `--timeout` (`bench.core.cli.add_timeout_arg`) bounds the ranks' time.
The data-parallel training set-up that bench-ddp and bench-zero share is in
`bench.core.training_bench`.

Example::

    def _measure(case: str, config: MyConfig, rank: int, device: torch.device) -> dict:
        ...
        return {"times": times}

    rows = [{"case": case, "ms": slowest_rank([r["times"] for r in results]).median}
            for case, results in measure_cases(_measure, cases, config, device=device)]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import torch

from bench.core.launch import DEFAULT_TIMEOUT_S, all_ranks_ok, backend_for, launch, rank_device
from bench.core.oom import OK, OOM, Outcome, guarded
from bench.core.timing import Summary, summarize

__all__ = ["guarded_on_all_ranks", "measure_cases", "slowest_rank"]

T = TypeVar("T")
C = TypeVar("C")
K = TypeVar("K")


# ----------------------------------------------------------------------------- on each rank


def guarded_on_all_ranks(fn: Callable[[], T], *, device: torch.device) -> Outcome[T]:
    """`guarded(fn)` on this rank, agreed over the ranks: `OOM` everywhere if any rank failed.

    Every rank must call it the same number of times (it issues one all-reduce).
    """
    outcome = guarded(fn, device=device)
    return outcome if all_ranks_ok(outcome.ok, device=device) else Outcome(None, OOM)


def _case_worker(
    rank: int,
    world_size: int,
    measure: Callable[[K, C, int, torch.device], dict[str, Any]],
    cases: Sequence[K],
    config: C,
    backend: str,
) -> list[dict[str, Any]]:
    """Every case on this rank, in order: `measure`'s dict and `status`, or `{"status": OOM}`."""
    device = rank_device(backend)
    results = []
    for case in cases:
        outcome = guarded_on_all_ranks(
            lambda c=case: measure(c, config, rank, device), device=device
        )
        results.append({**outcome.value, "status": OK} if outcome.ok else {"status": OOM})
    return results


def measure_cases(
    measure: Callable[[K, C, int, torch.device], dict[str, Any]],
    cases: Sequence[K],
    config: C,
    *,
    device: torch.device,
    env: Mapping[str, str] | None = None,
    timeout: float | None = DEFAULT_TIMEOUT_S,
) -> list[tuple[K, list[dict[str, Any]]]]:
    """Run `measure(case, config, rank, device)` for every case on `config.nproc` ranks.

    One launch (`bench.core.launch.launch`) with nccl on CUDA (one GPU per rank) or gloo on the CPU;
    the cases run in order on every rank, each guarded on all ranks.

    Args:
        measure: a module-level function (spawned ranks import it by name) returning a
            picklable dict of this rank's numbers for one case.
        cases: what to measure, in order (picklable).
        config: passed to `measure`; its `nproc` is the number of ranks.
        device: `cuda` or `cpu`: where the ranks run.
        env: environment variables each rank sets before the process group is created.
        timeout: seconds the ranks may take in all (None: no bound).

    Returns:
        `(case, results)` per case, in order, with every rank's result in rank order:
        `measure`'s dict with `"status": "ok"`, or `{"status": "OOM"}` on every rank when any
        rank ran out of memory.

    Raises:
        ValueError: CUDA with fewer GPUs than ranks (see `launch`).
    """
    cases = tuple(cases)
    backend = backend_for(device)
    per_rank = launch(
        _case_worker,
        world_size=config.nproc,
        backend=backend,
        args=(measure, cases, config, backend),
        env=env,
        timeout=timeout,
    )
    return list(zip(cases, (list(r) for r in zip(*per_rank, strict=True)), strict=True))


# ----------------------------------------------------------------------------- after the launch


def slowest_rank(per_rank: Sequence[Sequence[float]]) -> Summary:
    """Summary over steps of each step's largest value over the ranks (`per_rank[rank][step]`).

    A collective, and a data-parallel step, ends when its slowest rank does.
    """
    return summarize([max(values) for values in zip(*per_rank, strict=True)])
