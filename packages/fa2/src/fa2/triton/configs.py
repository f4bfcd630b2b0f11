"""Tile sizes for the kernels, and the small host-side decisions around a launch.

Each kernel has a short list of tiles (block sizes, warps, pipeline stages) per head-dim block
and dtype width. The first entry of each list is the default: the fastest in a sweep on an H100
at the CS336 leaderboard shapes (see docs/design/fa2.md); GPUs before Hopper read tables of
their own by compute capability (`fa2.triton.pre_hopper`, compiled for those GPUs but not
timed). The default is what runs unless FA2_AUTOTUNE=1,
which times the whole list once per shape class and keeps the fastest. The default path is
deterministic, costs no tuning time on the first call and adds nothing to the launch. Under
Triton's CPU interpreter a small tile is used, smaller than the test shapes, so that the
masked, ragged and diagonal code paths all run.

Five environment variables choose among the candidates, read here and nowhere else (see
`tile_settings`; a launch plan is built for each combination of their values, so a process
may compare candidates by changing them between calls):

- FA2_AUTOTUNE=1: time every listed tile once per shape class and keep the fastest, except the
  warp-specialised ("+WS") ones, which only FA2_TILES launches (`WS_WARNING`).
- FA2_TILES="kernel=tile,...": launch these listed candidates instead of the defaults, e.g.
  `FA2_TILES="forward=128x64/4w/2s+TMA+WS,dkdv=32x128/4w/2s+TMA+WS"`. Kernels: forward, dq,
  dkdv, single-pass (naming it also lets a `deterministic=False` call of any dtype take the
  single pass); tiles as `Tile.__str__` writes them. A tile that the call's list does not
  hold raises, naming the candidates; a "+WS" tile warns (`WS_WARNING`).
- FA2_L2_GROUP: the launch order of the backward passes (`l2_group`): unset or 1, each
  (batch, head)'s tiles in turn; "auto" or a number, heads taken in groups whose inputs fit
  in L2 together.
- FA2_GLUON_FORWARD: the hand warp-specialised Gluon forward (`fa2.triton.gluon_forward`)
  in place of the Triton one. Unset ("auto"), it runs where it measured faster: sm_90, bf16 or
  fp16, sequences of at least `GLUON_FORWARD_MIN_SEQ` tokens at the head dim, a call it takes
  (d 64 or 128, no grouped heads, window, softcap, packed sequences or bottom-right diagonal,
  TMA-aligned strides, static shapes), silently falling back otherwise. 1 forces it (FA3's
  intra-warpgroup overlap) wherever a call allows it, warning why (once per reason) where
  not; "pingpong" adds FA3's inter-warpgroup ping-pong, "plain" runs it with neither, to
  measure what each buys; "persistent" runs it over a grid of one program per
  multiprocessor, each taking several 128-row tiles, where the rows allow
  (`gluon_forward.persistent_refusal`), as the default does for sequences of at most
  `GLUON_PERSISTENT_MAX_SEQ` tokens; 0 never runs it. Under torch.compile it runs as the
  opaque op `fa2::gluon_forward` (Inductor launches Triton kernels, not Gluon ones).
- FA2_BACKWARD: which backward runs for 16-bit inputs. Unset ("auto"), the hand
  warp-specialised Gluon single pass for Hopper (`fa2.triton.gluon_backward`) where it
  measured faster than the Triton kernels (`gluon_backward_default`: sm_90, bf16 or fp16, head
  dim 128, or 64 from 8,192 tokens with 128 queries a step; a call it takes: one key/value
  head per query head, no window, softcap, packed
  sequences or bottom-right diagonal, TMA-aligned strides, static shapes, no FA2_TILES naming
  a backward kernel), silently falling back otherwise; in the order the call asks for
  (`deterministic=True`, the default: dQ's additions in a fixed order, the same bits every
  run; False: as they come, a little faster). "triton": fa2's Triton kernels always (two
  passes, or the single pass `single_pass_backward` chooses). "gluon": the Gluon single pass
  wherever a call allows it (head dim 64 too), warning why (once per reason) where not. Under
  torch.compile it runs as the opaque op `fa2::gluon_backward`.
"""

from __future__ import annotations

import functools
import math
import os
import re
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from fa2.masks import Band

__all__ = [
    "BACKWARD_FORMS",
    "DKDV",
    "DKDV_ATOMIC",
    "DQ",
    "FORWARD",
    "GLUON_BACKWARD_BLOCK_M",
    "GLUON_BACKWARD_MIN_SEQ",
    "GLUON_FORWARD_MIN_SEQ",
    "GLUON_PERSISTENT_MAX_SEQ",
    "GLUON_TRITON",
    "INTERPRET",
    "KERNELS",
    "L2_BUDGET",
    "LOG2E",
    "PRECISIONS",
    "SHORT_SEQ",
    "WS_WARNING",
    "Tile",
    "autotuning",
    "backward_form",
    "block_d",
    "by_head_dim",
    "cdiv",
    "choose_tile",
    "delta_rows",
    "device_capability",
    "dot_precision",
    "forced_tile",
    "gluon_backward_block_m",
    "gluon_backward_default",
    "gluon_default_possible",
    "gluon_forward_default",
    "gluon_forward_min_seq",
    "gluon_forward_requested",
    "gluon_persistent_default",
    "gluon_triton",
    "head_counts",
    "kernel_meta",
    "kernel_scales",
    "known_true",
    "l2_group",
    "seq_bucket",
    "single_pass_backward",
    "symbolic_shapes_refusal",
    "tile_settings",
    "timings",
    "upcast",
]

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
LOG2E = 1.4426950408889634  # exp(x) = exp2(x * log2(e)): the kernels use the faster exp2


_SETTINGS = ("FA2_AUTOTUNE", "FA2_TILES", "FA2_L2_GROUP", "FA2_GLUON_FORWARD", "FA2_BACKWARD")


def tile_settings() -> tuple[str | None, ...]:
    """The environment variables that choose tiles and launch orders (module docstring), as
    set now: part of every launch plan's key."""
    return tuple(os.environ.get(name) for name in _SETTINGS)


# fa2's Gluon kernels (`gluon_forward`, `gluon_backward`) are written against Triton 3.6's Gluon,
# an experimental dialect whose API changes between releases (Triton 3.9's lacks names they use,
# such as `gl.thread_barrier`): with another Triton, every call runs the Triton kernels.
GLUON_TRITON = (3, 6)


def gluon_triton() -> bool:
    """Whether the installed Triton is the one fa2's Gluon kernels are written for
    (`GLUON_TRITON`)."""
    import triton

    return tuple(int(part) for part in re.findall(r"\d+", triton.__version__)[:2]) == GLUON_TRITON


def gluon_forward_requested() -> str | None:
    """The Gluon forward FA2_GLUON_FORWARD asks for (module docstring): "auto" (unset),
    "overlap" (1), "pingpong", "plain", "persistent", or None (0)."""
    text = os.environ.get("FA2_GLUON_FORWARD", "").strip().lower()
    if text in ("", "auto"):
        return "auto"
    if text == "0":
        return None
    if text not in ("1", "pingpong", "plain", "persistent"):
        raise ValueError(
            'FA2_GLUON_FORWARD must be unset, 0, 1, "pingpong", "plain" or "persistent", got '
            f"{text!r}"
        )
    return "overlap" if text == "1" else text


def gluon_forward_default(head_dim: int, seq_len: Any) -> bool:
    """Whether FA2_GLUON_FORWARD unset ("auto") asks for the Gluon forward at `head_dim` and
    `seq_len` (the longer of the query and key lengths): where it measured faster
    (GLUON_FORWARD_MIN_SEQ). A traced symbolic length takes it only where it is known to."""
    least = gluon_forward_min_seq(head_dim)
    return least is not None and known_true(seq_len >= least)


def gluon_persistent_default(seq_len: Any) -> bool:
    """Whether the default Gluon forward (FA2_GLUON_FORWARD unset) runs in the persistent grid
    at `seq_len` (GLUON_PERSISTENT_MAX_SEQ), where the call's rows allow it."""
    return known_true(seq_len <= GLUON_PERSISTENT_MAX_SEQ)


def gluon_forward_min_seq(head_dim: Any) -> int | None:
    """The shortest sequence FA2_GLUON_FORWARD unset gives the Gluon forward at `head_dim`
    (GLUON_FORWARD_MIN_SEQ), or None (`by_head_dim`)."""
    return by_head_dim(GLUON_FORWARD_MIN_SEQ, head_dim)


def by_head_dim(table: dict[int, int], head_dim: Any) -> int | None:
    """`table`'s entry at `head_dim`, or None. A head dim traced as a symbol (torch.compile
    with `dynamic=True`) takes an entry only where it is known to equal its key (no guard)."""
    if isinstance(head_dim, int):
        return table.get(head_dim)
    return next((n for d, n in table.items() if known_true(head_dim == d)), None)


def gluon_default_possible(table: dict[int, int], head_dim: Any) -> bool:
    """Whether a Gluon default's `table` (GLUON_FORWARD_MIN_SEQ, GLUON_BACKWARD_MIN_SEQ) might
    take a call at `head_dim`: a head dim it lists, or one traced as a symbol. Where such a
    call was not given the Gluon kernel, symbolic sizes may be why (`symbolic_shapes_refusal`)."""
    return not isinstance(head_dim, int) or head_dim in table


def autotuning() -> bool:
    """FA2_AUTOTUNE=1 times every listed tile once per shape class instead of the default."""
    return os.environ.get("FA2_AUTOTUNE", "0") == "1"


# Host-side arithmetic in plain Python: triton.cdiv and triton.next_power_of_2 are constexpr
# functions whose calls cost microseconds each, which add up on the launch path.
def cdiv(a: int, b: int) -> int:
    """Ceiling division."""
    return -(-a // b)


def _next_power_of_2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def block_d(head_dim: int) -> int:
    """Head dim padded to a power of two of at least 16 (the smallest K of a tensor-core dot)."""
    return max(16, _next_power_of_2(head_dim))


def seq_bucket(n_q: int, n_k: int) -> int:
    """Autotuning key for the sequence length: tuned once per power of two, from 128 to 16384."""
    return min(max(_next_power_of_2(max(n_q, n_k)), 128), 16384)


def upcast(dtype: torch.dtype) -> bool:
    """Triton 3.6's interpreter computes 16-bit `tl.dot` wrongly: upcast there, and only there."""
    return INTERPRET and dtype != torch.float32


PRECISIONS = ("tf32x3", "ieee", "tf32")


def dot_precision(dtype: torch.dtype, precision: str | None = None) -> str:
    """How fp32 inputs are multiplied: `precision` if given, else "tf32" where the user allowed
    TF32 matmuls in torch (`torch.backends.cuda.matmul.allow_tf32`), else "tf32x3".

    "tf32x3" splits each fp32 operand into a TF32 high part and a TF32 remainder and sums three
    tensor-core products (as cuBLAS/CUTLASS 3xTF32 do): about fp32's accuracy at tensor-core
    speed. "ieee" is exact fp32 FMA on the CUDA cores; "tf32" one TF32 product (10-bit
    mantissa). 16-bit inputs always multiply on the tensor cores and ignore this ("tf32")."""
    if precision is not None and precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if dtype != torch.float32:
        return "tf32"
    if precision is not None:
        return precision
    return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "tf32x3"


def head_counts(q: torch.Tensor, k: torch.Tensor) -> tuple[int, int]:
    """(query heads, query heads per key/value head) of `(..., heads, n, d)` tensors."""
    heads = q.shape[-3] if q.dim() >= 3 else 1
    return heads, heads // (k.shape[-3] if k.dim() >= 3 else 1)


def kernel_meta(
    head_dim: int,
    dtype: torch.dtype,
    precision: str,
    band: Band,
    *,
    softcap: float,
    varlen: bool,
    same_lengths: bool,
) -> dict[str, object]:
    """The constexpr arguments the attention kernels take, fixed by the head dim, dtype, dot
    precision (see `dot_precision`), the band of visible keys (`fa2.masks`), the softcap,
    packed sequences, and whether each sequence has as many queries as keys (then the
    bottom-right diagonal is the top-left one, and the plainer code runs).

    Window sizes are constexprs: a model uses one or two, and the plain causal call (a window
    of 0 to the right) then compiles to the same code as before windows existed."""
    return dict(
        HEAD_DIM=head_dim,
        BLOCK_D=block_d(head_dim),
        IS_CAUSAL=band.right >= 0,
        LOCAL=band.left >= 0,
        WIN_LEFT=max(band.left, 0),
        WIN_RIGHT=max(band.right, 0),
        BOTTOM_RIGHT=band.bottom_right and not same_lengths,
        VARLEN=varlen,
        SOFTCAP=softcap > 0,
        UPCAST=upcast(dtype),
        PRECISION=precision,
    )


def kernel_scales(scale: float, softcap: float) -> tuple[float, float]:
    """(qk_scale, cap_scale), the kernels' float arguments: exponents are exp2(s * qk_scale - m)
    of raw scores s, or with a softcap of the capped ones tanh(s * cap_scale), where
    cap_scale = scale / softcap and qk_scale carries the cap instead of the scale."""
    if softcap:
        return softcap * LOG2E, scale / softcap
    return scale * LOG2E, 0.0


class Tile(NamedTuple):
    """One launch configuration: a program's tile and how the compiler pipelines it."""

    block_m: int  # query rows per tile
    block_n: int  # key rows per tile
    warps: int
    stages: int
    # Read the tiles of the inner loop through TMA descriptors (Hopper's copy unit) where the
    # device and the layout allow (`fa2.triton.launch.tma_layouts`); plain loads elsewhere.
    tma: bool = False
    # Warp-specialised (needs `tma`; see "Warp specialisation" below): one inner loop over
    # every tile, each masked, which Triton splits into a TMA producer warp and two consumer
    # warpgroups. A call that cannot take it gets the list's default (`choose_tile`); a
    # misaligned tensor, the same block sizes in the plain kernel (as `tma` tiles do).
    ws: bool = False

    def __str__(self) -> str:
        """As the sweeps and FA2_TILES write it: "128x64/4w/2s+TMA+WS"."""
        flags = "".join(f"+{name.upper()}" for name in ("tma", "ws") if getattr(self, name))
        return f"{self.block_m}x{self.block_n}/{self.warps}w/{self.stages}s{flags}"

    @classmethod
    def parse(cls, text: str) -> Tile:
        """The tile `str(tile)` wrote (flags in any case and order)."""
        match = re.fullmatch(r"(\d+)x(\d+)/(\d+)w/(\d+)s((?:\+\w+)*)", text.strip())
        flags = match and match.group(5).lower().split("+")[1:]
        if not match or not set(flags) <= {"tma", "ws"}:
            raise ValueError(
                f"a tile is written like 128x64/4w/2s, optionally +TMA and +WS; got {text!r}"
            )
        sizes = (int(match.group(i)) for i in range(1, 5))
        return cls(*sizes, tma="tma" in flags, ws="ws" in flags)


# Candidates by (head-dim block, 16-bit or fp32 and its dot precision); the first is the default,
# chosen by the H100 sweeps logged in docs/design/fa2.md ("Tile sweeps"), one line of reason per
# default here. ms are causal fwd or per-kernel medians at the shape named; "+TMA" reads the
# inner loop through TMA descriptors. Tile rules (`tl.static_assert` in the kernels): forward
# and dQ need block_m % block_n == 0, dK/dV block_n % block_m == 0, so that the causal diagonal
# starts on a tile boundary. The interpreter's tiles are smaller than the test shapes and not
# square, so tests cover several tiles, ragged edges and the diagonal.
# Sequences of at most SHORT_SEQ tokens take a table's `_short` list where it has one: a short
# loop's fixed costs weigh more there, and a smaller tile, two programs to a multiprocessor,
# hides them (d = 128 forward: 0.335 against 0.372 ms at (4, 32, 2048)).
#
# Warp specialisation ("+WS" tiles; candidates that nothing chooses by default, found wrong on
# an H200 with Triton 3.6 before the workaround in `tiles.load_rows`: see WS_WARNING). For
# sm_90 Triton 3.6 splits a loop written `tl.range(..., warp_specialize=True)` into one TMA
# producer warp and two consumer warpgroups, each taking half of the tile's 128 rows (FA3's
# layout), when: the kernel has 4 warps (with 8 it silently does not specialise); the loop is
# the kernel's only one (a second loop after it crashes the pass, so causal and ragged tiles
# are masked inside it); and every tile its matmuls read comes through a TMA descriptor, the
# program's own rows (q; k and v) too (a plain load there crashes it); and the kernel does not
# return early (packed sequences' tiles past their end idle instead). The forward splits its
# 128 query rows, dK/dV its 128 keys. dK/dV with grouped heads (the loop over the query heads
# around the specialised one, unrolled or not), dQ (its row vectors L and D along the split
# rows) and the single pass (dQ summed over the split keys) do not compile specialised: they
# take the plain kernels. Compiled for sm_90 on a CPU: docs/design/fa2.md, "Warp
# specialisation on Hopper".
SHORT_SEQ = 4096

# The shortest sequences the Gluon forward takes by default, by head dim (`gluon_forward_default`):
# where it measured faster than the Triton forward on H200s. d = 128: from 2,048 tokens, faster at
# (4, 32, 2048, 128) in both screens that forced it (0.333 against 0.352 ms,
# fa2_hopper_screen_h200_2026-11-28_gluon; 0.334 against 0.346,
# fa2_hopper_screen_h200_2026-11-28_gluonfwd) and at every longer shape; shorter d = 128 sequences
# are untimed. d = 64: past SHORT_SEQ only, slower at and below it (0.411 against 0.370 ms at
# (4, 16, 4096, 64), 0.164 against 0.094 at (32, 16, 512, 64), the same _gluonfwd screen).
GLUON_FORWARD_MIN_SEQ = {64: SHORT_SEQ + 1, 128: 2048}
# The longest sequences whose default Gluon forward runs in the persistent grid (one program
# per multiprocessor taking several 128-row tiles: `gluon_forward.persistent_refusal` says
# which calls it takes). Measured on an H200: at (4, 32, 2048, 128) 0.305 against 0.353 ms for
# the one-tile-a-program grid; slower from 16,384 tokens (2.066 against 1.865 ms at
# (1, 16, 16384, 128), 29.68 against 28.37 at (2, 32, 32768, 128)), where a program's few
# long items balance worse than the hardware's scheduling of one-tile programs
# (fa2_hopper_screen_h200_2026-11-29_persistent); lengths between are untimed.
GLUON_PERSISTENT_MAX_SEQ = 2048
FORWARD = {
    # the second tile runs the warp-specialised kernel's loop (tests force it)
    "interpreter": [Tile(32, 16, 1, 1), Tile(32, 16, 1, 1, tma=True, ws=True)],
    # 1.33 ms at (16, 16384, 64) (64x64/4w/3s 1.44); TMA slower here (1.263 -> 1.279)
    "16bit_d64": [
        Tile(128, 64, 8, 4),
        Tile(128, 64, 8, 3),
        Tile(64, 64, 4, 3),
        Tile(128, 64, 4, 3),
        Tile(128, 64, 4, 2, tma=True, ws=True),
        Tile(128, 64, 4, 3, tma=True, ws=True),
        Tile(128, 128, 4, 2, tma=True, ws=True),
    ],
    # 1.992 ms at (16, 16384, 128) (3 stages 2.005, 64x64/4w/3s+TMA 2.099)
    "16bit_d128": [
        Tile(128, 64, 8, 4, tma=True),
        Tile(128, 64, 8, 3, tma=True),
        Tile(128, 64, 8, 3),
        Tile(64, 64, 4, 3, tma=True),
        Tile(128, 64, 4, 2, tma=True, ws=True),
        Tile(128, 64, 4, 3, tma=True, ws=True),
        Tile(128, 128, 4, 2, tma=True, ws=True),
    ],
    # 0.335 ms at (4, 32, 2048, 128) (128x64/8w/3s+TMA 0.372), 0.589 at 4096 (0.628)
    "16bit_d128_short": [
        Tile(64, 64, 4, 3, tma=True),
        Tile(128, 64, 8, 3, tma=True),
        Tile(128, 64, 4, 2, tma=True, ws=True),
    ],
    "16bit_d256": [Tile(64, 32, 4, 2), Tile(64, 64, 8, 2)],  # untimed
    # exact fp32 ("ieee") at (4, 8192, 64): 2.95 ms (64x32/4w/2s 4.98)
    "32bit_d64": [Tile(64, 64, 8, 2), Tile(32, 32, 4, 2), Tile(64, 32, 4, 2)],
    "32bit_d128": [Tile(32, 32, 4, 2), Tile(64, 32, 8, 2)],  # 7.42 ms at (4, 8192, 128)
    "32bit_d256": [Tile(32, 32, 4, 2), Tile(64, 32, 4, 1)],  # untimed
    # tf32x3 at (8, 4096, 64): 0.528 ms (64x64/4w/2s 0.552)
    "tf32_d64": [
        Tile(128, 64, 8, 2),
        Tile(64, 64, 4, 2),
        Tile(64, 32, 4, 3),
        Tile(128, 64, 8, 2, tma=True),
    ],
    # tf32x3 at (4, 8192, 128): 1.530 ms with TMA, which spills no register (plain 1.650)
    "tf32_d128": [
        Tile(32, 32, 4, 3, tma=True),
        Tile(32, 32, 4, 2),
        Tile(32, 32, 4, 2, tma=True),
    ],
    "tf32_d256": [Tile(32, 32, 4, 2), Tile(64, 32, 4, 1)],  # untimed
}
DKDV = {
    # the second tile runs the warp-specialised kernel's loop (tests force it)
    "interpreter": [Tile(16, 32, 1, 1), Tile(16, 32, 1, 1, tma=True, ws=True)],
    # 2.05 ms at (16, 16384, 64) (64x64/4w/4s 2.19, 32x64/4w/4s 2.29); TMA about equal
    "16bit_d64": [
        Tile(64, 64, 4, 3),
        Tile(64, 64, 4, 4),
        Tile(32, 64, 4, 4),
        Tile(64, 64, 4, 3, tma=True),
        Tile(64, 128, 4, 2, tma=True, ws=True),
        Tile(32, 128, 4, 2, tma=True, ws=True),
    ],
    # 3.649 ms at (16, 16384, 128), no spills (64x64/4w/2s, which spills, 3.754)
    "16bit_d128": [
        Tile(32, 64, 4, 3, tma=True),
        Tile(64, 64, 4, 2),
        Tile(32, 64, 4, 3),
        Tile(32, 128, 4, 2, tma=True, ws=True),
        Tile(32, 128, 4, 3, tma=True, ws=True),
    ],
    # the whole backward 0.04-0.06 ms faster at (4, 32, 2048, 128) than with 32x64/4w/3s
    "16bit_d128_short": [
        Tile(64, 64, 4, 2),
        Tile(32, 64, 4, 3),
        Tile(32, 64, 4, 3, tma=True),
        Tile(32, 128, 4, 2, tma=True, ws=True),
    ],
    "16bit_d256": [Tile(16, 64, 4, 2), Tile(32, 64, 8, 1)],  # untimed
    # exact fp32 at (4, 8192, 64): 5.82 ms (32x64/4w/2s 9.77)
    "32bit_d64": [Tile(32, 32, 4, 2), Tile(32, 64, 8, 2), Tile(32, 64, 4, 2)],
    "32bit_d128": [Tile(32, 32, 4, 2), Tile(32, 64, 8, 2)],  # 12.4 ms (16x32 20.7)
    "32bit_d256": [Tile(16, 32, 4, 2), Tile(32, 32, 4, 1)],  # untimed
    # the TMA tile spills at d <= 32: the batch-1 fp32 sweep's backward 3-8% slower with it
    "tf32_d32": [Tile(32, 32, 4, 2), Tile(32, 32, 4, 2, tma=True)],
    # tf32x3 at (8, 4096, 64): 0.905 ms with TMA (plain 1.053)
    "tf32_d64": [
        Tile(32, 32, 4, 2, tma=True),
        Tile(32, 32, 4, 2),
        Tile(32, 64, 4, 2),
        Tile(64, 64, 4, 2),
    ],
    # tf32x3 at (4, 8192, 128): 2.942 ms with TMA (plain 3.556)
    "tf32_d128": [
        Tile(32, 32, 4, 2, tma=True),
        Tile(32, 32, 4, 2),
        Tile(32, 32, 8, 2, tma=True),
    ],
    "tf32_d256": [Tile(16, 32, 4, 2), Tile(32, 32, 4, 1)],  # untimed
}
DQ = {
    # the second tile, as many keys as queries, stands for the 128x128 candidates
    "interpreter": [Tile(32, 16, 1, 1), Tile(32, 32, 1, 1)],
    # TMA: 1.384 ms at (16, 16384, 64) (plain 1.431)
    "16bit_d64": [
        Tile(128, 64, 8, 3, tma=True),
        Tile(128, 64, 8, 3),
        Tile(64, 64, 4, 3),
        Tile(128, 64, 4, 3),
        Tile(128, 128, 8, 2, tma=True),
        Tile(128, 128, 8, 3, tma=True),
    ],
    # 2.405 ms at (16, 16384, 128) (with TMA 2.579)
    "16bit_d128": [
        Tile(128, 64, 8, 3),
        Tile(64, 64, 4, 2, tma=True),
        Tile(64, 32, 4, 3, tma=True),
        Tile(128, 128, 8, 2, tma=True),
        Tile(128, 128, 8, 2),
    ],
    "16bit_d256": [Tile(64, 16, 4, 2), Tile(64, 32, 8, 1)],  # untimed
    # exact fp32 at (4, 8192, 64): 5.16 ms (64x32/4w/2s 7.78)
    "32bit_d64": [Tile(64, 64, 8, 2), Tile(32, 32, 4, 2), Tile(64, 32, 4, 2)],
    "32bit_d128": [Tile(32, 32, 4, 2), Tile(64, 32, 8, 2)],  # 11.5 ms (32x16 24.2)
    "32bit_d256": [Tile(32, 16, 4, 2), Tile(32, 32, 4, 1)],  # untimed
    # tf32x3 at (8, 4096, 64): 0.673 ms (64x64/4w/2s 0.739)
    "tf32_d64": [
        Tile(128, 64, 8, 2),
        Tile(64, 64, 4, 2),
        Tile(64, 32, 4, 2),
        Tile(128, 64, 8, 2, tma=True),
    ],
    # tf32x3 at (4, 8192, 128): 2.362 ms with TMA (plain 2.407)
    "tf32_d128": [Tile(32, 32, 4, 2, tma=True), Tile(32, 32, 4, 2), Tile(32, 16, 4, 2, tma=True)],
    "tf32_d256": [Tile(32, 16, 4, 2), Tile(32, 32, 4, 1)],  # untimed
}

# The single-pass backward (dK/dV with dQ added atomically; `deterministic=False`). Same
# constraint as DKDV (block_n % block_m == 0). Candidates chosen to compile without spilling
# registers for sm_90 (ptxas), before the H100 sweep.
DKDV_ATOMIC = {
    "interpreter": [Tile(16, 32, 1, 1)],
    "16bit_d64": [
        Tile(64, 128, 8, 3),
        Tile(64, 64, 4, 3),
        Tile(32, 128, 8, 2),
        Tile(64, 128, 8, 2),
        Tile(32, 64, 4, 2),
    ],
    "16bit_d128": [
        Tile(32, 128, 8, 2),
        Tile(32, 64, 8, 2),
        Tile(16, 128, 8, 2),
        Tile(32, 128, 8, 3),
    ],
    "16bit_d256": [Tile(16, 64, 4, 2), Tile(32, 64, 8, 1)],
    "32bit_d64": [Tile(32, 32, 4, 2), Tile(32, 64, 8, 2), Tile(16, 32, 4, 2), Tile(16, 64, 4, 2)],
    "32bit_d128": [Tile(32, 32, 4, 2), Tile(16, 32, 4, 2), Tile(32, 64, 8, 2), Tile(16, 64, 4, 2)],
    "32bit_d256": [Tile(16, 32, 4, 2), Tile(32, 32, 4, 1)],
    "tf32_d64": [
        Tile(32, 32, 4, 2),
        Tile(16, 32, 4, 2),
        Tile(32, 32, 8, 2),
        Tile(16, 64, 4, 2),
        Tile(32, 32, 4, 3),
    ],
    "tf32_d128": [
        Tile(32, 32, 4, 2, tma=True),
        Tile(32, 32, 4, 2),
        Tile(16, 32, 8, 2),
        Tile(32, 32, 8, 2),
    ],
    "tf32_d256": [Tile(16, 32, 4, 2), Tile(32, 32, 4, 1)],
}


# What forcing a "+WS" tile says (FA2_TILES), once per kernel and tile in a process.
WS_WARNING = (
    "FA2_TILES forces the warp-specialised {kernel} tile {tile}. Triton 3.6's Hopper warp "
    "specialisation offsets the second consumer warpgroup's rows twice (docs/design/fa2.md, "
    "'Warp specialisation on Hopper'); fa2 works around it, and an H200 confirmed the 2-stage "
    "forward and dK/dV tiles right (docs/results/fa2_ws_diagnose_h200_2026-11-28.md), but a "
    "3-stage stand-in still lost rows there, and every such tile measured slower than the "
    "defaults: run packages/fa2/scripts/ws_diagnose.py on your GPU before training with one."
)
_warned: set[tuple[str, Tile]] = set()


def _warn_ws(kernel: str, tile: Tile) -> None:
    if (kernel, tile) not in _warned:
        _warned.add((kernel, tile))
        warnings.warn(WS_WARNING.format(kernel=kernel, tile=tile), UserWarning, stacklevel=4)


# The tables by the kernel names FA2_TILES uses.
KERNELS = {"forward": FORWARD, "dq": DQ, "dkdv": DKDV, "single-pass": DKDV_ATOMIC}


def single_pass_backward(dtype: torch.dtype) -> bool:
    """Whether a backward allowed to be nondeterministic takes the single-pass form. Measured
    on an H100: faster for fp32 inputs, whose every matmul is three tensor-core products
    under "tf32x3" (so the two matmuls it saves weigh more than its atomic additions), slower
    for 16-bit ones (docs/results/fa2_single_pass_h100_2026-11-23.md). Any dtype where
    FA2_TILES names a single-pass tile."""
    return dtype == torch.float32 or forced_tile("single-pass") is not None


BACKWARD_FORMS = ("auto", "triton", "gluon")
# Where FA2_BACKWARD unset takes the Gluon backward, deterministic (its ordered form): the
# shortest sequence at each head dim from which it measured no slower than the Triton
# backward's two passes on H200s, and the query tile it takes there.
# - d = 128, 64 queries a step, every length (docs/results/fa2_gluon_bwd_variants_h200_2026-11-28
#   .md and _final.md, two runs on two hosts): 0.885x and 0.980x the two passes' time at the
#   leaderboard's shape, 0.93x and 1.00x at (1, 16, 16384, 128), 0.96x in both at
#   (4, 32, 2048, 128).
# - d = 64, 128 queries a step (FA3's tile at that head dim), from 8,192 tokens
#   (fa2_gluon_bwd_variants_h200_2026-11-28_d64): 0.96x at (1, 16, 16384, 64) (0.97x in
#   fa2_gluon_bwd_variants_h200_2026-11-28_m128), 0.98x at (2, 16, 8192, 64); 1.02x at
#   (4, 16, 4096, 64) and slower below, where the two passes stay. At 64 queries a step the
#   single pass was slower than the two passes at every length.
GLUON_BACKWARD_MIN_SEQ = {128: 0, 64: 8192}
GLUON_BACKWARD_BLOCK_M = {128: 64, 64: 128}


def backward_form() -> str:
    """The form FA2_BACKWARD names (module docstring), one of BACKWARD_FORMS."""
    text = os.environ.get("FA2_BACKWARD", "").strip().lower() or "auto"
    if text not in BACKWARD_FORMS:
        raise ValueError(f"FA2_BACKWARD must be one of {', '.join(BACKWARD_FORMS)}, got {text!r}")
    return text


def gluon_backward_default(head_dim: Any, seq_len: Any) -> bool:
    """Whether FA2_BACKWARD unset ("auto") asks for the Gluon backward at `head_dim` and
    `seq_len` (the longer of the query and key lengths): where it measured faster
    (GLUON_BACKWARD_MIN_SEQ), unless FA2_TILES names a backward kernel's tile (which asks for
    the Triton kernels). Symbolic sizes take it only where they are known to (no guard)."""
    if any(forced_tile(kernel) for kernel in ("dq", "dkdv", "single-pass")):
        return False
    least = by_head_dim(GLUON_BACKWARD_MIN_SEQ, head_dim)
    return least is not None and known_true(seq_len >= least)


def gluon_backward_block_m(head_dim: int) -> int:
    """The queries per step of the Gluon backward at `head_dim` (GLUON_BACKWARD_BLOCK_M; 64
    where the table is silent)."""
    return GLUON_BACKWARD_BLOCK_M.get(head_dim, 64)


_forced: dict[str, dict[str, Tile]] = {}


def forced_tile(kernel: str) -> Tile | None:
    """The tile FA2_TILES names for `kernel` (a key of KERNELS), or None."""
    text = os.environ.get("FA2_TILES", "")
    if text not in _forced:
        tiles = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            name, _, tile = item.partition("=")
            if name.strip() not in KERNELS or not tile:
                raise ValueError(
                    f"FA2_TILES takes kernel=tile items separated by commas, kernels "
                    f"{', '.join(KERNELS)}; got {item!r}"
                )
            tiles[name.strip()] = Tile.parse(tile)
        _forced[text] = tiles
    return _forced[text].get(kernel)


# Bytes of the rows a backward pass re-reads from L2 (Q and dO for dK/dV, K and V for dQ) that
# the heads of one group may take together: FA3's `size_l2` (32 MiB, hopper/tile_scheduler.hpp),
# which groups heads for the same reason on the same 50 MB L2.
L2_BUDGET = 32 * 2**20


def l2_group(bytes_per_head: int) -> int:
    """How many (batch, head) pairs of a backward pass run together (FA2_L2_GROUP): 1 (unset,
    or "1") launches each one's tiles in turn, as the grid lists them; with "auto" the most
    heads, a power of two, whose re-read rows (`bytes_per_head` each) fit in L2_BUDGET
    together; or the number given. Within a group the tiles go heaviest first across its
    heads (as FA3's and cuDNN's schedulers order them), so that the rows those heads
    re-read stay in L2 between visits. An option to measure, not yet a default."""
    text = os.environ.get("FA2_L2_GROUP", "1").strip().lower()
    if text == "auto":
        return 1 << max(0, int(math.log2(max(L2_BUDGET // max(bytes_per_head, 1), 1))))
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f'FA2_L2_GROUP must be a positive number or "auto", got {text!r}')
    return int(text)


def delta_rows(head_dim: int) -> int:
    """Query rows per program of the pass computing D = rowsum(dO ∘ O) (memory-bound: about 64
    fp32 values per thread of 4 warps; 16 in the interpreter, to cover several programs)."""
    return 16 if INTERPRET else min(128, max(16, 8192 // block_d(head_dim)))


_fastest: dict[tuple, Tile] = {}
# FA2_AUTOTUNE's measurements, by (kernel table, head-dim block, dtype, precision, causal,
# seq bucket): {tile: median ms}. Read by the tile sweeps that choose the defaults above.
timings: dict[tuple, dict[Tile, float]] = {}


def _families(head_dim_block: int, element_size: int, precision: str) -> list[str]:
    """The table keys that may hold these kernels' tiles, the most specific first: head dims
    up to 32 may have a list of their own ("_d32") and otherwise share the one up to 64."""
    if INTERPRET:
        return ["interpreter"]
    width = "16bit" if element_size == 2 else ("32bit" if precision == "ieee" else "tf32")
    if head_dim_block <= 32:
        return [f"{width}_d32", f"{width}_d64"]
    if head_dim_block <= 64:
        return [f"{width}_d64"]
    if head_dim_block == 128:
        return [f"{width}_d128"]
    return [f"{width}_d256"]


@functools.cache
def device_capability(device: torch.device) -> tuple[int, int] | None:
    """The compute capability of a CUDA `device` (None for any other), which picks its tiles."""
    return torch.cuda.get_device_capability(device) if device.type == "cuda" else None


_SYMBOLIC_SHAPES = "torch.compile traces this call with dynamic shapes"
_symbolic_warned: set[str] = set()


def symbolic_shapes_refusal(sizes: Any, device: torch.device, kernel: str) -> str | None:
    """Why a call traced with symbolic `sizes` cannot take a Gluon `kernel` ("forward" or
    "backward"), or None where every size is an int. The Gluon kernels' plans need them known;
    where the call could otherwise take the Gluon kernel by default (an sm_90 GPU, outside the
    interpreter), this says so once per kernel, since the Triton kernels are slower there:
    a compiled model whose sequence length went symbolic (dynamo's automatic dynamic shapes,
    after a recompile) would otherwise run slower without a word."""
    if all(isinstance(size, int) for size in sizes):
        return None
    if not INTERPRET and device_capability(device) == (9, 0) and kernel not in _symbolic_warned:
        _symbolic_warned.add(kernel)
        warnings.warn(
            f"fa2: torch.compile traced this attention call with dynamic shapes, so its "
            f"{kernel} runs fa2's Triton kernels instead of the Gluon one it takes on Hopper "
            "by default, which are slower; keep the lengths static (torch.compile(..., "
            "dynamic=False), or torch._dynamo.mark_static on the inputs)",
            UserWarning,
            stacklevel=5,
        )
    return _SYMBOLIC_SHAPES


def known_true(condition: Any) -> bool:
    """Whether `condition` holds: a plain bool, or, while torch.compile traces with dynamic
    shapes, a symbolic one that holds for every size the graph may run with. Adds no guard,
    so a traced graph is not specialised on it (Inductor decides its inputs' alignment the
    same way)."""
    if isinstance(condition, bool):
        return condition
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return statically_known_true(condition)


def choose_tile(
    table: dict[str, list[Tile]],
    *,
    head_dim_block: int,
    dtype: torch.dtype,
    precision: str,
    seq_len: int,
    key: Callable[[], tuple],
    run: Callable[[Tile], object] | None,
    specialisable: bool = True,
    device: torch.device | None = None,
) -> Tile:
    """The tile to launch with: the table's default, the one FA2_TILES names, or with
    FA2_AUTOTUNE=1 the fastest of the list for `key()`, found once by timing `run(tile)` for
    each candidate (never without a `run`, e.g. while torch.compile traces with tensors that
    hold no data).

    `seq_len` (the longer of the query and key lengths) picks a family's `_short` list where
    the table has one and the sequences are at most `SHORT_SEQ` long (when traced with
    symbolic lengths: only where that holds for every length). FA2_TILES may name a tile of
    either list of the family. "+WS" tiles are never the default nor timed by FA2_AUTOTUNE;
    a named one warns (`WS_WARNING`), or where the call cannot run a warp-specialised kernel
    (`specialisable` False: its rows cannot be read through TMA descriptors, or dK/dV has
    grouped heads) gives way to the list's default, whose block sizes suit the plain kernel.
    On a `device` before Hopper the table of its architecture stands in for `table`
    (`fa2.triton.pre_hopper`)."""
    short = known_true(seq_len <= SHORT_SEQ)
    families = _families(head_dim_block, dtype.itemsize, precision)
    keys = [k for f in families for k in ((f"{f}_short", f) if short else (f,))]
    kernel = next((name for name, known in KERNELS.items() if known is table), None)
    if device is not None and not INTERPRET:
        from fa2.triton.pre_hopper import TABLES, architecture  # it imports Tile from here

        arch = architecture(device_capability(device))
        table = TABLES[arch][kernel] if arch and kernel else table
    candidates = next(table[k] for k in keys if k in table)
    forced = kernel and forced_tile(kernel)
    if forced:
        listed = {t for f in families for k in (f"{f}_short", f) for t in table.get(k, ())}
        if forced not in listed:
            raise ValueError(
                f"FA2_TILES names {kernel} tile {forced}, which is not a candidate for this "
                f"call ({', '.join(families)}); candidates: {', '.join(map(str, listed))}"
            )
        if forced.ws and not specialisable:
            return candidates[0]
        if forced.ws:
            _warn_ws(kernel, forced)
        return forced
    # "+WS" tiles run only where FA2_TILES names them (WS_WARNING); the default is never one.
    candidates = [tile for tile in candidates if not tile.ws]
    if run is None or not autotuning() or len(candidates) == 1:
        return candidates[0]
    full_key = (id(table), head_dim_block, dtype, precision, *key())
    if full_key not in _fastest:
        from triton.testing import do_bench

        run(candidates[0])  # compile and warm the clocks before anything is timed
        times = {}
        for tile in candidates:
            try:
                times[tile] = do_bench(lambda t=tile: run(t), return_mode="median")
            except Exception as exc:  # e.g. more shared memory than this GPU has
                if "OutOfResources" not in type(exc).__name__:
                    raise
                times[tile] = float("inf")
        timings[full_key] = times
        _fastest[full_key] = min(times, key=times.get)
    return _fastest[full_key]
