"""RMSNorm forward and backward as one Triton kernel each (the contract of `hgrn2.ops.norm.rms_norm`).

The composite in `hgrn2.ops.norm` makes about six element-wise passes over a float32 copy of the input in the
forward and a dozen in the backward; a training step of the 374M benchmark model runs 73 norms. Here each
direction reads and writes every element once: the forward stores y and the per-row 1/rms, the backward
reads x, dy and 1/rms and writes dx and per-program partial sums of dw (summed by torch).

Arithmetic in float32 whatever the input dtype, as the composite: rstd = 1/sqrt(mean(x²) + eps),
y = (x·rstd)·w, dx = rstd·(g − x̂·mean(g·x̂)) with g = dy·w and x̂ = x·rstd, dw = Σ_rows dy·x̂.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._device import on_tensor_device

MAX_D = 16384  # one row per program in registers; wider rows take the composite


@triton.jit
def _rms_norm_fwd_kernel(x, w, y, rstd, eps, D, BLOCK_D: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    mask = cols < D
    xr = tl.load(x + row * D + cols, mask=mask, other=0.0).to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(xr * xr, axis=0) / D + eps)
    wr = tl.load(w + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y + row * D + cols, (xr * r * wr).to(y.dtype.element_ty), mask=mask)
    tl.store(rstd + row, r)


@triton.jit
def _rms_norm_bwd_kernel(dy, x, w, rstd, dx, dw_part, N, D, ROWS, BLOCK_D: tl.constexpr):
    """Program p handles rows [p·ROWS, (p+1)·ROWS) and writes its share of dw to dw_part[p]."""
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_D)
    mask = cols < D
    wr = tl.load(w + cols, mask=mask, other=0.0).to(tl.float32)
    dw_acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for k in range(ROWS):
        row = pid.to(tl.int64) * ROWS + k
        if row < N:
            xr = tl.load(x + row * D + cols, mask=mask, other=0.0).to(tl.float32)
            dyr = tl.load(dy + row * D + cols, mask=mask, other=0.0).to(tl.float32)
            r = tl.load(rstd + row)
            xhat = xr * r
            g = dyr * wr
            c = tl.sum(g * xhat, axis=0) / D
            tl.store(dx + row * D + cols, (r * (g - xhat * c)).to(dx.dtype.element_ty), mask=mask)
            dw_acc += dyr * xhat
    tl.store(dw_part + pid.to(tl.int64) * D + cols, dw_acc, mask=mask)


def _launch_shape(D: int) -> tuple[int, int]:
    block = triton.next_power_of_2(D)
    return block, min(16, max(1, block // 256))


def _bwd_programs(x: torch.Tensor, N: int) -> int:
    # enough programs to fill the GPU several times over, few enough that dw's partial sums stay small
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 4
    return max(1, min(N, 8 * sms))


@torch.library.custom_op("hgrn2::rms_norm_fwd", mutates_args=())
@on_tensor_device
def rms_norm_fwd(x: torch.Tensor, weight: torch.Tensor, eps: float,
                 out_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """x [N, D] contiguous, weight [D] → (y [N, D] in out_dtype, rstd [N] float32)."""
    N, D = x.shape
    y = torch.empty_like(x, dtype=out_dtype)
    rstd = torch.empty(N, device=x.device, dtype=torch.float32)
    if N:
        block, warps = _launch_shape(D)
        _rms_norm_fwd_kernel[(N,)](x, weight, y, rstd, eps, D, BLOCK_D=block, num_warps=warps)
    return y, rstd


@rms_norm_fwd.register_fake
def _(x, weight, eps, out_dtype):
    return torch.empty_like(x, dtype=out_dtype), x.new_empty(x.shape[0], dtype=torch.float32)


@torch.library.custom_op("hgrn2::rms_norm_bwd", mutates_args=())
@on_tensor_device
def rms_norm_bwd(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                 rstd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """dy, x [N, D] contiguous, weight [D], rstd [N] → (dx [N, D] in x's dtype, dw [D] in weight's dtype)."""
    N, D = x.shape
    dx = torch.empty_like(x)
    if not N:
        return dx, torch.zeros_like(weight)
    programs = _bwd_programs(x, N)
    part = torch.empty(programs, D, device=x.device, dtype=torch.float32)  # every program writes its row
    block, warps = _launch_shape(D)
    _rms_norm_bwd_kernel[(programs,)](dy, x, weight, rstd, dx, part, N, D, triton.cdiv(N, programs),
                                      BLOCK_D=block, num_warps=warps)
    return dx, part.sum(0).to(weight.dtype)


@rms_norm_bwd.register_fake
def _(dy, x, weight, rstd):
    return torch.empty_like(x), torch.empty_like(weight)
