"""silu(g) · u, keeping only g and u for the backward.

Autograd of the composite also saves silu(g), a third tensor of the MLP's intermediate width
([B, T, intermediate], the widest activation of a layer); recomputing it in the backward costs one
element-wise pass.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, g, u):
        ctx.save_for_backward(g, u)
        return F.silu(g) * u

    @staticmethod
    def backward(ctx, dy):
        # the composite's backward, op for op (so its gradients bit for bit), with silu(g) recomputed
        g, u = ctx.saved_tensors
        dg = du = None
        if ctx.needs_input_grad[0]:
            dg = torch.ops.aten.silu_backward(dy * u, g)
        if ctx.needs_input_grad[1]:
            du = dy * F.silu(g)
        return dg, du

def swiglu(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """silu(g) · u for g, u of one shape and dtype."""
    if g.shape != u.shape or g.dtype != u.dtype:
        raise ValueError(f"`g`, `u`: expected one shape and dtype, got {tuple(g.shape)} {g.dtype} and "
                         f"{tuple(u.shape)} {u.dtype}")
    return _SwiGLU.apply(g, u)
