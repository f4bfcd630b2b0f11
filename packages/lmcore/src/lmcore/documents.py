"""Documents packed into the rows of a batch: where each starts, so that attention stays inside
its document and positions restart in each.

A training row is a window of a token stream whose documents follow one another, each starting
with the end-of-text token (GPT-2's convention, `<|endoftext|>` before every document), e.g.::

    row:        ... on the mat . EOT Once upon a time EOT The end
    document:   0   0  0   0   0 1   1    1    1 1    2   2   2
    position:   0   1  2   3   4 0   1    2    3 4    0   1   2

A document runs from an end-of-text token (or the row's start) to the token before the next one.
Its last target is that next end-of-text token, so each document predicts its own end and sees
nothing of its neighbours: `model(row, documents=Documents.from_tokens(row, eot_id=EOT))` gives
each document the logits it would get as a row of its own (positions from 0). The attention runs
`fa2.flash_attn_varlen_func` on the batch flattened to its tokens, one sequence per document (the
optional fa2 package, as the `fa2-*` backends), whatever the model's `attention`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lmcore.backends import _fa2_function

__all__ = ["Documents"]


@dataclass(frozen=True)
class Documents:
    """The documents of a batch of packed rows `(batch, seq)`, in fa2's varlen terms.

    Attributes:
        cu_seqlens: `(num_documents + 1,)` int32: 0, then where each document ends in the batch
            flattened to `batch * seq` tokens (a document never spans two rows).
        max_seqlen: a bound on a document's length: the row length, so that it is the same for
            every batch of a run (a compiled model does not recompile for it).
        positions: `(batch, seq)` int64: each token's position within its document.
    """

    cu_seqlens: torch.Tensor
    max_seqlen: int
    positions: torch.Tensor

    @classmethod
    def from_tokens(cls, token_ids: torch.Tensor, *, eot_id: int) -> Documents:
        """The documents of `token_ids` `(batch, seq)`: one starts at each `eot_id` and at the
        start of each row (see the module docstring). Syncs with the device once (the count of
        documents sizes `cu_seqlens`)."""
        batch, seq = token_ids.shape
        starts = token_ids == eot_id
        starts[:, 0] = True
        index = torch.arange(seq, device=token_ids.device).expand(batch, seq)
        # (batch, seq): the index of the start of each token's document, by a running maximum
        first = torch.where(starts, index, 0).cummax(dim=1).values
        begins = starts.flatten().nonzero().flatten()  # (num_documents,) in the flat batch
        total = begins.new_full((1,), batch * seq)
        cu_seqlens = torch.cat((begins, total)).to(torch.int32)
        return cls(cu_seqlens=cu_seqlens, max_seqlen=seq, positions=index - first)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal attention of each token to the tokens before it in its own document.

        Args:
            q: `(batch, heads, seq, head_dim)`, queries (rotated at their `positions`).
            k, v: `(batch, kv_heads, seq, head_dim)`.

        Returns:
            `(batch, seq, heads, head_dim)`.
        """
        batch, seq = q.shape[0], q.shape[2]

        def tokens(x: torch.Tensor) -> torch.Tensor:
            # (batch, heads, seq, head_dim) -> (batch * seq, heads, head_dim)
            return x.transpose(1, 2).flatten(0, 1)

        out = _fa2_function("flash_attn_varlen_func")(
            tokens(q), tokens(k), tokens(v), self.cu_seqlens, self.cu_seqlens,
            self.max_seqlen, self.max_seqlen, causal=True,
        )  # fmt: skip
        return out.unflatten(0, (batch, seq))  # (batch, seq, heads, head_dim)
