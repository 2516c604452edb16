"""The element-wise part of the chunked linear cross entropy (`hgrn2.ops.cross_entropy`) as Triton kernels.

Per chunk of rows the composite upcasts the [C, V] logits to float32 and makes five more passes over them
(log-sum-exp, subtract, exp, scale, downcast) — at V = 32000 the largest tensors of a training step. Here:
- forward: one read of the logits → per row the float32 log-sum-exp and the label's logit;
- backward: one read and one in-place write: logits ← coef · (softmax − onehot(label)), in the logits' dtype,
  ready for the two gradient matmuls.
Arithmetic in float32, as the composite's (online max / sum over blocks of the vocabulary).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._device import triton_op

BLOCK_V = 2048  # vocabulary columns per loop step


@triton.jit
def _ce_fwd_kernel(logits, labels, lse, target, V, stride, BLOCK_V: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = logits + row * stride
    cols = tl.arange(0, BLOCK_V)
    m = tl.full([BLOCK_V], float("-inf"), dtype=tl.float32)
    s = tl.zeros([BLOCK_V], dtype=tl.float32)
    for v0 in range(0, V, BLOCK_V):
        x = tl.load(base + v0 + cols, mask=v0 + cols < V, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        # columns never seen yet (m = -inf) contribute nothing; guard exp(-inf - -inf)
        s = s * tl.where(m_new == float("-inf"), 0.0, tl.exp(m - m_new)) + tl.where(x == float("-inf"), 0.0,
                                                                                     tl.exp(x - m_new))
        m = m_new
    mx = tl.max(m, axis=0)
    total = tl.sum(s * tl.where(m == float("-inf"), 0.0, tl.exp(m - mx)), axis=0)
    tl.store(lse + row, mx + tl.log(total))
    tl.store(target + row, tl.load(base + tl.load(labels + row)).to(tl.float32))


@triton.jit
def _ce_bwd_kernel(logits, labels, lse, coef, V, stride, BLOCK_V: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = logits + row * stride
    cols = tl.arange(0, BLOCK_V)
    r_lse = tl.load(lse + row)
    r_coef = tl.load(coef + row)
    label = tl.load(labels + row)
    for v0 in range(0, V, BLOCK_V):
        mask = v0 + cols < V
        x = tl.load(base + v0 + cols, mask=mask, other=0.0).to(tl.float32)
        p = tl.exp(x - r_lse) - tl.where(v0 + cols == label, 1.0, 0.0)
        tl.store(base + v0 + cols, (p * r_coef).to(logits.dtype.element_ty), mask=mask)




def _check_rows(logits: torch.Tensor) -> None:
    if logits.ndim != 2 or (logits.shape[1] > 1 and logits.stride(1) != 1):
        raise ValueError(f"`logits`: expected [C, V] with contiguous rows, got shape {tuple(logits.shape)} and "
                         f"strides {logits.stride()}")


@triton_op("hgrn2::ce_fwd")
def ce_fwd(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [C, V] (rows contiguous, any row stride), labels [C] int in [0, V) → (log-sum-exp [C], the labels'
    logits [C]), float32."""
    _check_rows(logits)
    C, V = logits.shape
    lse = torch.empty(C, device=logits.device, dtype=torch.float32)
    target = torch.empty_like(lse)
    if C:
        _ce_fwd_kernel[(C,)](logits, labels, lse, target, V, logits.stride(0), BLOCK_V=BLOCK_V, num_warps=8)
    return lse, target


@ce_fwd.register_fake
def _(logits, labels):
    C = logits.shape[0]
    return logits.new_empty(C, dtype=torch.float32), logits.new_empty(C, dtype=torch.float32)


@triton_op("hgrn2::ce_bwd_", mutates_args=("logits",))
def ce_bwd_(logits: torch.Tensor, labels: torch.Tensor, lse: torch.Tensor, coef: torch.Tensor) -> None:
    """In place: logits [C, V] (rows contiguous, any row stride) ← coef[:, None] · (softmax(logits) −
    onehot(labels)), given lse [C] (float32)."""
    _check_rows(logits)
    C, V = logits.shape
    if C:
        _ce_bwd_kernel[(C,)](logits, labels, lse, coef, V, logits.stride(0), BLOCK_V=BLOCK_V, num_warps=8)
