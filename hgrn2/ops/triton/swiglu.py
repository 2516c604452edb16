"""SwiGLU's element-wise core as one Triton kernel per direction (used by `hgrn2.ops.swiglu.swiglu_linear`).

The composite runs silu and the product as separate passes in the forward (two reads of the MLP's widest
activations, one intermediate write) and five in the backward; here the forward reads g, u once and writes
p = silu(g)·u, and the backward reads g, u, dp once and writes dg, du and p (which the down projection's
weight gradient needs), all in float32 with one rounding per output:
  s = g·σ(g),  p = s·u,  du = dp·s,  dg = dp·u·σ(g)·(1 + g·(1 − σ(g))).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._device import cdiv, triton_op

BLOCK = 2048  # elements per program


@triton.jit
def _swiglu_fwd_kernel(g, u, p, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    gr = tl.load(g + offs, mask=mask, other=0.0).to(tl.float32)
    ur = tl.load(u + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(p + offs, (gr * tl.sigmoid(gr) * ur).to(p.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_bwd_kernel(g, u, dp, dg, du, p, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    gr = tl.load(g + offs, mask=mask, other=0.0).to(tl.float32)
    ur = tl.load(u + offs, mask=mask, other=0.0).to(tl.float32)
    dpr = tl.load(dp + offs, mask=mask, other=0.0).to(tl.float32)
    sig = tl.sigmoid(gr)
    s = gr * sig
    tl.store(p + offs, (s * ur).to(p.dtype.element_ty), mask=mask)
    tl.store(du + offs, (dpr * s).to(du.dtype.element_ty), mask=mask)
    tl.store(dg + offs, (dpr * ur * sig * (1.0 + gr * (1.0 - sig))).to(dg.dtype.element_ty), mask=mask)


def _grid(n: int) -> tuple[int]:
    return (cdiv(n, BLOCK),)




@triton_op("hgrn2::swiglu_fwd")
def swiglu_fwd(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """g, u contiguous, one shape and dtype → silu(g)·u in their dtype."""
    p = torch.empty_like(g)
    if g.numel():
        _swiglu_fwd_kernel[_grid(g.numel())](g, u, p, g.numel(), BLOCK=BLOCK, num_warps=8)
    return p


@swiglu_fwd.register_fake
def _(g, u):
    return torch.empty_like(g)


@triton_op("hgrn2::swiglu_bwd")
def swiglu_bwd(g: torch.Tensor, u: torch.Tensor, dp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """g, u, dp contiguous, one shape → (dg, du, p = silu(g)·u), in g's dtype."""
    dg, du, p = torch.empty_like(g), torch.empty_like(g), torch.empty_like(g)
    if g.numel():
        _swiglu_bwd_kernel[_grid(g.numel())](g, u, dp, dg, du, p, g.numel(), BLOCK=BLOCK, num_warps=8)
    return dg, du, p


@swiglu_bwd.register_fake
def _(g, u, dp):
    return torch.empty_like(g), torch.empty_like(g), torch.empty_like(g)
