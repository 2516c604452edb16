"""Chunkwise-parallel HGRN2 in PyTorch: the fast path on the CPU and the portable fallback on any device.

Per head, with chunks of C tokens and b_t = Σ_{s≤t} log f_s inside the chunk (b is non-increasing):

    y_t = Σ_{s≤t in chunk} (q_t ⊙ e^{b_t − b_s}) · k_s  v_s   +   (q_t ⊙ e^{b_t}) · S      (q = scale·o, k = 1 − f)
    S  ← Diag(e^{b_C}) S + Σ_s (k_s ⊙ e^{b_C − b_s})ᵀ v_s

Every exponent used is ≤ 0, so nothing overflows whatever the gates. Inside a chunk, the pair (t, s) with t in
sub-block i and s in an earlier sub-block is factorised around r = b at the end of sub-block i − 1:
e^{b_t − b_s} = e^{b_t − r} · e^{r − b_s}, both factors ≤ 1 (an underflowing factor means a negligible term).
Pairs inside one sub-block (the diagonal) are computed element-wise and exactly.
Autograd differentiates all of it; computation is in float32 (float64 for float64 inputs).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .gates import activate, log_forget, one_minus_forget

CHUNK = 64  # tokens per chunk: the state recurrence runs T / CHUNK sequential steps
SUB = 16  # tokens per sub-block: the diagonal blocks cost SUB·SUB·K per token-head


def hgrn2_chunk(o, g, i, lower_bound=None, *, scale=1.0, o_act=None, i_act=None, initial_state=None,
                output_final_state=False, cu_seqlens=None):
    """Same contract as `hgrn2.ops.hgrn2` (shapes there)."""
    if cu_seqlens is not None:
        return _packed(o, g, i, lower_bound, scale=scale, o_act=o_act, i_act=i_act, initial_state=initial_state,
                       output_final_state=output_final_state, cu_seqlens=cu_seqlens)
    dt = torch.promote_types(o.dtype, torch.float32)
    q = activate(o.to(dt), o_act) * scale
    v = activate(i.to(dt), i_act)
    gd = g.to(dt)
    lb = None if lower_bound is None else lower_bound.to(dt)
    y, final = _chunked(q, log_forget(gd, lb), one_minus_forget(gd, lb), v,
                        None if initial_state is None else initial_state.to(dt))
    return y.to(i.dtype), (final.float() if dt == torch.float32 else final) if output_final_state else None


def _packed(o, g, i, lower_bound, *, initial_state, cu_seqlens, output_final_state, **kw):
    """Packed sequences: run each on its own (the torch path's varlen is a loop; the Triton kernel fuses it)."""
    c = cu_seqlens.tolist()
    ys, finals = [], []
    for n in range(len(c) - 1):
        sl = slice(c[n], c[n + 1])
        h0 = None if initial_state is None else initial_state[n : n + 1]
        y, h = hgrn2_chunk(o[:, sl], g[:, sl], i[:, sl], lower_bound, initial_state=h0, output_final_state=True, **kw)
        ys.append(y)
        finals.append(h)
    return torch.cat(ys, dim=1), (torch.cat(finals) if output_final_state else None)


def _chunked(q, logf, k, v, h0):
    """q, logf, k: [B, T, H, K]; v: [B, T, H, V]; h0: [B, H, V, K] or None → y [B, T, H, V], state [B, H, V, K]."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    pad = (-T) % CHUNK
    # Padding tokens have f = 1 (log f = 0) and k = v = q = 0: they leave the state alone and write nothing.
    q, logf, k, v = (F.pad(x, (0, 0, 0, 0, 0, pad)) for x in (q, logf, k, v))
    N = (T + pad) // CHUNK
    # [B, T, H, D] -> [B, H, N, C, D]
    q, logf, k, v = (x.view(B, N, CHUNK, H, -1).permute(0, 3, 1, 2, 4) for x in (q, logf, k, v))
    b = logf.cumsum(dim=3)

    y = _intra(q, k, v, b)

    b_last = b[..., -1:, :]  # [B, H, N, 1, K]
    u = (k * (b_last - b).exp()).transpose(-1, -2) @ v  # [B, H, N, K, V]: chunk's own contribution to S
    decay = b_last.exp().transpose(-1, -2)  # [B, H, N, K, 1]
    s = q.new_zeros(B, H, K, V) if h0 is None else h0.transpose(-1, -2)
    starts = []
    for n in range(N):
        starts.append(s)
        s = decay[:, :, n] * s + u[:, :, n]
    y = y + (q * b.exp()) @ torch.stack(starts, dim=2)
    y = y.permute(0, 2, 3, 1, 4).reshape(B, N * CHUNK, H, V)[:, :T]
    return y, s.transpose(-1, -2)


def _intra(q, k, v, b):
    """Σ_{s≤t in chunk} (q_t ⊙ e^{b_t − b_s}) · k_s  v_s for [B, H, N, C, ·] inputs → [B, H, N, C, V]."""
    rows = []
    for i in range(CHUNK // SUB):
        blk = slice(i * SUB, (i + 1) * SUB)
        qi, bi = q[..., blk, :], b[..., blk, :]
        # Diagonal sub-block, exact: e^{b_t − b_s} with the exponent masked to −inf above the diagonal first.
        diff = bi[..., :, None, :] - bi[..., None, :, :]  # [..., SUB, SUB, K]
        diff = diff.masked_fill(~_lower(SUB, q.device)[:, :, None], float("-inf"))
        diag = torch.einsum("...tk,...sk,...tsk->...ts", qi, k[..., blk, :], diff.exp())
        parts = [diag]
        if i > 0:
            r = b[..., i * SUB - 1 : i * SUB, :]  # b at the end of the previous sub-block
            before = slice(0, i * SUB)
            k_before = k[..., before, :] * (r - b[..., before, :]).exp()
            parts.insert(0, (qi * (bi - r).exp()) @ k_before.transpose(-1, -2))
        if i < CHUNK // SUB - 1:
            parts.append(qi.new_zeros(*qi.shape[:-1], CHUNK - (i + 1) * SUB))
        rows.append(torch.cat(parts, dim=-1))
    return torch.cat(rows, dim=-2) @ v


def _lower(n: int, device) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()
