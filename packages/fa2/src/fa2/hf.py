"""fa2 as an attention implementation of Hugging Face transformers (a recipe; transformers is
not a dependency of fa2: install it yourself).

    import fa2.hf
    from transformers import AutoModelForCausalLM

    fa2.hf.register()  # adds attn_implementation="fa2"
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="fa2")
    # or, on a model already built: model.set_attn_implementation("fa2")

`register` adds `attention_forward` to transformers' `AttentionInterface` and gives it the
attention masks transformers makes for flash-attn (`None` when nothing is padded, else the
2-D padding mask), so models that take pluggable attention (Llama, Mistral, Qwen2, Gemma 2,
...) run fa2's kernels: grouped-query heads without repeating k and v, sliding windows
(`config.sliding_window`), logit softcapping (Gemma 2's `attn_logit_softcapping`), padded
batches and padding-free packed sequences through `flash_attn_varlen_func`, decoding with a
KV cache through flash-attn's bottom-right causal alignment. What fa2 cannot do raises
NotImplementedError naming it: attention dropout in training, returned attention weights,
attention sinks, masks other than padding masks.
"""

from __future__ import annotations

from typing import Any

import torch

from fa2.bert_padding import pad_input, unpad_input
from fa2.dropin import flash_attn_func, flash_attn_varlen_func

__all__ = ["attention_forward", "register"]


def register(name: str = "fa2") -> str:
    """Make `attention_forward` transformers' attention implementation `name`.

    Returns `name`, to pass as `attn_implementation=` to `from_pretrained`, `from_config` or
    `set_attn_implementation`.

    Raises:
        ImportError: transformers (5.x) is not installed.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, flash_attention_mask)
    return name


def attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function interface, run by fa2.

    Args:
        module: the attention layer (its `is_causal` is read when `is_causal` is None).
        query: `(batch, heads, q_len, head_dim)`; key, value: `(batch, kv_heads, kv_len,
            head_dim)`, as transformers passes them.
        attention_mask: None (nothing padded) or the `(batch, kv_len)` padding mask (1 or True:
            a token) that `register`'s mask function gives.
        dropout: must be 0 (models pass their attention dropout while training).
        scaling: softmax scale (default 1/sqrt(head_dim)).
        sliding_window: a causal window of this many keys (the query's own included), as
            transformers' flash-attn path reads `config.sliding_window`.
        softcap: logit softcapping (Gemma 2), None or 0: off.
        is_causal: causal attention (default: the module's `is_causal`).
        **kwargs: `cu_seq_lens_q`, `cu_seq_lens_k`, `max_length_q`, `max_length_k` of
            padding-free packed sequences, or `position_ids` that restart at 0 at each packed
            sequence (batch 1); `output_attentions` and `s_aux` must be off.

    Returns:
        `(output, None)`: output `(batch, q_len, heads, head_dim)`, contiguous; no weights.
    """
    if dropout:
        raise NotImplementedError(
            f"dropout={dropout}: fa2 has no attention dropout; set the model's "
            "attention_dropout to 0.0 (or train with another attn_implementation)"
        )
    if kwargs.get("output_attentions"):
        raise NotImplementedError("output_attentions=True: fa2 never forms attention weights")
    if kwargs.get("s_aux") is not None:
        raise NotImplementedError("s_aux: fa2 does not implement attention sinks")
    if attention_mask is not None and attention_mask.dim() != 2:
        raise NotImplementedError(
            f"an attention mask of shape {tuple(attention_mask.shape)}: fa2 takes padding masks "
            "(batch, kv_len); register it with fa2.hf.register() so that transformers makes them"
        )
    causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    # transformers' window counts the query itself: it sees the sliding_window - 1 keys before
    options = dict(
        softmax_scale=scaling,
        causal=causal,
        window_size=(sliding_window - 1, sliding_window - 1) if sliding_window else (-1, -1),
        softcap=softcap or 0.0,
    )
    batch, heads, q_len, head_dim = query.shape
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))  # (batch, seq, heads, d) views
    packed = _packed_sequences(kwargs, batch)
    if packed is not None:
        cu_q, cu_k, max_q, max_k = packed
        out = flash_attn_varlen_func(
            *(t.reshape(-1, *t.shape[2:]) for t in (q, k, v)), cu_q, cu_k, max_q, max_k, **options
        )
        return out.view(batch, q_len, heads, head_dim), None
    if attention_mask is None:
        return flash_attn_func(q, k, v, **options), None
    return _padded(q, k, v, attention_mask.bool(), options), None


def _packed_sequences(kwargs: dict, batch: int) -> tuple | None:
    """(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) of padding-free packed
    sequences: from transformers' `cu_seq_lens_*` and `max_length_*`, or from `position_ids`
    that restart at 0 within one row; None when the batch is not packed."""
    if kwargs.get("cu_seq_lens_q") is not None:
        cu_q, cu_k = kwargs["cu_seq_lens_q"].int(), kwargs["cu_seq_lens_k"].int()
        return cu_q, cu_k, int(kwargs["max_length_q"]), int(kwargs["max_length_k"])
    positions = kwargs.get("position_ids")
    if positions is None or batch != 1 or positions.shape[-1] == 1:
        return None
    positions = positions.reshape(-1)
    starts = (positions == 0).nonzero().flatten()
    if starts.numel() <= 1 and positions[0] == 0:
        return None  # one sequence, not packed (nor a continuation with a cache)
    if starts.numel() == 0 or starts[0] != 0:
        return None
    total = torch.tensor([positions.numel()], device=starts.device)
    cu = torch.cat([starts, total]).int()
    longest = int(cu.diff().max())
    return cu, cu, longest, longest


def _padded(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, options: dict
) -> torch.Tensor:
    """Attention over a padded batch: its tokens packed without the padding (`unpad_input`),
    attended per sequence (`flash_attn_varlen_func`), and put back in place (`pad_input`:
    zeros at the padding)."""
    batch, q_len = q.shape[:2]
    kv_mask = mask[:, -k.shape[1] :]  # (batch, kv_len)
    q_mask = kv_mask[:, -q_len:]  # the queries are the last q_len tokens of each row
    q_rows, q_indices, cu_q, max_q, _ = unpad_input(q, q_mask)
    k_rows, kv_indices, cu_k, max_k, _ = unpad_input(k, kv_mask)
    v_rows = v.reshape(-1, *v.shape[2:]).index_select(0, kv_indices)  # k's rows of v
    out = flash_attn_varlen_func(q_rows, k_rows, v_rows, cu_q, cu_k, max_q, max_k, **options)
    return pad_input(out, q_indices, batch, q_len)
