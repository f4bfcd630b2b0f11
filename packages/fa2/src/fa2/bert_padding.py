"""flash-attn's padding helpers (`flash_attn.bert_padding`): from a padded batch to packed
variable-length sequences and back.

    hidden, indices, cu_seqlens, max_seqlen, _ = unpad_input(x, attention_mask)
    out = flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, ...)
    y = pad_input(out, indices, batch, seqlen)  # zeros where the batch was padded

The names, arguments and return tuples are flash-attn's (2.7 and later: `unpad_input` returns
five values, the last the lengths `attention_mask` alone counts). Both directions are
differentiable: the gradient of the padded positions is zero.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["pad_input", "unpad_input", "unpad_input_for_concatenated_sequences"]


def _check_mask(hidden_states: torch.Tensor, mask: torch.Tensor, name: str) -> None:
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
        raise ValueError(
            f"{name} must be a (batch, seqlen) tensor, got {getattr(mask, 'shape', mask)}"
        )
    if hidden_states.dim() < 2 or hidden_states.shape[:2] != mask.shape:
        raise ValueError(
            f"hidden_states must be (batch, seqlen, ...) with (batch, seqlen) = {name}'s "
            f"{tuple(mask.shape)}, got {tuple(hidden_states.shape)}"
        )


def _packed(
    hidden_states: torch.Tensor, indices: torch.Tensor, seqlens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """(the rows `indices` of hidden_states with batch and seqlen merged, indices, cu_seqlens,
    max_seqlen) for sequences of lengths `seqlens` (int32)."""
    cu_seqlens = F.pad(seqlens.cumsum(0, dtype=torch.int32), (1, 0))
    rows = hidden_states.reshape(-1, *hidden_states.shape[2:]).index_select(0, indices)
    # max_seqlen is a Python int, as flash-attn's functions take it (a device sync on a GPU)
    return rows, indices, cu_seqlens, int(seqlens.max()) if seqlens.numel() else 0


def unpad_input(
    hidden_states: torch.Tensor,
    attention_mask: torch.Tensor,
    unused_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, torch.Tensor]:
    """The tokens of a padded batch, packed one sequence after another.

    Args:
        hidden_states: `(batch, seqlen, ...)`.
        attention_mask: `(batch, seqlen)`, bool or int: nonzero for a token, 0 for padding.
            The tokens of a row need not be contiguous (left, right or inner padding); they
            keep their order.
        unused_mask: `(batch, seqlen)` or None: positions kept in the packed tensor (counted
            in `cu_seqlens`) but not in the returned used lengths, as flash-attn's.

    Returns:
        `(hidden, indices, cu_seqlens, max_seqlen, seqused)`: hidden `(total, ...)`, the
        selected rows; indices `(total,)` int64, their positions in the flattened
        `(batch * seqlen)` input (what `pad_input` takes); cu_seqlens `(batch + 1,)` int32;
        max_seqlen, the longest row, a Python int; seqused `(batch,)` int32, the tokens
        `attention_mask` alone selects per row.

    Raises:
        ValueError: the masks are not `(batch, seqlen)` of hidden_states.
    """
    _check_mask(hidden_states, attention_mask, "attention_mask")
    selected = attention_mask.bool()
    if unused_mask is not None:
        _check_mask(hidden_states, unused_mask, "unused_mask")
        selected = selected | unused_mask.bool()
    indices = selected.flatten().nonzero().flatten()
    seqused = attention_mask.bool().sum(dim=-1, dtype=torch.int32)
    rows, indices, cu_seqlens, longest = _packed(
        hidden_states, indices, selected.sum(dim=-1, dtype=torch.int32)
    )
    return rows, indices, cu_seqlens, longest, seqused


def unpad_input_for_concatenated_sequences(
    hidden_states: torch.Tensor, attention_mask_in_length: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Several short sequences concatenated in each row, packed as sequences of their own.

    Args:
        hidden_states: `(batch, seqlen, ...)`.
        attention_mask_in_length: `(batch, seqlen)` int: row b holds sequences of lengths
            `attention_mask_in_length[b, 0], [b, 1], ...` one after another from position 0,
            then zeros (e.g. `[2, 3, 0, 0, 0, 0]`: two sequences of 2 and 3 tokens, then one
            position of padding).

    Returns:
        `(hidden, indices, cu_seqlens, max_seqlen)` as `unpad_input`, with one entry of
        cu_seqlens per sequence (not per row).

    Raises:
        ValueError: a row's lengths add up to more than seqlen, or shapes that do not match.
    """
    _check_mask(hidden_states, attention_mask_in_length, "attention_mask_in_length")
    lengths = attention_mask_in_length.to(torch.int32)
    seqlen = lengths.shape[1]
    totals = lengths.sum(dim=-1)  # (batch,)
    if lengths.device.type == "cpu" and ((lengths < 0).any() or (totals > seqlen).any()):
        raise ValueError(
            f"each row's lengths must be >= 0 and add up to at most seqlen ({seqlen}), got "
            f"row totals {totals.tolist()}"
        )
    positions = torch.arange(seqlen, device=lengths.device)
    indices = (positions[None, :] < totals[:, None]).flatten().nonzero().flatten()
    seqlens = lengths.flatten()[lengths.flatten().nonzero().flatten()]
    return _packed(hidden_states, indices, seqlens)


def pad_input(
    hidden_states: torch.Tensor, indices: torch.Tensor, batch: int, seqlen: int
) -> torch.Tensor:
    """Put packed rows back into a padded batch: the inverse of `unpad_input`.

    Args:
        hidden_states: `(total, ...)`, the packed rows.
        indices: `(total,)`, their positions in the flattened `(batch * seqlen)` batch (the
            second value `unpad_input` returns).
        batch, seqlen: the padded batch's shape.

    Returns:
        `(batch, seqlen, ...)`, zeros at the positions `indices` does not name.
    """
    if indices.dim() != 1 or hidden_states.shape[0] != indices.shape[0]:
        raise ValueError(
            f"indices must be 1-D with one entry per row of hidden_states "
            f"({hidden_states.shape[0]}), got shape {tuple(indices.shape)}"
        )
    padded = hidden_states.new_zeros(batch * seqlen, *hidden_states.shape[1:])
    padded = padded.index_copy(0, indices, hidden_states)  # (batch * seqlen, ...)
    return padded.view(batch, seqlen, *hidden_states.shape[1:])
