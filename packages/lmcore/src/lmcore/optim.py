"""AdamW (Loshchilov & Hutter, 2019) written out, numerically equal to `torch.optim.AdamW`."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

__all__ = ["AdamW"]

# Parameter dtypes the fused kernel updates (its moments are float32 for all three unless
# `moment_dtype` says otherwise).
_FUSED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# The fused kernel's moments when `moment_dtype` is not given.
_FUSED_MOMENT_DTYPE = torch.float32
# Launch tables and shared step counts kept per optimizer: one per set of parameters that had
# gradients together.
_MAX_LAUNCHES = 16
# Group options that pick how the arithmetic is carried out, not what it computes: the
# constructor's choice, which a loaded state dict never changes.
_IMPLEMENTATION_OPTIONS = ("fused", "foreach", "moment_dtype")
# The per-parameter state of this AdamW and of torch's, in torch's names.
_STATE_KEYS = frozenset({"step", "exp_avg", "exp_avg_sq"})
# torch.optim.AdamW's group options that this AdamW does not take, with the value under which
# each changes nothing here (None: any value; they choose torch's implementation). A loaded
# state with another value is refused; the options are then dropped.
_TORCH_ONLY_OPTIONS = {
    "amsgrad": False,
    "maximize": False,
    "decoupled_weight_decay": True,
    "capturable": None,
    "differentiable": None,
}


def _step_dtype() -> torch.dtype:
    # torch.optim keeps `step` as a float32 CPU scalar (float64 when that is the default dtype);
    # doing the same keeps state dicts interchangeable with torch's AdamW.
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


class AdamW(torch.optim.Optimizer):
    """Adam with decoupled weight decay, step for step the same arithmetic as `torch.optim.AdamW`.

    For each parameter θ with gradient g, at step t (counted from 1)::

        θ ← θ · (1 − lr·λ)                          decoupled weight decay
        m ← β₁·m + (1 − β₁)·g                       first moment
        v ← β₂·v + (1 − β₂)·g²                      second moment
        θ ← θ − lr / (1 − β₁ᵗ) · m / (√v / √(1 − β₂ᵗ) + ε)

    The per-parameter state is `step` (a float CPU scalar tensor), `exp_avg` (m) and `exp_avg_sq`
    (v), with the names and layout torch uses, so state dicts load in either direction.
    Parameters whose `grad` is None are skipped (their step count does not advance).

    Three implementations of the same arithmetic:

    - multi-tensor (`foreach`): `torch._foreach_*` operations over each parameter group, which
      on a GPU launch a handful of kernels per group instead of a handful per parameter, each
      a pass over every tensor. The operations and their order are those of torch's own
      foreach AdamW.
    - per-parameter: a loop over the parameters, torch's single-tensor AdamW written out; the
      readable one, and the reference the multi-tensor path is tested against.
    - fused (`fused=True`): one Triton kernel launch per parameter group (per parameter dtype
      and step count within it, normally one) that reads each parameter, gradient and moment
      once and writes the parameter and moments once (`lmcore.kernels.adamw`: a table of the
      tensors' addresses, one program per block of 2,048 elements). The moments are float32
      also for bf16 and fp16 parameters unless `moment_dtype` says otherwise; the update is
      computed in float32 and the parameter and each moment rounded once to their dtypes.

    By default (`foreach=None`, `fused=False`) a group whose parameters are all on CUDA takes
    the multi-tensor path and any other the per-parameter one, torch's own rule: on the CPU the
    `_foreach_` operations run as a loop over the tensors anyway and save nothing.

    The multi-tensor and per-parameter paths give bit-for-bit the results of
    `torch.optim.AdamW` (either of its paths) in fp32 and fp64: every elementwise operation is
    the same IEEE operation in the same order, and the bias corrections are the same
    Python-float expressions. The fused path agrees with `torch.optim.AdamW(fused=True)` to
    within rounding (its arithmetic, with correctly rounded square root and division, in
    another order of operations than the multi-tensor path's).

    Args:
        params: parameters or parameter groups (dicts), as for any `torch.optim.Optimizer`.
        lr: learning rate.
        betas: (β₁, β₂), decay rates of the moment estimates.
        eps: added to the denominator for numerical stability.
        weight_decay: decoupled weight decay λ (multiplied by `lr`).
        foreach: True for the multi-tensor path, False for the per-parameter loop, None (the
            default) for multi-tensor on CUDA and per-parameter elsewhere.
        fused: True for the fused Triton kernel; its parameters must be CUDA tensors of
            float32, bfloat16 or float16 (on a CPU only under Triton's interpreter,
            `TRITON_INTERPRET=1`, which is how the tests run it), contiguous, with contiguous
            gradients.
        moment_dtype: the dtype of the fused kernel's moments, `torch.float32` or
            `torch.bfloat16`; None (the default) is float32. `torch.bfloat16` halves the
            optimizer state (4 bytes per parameter instead of 8), and for bf16 parameters keeps
            the moments as torch's AdamW does (in the parameter's dtype); each moment is then
            rounded to bf16 once per step. Only with `fused=True`: the other paths keep the
            moments in each parameter's dtype, as torch's AdamW does.

    Raises:
        ValueError: a hyper-parameter is out of range, both `fused` and `foreach` are True,
            `moment_dtype` is given without `fused` or is not float32 or bfloat16, or a fused
            group has parameters the kernel cannot update (the message says why).

    Example::

        >>> optimizer = AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
        >>> loss.backward()
        >>> optimizer.step()
        >>> optimizer.zero_grad()
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        *,
        foreach: bool | None = None,
        fused: bool = False,
        moment_dtype: torch.dtype | None = None,
    ) -> None:
        if not lr >= 0.0:
            raise ValueError(f"learning rate must be >= 0, got {lr}")
        if len(betas) != 2 or not all(0.0 <= beta < 1.0 for beta in betas):
            raise ValueError(f"betas must be two numbers in [0, 1), got {betas}")
        if not eps >= 0.0:
            raise ValueError(f"eps must be >= 0, got {eps}")
        if not weight_decay >= 0.0:
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
        if fused and foreach:
            raise ValueError("fused and foreach are two implementations: pick one")
        defaults = {
            "lr": lr,
            "betas": tuple(betas),
            "eps": eps,
            "weight_decay": weight_decay,
            "foreach": foreach,
            "fused": fused,
            "moment_dtype": moment_dtype,
        }
        self._launches: dict[tuple[Any, ...], Any] = {}
        self._shared_steps: dict[tuple[int, ...], torch.Tensor] = {}
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group (as `torch.optim.Optimizer` does); a fused group's parameters are checked.

        Raises:
            ValueError: a fused group holds parameters the fused kernel cannot update, or the
                group's `moment_dtype` is not one the fused kernel keeps (or it is not fused).
        """
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        _check_moment_dtype(group["moment_dtype"], fused=group["fused"])
        if group["fused"]:
            if group["foreach"]:
                raise ValueError("fused and foreach are two implementations: pick one")
            _check_fused_params(group["params"])

    def _init_state(
        self, param: torch.Tensor, *, moment_dtype: torch.dtype | None = None
    ) -> dict[str, torch.Tensor]:
        """The parameter's state, created on its first step: moments of `moment_dtype` (None:
        the parameter's own dtype, as torch keeps them)."""
        state = self.state[param]
        if not state:
            dtype = param.dtype if moment_dtype is None else moment_dtype
            state["step"] = torch.tensor(0.0, dtype=_step_dtype())
            for key in ("exp_avg", "exp_avg_sq"):
                state[key] = torch.zeros_like(
                    param, dtype=dtype, memory_format=torch.preserve_format
                )
        return state

    def state_dict(self) -> dict[str, Any]:
        """The optimizer's state in torch's layout, each parameter with a step tensor of its own.

        The fused path shares one step tensor among parameters stepped together; a saved
        state keeps no such sharing, so that an optimizer loading it (torch's included)
        counts each parameter's steps apart.
        """
        saved = super().state_dict()
        saved["state"] = {
            index: {**entry, "step": entry["step"].clone()} if "step" in entry else entry
            for index, entry in saved["state"].items()
        }
        return saved

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state dict of this AdamW or of `torch.optim.AdamW`, in any implementation.

        The implementation stays this optimizer's: `fused`, `foreach` and `moment_dtype` are the
        constructor's choice, never the checkpoint's. Each parameter's saved state is converted
        to what its group's implementation keeps: moments in the group's `moment_dtype` (float32
        by default) for a fused group and in the parameter's dtype otherwise (torch's rule), on
        the parameter's device, and `step` a float CPU scalar of its own. The hyper-parameters
        (lr, betas, eps, weight_decay) and whatever else the saved groups carry (a scheduler's
        `initial_lr`) are loaded, as any torch optimizer loads them; torch's own options that
        this AdamW does not take are dropped once they are found to change nothing.

        Raises:
            ValueError: the state dict is of another kind, and nothing is loaded: groups of
                other sizes, the state of another optimizer (anything but `step`, `exp_avg`
                and `exp_avg_sq`), a moment of another shape than its parameter, or torch
                options that change the arithmetic (`amsgrad`, `maximize`, or weight decay
                added to the gradient, as torch's Adam does).
        """
        self.check_state_dict(state_dict)
        groups = [
            {k: v for k, v in saved.items() if k not in _TORCH_ONLY_OPTIONS}
            | {k: ours[k] for k in _IMPLEMENTATION_OPTIONS}
            for ours, saved in zip(self.param_groups, state_dict["param_groups"], strict=True)
        ]
        super().load_state_dict({**state_dict, "param_groups": groups})
        # torch's loading cast every moment to its parameter's dtype; convert from the saved
        # tensors instead, so that float32 moments reach a float32 fused group unrounded.
        saved_state = state_dict["state"]
        for group, saved in zip(self.param_groups, groups, strict=True):
            for param, index in zip(group["params"], saved["params"], strict=True):
                if saved_state.get(index):
                    self.state[param] = _converted(saved_state[index], param, group)
        self._launches.clear()  # the moments are new tensors
        self._shared_steps.clear()

    def check_state_dict(self, state_dict: Any) -> None:
        """Raise ValueError where `load_state_dict` would refuse `state_dict`; change nothing.

        For callers that load several things together and check them all first
        (`lmcore.load_checkpoint`)."""
        _check_loadable(self.param_groups, state_dict)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """Update every parameter that has a gradient; returns the closure's loss if one is given.

        Raises:
            RuntimeError: a gradient is sparse (not supported).
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            self._step_group(group)
        return loss

    def _step_group(self, group: dict[str, Any]) -> None:
        params = [p for p in group["params"] if p.grad is not None]
        if not params:
            return
        if any(p.grad.is_sparse for p in params):
            raise RuntimeError(
                "AdamW does not support sparse gradients; use torch.optim.SparseAdam"
            )
        if group.get("fused"):
            self._step_fused(params, group)
            return
        foreach = group.get("foreach")
        if foreach is None:
            foreach = all(p.is_cuda for p in params)
        if foreach:
            self._step_foreach(params, group)
        else:
            for param in params:
                self._step_one(param, group)

    def _step_one(self, param: torch.Tensor, group: dict[str, Any]) -> None:
        """The per-parameter update (torch's single-tensor AdamW)."""
        state = self._init_state(param)
        grad, exp_avg, exp_avg_sq = param.grad, state["exp_avg"], state["exp_avg_sq"]
        lr, eps, weight_decay = group["lr"], group["eps"], group["weight_decay"]
        beta1, beta2 = group["betas"]

        state["step"] += 1
        if weight_decay != 0:
            param.mul_(1 - lr * weight_decay)
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)

        t = state["step"].item()
        step_size = lr / (1 - beta1**t)
        denom = (exp_avg_sq.sqrt() / (1 - beta2**t) ** 0.5).add_(eps)
        param.addcdiv_(exp_avg, denom, value=-step_size)

    def _step_foreach(self, params: list[torch.Tensor], group: dict[str, Any]) -> None:
        """The multi-tensor update of one group's `params` (torch's foreach AdamW)."""
        grads = [p.grad for p in params]
        states = [self._init_state(p) for p in params]
        exp_avgs = [s["exp_avg"] for s in states]
        exp_avg_sqs = [s["exp_avg_sq"] for s in states]
        steps = [s["step"] for s in states]
        lr, eps, weight_decay = group["lr"], group["eps"], group["weight_decay"]
        beta1, beta2 = group["betas"]

        torch._foreach_add_(steps, 1)
        if weight_decay != 0:
            torch._foreach_mul_(params, 1 - lr * weight_decay)
        torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2)

        # Bias corrections are Python floats: the step counters live on the CPU, so reading
        # them never waits for the device.
        counts = [s.item() for s in steps]
        neg_step_sizes = [-(lr / (1 - beta1**t)) for t in counts]
        bias_correction2_sqrt = [(1 - beta2**t) ** 0.5 for t in counts]
        denom = torch._foreach_sqrt(exp_avg_sqs)
        torch._foreach_div_(denom, bias_correction2_sqrt)
        torch._foreach_add_(denom, eps)
        torch._foreach_addcdiv_(params, exp_avgs, denom, neg_step_sizes)

    def _step_fused(self, params: list[torch.Tensor], group: dict[str, Any]) -> None:
        """One kernel launch per (parameter dtype, moment dtype, step count) of the group's
        `params` (normally one: a group's moments share the group's moment dtype)."""
        from lmcore.kernels.adamw import adamw_step_

        moment_dtype = _fused_moment_dtype(group)
        states = [self._init_state(p, moment_dtype=moment_dtype) for p in params]
        counts = self._advance_steps(params, states)
        launches: dict[tuple[torch.dtype, torch.dtype, float], list[int]] = {}
        for i, (p, state, count) in enumerate(zip(params, states, counts, strict=True)):
            launches.setdefault((p.dtype, state["exp_avg"].dtype, count), []).append(i)
        beta1, beta2 = group["betas"]
        for (_, _, count), indices in launches.items():
            chosen = [params[i] for i in indices]
            tensors = (
                chosen,
                [p.grad for p in chosen],
                [states[i]["exp_avg"] for i in indices],
                [states[i]["exp_avg_sq"] for i in indices],
            )
            adamw_step_(
                self._launch(chosen),
                tensors,
                lr=group["lr"],
                beta1=beta1,
                beta2=beta2,
                eps=group["eps"],
                weight_decay=group["weight_decay"],
                step=int(count),
            )

    def _advance_steps(
        self, params: list[torch.Tensor], states: list[dict[str, torch.Tensor]]
    ) -> list[float]:
        """Add one to the step count of each of `params`; their counts after it.

        Parameters stepped together share one step tensor (the same object in each one's
        state), so that a step costs one addition instead of one per tensor (a hundred small
        CPU additions took most of the host time of a fused step). The sharing is kept only
        while the same parameters step together: otherwise (a first step, a loaded state dict,
        a parameter without a gradient this time) each gets a copy of its own before the
        addition, so no parameter outside this step is counted, and they share again when
        their counts agree.
        """
        # Keyed by the parameters' identities alone: a hit is used only while every one of
        # them still holds this very tensor as its step (checked below), whatever else changed.
        key = tuple(map(id, params))
        shared = self._shared_steps.get(key)
        if shared is not None and all(s["step"] is shared for s in states):
            shared += 1
            return [shared.item()] * len(params)
        steps = [s["step"].clone() for s in states]
        torch._foreach_add_(steps, 1)
        counts = torch.stack(steps).tolist()
        if len(set(counts)) == 1:
            steps = [_keep(self._shared_steps, key, steps[0])] * len(steps)
        for state, step in zip(states, steps, strict=True):
            state["step"] = step
        return counts

    def _launch(self, params: list[torch.Tensor]) -> Any:
        """The kept `lmcore.kernels.adamw.Launch` of these parameters (built on first use).

        Its block map and element type follow from the parameters' sizes and dtype, so they
        are part of the key beside the parameters' identities: a parameter whose data was
        replaced by a tensor of another size or dtype (`p.data = ...`, `model.half()`) gets a
        launch of its own, never one that would read and write it as the old tensor. The
        addresses are compared on every step by the launch itself (`Launch.addresses`)."""
        from lmcore.kernels.adamw import Launch

        key = (*map(id, params), *(p.numel() for p in params), params[0].dtype)
        launch = self._launches.get(key)
        return launch if launch is not None else _keep(self._launches, key, Launch(params))


def _moment_dtype(param: torch.Tensor, group: dict[str, Any]) -> torch.dtype:
    """The dtype `group` keeps `param`'s moments in: a fused group's `_fused_moment_dtype`,
    else the parameter's own (torch's rule, as `_init_state` makes them)."""
    return _fused_moment_dtype(group) if group["fused"] else param.dtype


def _check_loadable(groups: list[dict[str, Any]], state_dict: Any) -> None:
    """Raise ValueError unless `state_dict` is an AdamW state (this one's or torch's) for
    parameters like those of `groups`; see `AdamW.load_state_dict`."""
    if not isinstance(state_dict, Mapping) or not {"state", "param_groups"} <= state_dict.keys():
        raise ValueError("not an optimizer state dict (no 'state' and 'param_groups' entries)")
    saved_groups, state = state_dict["param_groups"], state_dict["state"]
    sizes = [len(g["params"]) for g in saved_groups]
    if sizes != [len(g["params"]) for g in groups]:
        raise ValueError(
            f"the state dict holds parameter groups of sizes {sizes}, this AdamW has "
            f"{[len(g['params']) for g in groups]}; build it over the same parameter groups"
        )
    for number, (group, saved) in enumerate(zip(groups, saved_groups, strict=True)):
        for option, neutral in _TORCH_ONLY_OPTIONS.items():
            if neutral is not None and option in saved and saved[option] != neutral:
                if option == "decoupled_weight_decay" and not saved.get("weight_decay"):
                    continue  # without weight decay, Adam and AdamW are the same update
                raise ValueError(
                    f"parameter group {number} was saved with {option}={saved[option]!r}, "
                    f"which lmcore.AdamW does not implement; load it into torch.optim."
                    f"{'Adam' if option == 'decoupled_weight_decay' else 'AdamW'} instead"
                )
        for param, index in zip(group["params"], saved["params"], strict=True):
            entry = state.get(index)
            if entry:
                _check_entry(entry, param, f"parameter {index}")


def _check_entry(entry: Any, param: torch.Tensor, name: str) -> None:
    """Raise ValueError unless `entry` is AdamW's state for a parameter like `param`."""
    if not isinstance(entry, dict) or entry.keys() != _STATE_KEYS:
        keys = sorted(entry) if isinstance(entry, dict) else type(entry).__name__
        raise ValueError(
            f"{name} has the state {keys}, not AdamW's {sorted(_STATE_KEYS)}: the state of "
            "another optimizer; lmcore.AdamW loads its own state dicts and torch.optim.AdamW's"
        )
    for key in ("exp_avg", "exp_avg_sq"):
        moment = entry[key]
        if not isinstance(moment, torch.Tensor) or moment.shape != param.shape:
            shape = tuple(moment.shape) if isinstance(moment, torch.Tensor) else moment
            raise ValueError(
                f"{name} has {key} of shape {shape} for a parameter of shape "
                f"{tuple(param.shape)}: the state of other parameters"
            )
    if torch.as_tensor(entry["step"]).numel() != 1:
        raise ValueError(f"{name} has a step count of {entry['step']!r}, not a number")


def _converted(entry: dict[str, Any], param: torch.Tensor, group: dict[str, Any]) -> dict[str, Any]:
    """A parameter's saved state (checked by `_check_entry`) as `group` keeps it: moments in
    `_moment_dtype` on the parameter's device, `step` a float CPU scalar of its own."""
    dtype = _moment_dtype(param, group)
    step = torch.as_tensor(entry["step"]).reshape(())
    return {
        "step": step.to(device="cpu", dtype=_step_dtype(), copy=True),
        "exp_avg": entry["exp_avg"].to(device=param.device, dtype=dtype),
        "exp_avg_sq": entry["exp_avg_sq"].to(device=param.device, dtype=dtype),
    }


def _keep(cache: dict[tuple[Any, ...], Any], key: tuple[Any, ...], value: Any) -> Any:
    """`value`, kept in `cache` under `key` (a cache of per-parameter-set objects, emptied
    when it holds _MAX_LAUNCHES, so that sets of parameters no longer stepped are let go)."""
    if len(cache) >= _MAX_LAUNCHES:
        cache.clear()
    cache[key] = value
    return value


def _fused_moment_dtype(group: dict[str, Any]) -> torch.dtype:
    """The dtype a fused group keeps its moments in (a group loaded from a state dict saved
    before `moment_dtype` existed has no entry: the default)."""
    dtype = group.get("moment_dtype")
    return _FUSED_MOMENT_DTYPE if dtype is None else dtype


def _check_moment_dtype(moment_dtype: object, *, fused: bool) -> None:
    """Raise unless `moment_dtype` is None or, with `fused`, a dtype the kernel keeps moments in."""
    from lmcore.kernels.adamw import MOMENT_DTYPES

    if moment_dtype is None:
        return
    if not fused:
        raise ValueError(
            "moment_dtype chooses the fused kernel's moments: pass fused=True, or leave it "
            "unset (the other paths keep the moments in each parameter's dtype, as torch's "
            "AdamW does)"
        )
    if moment_dtype not in MOMENT_DTYPES:
        raise ValueError(
            f"moment_dtype must be one of {[str(d) for d in MOMENT_DTYPES]} or None, got "
            f"{moment_dtype!r}"
        )


def _check_fused_params(params: list[torch.Tensor]) -> None:
    """Raise unless the fused kernel can update every parameter (the front door's check)."""
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    devices = sorted({str(p.device) for p in params})
    if len(devices) > 1:
        raise ValueError(
            f"fused AdamW updates a parameter group in one kernel launch on one device, and "
            f"this group's parameters are on {', '.join(devices)}: give each device's "
            "parameters a group of their own, or use fused=False"
        )
    for p in params:
        if p.dtype not in _FUSED_DTYPES:
            raise ValueError(
                f"fused AdamW updates float32, bfloat16 and float16 parameters, got {p.dtype}; "
                "use fused=False"
            )
        if not (p.is_cuda or (interpreted and p.device.type == "cpu")):
            raise ValueError(
                f"fused AdamW runs a Triton kernel and needs CUDA parameters, got one on "
                f"{p.device} (a CPU runs it only under TRITON_INTERPRET=1); use fused=False"
            )
        if not p.is_contiguous():
            raise ValueError(
                f"fused AdamW needs contiguous parameters, got strides {p.stride()}; make the "
                "parameter contiguous or use fused=False"
            )
