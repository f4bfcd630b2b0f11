"""GPU measurements of what users call in lmcore: the fused loss patched into a Hugging Face
model, and decoding with the KV cache.

Run from the repository root on a CUDA machine (no install needed; one GPU, under a minute)::

    export PYTHONPATH=$(ls -d $PWD/packages/*/src | paste -sd:)
    python3 packages/lmcore/scripts/users_gpu.py --out $OUT
    python3 packages/lmcore/scripts/users_gpu.py --out $OUT --sections generate --dtype fp32 \
        --device cpu  # the agreement check (2 CPU cores: about an hour)

Sections (`--sections`, default both):

- `hf-loss`: peak memory and time of one training step's forward and backward of a Qwen2
  model at its real vocabulary (151,936; 2 layers of Qwen2-0.5B's width, 4 × 1,024 tokens,
  bf16), with transformers' own loss and with `apply_fused_linear_cross_entropy`; and, without
  transformers, the LM head and loss alone on the same shapes (materialised logits and
  `F.cross_entropy` against `fused_linear_cross_entropy`). Without transformers on the machine
  the model rows are skipped and say so.
- `generate`: tokens per second of `lmcore.generate` (greedy, batch 1) on the `small` model
  (bf16, context 1,024) without the KV cache (every token runs the window, through SDPA, the
  fastest backend for that) and with it (`fa2.flash_attn_with_kvcache`), for a short and a
  long prompt, and how many of the tokens agree. Where they part, the uncached logits there:
  the gap between the two tokens the paths chose, and the spacing of the dtype's numbers at
  the top logit (a gap of a spacing or two is a rounding tie, not a bug). `--dtype fp32`
  runs the same in float32, on the CPU too: the check that the two paths agree when
  rounding does not decide (its tokens/s are not a measurement).

Writes `hf_loss_memory_<device>_<date>.json` and `generate_kv_cache_<device>_<date>.json` under
`--out` (rows plus device, versions, date, command and revision: `BENCH_GIT_REVISION`, else the
checkout's `git rev-parse HEAD`) and prints a table of each last. `--tiny` runs toy sizes (on
the CPU too: the rehearsal of the script, not a measurement).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

import lmcore

SECTIONS = ("hf-loss", "generate")
# Qwen2-0.5B's width (hidden 896, 14 heads over 2 key/value heads, FFN 4,864) and vocabulary,
# with 2 of its 24 layers: the logits dominate the step's memory, as in any large-vocabulary
# model's LM head.
QWEN2 = dict(vocab_size=151_936, hidden_size=896, intermediate_size=4864, num_hidden_layers=2,
             num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=4096,
             tie_word_embeddings=True)  # fmt: skip
TINY_QWEN2 = QWEN2 | dict(vocab_size=997, hidden_size=64, intermediate_size=96,
                          num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
REPEATS = 5  # timed steps per variant, after one warm-up (median reported)


def _revision() -> str | None:
    named = os.environ.get("BENCH_GIT_REVISION")
    if named:
        return named
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip() or None


def _environment(device: torch.device) -> dict:
    versions = {"python": platform.python_version(), "torch": torch.__version__}
    for name in ("triton", "transformers"):
        try:
            versions[name] = __import__(name).__version__
        except ImportError:
            versions[name] = None
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "versions": versions,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "git_revision": _revision(),
    }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _measure(step: Callable[[], float], device: torch.device) -> dict:
    """Run `step` once to warm up, then REPEATS times: the median time (ms), the peak memory
    above what was allocated before a step (MiB, CUDA only) and the step's last loss."""
    step()
    times, peaks, loss = [], [], None
    for _ in range(REPEATS):
        _sync(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            before = torch.cuda.memory_allocated(device)
        start = time.perf_counter()
        loss = step()
        _sync(device)
        times.append((time.perf_counter() - start) * 1e3)
        if device.type == "cuda":
            peaks.append((torch.cuda.max_memory_allocated(device) - before) / 2**20)
    return {
        "step_ms": statistics.median(times),
        "peak_above_start_mib": max(peaks) if peaks else None,
        "loss": loss,
    }


def _hf_rows(device: torch.device, tiny: bool, tokens: torch.Tensor) -> list[dict]:
    """Qwen2 with transformers' loss, then patched: rows, or one row saying why none."""
    try:
        import transformers
    except ImportError:
        return [{"case": "Qwen2 model", "variant": "skipped: transformers is not installed"}]
    sizes = TINY_QWEN2 if tiny else QWEN2
    rows = []
    for variant in ("transformers loss", "apply_fused_linear_cross_entropy"):
        torch.manual_seed(0)
        config = transformers.Qwen2Config(**sizes, attn_implementation="sdpa")
        model = transformers.Qwen2ForCausalLM(config).to(device, torch.bfloat16).train()
        if variant != "transformers loss":
            lmcore.apply_fused_linear_cross_entropy(model)

        def step(model=model) -> float:
            model.zero_grad(set_to_none=True)
            loss = model(tokens, labels=tokens).loss
            loss.backward()
            return loss.item()

        rows.append({"case": f"Qwen2 {sizes['num_hidden_layers']} layers", "variant": variant,
                     **_measure(step, device)})  # fmt: skip
        del model
    return rows


def _head_rows(device: torch.device, tiny: bool, num_tokens: int) -> list[dict]:
    """The LM head and loss alone: materialised logits and F.cross_entropy, then fused."""
    sizes = TINY_QWEN2 if tiny else QWEN2
    torch.manual_seed(0)
    hidden = torch.randn(num_tokens, sizes["hidden_size"], device=device, dtype=torch.bfloat16)
    hidden.requires_grad_()
    weight = torch.randn(sizes["vocab_size"], sizes["hidden_size"], device=device,
                         dtype=torch.bfloat16).mul_(0.02).requires_grad_()  # fmt: skip
    targets = torch.randint(0, sizes["vocab_size"], (num_tokens,), device=device)
    losses = {
        "logits + F.cross_entropy (fp32 upcast)": lambda: F.cross_entropy(
            (hidden @ weight.t()).float(), targets
        ),
        "fused_linear_cross_entropy": lambda: lmcore.fused_linear_cross_entropy(
            hidden, weight, targets
        ),
    }
    rows = []
    for variant, loss_fn in losses.items():

        def step(loss_fn=loss_fn) -> float:
            hidden.grad = weight.grad = None
            loss = loss_fn()
            loss.backward()
            return loss.item()

        rows.append({"case": "LM head + loss", "variant": variant, **_measure(step, device)})
    return rows


def hf_loss(device: torch.device, tiny: bool) -> dict:
    """The `hf-loss` section's result."""
    batch, seq = (2, 64) if tiny else (4, 1024)
    vocab = (TINY_QWEN2 if tiny else QWEN2)["vocab_size"]
    tokens = torch.randint(0, vocab, (batch, seq), device=device)
    rows = _hf_rows(device, tiny, tokens) + _head_rows(device, tiny, batch * seq)
    return {"tool": "hf-loss-memory", "config": {"batch": batch, "seq": seq, "vocab": vocab,
            "dtype": "bf16", "repeats": REPEATS}, "rows": rows}  # fmt: skip


DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def _parting(model: torch.nn.Module, window: torch.Tensor, chosen: dict[bool, int]) -> dict:
    """Where the cached and uncached tokens part: the uncached logits of `window` (the prompt
    and the tokens both chose so far), the gap between the token each path chose there, and the
    spacing of the logits' dtype at the top logit (its unit in the last place)."""
    context = model.config.context_length
    logits = model(window[-context:].unsqueeze(0))[0, -1]  # (vocab,), the model's dtype
    top = logits.max().float().abs().item()
    spacing = torch.finfo(logits.dtype).eps * 2.0 ** math.floor(math.log2(top)) if top else 0.0
    return {
        "logit_gap_where_they_part": (logits[chosen[False]] - logits[chosen[True]]).item(),
        "logit_spacing_there": spacing,
    }


def generate_rows(device: torch.device, tiny: bool, dtype: str = "bf16") -> dict:
    """The `generate` section's result, the model in `dtype` (a key of `DTYPES`)."""
    if tiny:
        config = lmcore.ModelConfig(vocab_size=97, context_length=64, d_model=64, num_layers=2,
                                    num_heads=4, d_ff=96, attention="sdpa")  # fmt: skip
        cases = [(8, 16), (40, 16)]
    else:
        config = lmcore.model_config("small", context_length=1024, attention="sdpa")
        cases = [(128, 256), (768, 256)]  # (prompt tokens, new tokens)
    torch.manual_seed(0)
    model = lmcore.TransformerLM.from_config(config).to(device, DTYPES[dtype]).eval()
    rows = []
    for prompt_len, new in cases:
        prompt = torch.randint(0, config.vocab_size, (prompt_len,), device=device)
        outputs = {}
        for use_cache in (False, True):
            lmcore.generate(model, prompt, 4, temperature=0.0, use_cache=use_cache)  # warm-up
            _sync(device)
            start = time.perf_counter()
            outputs[use_cache] = lmcore.generate(model, prompt, new, temperature=0.0,
                                                 use_cache=use_cache)  # fmt: skip
            _sync(device)
            seconds = time.perf_counter() - start
            rows.append({
                "case": f"prompt {prompt_len}, {new} new tokens",
                "variant": "KV cache (fa2.flash_attn_with_kvcache)" if use_cache
                else "no cache (window through SDPA)",
                "tokens_per_s": outputs[use_cache].numel() / seconds,
                "seconds": seconds,
            })  # fmt: skip
        same = (outputs[True] == outputs[False]).int().cumprod(0).sum().item()
        rows[-1]["tokens_equal_to_uncached_prefix"] = same
        rows[-1]["vs_no_cache"] = rows[-1]["tokens_per_s"] / rows[-2]["tokens_per_s"]
        if same < min(outputs[True].numel(), outputs[False].numel()):
            with torch.no_grad():
                window = torch.cat((prompt, outputs[False][:same]))
                chosen = {cached: outputs[cached][same].item() for cached in (False, True)}
                rows[-1] |= _parting(model, window, chosen)
    return {"tool": "generate-kv-cache", "config": {"model": "tiny" if tiny else "small",
            "context_length": config.context_length, "dtype": dtype, "greedy": True,
            "batch": 1}, "rows": rows}  # fmt: skip


def _table(result: dict) -> str:
    rows = result["rows"]
    columns = list(dict.fromkeys(c for row in rows for c in row if c != "case"))
    lines = ["| case | " + " | ".join(columns) + " |", "|" + " --- |" * (len(columns) + 1)]
    for row in rows:
        cells = [row.get(c) for c in columns]
        text = [
            f"{c:.4g}" if isinstance(c, float) else ("" if c is None else str(c)) for c in cells
        ]
        lines.append(f"| {row['case']} | " + " | ".join(text) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the JSON results")
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"comma-separated, of {', '.join(SECTIONS)}")  # fmt: skip
    parser.add_argument("--tiny", action="store_true", help="toy sizes: a rehearsal, not a result")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=list(DTYPES), default="bf16",
                        help="the generate section's model dtype (default bf16)")  # fmt: skip
    args = parser.parse_args(argv)
    sections = args.sections.split(",")
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown sections {unknown}; choose from {', '.join(SECTIONS)}")
    device = torch.device(args.device)
    agreement_check = sections == ["generate"] and args.dtype == "fp32"
    if device.type != "cuda" and not (args.tiny or agreement_check):
        parser.error(
            "the measurements need a CUDA device; --tiny rehearses them on the CPU, and "
            "--sections generate --dtype fp32 checks the tokens' agreement there"
        )
    environment = _environment(device)
    slug = environment["device"].split()[-1].lower() if device.type == "cuda" else "cpu"
    stem_date = environment["date"][:10]
    args.out.mkdir(parents=True, exist_ok=True)
    runs = {
        "hf-loss": ("hf_loss_memory", hf_loss),
        "generate": (
            "generate_kv_cache" + ("" if args.dtype == "bf16" else f"_{args.dtype}"),
            functools.partial(generate_rows, dtype=args.dtype),
        ),
    }
    tables = []
    for section in sections:
        stem, run = runs[section]
        result = {**run(device, args.tiny), **environment, "tiny": args.tiny}
        path = args.out / f"{stem}_{slug}_{stem_date}.json"
        path.write_text(json.dumps(result, indent=1) + "\n")
        tables.append(f"{path.name}\n{_table(result)}")
    print("\n\n".join(tables))
    return 0


if __name__ == "__main__":
    sys.exit(main())
