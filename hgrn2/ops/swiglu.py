"""The SwiGLU MLP's element-wise core and its output projection, keeping only g and u for the backward.

Autograd of the composite `down(silu(g) · u)` saves silu(g) and the product p = silu(g) · u besides g and u:
two more tensors of the MLP's intermediate width ([B, T, intermediate], the widest activations of a layer).
Recomputing silu(g) and p in the backward costs two element-wise passes. On CUDA the element-wise parts
run as one Triton kernel per direction (`hgrn2.ops.triton.swiglu`), which also computes p in the backward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import use_glue_kernels as _use_triton  # a module global, so that tests can force either path


class _SwiGLULinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, g, u, weight, bias):
        # runs under the caller's autocast, so F.linear computes as nn.Linear would (operands in the autocast
        # dtype); the backward repeats that with the dtype recorded here
        ctx.triton = _use_triton(g)
        if ctx.triton:
            from .triton.swiglu import swiglu_fwd
            g, u = g.contiguous(), u.contiguous()
            p = swiglu_fwd(g, u)
        else:
            p = F.silu(g) * u
        y = F.linear(p, weight, bias)
        ctx.save_for_backward(g, u, weight)
        ctx.has_bias, ctx.compute_dtype = bias is not None, y.dtype
        return y

    @staticmethod
    def backward(ctx, dy):
        g, u, weight = ctx.saved_tensors
        dt = ctx.compute_dtype
        dy = dy.to(dt)
        dp = dy @ weight.to(dt)
        if ctx.triton:
            from .triton.swiglu import swiglu_bwd
            dg, du, p = swiglu_bwd(g, u, dp.contiguous())
        else:
            silu = F.silu(g)
            p = silu * u
            dg = torch.ops.aten.silu_backward(dp * u, g) if ctx.needs_input_grad[0] else None
            du = dp * silu if ctx.needs_input_grad[1] else None
        dw = db = None
        if ctx.needs_input_grad[2]:
            dw = (dy.reshape(-1, dy.shape[-1]).t() @ p.reshape(-1, p.shape[-1]).to(dt)).to(weight.dtype)
        if ctx.has_bias and ctx.needs_input_grad[3]:
            db = dy.reshape(-1, dy.shape[-1]).sum(0, dtype=torch.float32)  # cast to bias's dtype by autograd
        return dg, du, dw, db


def swiglu_linear(g: torch.Tensor, u: torch.Tensor, weight: torch.Tensor,
                  bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(silu(g) · u, weight, bias): g, u [..., I] of one shape and dtype, weight [O, I], bias [O]
    → [..., O]. Under autocast it computes as nn.Linear does."""
    if g.shape != u.shape or g.dtype != u.dtype:
        raise ValueError(f"`g`, `u`: expected one shape and dtype, got {tuple(g.shape)} {g.dtype} and "
                         f"{tuple(u.shape)} {u.dtype}")
    if weight.ndim != 2 or weight.shape[1] != g.shape[-1]:
        raise ValueError(f"`weight`: expected [out, {g.shape[-1]}], got {tuple(weight.shape)}")
    if bias is not None and bias.shape != weight.shape[:1]:
        raise ValueError(f"`bias`: expected shape ({weight.shape[0]},), got {tuple(bias.shape)}")
    return _SwiGLULinear.apply(g, u, weight, bias)
