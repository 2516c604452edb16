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
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F


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
        return tuple(F.linear(x, w, b) for w, b in zip(weights, biases))
    return _Linears.apply(x, len(weights), *weights, *biases)


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
                dbs[j] = dy2.sum(0, dtype=torch.promote_types(dy2.dtype, torch.float32)).to(ctx.dtypes[2 + n + j])
        dws = [None] * n
        if dw is not None:
            dw = dw.to(ctx.dtypes[2])  # the weights share a dtype (they were concatenated)
            dws = [d if dy is not None and need[2 + j] else None
                   for j, (d, dy) in enumerate(zip(dw.split(sizes), dys))]
        if dx is not None:
            dx = dx.view(x.shape).to(ctx.dtypes[0])
        return dx, None, *dws, *dbs
