"""The 2026 CS336 assignment 2 handout's problems, answered from measured results.

`PROBLEMS` lists every problem of the handout in its order, each with the function that answers
it from a results folder (`bench.report.results.Results`), and after them what the seed projects
had (`bench.report.seeds.SEED_PROBLEMS`); `build_document` turns them into a
document (`bench.report.document`) that `bench-report` renders as Markdown, LaTeX or Typst
(`bench.report.tool`). It reads the tools' row keys and never runs a tool.
"""

from __future__ import annotations

from pathlib import Path

from bench.core.env import now_iso
from bench.report.analysis import analytic_answers
from bench.report.appendix_2025 import answer_bucket_equation, answer_bucket_sweep, answer_xxl
from bench.report.checkpointing import answer_checkpointing
from bench.report.data_parallel import answer_ddp
from bench.report.document import Block, Heading, Image, Paragraph, Table
from bench.report.kernels import (
    answer_attention,
    answer_compile,
    answer_flash_benchmarking,
    answer_flash_tests,
    is_compile,
)
from bench.report.leaderboard import FULL_RUN, answer_leaderboard
from bench.report.memory import answer_memory
from bench.report.parallel import (
    answer_allreduce,
    answer_fsdp_accounting,
    answer_fsdp_tests,
    answer_sharding,
    answer_tests,
)
from bench.report.problem import Problem, earlier_blocks, image_link, record_blocks
from bench.report.results import Record, Results
from bench.report.seeds import SEED_PROBLEMS, SEEDS_HEADING, SEEDS_TEXT
from bench.report.single_gpu import (
    answer_accumulation,
    answer_benchmarking,
    answer_mixed_precision,
    answer_profile,
    answer_warmup,
    is_memory,
    is_model_study,
    is_profile,
)

__all__ = ["PROBLEMS", "Problem", "Results", "build_document"]


def _tool(*tools: str, stem: str | None = None):
    def claims(record: Record) -> bool:
        return record.run.tool in tools and (stem is None or record.path.stem.startswith(stem))

    return claims


def _any(*claims):
    return lambda record: any(claim(record) for claim in claims)


ONE_GPU = "one GPU (an H100 here: `packages/bench/scripts/handout_gpu.sh`)"
TWO_GPUS = "two GPUs on one node (`bench-ddp`, `bench-zero` under two processes)"

PROBLEMS: tuple[Problem, ...] = (
    Problem(
        "benchmarking_script",
        "Benchmarking Script",
        "2.1.3 (a, b)",
        "A benchmarking script, and forward / backward / optimizer timings of every size.",
        answer_benchmarking,
        is_model_study,
        ONE_GPU + ", part1",
    ),
    Problem(
        "benchmarking_script (c)",
        "Warm-up",
        "2.1.3 (c)",
        "The timings without warm-up and with one or two warm-up steps, and why.",
        answer_warmup,
        _tool("warmup"),
        ONE_GPU + ", quick or part1",
    ),
    Problem(
        "nsys_profile",
        "Nsight Systems Profiling",
        "2.1.4",
        "Per profile: forward time, the top kernels, the non-matmul kernels, a training "
        "step's matmul share, softmax against matmul inside attention (torch.profiler's "
        "kernel tables stand in for Nsight Systems; `bench-model --nvtx` marks the same "
        "ranges for `nsys`).",
        answer_profile,
        is_profile,
        ONE_GPU + ", quick",
    ),
    Problem(
        "mixed_precision_accumulation",
        "Mixed-Precision Accumulation",
        "2.1.5",
        "The four accumulation loops' results, commented.",
        answer_accumulation,
        _tool("precision"),
    ),
    Problem(
        "benchmarking_mixed_precision",
        "Benchmarking Mixed Precision",
        "2.1.5",
        "(a) dtypes under autocast, (b) layer norm and bf16, (c) fp32 against bf16 timings.",
        answer_mixed_precision,
        lambda r: False,
        ONE_GPU + ", part1",
    ),
    Problem(
        "memory_profiling",
        "Memory Profiling",
        "2.1.6",
        "(a) timelines of xl's forward and training step, (b) peaks at contexts 128 and "
        "2048, (c) bf16's effect, (d) a residual-stream activation's size, (e) the largest "
        "allocations, (f) one block's residuals by operation and its gradients.",
        answer_memory,
        is_memory,
        ONE_GPU + ", quick or part2",
    ),
    Problem(
        "gradient_checkpointing",
        "Memory-Optimal Gradient Checkpointing",
        "3.2",
        "(a) the memory-optimal nesting and its cost, (b) the best one-level segment size "
        "for xl at batch 4, context 2048, with measured peaks.",
        answer_checkpointing,
        _tool("step", stem="step_checkpointing"),
    ),
    Problem(
        "pytorch_attention",
        "PyTorch Attention Benchmarking",
        "4.1.1",
        "A table over d ∈ {16…128} × seq ∈ {256…16384}, where memory runs out and the "
        "accounting for it.",
        answer_attention,
        lambda r: r.run.tool == "attn" and not is_compile(r),
        ONE_GPU + ", part4 and part7",
    ),
    Problem(
        "torch_compile",
        "Torch Compile",
        "4.2",
        "(a) compiled against eager attention, (b) the whole model compiled.",
        answer_compile,
        is_compile,
        ONE_GPU + ", part4, and quick or part5",
    ),
    Problem(
        "flash_forward",
        "FlashAttention-2 Forward Pass",
        "4.2.2",
        "The forward in PyTorch and in Triton, passing `test_flash_forward_pass`.",
        answer_flash_tests(
            "test_flash_forward", "(a, b) `fa2.FlashAttention2PyTorch`, `fa2.FlashAttention2Triton`"
        ),
        _tool("official_tests"),
    ),
    Problem(
        "flash_backward",
        "FlashAttention-2 Backward Pass",
        "4.2.2",
        "The backward with recomputation, passing `test_flash_backward`.",
        answer_flash_tests(
            "test_flash_backward",
            "fa2's backward (Triton dQ and dK/dV kernels, and the PyTorch reference)",
        ),
    ),
    Problem(
        "flash_benchmarking",
        "FlashAttention-2 Benchmarking",
        "4.2.2",
        "fa2 against regular PyTorch attention, forward / backward / end to end, batch 1, "
        "causal, seq 128…65536, d 16…128, bf16 and fp32.",
        answer_flash_benchmarking,
        _any(_tool("flash", stem="flash_sweep"), _tool("flash", stem="flash_naive")),
        ONE_GPU + ", quick or part6",
    ),
    Problem(
        "distributed_communication_single_node",
        "Distributed Communication",
        "5.1",
        "All-reduce time over sizes 1 MB…1 GB and 2, 4, 6 processes, gloo and NCCL.",
        answer_allreduce,
        _tool("allreduce"),
        "two to six GPUs (`bench-allreduce`)",
    ),
    Problem(
        "naive_ddp",
        "Naïve DDP",
        "5.2",
        "A naïve DDP whose weights match single-process training.",
        answer_tests(("test_ddp",), "`ddp.NaiveDDP` and the overlapped wrappers."),
    ),
    Problem(
        "naive_ddp_benchmarking",
        "Naïve DDP Benchmarking",
        "5.2",
        "Time per step and in communication, xl on 1 node × 2 GPUs.",
        answer_ddp("ddp:naive", "Naïve DDP"),
        _tool("ddp"),
        TWO_GPUS,
    ),
    Problem(
        "minimal_ddp_flat_benchmarking",
        "Minimal DDP with Flat Gradients",
        "5.3.1",
        "Time per step and in communication with one all-reduce of flat gradients.",
        answer_ddp("ddp:flat", "Flat DDP"),
        needs=TWO_GPUS,
    ),
    Problem(
        "ddp_overlap_individual_parameters",
        "DDP Overlapping Individual Parameters",
        "5.3.2",
        "A DDP container overlapping communication with backward.",
        answer_tests(("test_ddp",), "`ddp.DDPIndividualParameters` (`get_ddp`)."),
    ),
    Problem(
        "ddp_overlap_individual_parameters_benchmarking",
        "DDP Overlap Benchmarking",
        "5.3.2",
        "(a) its time per step against the others, (b) Nsight screenshots.",
        answer_ddp("ddp:individual", "Overlapped DDP, one all-reduce per gradient"),
        needs=TWO_GPUS,
    ),
    Problem(
        "optimizer_state_sharding",
        "Optimizer State Sharding",
        "6",
        "A sharded optimizer passing `test_sharded_optimizer`.",
        answer_tests(("test_sharded_optimizer",), "`zero.ShardedOptimizer`."),
    ),
    Problem(
        "optimizer_state_sharding_accounting",
        "Optimizer State Sharding Accounting",
        "6",
        "(a) peak memory and its breakdown, (b) time per step, (c) against ZeRO stage 1.",
        answer_sharding,
        _tool("zero"),
        TWO_GPUS,
    ),
    Problem(
        "fsdp",
        "Fully-Sharded Data Parallel",
        "7",
        "An FSDP container passing `test_fsdp`.",
        answer_fsdp_tests,
        _tool("fsdp_last_bit"),
    ),
    Problem(
        "fsdp_accounting",
        "FSDP Accounting",
        "7",
        "(a) the memory FSDP saves, (b) whether the all-gathers finish in time (Nsight).",
        answer_fsdp_accounting,
        _tool("plan", stem="plan_fsdp"),
        needs=TWO_GPUS,
    ),
    *(
        Problem(key, title, where, asks, analytic_answers(key))
        for key, title, where, asks in (
            (
                "alternate_ring_all_reduce",
                "Alternate ring all-reduce",
                "8.1",
                "The time of the all-reduce that forwards whole tensors, in S, N and W.",
            ),
            (
                "data_parallel_calcs",
                "Data parallel calculations",
                "8.2",
                "(a) backward FLOPs, (b) backward communication, (c) the largest N_DP.",
            ),
            (
                "fsdp_calcs",
                "Fully sharded data parallel calculations",
                "8.3",
                "(a) FLOPs, (b) communication, (c) the largest N_FSDP, forward and backward.",
            ),
            (
                "tp_calcs",
                "Tensor parallel calculations",
                "8.4",
                "(a) the backward equations, (b) FLOPs, (c) communication, (d) the largest N_TP.",
            ),
            (
                "fsdp_tp_calcs",
                "2D parallelism calculations",
                "8.5",
                "(a) forward FLOPs, (b) forward communication, (c)/(d) the largest N with the "
                "axes overlapped or sharing the network.",
            ),
        )
    ),
    Problem(
        "leaderboard",
        "Leaderboard: fastest training step",
        "9",
        "The best wall-clock time of a full training step of the 8B model, batch 2, "
        "context 32,768, on two B200s.",
        answer_leaderboard,
        _any(
            _tool("step", stem="step_leaderboard"),
            _tool("flash", stem="flash_leaderboard"),
            _tool("ops", "plan_leaderboard"),
        ),
        FULL_RUN,
    ),
    Problem(
        "ddp_bucketed_benchmarking (a)",
        "Bucketed DDP: bucket sizes",
        "2025 §2.3.3",
        "DDPBucketed's time per step at bucket sizes 1, 10, 100 and 1000 MB, commented.",
        answer_bucket_sweep,
        needs=TWO_GPUS,
        handout="2025",
    ),
    Problem(
        "ddp_bucketed_benchmarking (b)",
        "Bucketed DDP: the bucket-size equation",
        "2025 §2.3.3",
        "DDP's overhead as a function of s, w, o and n_b, and the bucket size minimising it.",
        answer_bucket_equation,
        handout="2025",
    ),
    Problem(
        "communication_accounting",
        "XXL communication accounting",
        "2025 §2.4",
        "(a) the XXL model's memory, (b) N_FSDP for a 95 GB device, (c) the compute-bound "
        "batch on a TPU v5p mesh, (d) tricks that lower it.",
        answer_xxl,
        handout="2025",
    ),
)


APPENDIX = "Appendix: the 2025 handout's problems that 2026 dropped"
APPENDIX_TEXT = (
    "The 2025 handout asked these too; courses that still follow it grade them. They are "
    "answered from the same results and bench-plan's formulas."
)


def build_document(
    res: Results, *, report_dir: Path, title: str, writeup: bool = False
) -> list[Block]:
    """The whole report: a summary, then each problem in the handout's order with its answer
    and the result files it rests on, then what the seed projects had (`SEED_PROBLEMS`), then
    the results no problem claims.

    With `writeup`, the document one hands in: each problem's answer and the plots of the
    results it rests on, each result named with its device, date and revision in one line;
    not the results' full tables, the earlier runs they replace, the seed section (no problem
    of the handout) or the results no problem claims (the Markdown report keeps those)."""
    stems = {r.path.stem for r in res.records}
    devices: dict[str, set[str]] = {}
    for rec in res.records:
        devices.setdefault(rec.run.tool, set()).add(
            f"{rec.run.env.get('device_name')} ({str(rec.run.date)[:10]})"
        )
    what = "; ".join(f"{tool} on {', '.join(sorted(d))}" for tool, d in devices.items())
    doc: list[Block] = [
        Heading(1, title),
        Paragraph(
            f"Built {now_iso()} from {len(res.records)} result file(s) in "
            f"`{res.folder.as_posix()}`: {what or 'nothing measured yet'}. Every number in the "
            "answers names the file it comes from and the code revision that file measured. "
            "Sections follow the 2026 handout; sizes are shown with their dimensions "
            "(d_model/d_ff/layers/heads), since the 2025 handout's xl was 1600 wide. A result "
            "that a newer one of the same kind replaces is listed as an earlier run, without "
            "its numbers; a problem whose run is missing says which command makes it and on "
            "what hardware."
            + (
                " Where two GPUs measured the same study, this write-up answers from the newer "
                "run; the full report (REPORT.md) keeps both."
                if writeup
                else ""
            )
        ),
    ]
    shown: set[Path] = set()
    for number, problem in enumerate(PROBLEMS, start=1):
        if problem.handout != "2026" and PROBLEMS[number - 2].handout == "2026":
            doc += [Heading(2, APPENDIX), Paragraph(APPENDIX_TEXT)]
        doc.extend(_section(problem, number, res, report_dir, shown, stems, writeup=writeup))
    if writeup:
        return doc
    doc += [Heading(2, SEEDS_HEADING), Paragraph(SEEDS_TEXT)]
    for number, problem in enumerate(SEED_PROBLEMS, start=len(PROBLEMS) + 1):
        doc.extend(_section(problem, number, res, report_dir, shown, stems))
    rest = [r for r in res.records if r.path not in shown]
    if rest:
        doc.append(Heading(2, "Other results"))
        doc.extend(_results(res, rest, report_dir, stems))
    if res.skipped:
        doc.append(Paragraph("Skipped files: " + "; ".join(res.skipped)))
    return doc


def _section(
    problem: Problem,
    number: int,
    res: Results,
    report_dir: Path,
    shown: set[Path],
    stems: set[str],
    *,
    writeup: bool = False,
) -> list[Block]:
    """A problem's heading, question, answer (or what it needs) and the results it claims that
    no problem before it showed (added to `shown`): in full, or in brief for the `writeup`."""
    doc: list[Block] = [
        Heading(2, f"{number}. {problem.title} (§{problem.where}, `{problem.key}`)"),
        Paragraph(f"*Asks.* {problem.asks}"),
    ]
    try:
        answer = problem.answer(res)
    except (KeyError, AttributeError, TypeError) as exc:  # a result of an older tool
        answer = [Paragraph(f"(No answer: a result file lacks {exc}; re-run its tool.)")]
    if not answer:
        needs = f" It needs {problem.needs}." if problem.needs else ""
        doc.append(Paragraph(f"Not measured: no result answers it yet.{needs}"))
    doc.extend(
        _linked(block, report_dir)
        for block in answer
        if not (writeup and isinstance(block, Table) and block.beyond_handout)
    )
    mine = [r for r in res.records if r.path not in shown and problem.claims(r)]
    shown.update(r.path for r in mine)
    if writeup:
        return doc + _in_brief(res, mine, report_dir, stems)
    return doc + _results(res, mine, report_dir, stems)


def _results(res: Results, records: list[Record], report_dir: Path, stems: set[str]) -> list[Block]:
    """The current results in full, then the earlier runs they replace, in brief."""
    out: list[Block] = []
    for record in (r for r in records if res.current(r)):
        out += record_blocks(record, report_dir, stems)
    for record in (r for r in records if not res.current(r)):
        out += earlier_blocks(record, res.earlier[record.path])
    return out


def _in_brief(
    res: Results, records: list[Record], report_dir: Path, stems: set[str]
) -> list[Block]:
    """The current results in one line each (file, device, date, revision) and their plots."""
    out: list[Block] = []
    for record in (r for r in records if res.current(r)):
        out += [b for b in record_blocks(record, report_dir, stems) if isinstance(b, Image)]
        env = record.run.env
        out.append(
            Paragraph(
                f"Source: `{record.path.name}`, {env.get('device_name')}, "
                f"{str(record.run.date)[:10]}, code {record.revision}."
            )
        )
    return out


def _linked(block: Block, report_dir: Path) -> Block:
    """An answer's image (an absolute path) linked relative to the report."""
    if isinstance(block, Image) and Path(block.path).is_absolute():
        return Image(image_link(Path(block.path), report_dir), block.caption)
    return block
