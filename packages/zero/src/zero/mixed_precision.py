"""FSDP's mixed-precision policy: the dtypes weights are kept, computed, reduced and returned in.

torch's FSDP2 (`torch.distributed.fsdp.MixedPrecisionPolicy`) keeps the sharded parameters in the
module's own dtype and names the rest: `param_dtype` (gathered weights, the computation),
`reduce_dtype` (the gradient reduction), `output_dtype` (the module's outputs) and
`cast_forward_inputs`. `MixedPrecision` says the same with this project's names, and adds the
storage dtype, so that a float32 module can be kept in bf16 from the moment it is sharded:

==================  ======================  ===============================================
ours                FSDP2                   what it sets
==================  ======================  ===============================================
storage_dtype       (the module's dtype)    the shards, their gradients, the optimizer's view
compute_dtype       param_dtype             the all-gather and the gathered weights
reduce_dtype        reduce_dtype            the gradient reduce-scatter (and all-reduce)
output_dtype        output_dtype            the floating outputs of every unit
cast_forward_inputs cast_forward_inputs     floating inputs of every unit to compute_dtype
==================  ======================  ===============================================

Plain Python on top of torch dtypes: validated once here, resolved against the module's dtype by
`resolve`, read by `zero.FSDP`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

__all__ = ["COMPUTE_DTYPES", "STORAGE_DTYPES", "MixedPrecision"]

# Dtypes the shards may be kept in: float32 master weights, or bfloat16 (a model built in bf16,
# its gradients and an elementwise optimizer's state in bf16 too). Not float16: its 5 exponent
# bits leave gradients and small updates to underflow without a loss scale, which FSDP does not
# keep.
STORAGE_DTYPES = (torch.float32, torch.bfloat16)
# Dtypes the units may compute and communicate in.
COMPUTE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _check_dtype(name: str, dtype: object, allowed: tuple[torch.dtype, ...]) -> None:
    if dtype is not None and dtype not in allowed:
        raise ValueError(
            f"{name} must be one of {[str(d) for d in allowed]} or None, got {dtype!r}"
        )


@dataclass(frozen=True)
class MixedPrecision:
    """The dtypes FSDP keeps, computes, reduces and returns in (see the module docstring).

    Attributes:
        storage_dtype: the shards (`FSDP.parameters()`), their gradients, and so the state of an
            elementwise optimizer built on them: `torch.float32` (master weights) or
            `torch.bfloat16`. None (the default): the module's own dtype, which must then be
            one of those two. A float32 module with `storage_dtype=torch.bfloat16` is rounded
            once, as it is sharded.
        compute_dtype: the dtype the shards are cast to *before* the all-gather (half the bytes
            in bf16), so the units compute with weights of this dtype (FSDP2's `param_dtype`).
            None: the storage dtype.
        reduce_dtype: the dtype gradients are reduced in. None: the compute dtype (FSDP2's
            default); `torch.float32` sums in full precision at twice the bytes of bf16. The
            reduced gradient is then rounded to the storage dtype.
        output_dtype: every unit's floating-point outputs are cast to it. None: left as they
            are.
        cast_forward_inputs: when the compute dtype differs from the storage dtype, cast every
            unit's floating-point inputs to the compute dtype before its forward (as FSDP2
            does), so that a float32 input meets bf16 weights as bf16.

    Raises:
        ValueError: a dtype outside `STORAGE_DTYPES` (storage) or `COMPUTE_DTYPES` (the others).

    Example::

        >>> MixedPrecision(compute_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        >>> MixedPrecision(storage_dtype=torch.bfloat16)  # bf16 weights, grads and AdamW state
    """

    storage_dtype: torch.dtype | None = None
    compute_dtype: torch.dtype | None = None
    reduce_dtype: torch.dtype | None = None
    output_dtype: torch.dtype | None = None
    cast_forward_inputs: bool = True

    def __post_init__(self) -> None:
        _check_dtype("storage_dtype", self.storage_dtype, STORAGE_DTYPES)
        for name in ("compute_dtype", "reduce_dtype", "output_dtype"):
            _check_dtype(name, getattr(self, name), COMPUTE_DTYPES)
        if not isinstance(self.cast_forward_inputs, bool):
            raise TypeError(
                f"cast_forward_inputs must be True or False, got {self.cast_forward_inputs!r}"
            )

    def resolve(self, module_dtype: torch.dtype) -> MixedPrecision:
        """The policy with every default replaced by the dtype it stands for.

        Args:
            module_dtype: the dtype of the module's parameters (float32 for a module without).

        Raises:
            ValueError: no storage dtype is given and `module_dtype` is not one of
                `STORAGE_DTYPES`.
        """
        storage = module_dtype if self.storage_dtype is None else self.storage_dtype
        if storage not in STORAGE_DTYPES:
            raise ValueError(
                f"FSDP keeps its shards in {[str(d) for d in STORAGE_DTYPES]} but the module's "
                f"parameters are {module_dtype}: build it in float32 (master weights; pass "
                "compute_dtype=torch.bfloat16 or float16 to compute in a narrower dtype) or "
                "bfloat16, or pass MixedPrecision(storage_dtype=...) to convert it as it is "
                "sharded"
            )
        compute = storage if self.compute_dtype is None else self.compute_dtype
        reduce = compute if self.reduce_dtype is None else self.reduce_dtype
        return replace(self, storage_dtype=storage, compute_dtype=compute, reduce_dtype=reduce)
