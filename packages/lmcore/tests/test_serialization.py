"""Checkpoints: a run resumed from a checkpoint is bit-for-bit the uninterrupted run."""

import dataclasses
import io
import warnings

import numpy as np
import pytest
import torch

from lmcore import (
    AdamW,
    TransformerLM,
    clip_grad_norm,
    cosine_lr,
    cross_entropy,
    get_batch,
    load_checkpoint,
    save_checkpoint,
)

TOTAL_STEPS = 6


def _train(model, optimizer, tokens, start: int, stop: int) -> None:
    for it in range(start, stop):
        for group in optimizer.param_groups:
            group["lr"] = cosine_lr(it, 1e-2, 1e-3, 2, TOTAL_STEPS)
        inputs, targets = get_batch(tokens, 4, 16, "cpu", generator=np.random.default_rng(it))
        optimizer.zero_grad()
        cross_entropy(model(inputs), targets).backward()
        clip_grad_norm(model.parameters(), 1.0)
        optimizer.step()


def _fresh(config, seed: int):
    torch.manual_seed(seed)
    model = TransformerLM.from_config(config)
    return model, AdamW(model.parameters(), weight_decay=0.1)


@pytest.fixture
def tokens(tiny_config):
    return np.random.default_rng(0).integers(0, tiny_config.vocab_size, size=500)


def test_resumed_run_equals_uninterrupted_run(tiny_config, tokens, tmp_path):
    model, optimizer = _fresh(tiny_config, seed=0)
    _train(model, optimizer, tokens, 0, TOTAL_STEPS)

    first, first_optimizer = _fresh(tiny_config, seed=0)
    _train(first, first_optimizer, tokens, 0, 3)
    save_checkpoint(first, first_optimizer, 3, tmp_path / "ckpt.pt")
    resumed, resumed_optimizer = _fresh(tiny_config, seed=1)  # different initial weights
    start = load_checkpoint(tmp_path / "ckpt.pt", resumed, resumed_optimizer)
    _train(resumed, resumed_optimizer, tokens, start, TOTAL_STEPS)

    assert start == 3
    for name, value in model.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[name]), name
    for p, q in zip(model.parameters(), resumed.parameters(), strict=True):
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(optimizer.state[p][key], resumed_optimizer.state[q][key]), key


def test_round_trip_through_file_object(tiny_config, tokens):
    model, optimizer = _fresh(tiny_config, seed=0)
    _train(model, optimizer, tokens, 0, 1)
    buffer = io.BytesIO()
    save_checkpoint(model, optimizer, 1, buffer)
    buffer.seek(0)
    other, other_optimizer = _fresh(tiny_config, seed=1)
    assert load_checkpoint(buffer, other, other_optimizer) == 1
    assert other_optimizer.state_dict()["state"].keys() == optimizer.state_dict()["state"].keys()
    for a, b in zip(model.parameters(), other.parameters(), strict=True):
        assert torch.equal(a, b)


def test_extra_state_round_trips_and_loads_from_the_read_dict(tiny_config, tmp_path):
    model, optimizer = _fresh(tiny_config, seed=0)
    rng = np.random.default_rng(7)
    rng.integers(0, 10, size=3)
    extra = {"config": {"lr": 1e-3, "size": "tiny"}, "rng": rng.bit_generator.state}
    extra["torch_rng"] = torch.get_rng_state()
    save_checkpoint(model, optimizer, 3, tmp_path / "ckpt.pt", extra=extra)
    read = torch.load(tmp_path / "ckpt.pt", map_location="cpu", weights_only=True)
    assert read["extra"]["config"] == extra["config"]
    assert read["extra"]["rng"] == extra["rng"]  # 128-bit integers survive weights_only loading
    assert torch.equal(read["extra"]["torch_rng"], extra["torch_rng"])
    other, other_optimizer = _fresh(tiny_config, seed=1)
    assert load_checkpoint(read, other, other_optimizer) == 3
    for a, b in zip(model.parameters(), other.parameters(), strict=True):
        assert torch.equal(a, b)


# Importing torch.compile's machinery the first time triggers a deprecation warning inside torch.
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_compiled_model_saves_plain_keys(tiny_config, tmp_path):
    model, _ = _fresh(tiny_config, seed=0)
    save_checkpoint(torch.compile(model), None, 0, tmp_path / "ckpt.pt")
    other, _ = _fresh(tiny_config, seed=1)
    load_checkpoint(tmp_path / "ckpt.pt", other, None)
    for a, b in zip(model.parameters(), other.parameters(), strict=True):
        assert torch.equal(a, b)


def test_loading_optimizer_from_weights_only_checkpoint_is_rejected(tiny_config, tmp_path):
    model, optimizer = _fresh(tiny_config, seed=0)
    save_checkpoint(model, None, 0, tmp_path / "ckpt.pt")
    with pytest.raises(ValueError, match="no optimizer state"):
        load_checkpoint(tmp_path / "ckpt.pt", model, optimizer)


def test_negative_iteration_is_rejected(tiny_model, tmp_path):
    with pytest.raises(ValueError, match="iteration"):
        save_checkpoint(tiny_model, None, -1, tmp_path / "ckpt.pt")


def _snapshot(model, optimizer):
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    state = {id(p): {k: v.clone() for k, v in s.items()} for p, s in optimizer.state.items()}
    return weights, state


def _assert_untouched(model, optimizer, snapshot):
    weights, state = snapshot
    for name, value in model.state_dict().items():
        assert torch.equal(value, weights[name]), name
    assert {id(p) for p in optimizer.state} == set(state)
    for p, s in optimizer.state.items():
        for key, value in s.items():
            assert torch.equal(value, state[id(p)][key]), key


def _trained(config, tokens, tmp_path):
    model, optimizer = _fresh(config, seed=0)
    _train(model, optimizer, tokens, 0, 1)
    save_checkpoint(model, optimizer, 1, tmp_path / "ckpt.pt")
    return torch.load(tmp_path / "ckpt.pt", weights_only=True)


def test_checkpoint_carries_the_model_configuration(tiny_config, tokens, tmp_path):
    checkpoint = _trained(tiny_config, tokens, tmp_path)
    assert checkpoint["model_config"] == dataclasses.asdict(tiny_config)


def test_weights_of_another_configuration_are_refused_naming_the_difference(
    tiny_config, tokens, tmp_path
):
    checkpoint = _trained(tiny_config, tokens, tmp_path)
    # 6 heads of 4 features instead of 3 of 8: every weight has the same shape
    other = dataclasses.replace(tiny_config, num_heads=6)
    model, optimizer = _fresh(other, seed=1)
    _train(model, optimizer, tokens, 0, 1)
    before = _snapshot(model, optimizer)
    with pytest.raises(ValueError, match=r"num_heads 3 \(checkpoint\) vs 6 \(model\)"):
        load_checkpoint(checkpoint, model, optimizer)
    _assert_untouched(model, optimizer, before)


def test_context_length_and_attention_backend_may_differ(tiny_config, tokens, tmp_path):
    checkpoint = _trained(tiny_config, tokens, tmp_path)
    other = dataclasses.replace(tiny_config, context_length=48, attention="sdpa")
    model, optimizer = _fresh(other, seed=1)
    assert load_checkpoint(checkpoint, model, optimizer) == 1


def test_an_old_checkpoint_without_configuration_loads_with_a_warning(
    tiny_config, tokens, tmp_path
):
    checkpoint = _trained(tiny_config, tokens, tmp_path)
    del checkpoint["model_config"]
    model, optimizer = _fresh(tiny_config, seed=1)
    with pytest.warns(UserWarning, match="no model configuration"):
        assert load_checkpoint(checkpoint, model, optimizer) == 1
    for name, value in checkpoint["model"].items():
        assert torch.equal(model.state_dict()[name], value), name


def test_a_new_checkpoint_loads_without_a_warning(tiny_config, tokens, tmp_path):
    checkpoint = _trained(tiny_config, tokens, tmp_path)
    model, optimizer = _fresh(tiny_config, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_checkpoint(checkpoint, model, optimizer)


def test_a_weight_that_does_not_fit_changes_nothing(tiny_config, tokens, tmp_path):
    checkpoint = _trained(tiny_config, tokens, tmp_path)
    del checkpoint["model_config"]  # an old checkpoint: only the shapes can tell
    checkpoint["model"]["lm_head.weight"] = checkpoint["model"]["lm_head.weight"][:-1]
    model, optimizer = _fresh(tiny_config, seed=1)
    _train(model, optimizer, tokens, 0, 1)
    before = _snapshot(model, optimizer)
    with pytest.warns(UserWarning), pytest.raises(ValueError, match=r"lm_head\.weight"):
        load_checkpoint(checkpoint, model, optimizer)
    _assert_untouched(model, optimizer, before)


def test_optimizer_state_for_other_groups_changes_nothing(tiny_config, tokens, tmp_path):
    checkpoint = _trained(tiny_config, tokens, tmp_path)
    model, _ = _fresh(tiny_config, seed=1)
    params = list(model.parameters())
    optimizer = AdamW([{"params": params[:3]}, {"params": params[3:]}])
    _train(model, optimizer, tokens, 0, 1)
    before = _snapshot(model, optimizer)
    with pytest.raises(ValueError, match="parameter groups of sizes"):
        load_checkpoint(checkpoint, model, optimizer)
    _assert_untouched(model, optimizer, before)


def test_a_file_holding_other_objects_is_refused_without_advising_weights_only_false(
    tiny_config, tmp_path
):
    # torch's own message advises weights_only=False, which runs whatever code the file holds.
    import fractions

    model, _ = _fresh(tiny_config, seed=0)
    save_checkpoint(model, None, 0, tmp_path / "ckpt.pt", extra={"ratio": fractions.Fraction(1, 3)})
    with pytest.raises(ValueError, match=r"add_safe_globals\(\[fractions\.Fraction\]\)") as info:
        load_checkpoint(tmp_path / "ckpt.pt", model, None)
    assert "weights_only=False" not in str(info.value)
    assert info.value.__suppress_context__  # torch's message is not printed beneath it


def test_an_optimizer_state_of_another_kind_changes_nothing(tiny_config, tokens, tmp_path):
    # lmcore.AdamW refuses torch's SGD state; load_checkpoint asks it before loading the model.
    model, _ = _fresh(tiny_config, seed=0)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    _train(model, sgd, tokens, 0, 1)
    save_checkpoint(model, sgd, 1, tmp_path / "ckpt.pt")
    other, optimizer = _fresh(tiny_config, seed=1)
    before = _snapshot(other, optimizer)
    with pytest.raises(ValueError, match=r"another optimizer.*Nothing was loaded"):
        load_checkpoint(tmp_path / "ckpt.pt", other, optimizer)
    _assert_untouched(other, optimizer, before)
