"""Several linear projections of one input as one autograd node: `linears(x, weights, biases)`.

Written as separate `nn.Linear` calls (HGRU2's q/f/i projections, the MLP's gate and up), autograd makes a node
per projection and per weight cast, and the backward sums the projections' dx with full-size adds. Here the
backward accumulates dx in place (one addmm per further projection), the weights are cast once together (and
their gradients back), and the forward's casts are reused: fewer kernels, and fewer launches for a training step
that the CPU launching its kernels can bound. One matmul over the concatenated weights would do the forward in
one launch, but gives each output as a strided column slice, which the recurrence kernels would copy (three
copies and a cat of the gradients per layer: more than the adds).

Arithmetic as `F.linear` under the caller's autocast: operands in the autocast dtype (else as given), each
product rounded to it; dx accumulates in the matmuls' fp32 accumulators and is rounded once per projection.

Without a backward and with at most `gemv.MAX_ROWS` rows on CUDA (decoding), the projections of a group run as one
Triton launch (`hgrn2.ops.triton.gemv`), which also takes the RMSNorm before them (`rms_norm_linears`) and, for
the MLP, SwiGLU after gate and up (`rms_norm_swiglu_mlp`): a decode step's time is its weight reads and its
launches, and one launch per projection and per norm leaves it well short of the copy bandwidth.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F

from . import use_glue_kernels
from .norm import add_rms_norm, rms_norm
from .swiglu import swiglu_linear

MAX_GEMV_ROWS = 4  # = hgrn2.ops.triton.gemv.MAX_ROWS (not imported here: Triton may be absent)
MAX_GEMV_WEIGHTS = 3  # the kernel's weight pointers (one launch for HGRU2's q/f/i)


def _use_gemv(x: torch.Tensor, weights: tuple, biases: tuple, res: torch.Tensor | None = None,
              norm_weight: torch.Tensor | None = None) -> bool:
    """Whether the small-batch kernels take these projections: no backward, no autocast, a few rows on CUDA, and
    weights that fit (`_weights_fit`); a residual like x and a norm weight [K], where given."""
    if not use_glue_kernels(x) or torch.is_grad_enabled() or torch.is_autocast_enabled(x.device.type):
        return False
    if res is not None and (res.shape != x.shape or res.dtype != x.dtype or res.device != x.device):
        return False
    if norm_weight is not None and (norm_weight.shape != x.shape[-1:] or not norm_weight.is_contiguous()
                                    or norm_weight.device != x.device):
        return False
    return 0 < x.numel() <= MAX_GEMV_ROWS * x.shape[-1] and _weights_fit(x, x.shape[-1], weights, biases)


def _weights_fit(x: torch.Tensor, k: int, weights: tuple, biases: tuple) -> bool:
    """One to `MAX_GEMV_WEIGHTS` contiguous weights [N, k] of one shape in x's dtype, on x's device; biases all
    present (contiguous [N] in that dtype, on that device) or all absent. Anything else goes to the unfused path,
    which raises the errors for bad input."""
    n = weights[0].shape[0]
    if len(weights) > MAX_GEMV_WEIGHTS or any(
            w.shape != (n, k) or w.dtype != x.dtype or w.device != x.device or not w.is_contiguous() for w in weights):
        return False
    return all(b is None for b in biases) or all(
        b is not None and b.shape == (n,) and b.dtype == x.dtype and b.device == x.device and b.is_contiguous()
        for b in biases)


def _rows(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.reshape(-1, t.shape[-1]).contiguous()


def _gemv(x: torch.Tensor, weights: tuple, biases: tuple, res: torch.Tensor | None = None,
          norm: tuple[torch.Tensor, float] | None = None) -> tuple[torch.Tensor, ...]:
    """The kernel's outputs shaped like x's leading dims (and r = x + res last, with res)."""
    from .triton.gemv import gemv

    gamma, eps = norm if norm is not None else (None, 0.0)
    ys = gemv(_rows(x), list(weights), [b for b in biases if b is not None], _rows(res), gamma, float(eps))
    return tuple(y.view(*x.shape[:-1], y.shape[-1]) for y in ys)


def _norm(x, res, norm_weight, eps, out_dtype):
    if res is None:
        return x, rms_norm(x, norm_weight, eps, out_dtype)
    return add_rms_norm(x, res, norm_weight, eps, out_dtype)


def rms_norm_linears(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weights: Iterable[torch.Tensor],
                     biases: Iterable[torch.Tensor | None] | None = None, *, res: torch.Tensor | None = None,
                     out_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """A pre-norm and the projections after it: (r, linears(rms_norm(r, norm_weight, eps, out_dtype), weights,
    biases)) with r = x + res, or x without res (`hgrn2.ops.norm.add_rms_norm`). In decoding, one kernel."""
    weights = tuple(weights)
    biases = tuple(biases) if biases is not None else (None,) * len(weights)
    if _use_gemv(x, weights, biases, res, norm_weight) and out_dtype in (None, x.dtype):
        out = _gemv(x, weights, biases, res, (norm_weight, eps))
        return (x, out) if res is None else (out[-1], out[:-1])
    r, h = _norm(x, res, norm_weight, eps, out_dtype)
    return r, linears(h, weights, biases)


def rms_norm_swiglu_mlp(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, gate: torch.Tensor,
                        up: torch.Tensor, down: torch.Tensor,
                        biases: tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None] = (None,) * 3,
                        *, res: torch.Tensor | None = None, out_dtype: torch.dtype | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """A pre-norm and the SwiGLU MLP after it: (r, down(silu(gate(h)) · up(h))) with h = rms_norm(r) and r = x + res
    (or x); weights gate, up [I, D], down [D, I] and their biases (or None). In decoding, two kernels."""
    bg, bu, bd = biases
    if (_use_gemv(x, (gate, up), (bg, bu), res, norm_weight) and out_dtype in (None, x.dtype)
            and _weights_fit(x, gate.shape[0], (down,), (bd,))):
        from .triton.gemv import gemv_swiglu

        out = gemv_swiglu(_rows(x), gate, up, [b for b in (bg, bu) if b is not None], _rows(res), norm_weight,
                          float(eps))
        y = _gemv(out[0], (down,), (bd,))[0].view(*x.shape[:-1], down.shape[0])
        return (x, y) if res is None else (out[1].view(x.shape), y)
    r, h = _norm(x, res, norm_weight, eps, out_dtype)
    g, u = linears(h, (gate, up), (bg, bu))
    return r, swiglu_linear(g, u, down, bd)


def linears(x: torch.Tensor, weights: Iterable[torch.Tensor],
            biases: Iterable[torch.Tensor | None] | None = None) -> tuple[torch.Tensor, ...]:
    """(F.linear(x, w, b) for each weight w [out_j, in] and bias b [out_j] or None): x [..., in] → the outputs
    [..., out_j], contiguous; differentiable in all of them."""
    weights = tuple(weights)
    biases = tuple(biases) if biases is not None else (None,) * len(weights)
    if not weights or len(biases) != len(weights):
        raise ValueError(f"`weights`, `biases`: expected one or more weights and as many biases (or None), got "
                         f"{len(weights)} and {len(biases)}")
    for j, (w, b) in enumerate(zip(weights, biases)):
        if w.ndim != 2 or w.shape[1] != x.shape[-1]:
            raise ValueError(f"`weights[{j}]`: expected [out, {x.shape[-1]}], got {tuple(w.shape)}")
        if w.dtype != weights[0].dtype:
            raise ValueError(f"`weights[{j}]`: expected weights[0]'s dtype {weights[0].dtype}, got {w.dtype}")
        if b is not None and b.shape != w.shape[:1]:
            raise ValueError(f"`biases[{j}]`: expected shape ({w.shape[0]},), got {tuple(b.shape)}")
    params = (*weights, *(b for b in biases if b is not None))
    if not (torch.is_grad_enabled() and any(t.requires_grad for t in (x, *params))):
        # no backward (decoding, evaluation): plain matmuls read each weight once, with no concatenated copy
        if _use_gemv(x, weights, biases):
            return _gemv(x, weights, biases)
        return tuple(F.linear(x, w, b) for w, b in zip(weights, biases))
    return _Linears.apply(x, len(weights), *weights, *biases)


def _bias_grad(dy2: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The sum of dy2 [N, C] over its rows, accumulated in fp32, as `dtype`. On CUDA a half-precision dy2 is summed
    by one matmul with a row of ones (fp32 output): a column reduction of a narrow dy2 (LRA's C = 64) reads it far
    below the copy rate."""
    if dy2.is_cuda and dy2.dtype in (torch.bfloat16, torch.float16):
        return torch.mm(dy2.new_ones(1, dy2.shape[0]), dy2, out_dtype=torch.float32)[0].to(dtype)
    return dy2.sum(0, dtype=torch.promote_types(dy2.dtype, torch.float32)).to(dtype)


class _Linears(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, n, *params):
        weights, biases = params[:n], params[n:]
        ctx.dtypes = [x.dtype, None] + [None if p is None else p.dtype for p in params]  # as the inputs
        ctx.sizes = [w.shape[0] for w in weights]
        # one cast of all the weights (and biases) into the autocast dtype, kept for the backward
        w = torch.cat(weights) if n > 1 else weights[0]
        b = None if all(t is None for t in biases) else torch.cat(
            [t if t is not None else w.new_zeros(m) for t, m in zip(biases, ctx.sizes)])
        dev = x.device.type
        if torch.is_autocast_enabled(dev):
            dt = torch.get_autocast_dtype(dev)
            x, w, b = x.to(dt), w.to(dt), None if b is None else b.to(dt)
        ws, bs = w.split(ctx.sizes), (None,) * n if b is None else b.split(ctx.sizes)
        ys = tuple(F.linear(x, wj, bj) for wj, bj in zip(ws, bs))  # operands in one dtype: autocast leaves them
        ctx.save_for_backward(x, w)
        ctx.has_bias = [t is not None for t in biases]
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None
        return ys

    @staticmethod
    def backward(ctx, *dys):
        x, w = ctx.saved_tensors
        need, n, sizes = ctx.needs_input_grad, len(ctx.sizes), ctx.sizes
        x2 = x.reshape(-1, x.shape[-1])
        dx, dbs = None, [None] * n
        dw = w.new_empty(w.shape) if any(need[2:2 + n]) else None  # every weight's gradient, then one cast
        dw_rows = dw.split(sizes) if dw is not None else (None,) * n
        for j, (dy, wj, dwj) in enumerate(zip(dys, w.split(sizes), dw_rows)):
            if dy is None:
                continue
            dy2 = dy.reshape(-1, dy.shape[-1])
            if need[0]:
                dx = dy2 @ wj if dx is None else dx.addmm_(dy2, wj)
            if need[2 + j]:
                torch.mm(dy2.t(), x2, out=dwj)
            if ctx.has_bias[j] and need[2 + n + j]:
                dbs[j] = _bias_grad(dy2, ctx.dtypes[2 + n + j])
        dws = [None] * n
        if dw is not None:
            dw = dw.to(ctx.dtypes[2])  # the weights share a dtype (they were concatenated)
            dws = [d if dy is not None and need[2 + j] else None
                   for j, (d, dy) in enumerate(zip(dw.split(sizes), dys))]
        if dx is not None:
            dx = dx.view(x.shape).to(ctx.dtypes[0])
        return dx, None, *dws, *dbs
