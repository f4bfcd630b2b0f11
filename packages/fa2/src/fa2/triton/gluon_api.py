"""The Gluon names fa2's Hopper kernels use (`gluon_forward`, `gluon_backward`), imported once.

Gluon is Triton's lower-level, experimental dialect, and its API changes between releases: the
kernels are written against Triton 3.6's (`configs.gluon_triton`). With another Triton, a Triton
without Gluon or no Triton at all, `HAVE_GLUON` is False and every name here is None, so the
kernel modules import but define no kernels, and their callers run the Triton kernels.
"""

from __future__ import annotations

__all__ = [
    "HAVE_GLUON",
    "builtin",
    "fence_async_shared",
    "gl",
    "gluon",
    "ir",
    "mbarrier",
    "tma",
    "warpgroup_mma",
    "warpgroup_mma_wait",
]

try:
    from fa2.triton.configs import gluon_triton

    if not gluon_triton():  # another Triton's Gluon: not the API the kernels are written for
        raise ImportError("fa2's Gluon kernels are written for another Triton's Gluon")
    from triton._C.libtriton import ir
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language._core import builtin
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    HAVE_GLUON = True
except ImportError:  # pragma: no cover - depends on the installed Triton
    builtin = ir = gluon = gl = fence_async_shared = mbarrier = tma = warpgroup_mma = (
        warpgroup_mma_wait
    ) = None
    HAVE_GLUON = False
