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
    "COMPILED_ATTENTION",
    "PLAN_LOSSES",
    "REGIMES",
    "LossMemory",
    "Residual",
    "block_backward_working_set",
    "block_residuals",
    "combined_formula",
    "compiled_residuals_known",
    "compute_bytes",
    "head_residuals",
    "kept_attention_residuals",
    "loss_chunk_tokens",
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


# What a block compiled by inductor keeps for backward (its min-cut partition of the joint graph,
# read on the CPU: the tests compile a block with inductor's partitioner and decompositions and
# count what is saved): seven T·d and two T·d_kv tensors and three T·f ones in the residual
# dtype, the two norms' float32 rsqrt and the attention's logsumexp, for a fused attention
# kernel (SDPA, fa2's Triton path; fa2's PyTorch path is traced into many more) in fp32 or bf16
# (autocast is not measured). The same whatever holds the block: a compiled block under a
# checkpoint keeps it while the checkpoint recomputes it.
COMPILED_ATTENTION = ("sdpa", "fa2-triton")
_COMPILED_TD, _COMPILED_TDKV, _COMPILED_TF = 7, 2, 3


def compiled_residuals_known(config: lmcore.ModelConfig, *, regime: str, tp: int = 1) -> bool:
    """Whether `block_residuals(..., compiled=True)` knows what inductor keeps for this block
    (a fused attention kernel, fp32 or bf16, no tensor parallelism); else it gives eager's."""
    return config.attention in COMPILED_ATTENTION and regime != "autocast" and tp == 1


def block_residuals(
    config: lmcore.ModelConfig,
    *,
    batch: int,
    seq_len: int,
    regime: str,
    tp: int = 1,
    compiled: bool = False,
) -> list[Residual]:
    """The tensors one `TransformerBlock` saves for backward on one device.

    Args:
        config: the model (width, heads, attention backend `config.attention`).
        batch: sequences on this device (the micro-batch).
        seq_len: tokens per sequence s.
        regime: one of `REGIMES`.
        tp: tensor-parallel ranks the block is split over.
        compiled: the block compiled by inductor, where what it keeps is known
            (`compiled_residuals_known`); eager code's residuals otherwise.

    Returns:
        The residuals in the order the forward pass makes them. Under `autocast` the last one is
        the block's bf16 weight copies (autocast's cache), which its matmuls save.

    Raises:
        ValueError: an unknown regime or attention backend, or a size that is not positive.
    """
    _check(regime, batch, seq_len, tp)
    if compiled and compiled_residuals_known(config, regime=regime, tp=tp):
        return _compiled_block_residuals(config, batch=batch, seq_len=seq_len, regime=regime)
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


def kept_attention_residuals(
    config: lmcore.ModelConfig, *, batch: int, seq_len: int, regime: str, tp: int = 1
) -> list[Residual]:
    """What `selective` checkpointing keeps of one block beyond its input: the attention output
    and its logsumexp, for the backends whose kernel it keeps (`lmcore.SELECTIVE_KEEPS`);
    nothing for the others, whose attention it recomputes."""
    _check(regime, batch, seq_len, tp)
    if config.attention not in lmcore.SELECTIVE_KEEPS:
        return []
    tokens = batch * seq_len
    heads = _tp_width(config.num_heads, tp)
    per = "" if tp == 1 else "/t"
    return [
        _res("attn", "attention output (kept)", compute_bytes(regime), f"T·d{per}",
             tokens * heads * config.head_dim),
        _res("attn", "logsumexp per query and head (fp32, kept)", _FP32, f"b·h{per}·s",
             tokens * heads),
    ]  # fmt: skip


def _compiled_block_residuals(
    config: lmcore.ModelConfig, *, batch: int, seq_len: int, regime: str
) -> list[Residual]:
    """`block_residuals` of a block compiled by inductor (see `COMPILED_ATTENTION`)."""
    tokens, r = batch * seq_len, residual_bytes(regime)
    d, d_kv = config.d_model, config.kv_heads * config.head_dim
    tkv = "T·d_kv" if config.kv_heads != config.num_heads else "T·d"
    return [
        _res("block", "T·d-sized tensors inductor keeps", _COMPILED_TD * r, "T·d", tokens * d),
        _res("attn", "keys and values", _COMPILED_TDKV * r, tkv, tokens * d_kv),
        _res("ffn", "T·f-sized tensors inductor keeps", _COMPILED_TF * r, "T·f",
             tokens * config.d_ff),
        _res("block", "rsqrt of the two norms (fp32)", 2 * _FP32, "T", tokens),
        _res("attn", "logsumexp per query and head (fp32)", _FP32, "b·h·s",
             batch * config.num_heads * seq_len),
    ]  # fmt: skip


def block_backward_working_set(
    config: lmcore.ModelConfig,
    *,
    batch: int,
    seq_len: int,
    regime: str,
    tp: int = 1,
    compiled: bool = False,
) -> Residual:
    """The gradients of one block's intermediates alive at once in its backward, beyond what the
    block saved.

    Eager code (an estimate, not read off the graph, whose error the measured check states):
    the larger of the FFN's (three `T·f` gradients: of the product, of SiLU's output and of
    w3's) and the attention's (naive: the gradients of the weights and of the scores, `b·h·s²`
    each, in float32 unless the model is bf16; fused kernels: dq, dk, dv), plus the residual
    stream's incoming and outgoing gradients, all on top of every saved tensor.

    A block compiled by inductor, where its partition is known (`compiled_residuals_known`):
    read off the backward inductor generates for a block (`TORCH_LOGS=output_code`, on the
    CPU). Its saved tensors are donated to it (AOTAutograd's `donated_buffer`) and each is freed
    at its last use. It starts with the FFN: w2's weight gradient frees w2's saved input, then
    the gradient of that product (`T·f`) is made, then one fused kernel writes the gradients of
    w1's and w3's outputs, one into w3's saved output in place (a buffer reuse), the other into
    a new `T·f` buffer. That moment is the block's largest: every saved tensor but w2's input,
    two `T·f` gradients and the incoming `T·d` one, i.e. one `T·f` and one `T·d` beyond the
    saved tensors. After it the three saved `T·f` tensors are gone, which leaves the attention's
    backward (dq, dk, dv) room below it.
    """
    _check(regime, batch, seq_len, tp)
    b, s, d = batch, seq_len, config.d_model
    tokens = b * s
    if compiled and compiled_residuals_known(config, regime=regime, tp=tp):
        r = residual_bytes(regime)
        return Residual(
            "backward",
            "a new T·f gradient in the FFN's backward and the incoming T·d one (inductor's)",
            r * tokens * (config.d_ff + d),
            1,
            f"{r}·T·f + {r}·T·d",
        )
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


# The next-token losses the model predicts: bench's two (`LOSSES`) and the torch-native step's
# chunked cross-entropy (`bench.core.torch_native.chunked_cross_entropy`).
PLAN_LOSSES = (*LOSSES, "chunked")


def loss_chunk_tokens(tokens: int, vocab_size: int, compute_bytes: int) -> int:
    """Tokens per chunk of the fused loss and of the torch-native chunked one: lmcore's rule
    (`lmcore.chunk_rows`: as many as 1 GiB of logits in the compute dtype holds, a multiple of
    128). Imports torch (for the dtype), only when a plan is computed."""
    import torch

    dtype = {2: torch.bfloat16, 4: torch.float32}[compute_bytes]
    return lmcore.chunk_rows(tokens, vocab_size, dtype)


@dataclass(frozen=True)
class LossMemory:
    """The loss's memory on one device beyond the final norm's output.

    Attributes:
        saved: residuals kept from the forward pass to the loss's backward.
        held: gradients the loss computes in its forward and holds until its backward (the
            fused loss's `dh` and `dW`), bytes; part of `forward_peak` and `backward_peak`.
        forward_peak: bytes alive at the worst moment of the loss's forward (saved included).
        backward_peak: bytes alive at the worst moment of the loss's backward.
        forward_formula, backward_formula: those two in symbols.
    """

    saved: list[Residual]
    held: int
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
    weight_bytes: int | None = None,
) -> LossMemory:
    """The memory of the LM head's output and the cross-entropy on one device.

    `materialized` (`lmcore.cross_entropy` on the whole `[T, V]` logits): the logits in the
    compute dtype (kept through backward when the caller holds them, as `logits = model(x);
    loss = ce(logits, y)` does), upcast to fp32 if they are not, `logits − max` saved by the
    target's gather and `exp` of it saved by exp's backward (fp32 each); in backward the gather's
    and exp's gradients (fp32 each) while those two are still alive.

    `fused` (`lmcore.fused_linear_cross_entropy`, its code read as it is): the gradients are
    computed in the forward, a chunk of `chunk_tokens` rows of logits (compute dtype) at a time,
    into `dh` (`T·d`, the hidden states' dtype) and a float32 accumulator of `dW` (`V·d·4`);
    at the end of the forward the accumulator is rounded to the weight's dtype and freed. Held
    until the loss's backward (which scales them in place): `dh` and `dW`. Nothing else is saved
    (not even the head's input). Under autocast a float32 weight is cast to bf16 once per call.

    `chunked` (the torch-native step's): each chunk's `F.cross_entropy(h_c @ Wᵀ, y_c)` under a
    checkpoint, so the forward keeps nothing of `[T, V]` size; in backward each chunk's logits
    are computed again, with their float32 gradient, and the weight's gradient accumulates
    chunk by chunk (the sum and one chunk's product alive together) beside `dh`.

    Args:
        config: the model (vocabulary V, width d).
        batch, seq_len: sequences and their length on this device.
        regime: one of `REGIMES` (the logits' dtype follows it).
        loss: one of `PLAN_LOSSES`.
        hold_logits: the caller keeps the logits alive through backward (materialised only).
        tp: tensor-parallel ranks (the vocabulary is split across them).
        chunk_tokens: the chunk of `fused` and `chunked` (default: `loss_chunk_tokens`).
        weight_bytes: bytes per element of the LM head's weight as the loss sees it (FSDP's
            gathered weight is in its compute dtype); the regime's parameters' when None.

    Raises:
        ValueError: an unknown loss or regime, or a size that is not positive.
    """
    _check(regime, batch, seq_len, tp)
    if loss not in PLAN_LOSSES:
        raise ValueError(f"loss must be one of {PLAN_LOSSES}, got {loss!r}")
    tokens = batch * seq_len
    vocab = _tp_width(config.vocab_size, tp)
    tv = tokens * vocab
    tv_text = "T·V" if tp == 1 else "T·V/t"
    c = compute_bytes(regime)
    saved = [_res("loss", "targets (int64)", _INT64, "T", tokens)]
    if loss in ("fused", "chunked"):
        chunk = chunk_tokens or loss_chunk_tokens(tokens, config.vocab_size, c)
        if chunk < 1:
            raise ValueError(f"chunk_tokens must be positive, got {chunk_tokens!r}")
        return _chunked_loss_memory(
            config, loss=loss, regime=regime, tokens=tokens, vocab=vocab, tp=tp,
            chunk=min(chunk, tokens), saved=saved,
            weight_bytes=weight_bytes or (2 if regime == "bf16" else _FP32),
        )  # fmt: skip
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
        saved, 0, forward, backward,
        combined_formula([*saved, *transient]), combined_formula([*saved, *gradient]),
    )  # fmt: skip


def _chunked_loss_memory(
    config: lmcore.ModelConfig,
    *,
    loss: str,
    regime: str,
    tokens: int,
    vocab: int,
    tp: int,
    chunk: int,
    saved: list[Residual],
    weight_bytes: int,
) -> LossMemory:
    """`loss_memory` of the two losses that work through chunks of tokens (`fused`,
    `chunked`)."""
    c, h, w = compute_bytes(regime), residual_bytes(regime), weight_bytes
    d = config.d_model
    vd = vocab * d
    vd_text = "V·d" if tp == 1 else "V·d/t"
    logits = _res("loss", f"a chunk of logits ({c} B)", c, f"chunk·{vd_text[:1]}", chunk * vocab)
    dh = _res("loss", f"dh, the hidden states' gradient ({h} B)", h, "T·d", tokens * d)
    dw = _res("loss", f"dW, the head's gradient ({w} B)", w, vd_text, vd)
    if loss == "fused":
        # the weight cast to the compute dtype once per call (autocast over a float32 weight)
        cast = [_res("loss", "W cast to bf16", c, vd_text, vd)] if w != c else []
        losses = _res("loss", "a float32 loss per token", 4, "T", tokens)
        accumulator = _res("loss", "dW's float32 accumulator", 4, vd_text, vd)
        # the chunk loop, then the rounding of dW (the chunk freed first; no copy when float32);
        # the head's input, the final norm's output, is alive as the loss's argument
        hidden = _res("loss", f"the head's input ({h} B)", h, "T·d", tokens * d)
        loop = [*saved, hidden, losses, dh, accumulator, *cast, logits]
        rounding = [*saved, hidden, losses, dh, accumulator, *cast, *([dw] if w != 4 else [])]
        forward = max(loop, rounding, key=total_bytes)
        held = [dh, dw]
        return LossMemory(
            saved, total_bytes(held), total_bytes(forward), total_bytes([*saved, *held]),
            combined_formula(forward), combined_formula([*saved, *held]),
        )  # fmt: skip
    # chunked: one chunk's logits and their float32 copy in the forward; in backward the
    # recomputed chunk, its float32 gradient, and dW's sum beside this chunk's product
    upcast = [_res("loss", "a chunk of logits' float32 copy", 4, "chunk·V", chunk * vocab)]
    upcast = upcast if c != 4 else []
    grad = _res("loss", "their float32 gradient", 4, "chunk·V", chunk * vocab)
    forward = [*saved, logits, *upcast]
    backward = [*saved, logits, grad, dh, dw, dw]
    return LossMemory(
        saved, 0, total_bytes(forward), total_bytes(backward),
        combined_formula(forward), combined_formula(backward),
    )  # fmt: skip


def head_residuals(
    config: lmcore.ModelConfig,
    *,
    batch: int,
    seq_len: int,
    regime: str,
    tp: int = 1,
    loss: str = "materialized",
) -> list[Residual]:
    """The residuals outside the blocks and the loss: token ids, the final norm, the LM head.

    The LM head's matmul saves the final norm's output and, under `autocast`, its bf16 weight
    copy; the `fused` loss saves neither (only the gradients it computes, `loss_memory`).
    """
    _check(regime, batch, seq_len, tp)
    tokens = batch * seq_len
    out = [_res("embedding", "token ids (int64)", _INT64, "T", tokens)]
    norm = _norm("ln_final", regime, tokens, config.d_model, 1, "x (the last block's output)")
    if loss == "fused":
        return out + norm[:-1]  # its output is the loss's argument, not saved
    out += norm
    if regime == "autocast":
        head = next(p for p in model_parameters(config) if p.name == "lm_head.weight")
        out.append(_res("lm_head", "bf16 copy of the LM head weight (autocast cache)", 2,
                        "V·d" + ("" if tp == 1 else "/t"), head.tp_numel(tp)))  # fmt: skip
    return out


def total_bytes(residuals: Sequence[Residual]) -> int:
    """The bytes of `residuals` together."""
    return sum(r.num_bytes for r in residuals)
