"""The training loop on one rank: `Trainer` builds its parts once, then steps.

As torchtitan's Trainer does, the constructor builds every part in a fixed order and keeps it by
name: the data (`bench.train.data`), the model and its loss (`bench.train.lm`), the parallel mode
that wraps the model and builds the optimizer (`bench.train.parallel`), the checkpointer (which
restores a resumed run), the recorder, and the mode's training step. `train()` then steps: the
learning rate of `lmcore.cosine_lr` (linear warm-up, cosine decay to `--min-lr` at `--steps`),
the micro-batches, the step, and on schedule a log line with an evaluation, a checkpoint; it ends
after `--stop-after`, `--steps` or `--time-budget`, whichever comes first, with an evaluation, a
checkpoint and a sample.

Every step is the project's one training step (`bench.core.step.train_step`: autocast,
gradient accumulation with the wrapper's `no_sync`, the wrapper's synchronisation, clipping, the
optimizer step; under `--precision fp16` the loss scaled by a `bench.core.loss_scale.LossScaler`,
whose state every checkpoint keeps and whose skipped steps the metrics count), or torch's own
under `--baseline torch` (`bench.train.baseline`).
"""

from __future__ import annotations

import functools
import time
from typing import Any

import torch
import torch.distributed as dist

import lmcore
from bench.core.layouts import autocast_dtype, loss_scaled
from bench.core.loss_scale import LossScaler
from bench.core.memory import MIB, peak_memory
from bench.core.model_runtime import loss_function, next_token_loss
from bench.core.step import train_step
from bench.core.torch_native import torch_native_model
from bench.train import lm
from bench.train.baseline import torch_native_step
from bench.train.checkpoint import Checkpointer
from bench.train.config import TrainConfig
from bench.train.config_files import write_run_config
from bench.train.data import Batches, Corpus, default_cache_dir, load_corpus
from bench.train.faults import kill_point
from bench.train.generate import sample
from bench.train.parallel import TrainerParallel
from bench.train.record import Recorder, mfu_function, profiled
from bench.train.tokenizer import EOT_TEXT, load_tokenizer, save_tokenizer

__all__ = ["Trainer", "corpus_of", "train_on_rank"]


def corpus_of(config: TrainConfig) -> Corpus:
    """The run's tokens (tokenised now, or read from the cache) and tokenizer.

    Raises:
        ValueError: bad data (`load_corpus`), or `--pack` without an end-of-text token.
    """
    corpus = load_corpus(
        config.data,
        val_data=config.val_data,
        tokenizer=config.tokenizer,
        vocab_size=config.vocab_size,
        context_length=config.context_length,
        out_dir=config.out,
        cache_dir=config.cache_dir or default_cache_dir(),
        resume=bool(config.resume),
        eot_id=config.eot_id,
    )
    if config.pack and corpus.eot_id is None:
        raise ValueError(
            f"--pack: the tokenizer in --out {config.out} has no {EOT_TEXT} token (written "
            "before it had one); start the run again in a new --out, or give --eot-id"
        )
    return corpus


def _mean_over_ranks(value: torch.Tensor) -> float:
    """`value` averaged over the ranks (equal shares, so the mean over the global batch)."""
    if dist.is_initialized():
        value = value.clone()
        dist.all_reduce(value)
        value /= dist.get_world_size()
    return value.item()


def _busiest_peak_mib(device: torch.device) -> float | None:
    """The most memory allocated at once on any rank since the run began, in MiB (a collective
    with several ranks); None off CUDA."""
    peak = peak_memory(device)
    if peak is None:
        return None
    value = torch.tensor(float(peak), dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return value.item() / MIB


def _device(config: TrainConfig) -> torch.device:
    device = torch.device(config.device)
    if device.type != "cuda":
        return device
    if dist.is_initialized() or device.index is None:  # the rank's GPU, named so calls agree
        device = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.set_device(device)
    return device


class Trainer:
    """One rank of a bench-train run (the whole run when there is one process).

    Args:
        config: the run.
        rank: this rank.
        world_size: the number of ranks.
    """

    def __init__(self, config: TrainConfig, *, rank: int = 0, world_size: int = 1) -> None:
        self.config, self.rank, self.world_size = config, rank, world_size
        self.primary = rank == 0
        self.device = device = _device(config)
        if dist.is_initialized() and not self.primary:
            dist.barrier()  # rank 0 tokenises (or finds the cache) first
        self.corpus = corpus_of(config)
        if dist.is_initialized() and self.primary:
            dist.barrier()
        self.batches = self._batches(self.corpus.train, seed=config.seed)
        # where packed documents start (`--pack`); None: plain rows
        self.eot_id = self.corpus.eot_id if config.pack else None

        self.model_config = config.model_config(vocab_size=self.corpus.vocab_size)
        self.raw = lm.build_model(
            self.model_config,
            device,
            seed=config.seed,
            activation_checkpointing=config.activation_checkpointing,
        )
        decayed = lm.decayed_names(self.raw)
        self.loss_fn = loss_function(compile=config.compile, backend=config.compile_backend)
        # `--baseline torch` runs bench-step's torch-native model, which compiles its own pieces.
        baseline = config.baseline == "torch"
        self.parallel = TrainerParallel(
            config.parallel,
            rank=rank,
            device=device,
            precision=config.precision,
            compile=config.compile and not baseline,
            compile_backend=config.compile_backend,
            bucket_size_mb=config.bucket_size_mb,
            broadcast_mb=config.bucket_size_mb,
        )
        step_model = (
            torch_native_model(
                self.raw, compile=config.compile, compile_backend=config.compile_backend
            )
            if baseline
            else self.raw
        )
        self.model = self.parallel.wrap(step_model)
        optimizer_cls, options = lm.optimizer_class(
            config.optimizer, lr=config.lr, param_dtype=next(self.raw.parameters()).dtype
        )
        groups = lm.param_groups(self.raw, decayed, config.weight_decay)
        self.optimizer = self.parallel.build_optimizer(groups, optimizer_cls, options)
        self.loss_scaler = (
            LossScaler(device, init_scale=config.loss_scale)
            if loss_scaled(config.precision)
            else None
        )

        tokenizer = self.corpus.tokenizer
        self.checkpointer = Checkpointer(
            config,
            self.parallel,
            rank=rank,
            world_size=world_size,
            model_config=self.model_config,
            tokenizer=None if tokenizer is None else tokenizer.fingerprint(),
            device=device,
        )
        self.start, saved = self.checkpointer.load(
            self.model, self.raw, self.optimizer, self.batches.generator, self.loss_scaler
        )
        if self.primary:  # once a --resume's checkpoint has loaded: a refused one changes nothing
            write_run_config(config)
        mfu = mfu_function(config, self.model_config, device, world_size)
        self.recorder = Recorder(
            config, start=self.start, primary=self.primary, mfu=mfu, saved=saved
        )
        if config.baseline == "torch":
            self.step_fn = functools.partial(torch_native_step, scaler=self.loss_scaler)
        else:
            sharded = self.parallel.sharded_params(self.raw, decayed)
            self.step_fn = functools.partial(
                train_step,
                sharded_params=sharded,
                loss_fn=self.loss_fn,
                fused_loss=config.loss == "fused",
                loss_scaler=self.loss_scaler,
                eot_id=self.eot_id,
            )

    def _batches(self, tokens: Any, *, seed: int) -> Batches:
        c = self.config
        return Batches(
            tokens,
            batch_size=c.batch_size,
            grad_accum=c.grad_accum,
            context_length=c.context_length,
            rank=self.rank,
            world_size=self.world_size,
            seed=seed,
        )

    def step(self, step: int) -> tuple[torch.Tensor, float]:
        """Optimizer step `step` (counted from 1): its mean loss (on the device) and its lr."""
        c = self.config
        lr = lmcore.cosine_lr(step - 1, c.lr, c.final_lr, c.warmup, c.steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        micro_batches = [self.batches.next(self.device) for _ in range(c.grad_accum)]
        with profiled(c, step, self.device, self.primary):
            loss = self.step_fn(
                self.model,
                self.optimizer,
                micro_batches,
                autocast_dtype=autocast_dtype(c.precision),
                max_grad_norm=c.grad_clip or None,
            )
        kill_point("step", step)
        return loss, lr

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean validation loss over `--eval-batches` global batches, the same ones every time
        (documents apart under `--pack`, as in training)."""
        c = self.config
        batches = self._batches(self.corpus.val, seed=c.seed + 1)
        dtype = autocast_dtype(c.precision)
        total = torch.zeros((), device=self.device)
        for _ in range(c.eval_batch_count):
            tokens = batches.next(self.device)
            with torch.autocast(self.device.type, dtype=dtype, enabled=dtype is not None):
                total += next_token_loss(
                    self.model, tokens[:, :-1], tokens[:, 1:], fused=False,
                    loss_fn=self.loss_fn, eot_id=self.eot_id,
                )  # fmt: skip
        return _mean_over_ranks(total / c.eval_batch_count)

    def save(self, step: int) -> None:
        """Write the checkpoint of `step` (every rank calls it)."""
        self.checkpointer.save(
            step,
            self.model,
            self.raw,
            self.optimizer,
            self.batches.generator,
            record=self.recorder.state(),
            loss_scaler=self.loss_scaler,
        )

    def _out_of_time(self, started: float, *, logging: bool) -> bool:
        """Whether `--time-budget` has run out since `started`: by this process's clock at every
        step, or with several ranks by rank 0's at the logged steps (where they synchronise
        anyway), so that all stop after the same step."""
        budget = self.config.time_budget
        if budget is None:
            return False
        over = time.perf_counter() - started >= budget
        if not dist.is_initialized():
            return over
        if not logging:
            return False
        flag = torch.tensor(float(over), device=self.device)
        dist.broadcast(flag, src=0)
        return bool(flag.item())

    def train(self) -> dict[str, Any]:
        """Train from the checkpoint (or the start) to the last step; rank 0's result.

        From a checkpoint at the last step (a run killed after it), nothing is trained: the
        result is the one the checkpoint and the metrics recorded, with a new sample.
        """
        c, recorder = self.config, self.recorder
        step, stopped_by = self.start, None
        if self.start == c.last_step:
            recorder.say(f"the checkpoint is at the last step, {step}: writing the outputs")
        started = time.perf_counter()
        try:
            for step in range(self.start + 1, c.last_step + 1):
                step_loss, lr = self.step(step)
                if step == self.start + 1:
                    _mean_over_ranks(step_loss)  # waits for the step (compilation included)
                    recorder.first_step_s = time.perf_counter() - started
                    compiled = " (compilation included)" if c.compile else ""
                    recorder.say(f"first step: {recorder.first_step_s:.1f} s{compiled}")
                if step == c.profile_step:
                    recorder.exclude_interval()
                evaluating = bool(c.eval_interval) and step % c.eval_interval == 0
                logging = step % c.log_interval == 0 or evaluating
                if self._out_of_time(started, logging=logging):
                    stopped_by = "time-budget"
                last = step == c.last_step or stopped_by is not None
                if logging or last:
                    loss = _mean_over_ranks(step_loss)  # waits for the step to end
                    seconds = recorder.elapsed()  # before evaluating (a compiled model recompiles)
                    val_loss = self.evaluate() if evaluating or last else None
                    recorder.log(step, loss, lr, val_loss, seconds, scaling=self._scaling())
                if c.save_every and step % c.save_every == 0 and not last:
                    self.save(step)
                if logging or last or (c.save_every and step % c.save_every == 0):
                    recorder.restart_clock()
                if last:
                    break
            if step > self.start and c.checkpoint:
                self.save(step)
        finally:
            recorder.close()
        kill_point("outputs")
        if stopped_by is None and step < c.steps:
            stopped_by = "stop-after"
        tokens_per_s, mfu = recorder.speed()
        final = recorder.final()
        model = self.final_model() if c.generate or c.export_hf else None
        if model is not None and c.export_hf:
            self.export(model)
        return {
            "final_train_loss": final.get("loss"),
            "final_val_loss": final.get("val_loss"),
            "steps": step,
            "stopped_by": stopped_by,
            "first_step_s": recorder.first_step_s,
            "tokens_per_s": tokens_per_s,
            "mfu": mfu,
            "sample": self.sample(model),
            "parameters": lmcore.count_parameters(self.model_config),
            "vocab_size": self.corpus.vocab_size,
            "val_source": self.corpus.val_source,
            "records": recorder.records,
            "world_size": self.world_size,
            "peak_memory_mib": _busiest_peak_mib(self.device),
            **(self._scaling() or {}),
        }

    def _scaling(self) -> dict[str, float] | None:
        """fp16's loss scale now and the optimizer steps skipped so far (None: no scaling)."""
        scaler = self.loss_scaler
        if scaler is None:
            return None
        return {"loss_scale": scaler.get_scale(), "skipped_steps": scaler.skipped_steps}

    def final_model(self) -> torch.nn.Module | None:
        """The model with its full weights on rank 0 (None elsewhere): in the sharded modes
        gathered first (a collective: every rank calls)."""

        def build() -> torch.nn.Module:
            return lm.build_model(self.model_config, self.device, seed=self.config.seed)

        return self.parallel.gathered_model(self.model, self.raw, build)

    def export(self, model: torch.nn.Module) -> None:
        """Write `model` (`final_model`'s, on rank 0) as a Hugging Face Llama checkpoint to
        `--export-hf`, with the BPE tokenizer (`tokenizer.json`) beside it; the end-of-text
        token is its beginning and end of a sequence (GPT-2's convention)."""
        c = self.config
        eot = self.corpus.eot_id
        lmcore.export_hf(model, c.export_hf, bos_token_id=eot, eos_token_id=eot)
        tokenizer = self.corpus.tokenizer or load_tokenizer(c.tokenizer, c.out)
        if tokenizer is not None:
            save_tokenizer(tokenizer, c.export_hf)
        self.recorder.say(f"exported a Hugging Face Llama checkpoint to {c.export_hf}")

    def sample(self, model: torch.nn.Module | None) -> str | None:
        """`--generate` tokens after `--prompt` from `model` (`final_model`'s) on rank 0 (None
        elsewhere, or without a tokenizer)."""
        c = self.config
        tokenizer = self.corpus.tokenizer or load_tokenizer(c.tokenizer, c.out)
        if not c.generate or model is None or tokenizer is None:
            return None
        return sample(
            model,
            tokenizer,
            prompt=c.prompt,
            tokens=c.generate,
            temperature=c.temperature,
            top_p=c.top_p,
            seed=c.seed,
            autocast_dtype=autocast_dtype(c.precision),
        )


def train_on_rank(rank: int, world_size: int, config: TrainConfig) -> dict[str, Any]:
    """`Trainer(config, ...).train()` on one rank: `bench.core.launch`'s worker."""
    return Trainer(config, rank=rank, world_size=world_size).train()
