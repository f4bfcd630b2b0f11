"""The LM head and cross-entropy fused: the loss of `hidden @ weight.T` without the full logits.

Materialised, the logits of a large-vocabulary model dominate its memory: the leaderboard's step
(65,536 tokens, vocabulary 151,936) holds 19.9 GB of bf16 logits and as much again for their
gradient. `fused_linear_cross_entropy` works through the tokens in chunks instead. For each
chunk of `c` tokens it

1. computes the chunk's logits `h_c @ W.T` (`c × V`, the only large temporary; cuBLAS),
2. runs one row kernel that finds each row's log-sum-exp (online softmax), its loss, and writes
   the gradient of the loss with respect to the logits over them (Triton on CUDA, plain torch
   elsewhere; float32 arithmetic),
3. multiplies that gradient into the gradient of the hidden states, `dh_c = dlogits @ W`, and
   into the weight's, `dW += dlogitsᵀ @ h_c`, accumulated in float32 across chunks (inside the
   GEMM, so the accumulator costs no extra pass).

The gradients are computed in the forward pass, assuming the loss's own gradient is 1, and kept
until backward, which only multiplies them by the incoming scalar gradient. Each is kept in its
input's dtype: the weight's float32 accumulator is rounded to a 16-bit weight's dtype once, at
the end of the forward, and freed, so what waits for backward is `V·d·2` bytes rather than
`V·d·4` (for the leaderboard's 151,936 × 4,096 head: 1.24 GB rather than 2.49 GB), and the
backward's product is the gradient itself rather than a second copy beside the accumulator
(scaled in place; out of place only where the graph is kept for another backward).
The product rounds once more unless the incoming gradient is a power of two (the 1 of
`loss.backward()` is). The three matmuls
are the same FLOPs as the unfused computation's (6·T·V·d), nothing is recomputed, and the
logits make the same number of trips through memory (written by the GEMM, read twice and
written once by the row kernel, read by the two GEMMs), so the fused loss costs about what the
unfused one does while holding one chunk of logits instead of all of them.

The pieces, top-down: the chunk size from a memory budget; the row step in torch (the CPU path
and the reference the Triton kernel is tested against); the matmul helpers that accumulate in
float32; the chunk loop as a `torch.library` custom op with its autograd formula (so that
`torch.compile` treats it as one opaque op and never traces the loop); the public function.
"""

from __future__ import annotations

import functools

import torch

__all__ = ["CHUNK_BUDGET_BYTES", "chunk_rows", "fused_linear_cross_entropy"]

# The chunk's logits (in the compute dtype) may take this many bytes. 1 GiB holds a whole batch
# of a 10,000-token vocabulary (64 × 512 tokens of `small`: one chunk, the unfused computation's
# launches) and 3,456 tokens of the leaderboard's 151,936 (19 chunks, 1.05 GB, against 19.9 GB
# for all the logits). The chunk size is also the depth (K) of the weight-gradient GEMM, whose
# float32 accumulator is read and written once per chunk: 8 bytes per weight element against
# 2·c FLOPs, compute-bound for c above about 1,200 on an H100 (989 TFLOP/s dense bf16 against
# 3.35 TB/s, its datasheet's figures), which this budget keeps for vocabularies up to ~400,000.
CHUNK_BUDGET_BYTES = 1 << 30
# Chunk sizes are a multiple of this many tokens (whole GEMM tiles) unless the input is smaller.
_ROW_MULTIPLE = 128
_REDUCTIONS = ("mean", "sum")
_LOW_PRECISION = (torch.bfloat16, torch.float16)


def chunk_rows(
    num_tokens: int,
    vocab_size: int,
    dtype: torch.dtype,
    *,
    budget_bytes: int = CHUNK_BUDGET_BYTES,
) -> int:
    """Tokens per chunk: as many as fit `budget_bytes` of logits, a multiple of 128, ≤ tokens.

    Args:
        num_tokens: tokens in the whole input.
        vocab_size: columns of the logits.
        dtype: dtype the logits are computed in.
        budget_bytes: bytes one chunk's logits may take (`CHUNK_BUDGET_BYTES` by default).

    Returns:
        At least 128 tokens (or `num_tokens` when fewer), even if 128 rows exceed the budget.
    """
    per_token = vocab_size * torch.empty((), dtype=dtype).element_size()
    rows = budget_bytes // per_token // _ROW_MULTIPLE * _ROW_MULTIPLE
    return min(num_tokens, max(rows, _ROW_MULTIPLE))


def _rows_torch_(
    logits: torch.Tensor,
    targets: torch.Tensor,
    losses: torch.Tensor,
    scale: torch.Tensor,
    *,
    ignore_index: int,
    compute_grad: bool,
) -> None:
    """`lmcore.kernels.cross_entropy.cross_entropy_rows_` in torch operations (same contract)."""
    x = logits.to(losses.dtype)
    lse = torch.logsumexp(x, dim=-1)  # (rows,)
    ignored = targets == ignore_index
    safe = torch.where(ignored, 0, targets).long().unsqueeze(1)  # (rows, 1)
    loss = lse - x.gather(1, safe).squeeze(1)
    losses.copy_(torch.where(ignored, 0.0, loss))
    if compute_grad:
        row_scale = torch.where(ignored, 0.0, scale).unsqueeze(1)  # (rows, 1)
        grad = torch.exp(x - lse.unsqueeze(1)) * row_scale
        grad.scatter_add_(1, safe, -row_scale)
        logits.copy_(grad)


def _addmm_float32_(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta: int) -> None:
    """`acc = beta·acc + a @ b` for 16-bit `a`, `b` and a float32 `acc`, inside one GEMM."""
    torch.addmm(acc, a, b, beta=beta, out_dtype=torch.float32, out=acc)


@functools.cache
def _addmm_accumulates_in_float32(device: torch.device) -> bool:
    """Whether this torch's `addmm(..., out_dtype=float32)` adds bf16 products into a float32
    matrix inside the GEMM (newer releases allow a float32 `self`; older ones refuse it).
    Tried once per device on 2 × 2 matrices, in the very call the loss makes."""
    c = torch.full((2, 2), 7.0, device=device)
    a = torch.ones(2, 2, device=device, dtype=torch.bfloat16)
    try:
        _addmm_float32_(c, a, a, beta=0)  # 2, whatever c held
        _addmm_float32_(c, a, a, beta=1)  # 4
    except Exception:  # any refusal means: not in this torch
        return False
    return bool(torch.all(c == 4))


def _mm_into(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """`out = a @ b` with the products accumulated in at least float32, stored in out's dtype."""
    if out.dtype == a.dtype:
        torch.mm(a, b, out=out)
    elif out.is_cuda and a.dtype in _LOW_PRECISION and out.dtype == torch.float32:
        torch.mm(a, b, out_dtype=torch.float32, out=out)
    else:
        out.copy_(torch.mm(a.to(out.dtype), b.to(out.dtype)))


def _addmm_into(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, first: bool) -> None:
    """`acc = a @ b` (first) or `acc += a @ b`, accumulated in acc's dtype (float32 or wider)."""
    beta = 0 if first else 1  # beta 0 ignores acc's (uninitialised) contents
    if acc.dtype == a.dtype:
        torch.addmm(acc, a, b, beta=beta, out=acc)
    elif not acc.is_cuda:
        torch.addmm(acc, a.to(acc.dtype), b.to(acc.dtype), beta=beta, out=acc)
    elif _addmm_accumulates_in_float32(acc.device):
        _addmm_float32_(acc, a, b, beta=beta)
    elif first:  # older torch: the chunk's product is rounded to a's dtype once
        acc.copy_(torch.mm(a, b))
    else:
        acc.add_(torch.mm(a, b))


def _rows_step(use_triton: bool):
    if not use_triton:
        return _rows_torch_
    from lmcore.kernels.cross_entropy import cross_entropy_rows_

    return cross_entropy_rows_


@torch.library.custom_op("lmcore::linear_cross_entropy", mutates_args=())
def _linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    ignore_index: int,
    mean: bool,
    rows_per_chunk: int,
    compute_dtype: torch.dtype,
    grad_hidden: bool,
    grad_weight: bool,
    use_triton: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The chunk loop: the loss (0-dim, float32 or wider) and the gradients of `loss` itself.

    Shapes: hidden `(T, d)`, weight `(V, d)`, targets `(T,)`. Returns `(loss, dh, dW)`, where
    `dh` is `(T, d)` in hidden's dtype and `dW` `(V, d)` in the weight's (accumulated in float32
    or wider, rounded once), each empty when not asked for.
    """
    num_tokens, features = hidden.shape
    vocab_size = weight.shape[0]
    rows_ = _rows_step(use_triton)
    with torch.autocast(hidden.device.type, enabled=False):
        w = weight.to(compute_dtype)  # (V, d); no copy when the dtypes agree
        acc_dtype = torch.promote_types(compute_dtype, torch.float32)  # softmax and loss
        counted = (targets != ignore_index).sum()
        scale = counted.to(acc_dtype).reciprocal() if mean else hidden.new_ones((), dtype=acc_dtype)
        losses = torch.empty(num_tokens, device=hidden.device, dtype=acc_dtype)
        dh = hidden.new_empty((num_tokens, features) if grad_hidden else (0,))
        acc_weight = torch.promote_types(weight.dtype, torch.float32)
        dw = weight.new_empty((vocab_size, features) if grad_weight else (0,), dtype=acc_weight)
        chunk = hidden.new_empty((min(rows_per_chunk, num_tokens), vocab_size), dtype=w.dtype)
        for start in range(0, num_tokens, rows_per_chunk):
            stop = min(start + rows_per_chunk, num_tokens)
            h = hidden[start:stop].to(compute_dtype)  # (c, d)
            logits = chunk[: stop - start]  # (c, V)
            torch.mm(h, w.t(), out=logits)
            rows_(
                logits,
                targets[start:stop],
                losses[start:stop],
                scale,
                ignore_index=ignore_index,
                compute_grad=grad_hidden or grad_weight,
            )
            # logits now hold d loss / d logits (c, V)
            if grad_hidden:
                _mm_into(dh[start:stop], logits, w)
            if grad_weight:
                _addmm_into(dw, logits.t(), h, first=start == 0)
        loss = losses.sum() * scale
        del chunk, logits  # free the chunk before the rounded copy of dW is allocated
    return loss, dh, dw.to(weight.dtype)  # the float32 accumulator freed, dW in W's dtype


@_linear_cross_entropy.register_fake
def _(hidden, weight, targets, ignore_index, mean, rows_per_chunk, compute_dtype, grad_hidden,
      grad_weight, use_triton):  # fmt: skip
    return (
        hidden.new_empty((), dtype=torch.promote_types(compute_dtype, torch.float32)),
        hidden.new_empty(hidden.shape if grad_hidden else (0,)),
        weight.new_empty(weight.shape if grad_weight else (0,)),
    )


def _setup_context(ctx, inputs, output) -> None:
    _, dh, dw = output
    ctx.save_for_backward(dh, dw)
    ctx.mark_non_differentiable(dh, dw)
    ctx.set_materialize_grads(False)  # no zero tensors the size of dh and dW for their grads
    ctx.grad_hidden, ctx.grad_weight = inputs[7], inputs[8]


def _graph_is_kept() -> bool:
    """Whether the backward running now keeps the graph (`retain_graph=True`, `create_graph`),
    so that the saved gradients may be used again; True when it cannot be told (outside an
    autograd backward, a torch without the query, a compiled backward)."""
    if torch.compiler.is_compiling():
        return True
    keep_graph = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", None)
    return True if keep_graph is None else bool(keep_graph())


def _backward(ctx, grad_loss, _dh, _dw):
    dh, dw = ctx.saved_tensors
    # The saved gradients are scaled in place (no second dh or dW beside them) when this
    # backward is their last use; a kept graph may run backward again.
    scale_ = torch.mul if _graph_is_kept() else torch.Tensor.mul_
    d_hidden = scale_(dh, grad_loss) if ctx.grad_hidden else None
    d_weight = scale_(dw, grad_loss) if ctx.grad_weight else None
    return d_hidden, d_weight, None, None, None, None, None, None, None, None


_linear_cross_entropy.register_autograd(_backward, setup_context=_setup_context)


def _compute_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    device_type = hidden.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return torch.promote_types(hidden.dtype, weight.dtype)


def _check_inputs(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, reduction: str
) -> None:
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    if not (hidden.is_floating_point() and weight.is_floating_point()):
        raise TypeError(
            f"hidden and weight must be floating point, got {hidden.dtype} and {weight.dtype}"
        )
    if targets.is_floating_point() or targets.is_complex() or targets.dtype == torch.bool:
        raise TypeError(f"targets must be integer class ids, got dtype {targets.dtype}")
    if weight.dim() != 2 or hidden.dim() < 1 or hidden.shape[-1] != weight.shape[1]:
        raise ValueError(
            "weight must be (vocab_size, features) and hidden (..., features); got hidden "
            f"{tuple(hidden.shape)} and weight {tuple(weight.shape)}"
        )
    if targets.shape != hidden.shape[:-1]:
        raise ValueError(
            f"targets must have the shape of hidden without the feature dimension; got hidden "
            f"{tuple(hidden.shape)} and targets {tuple(targets.shape)}"
        )
    if len({hidden.device, weight.device, targets.device}) != 1:
        raise ValueError(
            f"hidden, weight and targets must be on one device, got {hidden.device}, "
            f"{weight.device} and {targets.device}"
        )
    if targets.numel() == 0:
        raise ValueError("the cross-entropy of no tokens is undefined")


def _check_targets_on_cpu(targets: torch.Tensor, vocab_size: int, ignore_index: int) -> None:
    # On the CPU the check is cheap; on a GPU it would wait for the device, so there the row
    # kernel turns an out-of-range target into a NaN loss instead. (A compiled graph skips it:
    # the torch row step's gather still refuses such a target.)
    counted = targets[targets != ignore_index]
    if counted.numel() and not (int(counted.min()) >= 0 and int(counted.max()) < vocab_size):
        raise ValueError(
            f"targets must be class ids in [0, {vocab_size}) or ignore_index ({ignore_index}); "
            f"got values from {int(counted.min())} to {int(counted.max())}"
        )


def fused_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    reduction: str = "mean",
    ignore_index: int = -100,
    chunk_size: int | None = None,
    use_triton: bool | None = None,
) -> torch.Tensor:
    """`F.cross_entropy(hidden @ weight.T, targets)` without ever holding the full logits.

    The tokens are processed in chunks (see the module docstring): each chunk's logits, loss
    and gradients are computed and the logits dropped before the next chunk, so the extra
    memory is one chunk of logits (`chunk_size × V` in the compute dtype) plus, during the
    forward and for a weight narrower than float32, a float32 accumulator of the weight's
    gradient (`V × d × 4` bytes). Kept for backward: the two gradients, each in its input's
    dtype (`T × d` and `V × d`); nothing of `tokens × V` size. Softmax, loss and the gradient of the
    logits are computed in float32; the matmuls take the compute dtype (bf16 under
    `torch.autocast(dtype=torch.bfloat16)`) and accumulate in float32, the weight's gradient
    across chunks too. Under autocast the weight may stay float32 (master weights): it is cast
    once per call, and its gradient comes back in float32.

    Works under `torch.compile` (one opaque custom op, `lmcore::linear_cross_entropy`), and
    inside modules wrapped by DDP or FSDP (pass the weight the module holds during its
    forward; `TransformerLM(..., targets=...)` does).

    Args:
        hidden: `(..., d)` final hidden states (after the final norm).
        weight: `(V, d)` LM-head weight.
        targets: `(...)` integer class ids in `[0, V)`, or `ignore_index`.
        reduction: `"mean"` over the tokens not ignored (NaN if all are) or `"sum"`.
        ignore_index: target value whose token is left out of the loss and gets no gradient.
        chunk_size: tokens per chunk; None picks the most whose logits fit
            `CHUNK_BUDGET_BYTES` (see `chunk_rows`).
        use_triton: the row step as a Triton kernel (True) or torch operations (False); None
            (default) uses Triton on CUDA. True on a CPU needs Triton's interpreter
            (`TRITON_INTERPRET=1`): that is how the tests check the kernel.

    Returns:
        A 0-dim float32 tensor.

    Raises:
        ValueError: shapes do not fit, devices differ, no tokens, an unknown `reduction`, a
            `chunk_size` below 1, or (on the CPU) a target outside `[0, V)`. On CUDA such a
            target gives a NaN loss instead (checking it would stall the device).
        TypeError: non-floating hidden or weight, or non-integer targets.

    Example::

        >>> hidden = model.ln_final(model.layers(model.token_embeddings(x)))  # (B, S, d)
        >>> loss = fused_linear_cross_entropy(hidden, model.lm_head.weight, y)
        >>> loss.backward()
    """
    _check_inputs(hidden, weight, targets, reduction)
    vocab_size = weight.shape[0]
    if not hidden.is_cuda and not torch.compiler.is_compiling():
        _check_targets_on_cpu(targets, vocab_size, ignore_index)
    hidden = hidden.reshape(-1, hidden.shape[-1])  # (T, d)
    targets = targets.reshape(-1)  # (T,)
    compute_dtype = _compute_dtype(hidden, weight)
    if chunk_size is None:
        chunk_size = chunk_rows(hidden.shape[0], vocab_size, compute_dtype)
    elif isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer or None, got {chunk_size!r}")
    grad = torch.is_grad_enabled()
    loss, _, _ = _linear_cross_entropy(
        hidden,
        weight,
        targets,
        ignore_index,
        reduction == "mean",
        chunk_size,
        compute_dtype,
        grad and hidden.requires_grad,
        grad and weight.requires_grad,
        hidden.is_cuda if use_triton is None else use_triton,
    )
    return loss
