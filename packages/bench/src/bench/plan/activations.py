"""What `lmcore.TransformerLM`'s eager code saves for backward, tensor by tensor, as formulas.

The "residuals" of the handout's §3.1: every tensor autograd keeps from the forward pass for the
backward pass, counted once per storage (a tensor several operations save counts once), without
the parameters themselves and without views of RoPE's tables (buffers). Read off lmcore's code
(`norm.py`, `attention.py`, `backends.py`, `ffn.py`, `loss.py`) and checked in the tests against
the tensors the autograd graph of a real lmcore model holds.

Symbols: T = b·s tokens on the device (b sequences of s tokens), d = d_model, d_kv = key/value
width (num_kv_heads · head_dim), f = d_ff, h query heads, V vocabulary, t tensor-parallel ranks
(each holds h/t heads, d/t of the attention width and f/t of the FFN width; norms and the
residual stream stay whole). Three activation regimes:

- `fp32`: everything float32 (4 bytes).
- `autocast`: float32 parameters under `torch.autocast(bfloat16)` on CUDA. The residual stream
  and RMSNorm stay float32; each Linear casts its input to bf16 itself (autocast caches casts
  of parameters only, so RMSNorm's output is cast once per projection that reads it); softmax
  runs in float32 (CUDA's autocast float32 list), and the second attention matmul casts the
  weights back to bf16. The bf16 copies of the weights (autocast's cache) are saved by the
  matmuls that use them.
- `bf16`: parameters and activations bfloat16 (a model built or cast in bf16). RMSNorm upcasts
  its input to float32 and saves that copy.

Attention: `naive` materialises the (s × s) scores per head and saves the softmax output;
`sdpa`, `fa2-pytorch` and `fa2-triton` (fused kernels) save q, k, v, their output and one
float32 logsumexp per query and head instead.

Example::

    >>> config = lmcore.model_config("xl", context_length=2048)
    >>> total = sum(r.num_bytes for r in block_residuals(config, batch=4, seq_len=2048,
    ...                                                   regime="fp32"))
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import lmcore
from bench.core.model_options import LOSSES
from bench.plan.params import model_parameters

__all__ = [
    "ATTENTION_KINDS",
    "REGIMES",
    "LossMemory",
    "Residual",
    "block_backward_working_set",
    "block_residuals",
    "combined_formula",
    "compute_bytes",
    "fused_loss_chunk_tokens",
    "head_residuals",
    "loss_memory",
    "materializes_scores",
    "residual_bytes",
    "residual_stream_bytes",
    "total_bytes",
]

REGIMES = ("fp32", "autocast", "bf16")
# lmcore's attention backends and whether each materialises the (s × s) scores.
ATTENTION_KINDS = {"naive": True, "sdpa": False, "fa2-pytorch": False, "fa2-triton": False}

_INT64 = 8  # token ids and targets
_FP32 = 4


@dataclass(frozen=True)
class Residual:
    """One tensor saved for backward (or one group of equal ones).

    Attributes:
        where: the layer that produces it (`"ln1"`, `"attn"`, `"ffn"`, `"loss"`, ...).
        tensor: what it is, in words.
        num_bytes: its size on one device.
        coefficient: bytes per element times copies, the number in front of `symbols`.
        symbols: the elements in symbols (`"T·d"`, `"b·h·s²"`; `/t` when split over TP ranks).
    """

    where: str
    tensor: str
    num_bytes: int
    coefficient: int
    symbols: str

    @property
    def formula(self) -> str:
        """The size in symbols: `4·T·d` (`s²` for a coefficient of 1)."""
        return self.symbols if self.coefficient == 1 else f"{self.coefficient}·{self.symbols}"


def combined_formula(residuals: Sequence[Residual]) -> str:
    """The sum of `residuals` in symbols, like terms added: `40·T·d + 16·T·f + 4·b·h·s²`."""
    sums: dict[str, int] = {}
    for r in residuals:
        sums[r.symbols] = sums.get(r.symbols, 0) + r.coefficient
    return " + ".join(symbols if c == 1 else f"{c}·{symbols}" for symbols, c in sums.items())


def materializes_scores(attention: str) -> bool:
    """Whether the attention backend `attention` materialises the (s × s) score matrix.

    Raises:
        ValueError: an attention backend this model does not know.
    """
    try:
        return ATTENTION_KINDS[attention]
    except KeyError:
        raise ValueError(
            f"unknown attention {attention!r}; the memory model knows {', '.join(ATTENTION_KINDS)}"
        ) from None


def _check(regime: str, batch: int, seq_len: int, tp: int) -> None:
    if regime not in REGIMES:
        raise ValueError(f"regime must be one of {REGIMES}, got {regime!r}")
    for name, value in (("batch", batch), ("seq_len", seq_len), ("tp", tp)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def compute_bytes(regime: str) -> int:
    """Bytes of a matmul's inputs and outputs: 4 in fp32, 2 under autocast or in bf16."""
    return _FP32 if regime == "fp32" else 2


def residual_bytes(regime: str) -> int:
    """Bytes per element of the residual stream: 4, except 2 for a bf16 model."""
    return 2 if regime == "bf16" else _FP32


def residual_stream_bytes(batch: int, seq_len: int, d_model: int, *, element_bytes: int = 4) -> int:
    """Bytes of one residual-stream activation (batch, seq, d_model): `b·s·d·bytes` (§2 (d))."""
    return batch * seq_len * d_model * element_bytes


def _tp_width(width: int, tp: int) -> int:
    return -(-width // tp)


def _res(where: str, tensor: str, coefficient: int, symbols: str, elements: int) -> Residual:
    """A residual of `coefficient · elements` bytes, written `coefficient·symbols`."""
    return Residual(where, tensor, coefficient * elements, coefficient, symbols)


def _norm(
    where: str, regime: str, tokens: int, d: int, consumers: int, what: str
) -> list[Residual]:
    """The RMSNorm of `norm.py`: its input saved by the square (the fp32 copy in a bf16 model),
    rsqrt(mean(x²) + eps), x·rms saved by the gain's multiply, the output saved by its readers."""
    upcast = ", upcast to fp32" if regime == "bf16" else ""
    out = [
        _res(where, f"input {what}{upcast}", 4, "T·d", tokens * d),
        _res(where, "rsqrt(mean(x²) + eps)", 4, "T", tokens),
        _res(where, "x · rms⁻¹ (fp32)", 4, "T·d", tokens * d),
    ]
    if regime == "bf16":
        out.append(_res(where, "gain upcast to fp32", 4, "d", d))
    if regime == "autocast":
        text = f"output cast to bf16 by each of its {consumers} matmul(s)"
        out.append(_res(where, text, 2 * consumers, "T·d", tokens * d))
    else:
        text = "output (saved by the matmuls that read it)"
        out.append(_res(where, text, compute_bytes(regime), "T·d", tokens * d))
    return out


def block_residuals(
    config: lmcore.ModelConfig, *, batch: int, seq_len: int, regime: str, tp: int = 1
) -> list[Residual]:
    """The tensors one `TransformerBlock` saves for backward on one device.

    Args:
        config: the model (width, heads, attention backend `config.attention`).
        batch: sequences on this device (the micro-batch).
        seq_len: tokens per sequence s.
        regime: one of `REGIMES`.
        tp: tensor-parallel ranks the block is split over.

    Returns:
        The residuals in the order the forward pass makes them. Under `autocast` the last one is
        the block's bf16 weight copies (autocast's cache), which its matmuls save.

    Raises:
        ValueError: an unknown regime or attention backend, or a size that is not positive.
    """
    _check(regime, batch, seq_len, tp)
    naive = materializes_scores(config.attention)
    b, s, d = batch, seq_len, config.d_model
    tokens = b * s
    c = compute_bytes(regime)
    heads = _tp_width(config.num_heads, tp)
    d_attn = heads * config.head_dim  # d/t: this rank's share of the attention width
    d_kv = _tp_width(config.kv_heads, tp) * config.head_dim
    f_tp = _tp_width(config.d_ff, tp)
    per = "" if tp == 1 else "/t"
    td, tf, bhs2 = f"T·d{per}", f"T·f{per}", f"b·h{per}·s²"
    scores = b * heads * s * s
    out = _norm("ln1", regime, tokens, d, 3, "x (the block's input)")
    out.append(_res("attn", "queries after RoPE", c, td, tokens * d_attn))
    if naive:
        grouped = " (repeated to every query head)" if config.kv_heads != config.num_heads else ""
        out += [
            _res("attn", "keys after RoPE" + grouped, c, td, tokens * d_attn),
            _res("attn", "contiguous copy of the values" + grouped, c, td, tokens * d_attn),
            _res("attn", "causal mask (bool)", 1, "s²", s * s),
        ]
        if regime == "autocast":
            out += [
                _res("attn", "softmax output (fp32: autocast's float32 list)", 4, bhs2, scores),
                _res("attn", "softmax output cast to bf16 for the second matmul", 2, bhs2, scores),
            ]
        else:
            out.append(_res("attn", "softmax output (attention weights)", c, bhs2, scores))
    else:
        tkv = f"T·d_kv{per}" if config.kv_heads != config.num_heads else td
        out += [
            _res("attn", "keys after RoPE", c, tkv, tokens * d_kv),
            _res("attn", "values", c, tkv, tokens * d_kv),
            _res("attn", "attention output (heads layout, saved by the kernel)", c, td,
                 tokens * d_attn),
            _res("attn", "logsumexp per query and head (fp32)", 4, f"b·h{per}·s", b * heads * s),
        ]  # fmt: skip
    out.append(_res("attn", "attention output, heads merged (saved by output_proj)", c, td,
                    tokens * d_attn))  # fmt: skip
    out += _norm("ln2", regime, tokens, d, 2, "x + attention (the residual stream)")
    out += [
        _res("ffn", "w1 x (saved by SiLU)", c, tf, tokens * f_tp),
        _res("ffn", "SiLU(w1 x)", c, tf, tokens * f_tp),
        _res("ffn", "w3 x", c, tf, tokens * f_tp),
        _res("ffn", "SiLU(w1 x) * w3 x (saved by w2)", c, tf, tokens * f_tp),
    ]
    if regime == "autocast":
        weights = sum(
            p.tp_numel(tp) for p in model_parameters(config) if p.block == 0 and p.kind == "linear"
        )
        out.append(_res("weights", "bf16 copies of the block's weights (autocast cache)", 2,
                        f"N_block{per}", weights))  # fmt: skip
    return out


def block_backward_working_set(
    config: lmcore.ModelConfig, *, batch: int, seq_len: int, regime: str, tp: int = 1
) -> Residual:
    """An estimate of the gradients of one block's intermediates alive at once in its backward.

    The larger of the FFN's (three `T·f` gradients: of the product, of SiLU's output and of w3's)
    and the attention's (naive: the gradients of the weights and of the scores, `b·h·s²` each, in
    float32 unless the model is bf16; fused kernels: dq, dk, dv), plus the residual stream's
    incoming and outgoing gradients. Not read off the graph: an estimate, whose error the
    measured check states.
    """
    _check(regime, batch, seq_len, tp)
    b, s, d = batch, seq_len, config.d_model
    tokens = b * s
    c = compute_bytes(regime)
    r = residual_bytes(regime)
    heads = _tp_width(config.num_heads, tp)
    d_attn = heads * config.head_dim
    d_kv = _tp_width(config.kv_heads, tp) * config.head_dim
    per = "" if tp == 1 else "/t"
    ffn = _res("backward", "FFN", 3 * c, f"T·f{per}", tokens * _tp_width(config.d_ff, tp))
    if materializes_scores(config.attention):
        g = 2 if regime == "bf16" else 4
        attn = _res("backward", "scores", 2 * g, f"b·h{per}·s²", b * heads * s * s)
    else:
        attn = _res("backward", "dq, dk, dv", c, f"T·(d + 2·d_kv){per}",
                    tokens * (d_attn + 2 * d_kv))  # fmt: skip
    stream = 2 * r * tokens * d
    return Residual(
        "backward",
        "gradients of one block's intermediates",
        max(ffn.num_bytes, attn.num_bytes) + stream,
        1,
        f"max({ffn.formula}, {attn.formula}) + {2 * r}·T·d",
    )


def fused_loss_chunk_tokens(tokens: int, vocab_size: int, d_model: int) -> int:
    """Tokens per chunk of a fused LM-head + cross-entropy: Liger-Kernel's rule.

    Liger-Kernel's `fused_linear_cross_entropy` sizes chunks so that a chunk of logits is about
    as large as the hidden states: `next_pow2(ceil(T / ceil(V / d)))`, at most T.
    """
    per = -(-tokens // -(-vocab_size // d_model))
    return min(tokens, 1 << (per - 1).bit_length())


@dataclass(frozen=True)
class LossMemory:
    """The loss's memory on one device beyond the final norm's output.

    Attributes:
        saved: residuals kept from the forward pass to the loss's backward.
        forward_peak: bytes alive at the worst moment of the loss's forward (saved included).
        backward_peak: bytes alive at the worst moment of the loss's backward.
        forward_formula, backward_formula: those two in symbols.
    """

    saved: list[Residual]
    forward_peak: int
    backward_peak: int
    forward_formula: str
    backward_formula: str

    @property
    def saved_bytes(self) -> int:
        """Bytes of `saved`."""
        return total_bytes(self.saved)


def loss_memory(
    config: lmcore.ModelConfig,
    *,
    batch: int,
    seq_len: int,
    regime: str,
    loss: str,
    hold_logits: bool = True,
    tp: int = 1,
    chunk_tokens: int | None = None,
) -> LossMemory:
    """The memory of the LM head's output and the cross-entropy on one device.

    `materialized` (`lmcore.cross_entropy` on the whole `[T, V]` logits): the logits in the
    compute dtype (kept through backward when the caller holds them, as `logits = model(x);
    loss = ce(logits, y)` does), upcast to fp32 if they are not, `logits − max` saved by the
    target's gather and `exp` of it saved by exp's backward (fp32 each); in backward the gather's
    and exp's gradients (fp32 each) while those two are still alive.

    `fused` (an LM head + cross-entropy that never holds the whole logits, as
    `lmcore.fused_linear_cross_entropy`): one float32 logsumexp per token saved; a chunk of
    `chunk_tokens` rows of fp32 logits and their gradient at a time. The model assumes the
    backward recomputes each chunk (nothing `[T, V]`-sized is kept between the passes).

    Args:
        config: the model (vocabulary V, width d).
        batch, seq_len: sequences and their length on this device.
        regime: one of `REGIMES` (the logits' dtype follows it).
        loss: `"materialized"` or `"fused"`.
        hold_logits: the caller keeps the logits alive through backward (materialised only).
        tp: tensor-parallel ranks (the vocabulary is split across them).
        chunk_tokens: the fused loss's chunk (default: `fused_loss_chunk_tokens`).

    Raises:
        ValueError: an unknown loss or regime, or a size that is not positive.
    """
    _check(regime, batch, seq_len, tp)
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
    tokens = batch * seq_len
    vocab = _tp_width(config.vocab_size, tp)
    tv = tokens * vocab
    tv_text = "T·V" if tp == 1 else "T·V/t"
    saved = [_res("loss", "targets (int64)", _INT64, "T", tokens)]
    if loss == "fused":
        chunk = chunk_tokens or fused_loss_chunk_tokens(tokens, config.vocab_size, config.d_model)
        if chunk < 1:
            raise ValueError(f"chunk_tokens must be positive, got {chunk_tokens!r}")
        chunk = min(chunk, tokens)
        saved.append(_res("loss", "logsumexp per token (fp32)", 4, "T", tokens))
        work = 8 * chunk * vocab
        text = (
            f"{combined_formula(saved)} + 8·chunk·{tv_text[2:]} (a chunk of fp32 logits and its "
            f"gradient; chunk = {chunk:,} tokens)"
        )
        base = total_bytes(saved)
        return LossMemory(saved, base + work, base + work, text, text)
    c = compute_bytes(regime)
    upcast = 4 if c != 4 else 0
    if hold_logits:
        saved.append(_res("loss", f"logits held by the caller ({c} B)", c, tv_text, tv))
    saved += [
        _res("loss", "logsumexp input (fp32)", 4, "T", tokens),
        _res("loss", "logits − max (fp32, saved by the target gather)", 4, tv_text, tv),
        _res("loss", "exp(logits − max) (fp32)", 4, tv_text, tv),
    ]
    base = total_bytes(saved)
    # Forward: the logits (alive as the loss's argument) and their fp32 copy while the two
    # saved fp32 tensors are made.
    transient = [_res("loss", "fp32 copy of the logits", upcast, tv_text, tv)] if upcast else []
    if not hold_logits:
        transient.append(_res("loss", "logits (the loss's argument)", c, tv_text, tv))
    forward = base + total_bytes(transient)
    # Backward: gather's gradient while both saved tensors live, then exp's and its own.
    gradient = [_res("loss", "a gradient of logits − max (fp32)", 4, tv_text, tv)]
    backward = base + total_bytes(gradient)
    return LossMemory(
        saved, forward, backward,
        combined_formula([*saved, *transient]), combined_formula([*saved, *gradient]),
    )  # fmt: skip


def head_residuals(
    config: lmcore.ModelConfig, *, batch: int, seq_len: int, regime: str, tp: int = 1
) -> list[Residual]:
    """The residuals outside the blocks and the loss: token ids, the final norm, the LM head.

    Under `autocast` the LM head's bf16 weight copy is saved by its matmul.
    """
    _check(regime, batch, seq_len, tp)
    tokens = batch * seq_len
    out = [_res("embedding", "token ids (int64)", _INT64, "T", tokens)]
    out += _norm("ln_final", regime, tokens, config.d_model, 1, "x (the last block's output)")
    if regime == "autocast":
        head = next(p for p in model_parameters(config) if p.name == "lm_head.weight")
        out.append(_res("lm_head", "bf16 copy of the LM head weight (autocast cache)", 2,
                        "V·d" + ("" if tp == 1 else "/t"), head.tp_numel(tp)))  # fmt: skip
    return out


def total_bytes(residuals: Sequence[Residual]) -> int:
    """The bytes of `residuals` together."""
    return sum(r.num_bytes for r in residuals)
