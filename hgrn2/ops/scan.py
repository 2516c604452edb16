"""HGRN1's element-wise recurrence as a chunked linear scan in PyTorch (the "scan" backend; CPU and GPU).

    h_t = a_t ⊙ h_{t-1} + u_t,   a_t = f_t·e^{iθ} (|a_t| ≤ 1),   u_t = (1 − f_t) ⊙ i_t

The scan runs in float32 (float64 for float64 inputs, complex for the complex HGRU) with a square-root split
of time: T tokens become ~√T chunks of ~√T tokens. One loop walks the positions of every chunk at once from
a zero state, a second loop carries the state across chunk ends, and one element-wise fix-up adds A_t·carry
(A_t = Π a within the chunk, a cumulative product). That is ~2√T small steps instead of T, only products of gates
of modulus ≤ 1 (no exponent of a positive number, so nothing overflows for any gate or length), and two
passes over memory.

Autograd: `LinearScan` saves (a, h) and its backward is the same scan run backwards in time,
δ_t = ∂h_t + conj(a_{t+1})·δ_{t+1},  ∂u_t = δ_t,  ∂a_t = δ_t·conj(h_{t-1});
because the backward calls `LinearScan` itself, higher derivatives work too. Gate math (log f, 1 − f) comes
from `gates.py`; the initial state enters as u_0 += a_0·h_init, and packed sequences (`cu_seqlens`) reset the
carry by zeroing a at each sequence start.
"""

from __future__ import annotations

import math

import torch

from .gates import log_forget, one_minus_forget


def _scan(a: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """h_t = a_t·h_{t-1} + u_t with h_{-1} = 0, without autograd. a, u: [B, T, D] of one dtype → h [B, T, D]."""
    B, T, D = u.shape
    C = math.isqrt(T - 1) + 1  # chunk length ⌈√T⌉
    n = -(-T // C)  # number of chunks
    pad = n * C - T
    if pad:  # a = 1, u = 0 after the end leaves every real position unchanged
        a = torch.cat([a, a.new_ones(B, pad, D)], 1)
        u = torch.cat([u, u.new_zeros(B, pad, D)], 1)
    a, u = a.view(B, n, C, D), u.view(B, n, C, D)
    h = torch.empty_like(u)
    h[:, :, 0] = u[:, :, 0]
    for t in range(1, C):  # all chunks in parallel, starting from a zero state
        h[:, :, t] = torch.addcmul(u[:, :, t], a[:, :, t], h[:, :, t - 1])
    A = a.cumprod(2)  # products of moduli ≤ 1: they may underflow to 0, which is the right limit
    carry = torch.zeros_like(h[:, :, 0])  # carry[:, c] = true state just before chunk c
    for c in range(1, n):
        carry[:, c] = torch.addcmul(h[:, c - 1, -1], A[:, c - 1, -1], carry[:, c - 1])
    h.addcmul_(A, carry[:, :, None])
    return h.view(B, n * C, D)[:, :T]


class LinearScan(torch.autograd.Function):
    """Differentiable h = scan(a, u) for real or complex a, u [B, T, D] (same dtype)."""

    @staticmethod
    def forward(ctx, a, u):
        h = _scan(a, u)
        ctx.save_for_backward(a, h)
        return h

    @staticmethod
    def backward(ctx, dh):
        a, h = ctx.saved_tensors
        # δ_t = dh_t + conj(a_{t+1})·δ_{t+1}: a forward scan on time-reversed inputs with coefficients shifted by one.
        a_next = torch.cat([a[:, 1:], torch.zeros_like(a[:, :1])], 1).conj()
        delta = LinearScan.apply(a_next.flip(1), dh.flip(1)).flip(1)
        h_prev = torch.cat([torch.zeros_like(h[:, :1]), h[:, :-1]], 1)
        return delta * h_prev.conj(), delta


def hgrn1_scan(i: torch.Tensor, g: torch.Tensor, lower_bound: torch.Tensor | None = None, *,
               theta: torch.Tensor | None = None, initial_state: torch.Tensor | None = None,
               output_final_state: bool = False,
               cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """HGRN1's recurrence h_t = f_t ⊙ e^{iθ} ⊙ h_{t-1} + (1 − f_t) ⊙ i_t by a chunked scan.

    i, g: [B, T, D] (i complex when `theta` is given); lower_bound: [D] or None; theta: [D] or None;
    initial_state: [N, D] (N = B, or the number of packed sequences with `cu_seqlens` [N + 1]).
    Returns h [B, T, D] in i's dtype and the final state [N, D] (float32/float64, complex for complex i) or None.
    Arguments are validated by `hgrn2.ops.hgrn1`.
    """
    dt = torch.promote_types(g.dtype, torch.float32)
    gd = g.to(dt)
    lb = None if lower_bound is None else lower_bound.to(dt)
    a = log_forget(gd, lb).exp()
    x = i.to(torch.promote_types(i.dtype, dt))
    u = one_minus_forget(gd, lb) * x
    if theta is not None:
        a = a * torch.polar(torch.ones_like(theta, dtype=dt), theta.to(dt))
    a = a.to(x.dtype)

    if cu_seqlens is None:
        if initial_state is not None:
            u = torch.cat([u[:, :1] + a[:, :1] * initial_state.to(x.dtype)[:, None], u[:, 1:]], 1)
        h = LinearScan.apply(a, u)
        final = h[:, -1] if output_final_state else None
    else:
        starts, ends = cu_seqlens[:-1].long(), cu_seqlens[1:].long() - 1
        first = torch.zeros(i.shape[1], dtype=torch.bool, device=i.device).index_fill(0, starts, True)
        if initial_state is not None:  # scatter each sequence's state onto its first position
            h0 = x.new_zeros(i.shape[1:]).index_put((starts,), initial_state.to(x.dtype))
            u = u + a * h0
        a = a.masked_fill(first[None, :, None], 0)  # no carry across sequence boundaries
        h = LinearScan.apply(a, u)
        final = h[0, ends] if output_final_state else None
    return h.to(i.dtype), final
