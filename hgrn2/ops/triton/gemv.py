"""Projections of a few rows, as in decoding: y_j = x W_jᵀ + b_j for up to three weights of one shape in one launch,
or the SwiGLU pair silu(x W_gᵀ + b_g) · (x W_uᵀ + b_u) (used by `hgrn2.ops.projection` for M ≤ `MAX_ROWS`).

With one token per sequence a projection reads its whole weight for a few outputs, so its time is the weight
read. Each program reduces a [BLOCK_N, K] slab of one weight against the M rows of x in BLOCK_K steps (fp32
accumulators, one rounding per output, as F.linear); the grid's second axis picks the weight, so HGRU2's q/f/i
projections are one launch, and the MLP's gate and up are read by the same program, whose product is the only
thing written. Many small programs (BLOCK_N rows each) keep enough loads in flight to approach the copy bandwidth
without split-K.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._device import cdiv, launch_pdl, next_pow2, triton_op
from ._interpret import INTERPRET

MAX_ROWS = 4  # beyond this the rows' accumulators crowd out the weight tile; cuBLAS's GEMM takes over


@triton.jit
def _slab(x, res, gamma, eps, w, offs_m, offs_n, M, N, K, stride_xm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
          BLOCK_K: tl.constexpr, EVEN: tl.constexpr, NORM: tl.constexpr, RES: tl.constexpr):
    """[BLOCK_M, BLOCK_N] fp32: rows offs_m of the input times rows offs_n of w [N, K], transposed. The input is x,
    or with RES r = x + res (rounded to x's dtype, as the add would be), and with NORM rms_norm(·)·gamma: the
    squares are summed beside the products, and since 1/rms is one number per row it scales the sums at the end.
    The products are summed element-wise over the K steps and reduced across the tile once, so no step waits on
    a reduction and the next step's loads issue early."""
    acc = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_K], tl.float32)
    ss = tl.zeros([BLOCK_M, BLOCK_K], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        w_ptrs = w + offs_n[:, None].to(tl.int64) * K + offs_k[None, :]
        x_off = offs_m[:, None] * stride_xm + offs_k[None, :]
        if EVEN:
            wt = tl.load(w_ptrs)
            x_mask = offs_m[:, None] < M
        else:
            wt = tl.load(w_ptrs, mask=(offs_n[:, None] < N) & (offs_k[None, :] < K), other=0.0)
            x_mask = (offs_m[:, None] < M) & (offs_k[None, :] < K)
        xt = tl.load(x + x_off, mask=x_mask, other=0.0).to(tl.float32)
        if RES:
            xt = (xt + tl.load(res + x_off, mask=x_mask, other=0.0).to(tl.float32)).to(x.dtype.element_ty)
            xt = xt.to(tl.float32)
        if NORM:
            ss += xt * xt
            xt = xt * tl.load(gamma + offs_k, mask=offs_k < K, other=0.0).to(tl.float32)[None, :]
        acc += xt[:, None, :] * wt.to(tl.float32)[None, :, :]
    out = tl.sum(acc, axis=2)
    if NORM:
        out = out * tl.rsqrt(tl.sum(ss, axis=1) / K + eps)[:, None]
    return out


@triton.jit
def _bias(acc, b, offs_n, N, HAS_BIAS: tl.constexpr):
    if HAS_BIAS:
        acc += tl.load(b + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    return acc


@triton.jit
def _gemv_kernel(x, res, r_out, gamma, eps, w0, w1, w2, b0, b1, b2, y0, y1, y2, M, N, K, stride_xm, stride_ym,
                 HAS_BIAS: tl.constexpr, SWIGLU: tl.constexpr, NORM: tl.constexpr, RES: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN: tl.constexpr,
                 PDL: tl.constexpr):
    if PDL:  # launched before the previous kernel has drained: wait for its writes
        tl.extra.cuda.gdc_wait()
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    j = tl.program_id(1)
    if SWIGLU:
        g = _slab(x, res, gamma, eps, w0, offs_m, offs_n, M, N, K, stride_xm, BLOCK_M, BLOCK_N, BLOCK_K, EVEN, NORM,
                  RES)
        u = _slab(x, res, gamma, eps, w1, offs_m, offs_n, M, N, K, stride_xm, BLOCK_M, BLOCK_N, BLOCK_K, EVEN, NORM,
                  RES)
        g, u = _bias(g, b0, offs_n, N, HAS_BIAS), _bias(u, b1, offs_n, N, HAS_BIAS)
        out, y = g * tl.sigmoid(g) * u, y0
    else:
        w, b, y = w0, b0, y0
        if j == 1:
            w, b, y = w1, b1, y1
        if j == 2:
            w, b, y = w2, b2, y2
        out = _slab(x, res, gamma, eps, w, offs_m, offs_n, M, N, K, stride_xm, BLOCK_M, BLOCK_N, BLOCK_K, EVEN, NORM,
                    RES)
        out = _bias(out, b, offs_n, N, HAS_BIAS)
    tl.store(y + offs_m[:, None] * stride_ym + offs_n[None, :], out.to(y.dtype.element_ty),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))
    if RES:  # the first program also writes r = x + res, the residual stream after this step
        if (tl.program_id(0) == 0) & (j == 0):
            for k0 in range(0, K, BLOCK_K):
                offs_k = k0 + tl.arange(0, BLOCK_K)
                off = offs_m[:, None] * stride_xm + offs_k[None, :]
                mask = (offs_m[:, None] < M) & (offs_k[None, :] < K)
                r = tl.load(x + off, mask=mask, other=0.0).to(tl.float32) + tl.load(res + off, mask=mask,
                                                                                     other=0.0).to(tl.float32)
                tl.store(r_out + off, r.to(r_out.dtype.element_ty), mask=mask)


def _configs() -> list[triton.Config]:
    # rows of the weight per program, K step, warps: few rows per program give many programs (loads in flight)
    shapes = [(1, 2048, 4), (2, 1024, 4), (2, 2048, 8), (4, 1024, 4), (4, 512, 2), (4, 2048, 8), (8, 512, 4),
              (8, 1024, 8)]
    return [triton.Config({"BLOCK_N": n, "BLOCK_K": k}, num_warps=w) for n, k, w in shapes]


def _prune(configs, named_args, **kwargs):
    # the [BLOCK_M, BLOCK_N, BLOCK_K] accumulator within 64 fp32 registers a thread; K steps no longer than K
    m, k = kwargs["BLOCK_M"], named_args["K"]
    kept = [c for c in configs if m * c.kwargs["BLOCK_N"] * c.kwargs["BLOCK_K"] <= 64 * 32 * c.num_warps
            and c.kwargs["BLOCK_K"] <= max(512, next_pow2(k))]
    return kept or [min(configs, key=lambda c: c.kwargs["BLOCK_N"] * c.kwargs["BLOCK_K"] / c.num_warps)]


_tuned = triton.autotune(_configs(), key=["N", "K", "BLOCK_M", "SWIGLU", "HAS_BIAS", "NORM", "RES", "PDL"],
                         prune_configs_by={"early_config_prune": _prune})(
    triton.heuristics({"EVEN": lambda a: a["N"] % a["BLOCK_N"] == 0 and a["K"] % a["BLOCK_K"] == 0})(_gemv_kernel))


def _launch(x, ws, bs, ys, swiglu: bool, res=None, gamma=None, eps: float = 0.0, r_out=None) -> None:
    M, K = x.shape
    N = ws[0].shape[0]
    has_bias = bool(bs)
    bs = bs if has_bias else ws  # unused pointers (never read without their flag) keep the signature fixed
    ws3, bs3, ys3 = (*ws, *ws[:1] * (3 - len(ws))), (*bs, *bs[:1] * (3 - len(bs))), (*ys, *ys[:1] * (3 - len(ys)))
    norm = (x if res is None else res, x if r_out is None else r_out, x if gamma is None else gamma)
    args = (x, *norm, eps, *ws3, *bs3, *ys3, M, N, K, x.stride(0), ys[0].stride(0))
    pdl = launch_pdl(x)
    meta = dict(HAS_BIAS=has_bias, SWIGLU=swiglu, NORM=gamma is not None, RES=res is not None, BLOCK_M=next_pow2(M),
                PDL=pdl)
    if INTERPRET:  # autotuning's timing loop means nothing in the interpreter
        block_n, block_k = 8, 64
        grid = (cdiv(N, block_n), 1 if swiglu else len(ws))
        even = N % block_n == 0 and K % block_k == 0
        _gemv_kernel[grid](*args, BLOCK_N=block_n, BLOCK_K=block_k, EVEN=even, **meta)
        return
    _tuned[lambda c: (cdiv(N, c["BLOCK_N"]), 1 if swiglu else len(ws))](*args, **meta, launch_pdl=pdl)


@triton_op("hgrn2::gemv")
def gemv(x: torch.Tensor, weights: list[torch.Tensor], biases: list[torch.Tensor], res: torch.Tensor | None,
         gamma: torch.Tensor | None, eps: float) -> list[torch.Tensor]:
    """x [M, K] contiguous rows (M ≤ MAX_ROWS); weights: 1–3 contiguous [N, K] of x's dtype; biases: [] or one
    [N] per weight → [h W_jᵀ + b_j], each [M, N] in x's dtype, where h = x, or r = x + res (res like x), or with
    gamma [K] rms_norm(r, gamma, eps). With res, r is appended to the list."""
    ys = [x.new_empty(x.shape[0], w.shape[0]) for w in weights]
    r = None if res is None else torch.empty_like(x)
    _launch(x, weights, biases, ys, False, res, gamma, eps, r)
    return ys if r is None else [*ys, r]


@gemv.register_fake
def _(x, weights, biases, res, gamma, eps):
    return [x.new_empty(x.shape[0], w.shape[0]) for w in weights] + ([] if res is None else [torch.empty_like(x)])


@triton_op("hgrn2::gemv_swiglu")
def gemv_swiglu(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, biases: list[torch.Tensor],
                res: torch.Tensor | None, gamma: torch.Tensor | None, eps: float) -> list[torch.Tensor]:
    """x [M, K] (M ≤ MAX_ROWS), gate and up [N, K], biases [] or [b_gate, b_up] → [silu(h gateᵀ + b_g) · (h upᵀ + b_u)]
    [M, N] in x's dtype, rounded once, with h as in `gemv` (and r appended with res)."""
    y = x.new_empty(x.shape[0], gate.shape[0])
    r = None if res is None else torch.empty_like(x)
    _launch(x, [gate, up], biases, [y], True, res, gamma, eps, r)
    return [y] if r is None else [y, r]


@gemv_swiglu.register_fake
def _(x, gate, up, biases, res, gamma, eps):
    return [x.new_empty(x.shape[0], gate.shape[0])] + ([] if res is None else [torch.empty_like(x)])
