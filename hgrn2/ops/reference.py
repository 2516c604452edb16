"""Step-by-step reference recurrences: the oracle every fast path is tested against.

Computes in float32, or float64 when given float64 inputs (then it is the fp64 reference). Also serves as the
torch decoding path for a handful of tokens. Differentiable by autograd (no in-place writes).
"""

from __future__ import annotations

import torch

from .gates import activate, log_forget, one_minus_forget


def segments(batch: int, seq_len: int, cu_seqlens: torch.Tensor | None) -> list[tuple[int, int, int]]:
    """(batch row, start, end) for each sequence: the rows of a padded batch, or the pieces of a packed one."""
    if cu_seqlens is None:
        return [(b, 0, seq_len) for b in range(batch)]
    c = cu_seqlens.tolist()
    return [(0, c[n], c[n + 1]) for n in range(len(c) - 1)]


def hgrn2_reference(o: torch.Tensor, g: torch.Tensor, i: torch.Tensor, lower_bound: torch.Tensor | None = None, *,
                    scale: float = 1.0, o_act: str | None = None, i_act: str | None = None,
                    initial_state: torch.Tensor | None = None, output_final_state: bool = False,
                    cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """HGRN2 by its definition, one token at a time.

    o, g: [B, T, H, K]; i: [B, T, H, V]; lower_bound: [H, K] or None; initial_state: [N, H, V, K] or None,
    N = B (or the number of packed sequences). Returns y [B, T, H, V] in i's dtype and the final state
    [N, H, V, K] (float32, or float64 for float64 inputs) or None.

        h_t = h_{t-1}·Diag(f_t) + i_t ⊗ (1 − f_t),   y_t = scale · h_t·o_t
    """
    B, T, H, K = o.shape
    V = i.shape[-1]
    dt = torch.promote_types(o.dtype, torch.float32)
    q = activate(o.to(dt), o_act) * scale
    v = activate(i.to(dt), i_act)
    gd = g.to(dt)
    lb = None if lower_bound is None else lower_bound.to(dt)
    f = log_forget(gd, lb).exp()
    k = one_minus_forget(gd, lb)

    pieces, finals = [], []
    for n, (b, s, e) in enumerate(segments(B, T, cu_seqlens)):
        h = o.new_zeros(H, V, K, dtype=dt) if initial_state is None else initial_state[n].to(dt)
        ys = []
        for t in range(s, e):
            h = h * f[b, t, :, None, :] + v[b, t, :, :, None] * k[b, t, :, None, :]
            ys.append(torch.einsum("hvk,hk->hv", h, q[b, t]))
        pieces.append(torch.stack(ys))
        finals.append(h)
    if cu_seqlens is None:
        y = torch.stack(pieces)
    else:
        y = torch.cat(pieces)[None]
    return y.to(i.dtype), (torch.stack(finals) if output_final_state else None)


def hgrn1_reference(i: torch.Tensor, g: torch.Tensor, lower_bound: torch.Tensor | None = None, *,
                    theta: torch.Tensor | None = None, initial_state: torch.Tensor | None = None,
                    output_final_state: bool = False, cu_seqlens: torch.Tensor | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """HGRN1's element-wise recurrence, one token at a time.

    i, g: [B, T, D] (i complex when `theta` is given); lower_bound: [D] or None; theta: [D] rotation angles
    or None; initial_state: [N, D]. Returns h [B, T, D] in i's dtype and the final state [N, D] or None.

        h_t = f_t ⊙ e^{iθ} ⊙ h_{t-1} + (1 − f_t) ⊙ i_t
    """
    B, T, D = i.shape
    dt = torch.promote_types(g.dtype, torch.float32)
    gd = g.to(dt)
    lb = None if lower_bound is None else lower_bound.to(dt)
    f = log_forget(gd, lb).exp()
    k = one_minus_forget(gd, lb)
    x = i.to(torch.promote_types(i.dtype, dt))
    if theta is not None:
        f = f * torch.polar(torch.ones_like(theta, dtype=dt), theta.to(dt))

    pieces, finals = [], []
    for n, (b, s, e) in enumerate(segments(B, T, cu_seqlens)):
        h = x.new_zeros(D) if initial_state is None else initial_state[n].to(x.dtype)
        hs = []
        for t in range(s, e):
            h = f[b, t] * h + k[b, t] * x[b, t]
            hs.append(h)
        pieces.append(torch.stack(hs))
        finals.append(h)
    y = torch.stack(pieces) if cu_seqlens is None else torch.cat(pieces)[None]
    return y.to(i.dtype), (torch.stack(finals) if output_final_state else None)
