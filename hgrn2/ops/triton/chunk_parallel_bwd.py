"""Chunk-parallel backward: a short reverse pass for the per-chunk state gradients, then one program per chunk.

Notation as in `chunk_parallel_fwd.py`. For chunk c with start state h_c and dh_c = the gradient w.r.t. its END state
(everything later chunks and dht send back):

1. `chunk_parallel_bwd_dh_kernel`, grid (NK·NV, N·H), reverse over chunks: stores dh_c, then
   dS ← dS ⊙ e^{b_last} + dyᵀ (q ⊙ e^b); d initial_state = dS at the start. K may be split.
2. `chunk_parallel_bwd_kernel`, grid (NT_total, NV, H), one program per chunk (and V-block):

       dv = Aᵀ dy + (k ⊙ e^{b_last − b}) dh_cᵀ
       dq = e^b ⊙ (dy h_c) + intra(dA)             dA = dy vᵀ (causal)
       dk = e^{b_last − b} ⊙ (v dh_c) + intra(dA)
       d log f_t = Σ_{t ≤ t' in chunk} (q ⊙ dq − k ⊙ dk)_{t'} + Σ_v dh_c ⊙ S_end
       Σ_v dh_c ⊙ S_end = e^{b_last} ⊙ Σ_v (dh_c ⊙ h_c) + Σ_{s in chunk} k_s ⊙ dk_state_s

   (the GLA identity restarted per chunk: b_t enters the loss through e^{b_t}, e^{b_t − b_s}, and — for
   the last row — through S_end = h_c e^{b_last} + Σ_s v_s (k_s e^{b_last − b_s})ᵀ; the last term is exact,
   no running sum crosses chunks). Then dL/df = dlogf / f − dk, dg = kσ(g)·dL/df, dβ = Σ σ(−g)·dL/df,
   do = dq·scale·act_o', di = dv·act_i'. With V split (NV > 1) do, dg are fp32 partial sums (linear in dq,
   dk, dlogf), added in torch.
"""

import triton
import triton.language as tl

from ._common import (
    SMALL_F,
    SMALL_GROUP,
    act,
    act_and_grad,
    chunk_bounds,
    chunk_decay,
    chunk_offset,
    chunk_tile,
    exact_pair_grads,
    expand_rows,
    fast_exp,
    fast_rcp,
    gates,
    half_decay,
    intra_A,
    listed,
    load_beta,
    load_gates,
    ref_decay,
    seq_bounds,
    sub_decay,
    suffix_exponent,
    tier_list,
    walk_loads,
)


@triton.jit
def chunk_parallel_bwd_dh_kernel(
    o, bb, dy, dht, dh, dh0, cu_seqlens, chunk_offsets, scale, T, NT,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    NV: tl.constexpr, O_ACT: tl.constexpr, HAS_DHT: tl.constexpr, STORE_DH0: tl.constexpr, VARLEN: tl.constexpr,
    DT: tl.constexpr, PREC: tl.constexpr,
):
    """Walks one sequence's chunks backwards for a [BV, BK] block of dS, from b (`chunk_parallel_decay_kernel`'s) as the
    forward walk: no gate, no log, no row scan per step."""
    i_kv, i_nh = tl.program_id(0), tl.program_id(1)
    i_k, i_v = i_kv // NV, i_kv % NV
    i_n, i_h = i_nh // H, i_nh % H
    bos, eos = seq_bounds(cu_seqlens, i_n, T, VARLEN)
    ck = i_k * BK + tl.arange(0, BK)
    cv = i_v * BV + tl.arange(0, BV)
    s_pos = cv[:, None] * K + ck[None, :]
    s_mask = (cv < V)[:, None] & (ck < K)[None, :]
    if HAS_DHT:
        dS = tl.load(dht + i_nh.to(tl.int64) * V * K + s_pos, mask=s_mask, other=0.0).to(tl.float32)
    else:
        dS = tl.zeros([BV, BK], dtype=tl.float32)

    n_c = tl.cdiv(eos - bos, BT)
    # pointers at the last chunk's first row and this head (int64 scalars), moved back one chunk per step
    t_last = bos + (n_c - 1) * BT
    o, bb, dy = o + (t_last * H + i_h) * K, bb + (t_last * H + i_h) * K, dy + (t_last * H + i_h) * V
    dh += ((chunk_offset(chunk_offsets, i_n, NT, VARLEN) + n_c - 1) * H + i_h) * V * K
    left = tl.where(n_c > 0, eos - t_last, 0).to(tl.int32)  # rows from the current chunk's start to the end
    o_nx, b_nx, bl_nx, dy_nx = walk_loads(o, bb, dy, left, ck, cv, H, K, V, BK, BV, BT)
    for it in range(0, n_c):
        o_t, b_t, bl_t, dy_t = o_nx, b_nx, bl_nx, dy_nx
        _, mtk = chunk_tile(left, ck, H, K, BK, BT)
        o, bb, dy, left = o - BT * H * K, bb - BT * H * K, dy - BT * H * V, left + BT
        o_nx, b_nx, bl_nx, dy_nx = walk_loads(o, bb, dy, tl.where(it < n_c - 1, left, 0), ck, cv, H, K, V, BK,
                                               BV, BT)

        tl.store(dh + s_pos, dS.to(dh.dtype.element_ty), mask=s_mask)
        dh -= H * V * K
        qe = tl.where(mtk, act(o_t.to(tl.float32), O_ACT) * scale * fast_exp(b_t), 0.0)
        dS = dS * fast_exp(bl_t)[None, :] + tl.dot(tl.trans(dy_t.to(DT)), qe.to(DT), input_precision=PREC)

    if STORE_DH0:
        tl.store(dh0 + i_nh.to(tl.int64) * V * K + s_pos, dS, mask=s_mask)


@triton.jit
def chunk_parallel_bwd_kernel(
    o, g, i, lb, h, a_in, dh, dy, do, dg, di, dlb, bb, fb, chunks, scale, T, NT, NC, NTOK,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    O_ACT: tl.constexpr, I_ACT: tl.constexpr, HAS_LB: tl.constexpr, VARLEN: tl.constexpr,
    MAX_SPREAD: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr,
    DV: tl.constexpr, DQK: tl.constexpr, LOAD_A: tl.constexpr, TIER: tl.constexpr,
):
    """One program per (chunk, V-block, head), one loop over K-blocks of BK: dA = dy vᵀ comes first (it needs
    no gate), then per K-block the gates, the intra-chunk terms, dv's state share, dq, dk, d log f and the
    stores of do, dg and the β partial sums; dv = Aᵀ dy + its state share at the end.

    Three launches by TIER, as the forward's (`chunk_parallel_fwd_o_kernel`): the chunk tier (grid
    (NC, NV, H)) from the b that `chunk_parallel_decay_kernel` stored in bb, then on a small grid (P, NV, 1) the
    chunks it listed for the halves tier, and those it listed for the fallback (sub-block or exact tier), which the
    chunk-tier launch leaves to them. DV / DQK select the outputs: both (one fused launch, the default) or one each
    (two launches that recompute the gates and re-read o, g, dy, dh but hold far fewer registers;
    `ChunkParallelConfig.bwd_split`). LOAD_A: A is the forward's (`ChunkParallelConfig.save_a`), read once instead
    of rebuilt from every K-block."""
    i_v = tl.program_id(1)
    if TIER == 0:
        if tl.load(fb + 2 + tl.program_id(0) * H + tl.program_id(2)) == 0:  # a listed chunk is a later launch's
            _bwd_at(o, g, i, lb, h, a_in, dh, dy, do, dg, di, dlb, bb, chunks, scale, T, NT, NC, NTOK,
                    tl.program_id(0), i_v, tl.program_id(2), H, K, V, BT, BK, BV, O_ACT, I_ACT, HAS_LB, VARLEN,
                    MAX_SPREAD, DT, PREC, DV, DQK, LOAD_A, TIER)
    else:
        count, entries = tier_list(fb, NC, H, TIER)
        for e in range(tl.program_id(0), count, tl.num_programs(0)):
            c_h = tl.load(entries + e)
            if listed(fb, c_h, TIER):
                _bwd_at(o, g, i, lb, h, a_in, dh, dy, do, dg, di, dlb, bb, chunks, scale, T, NT, NC, NTOK,
                        c_h // H, i_v, c_h % H, H, K, V, BT, BK, BV, O_ACT, I_ACT, HAS_LB, VARLEN, MAX_SPREAD, DT,
                        PREC, DV, DQK, LOAD_A, TIER)


@triton.jit
def _bwd_at(o, g, i, lb, h, a_in, dh, dy, do, dg, di, dlb, bb, chunks, scale, T, NT, NC, NTOK, i_c, i_v, i_h,
               H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
               BV: tl.constexpr, O_ACT: tl.constexpr, I_ACT: tl.constexpr, HAS_LB: tl.constexpr, VARLEN: tl.constexpr,
               MAX_SPREAD: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr, DV: tl.constexpr, DQK: tl.constexpr,
               LOAD_A: tl.constexpr, TIER: tl.constexpr):
    """`chunk_parallel_bwd_kernel` on chunk i_c, V-block i_v, head i_h: the pointers moved to the chunk, then its
    work."""
    t0, t1 = chunk_bounds(chunks, i_c, T, NT, BT, VARLEN)
    n = (t1 - t0).to(tl.int32)
    # the chunk's rows and head as one int64 offset per pointer; the tiles' offsets from there are int32
    base_k, base_v = (t0 * H + i_h) * K, (t0 * H + i_h) * V
    part = i_v.to(tl.int64) * NTOK * H * K  # this V-block's slice of the partial do / dg
    o, g, bb, do, dg = o + base_k, g + base_k, bb + base_k, do + part + base_k, dg + part + base_k
    i, dy, di = i + base_v, dy + base_v, di + base_v
    h, dh = h + (i_c.to(tl.int64) * H + i_h) * V * K, dh + (i_c.to(tl.int64) * H + i_h) * V * K
    if LOAD_A:
        a_in += (i_c.to(tl.int64) * H + i_h) * BT * BT  # the forward's A of this chunk and head
    # the β partial sums [H, K, NV · NC], a column per (V-block, chunk): their sum over chunks reads rows
    rs = tl.num_programs(1) * NC
    if HAS_LB:
        dlb += i_h.to(tl.int64) * K * rs + i_v * NC + i_c  # this program's column
    if n > 0:  # padding chunks: their β partial sums stay 0
        _bwd_chunk(o, g, i, lb, h, a_in, dh, dy, do, dg, di, dlb, rs, bb, scale, n, i_v, i_h, H, K, V, BT, BK,
                      BV, O_ACT, I_ACT, HAS_LB, MAX_SPREAD, DT, PREC, DV, DQK, LOAD_A, TIER)


@triton.jit
def _bwd_chunk(o, g, i, lb, h, a_in, dh, dy, do, dg, di, dlb, rs, bb, scale, n, i_v, i_h, H: tl.constexpr,
                  K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                  O_ACT: tl.constexpr, I_ACT: tl.constexpr, HAS_LB: tl.constexpr, MAX_SPREAD: tl.constexpr,
                  DT: tl.constexpr, PREC: tl.constexpr, DV: tl.constexpr, DQK: tl.constexpr, LOAD_A: tl.constexpr,
                  TIER: tl.constexpr):
    """`chunk_parallel_bwd_kernel`'s work on one chunk of n rows (every pointer at the chunk's first row and head)."""
    rows = tl.arange(0, BT)
    causal = rows[:, None] >= rows[None, :]
    cv = i_v * BV + tl.arange(0, BV)
    offv, mtv = chunk_tile(n, cv, H, V, BV, BT)
    i_t = tl.load(i + offv, mask=mtv, other=0.0)
    dy_t = tl.load(dy + offv, mask=mtv, other=0.0)
    b_do = dy_t.to(DT)
    if DQK:
        v_c = tl.where(mtv, act(i_t.to(tl.float32), I_ACT), 0.0).to(DT)
        dA = tl.dot(b_do, tl.trans(v_c), input_precision=PREC)
        dA = tl.where(causal, dA, 0.0).to(DT)
    if DV:
        if LOAD_A:  # issued before the K loop: its latency hides behind it
            A = tl.load(a_in + (rows[:, None] * BT + rows[None, :]))
        else:
            A = tl.zeros([BT, BT], dtype=tl.float32)
        dvT = tl.zeros([BV, BT], dtype=tl.float32)

    for kb in range(0, tl.cdiv(K, BK)):
        ck = kb * BK + tl.arange(0, BK)
        offk, mtk, beta, q, a, k = load_gates(o, g, lb, n, ck, i_h, scale, H, K, BK, BT, O_ACT, HAS_LB)
        s_off = cv[:, None] * K + ck[None, :]
        s_mask = (cv < V)[:, None] & (ck < K)[None, :]
        dh_t = tl.load(dh + s_off, mask=s_mask, other=0.0)
        # intra-chunk terms of dq, dk and their share of d log f's sum, q ⊙ dq − k ⊙ dk: its pairs cancel (the
        # sum over the chunk is 0), so the share is formed from the rounded dot operands that carry each pair
        # into dq and dk — then it cancels to fp32 rounding, not to bf16's (see `_common.diag_grads`)
        if TIER == 2:
            a = tl.where(mtk, a, 0.0)
            c, r, b_last = chunk_decay(a, BT, BK)
            spread = -tl.min(tl.min(c, 1), 0)
            if DV and not LOAD_A:
                A_k, ec, enc = intra_A(q, k, a, c, r, spread, BT, BK, MAX_SPREAD, DT, PREC)
                A += A_k
            else:  # e^{±c} only (e^{−c} is used on the fast path only; clamped so that it stays finite)
                ec = fast_exp(c)
                enc = fast_exp(tl.minimum(-c, 80.0))
            eb = ec * expand_rows(fast_exp(r), BT, BK)
            # e^{b_last − b}: from e^{−c} on the fast path, else a sum over the later rows (exponent ≤ 0)
            if spread < MAX_SPREAD:
                w_end = enc * expand_rows(fast_exp(b_last[None, :] - r), BT, BK)
            else:
                w_end = fast_exp(suffix_exponent(a, rows))
            if DQK:
                dq_i, dk_i, db_i = _intra_dqk_sub(q, k, a, c, r, spread, ec, enc, dA, rows, BT, BK, MAX_SPREAD,
                                                  DT, PREC)
        elif TIER == 1:
            e_q, e_k, em, el, across, up, b_last = half_decay(bb, n, offk, mtk, ck, H, K, BT)
            qt = (q * e_q).to(DT)
            kt = (k * e_k).to(DT)
            kx = (k * e_k * across).to(DT)  # the first half's sources as seen from the second half's rows
            qt1 = tl.where(up, qt, 0.0)
            qt2 = tl.where(up, 0.0, qt)
            eb = e_q * em
            w_end = e_k * el
            if DV and not LOAD_A:
                A_k = tl.dot(qt1, tl.trans(kt), input_precision=PREC) + tl.dot(qt2, tl.trans(kx), input_precision=PREC)
                A += tl.where(causal, A_k, 0.0)
            if DQK:
                # each pair enters dq and dk through the operands of its half's product, and d log f's share
                # through the same ones
                dq_raw = tl.where(up, tl.dot(dA, kt, input_precision=PREC), tl.dot(dA, kx, input_precision=PREC))
                dk_1 = tl.dot(tl.trans(dA), qt1, input_precision=PREC)
                dk_2 = tl.dot(tl.trans(dA), qt2, input_precision=PREC)
                db_i = qt.to(tl.float32) * dq_raw - kt.to(tl.float32) * dk_1 - kx.to(tl.float32) * dk_2
                dq_i = e_q * dq_raw
                dk_i = e_k * (dk_1 + across * dk_2)
        else:
            e_q, e_k, m = ref_decay(bb, n, offk, mtk, ck, H, K)
            b_last = 2.0 * m
            qt = (q * e_q).to(DT)
            kt = (k * e_k).to(DT)
            em = fast_exp(m)[None, :]
            eb = e_q * em
            w_end = e_k * em  # e^{b_last − b} = e^{m − b}·e^{b_last − m}, and b_last − m = m
            if DV and not LOAD_A:
                A += tl.where(causal, tl.dot(qt, tl.trans(kt), input_precision=PREC), 0.0)
            if DQK:
                dq_raw = tl.dot(dA, kt, input_precision=PREC)
                dk_raw = tl.dot(tl.trans(dA), qt, input_precision=PREC)
                db_i = qt.to(tl.float32) * dq_raw - kt.to(tl.float32) * dk_raw
                dq_i = e_q * dq_raw
                dk_i = e_k * dk_raw
        dh_c = dh_t.to(DT)
        if DV:
            # dv's state share, accumulated transposed: dh_c (k e^{b_last − b})ᵀ. The untransposed form
            # (k e^{b_last − b}) dh_cᵀ breaks Triton 3.6's layout pass for fp32 inputs (k as the left operand).
            dvT += tl.dot(dh_c, tl.trans((k * w_end).to(DT)), input_precision=PREC)
        if DQK:
            _bwd_dqk(o, g, h, do, dg, dlb, rs, q, k, b_last, eb, w_end, dq_i, dk_i, db_i, b_do, v_c, dh_t, dh_c,
                        beta, offk, mtk, s_off, s_mask, ck, scale, K, O_ACT, HAS_LB, DT, PREC)

    if DV:
        dv = tl.trans(dvT) + tl.dot(tl.trans(A.to(DT)), b_do, input_precision=PREC)
        _, dv_act = act_and_grad(tl.load(i + offv, mask=mtv, other=0.0).to(tl.float32), I_ACT)  # reloaded
        tl.store(di + offv, (dv * dv_act).to(di.dtype.element_ty), mask=mtv)


@triton.jit
def _intra_dqk_sub(q, k, a, c, r, spread, ec, enc, dA, rows, BT: tl.constexpr, BK: tl.constexpr,
                   MAX_SPREAD: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr):
    """The sub-block and exact tiers of the intra-chunk dq, dk and q ⊙ dq − k ⊙ dk [BT, BK] from dA."""
    NB: tl.constexpr = BT // 16
    blk = rows // 16
    if spread < MAX_SPREAD:
        qt = q * ec
        kt = (k * enc).to(DT)
        dq_i = tl.zeros([BT, BK], dtype=tl.float32)
        dk_i = tl.zeros([BT, BK], dtype=tl.float32)
        db_i = tl.zeros([BT, BK], dtype=tl.float32)
        # sub-block j of the sources: mask the K-block side, not dA (a masked dA would be loop-invariant,
        # and the compiler would keep NB converted copies of it alive across the K loop)
        for j in tl.static_range(NB):
            Ej = sub_decay(r, j, BT, BK)
            qt_j = (qt * Ej).to(DT)
            dq_j = tl.dot(dA, tl.where((blk == j)[:, None], kt, 0.0), input_precision=PREC)
            dq_i += Ej * dq_j
            db_i += qt_j.to(tl.float32) * dq_j
            dk_i += tl.where((blk == j)[:, None], tl.dot(tl.trans(dA), qt_j, input_precision=PREC), 0.0)
        db_i -= kt.to(tl.float32) * dk_i
        dq_i = dq_i * ec
        dk_i = dk_i * enc
    else:
        dq_i, dk_i = exact_pair_grads(q, k, a, dA, rows)
        db_i = q * dq_i - k * dk_i
    return dq_i, dk_i, db_i


@triton.jit
def _bwd_dqk(o, g, h, do, dg, dlb, rs, q, k, b_last, eb, w_end, dq_i, dk_i, db_i, b_do, v_c, dh_t, dh_c, beta, offk,
                mtk, s_off, s_mask, ck, scale, K: tl.constexpr, O_ACT: tl.constexpr, HAS_LB: tl.constexpr,
                DT: tl.constexpr, PREC: tl.constexpr):
    """One K-block of `chunk_parallel_bwd_kernel`'s dq, dk (the intra terms given), d log f and the stores of do,
    dg and the β partial sums (pointers at the chunk's first row and head)."""
    # state terms (operands in the dot dtype: h and dh are stored in it anyway)
    h_t = tl.load(h + s_off, mask=s_mask, other=0.0)
    dq_s = eb * tl.dot(b_do, h_t.to(DT), input_precision=PREC)
    b_dq = dq_s + dq_i
    dk_s = w_end * tl.dot(v_c, dh_c, input_precision=PREC)
    b_dk = dk_s + dk_i
    _, dq_act = act_and_grad(tl.load(o + offk, mask=mtk, other=0.0).to(tl.float32), O_ACT)
    tl.store(do + offk, (b_dq * scale * dq_act).to(do.dtype.element_ty), mask=mtk)

    # d log f_t = e^{b_last} Σ_v dh_c ⊙ h_c + Σ_s y_s + Σ_{t' ≥ t} (x − y)_t' with x = q ⊙ dq_s + the intra share,
    # y = k ⊙ dk_s; as Σ_{t' ≥ t} x + Σ_{t' < t} y it takes a forward scan and a sum over the chunk (a reverse
    # scan takes half as many instructions again, and the scans and sums are a large share of this kernel)
    x = q * dq_s + db_i
    y = k * dk_s
    tail = fast_exp(b_last) * tl.sum(dh_t.to(tl.float32) * h_t.to(tl.float32), 0) + tl.sum(x, 0)
    # The scan also hands dk and y − x over, unchanged ('keep the later' operand): the compiler then runs d log f's
    # rest, dg and dβ in the scan's layout, not back in the dot layout through five layout conversions (each a
    # shared-memory round trip with a barrier).
    cz, z, b_dk = tl.associative_scan((y - x, y - x, b_dk), 0, _sum_keep_later)
    b_dlogf = tail[None, :] + cz - z
    # σ(±g), f recomputed from a reloaded tile (fewer live registers)
    g_2 = tl.load(g + offk, mask=mtk, other=0.0)
    _, _, s_pos, s_neg, f = gates(g_2.to(tl.float32), beta, HAS_LB)
    d_f = b_dlogf * fast_rcp(tl.maximum(f, 1e-30)) - b_dk
    tl.store(dg + offk, (k * s_pos * d_f).to(dg.dtype.element_ty), mask=mtk)
    if HAS_LB:  # the gates below SMALL_F take their share from `chunk_parallel_bwd_small_kernel`
        dlb_p = tl.sum(tl.where(mtk & (f >= SMALL_F), s_neg * d_f, 0.0), 0)
        tl.store(dlb + ck * rs, dlb_p, mask=ck < K)


@triton.jit
def _sum_keep_later(s1, z1, k1, s2, z2, k2):
    """Scan combine: a sum, and two operands passed through (the later one kept: the scan returns them as given)."""
    return s1 + s2, z2, k2


@triton.jit
def chunk_parallel_bwd_small_kernel(
    o, g, i, lb, h, dh, dy, dlb, fz, form, chunks, scale, T, NT, NC, RS,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BVS: tl.constexpr,
    O_ACT: tl.constexpr, I_ACT: tl.constexpr, VARLEN: tl.constexpr, SPREC: tl.constexpr, FORM: tl.constexpr,
    NP: tl.constexpr, PAIRS_PER_CHANNEL: tl.constexpr,
):
    """dβ's share of the forget gates below SMALL_F, exactly, added to V-block 0's β partial sums of the chunks that
    `chunk_parallel_decay_kernel` listed in fz (grid (P,): programs walking the list as the fallback launches do).

    There dL/df_t = Σ_v dH_t ⊙ (h_{t−1} − v_t) is formed directly, not as d log f / f (whose cancelling running sum
    would be divided by the small f), from the chunk-start state h_c and the end state's gradient dh_c, every
    exponent a sum of log f over the rows it spans (each ≤ 0: nothing divides by f), in one of two forms, launched
    one after the other:
    - FORM 0 (BK-wide K-blocks, those whose channel groups the chunk's mask leaves out skipped) counts each listed
      (chunk, head)'s small gates and the channels holding them, takes the chunk in the pair form (`_small_pairs`:
      NP (row, channel) pairs per step) when its steps are at most PAIRS_PER_CHANNEL per such channel, and records
      its choice in `form`;
    - FORM 1 (BK-wide K-blocks, skipping those whose channel groups the chunk's mask leaves out) takes the other
      chunks in the channel form (`_small_channels`: one [BT, BT] product per channel).
    Each launch is compiled on its own, so neither form's registers limit the other's occupancy."""
    for e in range(tl.program_id(0), tl.load(fz), tl.num_programs(0)):
        c_h = tl.load(fz + 1 + NC * H + e)
        groups = tl.load(fz + 1 + c_h).to(tl.int64)  # the chunk's channel groups holding a small gate
        if FORM == 0:
            _small_chunk(o, g, i, lb, h, dh, dy, dlb, form, chunks, c_h, groups, tl.arange(0, BK), scale, T, NT, NC,
                         RS, H, K, V, BT, BK, BVS, O_ACT, I_ACT, VARLEN, SPREC, FORM, NP, PAIRS_PER_CHANNEL)
        elif tl.load(form + c_h) != 0:
            for kb in range(0, tl.cdiv(K, BK)):
                if _block_flagged(groups, kb, BK):
                    _small_chunk(o, g, i, lb, h, dh, dy, dlb, form, chunks, c_h, groups, kb * BK + tl.arange(0, BK),
                                 scale, T, NT, NC, RS, H, K, V, BT, BK, BVS, O_ACT, I_ACT, VARLEN, SPREC, FORM, NP,
                                 PAIRS_PER_CHANNEL)


@triton.jit
def _block_flagged(groups, kb, BK: tl.constexpr):
    """Whether K-block kb holds a channel group that the chunk's mask `groups` (int64: a block may reach bit 31)
    flags."""
    first = tl.minimum(kb * BK // SMALL_GROUP, 31)
    last = tl.minimum((kb * BK + BK - 1) // SMALL_GROUP, 31)
    return (groups & (((tl.full([], 1, tl.int64) << (last - first + 1)) - 1) << first)) != 0


@triton.jit
def _small_chunk(o, g, i, lb, h, dh, dy, dlb, form, chunks, c_h, groups, ck, scale, T, NT, NC, RS,
                 H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                 BVS: tl.constexpr,
                 O_ACT: tl.constexpr, I_ACT: tl.constexpr, VARLEN: tl.constexpr, SPREC: tl.constexpr,
                 FORM: tl.constexpr, NP: tl.constexpr, PAIRS_PER_CHANNEL: tl.constexpr):
    """`chunk_parallel_bwd_small_kernel` on the listed (chunk, head) c_h: the pointers moved there, then its work."""
    i_c, i_h = c_h // H, c_h % H
    t0, t1 = chunk_bounds(chunks, i_c, T, NT, BT, VARLEN)
    n = (t1 - t0).to(tl.int32)
    base_k, base_v = (t0 * H + i_h) * K, (t0 * H + i_h) * V
    state = (i_c.to(tl.int64) * H + i_h) * V * K
    row = dlb + i_h.to(tl.int64) * K * RS + i_c  # V-block 0's column (stride RS): the main kernel has written it
    if FORM == 0:
        _small_pairs_chunk(o + base_k, g + base_k, i + base_v, dy + base_v, lb, h + state, dh + state, row, RS,
                           form + c_h, groups, n, i_h, scale, H, K, V, BT, BK, BVS, NP, PAIRS_PER_CHANNEL, O_ACT,
                           I_ACT, SPREC)
    else:
        _small_channels_block(o + base_k, g + base_k, i + base_v, dy + base_v, lb, h + state, dh + state, row, RS, n,
                              i_h, ck, scale, H, K, V, BT, BK, BVS, O_ACT, I_ACT, SPREC)


@triton.jit
def _small_mask(g, lb, n, i_h, ck, H: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, BT: tl.constexpr):
    """1 where a gate of the chunk's columns ck is below SMALL_F, else 0 [BT, BK] (pointer at the chunk's first row
    and head)."""
    offk, mtk = chunk_tile(n, ck, H, K, BK, BT)
    f = gates(tl.load(g + offk, mask=mtk, other=0.0).to(tl.float32), load_beta(lb, i_h, K, ck, True), True)[4]
    return tl.where(mtk & (f < SMALL_F), 1, 0)


@triton.jit
def _small_pairs_chunk(o, g, i, dy, lb, h, dh, row, rs, form, groups, n, i_h, scale, H: tl.constexpr,
                       K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BVS: tl.constexpr,
                       NP: tl.constexpr,
                       PAIRS_PER_CHANNEL: tl.constexpr, O_ACT: tl.constexpr, I_ACT: tl.constexpr,
                       SPREC: tl.constexpr):
    """FORM 0 on one chunk (pointers at its first row and head; h, dh at its state): the choice of form, then the
    pair form over the K-blocks that `groups` flags when it is chosen (each block its own steps). A pair step costs
    about half a channel of the channel form."""
    steps = tl.zeros([], dtype=tl.int32)
    chans = tl.zeros([], dtype=tl.int32)
    for kb in range(0, tl.cdiv(K, BK)):
        if _block_flagged(groups, kb, BK):
            small = _small_mask(g, lb, n, i_h, kb * BK + tl.arange(0, BK), H, K, BK, BT)
            steps += tl.cdiv(tl.sum(small), NP)
            chans += tl.sum(tl.max(small, 0))
    use_pairs = steps <= PAIRS_PER_CHANNEL * chans
    tl.store(form, tl.where(use_pairs, 0, 1).to(tl.int8))
    if use_pairs:
        for kb in range(0, tl.cdiv(K, BK)):
            if _block_flagged(groups, kb, BK):
                ck = kb * BK + tl.arange(0, BK)
                acc = _small_pairs(o, g, i, dy, lb, h, dh, n, i_h, ck, scale, H, K, V, BT, BK, BVS, NP, O_ACT,
                                   I_ACT, SPREC)
                tl.store(row + ck * rs, tl.load(row + ck * rs, mask=ck < K, other=0.0) + acc, mask=ck < K)


@triton.jit
def _small_pairs(o, g, i, dy, lb, h, dh, n, i_h, ck, scale, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                 BT: tl.constexpr, BK: tl.constexpr, BVS: tl.constexpr, NP: tl.constexpr, O_ACT: tl.constexpr,
                 I_ACT: tl.constexpr, SPREC: tl.constexpr):
    """The pair form on the channels ck: the (row, channel) pairs holding a small gate, numbered row by row, then
    channel by channel, NP per step (`_pair_grads`). Returns the block's dβ share [BK]."""
    rows = tl.arange(0, BT)
    beta = load_beta(lb, i_h, K, ck, True)
    small = _small_mask(g, lb, n, i_h, ck, H, K, BK, BT)
    count = tl.sum(small, 1)  # per row
    end = tl.cumsum(count, 0)
    start = end - count
    total = tl.sum(count, 0)
    p = tl.arange(0, NP)
    acc = tl.zeros([BK], dtype=tl.float32)
    for base in range(0, total, NP):
        e = base + p
        valid = e < total
        tp = tl.minimum(tl.sum(tl.where(end[None, :] <= e[:, None], 1, 0), 1), BT - 1)  # the pair's row
        rank = e - tl.sum(tl.where(rows[None, :] == tp[:, None], start[None, :], 0), 1)
        # its channel: the rank-th small gate of row tp, whose gates are loaded again as one row per pair
        mr = valid[:, None] & (ck < K)[None, :]
        fr = gates(tl.load(g + tp[:, None] * (H * K) + ck[None, :], mask=mr, other=0.0).to(tl.float32), beta,
                   True)[4]
        fl = tl.where(mr & (fr < SMALL_F), 1, 0)
        hit = (fl > 0) & (tl.cumsum(fl, 1) - fl == rank[:, None])
        kp = tl.sum(tl.where(hit, ck[None, :], 0), 1)
        found = tl.max(hit.to(tl.int32), 1) > 0
        d_f = _pair_grads(o, g, i, dy, lb, h, dh, n, i_h, tp, kp, found, scale, H, K, V, BT, BVS, NP, O_ACT, I_ACT,
                          SPREC)
        acc += tl.sum(tl.where(hit, d_f[:, None], 0.0), 0)
    return acc


@triton.jit
def _pair_grads(o, g, i, dy, lb, h, dh, n, i_h, tp, kp, valid, scale, H: tl.constexpr, K: tl.constexpr,
                V: tl.constexpr, BT: tl.constexpr, BVS: tl.constexpr, NP: tl.constexpr, O_ACT: tl.constexpr,
                I_ACT: tl.constexpr, SPREC: tl.constexpr):
    """σ(−g)·dL/df at NP (row t, channel k) pairs [NP], from their channels' columns [BT, NP] (channel k's gates
    over the chunk's rows, one column per pair):

        h_{t−1} = α h_c + Σ_{s<t} N[s] v_s,   N[s] = k_s e^{Σ_{s<τ<t} log f_τ},   α = e^{Σ_{τ<t} log f_τ}
        dH_t = γ dh_c + Σ_{u≥t} M[u] dy_u,    M[u] = q_u e^{Σ_{t<τ≤u} log f_τ},   γ = e^{Σ_{τ>t} log f_τ}

    (channel k of the states), dL/df_t = Σ_v dH_t ⊙ (h_{t−1} − v_t): two [NP, BT] × [BT, V] products per step."""
    rows = tl.arange(0, BT)
    ok = (rows[:, None] < n) & valid[None, :]
    off = rows[:, None] * (H * K) + kp[None, :]
    beta = tl.load(lb + i_h * K + kp, mask=valid, other=0.0).to(tl.float32)
    a, k, _, s_neg, _ = gates(tl.load(g + off, mask=ok, other=0.0).to(tl.float32), beta, True)
    a = tl.where(ok, a, 0.0)
    # log f one row down, so that the exponents are sums over the rows they span
    okn = (rows[:, None] + 1 < n) & valid[None, :]
    a_next = tl.where(okn, gates(tl.load(g + H * K + off, mask=okn, other=0.0).to(tl.float32), beta, True)[0], 0.0)
    q = act(tl.load(o + off, mask=ok, other=0.0).to(tl.float32), O_ACT) * scale
    before = rows[:, None] < tp[None, :]
    after = rows[:, None] > tp[None, :]
    span_n = tl.cumsum(tl.where(rows[:, None] + 1 < tp[None, :], a_next, 0.0), 0, reverse=True)  # Σ_{s<τ<t}
    N = tl.where(before & ok, k * fast_exp(span_n), 0.0)
    span_m = tl.cumsum(tl.where(after, a, 0.0), 0)  # Σ_{t<τ≤u}
    M = tl.where(ok & (rows[:, None] >= tp[None, :]), q * fast_exp(span_m), 0.0)
    alpha = fast_exp(tl.sum(tl.where(before, a, 0.0), 0))
    gamma = fast_exp(tl.sum(tl.where(after, a, 0.0), 0))
    w = tl.sum(tl.where(ok & (rows[:, None] == tp[None, :]), s_neg, 0.0), 0)  # ∂f/∂β = σ(−g)
    d_f = tl.zeros([NP], dtype=tl.float32)
    for j in range(0, tl.cdiv(V, BVS)):
        cv, v, dy_j = _v_dy_block(i, dy, n, j, H, V, BT, BVS, I_ACT)
        mp = valid[:, None] & (cv < V)[None, :]
        s_off = cv[None, :] * K + kp[:, None]  # channel k of the states [V, K], one row per pair
        v_t = tl.where(mp, act(tl.load(i + tp[:, None] * (H * V) + cv[None, :], mask=mp, other=0.0).to(tl.float32),
                                I_ACT), 0.0)
        X = (alpha[:, None] * tl.load(h + s_off, mask=mp, other=0.0).to(tl.float32)
             + tl.dot(tl.trans(N), v, input_precision=SPREC) - v_t)  # h_{t−1} − v_t
        Y = (gamma[:, None] * tl.load(dh + s_off, mask=mp, other=0.0).to(tl.float32)
             + tl.dot(tl.trans(M), dy_j, input_precision=SPREC))  # dH_t
        d_f += tl.sum(X * Y, 1)
    return w * d_f


@triton.jit
def _small_channels_block(o, g, i, dy, lb, h, dh, row, rs, n, i_h, ck, scale, H: tl.constexpr, K: tl.constexpr,
                          V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BVS: tl.constexpr,
                          O_ACT: tl.constexpr, I_ACT: tl.constexpr, SPREC: tl.constexpr):
    """FORM 1 on one K-block of one chunk (pointers at its first row and head; h, dh at its state)."""
    rows = tl.arange(0, BT)
    cols = tl.arange(0, BK)
    beta = load_beta(lb, i_h, K, ck, True)
    offk, mtk = chunk_tile(n, ck, H, K, BK, BT)
    a, k, _, s_neg, f = gates(tl.load(g + offk, mask=mtk, other=0.0).to(tl.float32), beta, True)
    small = tl.where(mtk & (f < SMALL_F), 1, 0)
    row_any = tl.max(small, 1)
    chan_any = tl.max(small, 0)
    # bit t (j): row t (channel j) holds a small gate; the loops test scalars
    flagged = tl.sum(tl.where(row_any > 0, tl.full([BT], 1, tl.int64) << rows, 0), 0)
    chans = tl.sum(tl.where(chan_any > 0, tl.full([BK], 1, tl.int64) << cols, 0), 0)
    if flagged != 0:
        a = tl.where(mtk, a, 0.0)
        k = tl.where(mtk, k, 0.0)
        w = tl.where(small > 0, s_neg, 0.0)  # ∂f/∂β = σ(−g) where the gate is small
        q = tl.where(mtk, act(tl.load(o + offk, mask=mtk, other=0.0).to(tl.float32), O_ACT) * scale, 0.0)
        # log f one row down (a_next[s] = a[s + 1]), so that the exponents are sums over the rows they span
        offn, mtn = chunk_tile(n - 1, ck, H, K, BK, BT)
        a_next = tl.where(mtn, gates(tl.load(g + H * K + offn, mask=mtn, other=0.0).to(tl.float32), beta,
                                     True)[0], 0.0)
        acc = _small_channels(i, dy, h, dh, n, ck, a, k, w, q, a_next, chans, rows, cols, H, K, V, BT, BK,
                              BVS, I_ACT, SPREC)
        tl.store(row + ck * rs, tl.load(row + ck * rs, mask=ck < K, other=0.0) + acc, mask=ck < K)


@triton.jit
def _small_channels(i, dy, h, dh, n, ck, a, k, w, q, a_next, chans, rows, cols, H: tl.constexpr, K: tl.constexpr,
                    V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BVS: tl.constexpr, I_ACT: tl.constexpr,
                    SPREC: tl.constexpr):
    """The channel form, in sub-chunks of SB = 16 rows. Each sub-chunk j's start state S_j and its end state's
    gradient E_j (from the rows after it) come from the chunk's h_c and dh_c in one product each,

        S_j = e^{Σ_{τ<r_j} log f_τ} h_c + Σ_{s<r_j} v_s (k_s e^{Σ_{s<τ<r_j} log f_τ})
        E_j = e^{Σ_{τ>e_j} log f_τ} dh_c + Σ_{u>e_j} dy_u (q_u e^{Σ_{e_j<τ≤u} log f_τ})

    (r_j, e_j its first and last row); within a sub-chunk, per channel (its index dropped),

        h_{t−1} = α_t S_j + Σ_{s<t} N[t, s] v_s     N[t, s] = k_s e^{Σ_{s<τ<t} log f_τ},  α_t = e^{Σ_{r_j≤τ<t} log f_τ}
        dH_t = γ_t E_j + Σ_{u≥t} M[t, u] dy_u       M[t, u] = q_u e^{Σ_{t<τ≤u} log f_τ},  γ_t = e^{Σ_{t<τ≤e_j} log f_τ}

    so that dL/df_t = Σ_v dH_t ⊙ (h_{t−1} − v_t) is, with Ñ = N − I and, per sub-chunk, G = dy vᵀ, Vd = v E_j,
    Yh = dy S_j (the products over V, shared by the block's channels),

        γ_t (α_t Σ_v E_j ⊙ S_j + (Ñ Vd)_t) + α_t (M Yh)_t + Σ_s (M G)[t, s] Ñ[t, s],

    one [16, 16] product per sub-chunk and channel that holds a small gate: a [BT, BT] one per channel would cost
    BT/16 times the products and elementwise work. Every exponent is a sum of log f over the rows it spans (each
    ≤ 0: none is a difference, so none cancels). Returns the block's dβ share [BK]."""
    SB: tl.constexpr = 16
    NB: tl.constexpr = BT // SB
    first = tl.arange(0, NB) * SB
    r3, s3, e3 = rows[:, None, None], first[None, :, None], (first + SB - 1)[None, :, None]
    span_h = tl.cumsum(tl.where(r3 + 1 < s3, a_next[:, None, :], 0.0), 0, reverse=True)  # Σ_{s<τ<r_j}
    into_start = tl.reshape(tl.where(r3 < s3, k[:, None, :] * fast_exp(span_h), 0.0), (BT, NB * BK))
    span_d = tl.cumsum(tl.where(r3 > e3, a[:, None, :], 0.0), 0)  # Σ_{e_j<τ≤u}
    into_end = tl.reshape(tl.where(r3 > e3, q[:, None, :] * fast_exp(span_d), 0.0), (BT, NB * BK))
    to_start = fast_exp(tl.sum(tl.where(r3 < s3, a[:, None, :], 0.0), 0))  # [NB, BK]
    to_end = fast_exp(tl.sum(tl.where(r3 > e3, a[:, None, :], 0.0), 0))
    G = tl.zeros([NB, SB, SB], dtype=tl.float32)
    Vd = tl.zeros([NB, SB, BK], dtype=tl.float32)
    Yh = tl.zeros([NB, SB, BK], dtype=tl.float32)
    hd = tl.zeros([NB, BK], dtype=tl.float32)
    for j in range(0, tl.cdiv(V, BVS)):
        cv, v, dy_j = _v_dy_block(i, dy, n, j, H, V, BT, BVS, I_ACT)
        s_off = cv[:, None] * K + ck[None, :]
        s_mask = (cv < V)[:, None] & (ck < K)[None, :]
        S = tl.load(h + s_off, mask=s_mask, other=0.0).to(tl.float32)
        dS = tl.load(dh + s_off, mask=s_mask, other=0.0).to(tl.float32)
        starts = tl.permute(tl.reshape(tl.dot(tl.trans(v), into_start, input_precision=SPREC), (BVS, NB, BK)),
                            (1, 0, 2)) + S[None, :, :] * to_start[:, None, :]  # [NB, BVS, BK]
        ends = tl.permute(tl.reshape(tl.dot(tl.trans(dy_j), into_end, input_precision=SPREC), (BVS, NB, BK)),
                          (1, 0, 2)) + dS[None, :, :] * to_end[:, None, :]
        v3 = tl.reshape(v, (NB, SB, BVS))
        dy3 = tl.reshape(dy_j, (NB, SB, BVS))
        G = tl.dot(dy3, tl.permute(v3, (0, 2, 1)), G, input_precision=SPREC)
        Vd = tl.dot(v3, ends, Vd, input_precision=SPREC)
        Yh = tl.dot(dy3, starts, Yh, input_precision=SPREC)
        hd += tl.sum(ends * starts, 1)
    eye = (tl.arange(0, SB)[:, None] == tl.arange(0, SB)[None, :])[None, :, :]
    acc = tl.zeros([BK], dtype=tl.float32)
    for c in range(0, BK):
        if (chans >> c) & 1:
            P, Q, alpha, gamma = _sub_decays(tl.reshape(_column(a, cols, c), (NB, SB)),
                                             tl.reshape(_column(a_next, cols, c), (NB, SB)), SB)
            M = P * tl.reshape(_column(q, cols, c), (NB, SB))[:, None, :]
            N = Q * tl.reshape(_column(k, cols, c), (NB, SB))[:, None, :] - tl.where(eye, 1.0, 0.0)  # Ñ
            pick = cols[None, None, :] == c
            d_f = (gamma * (alpha * tl.sum(tl.where(cols[None, :] == c, hd, 0.0), 1)[:, None]
                            + tl.sum(N * tl.sum(tl.where(pick, Vd, 0.0), 2)[:, None, :], 2))
                   + alpha * tl.sum(M * tl.sum(tl.where(pick, Yh, 0.0), 2)[:, None, :], 2)
                   + tl.sum(tl.dot(M, G, input_precision=SPREC) * N, 2))
            share = tl.sum(tl.sum(tl.reshape(_column(w, cols, c), (NB, SB)) * d_f, 1), 0)
            acc += tl.where(cols == c, share, 0.0)
    return acc


@triton.jit
def _sub_decays(a, a_next, SB: tl.constexpr):
    """One channel's decays within each sub-chunk from its log f a [NB, SB] (a_next: each row's successor's),
    every exponent a sum of log f over the rows it spans (each ≤ 0: no sum is a difference, so none cancels):

        P[t, u] = e^{Σ_{t<τ≤u} a_τ} (u ≥ t),  Q[t, s] = e^{Σ_{s<τ<t} a_τ} (s < t),  0 elsewhere  [NB, SB, SB],
        alpha_t = e^{Σ_{τ<t} a_τ},  gamma_t = e^{Σ_{τ>t} a_τ}  [NB, SB]   (τ within t's sub-chunk)."""
    p = tl.arange(0, SB)
    x = p[None, :, None]  # the row
    y = p[None, None, :]  # the row summed over
    A = a[:, None, :]
    P = tl.where(y >= x, fast_exp(tl.cumsum(tl.where(y > x, A, 0.0), 2)), 0.0)
    Q = tl.where(y < x, fast_exp(tl.cumsum(tl.where(y + 1 < x, a_next[:, None, :], 0.0), 2, reverse=True)), 0.0)
    alpha = fast_exp(tl.sum(tl.where(y < x, A, 0.0), 2))
    gamma = fast_exp(tl.sum(tl.where(y > x, A, 0.0), 2))
    return P, Q, alpha, gamma


@triton.jit
def _v_dy_block(i, dy, n, j, H: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BVS: tl.constexpr,
                I_ACT: tl.constexpr):
    """V sub-block j of a chunk (pointers at its first row and head): its columns cv, the values v = act(i) and dy,
    [BT, BVS] each in fp32 (zero outside the chunk's n rows and V)."""
    cv = j * BVS + tl.arange(0, BVS)
    offv, mtv = chunk_tile(n, cv, H, V, BVS, BT)
    v = tl.where(mtv, act(tl.load(i + offv, mask=mtv, other=0.0).to(tl.float32), I_ACT), 0.0)
    return cv, v, tl.load(dy + offv, mask=mtv, other=0.0).to(tl.float32)


@triton.jit
def _column(x, cols, c):
    """Column c of a [BT, BK] tile, as a [BT] vector."""
    return tl.sum(tl.where(cols[None, :] == c, x, 0.0), 1)
