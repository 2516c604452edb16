"""RMSNorm and LayerNorm over the last dim, computed in (at least) float32, that keep little for the backward.

Written as the obvious composite (upcast, statistics, scale), autograd would save the float32 copy of the input
and the float32 normalised tensor: two full-size fp32 tensors per norm, three norms per HGRN2 layer, most of a
training step's activation memory (`hgrn2 bench memory`). These functions save the input in its
own dtype and the per-row statistics, and recompute the normalised tensor in the backward (one element-wise
pass). The forward arithmetic is the composite's, operation for operation.

On CUDA, both run as one Triton kernel per direction (`hgrn2.ops.triton.norm`: the same float32 arithmetic, one
read and one write per element instead of the composite's dozen passes; LayerNorm's dw and db without PyTorch's
slow narrow-row reduction).
"""

from __future__ import annotations

import torch

from . import use_glue_kernels


def _use_triton(x: torch.Tensor) -> bool:
    if not use_glue_kernels(x):
        return False
    from .triton.norm import MAX_D
    return x.shape[-1] <= MAX_D


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, torch.float32)  # fp32 for half inputs, fp64 stays fp64


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps, out_dtype):
        ctx.triton = _use_triton(x)
        if ctx.triton:
            from .triton.norm import rms_norm_fwd
            x2 = x.reshape(-1, x.shape[-1]).contiguous()
            y, rstd = rms_norm_fwd(x2, weight.contiguous(), eps, out_dtype)
            ctx.save_for_backward(x2, weight, rstd)
            return y.view(x.shape)
        dt = _compute_dtype(x)
        xf = x.to(dt)
        rstd = torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return (xf * rstd * weight.to(dt)).to(out_dtype)

    @staticmethod
    def backward(ctx, dy):
        x, weight, rstd = ctx.saved_tensors
        if ctx.triton:
            from .triton.norm import rms_norm_bwd
            dx, dw = rms_norm_bwd(dy.reshape(x.shape).contiguous(), x, weight.contiguous(), rstd)
            return dx.view(dy.shape), dw, None, None
        dt = rstd.dtype
        xhat, dyf = x.to(dt) * rstd, dy.to(dt)
        dx = dw = None
        if ctx.needs_input_grad[0]:
            g = dyf * weight.to(dt)
            dx = (rstd * (g - xhat * (g * xhat).mean(-1, keepdim=True))).to(x.dtype)
        if ctx.needs_input_grad[1]:
            dw = (dyf * xhat).reshape(-1, xhat.shape[-1]).sum(0).to(weight.dtype)
        return dx, dw, None, None


class _AddRMSNorm(torch.autograd.Function):
    """(r, y) = (x + res, rms_norm(x + res)): a residual add and the next pre-norm in one pass each way."""

    @staticmethod
    def forward(ctx, x, res, weight, eps, out_dtype):
        ctx.triton = _use_triton(x)
        ctx.dtypes = (x.dtype, res.dtype)
        if ctx.triton:
            from .triton.norm import add_rms_norm_fwd
            D = x.shape[-1]
            r, y, rstd = add_rms_norm_fwd(x.reshape(-1, D).contiguous(), res.reshape(-1, D).contiguous(),
                                          weight.contiguous(), eps, out_dtype)
            ctx.save_for_backward(r, weight, rstd)
            return r.view(x.shape), y.view(x.shape)
        r = x + res
        dt = _compute_dtype(r)
        rf = r.to(dt)
        rstd = torch.rsqrt(rf.square().mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(r, weight, rstd)
        return r, (rf * rstd * weight.to(dt)).to(out_dtype)

    @staticmethod
    def backward(ctx, dr, dy):
        r, weight, rstd = ctx.saved_tensors
        x_dtype, res_dtype = ctx.dtypes
        if ctx.triton:
            from .triton.norm import add_rms_norm_bwd
            D = r.shape[-1]
            dx, dres, dw = add_rms_norm_bwd(dy.reshape(-1, D).contiguous(), dr.reshape(-1, D).contiguous(), r,
                                            weight.contiguous(), rstd, x_dtype, res_dtype)
            return dx.view(dy.shape), dres.view(dy.shape), dw, None, None
        dt = rstd.dtype
        rhat, dyf = r.to(dt) * rstd, dy.to(dt)
        g = dyf * weight.to(dt)
        dr = dr + (rstd * (g - rhat * (g * rhat).mean(-1, keepdim=True))).to(r.dtype)
        dw = (dyf * rhat).reshape(-1, rhat.shape[-1]).sum(0).to(weight.dtype)
        return dr.to(x_dtype), dr.to(res_dtype), dw, None, None


class _LayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        ctx.triton = _use_triton(x)
        if ctx.triton:
            from .triton.norm import layer_norm_fwd
            x2 = x.reshape(-1, x.shape[-1]).contiguous()
            y, mean, rstd = layer_norm_fwd(x2, _contiguous(weight), _contiguous(bias), eps)
            ctx.has_bias = bias is not None
            ctx.save_for_backward(x2, weight, bias, mean, rstd)
            return y.view(x.shape)
        dt = _compute_dtype(x)
        w = None if weight is None else weight.to(dt)
        b = None if bias is None else bias.to(dt)
        y, mean, rstd = torch.native_layer_norm(x.to(dt), x.shape[-1:], w, b, eps)
        ctx.save_for_backward(x, weight, bias, mean, rstd)
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        x, weight, bias, mean, rstd = ctx.saved_tensors
        if ctx.triton:
            from .triton.norm import layer_norm_bwd
            dx, dw, db = layer_norm_bwd(dy.reshape(x.shape).contiguous(), x, _contiguous(weight), mean, rstd,
                                        ctx.has_bias)
            return (dx.view(dy.shape), None if weight is None else dw.to(weight.dtype),
                    None if bias is None else db.to(bias.dtype), None)
        dt = rstd.dtype
        w = None if weight is None else weight.to(dt)
        b = None if bias is None else bias.to(dt)
        mask = [ctx.needs_input_grad[0], weight is not None and ctx.needs_input_grad[1],
                bias is not None and ctx.needs_input_grad[2]]
        dx, dw, db = torch.ops.aten.native_layer_norm_backward(dy.to(dt), x.to(dt), x.shape[-1:], mean, rstd, w, b,
                                                               mask)
        return (None if dx is None else dx.to(x.dtype), None if dw is None else dw.to(weight.dtype),
                None if db is None else db.to(bias.dtype), None)


def _contiguous(p: torch.Tensor | None) -> torch.Tensor | None:
    return None if p is None else p.contiguous()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x [..., D] / sqrt(mean(x², -1) + eps) · weight [D], in float32 (fp64 for fp64 x), returned in out_dtype
    (default x's dtype; a lower one saves the separate cast a consumer would make, e.g. under autocast)."""
    if weight.shape != x.shape[-1:]:
        raise ValueError(f"`weight`: expected shape {tuple(x.shape[-1:])} (x's last dim), got {tuple(weight.shape)}")
    if out_dtype is not None and not out_dtype.is_floating_point:
        raise ValueError(f"`out_dtype`: expected a floating-point dtype or None, got {out_dtype}")
    return _RMSNorm.apply(x, weight, eps, out_dtype or x.dtype)


def add_rms_norm(x: torch.Tensor, res: torch.Tensor, weight: torch.Tensor, eps: float,
                 out_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A pre-norm block's residual step: r = x + res [..., D] (in their promoted dtype, as `x + res`) and
    rms_norm(r, weight, eps, out_dtype) — on CUDA one kernel each way instead of an add, a norm and, in the
    backward, a gradient sum and a cast. x, res of one shape; weight [D]. Returns (r, normalised r)."""
    if x.shape != res.shape:
        raise ValueError(f"`res`: expected x's shape {tuple(x.shape)}, got {tuple(res.shape)}")
    if weight.shape != x.shape[-1:]:
        raise ValueError(f"`weight`: expected shape {tuple(x.shape[-1:])} (x's last dim), got {tuple(weight.shape)}")
    out_dtype = out_dtype or torch.promote_types(x.dtype, res.dtype)
    if not out_dtype.is_floating_point:
        raise ValueError(f"`out_dtype`: expected a floating-point dtype or None, got {out_dtype}")
    return _AddRMSNorm.apply(x, res, weight, eps, out_dtype)


def layer_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    """F.layer_norm over x's last dim [D] with optional weight, bias [D], in float32 (fp64 for fp64 x), returned
    in x's dtype."""
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and p.shape != x.shape[-1:]:
            raise ValueError(f"`{name}`: expected shape {tuple(x.shape[-1:])} (x's last dim), got {tuple(p.shape)}")
    return _LayerNorm.apply(x, weight, bias, eps)
