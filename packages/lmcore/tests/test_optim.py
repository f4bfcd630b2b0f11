"""AdamW against torch.optim.AdamW, gradient clipping against torch's, the cosine schedule."""

import copy
import math

import pytest
import torch

from lmcore import AdamW, clip_grad_norm, cosine_lr


def _param_groups(params):
    # Three groups with different hyper-parameters, one of them without weight decay.
    return [
        {"params": params[:2]},
        {"params": params[2:3], "lr": 3e-2, "weight_decay": 0.0},
        {"params": params[3:], "lr": 5e-3, "betas": (0.8, 0.95), "eps": 1e-6},
    ]


def _make_params(seed: int, dtype=torch.float32):
    torch.manual_seed(seed)
    shapes = [(7, 5), (5,), (3, 4, 2), (11,)]
    return [torch.randn(s, dtype=dtype, requires_grad=True) for s in shapes]


def _train(optimizer_cls, params, steps: int, **kwargs):
    optimizer = optimizer_cls(_param_groups(params), lr=1e-2, weight_decay=0.1, **kwargs)
    torch.manual_seed(123)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn_like(p)
        optimizer.step()
    return optimizer


# Both of our paths against both of torch's: the same IEEE operations in the same order, so the
# parameters and moments agree bit for bit (rtol=atol=0), not merely to a tolerance.
@pytest.mark.parametrize("torch_foreach", [False, True])
@pytest.mark.parametrize("foreach", [None, False, True])
def test_adamw_matches_torch_over_several_steps(foreach, torch_foreach):
    ours, theirs = _make_params(0), _make_params(0)
    mine = _train(AdamW, ours, steps=7, foreach=foreach)
    reference = _train(torch.optim.AdamW, theirs, steps=7, foreach=torch_foreach)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        for key in ("exp_avg", "exp_avg_sq", "step"):
            torch.testing.assert_close(mine.state[a][key], reference.state[b][key], rtol=0, atol=0)


@pytest.mark.parametrize("foreach", [False, True])
def test_adamw_matches_torch_in_float64_with_mixed_dtypes(foreach):
    ours = _make_params(1, torch.float64)[:2] + _make_params(1)[2:]
    theirs = _make_params(1, torch.float64)[:2] + _make_params(1)[2:]
    _train(AdamW, ours, steps=4, foreach=foreach)
    _train(torch.optim.AdamW, theirs, steps=4)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_adamw_foreach_and_loop_paths_agree_on_a_model():
    torch.manual_seed(3)
    models = [torch.nn.Sequential(torch.nn.Linear(9, 13), torch.nn.Linear(13, 5)) for _ in "ab"]
    models[1].load_state_dict(models[0].state_dict())
    optimizers = [
        AdamW(m.parameters(), lr=3e-3, weight_decay=0.1, foreach=f)
        for m, f in zip(models, (True, False), strict=True)
    ]
    for _ in range(5):
        x = torch.randn(6, 9)
        for model, optimizer in zip(models, optimizers, strict=True):
            optimizer.zero_grad()
            model(x).square().mean().backward()
            optimizer.step()
    for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize(("foreach", "torch_foreach"), [(None, True), (False, False)])
def test_adamw_matches_torch_on_cuda(foreach, torch_foreach):
    # On CUDA the default is the multi-tensor path; each path against torch's same path.
    ours = [p.detach().cuda().requires_grad_() for p in _make_params(4)]
    theirs = [p.detach().cuda().requires_grad_() for p in _make_params(4)]
    _train(AdamW, ours, steps=5, foreach=foreach)
    _train(torch.optim.AdamW, theirs, steps=5, foreach=torch_foreach)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


# ---- the fused path (Triton's interpreter on a CPU) ---------------------------------------------

# Sizes that cross the kernel's 2,048-element blocks (6,147 elements: four blocks, the last
# ragged) and tiny ones.
FUSED_SHAPES = [(3, 2049), (5,), (7, 13), (1,)]


def _fused_params(seed: int, dtype=torch.float32, device="cpu"):
    torch.manual_seed(seed)
    return [torch.randn(s, dtype=dtype, device=device, requires_grad=True) for s in FUSED_SHAPES]


def _train_fused_pair(ours, theirs, steps, *, skip=None, **kwargs):
    """Step our fused AdamW and torch's fused AdamW on the same fresh random gradients."""
    groups = [
        lambda ps: [{"params": ps[:2]}, {"params": ps[2:], "lr": 3e-2, "weight_decay": 0.0}],
    ][0]
    mine = AdamW(groups(ours), lr=1e-2, weight_decay=0.1, fused=True, **kwargs)
    reference = torch.optim.AdamW(groups(theirs), lr=1e-2, weight_decay=0.1, fused=True)
    g = torch.Generator().manual_seed(123)
    for step in range(steps):
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            if skip is not None and skip(step, i):
                a.grad = b.grad = None
                continue
            grad = torch.randn(a.shape, generator=g).to(a)
            a.grad, b.grad = grad, grad.clone()
        mine.step()
        reference.step()
    return mine, reference


def test_fused_adamw_matches_torch_fused_adamw():
    ours, theirs = _fused_params(0), _fused_params(0)
    mine, reference = _train_fused_pair(ours, theirs, steps=5)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b)  # float32 tolerances: rounding, not arithmetic
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(mine.state[a][key], reference.state[b][key])
        assert mine.state[a]["step"].item() == reference.state[b]["step"].item() == 5


def test_fused_adamw_with_parameters_at_different_steps():
    ours, theirs = _fused_params(1), _fused_params(1)
    # parameter 1 has no gradient on even steps: it is one step behind the others, its own launch
    mine, _ = _train_fused_pair(ours, theirs, steps=4, skip=lambda step, i: i == 1 and step % 2)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b)
    assert mine.state[ours[1]]["step"].item() == 2


def test_fused_adamw_follows_gradients_written_in_place_and_moved():
    # Gradients kept at one address (copied into) reuse the launch's address table; a gradient
    # replaced by a new tensor moves it, and the table is rebuilt.
    ours, theirs = _fused_params(6), _fused_params(6)
    mine = AdamW(ours, lr=1e-2, weight_decay=0.1, fused=True)
    reference = torch.optim.AdamW(theirs, lr=1e-2, weight_decay=0.1, fused=True)
    for a in ours:
        a.grad = torch.zeros_like(a)
    g = torch.Generator().manual_seed(7)
    for step in range(4):
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            grad = torch.randn(a.shape, generator=g)
            if step == 2 and i == 0:
                a.grad = grad.clone()  # a new address
            else:
                a.grad.copy_(grad)
            b.grad = grad
        mine.step()
        reference.step()
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b)


def test_fused_adamw_refuses_a_gradient_that_is_not_contiguous():
    param = torch.randn(4, 5, requires_grad=True)
    param.grad = torch.randn(5, 4).t()
    with pytest.raises(ValueError, match="contiguous gradients of the parameters' dtype"):
        AdamW([param], fused=True).step()


def _adamw_float64(param, grads, *, lr, weight_decay, betas=(0.9, 0.999), eps=1e-8):
    """AdamW in float64 on a bf16 parameter, rounding it back to bf16 after every step."""
    m = torch.zeros_like(param, dtype=torch.float64)
    v = torch.zeros_like(m)
    for t, grad in enumerate(grads, start=1):
        p, g = param.double(), grad.double()
        p = p - lr * weight_decay * p
        m = betas[0] * m + (1 - betas[0]) * g
        v = betas[1] * v + (1 - betas[1]) * g * g
        denom = v.sqrt() / (1 - betas[1] ** t) ** 0.5 + eps
        param = (p - lr / (1 - betas[0] ** t) * m / denom).to(param.dtype)
    return param, m, v


def _bf16_run(steps: int, device: str = "cpu"):
    torch.manual_seed(2)
    param = torch.randn(3, 2049, device=device).to(torch.bfloat16).requires_grad_()
    start = param.detach().clone()
    grads = [torch.randn_like(param, dtype=torch.float32).to(param.dtype) for _ in range(steps)]
    optimizer = AdamW([param], lr=1e-2, weight_decay=0.1, fused=True)
    for grad in grads:
        param.grad = grad
        optimizer.step()
    return (
        param.detach(),
        optimizer.state[param],
        _adamw_float64(start, grads, lr=1e-2, weight_decay=0.1),
    )


def test_fused_adamw_keeps_float32_moments_for_bf16_parameters():
    _, state, (_, m, v) = _bf16_run(steps=4)
    assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.float32
    torch.testing.assert_close(state["exp_avg"], m.float(), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(state["exp_avg_sq"], v.float(), rtol=1e-5, atol=1e-7)


def test_fused_adamw_rounds_a_bf16_parameter_once_per_step():
    # One ulp: the update in float32 against float64, rounded once. (Triton's interpreter
    # truncates where the GPU rounds to nearest, so the CPU checks one step; the GPU test five.)
    param, _, (want, _, _) = _bf16_run(steps=1)
    torch.testing.assert_close(param, want, rtol=2**-7, atol=0)


def _assert_within_one_rounding_a_step(
    moment: torch.Tensor, grads: list[torch.Tensor], beta: float, *, squared: bool
) -> None:
    """`moment` (bf16) differs from the exact moment of `grads` by at most one bf16 rounding
    of each step's value: step k's rounding is below 2**-7·|m_k| (one ulp: truncation, as
    Triton's interpreter does, or rounding to nearest), and later steps scale it by β < 1, so
    the error stays below 2**-7 · Σ_k |m_k| (the moments depend on the gradients alone)."""
    exact = torch.zeros_like(moment, dtype=torch.float64)
    bound = torch.zeros_like(exact)
    for g in grads:
        g = g.double().square() if squared else g.double()
        exact = beta * exact + (1 - beta) * g
        bound += 2**-7 * exact.abs()
    assert torch.all((moment.double() - exact).abs() <= bound)


@pytest.mark.parametrize(
    ("device", "steps"), [("cpu", 3), pytest.param("cuda", 10, marks=pytest.mark.gpu)]
)
def test_fused_adamw_keeps_bf16_moments_when_asked_within_one_rounding_a_step(device, steps):
    torch.manual_seed(2)
    param = torch.randn(3, 2049, device=device).to(torch.bfloat16).requires_grad_()
    grads = [torch.randn_like(param, dtype=torch.float32).to(param.dtype) for _ in range(steps)]
    optimizer = AdamW([param], fused=True, moment_dtype=torch.bfloat16)
    for grad in grads:
        param.grad = grad
        optimizer.step()
    state = optimizer.state[param]
    assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.bfloat16
    _assert_within_one_rounding_a_step(state["exp_avg"], grads, 0.9, squared=False)
    _assert_within_one_rounding_a_step(state["exp_avg_sq"], grads, 0.999, squared=True)


def _bf16_pair(steps: int, device: str = "cpu"):
    """bf16 parameters stepped by our fused AdamW with bf16 moments and by torch's AdamW
    (`fused=False`, bf16 moments too), and the float64 AdamW of the same start and gradients."""
    torch.manual_seed(9)
    start = [torch.randn(s, device=device).to(torch.bfloat16) for s in FUSED_SHAPES]
    grads = [[torch.randn_like(p, dtype=torch.float32).to(p.dtype) for p in start]
             for _ in range(steps)]  # fmt: skip
    results = []
    for make in (
        lambda ps: AdamW(ps, lr=1e-2, weight_decay=0.1, fused=True, moment_dtype=torch.bfloat16),
        lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, foreach=False, fused=False),
    ):
        params = [p.clone().requires_grad_() for p in start]
        optimizer = make(params)
        for step_grads in grads:
            for p, g in zip(params, step_grads, strict=True):
                p.grad = g.clone()
            optimizer.step()
        results.append([p.detach() for p in params])
    exact = [
        _adamw_float64(p, [g[i] for g in grads], lr=1e-2, weight_decay=0.1)[0]
        for i, p in enumerate(start)
    ]
    return results[0], results[1], exact


def _distance(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    pairs = zip(got, want, strict=True)
    return sum(((a.double() - b.double()) ** 2).sum().item() for a, b in pairs) ** 0.5


def test_fused_adamw_with_bf16_moments_is_within_twice_torchs_bf16_error():
    # torch's bf16 AdamW rounds each of its operations to bf16; ours rounds the parameter and
    # the moments once a step. Both against the float64 AdamW (the parameter rounded to bf16
    # after each step, as a bf16 parameter must be): ours at most twice as far. Two steps on
    # the CPU, where Triton's interpreter truncates its stores instead of rounding them.
    ours, theirs, exact = _bf16_pair(steps=2)
    assert _distance(theirs, exact) > 0
    assert _distance(ours, exact) <= 2 * _distance(theirs, exact)


def test_adamw_moment_dtype_needs_the_fused_kernel_and_a_dtype_it_keeps():
    with pytest.raises(ValueError, match="pass fused=True"):
        AdamW(_make_params(0), moment_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="moment_dtype must be one of"):
        AdamW(_fused_params(0), fused=True, moment_dtype=torch.float16)
    optimizer = AdamW(_fused_params(0)[:2], fused=True)
    with pytest.raises(ValueError, match="pass fused=True"):
        optimizer.add_param_group(
            {"params": _fused_params(1)[2:], "fused": False, "moment_dtype": torch.bfloat16}
        )


def _stepped_with_bf16_moments(seed: int) -> tuple[list[torch.Tensor], AdamW]:
    """bf16 parameters, one step of the fused AdamW with bf16 moments."""
    params = _fused_params(seed, torch.bfloat16)
    optimizer = AdamW(params, fused=True, moment_dtype=torch.bfloat16)
    for p in params:
        p.grad = torch.randn_like(p)
    optimizer.step()
    return params, optimizer


def test_fused_adamw_refuses_moments_of_two_dtypes_in_one_launch():
    params, optimizer = _stepped_with_bf16_moments(0)
    state = optimizer.state[params[0]]
    state["exp_avg_sq"] = state["exp_avg_sq"].float()
    with pytest.raises(ValueError, match="moments of one launch in one dtype"):
        optimizer.step()


def test_fused_state_dict_with_bf16_moments_loads_keeping_them_bf16():
    params, mine = _stepped_with_bf16_moments(3)
    fresh = _fused_params(3, torch.bfloat16)
    resumed = AdamW(fresh, fused=True, moment_dtype=torch.bfloat16)
    resumed.load_state_dict(copy.deepcopy(mine.state_dict()))
    for p, q in zip(fresh, params, strict=True):
        assert resumed.state[p]["exp_avg"].dtype == torch.bfloat16
        assert torch.equal(resumed.state[p]["exp_avg_sq"], mine.state[q]["exp_avg_sq"])


def test_fused_adamw_counts_each_parameters_steps_apart_when_saved_and_resumed():
    # parameters stepped together share one step count; a saved state must not (torch's
    # AdamW would otherwise add one to the shared count once per parameter)
    ours, theirs = _fused_params(5), _fused_params(5)
    mine, _ = _train_fused_pair(ours, theirs, steps=3, skip=lambda step, i: i == 3 and step == 2)
    assert [mine.state[p]["step"].item() for p in ours] == [3, 3, 3, 2]
    saved = copy.deepcopy(mine.state_dict())
    steps = [entry["step"] for entry in saved["state"].values()]
    assert len({id(t) for t in steps}) == len(steps)
    fresh = _fused_params(5)
    other = torch.optim.AdamW([{"params": fresh[:2]}, {"params": fresh[2:]}], foreach=True)
    other.load_state_dict(saved)
    for p in fresh:
        p.grad = torch.randn_like(p)
    other.step()
    assert [other.state[p]["step"].item() for p in fresh] == [4, 4, 4, 3]
    for p in ours:
        p.grad = torch.randn_like(p)
    mine.step()  # the live state was not touched by saving it
    assert [mine.state[p]["step"].item() for p in ours] == [4, 4, 4, 3]


def test_fused_state_dict_loads_into_torch_and_back_keeping_float32_moments():
    ours, theirs = _fused_params(3), _fused_params(3)
    mine, _ = _train_fused_pair(ours, theirs, steps=2)
    saved = mine.state_dict()
    fresh = _fused_params(3)
    other = torch.optim.AdamW([{"params": fresh[:2]}, {"params": fresh[2:]}])
    other.load_state_dict(copy.deepcopy(saved))
    assert torch.equal(other.state[fresh[0]]["exp_avg"], mine.state[ours[0]]["exp_avg"])
    # into bf16 parameters: torch's loading would round the moments to bf16
    params = _fused_params(3, torch.bfloat16)
    resumed = AdamW([{"params": params[:2]}, {"params": params[2:]}], fused=True)
    resumed.load_state_dict(copy.deepcopy(saved))
    for p, q in zip(params, ours, strict=True):
        state = resumed.state[p]
        assert state["exp_avg"].dtype == torch.float32 and state["step"].device.type == "cpu"
        assert torch.equal(state["exp_avg_sq"], mine.state[q]["exp_avg_sq"])


@pytest.mark.parametrize(
    ("params", "kwargs", "match"),
    [
        (lambda: _fused_params(0), {"foreach": True}, "pick one"),
        (lambda: _fused_params(0, torch.float64), {}, "float32, bfloat16 and float16"),
        (lambda: [torch.randn(4, 3).t().requires_grad_()], {}, "contiguous parameters"),
    ],
)
def test_fused_adamw_rejects_what_its_kernel_cannot_update(params, kwargs, match):
    with pytest.raises(ValueError, match=match):
        AdamW(params(), fused=True, **kwargs)


def test_fused_adamw_on_a_cpu_without_the_interpreter_says_so(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="needs CUDA parameters"):
        AdamW(_fused_params(0), fused=True)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_adamw_matches_torch_fused_on_cuda(dtype):
    ours, theirs = _fused_params(4, device="cuda"), _fused_params(4, device="cuda")
    mine, reference = _train_fused_pair(ours, theirs, steps=5)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b)
        torch.testing.assert_close(mine.state[a]["exp_avg_sq"], reference.state[b]["exp_avg_sq"])
    if dtype == torch.bfloat16:  # rounded to nearest once per step: within two ulps after five
        param, _, (want, _, _) = _bf16_run(steps=5, device="cuda")
        torch.testing.assert_close(param, want, rtol=2**-6, atol=0)


@pytest.mark.gpu
def test_fused_adamw_with_bf16_moments_is_within_twice_torchs_bf16_error_on_cuda():
    ours, theirs, exact = _bf16_pair(steps=10, device="cuda")
    assert _distance(ours, exact) <= 2 * _distance(theirs, exact)


@pytest.mark.gpu
def test_fused_adamw_with_a_misaligned_parameter_on_cuda():
    # A view 4 bytes into its buffer: the kernel's 16-byte vector path is off for this launch.
    base = torch.randn(3 * 2049 + 1, device="cuda")
    ours = [base[1:].view(3, 2049).requires_grad_(), *_fused_params(8, device="cuda")[1:]]
    theirs = [p.detach().clone().requires_grad_() for p in ours]
    _train_fused_pair(ours, theirs, steps=3)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b)


def test_adamw_state_dict_has_torch_layout():
    ours = _train(AdamW, _make_params(0), steps=2).state_dict()
    theirs = _train(torch.optim.AdamW, _make_params(0), steps=2).state_dict()
    assert ours["state"].keys() == theirs["state"].keys()
    for index, state in ours["state"].items():
        assert state.keys() == theirs["state"][index].keys() == {"step", "exp_avg", "exp_avg_sq"}
        for key, value in state.items():
            assert value.dtype == theirs["state"][index][key].dtype
            torch.testing.assert_close(value, theirs["state"][index][key], rtol=0, atol=0)


def test_adamw_resumes_from_torch_state_dict():
    ours, theirs = _make_params(0), _make_params(0)
    reference = _train(torch.optim.AdamW, theirs, steps=3)
    with torch.no_grad():
        for a, b in zip(ours, theirs, strict=True):
            a.copy_(b)
    optimizer = AdamW(_param_groups(ours))
    # A copy: load_state_dict keeps tensors that need no cast, which would share the moments.
    optimizer.load_state_dict(copy.deepcopy(reference.state_dict()))
    torch.manual_seed(5)
    grads = [torch.randn_like(p) for p in ours]
    for a, b, g in zip(ours, theirs, grads, strict=True):
        a.grad, b.grad = g, g.clone()
    optimizer.step()
    reference.step()
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_adamw_skips_parameters_without_gradient():
    params = _make_params(0)
    before = params[1].detach().clone()
    optimizer = AdamW(params)
    params[0].grad = torch.randn_like(params[0])
    optimizer.step()
    assert torch.equal(params[1], before)
    assert params[1] not in optimizer.state


def test_adamw_step_returns_closure_loss():
    params = _make_params(0)
    optimizer = AdamW(params)

    def closure():
        optimizer.zero_grad()
        loss = sum((p**2).sum() for p in params)
        loss.backward()
        return loss

    loss = optimizer.step(closure)
    assert loss > 0 and all(p.grad is not None for p in params)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"lr": -1e-3}, "learning rate"),
        ({"betas": (0.9, 1.0)}, "betas"),
        ({"eps": -1.0}, "eps"),
        ({"weight_decay": -0.1}, "weight_decay"),
    ],
)
def test_adamw_rejects_bad_hyper_parameters(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AdamW(_make_params(0), **kwargs)


@pytest.mark.parametrize("max_norm", [0.5, 1e3])  # one that clips, one that does not
def test_clip_grad_norm_matches_torch(max_norm):
    ours, theirs = _make_params(0), _make_params(0)
    torch.manual_seed(1)
    for a, b in zip(ours, theirs, strict=True):
        a.grad = torch.randn_like(a) * 3
        b.grad = a.grad.clone()
    ours.append(torch.randn(3, requires_grad=True))  # no gradient: ignored
    total = clip_grad_norm(ours, max_norm)
    expected = torch.nn.utils.clip_grad_norm_(theirs, max_norm)
    torch.testing.assert_close(total, expected)
    for a, b in zip(ours[:-1], theirs, strict=True):
        torch.testing.assert_close(a.grad, b.grad)


def test_clip_grad_norm_caps_total_norm():
    params = _make_params(0)
    for p in params:
        p.grad = torch.randn_like(p) * 10
    clip_grad_norm(params, 1.0)
    total = torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in params]))
    assert total.item() == pytest.approx(1.0, rel=1e-5)


def test_clip_grad_norm_rejects_negative_max_norm():
    with pytest.raises(ValueError, match="max_norm"):
        clip_grad_norm(_make_params(0), -1.0)


def _cosine_reference(t, max_lr, min_lr, warmup, total):
    if t < warmup:
        return max_lr * t / warmup
    if t <= total:
        return (
            min_lr
            + (max_lr - min_lr) * (1 + math.cos(math.pi * (t - warmup) / (total - warmup))) / 2
        )
    return min_lr


def test_cosine_lr_boundaries():
    args = (1.0, 0.1, 7, 21)  # max_lr, min_lr, warmup, total
    assert cosine_lr(0, *args) == 0.0
    assert cosine_lr(7, *args) == 1.0
    assert cosine_lr(14, *args) == pytest.approx(0.55)  # half way down the cosine
    assert cosine_lr(21, *args) == pytest.approx(0.1)
    assert cosine_lr(22, *args) == cosine_lr(1000, *args) == 0.1


def test_cosine_lr_matches_handout_definition_everywhere():
    for t in range(30):
        assert cosine_lr(t, 3e-4, 3e-5, 5, 25) == pytest.approx(
            _cosine_reference(t, 3e-4, 3e-5, 5, 25)
        )


def test_cosine_lr_without_warmup_starts_at_max():
    assert cosine_lr(0, 2.0, 0.5, 0, 10) == 2.0


@pytest.mark.parametrize(("step", "warmup", "total"), [(-1, 2, 10), (0, -1, 10), (0, 10, 10)])
def test_cosine_lr_rejects_bad_arguments(step, warmup, total):
    with pytest.raises(ValueError):
        cosine_lr(step, 1.0, 0.1, warmup, total)
