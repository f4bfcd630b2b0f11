"""Activation checkpointing recomputes the chosen blocks and changes no gradient."""

import copy

import pytest
import torch

from lmcore import TransformerLM, apply_activation_checkpointing, cross_entropy


@pytest.fixture
def model(tiny_config) -> TransformerLM:
    torch.manual_seed(0)
    config = tiny_config.__class__(**{**tiny_config.__dict__, "num_layers": 4})
    return TransformerLM.from_config(config)


def _gradients(model: TransformerLM, tokens: torch.Tensor) -> list[torch.Tensor]:
    model.zero_grad()
    cross_entropy(model(tokens[:, :-1]), tokens[:, 1:]).backward()
    return [p.grad for p in model.parameters()]


@pytest.mark.parametrize("every", [1, 2, 3])
def test_gradients_are_unchanged(model, every):
    tokens = torch.randint(0, model.config.vocab_size, (3, 20))
    expected = _gradients(model, tokens)
    checkpointed = apply_activation_checkpointing(copy.deepcopy(model), every=every)
    actual = _gradients(checkpointed, tokens)
    names = list(model.state_dict())  # parameters only: the model has no persistent buffers
    # Recomputation repeats the same float32 operations, so the results are identical.
    for name, a, e in zip(names, actual, expected, strict=True):
        assert torch.equal(a, e), name


@pytest.mark.parametrize(("every", "recomputed"), [(1, [0, 1, 2, 3]), (2, [1, 3]), (3, [2])])
def test_every_kth_block_runs_forward_again_in_backward(model, every, recomputed):
    calls = [0] * len(model.layers)
    for index, layer in enumerate(model.layers):
        layer.register_forward_pre_hook(lambda *_, i=index: calls.__setitem__(i, calls[i] + 1))
    apply_activation_checkpointing(model, every=every)
    _gradients(model, torch.randint(0, model.config.vocab_size, (2, 10)))
    assert calls == [2 if i in recomputed else 1 for i in range(len(calls))]


def test_state_dict_keys_are_unchanged(model):
    keys = list(model.state_dict())
    apply_activation_checkpointing(model)
    assert list(model.state_dict()) == keys


def test_applying_twice_is_rejected(model):
    apply_activation_checkpointing(model, every=2)
    with pytest.raises(RuntimeError, match="already applied"):
        apply_activation_checkpointing(model)


@pytest.mark.parametrize("every", [0, -2, 1.5])
def test_bad_every_is_rejected(model, every):
    with pytest.raises(ValueError, match="every"):
        apply_activation_checkpointing(model, every=every)
