"""bench-generate's implementation: sample text from a saved bench-train run (`load_run`,
`sample`), and `run_parsed`, what its command runs.

What it does and the command line: `bench.commands.generate` (`bench-generate --help`).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

import lmcore
from bench.core.cli import resolve_device, usage_errors
from bench.core.layouts import PRECISIONS, autocast_dtype
from bench.core.step import build_lm
from bench.train.checkpoint import CHECKPOINT, read_checkpoint
from bench.train.choices import SAMPLING
from bench.train.config_files import recorded_config
from bench.train.tokenizer import Tokenizer, load_tokenizer

__all__ = ["load_run", "run_parsed", "sample"]


def sample(
    model: lmcore.TransformerLM,
    tokenizer: Tokenizer,
    *,
    prompt: str,
    tokens: int,
    temperature: float,
    top_p: float,
    seed: int,
    autocast_dtype: torch.dtype | None = None,
    use_cache: bool | None = None,
) -> str:
    """`prompt` and `tokens` tokens sampled after it, decoded (see `lmcore.generate`).

    Args:
        model: the model, on its device.
        tokenizer: encodes the prompt and decodes the sample.
        prompt: the text to continue.
        tokens: how many tokens to sample.
        temperature: softmax temperature; 0 is greedy.
        top_p: nucleus sampling mass in (0, 1].
        seed: the sampling generator's seed.
        autocast_dtype: run the model under autocast in this dtype; None for none.
        use_cache: decode with a KV cache (`lmcore.generate`'s; None: where fa2 is there).

    Raises:
        ValueError: the prompt encodes to no tokens.
    """
    ids = tokenizer.encode(prompt)
    if not ids:
        raise ValueError("--prompt encodes to no tokens; give a non-empty prompt")
    device = next(model.parameters()).device
    generator = torch.Generator(device).manual_seed(seed)
    with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
        out = lmcore.generate(
            model, ids, tokens, temperature=temperature, top_p=top_p, generator=generator,
            use_cache=use_cache,
        )  # fmt: skip
    return prompt + tokenizer.decode(out.tolist())


def load_run(
    run: str | Path, *, device: torch.device, attention: str | None = None
) -> tuple[lmcore.TransformerLM, Tokenizer, dict]:
    """The model of a run's checkpoint on `device`, the run's tokenizer and its configuration.

    Args:
        run: the run's output folder.
        device: where to put the model.
        attention: the attention backend; the run's (sdpa for fa2-triton off CUDA) when None.

    Raises:
        ValueError: no checkpoint, a damaged one or one without the trainer's record
            (`read_checkpoint`), or a run without a tokenizer (trained on token ids).
    """
    run = Path(run)
    if not (run / CHECKPOINT).is_file():
        raise ValueError(
            f"--run {run}: no {CHECKPOINT}; give the --out folder of a bench-train run"
        )
    checkpoint = read_checkpoint(run / CHECKPOINT)
    extra = checkpoint["extra"]
    config = recorded_config(extra)
    tokenizer = load_tokenizer(config["tokenizer"], run)
    if tokenizer is None:
        raise ValueError(f"--run {run}: no tokenizer.json (it trained on token ids)")
    model_config = lmcore.ModelConfig(**extra["model_config"])
    if attention is None and model_config.attention == "fa2-triton" and device.type != "cuda":
        attention = "sdpa"
    if attention is not None:
        model_config = lmcore.ModelConfig(**{**extra["model_config"], "attention": attention})
    model = build_lm(model_config, device, seed=config["seed"])
    lmcore.load_checkpoint(checkpoint, model, None)
    return model, tokenizer, config


def run_parsed(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    argv: Sequence[str] | None = None,
) -> int:
    """What `bench-generate` runs once its options have parsed (`bench.commands.generate`): load
    the run, sample, print; the exit status (0). Bad input ends as a usage error of `parser`."""
    with usage_errors(parser):
        device = resolve_device(args.device)
        model, tokenizer, config = load_run(args.run, device=device, attention=args.attention)
        chosen = {name: getattr(args, name, config[name]) for name in SAMPLING}
        precision = args.precision or (config["precision"] if device.type == "cuda" else "fp32")
        if PRECISIONS[precision].weights == "bf16":
            model = model.to(torch.bfloat16)
        started = time.perf_counter()
        text = sample(
            model,
            tokenizer,
            prompt=chosen["prompt"],
            tokens=chosen["generate"],
            temperature=chosen["temperature"],
            top_p=chosen["top_p"],
            seed=chosen["seed"],
            autocast_dtype=autocast_dtype(precision),
            use_cache=args.use_cache,
        )
        seconds = time.perf_counter() - started  # the text is on the host: the work is done
    sys.stdout.write(text + "\n")
    how = "with the KV cache" if args.use_cache else "without a KV cache (--no-cache)"
    print(
        f"bench-generate: {chosen['generate']} tokens in {seconds:.2f} s, "
        f"{chosen['generate'] / seconds:,.1f} tokens/s {how} on {device}",
        file=sys.stderr,
    )
    return 0
