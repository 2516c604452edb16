"""RMSNorm and LayerNorm, forward and backward as one Triton kernel each (the contracts of
`hgrn2.ops.norm.rms_norm` and `.layer_norm`).

The composite RMSNorm in `hgrn2.ops.norm` makes about six element-wise passes over a float32 copy of the input
in the forward and a dozen in the backward; a training step of the 374M benchmark model runs 73 norms. PyTorch's
LayerNorm backward reduces dw and db in a kernel that is slow for narrow rows (MQAR's d = 128, where it took a
quarter of the training step). Here each direction reads and writes every element once: the
forward stores y and the per-row statistics, the backward reads x, dy and the statistics and writes dx and
per-program partial sums of dw, db (summed by torch). Rows narrower than 1024 go several to a program.

Arithmetic in float32 whatever the input dtype: x̂ = x·rstd with rstd = 1/sqrt(mean(x²) + eps) (RMSNorm), or
x̂ = (x − mean)·rstd with the biased variance (LayerNorm); y = x̂·w + b; dx = rstd·(g − x̂·mean(g·x̂) − mean(g))
with g = dy·w (no mean(g) for RMSNorm); dw = Σ_rows dy·x̂, db = Σ_rows dy.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import sm_count
from ._device import cdiv, next_pow2, triton_op

MAX_D = 16384  # a row per program in registers at most; wider rows take the composite


@triton.jit
def _norm_fwd_kernel(x, res, r, w, b, y, mean, rstd, eps, N, D, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                     CENTER: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, HAS_RES: tl.constexpr):
    """Rows [p·BLOCK_N, (p+1)·BLOCK_N): y = x̂·w + b with x̂ = (x − mean)·rstd (CENTER: LayerNorm) or x·rstd.
    HAS_RES: the input is x + res, stored to r (rounded to r's dtype first: the norm sees what r holds)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK_D)
    mask = (rows < N)[:, None] & (cols < D)[None, :]
    offs = rows[:, None] * D + cols[None, :]
    xr = tl.load(x + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        xr = (xr + tl.load(res + offs, mask=mask, other=0.0).to(tl.float32)).to(r.dtype.element_ty)
        tl.store(r + offs, xr, mask=mask)
        xr = xr.to(tl.float32)
    if CENTER:
        mu = tl.sum(xr, axis=1) / D
        xr = tl.where(mask, xr - mu[:, None], 0.0)
        tl.store(mean + rows, mu, mask=rows < N)
    inv = 1.0 / tl.sqrt(tl.sum(xr * xr, axis=1) / D + eps)
    out = xr * inv[:, None]
    if HAS_W:
        out = out * tl.load(w + cols, mask=cols < D, other=0.0).to(tl.float32)[None, :]
    if HAS_B:
        out = out + tl.load(b + cols, mask=cols < D, other=0.0).to(tl.float32)[None, :]
    tl.store(y + offs, out.to(y.dtype.element_ty), mask=mask)
    tl.store(rstd + rows, inv, mask=rows < N)


@triton.jit
def _norm_bwd_kernel(dy, x, w, mean, rstd, dx, dr, dres, dw_part, db_part, N, D, TILES, BLOCK_N: tl.constexpr,
                     BLOCK_D: tl.constexpr, CENTER: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
                     HAS_RES: tl.constexpr):
    """Program p handles row tiles [p·TILES, (p+1)·TILES) and writes its shares of dw and db to row p of the
    partial sums: dx = rstd·(g − x̂·mean(g·x̂) − mean(g)) with g = dy·w (no mean(g) term for RMSNorm).
    HAS_RES (x was r = x + res): dx also takes dr, r's gradient from its other uses, and is stored twice, in
    x's dtype and as dres in res's."""
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_D)
    cmask = cols < D
    if HAS_W:
        wr = tl.load(w + cols, mask=cmask, other=0.0).to(tl.float32)
    dw_acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    db_acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for t in range(TILES):
        rows = (pid.to(tl.int64) * TILES + t) * BLOCK_N + tl.arange(0, BLOCK_N)
        rmask = rows < N
        mask = rmask[:, None] & cmask[None, :]
        offs = rows[:, None] * D + cols[None, :]
        xr = tl.load(x + offs, mask=mask, other=0.0).to(tl.float32)
        dyr = tl.load(dy + offs, mask=mask, other=0.0).to(tl.float32)
        inv = tl.load(rstd + rows, mask=rmask, other=0.0)
        if CENTER:
            xr = tl.where(mask, xr - tl.load(mean + rows, mask=rmask, other=0.0)[:, None], 0.0)
        xhat = xr * inv[:, None]
        g = dyr
        if HAS_W:
            g = dyr * wr[None, :]
        dxr = g - xhat * (tl.sum(g * xhat, axis=1) / D)[:, None]
        if CENTER:
            dxr -= (tl.sum(g, axis=1) / D)[:, None]
        dxr = inv[:, None] * dxr
        if HAS_RES:
            # rounded as the norm's gradient alone would be (to r's dtype), then summed with dr as autograd sums
            dxr = dxr.to(x.dtype.element_ty).to(tl.float32) + tl.load(dr + offs, mask=mask, other=0.0).to(tl.float32)
            tl.store(dres + offs, dxr.to(dres.dtype.element_ty), mask=mask)
        tl.store(dx + offs, dxr.to(dx.dtype.element_ty), mask=mask)
        if HAS_W:
            dw_acc += tl.sum(dyr * xhat, axis=0)
        if HAS_B:
            db_acc += tl.sum(dyr, axis=0)
    if HAS_W:
        tl.store(dw_part + pid.to(tl.int64) * D + cols, dw_acc, mask=cmask)
    if HAS_B:
        tl.store(db_part + pid.to(tl.int64) * D + cols, db_acc, mask=cmask)


def _launch_shape(D: int) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_D, warps): rows of up to 1024 elements go several to a program (narrow rows alone
    would leave each program a few hundred bytes to move). A fixed rule, not autotuning: the tile sets the order
    of each sum, and a shape picked by timing could differ in a resumed run, which must repeat every bit."""
    block = next_pow2(D)
    rows = max(1, 1024 // block)
    return rows, block, min(16, max(1, rows * block // 256))


def _bwd_programs(x: torch.Tensor, tiles: int) -> int:
    # enough programs to fill the GPU several times over, few enough that dw's partial sums stay small
    return max(1, min(tiles, 8 * sm_count(x.device)))


def _norm_fwd(x, weight, bias, eps, out_dtype, center, res=None, r=None):
    N, D = x.shape
    y = torch.empty_like(x, dtype=out_dtype)
    mean = torch.empty(N if center else 0, device=x.device, dtype=torch.float32)
    rstd = torch.empty(N, device=x.device, dtype=torch.float32)
    if N:
        rows, block, warps = _launch_shape(D)
        _norm_fwd_kernel[(cdiv(N, rows),)](
            x, res, r, weight, bias, y, mean, rstd, eps, N, D, BLOCK_N=rows, BLOCK_D=block, CENTER=center,
            HAS_W=weight is not None, HAS_B=bias is not None, HAS_RES=res is not None, num_warps=warps)
    return y, mean, rstd


def _norm_bwd(dy, x, weight, mean, rstd, center, has_bias, dr=None, dres=None, dx=None):
    """→ dx [N, D] (in x's dtype unless given), and the float32 [D] sums of dw and db (empty for a missing
    parameter: summing an empty partial would launch two kernels for nothing). With dr: dx + dr, also written
    to dres."""
    N, D = x.shape
    dx = torch.empty_like(x) if dx is None else dx
    rows, block, warps = _launch_shape(D)
    tiles = cdiv(N, rows)
    programs = _bwd_programs(x, tiles) if N else 0
    # every program writes its row of each partial sum there is (a missing one sums to zeros)
    dw_part = torch.empty(programs if weight is not None else 0, D, device=x.device, dtype=torch.float32)
    db_part = torch.empty(programs if has_bias else 0, D, device=x.device, dtype=torch.float32)
    if N:
        _norm_bwd_kernel[(programs,)](
            dy, x, weight, mean, rstd, dx, dr, dres, dw_part, db_part, N, D, cdiv(tiles, programs),
            BLOCK_N=rows, BLOCK_D=block, CENTER=center, HAS_W=weight is not None, HAS_B=has_bias,
            HAS_RES=dr is not None, num_warps=warps)
    dw = dw_part.sum(0) if weight is not None else dw_part.new_empty(0)
    return dx, dw, db_part.sum(0) if has_bias else db_part.new_empty(0)


@triton_op("hgrn2::rms_norm_fwd")
def rms_norm_fwd(x: torch.Tensor, weight: torch.Tensor, eps: float,
                 out_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """x [N, D] contiguous, weight [D] → (y [N, D] in out_dtype, rstd [N] float32)."""
    y, _, rstd = _norm_fwd(x, weight, None, eps, out_dtype, center=False)
    return y, rstd


@rms_norm_fwd.register_fake
def _(x, weight, eps, out_dtype):
    return torch.empty_like(x, dtype=out_dtype), x.new_empty(x.shape[0], dtype=torch.float32)


@triton_op("hgrn2::rms_norm_bwd")
def rms_norm_bwd(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                 rstd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """dy, x [N, D] contiguous, weight [D], rstd [N] → (dx [N, D] in x's dtype, dw [D] in weight's dtype)."""
    dx, dw, _ = _norm_bwd(dy, x, weight, rstd.new_empty(0), rstd, center=False, has_bias=False)
    return dx, dw.to(weight.dtype)


@rms_norm_bwd.register_fake
def _(dy, x, weight, rstd):
    return torch.empty_like(x), torch.empty_like(weight)


@triton_op("hgrn2::add_rms_norm_fwd")
def add_rms_norm_fwd(x: torch.Tensor, res: torch.Tensor, weight: torch.Tensor, eps: float,
                     out_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x, res [N, D] contiguous, weight [D] → (r = x + res [N, D] in their promoted dtype, rms_norm(r) [N, D]
    in out_dtype, rstd [N] float32)."""
    r = torch.empty_like(x, dtype=torch.promote_types(x.dtype, res.dtype))
    y, _, rstd = _norm_fwd(x, weight, None, eps, out_dtype, center=False, res=res, r=r)
    return r, y, rstd


@add_rms_norm_fwd.register_fake
def _(x, res, weight, eps, out_dtype):
    r = torch.empty_like(x, dtype=torch.promote_types(x.dtype, res.dtype))
    return r, torch.empty_like(x, dtype=out_dtype), x.new_empty(x.shape[0], dtype=torch.float32)


@triton_op("hgrn2::add_rms_norm_bwd")
def add_rms_norm_bwd(dy: torch.Tensor, dr: torch.Tensor, r: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor,
                     x_dtype: torch.dtype, res_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dy (the norm's output gradient), dr (r's from its other uses), r [N, D] contiguous, weight [D], rstd [N]
    → (dx in x_dtype, dres in res_dtype: both r's whole gradient, dw [D] in weight's dtype)."""
    dx = torch.empty_like(r, dtype=x_dtype)
    dres = torch.empty_like(r, dtype=res_dtype)
    _, dw, _ = _norm_bwd(dy, r, weight, rstd.new_empty(0), rstd, center=False, has_bias=False, dr=dr, dres=dres,
                         dx=dx)
    return dx, dres, dw.to(weight.dtype)


@add_rms_norm_bwd.register_fake
def _(dy, dr, r, weight, rstd, x_dtype, res_dtype):
    return torch.empty_like(r, dtype=x_dtype), torch.empty_like(r, dtype=res_dtype), torch.empty_like(weight)


@triton_op("hgrn2::layer_norm_fwd")
def layer_norm_fwd(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                   eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [N, D] contiguous, weight, bias [D] or None → (y [N, D] in x's dtype, mean [N], rstd [N] float32)."""
    return _norm_fwd(x, weight, bias, eps, x.dtype, center=True)


@layer_norm_fwd.register_fake
def _(x, weight, bias, eps):
    stat = x.new_empty(x.shape[0], dtype=torch.float32)
    return torch.empty_like(x), stat, torch.empty_like(stat)


@triton_op("hgrn2::layer_norm_bwd")
def layer_norm_bwd(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None, mean: torch.Tensor,
                   rstd: torch.Tensor, has_bias: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dy, x [N, D] contiguous, weight [D] or None, mean, rstd [N] → (dx [N, D] in x's dtype, dw [D], db [D]
    float32 sums; empty where there is no weight / bias)."""
    return _norm_bwd(dy, x, weight, mean, rstd, center=True, has_bias=has_bias)


@layer_norm_bwd.register_fake
def _(dy, x, weight, mean, rstd, has_bias):
    D = x.shape[1]
    return (torch.empty_like(x), x.new_empty(D if weight is not None else 0, dtype=torch.float32),
            x.new_empty(D if has_bias else 0, dtype=torch.float32))
