"""Forward kernel: the HGRN2 recurrence over BT-token sub-blocks, state in registers, one pass over memory.

One program per (V-block, sequence·head) walks its sequence BT tokens at a time (`block_t_fwd`). Per sub-block,
with b the within-block cumsum of log f (b ≤ 0, so every factor below is ≤ 1 except inside `diag_block`):

    y = (q ⊙ e^{b}) Sᵀ + A v                         A = the exact causal BT×BT block (see _common)
    S ← S ⊙ e^{b_last} + vᵀ (k ⊙ e^{b_last − b})     S [BV, K] in fp32

It reads o, g, i once and writes y once (plus the final state); k and log f live only in registers.
"""

import triton
import triton.language as tl

from ._common import act, causal_av, diag_block, gates, load_beta, seq_bounds, step_tile


@triton.jit
def fused_chunk_fwd_kernel(
    o, g, i, lb, h0, y, ht, cu_seqlens, scale, T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    O_ACT: tl.constexpr, I_ACT: tl.constexpr, HAS_LB: tl.constexpr, HAS_H0: tl.constexpr,
    STORE_HT: tl.constexpr, VARLEN: tl.constexpr, MAX_SPREAD: tl.constexpr, DT: tl.constexpr,
    PREC: tl.constexpr, REVERSE: tl.constexpr,
):
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_h = i_nh // H, i_nh % H
    bos, eos = seq_bounds(cu_seqlens, i_n, T, VARLEN)
    ck = tl.arange(0, BK)
    cv = i_v * BV + tl.arange(0, BV)
    beta = load_beta(lb, i_h, K, ck, HAS_LB)
    # state S [BV, K] (the [V, K] layout of fla's state_v_first)
    s_off = i_nh.to(tl.int64) * V * K + cv[:, None] * K + ck[None, :]
    s_mask = (cv < V)[:, None] & (ck < K)[None, :]
    if HAS_H0:
        S = tl.load(h0 + s_off, mask=s_mask, other=0.0).to(tl.float32)
    else:
        S = tl.zeros([BV, BK], dtype=tl.float32)

    # register double-buffering: the next sub-block's tiles load while this one computes
    offk, offv, mtk, mtv = step_tile(bos, bos, eos, i_h, H, K, V, ck, cv, BK, BV, BT, REVERSE)
    o_nx = tl.load(o + offk, mask=mtk, other=0.0)
    g_nx = tl.load(g + offk, mask=mtk, other=0.0)
    i_nx = tl.load(i + offv, mask=mtv, other=0.0)
    for t0 in range(bos, eos, BT):
        o_t, g_t, i_t = o_nx, g_nx, i_nx
        offk, offv, mtk, mtv = step_tile(t0 + BT, bos, eos, i_h, H, K, V, ck, cv, BK, BV, BT, REVERSE)
        o_nx = tl.load(o + offk, mask=mtk, other=0.0)
        g_nx = tl.load(g + offk, mask=mtk, other=0.0)
        i_nx = tl.load(i + offv, mask=mtv, other=0.0)
        offk, offv, mtk, mtv = step_tile(t0, bos, eos, i_h, H, K, V, ck, cv, BK, BV, BT, REVERSE)

        # rows past the end need a = 0 (b stays put) and v = 0; padded K columns need k = 0
        q = act(o_t.to(tl.float32), O_ACT) * scale
        a, k, _, _, _ = gates(g_t.to(tl.float32), beta, HAS_LB)
        a = tl.where(mtk, a, 0.0)
        k = tl.where(mtk, k, 0.0)
        v = tl.where(mtv, act(i_t.to(tl.float32), I_ACT), 0.0)

        b = tl.cumsum(a, 0)
        b_last = tl.sum(a, 0)
        A, eb, w_end = diag_block(q, k, a, b, b_last, -tl.min(b_last), MAX_SPREAD, DT, PREC)
        v_c = v.to(DT)
        out = tl.dot((q * eb).to(DT), tl.trans(S.to(DT)), input_precision=PREC)
        out += causal_av(A, v, DT, PREC)
        tl.store(y + offv, out.to(y.dtype.element_ty), mask=mtv)
        S = S * tl.exp(b_last)[None, :] + tl.dot(tl.trans(v_c), (k * w_end).to(DT), input_precision=PREC)

    if STORE_HT:
        tl.store(ht + s_off, S, mask=s_mask)
