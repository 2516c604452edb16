"""Backward kernels: a forward sweep for the state-dependent part of dq, then one reverse sweep for the rest.

Both walk a sequence BT tokens at a time per (V-block, sequence·head), like the forward kernel (`bwd_form`).

1. `fused_chunk_bwd_dq_kernel` recomputes the state S forward and writes dys = P = dy S [BT, K] (fp32, one slice per
   V-block; dq's state term is e^{b} ⊙ P, the only term of the backward that needs the forward state), and
   the final state S_T where a final-state gradient comes in (its share of d log f must be rounded this way).
2. `fused_chunk_bwd_kernel` walks backwards carrying dS [BV, K] (the gradient of the state after the sub-block):

       dq = e^{b} ⊙ P + diag part         dk = e^{b_last − b} ⊙ (v dS) + diag part
       dv = (k ⊙ e^{b_last − b}) dSᵀ + Aᵀ dy          dS ← dS ⊙ e^{b_last} + dyᵀ (q ⊙ e^{b})

   and the gradient of log f by the GLA identity, d log f_t = Σ_{t' ≥ t} (q ⊙ dq − k ⊙ dk)_{t'} + Σ_v dS_T ⊙ S_T
   (a reverse running sum carried across sub-blocks; the last term is the final state's share). Its terms
   cancel pair by pair, so each is formed from the dot operands as rounded (k e^{b_last − b} in S, q e^{b}
   in dS; see `diag_grads` for the diagonal block): the running sum then carries fp32 rounding only. It then
   chains through the activations and the gate, dg = dlogf·∂log f/∂g + dk·∂k/∂g, and
   writes do, dg (per V-block partial sums when V is split), di and d initial_state.
"""

import triton
import triton.language as tl

from ._common import act, act_and_grad, decay_to_end, diag_block, diag_grads, gates, load_beta, seq_bounds, step_tile


@triton.jit
def fused_chunk_bwd_dq_kernel(
    g, i, lb, h0, dy, dys, ht, cu_seqlens, T, NTOK,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    I_ACT: tl.constexpr, HAS_LB: tl.constexpr, HAS_H0: tl.constexpr, STORE_HT: tl.constexpr, VARLEN: tl.constexpr,
    MAX_SPREAD: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr, SPREC: tl.constexpr, REVERSE: tl.constexpr,
):
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_h = i_nh // H, i_nh % H
    bos, eos = seq_bounds(cu_seqlens, i_n, T, VARLEN)
    ck = tl.arange(0, BK)
    cv = i_v * BV + tl.arange(0, BV)
    beta = load_beta(lb, i_h, K, ck, HAS_LB)
    s_off = i_nh.to(tl.int64) * V * K + cv[:, None] * K + ck[None, :]
    s_mask = (cv < V)[:, None] & (ck < K)[None, :]
    if HAS_H0:
        S = tl.load(h0 + s_off, mask=s_mask, other=0.0).to(tl.float32)
    else:
        S = tl.zeros([BV, BK], dtype=tl.float32)
    dys_base = dys + i_v.to(tl.int64) * NTOK * H * K  # this V-block's slice

    offk, offv, mtk, mtv = step_tile(bos, bos, eos, i_h, H, K, V, ck, cv, BK, BV, BT, REVERSE)
    g_nx = tl.load(g + offk, mask=mtk, other=0.0)
    i_nx = tl.load(i + offv, mask=mtv, other=0.0)
    dy_nx = tl.load(dy + offv, mask=mtv, other=0.0)
    for t0 in range(bos, eos, BT):
        g_t, i_t, dy_t = g_nx, i_nx, dy_nx
        offk, offv, mtk, mtv = step_tile(t0 + BT, bos, eos, i_h, H, K, V, ck, cv, BK, BV, BT, REVERSE)
        g_nx = tl.load(g + offk, mask=mtk, other=0.0)
        i_nx = tl.load(i + offv, mask=mtv, other=0.0)
        dy_nx = tl.load(dy + offv, mask=mtv, other=0.0)
        offk, offv, mtk, mtv = step_tile(t0, bos, eos, i_h, H, K, V, ck, cv, BK, BV, BT, REVERSE)

        a, k, _, _, _ = gates(g_t.to(tl.float32), beta, HAS_LB)
        a = tl.where(mtk, a, 0.0)
        k = tl.where(mtk, k, 0.0)
        v = tl.where(mtv, act(i_t.to(tl.float32), I_ACT), 0.0).to(DT)
        b = tl.cumsum(a, 0)
        b_last = tl.sum(a, 0)

        # fp32 operands (SPREC): P feeds the cross-block running sum of d log f (see fused_chunk_bwd_kernel)
        tl.store(dys_base + offk, tl.dot(dy_t.to(tl.float32), S, input_precision=SPREC), mask=mtk)

        # the same rounded operand as the forward's and the reverse sweep's state update
        ke = (k * decay_to_end(a, b, b_last, -tl.min(b_last), MAX_SPREAD)).to(DT)
        S = S * tl.exp(b_last)[None, :] + tl.dot(tl.trans(v), ke, input_precision=PREC)
    if STORE_HT:
        tl.store(ht + s_off, S, mask=s_mask)


@triton.jit
def _load_step(o, g, i, dy, t0, bos, eos, i_h, H, K: tl.constexpr, V: tl.constexpr, ck, cv, BK: tl.constexpr,
               BV: tl.constexpr, BT: tl.constexpr, REVERSE: tl.constexpr):
    """The raw o, g [BT, BK] and i, dy [BT, BV] tiles of the sub-block from row t0 (zeros outside [bos, eos)):
    what the reverse sweeps load one step ahead."""
    offk, offv, mtk, mtv = step_tile(t0, bos, eos, i_h, H, K, V, ck, cv, BK, BV, BT, REVERSE)
    return (tl.load(o + offk, mask=mtk, other=0.0), tl.load(g + offk, mask=mtk, other=0.0),
            tl.load(i + offv, mask=mtv, other=0.0), tl.load(dy + offv, mask=mtv, other=0.0))


@triton.jit
def _final_state_grad(dht, ht, s_off, s_mask, HAS_DHT: tl.constexpr, BV: tl.constexpr, BK: tl.constexpr):
    """dS where the reverse sweeps start [BV, BK] and the final state's share of every d log f, Σ_v dS_T ⊙ S_T
    [BK] (this V-block's part); zeros without a final-state gradient."""
    if HAS_DHT:
        dS = tl.load(dht + s_off, mask=s_mask, other=0.0).to(tl.float32)
        share = tl.sum(dS * tl.load(ht + s_off, mask=s_mask, other=0.0), 0)
    else:
        dS = tl.zeros([BV, BK], dtype=tl.float32)
        share = tl.zeros([BK], dtype=tl.float32)
    return dS, share


@triton.jit
def fused_chunk_bwd_kernel(
    o, g, i, lb, dy, dys, ht, dht, do, dg, di, dh0, cu_seqlens, scale, T, NTOK,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    O_ACT: tl.constexpr, I_ACT: tl.constexpr, HAS_LB: tl.constexpr, HAS_DHT: tl.constexpr,
    STORE_DH0: tl.constexpr, VARLEN: tl.constexpr, MAX_SPREAD: tl.constexpr, DT: tl.constexpr,
    PREC: tl.constexpr, SPREC: tl.constexpr, REVERSE: tl.constexpr,
):
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_h = i_nh // H, i_nh % H
    bos, eos = seq_bounds(cu_seqlens, i_n, T, VARLEN)
    rows = tl.arange(0, BT)
    ck = tl.arange(0, BK)
    cv = i_v * BV + tl.arange(0, BV)
    beta = load_beta(lb, i_h, K, ck, HAS_LB)
    s_off = i_nh.to(tl.int64) * V * K + cv[:, None] * K + ck[None, :]
    s_mask = (cv < V)[:, None] & (ck < K)[None, :]
    dS, dlogf_carry = _final_state_grad(dht, ht, s_off, s_mask, HAS_DHT, BV, BK)
    part = i_v.to(tl.int64) * NTOK * H * K  # offset of this V-block's slice in dys and partial do/dg

    # walk the sub-blocks last to first, loading the previous one while this one computes
    t_last = bos + (tl.cdiv(eos - bos, BT) - 1) * BT
    o_nx, g_nx, i_nx, dy_nx = _load_step(o, g, i, dy, t_last, bos, eos, i_h, H, K, V, ck, cv, BK, BV, BT, REVERSE)
    for it in range(0, tl.cdiv(eos - bos, BT)):
        t0 = t_last - it * BT
        o_t, g_t, i_t, dy_t = o_nx, g_nx, i_nx, dy_nx
        o_nx, g_nx, i_nx, dy_nx = _load_step(o, g, i, dy, t0 - BT, bos, eos, i_h, H, K, V, ck, cv, BK, BV, BT, REVERSE)
        offk, offv, mtk, mtv = step_tile(t0, bos, eos, i_h, H, K, V, ck, cv, BK, BV, BT, REVERSE)

        o_raw = o_t.to(tl.float32)
        i_raw = i_t.to(tl.float32)
        b_do = dy_t.to(DT)
        q, dq_act = act_and_grad(o_raw, O_ACT)
        q = q * scale
        a, k, s_pos, _, f = gates(g_t.to(tl.float32), beta, HAS_LB)
        a = tl.where(mtk, a, 0.0)
        k = tl.where(mtk, k, 0.0)
        v, dv_act = act_and_grad(i_raw, I_ACT)
        v = tl.where(mtv, v, 0.0).to(DT)
        b = tl.cumsum(a, 0)
        b_last = tl.sum(a, 0)
        spread = -tl.min(b_last)
        A, eb, w_end = diag_block(q, k, a, b, b_last, spread, MAX_SPREAD, DT, PREC)
        dS_c = dS.to(DT)
        ke = (k * w_end).to(DT)  # S's operand in the forward sweeps, dS's partner below
        qe = (q * eb).to(DT)  # dS's operand

        # dv = (k ⊙ e^{b_last − b}) dSᵀ + Aᵀ dy, stored at once (each result is written as soon as it is
        # complete, to keep few [BT, K] tiles alive)
        b_dv = tl.dot(ke, tl.trans(dS_c), input_precision=PREC)
        b_dv += tl.dot(tl.trans(A.to(DT)), b_do, input_precision=PREC)
        tl.store(di + offv, (b_dv * dv_act).to(di.dtype.element_ty), mask=mtv)

        # dq, dk: the diagonal block plus the state terms (dq's came from the forward sweep)
        dA = tl.dot(b_do, tl.trans(v), input_precision=PREC)
        dA = tl.where(rows[:, None] >= rows[None, :], dA, 0.0)
        dq_d, dk_d, db_d = diag_grads(q, k, a, b_last, eb, w_end, dA, spread, MAX_SPREAD, DT, PREC)
        P = tl.load(dys + part + offk, mask=mtk, other=0.0)  # dy S
        vdS = tl.dot(v.to(tl.float32), dS, input_precision=SPREC)
        b_dq = eb * P + dq_d
        tl.store(do + part + offk, (b_dq * scale * dq_act).to(do.dtype.element_ty), mask=mtk)
        b_dk = w_end * vdS + dk_d
        dS = dS * tl.exp(b_last)[None, :] + tl.dot(tl.trans(b_do), qe, input_precision=PREC)

        # d log f: reverse running sum of q ⊙ dq − k ⊙ dk. A pair (s earlier, t later) enters the state terms
        # as (q e^{b})_t·dy_t·S ∋ v_s (k e^{b_last − b})_s and as (k e^{b_last − b})_s·v_s·dS ∋ dy_t (q e^{b})_t,
        # so with both factors taken as the rounded dot operands the pair cancels to fp32 rounding wherever
        # both ends lie past t. The diagonal block's share sums to 0 over the block, so only the state terms
        # are carried across blocks.
        db_s = qe.to(tl.float32) * P - ke.to(tl.float32) * vdS
        db = db_s + db_d
        b_dlogf = (dlogf_carry + tl.sum(db, 0))[None, :] - tl.cumsum(db, 0) + db
        dlogf_carry += tl.sum(db_s, 0)

        # chain rule to g and β. f = β + (1 − β)σ(g), k = 1 − f: dL/df = dlogf / f − dk, ∂f/∂g = kσ(g),
        # ∂f/∂β = σ(−g); kσ(g)/f ≤ 1 stays bounded (0 only where f underflowed, and then dlogf ≈ 0 too)
        d_f = b_dlogf / tl.maximum(f, 1e-30) - b_dk
        tl.store(dg + part + offk, (k * s_pos * d_f).to(dg.dtype.element_ty), mask=mtk)

    if STORE_DH0:
        tl.store(dh0 + s_off, dS, mask=s_mask)


# The split backward (FusedChunkConfig.bwd_split): the reverse sweep above keeps ~25 [BT, K] tiles alive beside dS and
# spills; here it carries only what needs the state, and the diagonal blocks and the chain rule run in a
# kernel with one program per (sub-block, sequence·head), which needs no state and fills the GPU.
#   2'. `fused_chunk_bwd_state_kernel` walks backwards carrying dS and writes, per sub-block, v dS [BT, K] (fp32,
#       per V-block), (k ⊙ e^{b_last − b}) dSᵀ [BT, BV] (fp32) and d log f's state-term carry entering it
#       (Σ over later sub-blocks of q⊙dq − k⊙dk's state terms, plus the final state's share) [K].
#   3'. `fused_chunk_bwd_diag_kernel` adds the diagonal block's terms and writes do, dg and di.
# Both recompute the gates and factors exactly as the sweeps do, so each dot operand is the same rounded value
# on both sides of d log f's cancelling pairs.


@triton.jit
def _carry_row(bos, t0, i_n, BT: tl.constexpr):
    """Row of sub-block [t0, t0 + BT) of sequence i_n in a [NTOK // BT + N + 1, ...] per-sub-block tensor:
    sequence n's sub-blocks take rows bos//BT + n + j, disjoint from the next sequence's."""
    return bos // BT + i_n + (t0 - bos) // BT


@triton.jit
def fused_chunk_bwd_state_kernel(
    o, g, i, lb, dy, dys, ht, dht, vds, dvs, carry, dh0, cu_seqlens, scale, T, NTOK, NBT,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    O_ACT: tl.constexpr, I_ACT: tl.constexpr, HAS_LB: tl.constexpr, HAS_DHT: tl.constexpr,
    STORE_DH0: tl.constexpr, VARLEN: tl.constexpr, MAX_SPREAD: tl.constexpr, DT: tl.constexpr,
    PREC: tl.constexpr, SPREC: tl.constexpr, REVERSE: tl.constexpr,
):
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_h = i_nh // H, i_nh % H
    bos, eos = seq_bounds(cu_seqlens, i_n, T, VARLEN)
    ck = tl.arange(0, BK)
    cv = i_v * BV + tl.arange(0, BV)
    beta = load_beta(lb, i_h, K, ck, HAS_LB)
    s_off = i_nh.to(tl.int64) * V * K + cv[:, None] * K + ck[None, :]
    s_mask = (cv < V)[:, None] & (ck < K)[None, :]
    dS, dlogf_carry = _final_state_grad(dht, ht, s_off, s_mask, HAS_DHT, BV, BK)
    part = i_v.to(tl.int64) * NTOK * H * K  # this V-block's slice of dys and vds
    carry_base = carry + i_v.to(tl.int64) * NBT * H * K

    t_last = bos + (tl.cdiv(eos - bos, BT) - 1) * BT
    o_nx, g_nx, i_nx, dy_nx = _load_step(o, g, i, dy, t_last, bos, eos, i_h, H, K, V, ck, cv, BK, BV, BT, REVERSE)
    for it in range(0, tl.cdiv(eos - bos, BT)):
        t0 = t_last - it * BT
        o_t, g_t, i_t, dy_t = o_nx, g_nx, i_nx, dy_nx
        o_nx, g_nx, i_nx, dy_nx = _load_step(o, g, i, dy, t0 - BT, bos, eos, i_h, H, K, V, ck, cv, BK, BV, BT, REVERSE)
        offk, offv, mtk, mtv = step_tile(t0, bos, eos, i_h, H, K, V, ck, cv, BK, BV, BT, REVERSE)

        q = act(o_t.to(tl.float32), O_ACT) * scale
        a, k, _, _, _ = gates(g_t.to(tl.float32), beta, HAS_LB)
        a = tl.where(mtk, a, 0.0)
        k = tl.where(mtk, k, 0.0)
        v = tl.where(mtv, act(i_t.to(tl.float32), I_ACT), 0.0).to(DT)
        b = tl.cumsum(a, 0)
        b_last = tl.sum(a, 0)
        ke = (k * decay_to_end(a, b, b_last, -tl.min(b_last), MAX_SPREAD)).to(DT)
        qe = (q * tl.exp(b)).to(DT)

        tl.store(dvs + offv, tl.dot(ke, tl.trans(dS.to(DT)), input_precision=PREC), mask=mtv)
        vdS = tl.dot(v.to(tl.float32), dS, input_precision=SPREC)
        tl.store(vds + part + offk, vdS, mask=mtk)
        P = tl.load(dys + part + offk, mask=mtk, other=0.0)
        tl.store(carry_base + (_carry_row(bos, t0, i_n, BT) * H + i_h) * K + ck, dlogf_carry, mask=ck < K)
        dlogf_carry += tl.sum(qe.to(tl.float32) * P - ke.to(tl.float32) * vdS, 0)
        dS = dS * tl.exp(b_last)[None, :] + tl.dot(tl.trans(dy_t.to(DT)), qe, input_precision=PREC)

    if STORE_DH0:
        tl.store(dh0 + s_off, dS, mask=s_mask)


@triton.jit
def fused_chunk_bwd_diag_kernel(
    o, g, i, lb, dy, dys, vds, dvs, carry, do, dg, di, cu_seqlens, scale, T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    O_ACT: tl.constexpr, I_ACT: tl.constexpr, HAS_LB: tl.constexpr, VARLEN: tl.constexpr,
    MAX_SPREAD: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr, REVERSE: tl.constexpr,
):
    """One program per (sub-block, sequence·head), all of K and V (BK ≥ K, BV ≥ V); dys, vds and carry summed
    over the V-blocks."""
    i_t, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_h = i_nh // H, i_nh % H
    bos, eos = seq_bounds(cu_seqlens, i_n, T, VARLEN)
    t0 = bos + i_t * BT
    if t0 < eos:  # the grid covers the longest sequence
        rows = tl.arange(0, BT)
        ck = tl.arange(0, BK)
        cv = tl.arange(0, BV)
        beta = load_beta(lb, i_h, K, ck, HAS_LB)
        offk, offv, mtk, mtv = step_tile(t0, bos, eos, i_h, H, K, V, ck, cv, BK, BV, BT, REVERSE)
        q, dq_act = act_and_grad(tl.load(o + offk, mask=mtk, other=0.0).to(tl.float32), O_ACT)
        q = q * scale
        a, k, s_pos, _, f = gates(tl.load(g + offk, mask=mtk, other=0.0).to(tl.float32), beta, HAS_LB)
        a = tl.where(mtk, a, 0.0)
        k = tl.where(mtk, k, 0.0)
        v, dv_act = act_and_grad(tl.load(i + offv, mask=mtv, other=0.0).to(tl.float32), I_ACT)
        v = tl.where(mtv, v, 0.0).to(DT)
        b_do = tl.load(dy + offv, mask=mtv, other=0.0).to(DT)
        b = tl.cumsum(a, 0)
        b_last = tl.sum(a, 0)
        spread = -tl.min(b_last)
        A, eb, w_end = diag_block(q, k, a, b, b_last, spread, MAX_SPREAD, DT, PREC)

        b_dv = tl.load(dvs + offv, mask=mtv, other=0.0) + tl.dot(tl.trans(A.to(DT)), b_do, input_precision=PREC)
        tl.store(di + offv, (b_dv * dv_act).to(di.dtype.element_ty), mask=mtv)

        dA = tl.dot(b_do, tl.trans(v), input_precision=PREC)
        dA = tl.where(rows[:, None] >= rows[None, :], dA, 0.0)
        dq_d, dk_d, db_d = diag_grads(q, k, a, b_last, eb, w_end, dA, spread, MAX_SPREAD, DT, PREC)
        crow = (_carry_row(bos, t0, i_n, BT) * H + i_h) * K + ck
        P = tl.load(dys + offk, mask=mtk, other=0.0)
        vdS = tl.load(vds + offk, mask=mtk, other=0.0)
        dlogf_carry = tl.load(carry + crow, mask=ck < K, other=0.0)
        b_dq = eb * P + dq_d
        tl.store(do + offk, (b_dq * scale * dq_act).to(do.dtype.element_ty), mask=mtk)
        b_dk = w_end * vdS + dk_d
        ke = (k * w_end).to(DT)
        qe = (q * eb).to(DT)
        db = qe.to(tl.float32) * P - ke.to(tl.float32) * vdS + db_d
        b_dlogf = (dlogf_carry + tl.sum(db, 0))[None, :] - tl.cumsum(db, 0) + db
        d_f = b_dlogf / tl.maximum(f, 1e-30) - b_dk
        tl.store(dg + offk, (k * s_pos * d_f).to(dg.dtype.element_ty), mask=mtk)
