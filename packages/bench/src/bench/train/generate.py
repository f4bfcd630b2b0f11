"""bench-generate: sample text from a saved bench-train run, on a CPU or a GPU, without training.

    bench-generate --run runs/small --prompt "ROMEO:" --generate 300
    bench-generate --run runs/small --device cpu --temperature 0      # greedy, on the CPU

It reads the run's `checkpoint.pt` (the weights and the model's configuration) and its tokenizer
(`tokenizer.json` for BPE), and prints the prompt and what follows it. The sampling options
default to the run's own (`--prompt`, `--generate`, `--temperature`, `--top-p`, `--seed`), so on
the run's device, with its attention backend and precision, it prints the run's `sample.txt`
again. The attention backend changes no weight: `--attention` may name any (the run's by
default; sdpa in place of fa2-triton off CUDA, whose kernels need a GPU).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

import lmcore
from bench.core.cli import resolve_device, usage_errors
from bench.core.training import build_lm
from bench.train.checkpoint import CHECKPOINT, read_checkpoint
from bench.train.config import PRECISIONS, TrainConfig
from bench.train.options import add_options
from bench.train.tokenizer import Tokenizer, load_tokenizer

__all__ = ["build_parser", "load_run", "main", "sample"]

_SAMPLING = ("generate", "prompt", "temperature", "top_p", "seed")


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
            model, ids, tokens, temperature=temperature, top_p=top_p, generator=generator
        )
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
    config = extra["config"]
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


def build_parser() -> argparse.ArgumentParser:
    """The `bench-generate` command line; the sampling options are bench-train's own."""
    first, _, rest = (__doc__ or "").partition("\n\n")
    parser = argparse.ArgumentParser(
        prog="bench-generate",
        description=first + "\n\n" + rest,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--run", required=True, type=Path, metavar="DIR", help="a bench-train --out folder"
    )
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda (default: auto)")
    parser.add_argument(
        "--attention",
        choices=list(lmcore.ATTENTION_BACKENDS),
        help="attention backend (default: the run's)",
    )
    parser.add_argument(
        "--precision",
        choices=list(PRECISIONS),
        help="autocast dtype (default: the run's on CUDA, fp32 on a CPU)",
    )
    sampling = parser.add_argument_group("sampling", "bench-train's options (default: the run's)")
    return add_options(parser, TrainConfig, names=_SAMPLING, into=sampling, defaults=False)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `bench-generate` (see the module docstring)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    with usage_errors(parser):
        device = resolve_device(args.device)
        model, tokenizer, config = load_run(args.run, device=device, attention=args.attention)
        chosen = {name: getattr(args, name, config[name]) for name in _SAMPLING}
        precision = args.precision or (config["precision"] if device.type == "cuda" else "fp32")
        text = sample(
            model,
            tokenizer,
            prompt=chosen["prompt"],
            tokens=chosen["generate"],
            temperature=chosen["temperature"],
            top_p=chosen["top_p"],
            seed=chosen["seed"],
            autocast_dtype=PRECISIONS[precision],
        )
    sys.stdout.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
