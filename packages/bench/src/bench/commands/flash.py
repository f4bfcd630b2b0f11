"""bench-flash: FlashAttention-2 against PyTorch attention and SDPA, timed with `do_bench`.

Each case times, for every implementation, sequence length, head size and dtype: the forward,
the forward+backward, and the backward as their difference (the median of forward+backward
minus the median of forward; a backward timed on its own would need `retain_graph`, which
compiled graphs refuse). Times are medians of `triton.testing.do_bench` (CUDA; the L2 cache is
flushed between calls). At each shape every implementation runs on the same inputs: each is
called once (compiling what it compiles), then timed in `--rounds` interleaved rounds, forwards
then backwards, the measurement budget split among them; a time is the median of its rounds',
so that a drift over the run (clocks, temperature) does not favour whichever runs last. On
CUDA each row also has `fwd_bwd_host_ms`, the host's time to issue one forward+backward while
the GPU is held busy: where it is half of `fwd_bwd_ms` or more, that time may be the host's
(Python, autograd, launches), not the kernels'.
Throughput counts attention FLOPs per head: the forward is `4·S²·D` (two matmuls of `2·S²·D`),
halved when causal; the backward is 2.5× the forward (five matmuls instead of two).

Presets (`--preset`, several allowed; `all` is every one):

- `leaderboard`: q, k, v of shape (16, 16384, 64), bf16, causal; fa2 through
  `torch.compile(fa2.FlashAttention2Triton.apply)` and `o.sum().backward()`, beside SDPA forced to
  its flash and cuDNN backends (one head: `(16, 1, 16384, 64)`, the same data) and naive
  attention. Ratios are against SDPA's flash backend.
- `noncausal`: the same at (16, 4096, 64), not causal.  `d128`: (16, 16384, 128), causal.
- `sweep`: the handout's sweep: batch 1, causal, seq 128 … 65536, d 16 … 128, bf16 and fp32;
  fa2-triton, naive attention, SDPA; a random output gradient; ratios against SDPA.

`--seq-k` makes every case's shapes rectangular: each query length (`--seq`) against keys and
values of each length given (top-left aligned when causal, as SDPA's `is_causal`), and the plot
adds heatmaps of fa2's speed-up over (Nq, Nk) and over (seq, d).

Without a GPU a tiny CPU case runs instead (and says so): fa2-triton is skipped there, the tiled
PyTorch FlashAttention-2 (`fa2-pytorch`) stands in for it.

Examples::

    bench-flash                                 # every preset on a GPU (a tiny case on a CPU)
    bench-flash --preset leaderboard            # (16, 16384, 64) bf16 causal
    bench-flash --preset sweep --dtype bf16 --d 64 --json flash.json --plot flash.png
    bench-flash --preset sweep --dtype bf16 --d 128 --seq 1024 4096 16384 --seq-k 1024 4096 16384
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from bench.core.attention_names import IMPL_NAMES
from bench.core.cli import Command, LazyChoices
from bench.core.options import option

__all__ = ["COMMAND", "DTYPES", "GRADS", "PRESETS", "FlashCase", "FlashOptions", "main"]

DTYPES = LazyChoices(fp32="torch:float32", bf16="torch:bfloat16", fp16="torch:float16")
GRADS = ("sum", "randn")

_PRESET_IMPLS = ("fa2-triton-compiled", "sdpa-flash", "sdpa-cudnn", "naive")


@dataclass(frozen=True)
class FlashCase:
    """One benchmark case: a grid of shapes and dtypes, the implementations and the baseline.

    Args:
        name: the case's name (a preset's name), shown in the table.
        batch: leading batch size of q, k, v `(batch, seq, d)`.
        seqs: sequence lengths (of the queries, where `seq_ks` is given).
        d_values: head sizes.
        dtypes: names from `DTYPES`.
        causal: causal masking.
        impls: implementation names (see `bench.core.attention_impls`).
        baseline: the implementation ratios are taken against.
        grad: how the backward is driven: `sum` (`o.sum().backward()`, the leaderboard's call) or
            `randn` (`o.backward(dO)` with a fresh random `dO`).
        seq_ks: key/value lengths, each query length against each; empty: square shapes.
    """

    name: str
    batch: int
    seqs: tuple[int, ...]
    d_values: tuple[int, ...]
    dtypes: tuple[str, ...]
    causal: bool
    impls: tuple[str, ...]
    baseline: str
    grad: str = "randn"
    seq_ks: tuple[int, ...] = ()

    def key_lengths(self, seq: int) -> tuple[int, ...]:
        """The key lengths a query length runs against: `seq_ks`, or its own length."""
        return self.seq_ks or (seq,)

    def __post_init__(self) -> None:
        if not set(self.impls) <= set(IMPL_NAMES) or len(set(self.impls)) != len(self.impls):
            raise ValueError(f"impls must be distinct names from {IMPL_NAMES}, got {self.impls}")
        if not set(self.dtypes) <= set(DTYPES) or not self.dtypes:
            raise ValueError(f"dtypes must be names from {list(DTYPES)}, got {self.dtypes}")
        if self.grad not in GRADS:
            raise ValueError(f"grad must be one of {GRADS}, got {self.grad!r}")
        sizes = (self.batch, *self.seqs, *self.seq_ks, *self.d_values)
        if not self.seqs or not self.d_values or not self.impls or min(sizes) < 1:
            raise ValueError(
                f"batch, seqs and d_values must be positive and non-empty, impls non-empty: {self}"
            )


PRESETS: dict[str, FlashCase] = {
    "leaderboard": FlashCase(
        "leaderboard", 16, (16384,), (64,), ("bf16",), True, _PRESET_IMPLS, "sdpa-flash", "sum"
    ),
    "noncausal": FlashCase(
        "noncausal", 16, (4096,), (64,), ("bf16",), False, _PRESET_IMPLS, "sdpa-flash", "sum"
    ),
    "d128": FlashCase(
        "d128", 16, (16384,), (128,), ("bf16",), True, _PRESET_IMPLS, "sdpa-flash", "sum"
    ),
    "sweep": FlashCase(
        "sweep",
        1,
        tuple(2**i for i in range(7, 17)),  # 128 … 65536
        (16, 32, 64, 128),
        ("bf16", "fp32"),
        True,
        ("fa2-triton", "naive", "sdpa"),
        "sdpa",
    ),
}


@dataclass(frozen=True)
class FlashOptions:
    """The cases bench-flash runs: presets, and what to change in each of them; each field is
    the option of its name (None: the preset's own).

    Raises:
        ValueError: budgets other than a warm-up and a measurement, rounds below 1, or values a
            case refuses.
    """

    presets: tuple[str, ...] | None = option(
        None, "cases", flag="preset", choices=[*PRESETS, "all"],
        default_text="all on CUDA; a tiny case on a CPU",
    )  # fmt: skip
    seqs: tuple[int, ...] | None = option(
        None, "sequence lengths (of the queries, with --seq-k)", flag="seq",
        default_text="the case's",
    )  # fmt: skip
    seq_ks: tuple[int, ...] | None = option(
        None, "key/value lengths: each query length against each", flag="seq-k",
        default_text="square shapes",
    )  # fmt: skip
    d_values: tuple[int, ...] | None = option(
        None, "head sizes", flag="d", default_text="the case's"
    )
    dtypes: tuple[str, ...] | None = option(
        None, "dtypes", flag="dtype", choices=list(DTYPES), default_text="the case's"
    )
    batch: int | None = option(None, "batch size", default_text="the case's")
    causal: bool | None = option(None, "causal masking", default_text="the case's")
    impls: tuple[str, ...] | None = option(
        None, "implementations", choices=IMPL_NAMES, default_text="the case's"
    )
    budget_ms: tuple[float, ...] | None = option(
        None, "do_bench warm-up and measurement budgets per timing (WARMUP REP)",
        default_text="25 100 on CUDA, 5 20 on a CPU", metavar="MS",
    )  # fmt: skip
    rounds: int | None = option(
        None, "timings of each implementation at a shape, interleaved with the others' "
        "(forwards, then backwards; REP split among them), so that a drift over the run does "
        "not favour whichever runs last", parse=int,
        default_text="2 on CUDA, 1 on a CPU", metavar="N",
    )  # fmt: skip

    def __post_init__(self) -> None:
        if self.budget_ms is not None and len(self.budget_ms) != 2:
            raise ValueError(f"--budget-ms takes WARMUP REP, got {self.budget_ms}")
        if self.rounds is not None and self.rounds < 1:
            raise ValueError(f"--rounds must be at least 1, got {self.rounds}")
        self.cases([*PRESETS.values()][:1])  # the changes apply to a case

    @property
    def changes(self) -> dict[str, object]:
        """The fields of each case the options change."""
        names = ("seqs", "seq_ks", "d_values", "dtypes", "batch", "causal", "impls")
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}

    def cases(self, default: list[FlashCase]) -> list[FlashCase]:
        """The presets named (`default` when none is), each with the options' changes."""
        if self.presets is None:
            base = default
        elif "all" in self.presets:
            base = list(PRESETS.values())
        else:
            base = [PRESETS[name] for name in self.presets]
        return [replace(case, **self.changes) for case in base]


COMMAND = Command("bench-flash", __doc__, config=FlashOptions, run="bench.tools.flash:TOOL")
main = COMMAND.main
