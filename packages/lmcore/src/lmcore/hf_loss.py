"""The fused LM head and loss for Hugging Face causal LMs: one call routes a transformers model's
training loss through `fused_linear_cross_entropy`, so its `(tokens, vocab)` logits are never
held (Liger-Kernel's `apply_liger_kernel_to_*` is the precedent).

    model = AutoModelForCausalLM.from_pretrained(name)
    apply_fused_linear_cross_entropy(model)
    loss = model(input_ids, attention_mask=mask, labels=labels).loss  # in train mode: fused

The patched forward runs the model's own decoder (`model.model`) and, instead of its
`lm_head` and `loss_function`, the fused loss on the decoder's last hidden states and
`lm_head.weight`, with transformers' causal-LM loss semantics: labels shifted by one inside
(or `shift_labels` given), `ignore_index` (-100) left out, the mean over counted tokens, or the
sum divided by `num_items_in_batch` where the trainer passes it (gradient accumulation). It
returns the model's usual output with `logits=None`. Without labels, or in eval mode (where
callers usually want the logits, as transformers' Trainer does for metrics), the model's own
forward runs unchanged. transformers is not a dependency of lmcore: this module is only used
with models the caller built.
"""

from __future__ import annotations

import inspect
import types
from typing import Any

import torch
import torch.nn.functional as F

from lmcore.linear_cross_entropy import fused_linear_cross_entropy

__all__ = ["FUSED_LOSS_MODEL_TYPES", "apply_fused_linear_cross_entropy", "causal_lm_loss"]

# Architectures whose causal-LM forward is exactly `lm_head(decoder(...).last_hidden_state)`
# followed by transformers' causal-LM loss (no logit scaling or softcapping), checked in
# transformers 5's modeling code and by the tests.
FUSED_LOSS_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")

# The attribute that marks a patched model (and holds the forward it replaced).
_PATCHED = "_unfused_forward"


def _check_model(model: torch.nn.Module) -> None:
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in FUSED_LOSS_MODEL_TYPES or not type(model).__name__.endswith("ForCausalLM"):
        raise ValueError(
            f"apply_fused_linear_cross_entropy takes a causal LM of one of the types "
            f"{', '.join(FUSED_LOSS_MODEL_TYPES)} (whose logits are the LM head's output as it "
            f"is), got {type(model).__name__} (model_type {model_type!r})"
        )
    head = getattr(model, "lm_head", None)
    if not isinstance(head, torch.nn.Linear) or head.bias is not None:
        raise ValueError("the model's lm_head must be a bias-free nn.Linear")
    if hasattr(model, _PATCHED):
        raise RuntimeError("apply_fused_linear_cross_entropy was already applied to this model")


def causal_lm_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor | None,
    *,
    num_items_in_batch: torch.Tensor | int | None = None,
    ignore_index: int = -100,
    shift_labels: torch.Tensor | None = None,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """transformers' causal-LM loss of the logits `hidden @ weight.T`, through the fused loss.

    Args:
        hidden: `(batch, seq, d)` final hidden states.
        weight: `(vocab, d)` LM-head weight.
        labels: `(batch, seq)` token ids (position i's label is predicted by position i - 1),
            `ignore_index` where nothing counts; or None with `shift_labels`.
        num_items_in_batch: divide the summed loss by this (the tokens counted over all
            micro-batches of an accumulated step); None: the mean over this call's tokens.
        ignore_index: the label left out.
        shift_labels: `(batch, seq)` labels already aligned with the hidden states.
        chunk_size: passed to `fused_linear_cross_entropy`.
    """
    if shift_labels is None:
        shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]  # (batch, seq)
    loss = fused_linear_cross_entropy(
        hidden,
        weight,
        shift_labels.to(hidden.device),
        reduction="mean" if num_items_in_batch is None else "sum",
        ignore_index=ignore_index,
        chunk_size=chunk_size,
    )
    if num_items_in_batch is not None:
        if isinstance(num_items_in_batch, torch.Tensor):
            num_items_in_batch = num_items_in_batch.to(loss.device)
        loss = loss / num_items_in_batch
    return loss


def apply_fused_linear_cross_entropy(
    model: torch.nn.Module, *, chunk_size: int | None = None
) -> torch.nn.Module:
    """Route a Hugging Face causal LM's training loss through `fused_linear_cross_entropy`.

    Patches this model object's `forward` (not its class: other models are untouched). In
    train mode with `labels` (or `shift_labels`), the forward returns the loss without ever
    holding the logits, and `logits=None`; otherwise it is the model's own forward. Loss and
    gradients equal the unpatched model's (the fused loss computes softmax and loss in fp32,
    as transformers' loss upcasts the logits to do).

    Args:
        model: a transformers `...ForCausalLM` of a type in `FUSED_LOSS_MODEL_TYPES` (Llama,
            Mistral, Qwen2, Qwen3), tied or untied head.
        chunk_size: tokens per chunk of logits (see `fused_linear_cross_entropy`); None picks
            by the vocabulary.

    Returns:
        The same model, for chaining.

    Raises:
        ValueError: another architecture (its logits may be scaled or capped) or a head with
            a bias.
        RuntimeError: the model is already patched.

    Example::

        >>> model = transformers.Qwen2ForCausalLM(config).cuda().bfloat16()
        >>> apply_fused_linear_cross_entropy(model).train()
        >>> model(ids, labels=ids).loss.backward()  # no (tokens, 151,936) logits held
    """
    _check_model(model)
    from transformers.modeling_outputs import CausalLMOutputWithPast

    unfused = model.forward
    signature = inspect.signature(unfused)
    var_keyword = next(
        (p.name for p in signature.parameters.values() if p.kind is p.VAR_KEYWORD), None
    )

    def forward(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        arguments = dict(signature.bind(*args, **kwargs).arguments)
        extra = dict(arguments.pop(var_keyword, None) or {})
        labels = arguments.pop("labels", None)
        if not self.training or (labels is None and extra.get("shift_labels") is None):
            return unfused(*args, **kwargs)
        logits_to_keep = arguments.pop("logits_to_keep", 0)
        if not (isinstance(logits_to_keep, int) and logits_to_keep == 0):
            raise ValueError("with labels the fused loss covers every position: logits_to_keep=0")
        return_dict = extra.pop("return_dict", None)
        outputs = self.model(**arguments, **extra)
        loss_options = {
            name: extra[name]
            for name in ("num_items_in_batch", "ignore_index", "shift_labels")
            if extra.get(name) is not None
        }
        loss = causal_lm_loss(
            outputs.last_hidden_state, self.lm_head.weight, labels, chunk_size=chunk_size,
            **loss_options,
        )  # fmt: skip
        rest = {name: value for name, value in outputs.items() if name != "last_hidden_state"}
        output = CausalLMOutputWithPast(loss=loss, logits=None, **rest)
        return output.to_tuple() if return_dict is False else output

    setattr(model, _PATCHED, unfused)
    model.forward = types.MethodType(forward, model)
    return model
