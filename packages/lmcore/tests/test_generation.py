"""Sampling: greedy decoding, the nucleus cut, end-of-sequence, context cropping."""

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from lmcore import generate


def _greedy_reference(model, prompt: list[int], steps: int) -> list[int]:
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            window = torch.tensor(ids[-model.config.context_length :])[None]
            ids.append(model(window)[0, -1].argmax().item())
    return ids[len(prompt) :]


def test_temperature_zero_is_greedy(tiny_model):
    out = generate(tiny_model, [5, 17, 3], 6, temperature=0.0)
    assert out.dtype == torch.int64
    assert out.tolist() == _greedy_reference(tiny_model, [5, 17, 3], 6)


def test_generation_past_the_context_crops_the_window(tiny_model, tiny_config):
    prompt = torch.randint(0, tiny_config.vocab_size, (tiny_config.context_length - 2,)).tolist()
    out = generate(tiny_model, prompt, 5, temperature=0.0)
    assert out.tolist() == _greedy_reference(tiny_model, prompt, 5)


def test_tiny_top_p_keeps_only_the_most_likely_token(tiny_model):
    sampled = generate(
        tiny_model, [1, 2], 5, top_p=1e-9, generator=torch.Generator().manual_seed(0)
    )
    assert sampled.tolist() == _greedy_reference(tiny_model, [1, 2], 5)


def test_stops_after_eos(tiny_model):
    eos = _greedy_reference(tiny_model, [4, 4, 9], 3)[1]
    out = generate(tiny_model, [4, 4, 9], 10, temperature=0.0, eos_id=eos)
    assert out[-1].item() == eos and len(out) <= 2


def test_same_generator_seed_gives_same_sample(tiny_model, tiny_config):
    a = generate(tiny_model, [3], 8, generator=torch.Generator().manual_seed(4))
    b = generate(tiny_model, [3], 8, generator=torch.Generator().manual_seed(4))
    assert torch.equal(a, b)
    assert len(a) == 8 and a.min() >= 0 and a.max() < tiny_config.vocab_size


class _FixedDistribution(nn.Module):
    """A stand-in model whose next-token distribution is always `probs`."""

    def __init__(self, probs: list[float]) -> None:
        super().__init__()
        self.logits = nn.Parameter(torch.tensor(probs).log())
        self.config = SimpleNamespace(context_length=4)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.logits.expand(*token_ids.shape, -1)


def test_top_p_samples_only_from_the_nucleus_in_proportion():
    # Mass 0.5 + 0.3 reaches top_p = 0.7 after two tokens: ids 2 and 3 must never appear, and
    # ids 0 and 1 keep their ratio, 0.5 / 0.8 = 0.625.
    model = _FixedDistribution([0.5, 0.3, 0.15, 0.05])
    out = generate(model, [0], 2000, top_p=0.7, generator=torch.Generator().manual_seed(0))
    assert set(out.tolist()) == {0, 1}
    # 2000 draws: the standard error of the frequency is about 0.011.
    assert (out == 0).float().mean().item() == pytest.approx(0.625, abs=0.04)


def test_training_mode_is_restored(tiny_model):
    tiny_model.train()
    generate(tiny_model, [1], 2)
    assert tiny_model.training


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"prompt_ids": []}, "non-empty"),
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"max_new_tokens": -1}, "max_new_tokens"),
    ],
)
def test_bad_arguments_are_rejected(tiny_model, kwargs, match):
    arguments = {"prompt_ids": [1, 2], "max_new_tokens": 3, **kwargs}
    with pytest.raises(ValueError, match=match):
        generate(tiny_model, **arguments)
