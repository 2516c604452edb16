"""Forward kernel: the HGRN2 recurrence over 16-token sub-blocks, state held in registers, one pass over memory.

One program per (V-block, sequence·head) walks its sequence 16 tokens at a time. Per sub-block, with b the
within-block cumsum of log f (b ≤ 0, so every factor below is ≤ 1 except inside `_diag_attn`):

    y = (q ⊙ e^{b}) Sᵀ + A v                         A = the exact causal 16×16 block (see _common)
    S ← S ⊙ e^{b_last} + vᵀ (k ⊙ e^{b_last − b})     S [BV, K] in fp32

It reads o, g, i once and writes y once (plus the final state); k and log f live only in registers.
"""

import triton
import triton.language as tl

from ._common import _act, _diag_attn, _gates


@triton.jit
def hgrn2_fwd_kernel(
    o, g, i, lb, h0, y, ht, cu_seqlens, scale, T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    O_ACT: tl.constexpr, I_ACT: tl.constexpr, HAS_LB: tl.constexpr, HAS_H0: tl.constexpr,
    STORE_HT: tl.constexpr, VARLEN: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr,
):
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_h = i_nh // H, i_nh % H
    if VARLEN:
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
    else:
        bos = i_n.to(tl.int64) * T
        eos = bos + T

    rows = tl.arange(0, 16)
    ck = tl.arange(0, BK)
    cv = i_v * BV + tl.arange(0, BV)
    mk = ck < K
    mv = cv < V
    if HAS_LB:
        beta = tl.load(lb + i_h * K + ck, mask=mk, other=0.0).to(tl.float32)
    else:
        beta = tl.zeros([BK], dtype=tl.float32)
    # state S [BV, K] (the [V, K] layout of fla's state_v_first)
    s_off = i_nh.to(tl.int64) * V * K + cv[:, None] * K + ck[None, :]
    s_mask = mv[:, None] & mk[None, :]
    if HAS_H0:
        S = tl.load(h0 + s_off, mask=s_mask, other=0.0).to(tl.float32)
    else:
        S = tl.zeros([BV, BK], dtype=tl.float32)

    for t0 in range(bos, eos, 16):
        tok = t0 + rows
        mt = tok < eos
        offk = (tok[:, None] * H + i_h) * K + ck[None, :]
        offv = (tok[:, None] * H + i_h) * V + cv[None, :]
        mtk = mt[:, None] & mk[None, :]
        mtv = mt[:, None] & mv[None, :]
        q = _act(tl.load(o + offk, mask=mtk, other=0.0).to(tl.float32), O_ACT) * scale
        a, k, _, _, _ = _gates(tl.load(g + offk, mask=mtk, other=0.0).to(tl.float32), beta, HAS_LB)
        v = _act(tl.load(i + offv, mask=mtv, other=0.0).to(tl.float32), I_ACT)
        q = tl.where(mtk, q, 0.0)
        a = tl.where(mtk, a, 0.0)
        k = tl.where(mtk, k, 0.0)
        v = tl.where(mtv, v, 0.0)

        b = tl.cumsum(a, 0)
        b_last = tl.sum(a, 0)
        spread = -tl.min(b_last)
        A = _diag_attn(q, k, b, spread, DT, PREC)
        out = tl.dot((q * tl.exp(b)).to(DT), tl.trans(S.to(DT)), input_precision=PREC)
        out += tl.dot(A.to(DT), v.to(DT), input_precision=PREC)
        tl.store(y + offv, out.to(y.dtype.element_ty), mask=mtv)

        ke = (k * tl.exp(b_last[None, :] - b)).to(DT)
        S = S * tl.exp(b_last)[None, :] + tl.dot(tl.trans(v.to(DT)), ke, input_precision=PREC)

    if STORE_HT:
        tl.store(ht + s_off, S, mask=s_mask)
