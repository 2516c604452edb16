"""HGRN2 with small heads (K, V ≤ 8) in Triton: the [V, K] state of each head in registers, one kernel per pass.

    f_t = β + (1 − β)σ(g_t),   h_t[v, k] = f_t[k]·h_{t−1}[v, k] + (1 − f_t[k])·i_t[v],
    y_t[v] = scale·Σ_k h_t[v, k]·a_t[k]

with a = act(o) and 1 − f = (1 − β)σ(−g) (exact as g → +∞). Each program owns one batch row, a block of BH heads and
one scan direction, and walks the sequence (or a chunk of it, below) with the state as a [BH, VP, KP] tile (VP, KP
the next powers of two of V, K): a whole small head per tile, so every reduction (over k for y and di, over v for
da and df) stays inside the program. `bidirectional` runs the forward and the reverse scan of the same inputs as
the two halves of one grid and sums their outputs, so a bidirectional model needs neither flipped copies nor a
second launch.

A program's walk is one step per token, each waiting on its loads; when batch × head blocks × directions leave
the GPU idle, time is cut into NC chunks, as `hgrn1.py` does: (1) each chunk walks from a zero state, keeping its
end state E_c and decay A_c = Π f; (2) a short walk over the chunks gives each its start state,
S_{c+1} = A_c·S_c + E_c; (3) each chunk walks again from S_c, writing the outputs. The backward chains the
gradients of the chunks' last states the same way, from the last chunk to the first.

The forward keeps every state h_t (fp32, [dirs, B, T, H, V, K]) when a gradient is needed; the backward walks
the opposite way with the state's gradient d (carried as f_{t+1}·d_{t+1}):

    d_t = f_{t+1}·d_{t+1} + scale·dy_t ⊗ a_t,   da_t = scale·Σ_v dy_t[v]·h_t[v, :],   di_t = Σ_k d_t[:, k]·(1 − f_t[k]),
    df_t = Σ_v d_t[v, :]·(h_{t−1}[v, :] − i_t[v]),   dg_t = df_t·(1 − β)σ(g)σ(−g),   dβ = Σ_t df_t·σ(−g)

dβ is summed per program into a [dirs·B·NC, H, K] buffer and reduced in torch (deterministic).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import ACTS
from ._device import cdiv, next_pow2, triton_op

MAX_TILE = 256  # state entries per program; each step waits on its loads, so a warp takes up to 8 per thread
MIN_CHUNK = 64  # shortest time chunk worth the extra passes of a chunked walk
TARGET_PROGRAMS = 8192  # one-warp programs that keep every SM of a large GPU busy


@triton.jit
def _act(o, O_ACT: tl.constexpr):
    """act(o) and act'(o) for O_ACT as `_common.ACTS` (0 identity, 1 silu, 2 sigmoid), by tl.sigmoid."""
    a = o
    da = tl.full(o.shape, 1.0, tl.float32)
    if O_ACT == 1:
        sig = tl.sigmoid(o)
        a = o * sig
        da = sig * (1 + o * (1 - sig))
    if O_ACT == 2:
        a = tl.sigmoid(o)
        da = a * (1 - a)
    return a, da


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
def _setup(lb, B, T, H, NC, CHUNK, V: tl.constexpr, K: tl.constexpr, VP: tl.constexpr, KP: tl.constexpr,
           BH: tl.constexpr, HAS_LB: tl.constexpr, REVERSE: tl.constexpr):
    """A program's place: grid (B·NC, head blocks, directions) → offsets, β, the direction (0 forward, 1
    reverse), the first token of its batch row in the inputs and in the per-direction outputs, its chunk's index
    j in [dirs·B·NC] and its steps [bos, eos) in scan order."""
    i_bc, i_h, i_d = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_c = i_bc // NC, i_bc % NC
    off_hk, m_hk, off_hv, m_hv, off_s, m_s = _offsets(i_h, H, V, K, VP, KP, BH)
    if HAS_LB:
        beta = tl.load(lb + off_hk, mask=m_hk, other=0).to(tl.float32)
    else:
        beta = tl.zeros([BH, KP], dtype=tl.float32)
    rev = i_d + REVERSE  # REVERSE is 0 when the grid holds both directions
    row = i_b.to(tl.int64) * T
    out = (i_d.to(tl.int64) * B + i_b) * T
    j = (i_d.to(tl.int64) * B + i_b) * NC + i_c
    bos = i_c * CHUNK
    eos = tl.minimum(bos + CHUNK, T)
    return off_hk, m_hk, off_hv, m_hv, off_s, m_s, beta, rev, row, out, j, bos, eos


@triton.jit
def _carried(p, j, off_s, m_s, H, V: tl.constexpr, K: tl.constexpr, VP: tl.constexpr, KP: tl.constexpr,
             BH: tl.constexpr, HAS: tl.constexpr):
    """The [BH, VP, KP] tile a chunk starts from: p[j] (a state, or a state's gradient, from the other chunks), or
    zeros without one."""
    if HAS:
        return tl.load(p + j * H * V * K + off_s, mask=m_s, other=0)
    return tl.zeros([BH, VP, KP], dtype=tl.float32)


@triton.jit
def _fwd_kernel(o, g, x, lb, y, hs, h_in, end, dec, B, T, H, NC, CHUNK, scale, V: tl.constexpr, K: tl.constexpr,
                VP: tl.constexpr, KP: tl.constexpr, BH: tl.constexpr, O_ACT: tl.constexpr, HAS_LB: tl.constexpr,
                REVERSE: tl.constexpr, HAS_HIN: tl.constexpr, LOCAL: tl.constexpr, STORE_H: tl.constexpr):
    """Scan one chunk from h_in[j] (or 0). LOCAL: only its end state and decay Π f (into end[j], dec[j]);
    otherwise y (and every state, STORE_H)."""
    off_hk, m_hk, off_hv, m_hv, off_s, m_s, beta, rev, row, out, j, bos, eos = _setup(
        lb, B, T, H, NC, CHUNK, V, K, VP, KP, BH, HAS_LB, REVERSE)
    h = _carried(h_in, j, off_s, m_s, H, V, K, VP, KP, BH, HAS_HIN)
    prod = tl.full([BH, KP], 1.0, dtype=tl.float32)
    for s in range(bos, eos):
        t = s + rev * (T - 1 - 2 * s)
        p_k = (row + t) * H * K + off_hk
        b_g = tl.load(g + p_k, mask=m_hk, other=0).to(tl.float32)
        b_x = tl.load(x + (row + t) * H * V + off_hv, mask=m_hv, other=0).to(tl.float32)
        f = beta + (1 - beta) * tl.sigmoid(b_g)
        k1 = (1 - beta) * tl.sigmoid(-b_g)
        h = f[:, None, :] * h + k1[:, None, :] * b_x[:, :, None]
        if LOCAL:
            prod *= f
        else:
            a, _ = _act(tl.load(o + p_k, mask=m_hk, other=0).to(tl.float32), O_ACT)
            a = tl.where(m_hk, a, 0)
            b_y = tl.sum(h * a[:, None, :], axis=2) * scale
            tl.store(y + (out + t) * H * V + off_hv, b_y.to(y.dtype.element_ty), mask=m_hv)
            if STORE_H:
                tl.store(hs + (out + t) * H * V * K + off_s, h, mask=m_s)
    if LOCAL:
        tl.store(end + j * H * V * K + off_s, h, mask=m_s)
        tl.store(dec + j * H * K + off_hk, prod, mask=m_hk)


@triton.jit
def _carry_kernel(end, dec, carry, B, H, NC, V: tl.constexpr, K: tl.constexpr, VP: tl.constexpr, KP: tl.constexpr,
                  BH: tl.constexpr, BACKWARD: tl.constexpr):
    """The state entering each chunk, carry[j] (zero at the first in walking order): S ← dec[j]·S + end[j],
    chunks walked first to last, or last to first for the backward's gradients."""
    i_b, i_h, i_d = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    off_hk, m_hk, off_hv, m_hv, off_s, m_s = _offsets(i_h, H, V, K, VP, KP, BH)
    first = (i_d.to(tl.int64) * B + i_b) * NC
    S = tl.zeros([BH, VP, KP], dtype=tl.float32)
    for cc in range(0, NC):
        if BACKWARD:
            c = NC - 1 - cc
        else:
            c = cc
        j = first + c
        tl.store(carry + j * H * V * K + off_s, S, mask=m_s)
        A = tl.load(dec + j * H * K + off_hk, mask=m_hk, other=0)
        S = A[:, None, :] * S + tl.load(end + j * H * V * K + off_s, mask=m_s, other=0)


@triton.jit
def _bwd_kernel(o, g, x, lb, hs, dy, do, dg, dx, dlb, d_in, end, dec, B, T, H, NC, CHUNK, scale, V: tl.constexpr,
                K: tl.constexpr, VP: tl.constexpr, KP: tl.constexpr, BH: tl.constexpr, O_ACT: tl.constexpr,
                HAS_LB: tl.constexpr, REVERSE: tl.constexpr, HAS_DIN: tl.constexpr, LOCAL: tl.constexpr):
    """Walk one chunk against the scan from d_in[j], the gradient of its last state from later chunks (or 0).
    LOCAL: only the gradient it passes to the state before it, from a zero start, and its decay (end[j], dec[j]);
    otherwise do, dg, di and the chunk's partial dβ."""
    off_hk, m_hk, off_hv, m_hv, off_s, m_s, beta, rev, row, out, j, bos, eos = _setup(
        lb, B, T, H, NC, CHUNK, V, K, VP, KP, BH, HAS_LB, REVERSE)
    d = _carried(d_in, j, off_s, m_s, H, V, K, VP, KP, BH, HAS_DIN)
    acc_lb = tl.zeros([BH, KP], dtype=tl.float32)
    prod = tl.full([BH, KP], 1.0, dtype=tl.float32)
    step = 1 - 2 * rev  # +1 forward, −1 reverse: the scan's direction in t
    h_t = tl.zeros([BH, VP, KP], dtype=tl.float32)  # the state after the current token, read once per token
    if not LOCAL:
        t_last = eos - 1 + rev * (T - 1 - 2 * (eos - 1))
        h_t = tl.load(hs + (out + t_last) * H * V * K + off_s, mask=m_s, other=0)
    for ss in range(bos, eos):
        s = bos + eos - 1 - ss  # the scan's step, walked backwards
        t = s + rev * (T - 1 - 2 * s)
        p_k = (row + t) * H * K + off_hk
        p_v = (row + t) * H * V + off_hv
        b_g = tl.load(g + p_k, mask=m_hk, other=0).to(tl.float32)
        b_o = tl.load(o + p_k, mask=m_hk, other=0).to(tl.float32)
        a, da_do = _act(b_o, O_ACT)
        a = tl.where(m_hk, a, 0)
        b_dy = tl.load(dy + p_v, mask=m_hv, other=0).to(tl.float32) * scale
        s_pos, s_neg = tl.sigmoid(b_g), tl.sigmoid(-b_g)
        f = beta + (1 - beta) * s_pos
        d += b_dy[:, :, None] * a[:, None, :]
        if LOCAL:
            prod *= f
        else:
            k1 = (1 - beta) * s_neg
            b_x = tl.load(x + p_v, mask=m_hv, other=0).to(tl.float32)
            # the state before token t: the previous token's, zero at the scan's first token (read there, unused)
            t_p = tl.where(s > 0, t - step, t)
            h_p = tl.load(hs + (out + t_p) * H * V * K + off_s, mask=m_s, other=0) * tl.where(s > 0, 1.0, 0.0)
            b_do = tl.sum(b_dy[:, :, None] * h_t, axis=1) * da_do
            b_dx = tl.sum(d * k1[:, None, :], axis=2)
            b_df = tl.sum(d * (h_p - b_x[:, :, None]), axis=1)
            p_out_k = (out + t) * H * K + off_hk
            tl.store(do + p_out_k, b_do.to(do.dtype.element_ty), mask=m_hk)
            tl.store(dg + p_out_k, ((1 - beta) * s_pos * s_neg * b_df).to(dg.dtype.element_ty), mask=m_hk)
            tl.store(dx + (out + t) * H * V + off_hv, b_dx.to(dx.dtype.element_ty), mask=m_hv)
            acc_lb += b_df * s_neg
            h_t = h_p
        d = d * f[:, None, :]
    if LOCAL:
        tl.store(end + j * H * V * K + off_s, d, mask=m_s)
        tl.store(dec + j * H * K + off_hk, prod, mask=m_hk)
    elif HAS_LB:
        tl.store(dlb + j * H * K + off_hk, acc_lb, mask=m_hk)


def _layout(B: int, T: int, H: int, V: int, K: int, dirs: int, block_heads: int, chunk: int, warps: int):
    """Kernel constants and the grid (B·NC, head blocks, dirs): whole heads per program up to `MAX_TILE` state
    entries (or `block_heads`), then time cut into NC chunks of CHUNK steps until the grid has `TARGET_PROGRAMS`
    programs (or chunks of `chunk` steps); one warp per `MAX_TILE` entries (or `warps`)."""
    VP, KP = next_pow2(V), next_pow2(K)
    BH = block_heads or max(1, min(next_pow2(H), MAX_TILE // (VP * KP)))
    nh = cdiv(H, BH)
    NC = cdiv(T, chunk) if chunk else max(1, min(T // MIN_CHUNK, cdiv(TARGET_PROGRAMS, B * nh * dirs)))
    CHUNK = cdiv(T, NC)
    NC = cdiv(T, CHUNK)
    meta = dict(V=V, K=K, VP=VP, KP=KP, BH=BH, num_warps=warps or max(1, BH * VP * KP // MAX_TILE))
    return meta, NC, CHUNK, (B * NC, nh, dirs)


def _chain(end: torch.Tensor, dec: torch.Tensor, B: int, H: int, dirs: int, NC: int, nh: int, meta: dict,
           backward: bool) -> torch.Tensor:
    """Pass 2 of a chunked walk: the carry entering every chunk from the chunks' local ends and decays."""
    carry = torch.empty_like(end)
    _carry_kernel[(B, nh, dirs)](end, dec, carry, B, H, NC, BACKWARD=backward, **meta)
    return carry


def _local_buffers(x: torch.Tensor, n: int, H: int, V: int, K: int) -> tuple[torch.Tensor, torch.Tensor]:
    return x.new_empty(n, H, V, K, dtype=torch.float32), x.new_empty(n, H, K, dtype=torch.float32)


def _sum_dirs(buf: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The per-direction buffer [dirs, ...] as one tensor in `dtype` (one direction was written in it already).
    Two directions: one element-wise add that writes `dtype` (the fp32 sum rounded once), not a reduction over a
    dimension of two and a cast, which move half again the bytes."""
    if buf.shape[0] == 1:
        return buf[0]
    return torch.add(buf[0], buf[1], out=buf.new_empty(buf.shape[1:], dtype=dtype))


@triton_op("hgrn2::small_heads_fwd")
def _fwd(o: torch.Tensor, g: torch.Tensor, x: torch.Tensor, lb: torch.Tensor | None, scale: float, o_act: int,
         reverse: int, dirs: int, store_h: bool, block_heads: int, chunk: int, warps: int
         ) -> tuple[torch.Tensor, torch.Tensor]:
    B, T, H, K = o.shape
    V = x.shape[-1]
    meta, NC, CHUNK, grid = _layout(B, T, H, V, K, dirs, block_heads, chunk, warps)
    common = dict(O_ACT=o_act, HAS_LB=lb is not None, REVERSE=reverse, **meta)
    h_in = None
    if NC > 1:  # passes 1 and 2: the state entering every chunk
        end, dec = _local_buffers(x, dirs * B * NC, H, V, K)
        _fwd_kernel[grid](o, g, x, lb, None, None, None, end, dec, B, T, H, NC, CHUNK, scale, HAS_HIN=False,
                          LOCAL=True, STORE_H=False, **common)
        h_in = _chain(end, dec, B, H, dirs, NC, grid[1], meta, backward=False)
    y = x.new_empty(dirs, B, T, H, V, dtype=x.dtype if dirs == 1 else torch.float32)
    hs = x.new_empty(dirs, B, T, H, V, K, dtype=torch.float32) if store_h else x.new_empty(0, dtype=torch.float32)
    _fwd_kernel[grid](o, g, x, lb, y, hs if store_h else None, h_in, None, None, B, T, H, NC, CHUNK, scale,
                      HAS_HIN=h_in is not None, LOCAL=False, STORE_H=store_h, **common)
    return _sum_dirs(y, x.dtype), hs


@triton_op("hgrn2::small_heads_bwd")
def _bwd(dy: torch.Tensor, o: torch.Tensor, g: torch.Tensor, x: torch.Tensor, lb: torch.Tensor | None,
         hs: torch.Tensor, scale: float, o_act: int, reverse: int, dirs: int, block_heads: int, chunk: int, warps: int
         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    B, T, H, K = o.shape
    V = x.shape[-1]
    meta, NC, CHUNK, grid = _layout(B, T, H, V, K, dirs, block_heads, chunk, warps)
    common = dict(O_ACT=o_act, HAS_LB=lb is not None, REVERSE=reverse, **meta)
    dy = dy.contiguous()
    d_in = None
    if NC > 1:  # passes 1 and 2: the gradient of every chunk's last state from the chunks after it
        end, dec = _local_buffers(x, dirs * B * NC, H, V, K)
        _bwd_kernel[grid](o, g, x, lb, None, dy, None, None, None, None, None, end, dec, B, T, H, NC, CHUNK, scale,
                          HAS_DIN=False, LOCAL=True, **common)
        d_in = _chain(end, dec, B, H, dirs, NC, grid[1], meta, backward=True)
    f32 = torch.float32
    do = o.new_empty(dirs, B, T, H, K, dtype=o.dtype if dirs == 1 else f32)
    dg = g.new_empty(dirs, B, T, H, K, dtype=g.dtype if dirs == 1 else f32)
    dx = x.new_empty(dirs, B, T, H, V, dtype=x.dtype if dirs == 1 else f32)
    part = x.new_empty(dirs * B * NC, H, K, dtype=f32) if lb is not None else None
    _bwd_kernel[grid](o, g, x, lb, hs, dy, do, dg, dx, part, d_in, None, None, B, T, H, NC, CHUNK, scale,
                      HAS_DIN=d_in is not None, LOCAL=False, **common)
    dlb = x.new_empty(0, dtype=f32) if lb is None else part.sum(0).to(lb.dtype)
    return _sum_dirs(do, o.dtype), _sum_dirs(dg, g.dtype), _sum_dirs(dx, x.dtype), dlb


@_fwd.register_fake
def _(o, g, x, lb, scale, o_act, reverse, dirs, store_h, block_heads, chunk, warps):
    B, T, H, K = o.shape
    hs = x.new_empty(dirs, B, T, H, x.shape[-1], K, dtype=torch.float32) if store_h else x.new_empty(
        0, dtype=torch.float32)
    return torch.empty_like(x), hs


@_bwd.register_fake
def _(dy, o, g, x, lb, hs, scale, o_act, reverse, dirs, block_heads, chunk, warps):
    dlb = x.new_empty(0, dtype=torch.float32) if lb is None else torch.empty_like(lb)
    return torch.empty_like(o), torch.empty_like(g), torch.empty_like(x), dlb


class _SmallHeads(torch.autograd.Function):
    @staticmethod
    def forward(ctx, o, g, x, lb, scale, o_act, reverse, dirs, block_heads, chunk, warps):
        store_h = any(ctx.needs_input_grad[:4])  # the states only for a backward
        y, hs = _fwd(o, g, x, lb, scale, o_act, reverse, dirs, store_h, block_heads, chunk, warps)
        ctx.save_for_backward(o, g, x, lb, hs)
        ctx.args = (scale, o_act, reverse, dirs, block_heads, chunk, warps)
        return y

    @staticmethod
    def backward(ctx, dy):
        o, g, x, lb, hs = ctx.saved_tensors
        do, dg, dx, dlb = _bwd(dy, o, g, x, lb, hs, *ctx.args)
        return do, dg, dx, (None if lb is None else dlb), None, None, None, None, None, None, None


def hgrn2_small_heads_triton(o: torch.Tensor, g: torch.Tensor, i: torch.Tensor, lower_bound: torch.Tensor | None = None,
                             *, scale: float = 1.0, o_act: str | None = None, reverse: bool = False,
                             bidirectional: bool = False, block_heads: int = 0, chunk_size: int = 0,
                             num_warps: int = 0) -> torch.Tensor:
    """The contract of `hgrn2.ops.hgrn2_small_heads` on Triton; `block_heads` forces the heads per program (a
    power of two), `chunk_size` the steps per time chunk and `num_warps` the warps per program (0: chosen from the
    shape, see `_layout`)."""
    o, g, i = (t.contiguous() for t in (o, g, i))
    lb = None if lower_bound is None else lower_bound.contiguous()
    return _SmallHeads.apply(o, g, i, lb, float(scale), ACTS[o_act], int(reverse), 2 if bidirectional else 1,
                             int(block_heads), int(chunk_size), int(num_warps))
