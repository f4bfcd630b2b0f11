"""Fixtures shared by the bench tests: one thread per test, tiny configurations, results made by
the real tools, an injected out-of-memory error, the `--help` of a tool, and bench-train's text,
command lines and one-process reference run."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import torch
from generated_text import generated_text

import bench.tools.attn
from bench.commands.train import main as bench_train
from bench.core.env import collect_env
from bench.core.results import Run, save_json
from bench.tools.attn import AttnConfig, run_attention
from bench.tools.data_parallel import DDPBenchConfig, run_ddp
from bench.tools.flash import FlashCase, run_flash
from bench.tools.model import ModelBenchConfig, run_model
from bench.tools.precision import run_precision
from bench.tools.sharding import ZeroBenchConfig, run_zero
from bench.train.record import read_metrics
from lmcore import ModelSize

# A model small enough that a training step takes milliseconds on one CPU thread.
TINY_SHAPE = ("tiny", ModelSize(d_model=32, d_ff=64, num_layers=1, num_heads=2))


def _tiny_model_config(**overrides) -> ModelBenchConfig:
    """Every mode of `TINY_SHAPE` at context 16, batch 2, vocabulary 97, 1 + 2 steps."""
    base = {
        "shapes": (TINY_SHAPE,),
        "context_lengths": (16,),
        "batch": 2,
        "vocab_size": 97,
        "warmup": 1,
        "steps": 2,
    }
    return ModelBenchConfig(**{**base, **overrides})


def _tiny_attn_config(**overrides) -> AttnConfig:
    """Two sequence lengths, one head size, the implementations that run on a CPU."""
    base = {
        "batch": 2,
        "d_values": (16,),
        "seqs": (17, 32),
        "impls": ("naive", "fa2-pytorch", "sdpa"),
        "steps": 2,
        "warmup": 1,
    }
    return AttnConfig(**{**base, **overrides})


_TINY_FLASH = FlashCase(
    "tiny", 1, (32, 64), (16,), ("fp32",), True, ("naive", "fa2-pytorch", "sdpa"), "sdpa"
)
TINY_BUDGET_MS = (1.0, 2.0)  # do_bench budgets (ms): a few calls per measurement
# Longest sequence naive attention "fits" under `naive_attention_oom`: between the tiny seqs 17, 32.
OOM_ABOVE_SEQ = 20


@pytest.fixture
def tiny_model_config():
    """Factory of tiny `ModelBenchConfig`s (keyword overrides)."""
    return _tiny_model_config


@pytest.fixture
def tiny_attn_config():
    """Factory of tiny `AttnConfig`s (keyword overrides)."""
    return _tiny_attn_config


@pytest.fixture
def tiny_flash_case() -> FlashCase:
    """A causal fp32 case at seq 32 and 64, d 16, with the implementations a CPU runs."""
    return _TINY_FLASH


@pytest.fixture
def tiny_budget_ms() -> tuple[float, float]:
    """`do_bench` budgets small enough for tests."""
    return TINY_BUDGET_MS


@pytest.fixture
def naive_attention_oom(monkeypatch: pytest.MonkeyPatch) -> int:
    """Make bench-attn's `naive` run out of memory above seq 20 (others run); return that seq."""
    real = bench.tools.attn.attention_impl

    def failing(name, *, device):
        fn = real(name, device=device)
        if name != "naive":
            return fn

        def attend(q, k, v, causal):
            if q.shape[-2] > OOM_ABOVE_SEQ:
                raise torch.OutOfMemoryError("CUDA out of memory (injected)")
            return fn(q, k, v, causal)

        return attend

    monkeypatch.setattr(bench.tools.attn, "attention_impl", failing)
    return OOM_ABOVE_SEQ


@pytest.fixture
def help_text(capsys: pytest.CaptureFixture[str]) -> Callable[[Callable[..., int]], str]:
    """Run a tool's `main(["--help"])`, check that it exits with status 0, return its output."""

    def run(main: Callable[..., int]) -> str:
        with pytest.raises(SystemExit) as exc:
            main(["--help"])
        assert exc.value.code == 0
        return capsys.readouterr().out

    return run


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """Run each test on one intra-op thread: CI has two cores shared with other test processes,
    and oversubscribed thread pools make tiny CPU kernels thousands of times slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tool_results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A results folder holding tiny real runs of bench-model, -attn, -flash and -precision."""
    folder = tmp_path_factory.mktemp("results")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        runs = {
            "model": run_model(
                _tiny_model_config(dtypes=("fp32", "bf16-autocast")),
                device="cpu",
                show_progress=False,
            ),
            "attn": run_attention(_tiny_attn_config(), device="cpu", show_progress=False),
            "flash": run_flash(
                [_TINY_FLASH], device="cpu", budget_ms=TINY_BUDGET_MS, show_progress=False
            ),
            "precision": run_precision(device="cpu"),
        }
    finally:
        torch.set_num_threads(before)
    for name, run in runs.items():
        save_json(run, folder / f"{name}.json")
    return folder


# bench-ddp and bench-zero on 2 gloo ranks with the tiny model: each launch takes tens of
# seconds on two shared cores, so their tests and bench-report's share one run of each.
TINY_DDP_CONFIG = DDPBenchConfig(
    size="tiny",
    context_length=16,
    batch=2,
    vocab_size=97,
    bucket_sizes_mb=(0.01,),
    torch_bucket_mbs=(None,),
    warmup=1,
    steps=2,
)
TINY_ZERO_CONFIG = ZeroBenchConfig(
    size="tiny",
    context_length=16,
    batch=2,
    vocab_size=97,
    variants=(
        "ddp:torch",
        "zero1:torch-ddp",
        "zero1:torch",
        "fsdp",
        "fsdp:torch",
        "fsdp:no-prefetch",
    ),
    bucket_sizes_mb=(0.0, 25.0),
    fsdp_dtypes=("fp32", "bf16"),
    fsdp_storage=("fp32", "bf16"),
    warmup=1,
    steps=2,
)


@pytest.fixture(scope="session")
def ddp_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """bench-ddp's every variant on 2 gloo ranks (`TINY_DDP_CONFIG`), each training row with a
    traced step (in `config["trace_dir"]`)."""
    traces = str(tmp_path_factory.mktemp("ddp_traces"))
    config = replace(TINY_DDP_CONFIG, trace_dir=traces)
    return run_ddp(config, device="cpu", command="bench-ddp --test")


@pytest.fixture(scope="session")
def zero_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """bench-zero's ddp:torch, zero1:torch-ddp (two caps), zero1:torch and the FSDP rows (fp32
    and bf16 compute over fp32 shards, and bf16 shards) on 2 gloo ranks, each FSDP row with a
    traced step (in `config["trace_dir"]`)."""
    traces = str(tmp_path_factory.mktemp("zero_traces"))
    config = replace(TINY_ZERO_CONFIG, trace_dir=traces)
    return run_zero(config, device="cpu", command="bench-zero --test")


# bench-train on the CPU: a model of one narrow layer, whose step takes milliseconds on one thread.
TRAIN_TINY = ("--size", "tiny", "--d-model", "32", "--num-layers", "1", "--num-heads", "2")
TRAIN_TINY += ("--d-ff", "64")
# 4 steps, a loss each; a clipping norm below the tiny model's gradient norm, so that the
# clipping (over shards, with FSDP) is part of what several ranks must get right.
RUN_4 = ("--steps", "4", "--log-every", "1", "--grad-clip", "0.1", "--generate", "0")


@pytest.fixture(scope="session")
def train_text(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A generated text file bench-train learns within a few dozen steps."""
    path = tmp_path_factory.mktemp("data") / "text.txt"
    path.write_text(generated_text(1500, seed=3), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def train_argv(train_text: Path) -> Callable[..., list[str]]:
    """`argv(out, *extra)`: a bench-train command line of the tiny model on `train_text`, UTF-8
    bytes, context 32, batch 8, on the CPU (the token cache beside `out`)."""

    def argv(out: Path, *extra: str, data: Path | None = None) -> list[str]:
        common = ["--data", str(data or train_text), "--out", str(out), "--device", "cpu"]
        common += ["--cache-dir", str(out.parent / "cache"), "--tokenizer", "bytes"]
        common += ["--context-length", "32", "--batch-size", "8", "--no-progress"]
        return [*common, *TRAIN_TINY, *extra]

    return argv


def _losses(out: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(out)}


@pytest.fixture(scope="session")
def losses_of() -> Callable[[Path], dict[int, float]]:
    """`losses_of(run)`: step → loss of a run folder's metrics.jsonl."""
    return _losses


@dataclass(frozen=True)
class Reference:
    """A one-process run of `RUN_4` (`args`: `run`, its `losses`) and a copy of the same run
    stopped after step 2 (`halfway`), to resume under other modes."""

    run: Path
    losses: dict[int, float]
    halfway: Path
    args: tuple[str, ...] = RUN_4


def _train_in_one_thread(*argvs: list[str]) -> None:
    """bench-train each command line to its end on one thread, as the tests run (session
    fixtures run outside the per-test `one_thread`)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for argv in argvs:
            assert bench_train(argv) == 0
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="session")
def train_in_one_thread() -> Callable[..., None]:
    """`train_in_one_thread(*argvs)`: bench-train each command line, on one thread (for the
    runs that module and session fixtures share)."""
    return _train_in_one_thread


@pytest.fixture(scope="session")
def one_process(
    train_argv: Callable[..., list[str]], tmp_path_factory: pytest.TempPathFactory
) -> Reference:
    """What every multi-rank run must reproduce: 4 steps in one process, and its halfway point."""
    root = tmp_path_factory.mktemp("one-process")
    _train_in_one_thread(
        train_argv(root / "run", *RUN_4), train_argv(root / "halfway", *RUN_4, "--stop-after", "2")
    )
    return Reference(root / "run", _losses(root / "run"), root / "halfway")


@pytest.fixture
def usage_error(capsys: pytest.CaptureFixture[str]) -> Callable[[list[str]], str]:
    """`usage_error(argv)`: bench-train's stderr for a command line it refuses as a usage error
    (exit status 2, before any training)."""

    def refused(argv: list[str]) -> str:
        with pytest.raises(SystemExit) as exc:
            bench_train(argv)
        assert exc.value.code == 2
        return capsys.readouterr().err

    return refused


@pytest.fixture
def copy_of() -> Callable[[Path, Path], Path]:
    """`copy_of(run, to)`: a copy of a run folder (to resume it elsewhere); returns `to`."""

    def copy(run: Path, to: Path) -> Path:
        shutil.copytree(run, to)
        return to

    return copy


H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture(scope="module")
def base_env() -> dict:
    """This machine's environment, as a result records it."""
    return collect_env("cpu", command="test")


@pytest.fixture
def save(tmp_path, base_env):
    """`save(stem, tool, rows, date=..., **run_fields)`: a result as a GPU run of that day in
    `tmp_path` (an H100's unless `device_name` is given)."""

    def write(stem: str, tool: str, rows: list[dict], *, date: str, **fields) -> Path:
        device = fields.pop("device_name", H100)
        env = {**base_env, "device_type": "cuda", "device_name": device, "date": date}
        env["git_revision"] = f"{abs(hash(stem)):040x}"[:40]
        run = Run.create(tool, rows, device="cpu", config=fields.pop("config", {}), env=env)
        for key, value in fields.items():
            setattr(run, key, value)
        return save_json(run, tmp_path / f"{stem}.json")

    return write
