"""Chunk-parallel forward: a short sequential pass for the chunk-start states, then one program per chunk.

Chunks of BT (64) tokens, each split into NB = BT/16 sub-blocks of 16. Per chunk, with a = log f and
c the inclusive cumsum of a *within each 16-token sub-block*, r_i the decay of the chunk up to the start of
sub-block i (exclusive prefix of the sub-block sums) and R [BT, K] that r broadcast to the rows of sub-block i:
b = R + c is the within-chunk cumsum of log f (b ≤ 0, non-increasing), every exponent below is ≤ 0 except
e^{−c} (bounded by the largest 16-token decay spread, checked against MAX_SPREAD).

1. `cp_fwd_h_kernel`, grid (NK·NV, N·H): walks the chunks of one sequence, stores the chunk-START state
   h_c [V, K] (STATE_DTYPE) and updates S ← S ⊙ e^{b_last} + vᵀ (k ⊙ e^{b_last − b}); final state in fp32.
   K may be split (the state's columns are independent).
2. `cp_fwd_o_kernel`, grid (NT_total, NV, H): y = (q ⊙ e^b) h_cᵀ + A v with the causal BT×BT block
   A[t, s] = Σ_k q_t k_s e^{b_t − b_s}. Fast path (spread < MAX_SPREAD): A = Σ_j (q e^{c} ⊙ E_j)(k e^{−c} on
   sub-block j)ᵀ with E_j[t] = e^{r_{i(t)} − r_j} (i(t) ≥ j, else 0): every factor bounded. Otherwise an exact
   column loop with the exponent masked before exp.
"""

import triton
import triton.language as tl

from ._common import _act, _gates, _load_beta, _row, _seq_bounds, _tile


@triton.jit
def _chunk_bounds(chunks, i_c, T, NT, BT: tl.constexpr, VARLEN: tl.constexpr):
    """[t0, t1) rows of chunk i_c (global chunk index) in the flattened [B·T] token axis; t0 = t1 for padding."""
    if VARLEN:
        t0 = tl.load(chunks + i_c * 2).to(tl.int64)
        t1 = tl.load(chunks + i_c * 2 + 1).to(tl.int64)
    else:
        i_n = i_c // NT
        t0 = i_n.to(tl.int64) * T + (i_c % NT) * BT
        t1 = tl.minimum(t0 + BT, i_n.to(tl.int64) * T + T)
    return t0, t1


@triton.jit
def _chunk_offset(chunk_offsets, i_n, NT, VARLEN: tl.constexpr):
    """Global index of sequence i_n's first chunk."""
    if VARLEN:
        return tl.load(chunk_offsets + i_n).to(tl.int64)
    else:
        return i_n.to(tl.int64) * NT


@triton.jit
def _chunk_decay(a, BT: tl.constexpr, BK: tl.constexpr):
    """a = log f [BT, BK] (0 on padded rows) → (c, r, R, b_last): c the inclusive cumsum within 16-row
    sub-blocks, r [NB, BK] the exclusive prefix of the sub-block sums, R = r on each sub-block's rows, b_last
    the chunk's total (so b = R + c)."""
    NB: tl.constexpr = BT // 16
    a3 = tl.reshape(a, [NB, 16, BK])
    c = tl.reshape(tl.cumsum(a3, 1), [BT, BK])
    s = tl.sum(a3, 1)
    cs = tl.cumsum(s, 0)
    r = cs - s
    b_last = tl.sum(s, 0)
    R = tl.reshape(tl.broadcast_to(r[:, None, :], [NB, 16, BK]), [BT, BK])
    return c, r, R, b_last


@triton.jit
def _expand_rows(x, BT: tl.constexpr, BK: tl.constexpr):
    """[NB, BK] per-sub-block rows → [BT, BK] (each row of x repeated on its sub-block's 16 rows)."""
    NB: tl.constexpr = BT // 16
    return tl.reshape(tl.broadcast_to(x[:, None, :], [NB, 16, BK]), [BT, BK])


@triton.jit
def _sub_decay(r, j, BT: tl.constexpr, BK: tl.constexpr):
    """E_j [BT, BK]: e^{r_i − r_j} on the rows of sub-block i ≥ j, 0 above (every exponent ≤ 0)."""
    NB: tl.constexpr = BT // 16
    ib = tl.arange(0, NB)
    r_j = tl.sum(tl.where(ib[:, None] == j, r, 0.0), 0)
    e = tl.where(ib[:, None] >= j, tl.exp(tl.minimum(r - r_j[None, :], 0.0)), 0.0)
    return _expand_rows(e, BT, BK)


@triton.jit
def _intra_A(q, k, c, r, R, spread, BT: tl.constexpr, BK: tl.constexpr, MAX_SPREAD: tl.constexpr,
             DT: tl.constexpr, PREC: tl.constexpr):
    """The causal intra-chunk block A [BT, BT] and e^{c}, e^{−c} (the latter only meaningful on the fast path)."""
    NB: tl.constexpr = BT // 16
    rows = tl.arange(0, BT)
    blk = rows // 16
    causal = rows[:, None] >= rows[None, :]
    ec = tl.exp(c)
    A = tl.zeros([BT, BT], dtype=tl.float32)
    if spread < MAX_SPREAD:
        enc = tl.exp(-c)
        qt = q * ec
        kt = k * enc
        for j in tl.static_range(NB):
            Ej = _sub_decay(r, j, BT, BK)
            kj = tl.where((blk == j)[:, None], kt, 0.0)
            A += tl.dot((qt * Ej).to(DT), tl.trans(kj.to(DT)), input_precision=PREC)
    else:
        enc = tl.zeros([BT, BK], dtype=tl.float32)
        b = R + c
        for j in range(BT):
            k_j = _row(k, rows, j)
            b_j = _row(b, rows, j)
            w = tl.exp(tl.where(rows[:, None] >= j, b - b_j[None, :], float("-inf")))
            A += tl.where(rows[None, :] == j, tl.sum(q * k_j[None, :] * w, 1)[:, None], 0.0)
    return tl.where(causal, A, 0.0), ec, enc


@triton.jit
def cp_fwd_h_kernel(
    g, i, lb, h0, h, ht, cu_seqlens, chunk_offsets, T, NT,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    NV: tl.constexpr, I_ACT: tl.constexpr, HAS_LB: tl.constexpr, HAS_H0: tl.constexpr, STORE_HT: tl.constexpr,
    VARLEN: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr,
):
    i_kv, i_nh = tl.program_id(0), tl.program_id(1)
    i_k, i_v = i_kv // NV, i_kv % NV
    i_n, i_h = i_nh // H, i_nh % H
    bos, eos = _seq_bounds(cu_seqlens, i_n, T, VARLEN)
    boff = _chunk_offset(chunk_offsets, i_n, NT, VARLEN)
    ck = i_k * BK + tl.arange(0, BK)
    cv = i_v * BV + tl.arange(0, BV)
    beta = _load_beta(lb, i_h, K, ck, HAS_LB)
    s_pos = cv[:, None] * K + ck[None, :]
    s_mask = (cv < V)[:, None] & (ck < K)[None, :]
    if HAS_H0:
        S = tl.load(h0 + i_nh.to(tl.int64) * V * K + s_pos, mask=s_mask, other=0.0).to(tl.float32)
    else:
        S = tl.zeros([BV, BK], dtype=tl.float32)

    offk, offv, mtk, mtv = _tile(bos, bos, eos, i_h, H, K, V, ck, cv, BK, BV, BT)
    g_nx = tl.load(g + offk, mask=mtk, other=0.0)
    i_nx = tl.load(i + offv, mask=mtv, other=0.0)
    for c in range(0, tl.cdiv(eos - bos, BT)):
        t0 = bos + c * BT
        g_t, i_t = g_nx, i_nx
        offk, offv, mtk, mtv = _tile(t0 + BT, bos, eos, i_h, H, K, V, ck, cv, BK, BV, BT)
        g_nx = tl.load(g + offk, mask=mtk, other=0.0)
        i_nx = tl.load(i + offv, mask=mtv, other=0.0)
        offk, offv, mtk, mtv = _tile(t0, bos, eos, i_h, H, K, V, ck, cv, BK, BV, BT)

        tl.store(h + ((boff + c) * H + i_h) * V * K + s_pos, S.to(h.dtype.element_ty), mask=s_mask)
        a, k, _, _, _ = _gates(g_t.to(tl.float32), beta, HAS_LB)
        a = tl.where(mtk, a, 0.0)
        k = tl.where(mtk, k, 0.0)
        v = tl.where(mtv, _act(i_t.to(tl.float32), I_ACT), 0.0)
        b = tl.cumsum(a, 0)
        b_last = tl.sum(a, 0)
        w = k * tl.exp(b_last[None, :] - b)
        S = S * tl.exp(b_last)[None, :] + tl.dot(tl.trans(v.to(DT)), w.to(DT), input_precision=PREC)

    if STORE_HT:
        tl.store(ht + i_nh.to(tl.int64) * V * K + s_pos, S, mask=s_mask)


@triton.jit
def cp_fwd_o_kernel(
    o, g, i, lb, h, y, a_out, chunks, scale, T, NT,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    O_ACT: tl.constexpr, I_ACT: tl.constexpr, HAS_LB: tl.constexpr, VARLEN: tl.constexpr,
    MAX_SPREAD: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr, STORE_A: tl.constexpr,
):
    """One program per (V-block, chunk, head); loops over K-blocks of BK (A and y accumulate over them; the
    fast/exact choice of the intra block is made per K-block). STORE_A: the first V-block also stores the
    causal A [BT, BT] of its chunk and head (in a_out's dtype) for the backward's dv."""
    i_c, i_v, i_h = tl.program_id(0), tl.program_id(1), tl.program_id(2)  # chunks on axis 0 (2^31)
    t0, t1 = _chunk_bounds(chunks, i_c, T, NT, BT, VARLEN)
    cv = i_v * BV + tl.arange(0, BV)
    h_base = h + (i_c.to(tl.int64) * H + i_h) * V * K
    out = tl.zeros([BT, BV], dtype=tl.float32)
    A = tl.zeros([BT, BT], dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BK)):
        ck = kb * BK + tl.arange(0, BK)
        offk, offv, mtk, mtv = _tile(t0, t0, t1, i_h, H, K, V, ck, cv, BK, BV, BT)
        o_t = tl.load(o + offk, mask=mtk, other=0.0)
        g_t = tl.load(g + offk, mask=mtk, other=0.0)
        s_mask = (cv < tl.where(t0 < t1, V, 0))[:, None] & (ck < K)[None, :]  # none for padding chunks
        h_t = tl.load(h_base + cv[:, None] * K + ck[None, :], mask=s_mask, other=0.0)
        beta = _load_beta(lb, i_h, K, ck, HAS_LB)

        q = _act(o_t.to(tl.float32), O_ACT) * scale
        a, k, _, _, _ = _gates(g_t.to(tl.float32), beta, HAS_LB)
        a = tl.where(mtk, a, 0.0)
        k = tl.where(mtk, k, 0.0)
        c, r, R, b_last = _chunk_decay(a, BT, BK)
        A_k, ec, _ = _intra_A(q, k, c, r, R, -tl.min(tl.min(c, 1), 0), BT, BK, MAX_SPREAD, DT, PREC)
        A += A_k
        eb = ec * _expand_rows(tl.exp(r), BT, BK)
        out += tl.dot((q * eb).to(DT), tl.trans(h_t.to(DT)), input_precision=PREC)

    offk, offv, mtk, mtv = _tile(t0, t0, t1, i_h, H, K, V, tl.arange(0, BK), cv, BK, BV, BT)
    i_t = tl.load(i + offv, mask=mtv, other=0.0)
    v = tl.where(mtv, _act(i_t.to(tl.float32), I_ACT), 0.0)
    out += tl.dot(A.to(DT), v.to(DT), input_precision=PREC)
    tl.store(y + offv, out.to(y.dtype.element_ty), mask=mtv)
    if STORE_A:
        if i_v == 0:
            rows = tl.arange(0, BT)
            a_pos = (i_c.to(tl.int64) * H + i_h) * BT * BT + rows[:, None] * BT + rows[None, :]
            tl.store(a_out + a_pos, A.to(a_out.dtype.element_ty))
