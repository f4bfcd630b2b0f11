"""`comm_group`: a process group of its own for gradient communication, with NCCL's options for
communication that overlaps computation.

An NCCL collective is a kernel: each of its channels is one CTA that holds an SM for as long as
the collective runs. While a bucket's all-reduce overlaps backward, those SMs are taken from
backward's matrix multiplications, so the communication is hidden from the step's timeline but
still slows it. NCCL's per-communicator configuration (``ncclConfig_t``) bounds the CTAs
(``maxCTAs``, ``minCTAs``) or asks NCCL to use as few as keep its bandwidth (the CTA policy
``efficiency``, NCCL 2.27 and later), and torch can run NCCL on a high-priority stream. These
are properties of a communicator, so they need a group of their own: `comm_group` makes one
over the ranks of an existing group, to pass as a wrapper's ``process_group``. The default group
and everything else that uses it are left alone.

A new group is a collective call: every rank of the default group must make it, in the same
order (as for ``torch.distributed.new_group``).
"""

from __future__ import annotations

from typing import Literal

import torch.distributed as dist

__all__ = ["CTA_POLICIES", "CtaPolicy", "comm_group"]

CtaPolicy = Literal["default", "efficiency"]
# NCCL_CTA_POLICY_DEFAULT and _EFFICIENCY of nccl.h (NCCL 2.27 and later): `default` tunes for
# bandwidth, `efficiency` uses the fewest CTAs that keep bandwidth "decent" (NCCL's words).
CTA_POLICIES: dict[str, int] = {"default": 0, "efficiency": 1}


def _check_ctas(name: str, value: object) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{name} must be a positive number of CTAs or None, got {value!r}")


def comm_group(
    *,
    process_group: dist.ProcessGroup | None = None,
    max_ctas: int | None = None,
    min_ctas: int | None = None,
    cta_policy: CtaPolicy | None = None,
    high_priority_stream: bool = False,
) -> dist.ProcessGroup:
    """A new process group over the ranks of `process_group`, for a wrapper's communication.

    Every option left at its default keeps NCCL's (and torch's) choice.

    Args:
        process_group: the group whose ranks and backend the new group takes; the default
            group if `None`.
        max_ctas: at most this many CTAs (SMs) per NCCL kernel (``ncclConfig_t.maxCTAs``; the
            environment's ``NCCL_MAX_CTAS`` for this communicator only). Fewer CTAs leave more
            SMs to the computation that runs alongside and carry fewer bytes per second.
        min_ctas: at least this many (``ncclConfig_t.minCTAs``).
        cta_policy: ``"efficiency"`` lets NCCL choose the fewest CTAs that keep most of its
            bandwidth; ``"default"`` tunes for bandwidth alone.
        high_priority_stream: run this group's NCCL kernels on a high-priority CUDA stream,
            so their CTAs are scheduled before the compute stream's waiting ones.

    Returns:
        The new group: pass it as ``process_group=`` to any wrapper.

    Raises:
        ValueError: a CTA count is not a positive integer, `min_ctas` exceeds `max_ctas`,
            `cta_policy` is not one of `CTA_POLICIES`, or an NCCL option was given for a group
            of another backend.
        RuntimeError: the default process group is not initialised.

    Example::

        >>> group = comm_group(max_ctas=8)  # on every rank
        >>> model = DDPBucketed(MyModel().to(device), bucket_size_mb=100, process_group=group)
    """
    _check_ctas("max_ctas", max_ctas)
    _check_ctas("min_ctas", min_ctas)
    if max_ctas is not None and min_ctas is not None and min_ctas > max_ctas:
        raise ValueError(f"min_ctas ({min_ctas}) must not exceed max_ctas ({max_ctas})")
    if cta_policy is not None and cta_policy not in CTA_POLICIES:
        raise ValueError(f"cta_policy must be one of {tuple(CTA_POLICIES)}, got {cta_policy!r}")
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            "the default process group is not initialised: call "
            "torch.distributed.init_process_group(...) on every rank first"
        )
    base = dist.group.WORLD if process_group is None else process_group
    backend = dist.get_backend(base)
    ranks = dist.get_process_group_ranks(base)
    nccl_options = {
        "max_ctas": max_ctas,
        "min_ctas": min_ctas,
        "cta_policy": cta_policy,
        "high_priority_stream": high_priority_stream or None,
    }
    given = [name for name, value in nccl_options.items() if value is not None]
    if backend != "nccl":
        if given:
            raise ValueError(
                f"{', '.join(given)} configure NCCL communicators, but the group's backend is "
                f"{backend}: leave them out, or build the group on nccl"
            )
        return dist.new_group(ranks, backend=backend)
    options = dist.ProcessGroupNCCL.Options(is_high_priority_stream=high_priority_stream)
    if max_ctas is not None:
        options.config.max_ctas = max_ctas
    if min_ctas is not None:
        options.config.min_ctas = min_ctas
    if cta_policy is not None:
        options.config.cta_policy = CTA_POLICIES[cta_policy]
    return dist.new_group(ranks, backend="nccl", pg_options=options)
