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

CHUNK = 64  # most tokens per chunk: the state recurrence runs T / CHUNK sequential steps
SUB = 8  # tokens per sub-block: the diagonal blocks cost SUB·SUB·K per token-head


def hgrn2_chunk(o: torch.Tensor, g: torch.Tensor, i: torch.Tensor, lower_bound: torch.Tensor | None = None, *,
                scale: float = 1.0, o_act: str | None = None, i_act: str | None = None,
                initial_state: torch.Tensor | None = None, output_final_state: bool = False,
                cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
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
    T = q.shape[1]
    size = _chunk_size(T)
    y, s = _Chunked.apply(*(_to_chunks(x, size) for x in (q, logf, k, v)), h0)
    return _from_chunks(y, T), s


def _chunk_size(T: int) -> int:
    """CHUNK tokens, or fewer for a shorter sequence: whole sub-blocks, so that padding adds less than SUB tokens."""
    return min(CHUNK, -(-T // SUB) * SUB)


def _to_chunks(x, size):
    """[B, T, H, D] → [B, H, N, C, D], padded with zeros: such tokens have f = 1 (log f = 0) and k = v = q = 0, so they
    leave the state alone and write nothing."""
    B, T, H, D = x.shape
    x = F.pad(x, (0, 0, 0, 0, 0, (-T) % size))
    return x.view(B, -1, size, H, D).permute(0, 3, 1, 2, 4)


def _from_chunks(x, T):
    B, H, N, C, D = x.shape
    return x.permute(0, 2, 3, 1, 4).reshape(B, N * C, H, D)[:, :T]


class _Chunked(torch.autograd.Function):
    """The chunked recurrence; q, k, v and h0 get autograd's gradients of a recomputed forward, log f gets a sum
    over only the pairs (s < t ≤ r) whose decay holds f_t.

    ∂L/∂log f_t is f_t·∂L/∂f_t, tiny where the gate is closed. The usual form, a reverse cumulative sum over t of
    per-token terms, reaches it by cancelling O(1) terms and leaves an absolute error of rounding size, which the
    chain rule to β and g then divides by f_t. Summing only the pairs that straddle t makes every term carry f_t.
    """

    @staticmethod
    def forward(ctx, q, logf, k, v, h0):
        # The forward's own graph over detached copies of q, k, v, h0 (log f held constant) gives their gradients
        # in the backward without a recomputation.
        leaves = [x.detach().requires_grad_(ctx.needs_input_grad[n]) if x is not None else None
                  for n, x in zip((0, 2, 3, 4), (q, k, v, h0))]
        with torch.enable_grad():
            y, s, starts = _forward(leaves[0], logf.detach(), *leaves[1:])
        ctx.graph = (y, s, leaves)
        ctx.save_for_backward(q, logf, k, v, starts.detach())
        return y.detach(), s.detach()

    @staticmethod
    def backward(ctx, dy, ds):
        q, logf, k, v, starts = ctx.saved_tensors
        y, s, leaves = ctx.graph
        wrt = [x for x in leaves if x is not None and x.requires_grad]
        if wrt and (y.grad_fn is None or s.grad_fn is None):  # a traced forward (torch.compile) keeps no graph
            leaves = [x.detach().requires_grad_(x.requires_grad) if x is not None else None for x in leaves]
            wrt = [x for x in leaves if x is not None and x.requires_grad]
            with torch.enable_grad():
                y, s, _ = _forward(leaves[0], logf.detach(), *leaves[1:])
        outs = [(t, d) for t, d in ((y, dy), (s, ds)) if t.grad_fn is not None]
        # retained: a backward may run twice over one graph (retain_graph=True); freed with the outer graph
        grads = iter(torch.autograd.grad([t for t, _ in outs], wrt, [d for _, d in outs], allow_unused=True,
                                         retain_graph=True) if wrt else ())
        dq, dk, dv, dh0 = (next(grads) if x is not None and x.requires_grad else None for x in leaves)
        dlogf = _dlogf(q, logf, k, v, dy, starts, ds) if ctx.needs_input_grad[1] else None
        return dq, dlogf, dk, dv, dh0


def _forward(q, logf, k, v, h0):
    """[B, H, N, C, ·] chunks → y [B, H, N, C, V], final state [B, H, V, K], chunk start states [B, H, N, K, V]."""
    B, H, N, _, K = q.shape
    b = logf.cumsum(dim=3)
    y = _intra(q, k, v, logf)
    b_last = b[..., -1:, :]  # [B, H, N, 1, K]
    u = (k * _suffix_sum(logf).exp()).transpose(-1, -2) @ v  # [B, H, N, K, V]: chunk's own contribution to S
    decay = b_last.exp().transpose(-1, -2)  # [B, H, N, K, 1]
    s = q.new_zeros(B, H, K, v.shape[-1]) if h0 is None else h0.transpose(-1, -2)
    starts = []
    for n in range(N):
        starts.append(s)
        s = decay[:, :, n] * s + u[:, :, n]
    starts = torch.stack(starts, dim=2)
    return y + (q * b.exp()) @ starts, s.transpose(-1, -2), starts


def _dlogf(q, logf, k, v, dy, starts, ds):
    """∂L/∂log f_t [B, H, N, C, K] as Σ over pairs (source s < t ≤ reader r), the chunk start state counting as a
    source before every token and the gradient of the chunk's end state as a reader after every token."""
    b = logf.cumsum(dim=3)
    b_last = b[..., -1:, :]
    # Gradient of each chunk's end state: that of the next chunk's start, the last one's from the final state.
    ends = torch.empty_like(starts)
    g = ds.transpose(-1, -2)
    decay, reads = b_last.exp().transpose(-1, -2), (q * b.exp()).transpose(-1, -2) @ dy  # [B, H, N, K, ·]
    for n in reversed(range(q.shape[2])):
        ends[:, :, n] = g
        g = decay[:, :, n] * g + reads[:, :, n]
    readers = q * b.exp() * (dy @ starts.transpose(-1, -2))  # start state → token r: holds f_t for t ≤ r
    sources = k * _suffix_sum(logf).exp() * (v @ ends.transpose(-1, -2))  # token s → end state: holds f_t for t > s
    d = readers.flip(3).cumsum(3).flip(3) + _exclusive_cumsum(sources)
    d = d + b_last.exp() * (starts * ends).sum(-1)[..., None, :]  # start state → end state
    return d + _intra_dlogf(q, k, logf, dy @ v.transpose(-1, -2))


def _intra_dlogf(q, k, logf, w):
    """Pairs inside a chunk: Σ_{s<t≤r} q_r k_s e^{b_r − b_s} w_rs with w = dy·vᵀ ([B, H, N, C, C]) → [B, H, N, C, K].

    Per sub-block I holding t: pairs inside I element-wise; pairs with one end in I and the other before or after
    it as matrix products factorised at I's edges (every factor ≤ 1); pairs spanning I as one product.
    """
    C, out = q.shape[-2], []
    for start in range(0, C, SUB):
        end = start + SUB
        qi, ki, li = q[..., start:end, :], k[..., start:end, :], logf[..., start:end, :]
        d = _sub_block_dlogf(qi, ki, li, w[..., start:end, start:end])
        if start > 0:  # sources before I: e^{b_s → start of I} for them, e^{start of I → b_r} for readers in I
            k_before = k[..., :start, :] * _suffix_sum(logf[..., :start, :]).exp()
            readers = qi * li.cumsum(-2).exp() * (w[..., start:end, :start] @ k_before)
            d = d + readers.flip(-2).cumsum(-2).flip(-2)  # Σ_{r ≥ t in I}
        if end < C:  # readers after I
            q_after = q[..., end:, :] * logf[..., end:, :].cumsum(-2).exp()
            sources = ki * _suffix_sum(li).exp() * (w[..., end:, start:end].transpose(-1, -2) @ q_after)
            d = d + _exclusive_cumsum(sources)  # Σ_{s < t in I}
            if start > 0:  # sources before I, readers after it: the decay spans all of I
                d = d + li.sum(-2, keepdim=True).exp() * (q_after * (w[..., end:, :start] @ k_before)).sum(
                    -2, keepdim=True)
        out.append(d)
    return torch.cat(out, dim=-2)


def _sub_block_dlogf(q, k, logf, w):
    """Σ_{s<t≤r} over pairs inside one sub-block, element-wise ([..., S, K] tensors, w [..., S, S])."""
    n = q.shape[-2]
    strict = _lower(n, q.device, -1)[:, :, None]  # [r, s, 1]: s < r
    # b_r − b_s as a sum from s on, not a difference of two sums from the chunk start (which cancel when both are
    # large, leaving an error of rounding relative to them in the exponent)
    # (0 on and above the diagonal, where `strict` drops the pair whatever its value)
    diff = torch.where(strict, logf[..., :, None, :], 0).cumsum(-3)
    pairs = torch.where(strict, q[..., :, None, :] * k[..., None, :, :] * diff.exp() * w[..., None], 0)
    before = _exclusive_cumsum(pairs)  # [r, t]: Σ_{s<t} pairs[r, s]
    return torch.where(_lower(n, q.device)[:, :, None], before, 0).sum(-3)  # Σ_{r≥t}


def _suffix_sum(x):
    """Σ of the entries after each position along dim −2 (e.g. b_end − b_s from log f, without cancellation)."""
    return _exclusive_cumsum(x.flip(-2)).flip(-2)


def _exclusive_cumsum(x):
    """Σ of the entries strictly before each position along dim −2 (no subtraction, so no cancellation)."""
    return F.pad(x[..., :-1, :].cumsum(-2), (0, 0, 1, 0))


def _intra(q, k, v, logf):
    """Σ_{s≤t in chunk} (q_t ⊙ e^{b_t − b_s}) · k_s  v_s for [B, H, N, C, ·] inputs → [B, H, N, C, V].

    Every exponent is a sum of log f over the tokens it spans, never a difference of two sums from the chunk start
    (those cancel when both are large and leave an error of rounding relative to them). No product pairs a
    position with a later one, not even by a zero weight: 0·inf = NaN would carry a bad value at s back to every
    t < s (an output may depend only on inputs at or before its position).
    """
    lower = _lower(SUB, q.device)[:, :, None]
    strict = _lower(SUB, q.device, -1)[:, :, None]
    rows = []
    for i in range(q.shape[-2] // SUB):
        blk = slice(i * SUB, (i + 1) * SUB)
        qi, li = q[..., blk, :], logf[..., blk, :]
        # Diagonal sub-block, exact: e^{Σ_{s<u≤t} log f_u}, the exponent 0 above the diagonal, which `lower` drops.
        diff = torch.where(strict, li[..., :, None, :], 0).cumsum(-3)
        diag = torch.einsum("...tk,...sk,...tsk->...ts", qi, k[..., blk, :], diff.exp())
        y = torch.where(lower, diag[..., None] * v[..., None, blk, :], 0).sum(-2)
        if i > 0:  # earlier sub-blocks, factorised at the end of the previous one: both factors ≤ 1
            before = slice(0, i * SUB)
            k_before = k[..., before, :] * _suffix_sum(logf[..., before, :]).exp()
            y = y + ((qi * li.cumsum(-2).exp()) @ k_before.transpose(-1, -2)) @ v[..., before, :]
        rows.append(y)
    return torch.cat(rows, dim=-2)


def _lower(n: int, device, diagonal: int = 0) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool, device=device).tril(diagonal)
