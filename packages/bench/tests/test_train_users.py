"""bench-train for the habits users bring from other trainers: checkpoints kept by number
(`--keep-last`), a model that leaves the project (`--export-hf`), packed documents (`--pack`),
and the holes a first run falls into, each refused before any file is written. (`--resume auto`
under a kill: test_train_faults.py.)"""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from killed_run import run_killed

from bench.commands.train import main
from bench.core.step import build_lm
from bench.train.config import TrainConfig
from bench.train.data import Batches
from bench.train.generate import load_run
from bench.train.record import read_metrics

REPO = Path(__file__).resolve().parents[3]
# Six steps, a checkpoint every two, the newest two kept, nothing sampled.
KEEP_TWO = ["--steps", "6", "--save-every", "2", "--keep-last", "2", "--generate", "0"]
KEEP_TWO += ["--eval-every", "0", "--eval-batches", "1"]


def _iteration(path: Path) -> int:
    return torch.load(path, weights_only=True)["iteration"]


def test_keep_last_keeps_the_newest_whole_and_prunes_only_after_a_commit(train_argv, tmp_path):
    out = tmp_path / "run"
    run_killed(train_argv(out, *KEEP_TWO), "checkpoint:6")  # step 6's written, not committed
    assert _iteration(out / "checkpoint.pt") == 4
    assert [_iteration(out / f"checkpoint-step{s}.pt") for s in (2, 4)] == [2, 4]
    assert main(train_argv(out, *KEEP_TWO, "--resume")) == 0
    assert sorted(p.name for p in out.glob("checkpoint*")) == [
        "checkpoint-step4.pt",
        "checkpoint-step6.pt",
        "checkpoint.pt",
    ]
    assert _iteration(out / "checkpoint-step4.pt") == 4
    assert _iteration(out / "checkpoint.pt") == _iteration(out / "checkpoint-step6.pt") == 6


def test_export_hf_writes_a_llama_checkpoint_with_the_runs_logits(train_argv, tmp_path):
    transformers = pytest.importorskip("transformers")
    out, hf = tmp_path / "run", tmp_path / "hf"
    argv = train_argv(out, "--steps", "3", "--generate", "0", "--eval-batches", "1")
    assert main([*argv, "--export-hf", str(hf)]) == 0
    assert {p.name for p in hf.iterdir()} == {"model.safetensors", "config.json"}  # bytes
    assert json.loads((hf / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    model, _, _ = load_run(out, device=torch.device("cpu"))
    llama = transformers.LlamaForCausalLM.from_pretrained(hf, attn_implementation="eager")
    ids = torch.randint(0, 256, (2, 31))
    with torch.no_grad():
        torch.testing.assert_close(llama(ids).logits, model(ids), atol=1e-5, rtol=1e-5)


def test_export_hf_without_safetensors_is_refused_before_training(
    train_argv, tmp_path, usage_error, monkeypatch
):
    monkeypatch.setitem(__import__("sys").modules, "safetensors", None)  # as if not installed
    err = usage_error([*train_argv(tmp_path / "run"), "--export-hf", str(tmp_path / "hf")])
    assert "--export-hf writes safetensors files: pip install safetensors" in err
    assert not (tmp_path / "run").exists()


EOT = 7  # the end-of-text id of the packed token file


def test_packed_training_has_the_loss_of_the_documents_apart(train_argv, tmp_path):
    """Step 1's loss (before any update) of `--pack` on a token file with documents of 1 to 40
    tokens is the mean over the batch's tokens of each document run as a row of its own."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(8, 256, 4000).astype(np.uint16)
    tokens[np.cumsum(rng.integers(1, 41, 400))[:-1].clip(max=3999)] = EOT
    tokens.tofile(tmp_path / "docs.bin")
    out = tmp_path / "run"
    extra = ["--steps", "2", "--log-every", "1", "--generate", "0", "--eval-every", "0"]
    argv = train_argv(out, *extra, "--eval-batches", "1", data=tmp_path / "docs.bin")
    assert main([*argv, "--pack", "--eot-id", str(EOT)]) == 0
    config = TrainConfig(**json.loads((out / "summary.json").read_text())["config"])
    model = build_lm(config.model_config(vocab_size=256), torch.device("cpu"), seed=config.seed)
    train = np.memmap(tmp_path / "docs.bin", dtype=np.uint16)[: 4000 - 400]  # the 90% head
    batches = Batches(train, batch_size=config.batch_size, grad_accum=1, rank=0, world_size=1,
                      context_length=config.context_length, seed=config.seed)  # fmt: skip
    batch = batches.next(torch.device("cpu"))
    inputs, targets = batch[:, :-1], batch[:, 1:]
    assert (inputs == EOT).sum() >= len(inputs)  # about one document start per row, or more
    total = 0.0
    with torch.no_grad():
        for row, target in zip(inputs, targets, strict=True):
            starts = [0, *(i for i in range(1, len(row)) if row[i] == EOT), len(row)]
            for s, e in itertools.pairwise(starts):
                logits = model(row[None, s:e])[0]
                total += torch.nn.functional.cross_entropy(logits, target[s:e], reduction="sum")
    assert read_metrics(out)[0]["loss"] == pytest.approx(total.item() / inputs.numel(), abs=1e-5)


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["--eot-id", "3"], "--eot-id says where --pack splits documents: add --pack"),
        (["--pack"], "--tokenizer bytes has no such token: use --tokenizer bpe"),
        (["--pack", "--tokenizer", "bpe", "--baseline", "torch"], "torch's step (--baseline)"),
        (["--keep-last", "3"], "--keep-last 3 keeps the checkpoints --save-every writes"),
        (["--keep-last", "0"], "--keep-last must be at least 1"),
        (["--resume", "later"], "--resume takes no value, or auto"),
        (["--resume", "auto", "--no-checkpoint"], "continues from checkpoints: drop --no-check"),
    ],
)
def test_options_that_do_not_go_together_are_refused_before_any_file(
    train_argv, tmp_path, usage_error, extra, match
):
    assert match in usage_error([*train_argv(tmp_path / "run"), *extra])
    assert not (tmp_path / "run").exists()


def test_a_token_file_packs_only_with_its_end_of_text_id(train_argv, tmp_path, usage_error):
    np.arange(300, dtype=np.uint16).tofile(tmp_path / "ids.bin")
    argv = train_argv(tmp_path / "run", "--pack", data=tmp_path / "ids.bin")
    assert "--pack on a token file needs its end-of-text id: --eot-id ID" in usage_error(argv)
    assert "outside the vocabulary of 256" in usage_error([*argv, "--eot-id", "256"])


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["--attention", "fa2-triton"], "--attention fa2-triton runs Triton kernels"),
        (["--optimizer", "lmcore-fused"], "--optimizer lmcore-fused runs Triton kernels"),
    ],
)
def test_triton_paths_on_a_cpu_are_refused_before_any_file(
    train_argv, tmp_path, usage_error, monkeypatch, extra, match
):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # as a user's shell has it
    err = usage_error([*train_argv(tmp_path / "run"), *extra])
    assert match in err and "TRITON_INTERPRET=1" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "make",
    [lambda p: p / "missing.txt", lambda p: p / "short.txt"],
    ids=["missing", "too-short"],
)
def test_rejected_data_writes_no_file(train_argv, tmp_path, usage_error, make):
    (tmp_path / "short.txt").write_text("too short for a sequence of the tiny model\n")
    out = tmp_path / "run"
    usage_error(train_argv(out, "--tokenizer", "bpe", "--vocab-size", "300", data=make(tmp_path)))
    assert not out.exists() or not any(out.iterdir())  # no config.toml, no tokenizer.json


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_the_default_output_folder_is_ignored_by_git():
    default = Path(TrainConfig.__dataclass_fields__["out"].default)
    check = subprocess.run(["git", "-C", str(REPO), "check-ignore", "-q", str(default / "x")],
                           check=False)  # fmt: skip
    assert check.returncode == 0, f"{default} is not git-ignored"


def test_bpe_holds_the_end_of_text_token_that_separates_documents(tmp_path):
    from bench.train.tokenizer import EOT_TEXT, BPETokenizer

    tokenizer = BPETokenizer.train("a story.\n" * 50 + EOT_TEXT + "another one.\n" * 50, 280)
    ids = tokenizer.encode(f"the end.{EOT_TEXT}once")
    assert ids.count(tokenizer.eot_id) == 1
    assert tokenizer.decode(ids) == "the end.once"  # samples leave it out
