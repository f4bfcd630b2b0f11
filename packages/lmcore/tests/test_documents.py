"""Packed documents: a batch of rows holding several documents each gives every document the
logits, loss and gradients it gets as a row of its own."""

import itertools

import pytest
import torch

from lmcore import (
    Documents,
    KVCache,
    ModelConfig,
    TransformerLM,
    apply_activation_checkpointing,
    cross_entropy,
)

EOT = 3  # the end-of-text id of these tests' rows
VOCAB = 53


@pytest.fixture
def model() -> TransformerLM:
    # Grouped-query heads (4 over 2) and an odd vocabulary; float64, so that packing (fa2's
    # varlen path) and single rows (SDPA) agree to rounding, not to a tolerance of their own.
    config = ModelConfig(vocab_size=VOCAB, context_length=24, d_model=32, num_layers=2,
                         num_heads=4, d_ff=48, num_kv_heads=2, attention="sdpa")  # fmt: skip
    torch.manual_seed(0)
    return TransformerLM.from_config(config).double()


def _rows() -> torch.Tensor:
    """Two rows of 21 tokens: documents of lengths 5, 7, 9 and 1, 17, 1, 2 (a document of one
    token at a row's start and one before the last)."""
    rows = torch.randint(EOT + 1, VOCAB, (2, 21), generator=torch.Generator().manual_seed(1))
    rows[0, [5, 12]] = EOT
    rows[1, [1, 18, 19]] = EOT
    return rows


def _documents(row: torch.Tensor) -> list[tuple[int, int]]:
    """(start, end) of each document of one row: from each EOT (or the start) to the next."""
    starts = [0, *(i for i in range(1, len(row)) if row[i] == EOT), len(row)]
    return list(itertools.pairwise(starts))


def test_from_tokens_marks_where_each_document_starts_and_each_tokens_position():
    rows = _rows()
    documents = Documents.from_tokens(rows, eot_id=EOT)
    assert documents.cu_seqlens.tolist() == [0, 5, 12, 21, 22, 39, 40, 42]
    assert documents.cu_seqlens.dtype == torch.int32 and documents.max_seqlen == 21
    assert documents.positions[0].tolist() == [*range(5), *range(7), *range(9)]
    assert documents.positions[1].tolist() == [0, *range(17), 0, 0, 1]


def test_each_document_gets_the_logits_of_a_row_of_its_own(model):
    rows = _rows()
    packed = model(rows, documents=Documents.from_tokens(rows, eot_id=EOT))
    for b, row in enumerate(rows):
        for start, end in _documents(row):
            alone = model(row[None, start:end])[0]
            torch.testing.assert_close(packed[b, start:end], alone, rtol=0, atol=1e-12)


@pytest.mark.parametrize("policy", ["none", "segments:2"])
def test_packed_training_has_the_loss_and_gradients_of_the_documents_apart(model, policy):
    apply_activation_checkpointing(model, policy=policy)
    tokens = torch.cat((_rows(), torch.randint(EOT + 1, VOCAB, (2, 1))), dim=1)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    documents = Documents.from_tokens(inputs, eot_id=EOT)
    packed = cross_entropy(model(inputs, documents=documents), targets)
    packed.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    apart = (
        sum(
            cross_entropy(model(inputs[b, None, s:e]), targets[b, None, s:e]) * (e - s)
            for b in range(len(inputs))
            for s, e in _documents(inputs[b])
        )
        / inputs.numel()
    )  # the mean over every token, as the packed loss
    apart.backward()
    torch.testing.assert_close(packed, apart, rtol=0, atol=1e-12)
    for name, p in model.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, rtol=1e-10, atol=1e-12, msg=name)


def test_documents_and_a_kv_cache_do_not_go_together(model):
    rows = _rows()
    with pytest.raises(ValueError, match="kv_cache, or train on documents"):
        model(rows[:1], documents=Documents.from_tokens(rows[:1], eot_id=EOT),
              kv_cache=KVCache.for_model(model))  # fmt: skip
