"""HGRN2 with small heads (K, V ≤ 8) in Triton: the [V, K] state of each head in registers, one kernel per pass.

    f_t = β + (1 − β)σ(g_t),   h_t[v, k] = f_t[k]·h_{t−1}[v, k] + (1 − f_t[k])·i_t[v],
    y_t[v] = scale·Σ_k h_t[v, k]·a_t[k]

with a = act(o) and 1 − f = (1 − β)σ(−g) (exact as g → +∞). Each program owns one batch row, a block of BH heads and
one scan direction, and walks the sequence with the state as a [BH, VP, KP] tile (VP, KP the next powers of two of
V, K): a whole small head per tile, so every reduction (over k for y and di, over v for da and df) stays inside
the program. `bidirectional` runs the forward and the reverse scan of the same inputs as the two halves of one
grid and sums their outputs, so a bidirectional model needs neither flipped copies nor a second launch.

The forward keeps every state h_t (fp32, [dirs, B, T, H, V, K]) when a gradient is needed; the backward walks
the opposite way with the state's gradient d (carried as f_{t+1}·d_{t+1}):

    d_t = f_{t+1}·d_{t+1} + scale·dy_t ⊗ a_t,   da_t = scale·Σ_v dy_t[v]·h_t[v, :],   di_t = Σ_k d_t[:, k]·(1 − f_t[k]),
    df_t = Σ_v d_t[v, :]·(h_{t−1}[v, :] − i_t[v]),   dg_t = df_t·(1 − β)σ(g)σ(−g),   dβ = Σ_t df_t·σ(−g)

dβ is summed per program into a [dirs·B, H, K] buffer and reduced in torch (deterministic).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._device import cdiv, next_pow2, triton_op

ACT_CODES = {None: 0, "sigmoid": 1, "silu": 2}
MAX_TILE = 256  # state entries per program: a few registers per thread at one warp per 32 entries


@triton.jit
def _act(o, O_ACT: tl.constexpr):
    """act(o) and act'(o) for O_ACT 0 (identity), 1 (sigmoid), 2 (silu)."""
    if O_ACT == 1:
        s = tl.sigmoid(o)
        return s, s * (1 - s)
    elif O_ACT == 2:
        s = tl.sigmoid(o)
        return o * s, s * (1 + o * (1 - s))
    else:
        return o, tl.full(o.shape, 1.0, tl.float32)


@triton.jit
def _offsets(i_h, H, V: tl.constexpr, K: tl.constexpr, VP: tl.constexpr, KP: tl.constexpr, BH: tl.constexpr):
    """Offsets and masks of a block of heads: [BH, KP] in a token's H·K, [BH, VP] in its H·V, [BH, VP, KP] in its
    H·V·K."""
    o_h = i_h * BH + tl.arange(0, BH)
    o_v = tl.arange(0, VP)
    o_k = tl.arange(0, KP)
    m_hk = (o_h[:, None] < H) & (o_k[None, :] < K)
    m_hv = (o_h[:, None] < H) & (o_v[None, :] < V)
    off_hk = o_h[:, None] * K + o_k[None, :]
    off_hv = o_h[:, None] * V + o_v[None, :]
    off_s = off_hv[:, :, None] * K + o_k[None, None, :]
    m_s = m_hv[:, :, None] & m_hk[:, None, :]
    return off_hk, m_hk, off_hv, m_hv, off_s, m_s


@triton.jit
def _fwd_kernel(o, g, x, lb, y, hs, B, T, H, scale, V: tl.constexpr, K: tl.constexpr, VP: tl.constexpr,
                KP: tl.constexpr, BH: tl.constexpr, O_ACT: tl.constexpr, HAS_LB: tl.constexpr, DIRS: tl.constexpr,
                REVERSE: tl.constexpr, STORE_H: tl.constexpr):
    i_b, i_h, i_d = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    off_hk, m_hk, off_hv, m_hv, off_s, m_s = _offsets(i_h, H, V, K, VP, KP, BH)
    rev = i_d + REVERSE  # 0 forward, 1 reverse (REVERSE is 0 when the grid holds both directions)
    if HAS_LB:
        beta = tl.load(lb + off_hk, mask=m_hk, other=0).to(tl.float32)
    else:
        beta = tl.zeros([BH, KP], dtype=tl.float32)
    h = tl.zeros([BH, VP, KP], dtype=tl.float32)
    row = i_b.to(tl.int64) * T  # first token of the batch row
    out = (i_d.to(tl.int64) * B + i_b) * T  # first token of this direction's output row
    for s in range(0, T):
        t = s + rev * (T - 1 - 2 * s)
        p_k = (row + t) * H * K + off_hk
        b_g = tl.load(g + p_k, mask=m_hk, other=0).to(tl.float32)
        a, _ = _act(tl.load(o + p_k, mask=m_hk, other=0).to(tl.float32), O_ACT)
        a = tl.where(m_hk, a, 0)
        b_x = tl.load(x + (row + t) * H * V + off_hv, mask=m_hv, other=0).to(tl.float32)
        f = beta + (1 - beta) * tl.sigmoid(b_g)
        k1 = (1 - beta) * tl.sigmoid(-b_g)
        h = f[:, None, :] * h + k1[:, None, :] * b_x[:, :, None]
        b_y = tl.sum(h * a[:, None, :], axis=2) * scale
        tl.store(y + (out + t) * H * V + off_hv, b_y.to(y.dtype.element_ty), mask=m_hv)
        if STORE_H:
            tl.store(hs + (out + t) * H * V * K + off_s, h, mask=m_s)


@triton.jit
def _bwd_kernel(o, g, x, lb, hs, dy, do, dg, dx, dlb, B, T, H, scale, V: tl.constexpr, K: tl.constexpr,
                VP: tl.constexpr, KP: tl.constexpr, BH: tl.constexpr, O_ACT: tl.constexpr, HAS_LB: tl.constexpr,
                DIRS: tl.constexpr, REVERSE: tl.constexpr):
    i_b, i_h, i_d = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    off_hk, m_hk, off_hv, m_hv, off_s, m_s = _offsets(i_h, H, V, K, VP, KP, BH)
    rev = i_d + REVERSE  # 0 forward, 1 reverse (REVERSE is 0 when the grid holds both directions)
    if HAS_LB:
        beta = tl.load(lb + off_hk, mask=m_hk, other=0).to(tl.float32)
    else:
        beta = tl.zeros([BH, KP], dtype=tl.float32)
    d = tl.zeros([BH, VP, KP], dtype=tl.float32)
    acc_lb = tl.zeros([BH, KP], dtype=tl.float32)
    row = i_b.to(tl.int64) * T
    out = (i_d.to(tl.int64) * B + i_b) * T
    step = 1 - 2 * rev  # +1 forward, −1 reverse: the forward scan's direction
    for ss in range(0, T):
        s = T - 1 - ss  # the forward scan's step index, walked backwards
        t = s + rev * (T - 1 - 2 * s)
        p_k = (row + t) * H * K + off_hk
        p_v = (row + t) * H * V + off_hv
        b_g = tl.load(g + p_k, mask=m_hk, other=0).to(tl.float32)
        b_o = tl.load(o + p_k, mask=m_hk, other=0).to(tl.float32)
        a, da_do = _act(b_o, O_ACT)
        a = tl.where(m_hk, a, 0)
        b_x = tl.load(x + p_v, mask=m_hv, other=0).to(tl.float32)
        b_dy = tl.load(dy + p_v, mask=m_hv, other=0).to(tl.float32) * scale
        p_h = (out + t) * H * V * K + off_s
        h_t = tl.load(hs + p_h, mask=m_s, other=0)
        # the state before token t: the previous token's, zero at the scan's first token (read there, unused)
        t_p = tl.where(s > 0, t - step, t)
        h_p = tl.load(hs + (out + t_p) * H * V * K + off_s, mask=m_s, other=0) * tl.where(s > 0, 1.0, 0.0)
        s_pos, s_neg = tl.sigmoid(b_g), tl.sigmoid(-b_g)
        f = beta + (1 - beta) * s_pos
        k1 = (1 - beta) * s_neg
        d += b_dy[:, :, None] * a[:, None, :]
        b_do = tl.sum(b_dy[:, :, None] * h_t, axis=1) * da_do
        b_dx = tl.sum(d * k1[:, None, :], axis=2)
        b_df = tl.sum(d * (h_p - b_x[:, :, None]), axis=1)
        p_out_k = (out + t) * H * K + off_hk
        tl.store(do + p_out_k, b_do.to(do.dtype.element_ty), mask=m_hk)
        tl.store(dg + p_out_k, ((1 - beta) * s_pos * s_neg * b_df).to(dg.dtype.element_ty), mask=m_hk)
        tl.store(dx + (out + t) * H * V + off_hv, b_dx.to(dx.dtype.element_ty), mask=m_hv)
        acc_lb += b_df * s_neg
        d = d * f[:, None, :]
    if HAS_LB:
        tl.store(dlb + (i_d.to(tl.int64) * B + i_b) * H * K + off_hk, acc_lb, mask=m_hk)


def _grid(B: int, H: int, V: int, K: int, dirs: int, block_heads: int):
    VP, KP = next_pow2(V), next_pow2(K)
    BH = block_heads or max(1, min(next_pow2(H), MAX_TILE // (VP * KP)))
    warps = max(1, min(4, BH * VP * KP // 64))
    return dict(V=V, K=K, VP=VP, KP=KP, BH=BH, num_warps=warps), (B, cdiv(H, BH), dirs)


def _sum_dirs(buf: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The per-direction buffer [dirs, ...] as one tensor in `dtype` (one direction was written in it already)."""
    return buf[0] if buf.shape[0] == 1 else buf.sum(0).to(dtype)


@triton_op("hgrn2::small_heads_fwd")
def _fwd(o: torch.Tensor, g: torch.Tensor, x: torch.Tensor, lb: torch.Tensor | None, scale: float, o_act: int,
         reverse: int, dirs: int, store_h: bool, block_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    B, T, H, K = o.shape
    V = x.shape[-1]
    meta, grid = _grid(B, H, V, K, dirs, block_heads)
    buf_dtype = x.dtype if dirs == 1 else torch.float32
    y = x.new_empty(dirs, B, T, H, V, dtype=buf_dtype)
    hs = x.new_empty(dirs, B, T, H, V, K, dtype=torch.float32) if store_h else x.new_empty(0, dtype=torch.float32)
    _fwd_kernel[grid](o, g, x, lb, y, hs if store_h else None, B, T, H, scale, O_ACT=o_act, HAS_LB=lb is not None,
                      DIRS=dirs, REVERSE=reverse, STORE_H=store_h, **meta)
    return _sum_dirs(y, x.dtype), hs


@triton_op("hgrn2::small_heads_bwd")
def _bwd(dy: torch.Tensor, o: torch.Tensor, g: torch.Tensor, x: torch.Tensor, lb: torch.Tensor | None,
         hs: torch.Tensor, scale: float, o_act: int, reverse: int, dirs: int, block_heads: int
         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    B, T, H, K = o.shape
    V = x.shape[-1]
    meta, grid = _grid(B, H, V, K, dirs, block_heads)
    f32 = torch.float32
    do = o.new_empty(dirs, B, T, H, K, dtype=o.dtype if dirs == 1 else f32)
    dg = g.new_empty(dirs, B, T, H, K, dtype=g.dtype if dirs == 1 else f32)
    dx = x.new_empty(dirs, B, T, H, V, dtype=x.dtype if dirs == 1 else f32)
    part = x.new_empty(dirs * B, H, K, dtype=f32) if lb is not None else None
    _bwd_kernel[grid](o, g, x, lb, hs, dy.contiguous(), do, dg, dx, part, B, T, H, scale, O_ACT=o_act,
                      HAS_LB=lb is not None, DIRS=dirs, REVERSE=reverse, **meta)
    dlb = x.new_empty(0, dtype=f32) if lb is None else part.sum(0).to(lb.dtype)
    return _sum_dirs(do, o.dtype), _sum_dirs(dg, g.dtype), _sum_dirs(dx, x.dtype), dlb


@_fwd.register_fake
def _(o, g, x, lb, scale, o_act, reverse, dirs, store_h, block_heads):
    B, T, H, K = o.shape
    hs = x.new_empty(dirs, B, T, H, x.shape[-1], K, dtype=torch.float32) if store_h else x.new_empty(
        0, dtype=torch.float32)
    return torch.empty_like(x), hs


@_bwd.register_fake
def _(dy, o, g, x, lb, hs, scale, o_act, reverse, dirs, block_heads):
    dlb = x.new_empty(0, dtype=torch.float32) if lb is None else torch.empty_like(lb)
    return torch.empty_like(o), torch.empty_like(g), torch.empty_like(x), dlb


class _SmallHeads(torch.autograd.Function):
    @staticmethod
    def forward(ctx, o, g, x, lb, scale, o_act, reverse, dirs, block_heads):
        store_h = any(ctx.needs_input_grad[:4])  # the states only for a backward
        y, hs = _fwd(o, g, x, lb, scale, o_act, reverse, dirs, store_h, block_heads)
        ctx.save_for_backward(o, g, x, lb, hs)
        ctx.args = (scale, o_act, reverse, dirs, block_heads)
        return y

    @staticmethod
    def backward(ctx, dy):
        o, g, x, lb, hs = ctx.saved_tensors
        do, dg, dx, dlb = _bwd(dy, o, g, x, lb, hs, *ctx.args)
        return do, dg, dx, (None if lb is None else dlb), None, None, None, None, None


def hgrn2_small_heads_triton(o: torch.Tensor, g: torch.Tensor, i: torch.Tensor, lower_bound: torch.Tensor | None = None,
                             *, scale: float = 1.0, o_act: str | None = None, reverse: bool = False,
                             bidirectional: bool = False, block_heads: int = 0) -> torch.Tensor:
    """The contract of `hgrn2.ops.hgrn2_small_heads` on Triton; `block_heads` forces the heads per program (a
    power of two; 0: as many as fill a tile of `MAX_TILE` state entries)."""
    o, g, i = (t.contiguous() for t in (o, g, i))
    lb = None if lower_bound is None else lower_bound.contiguous()
    return _SmallHeads.apply(o, g, i, lb, float(scale), ACT_CODES[o_act], int(reverse), 2 if bidirectional else 1,
                             int(block_heads))
