"""The HGRN2 forget gate with its lower bound, in log space.

    f     = β + (1 − β)·σ(g)
    log f = logaddexp(log β, log(1 − β) + logsigmoid(g))
    1 − f = (1 − β)·σ(−g)

`1 − f` is computed directly rather than as `1 − exp(log f)`, which cancels catastrophically when f → 1.
Every torch backend goes through these two functions, so the gate is defined in exactly one place.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

ACTIVATIONS = (None, "silu", "sigmoid")


def activate(x: torch.Tensor, act: str | None) -> torch.Tensor:
    """Apply one of `ACTIVATIONS` (None is the identity)."""
    if act is None:
        return x
    if act == "silu":
        return F.silu(x)
    if act == "sigmoid":
        return torch.sigmoid(x)
    raise ValueError(f"activation must be one of {ACTIVATIONS}, got {act!r}")


def log_forget(g: torch.Tensor, lower_bound: torch.Tensor | None) -> torch.Tensor:
    """log f for logits `g` [..., H, K] and bound `lower_bound` [H, K] (or None for β = 0)."""
    if lower_bound is None:
        return F.logsigmoid(g)
    return _LogForget.apply(g, lower_bound.to(torch.promote_types(g.dtype, lower_bound.dtype)))


class _LogForget(torch.autograd.Function):
    """log f with its derivatives in closed form: ∂/∂g = σ(−g)·(1 − β)σ(g)/f and ∂/∂β = σ(−g)/f.

    Autograd through logaddexp would form ∂/∂β as 1/f − σ(g)/f (cancelling when f → 1) and lose the log β branch
    entirely where β is floored for the log (β = 0 exactly).
    """

    @staticmethod
    def forward(ctx, g, beta):
        log_sig = F.logsigmoid(g)
        # β is floored at the dtype's tiny before the log: log(0) = −inf stays out of every intermediate.
        log_beta = torch.log(beta.clamp_min(torch.finfo(beta.dtype).tiny))
        out = torch.logaddexp(log_beta, torch.log1p(-beta) + log_sig)
        ctx.save_for_backward(g, beta, out)
        return out

    @staticmethod
    def backward(ctx, d):
        g, beta, out = ctx.saved_tensors
        log_sig_neg = F.logsigmoid(-g)
        dg = d * log_sig_neg.exp() * (torch.log1p(-beta) + F.logsigmoid(g) - out).exp()
        # d·σ(−g)/f through logs: d carries a factor f, so the product is finite where 1/f alone overflows.
        dbeta = d.sign() * (d.abs().log() + log_sig_neg - out).exp()
        return dg, dbeta.sum_to_size(beta.shape)


def one_minus_forget(g: torch.Tensor, lower_bound: torch.Tensor | None) -> torch.Tensor:
    """1 − f = (1 − β)·σ(−g), free of cancellation as f → 1."""
    # exp(logsigmoid) rather than sigmoid: sigmoid's backward, σ(1 − σ), is 0 in fp32 once σ(−g) rounds to 1
    # (g < −17), while this one keeps the derivative's relative accuracy for saturated gates.
    k = F.logsigmoid(-g).exp()
    if lower_bound is None:
        return k
    return (1 - lower_bound.to(k.dtype)) * k


def check_min_log_forget(min_log_forget: float) -> None:
    if not min_log_forget < 0:
        raise ValueError(f"`min_log_forget`: expected a negative number, got {min_log_forget!r}")


def clamp_forget_logits(g: torch.Tensor, lower_bound: torch.Tensor | None, min_log_forget: float) -> torch.Tensor:
    """Logits `g` [..., H, K] raised where needed so that log f ≥ `min_log_forget` (< 0) for bound [H, K] or None.

    The HGRN2 authors' code (hgru's SHgruV44 over its GLA kernels, the paper's MQAR runs) clamps each token's log
    decay at −3 and zeroes the decay's gradient there; their k = 1 − λ stays unclamped, which this clamp of the
    logit cannot reproduce (their k is up to 1 − e^m larger where the clamp acts: 5% at m = −3). Below the clamp
    the gradient of g is 0 (torch.clamp).
    """
    check_min_log_forget(min_log_forget)
    floor = math.exp(min_log_forget)  # the smallest f allowed
    if lower_bound is None:  # a Python number: no host-to-device copy (CUDA-graph capture)
        return g.clamp(min=min_log_forget - math.log1p(-floor))  # logit(e^m)
    # f = β + (1 − β)σ(g) ≥ e^m  ⇔  σ(g) ≥ s = (e^m − β)/(1 − β); where β ≥ e^m every g passes
    beta = lower_bound.to(torch.promote_types(lower_bound.dtype, torch.float32))
    s = (floor - beta) / (1 - beta)
    g_min = torch.where(s > 0, torch.logit(s.clamp(1e-30, 1 - 1e-7)), -torch.inf)
    return torch.maximum(g, g_min.to(dtype=g.dtype))


def lower_bounds_from_logits(gamma: torch.Tensor) -> torch.Tensor:
    """The paper's cumax: Γ [L, D] → β [L, D], β = cumsum(softmax(Γ, 0), 0) − that of layer 0.

    Layer 0 gets bound 0 and bounds rise monotonically with depth, staying below 1. Computed in float32 at least,
    and in float64 for a float64 Γ.
    """
    p = gamma.to(torch.promote_types(gamma.dtype, torch.float32)).softmax(dim=0)
    c = p.cumsum(dim=0)
    # 1 − p0 rounds to exactly 1 once p0 is below the dtype's half-ulp at 1; the ops take β < 1 only.
    return (c - c[0]).clamp(max=1 - torch.finfo(p.dtype).eps / 2)


def layer_bounds(betas: torch.Tensor | None, num_layers: int) -> list[torch.Tensor | None]:
    """The bound each layer hands its mixer from β [L, D] (or None: no bounds): None for layer 0, whose bound is
    exactly 0 (as a bound that needs a gradient it would take the Triton backward's small-bound recompute for
    nothing), the rows of β for the others (`unbind`: its backward stacks the rows in one kernel, where indexing
    would take a zero-filled [L, D] tensor, a copy and an add per layer)."""
    if betas is None:
        return [None] * num_layers
    return [None, *betas.unbind(0)[1:]]
