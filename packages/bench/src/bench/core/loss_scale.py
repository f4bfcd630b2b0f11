"""Dynamic loss scaling for fp16 training, the same on one process and across ranks.

fp16 has 5 exponent bits: gradients below about 6e-8 flush to zero and activations' gradients
above 65,504 overflow. `torch.amp.GradScaler` multiplies the loss by a scale before backward (so
small gradients stay representable), divides the gradients by it before the optimizer step, and
skips the step when any gradient is inf or NaN, halving the scale; after `growth_interval` clean
steps it doubles the scale again. `LossScaler` is that scaler with two additions:

- **Ranks agree.** Where gradients are sharded over ranks (ZeRO-1's optimizer over averaged
  gradients is fine, but `zero.FSDP` keeps each rank's shard of every gradient, and an overflow
  may land in one rank's shard only), a rank that skips alone would leave its shard of the
  weights behind the others'. Across ranks `unscale_` all-reduces the found-inf flags (their
  maximum) over the default process group, as torch's `ShardedGradScaler` does (FSDP2's DTensor
  gradients reduce their own flag too), so every rank skips the same steps and keeps the same
  scale. The collective is one float per step. (Not `ShardedGradScaler` itself: its flag has
  shape (1,), which torch's fused AdamW refuses on the CPU.)
- **Skipped steps are counted** (`skipped_steps`), and the scale is read once per step, after
  `update` (a host synchronisation, which `GradScaler.step` makes anyway to decide whether to
  step).

Use it as `torch.amp.GradScaler` is used, with `unscale_` called before clipping::

    scaler = LossScaler(device)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)        # every step, before clipping (see `unscale_`)
    clip_grad_norm(params, 1.0)
    scaler.step(optimizer)            # skipped where a gradient overflowed
    scaler.update()                   # halve or grow the scale; count a skipped step

`state_dict()` holds the scale, its growth tracker and the skipped steps, for checkpoints.
torch is imported when a scaler is made, not with the module: the command lines read the
defaults below before anything heavy is imported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["DEFAULT_GROWTH_INTERVAL", "DEFAULT_INIT_SCALE", "LossScaler"]

# torch.amp.GradScaler's own defaults: the first scale, and the clean steps between doublings.
DEFAULT_INIT_SCALE = 2.0**16
DEFAULT_GROWTH_INTERVAL = 2000


def _across_ranks() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


class LossScaler:
    """`torch.amp.GradScaler` whose ranks agree on every skip and which counts the steps it
    skipped; see the module docstring.

    Args:
        device: where the loss and gradients are (`cuda` or `cpu`; CPU autocast runs fp16 too).
        init_scale: the first scale.
        growth_interval: clean steps before the scale doubles.

    Attributes:
        skipped_steps: optimizer steps skipped for inf or NaN gradients since the run began
            (restored by `load_state_dict`).
    """

    def __init__(
        self,
        device: torch.device,
        *,
        init_scale: float = DEFAULT_INIT_SCALE,
        growth_interval: int = DEFAULT_GROWTH_INTERVAL,
    ) -> None:
        import torch

        if not init_scale > 0:
            raise ValueError(f"init_scale must be positive, got {init_scale}")
        self.scaler = torch.amp.GradScaler(
            device.type, init_scale=init_scale, growth_interval=growth_interval
        )
        self.across_ranks = _across_ranks()
        self.skipped_steps = 0
        self._scale = init_scale

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """`loss` times the current scale (backward from it gives scaled gradients)."""
        return self.scaler.scale(loss)

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide the gradients of `optimizer`'s parameters by the scale in place and find
        whether any is inf or NaN (on every rank, across ranks).

        Call it every step before `step`, after the gradients are synchronised: clipping needs
        the true gradients, and a fused optimizer that unscales inside its kernel would read
        an overflow flag that `step` alone does not reduce over the ranks.
        """
        self.scaler.unscale_(optimizer)
        if self.across_ranks:
            import torch.distributed as dist

            # the flags `step` and `update` read (one per device; GradScaler's own record)
            for found_inf in self.scaler._found_inf_per_device(optimizer).values():
                dist.all_reduce(found_inf, op=dist.ReduceOp.MAX)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """`optimizer.step()` unless `unscale_` found an inf or NaN gradient."""
        self.scaler.step(optimizer)

    def update(self) -> bool:
        """Halve the scale after an overflow, or grow it after `growth_interval` clean steps;
        return whether this step was skipped (and count it)."""
        self.scaler.update()
        scale = self.scaler.get_scale()
        skipped = scale < self._scale
        self._scale = scale
        self.skipped_steps += skipped
        return skipped

    def get_scale(self) -> float:
        """The scale the next step multiplies its loss by."""
        return self._scale

    def state_dict(self) -> dict[str, Any]:
        """The scale, its growth tracker and the steps skipped, for a checkpoint."""
        return {"scaler": self.scaler.state_dict(), "skipped_steps": self.skipped_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from `state_dict()`'s record."""
        self.scaler.load_state_dict(state["scaler"])
        self.skipped_steps = int(state["skipped_steps"])
        self._scale = float(state["scaler"]["scale"])
