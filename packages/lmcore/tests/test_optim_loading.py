"""What a loaded state dict becomes in lmcore.AdamW: the constructor picks the implementation, the
saved state is converted to it or refused; and the fused path's launches follow parameters that
change size, dtype or device. The fused kernel runs in Triton's interpreter on a CPU."""

import copy

import pytest
import torch

from lmcore import AdamW

SHAPES = [(3, 700), (5,), (2049,)]  # 2049: a block and one element more


def _params(seed: int, dtype=torch.float32) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g).to(dtype).requires_grad_() for s in SHAPES]


def _groups(params):
    return [{"params": params[:2]}, {"params": params[2:], "lr": 3e-2, "weight_decay": 0.0}]


def _step(optimizers_and_params, seed: int) -> None:
    """One step of each optimizer on its parameters, all given the same fresh gradients."""
    g = torch.Generator().manual_seed(seed)
    grads = [torch.randn(s, generator=g) for s in SHAPES]
    for optimizer, params in optimizers_and_params:
        for p, grad in zip(params, grads, strict=True):
            p.grad = grad.to(p.dtype)
        optimizer.step()


def _trained(optimizer_cls, params, steps: int = 2, **kwargs):
    optimizer = optimizer_cls(_groups(params), **({"lr": 1e-2, "weight_decay": 0.1} | kwargs))
    for step in range(steps):
        _step([(optimizer, params)], seed=step)
    return optimizer


def _one_step_float64(param, state, grad, group):
    """The parameter after one AdamW step from `state`, in float64, rounded to its dtype."""
    beta1, beta2 = group["betas"]
    t = state["step"].item() + 1
    p, g = param.detach().double(), grad.double()
    m = beta1 * state["exp_avg"].double() + (1 - beta1) * g
    v = beta2 * state["exp_avg_sq"].double() + (1 - beta2) * g * g
    p = p - group["lr"] * group["weight_decay"] * p
    denom = v.sqrt() / (1 - beta2**t) ** 0.5 + group["eps"]
    return (p - group["lr"] / (1 - beta1**t) * m / denom).to(param.dtype)


def test_a_fused_bf16_state_loads_into_the_default_path_as_torch_loads_it():
    # Before: the saved fused=True took over the default optimizer, whose moments torch's
    # loading had rounded to bf16, and the kernel wrote float32 over them (past their end).
    saved = _trained(AdamW, _params(0, torch.bfloat16), fused=True).state_dict()
    ours, theirs = _params(1, torch.bfloat16), _params(1, torch.bfloat16)
    mine = AdamW(_groups(ours), foreach=False)
    reference = torch.optim.AdamW(_groups(theirs), foreach=False)
    mine.load_state_dict(copy.deepcopy(saved))
    reference.load_state_dict(copy.deepcopy(saved))
    assert [(g["fused"], g["foreach"]) for g in mine.param_groups] == [(False, False)] * 2
    for group in reference.param_groups:  # torch's AdamW takes its implementation from the
        group.update(fused=None, foreach=False)  # checkpoint: put back the one it was built with
    _step([(mine, ours), (reference, theirs)], seed=9)
    for a, b in zip(ours, theirs, strict=True):
        assert mine.state[a]["exp_avg"].dtype == torch.bfloat16
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        torch.testing.assert_close(mine.state[a]["exp_avg_sq"], reference.state[b]["exp_avg_sq"])


def test_torch_adamw_state_loads_into_the_fused_path_with_float32_moments():
    # Before: the saved fused=None turned the fused optimizer into the default one, which then
    # failed on its float32 moments beside bf16 parameters.
    trained = _params(2, torch.bfloat16)
    saved = copy.deepcopy(_trained(torch.optim.AdamW, trained).state_dict())
    params = _params(3, torch.bfloat16)
    optimizer = AdamW(_groups(params), fused=True)
    optimizer.load_state_dict(copy.deepcopy(saved))
    assert all(g["fused"] and "amsgrad" not in g for g in optimizer.param_groups)
    g = torch.Generator().manual_seed(4)
    expected = []
    for i, p in enumerate(params):
        state = optimizer.state[p]
        assert state["exp_avg"].dtype == torch.float32 and state["step"].item() == 2
        assert torch.equal(state["exp_avg"], saved["state"][i]["exp_avg"].float())
        p.grad = torch.randn(p.shape, generator=g).to(p.dtype)
        group = optimizer.param_groups[0 if i < 2 else 1]
        expected.append(_one_step_float64(p, state, p.grad, group))
    optimizer.step()
    for p, want in zip(params, expected, strict=True):
        # the update in float32 against float64, rounded once to bf16: one ulp
        torch.testing.assert_close(p.detach(), want, rtol=2**-7, atol=0)


@pytest.mark.parametrize(
    "saved_kwargs, our_kwargs",
    [({"foreach": True}, {"foreach": False}), ({"foreach": False}, {"fused": True}),
     ({"fused": True}, {"foreach": True})],
    ids=["foreach-into-loop", "loop-into-fused", "fused-into-foreach"],
)  # fmt: skip
def test_the_implementation_is_the_constructors_and_training_continues_exactly(
    saved_kwargs, our_kwargs
):
    # fp32: every implementation keeps fp32 moments, so the resumed run equals one that never
    # stopped, run with our implementation throughout (to rounding for the fused kernel).
    first, ours = _params(5), _params(5)
    saved = copy.deepcopy(_trained(AdamW, first, **saved_kwargs).state_dict())
    uninterrupted = _trained(AdamW, ours, **our_kwargs)
    resumed_params = [p.detach().clone().requires_grad_() for p in first]
    resumed = AdamW(_groups(resumed_params), **our_kwargs)
    resumed.load_state_dict(saved)
    for group in resumed.param_groups:
        assert (group["fused"], group["foreach"]) == (
            our_kwargs.get("fused", False),
            our_kwargs.get("foreach"),
        )
    with torch.no_grad():
        for a, b in zip(ours, resumed_params, strict=True):
            b.copy_(a)
    for seed in (7, 8):
        _step([(uninterrupted, ours), (resumed, resumed_params)], seed=seed)
    for a, b in zip(ours, resumed_params, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("saved_dtype, our_dtype", [(torch.bfloat16, None), (None, torch.bfloat16)])
def test_the_fused_moment_dtype_is_the_constructors(saved_dtype, our_dtype):
    # A state saved with bf16 moments into float32 ones and back: converted, and the groups
    # keep the dtype this optimizer was built with, which its next step uses.
    saved = copy.deepcopy(
        _trained(
            AdamW, _params(13, torch.bfloat16), fused=True, moment_dtype=saved_dtype
        ).state_dict()
    )
    params = _params(14, torch.bfloat16)
    optimizer = AdamW(_groups(params), fused=True, moment_dtype=our_dtype)
    optimizer.load_state_dict(saved)
    want = torch.float32 if our_dtype is None else our_dtype
    assert all(g["moment_dtype"] == our_dtype for g in optimizer.param_groups)
    _step([(optimizer, params)], seed=15)
    for i, p in enumerate(params):
        state = optimizer.state[p]
        assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == want
        assert state["step"].item() == 3 and torch.isfinite(state["exp_avg_sq"]).all()
        assert not torch.equal(state["exp_avg"], saved["state"][i]["exp_avg"].to(want))


def _torch_state(optimizer_cls, **kwargs):
    return copy.deepcopy(_trained(optimizer_cls, _params(6), **kwargs).state_dict())


@pytest.mark.parametrize(
    "saved, match",
    [
        (lambda: _torch_state(torch.optim.AdamW, amsgrad=True), "amsgrad=True"),
        (lambda: _torch_state(torch.optim.AdamW, maximize=True), "maximize=True"),
        (lambda: _torch_state(torch.optim.Adam), "decoupled_weight_decay=False"),
        (lambda: _torch_state(torch.optim.SGD, momentum=0.9), "another optimizer"),
        (lambda: _torch_state(AdamW) | {"state": {0: {"step": torch.tensor(1.0)}}},
         "another optimizer"),
        (lambda: {**_torch_state(AdamW), "param_groups": [{"params": [0, 1, 2]}]}, "sizes"),
        (lambda: "optimizer.pt", "not an optimizer state dict"),
    ],
    ids=["amsgrad", "maximize", "adam-l2-decay", "sgd", "incomplete", "groups", "not-a-dict"],
)  # fmt: skip
def test_a_state_of_another_kind_is_refused_and_nothing_is_loaded(saved, match):
    optimizer = AdamW(_groups(_params(7)), fused=True)
    before = _options(optimizer)
    with pytest.raises(ValueError, match=match):
        optimizer.load_state_dict(saved())
    assert not optimizer.state and _options(optimizer) == before


def _options(optimizer):
    return [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]


def test_moments_of_other_shapes_are_refused():
    # Group sizes agree, the shapes do not: the fused kernel would have written past them.
    saved = _torch_state(torch.optim.AdamW)
    saved["state"][1]["exp_avg"] = torch.zeros(6)
    with pytest.raises(ValueError, match=r"exp_avg of shape \(6,\) for a parameter of shape"):
        AdamW(_groups(_params(8)), fused=True).load_state_dict(saved)


def test_adam_without_weight_decay_is_adamw_and_loads():
    saved = _torch_state(torch.optim.Adam, weight_decay=0.0)
    optimizer = AdamW(_groups(_params(9)))
    optimizer.load_state_dict(saved)
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.0, 0.0]


def test_a_fused_group_over_two_devices_is_refused():
    # torch's fused AdamW splits a group by device; one launch here cannot read two devices.
    params = [torch.randn(4, requires_grad=True), torch.randn(4, device="meta", requires_grad=True)]
    with pytest.raises(ValueError, match="a group of their own"):
        AdamW(params, fused=True)


def test_a_fused_parameter_resized_after_its_state_was_made_is_refused():
    # Before: the launch kept for the parameter still held its old size, and the kernel
    # updated only part of it (or, grown the other way, wrote past its moments).
    params = _params(10)
    optimizer = AdamW(params, fused=True)
    _step([(optimizer, params)], seed=0)
    params[0].data = torch.randn(4, 700)
    params[0].grad = torch.randn(4, 700)
    with pytest.raises(ValueError, match="of its size"):
        optimizer.step()


def test_a_fused_parameter_cast_to_bf16_is_updated_as_bf16():
    # `model.to(torch.bfloat16)` replaces each parameter's data: the launch must follow the
    # dtype (the kernel would otherwise read and write two bf16 values as one float32).
    params = _params(11)
    optimizer = AdamW(params, fused=True)
    _step([(optimizer, params)], seed=0)
    for p in params:
        p.data = p.data.to(torch.bfloat16)
    g = torch.Generator().manual_seed(12)
    expected = []
    for p in params:
        p.grad = torch.randn(p.shape, generator=g).to(torch.bfloat16)
        expected.append(_one_step_float64(p, optimizer.state[p], p.grad, optimizer.defaults))
    optimizer.step()
    for p, want in zip(params, expected, strict=True):
        torch.testing.assert_close(p.detach(), want, rtol=2**-7, atol=0)
