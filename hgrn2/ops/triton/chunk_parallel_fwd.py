"""Chunk-parallel forward: a short sequential pass for the chunk-start states, then one program per chunk.

Chunks of BT (64) tokens, each split into NB = BT/16 sub-blocks of 16. Per chunk, with a = log f and
c the inclusive cumsum of a *within each 16-token sub-block*, r_i the decay of the chunk up to the start of
sub-block i (exclusive prefix of the sub-block sums) and R [BT, K] that r broadcast to the rows of sub-block i:
b = R + c is the within-chunk cumsum of log f (b ≤ 0, non-increasing), every exponent below is ≤ 0 except
e^{−c} (bounded by the largest 16-token decay spread, checked against MAX_SPREAD).

1. `chunk_parallel_fwd_h_kernel`, grid (NK·NV, N·H): walks the chunks of one sequence, stores the chunk-START state
   h_c [V, K] (STATE_DTYPE) and updates S ← S ⊙ e^{b_last} + vᵀ (k ⊙ e^{b_last − b}); final state in fp32.
   K may be split (the state's columns are independent).
2. `chunk_parallel_fwd_o_kernel`, grid (NT_total, NV, H): y = (q ⊙ e^b) h_cᵀ + A v with the causal BT×BT block
   A[t, s] = Σ_k q_t k_s e^{b_t − b_s}, in one of four tiers:
   - chunk tier (the chunk's largest decay, max over channels of −b_last, below CHUNK_SPREAD = 120):
     A = (q e^{b − m})(k e^{m − b})ᵀ, one product, with the reference m = b_last / 2 per channel, so that every
     factor lies in [e^{−60}, e^{60}];
   - halves tier (each half of the chunk decays by less than HALF_SPREAD = 120: heads that forget fast): one
     product per half about the half's midpoint, which also takes the pairs across the halves through the second
     half's reference (the sources' factors e^{m₂ − b} ≤ 1 there);
   - sub-block tier (the largest 16-token spread below MAX_SPREAD = 60): A = Σ_j (q e^{c} ⊙ E_j)(k e^{−c} on
     sub-block j)ᵀ with E_j[t] = e^{r_{i(t)} − r_j} (i(t) ≥ j, else 0): every factor bounded;
   - otherwise an exact column loop with the exponent masked before exp.
   The chunk tier reads b from `chunk_parallel_decay_kernel` and holds no code of the others; a second launch
   takes the chunks that kernel listed for the halves tier, a third those it listed for the fallback, in the
   sub-block or exact tier per K-block; the first launch leaves the listed chunks to them.
"""

import triton
import triton.language as tl

from ._common import (
    SMALL_F,
    SMALL_GROUP,
    act,
    causal_av,
    chunk_bounds,
    chunk_decay,
    chunk_offset,
    chunk_tile,
    expand_rows,
    fast_exp,
    gates,
    half_decay,
    intra_A,
    listed,
    load_beta,
    load_gates,
    ref_decay,
    seq_bounds,
    take_row,
    tier_list,
    walk_loads,
)


@triton.jit
def chunk_parallel_fwd_h_kernel(
    g, i, lb, bb, h0, h, ht, cu_seqlens, chunk_offsets, T, NT,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    NV: tl.constexpr, I_ACT: tl.constexpr, HAS_LB: tl.constexpr, HAS_H0: tl.constexpr, STORE_HT: tl.constexpr,
    VARLEN: tl.constexpr, WALK_SPREAD: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr,
):
    """Walks one sequence's chunks for a [BV, BK] block of the state. b (the within-chunk cumsum of log f) comes
    from `chunk_parallel_decay_kernel`, so a step holds no log and no row scan: its latency is what the walk costs.
    The K-blocks of a chunk that decays by WALK_SPREAD or more form e^{b_last − b} as a sum of log f over the later
    rows instead: there b is large, and b_last − b would keep its rounding (below it, under a tenth of the dot
    operand's: `ChunkParallelConfig.walk_max_spread`)."""
    i_kv, i_nh = tl.program_id(0), tl.program_id(1)
    i_k, i_v = i_kv // NV, i_kv % NV
    i_n, i_h = i_nh // H, i_nh % H
    bos, eos = seq_bounds(cu_seqlens, i_n, T, VARLEN)
    ck = i_k * BK + tl.arange(0, BK)
    cv = i_v * BV + tl.arange(0, BV)
    beta = load_beta(lb, i_h, K, ck, HAS_LB)
    s_pos = cv[:, None] * K + ck[None, :]
    s_mask = (cv < V)[:, None] & (ck < K)[None, :]
    if HAS_H0:
        S = tl.load(h0 + i_nh.to(tl.int64) * V * K + s_pos, mask=s_mask, other=0.0).to(tl.float32)
    else:
        S = tl.zeros([BV, BK], dtype=tl.float32)
    # pointers at the sequence's first row and this head (int64 scalars), moved one chunk per step; the tiles'
    # offsets from there are int32
    g, bb, i = g + (bos * H + i_h) * K, bb + (bos * H + i_h) * K, i + (bos * H + i_h) * V
    first = chunk_offset(chunk_offsets, i_n, NT, VARLEN) * H + i_h
    h += first * V * K
    left = (eos - bos).to(tl.int32)  # rows from the current chunk's start to the sequence's end
    g_nx, b_nx, bl_nx, i_nx = walk_loads(g, bb, i, left, ck, cv, H, K, V, BK, BV, BT)
    for _ in range(0, tl.cdiv(left, BT)):
        g_t, b_t, bl_t, i_t = g_nx, b_nx, bl_nx, i_nx
        _, mtk = chunk_tile(left, ck, H, K, BK, BT)
        _, mtv = chunk_tile(left, cv, H, V, BV, BT)
        g, bb, i, left = g + BT * H * K, bb + BT * H * K, i + BT * H * V, left - BT
        g_nx, b_nx, bl_nx, i_nx = walk_loads(g, bb, i, left, ck, cv, H, K, V, BK, BV, BT)

        tl.store(h + s_pos, S.to(h.dtype.element_ty), mask=s_mask)
        h += H * V * K
        _, k, _, _, _ = gates(g_t.to(tl.float32), beta, HAS_LB)
        if tl.min(bl_t, 0) > -WALK_SPREAD:
            w = fast_exp(bl_t[None, :] - b_t)
        else:
            w = fast_exp(_suffix_log_f(g_t, beta, left + BT, HAS_LB))
        w = tl.where(mtk, k * w, 0.0)
        v = tl.where(mtv, act(i_t.to(tl.float32), I_ACT), 0.0)
        S = S * fast_exp(bl_t)[None, :] + tl.dot(tl.trans(v.to(DT)), w.to(DT), input_precision=PREC)

    if STORE_HT:
        tl.store(ht + i_nh.to(tl.int64) * V * K + s_pos, S, mask=s_mask)


@triton.jit
def _suffix_log_f(g, beta, n, HAS_LB: tl.constexpr):
    """Σ_{u>t} log f_u [BT, BK] over the first n rows of the gate logits g [BT, BK], one row's log f per step: the
    walk then holds no tile of log f."""
    BT: tl.constexpr = g.shape[0]
    rows = tl.arange(0, BT)
    gf = g.to(tl.float32)
    e = tl.zeros(gf.shape, dtype=tl.float32)
    for j in range(1, BT):
        a_j, _, _, _, _ = gates(take_row(gf, rows, j)[None, :], beta, HAS_LB)
        e += tl.where((rows[:, None] < j) & (j < n), a_j, 0.0)
    return e


@triton.jit
def _bit_or(a, b):
    return a | b


@triton.jit
def _flag_small(f, mtk, ck, fz, i_c, i_h, NC, H: tl.constexpr):
    """Lists the chunk and head in fz when the gates f [BT, BK] of the channels ck hold one below SMALL_F (the
    decay kernel's FLAG_SMALL)."""
    small = tl.max(tl.where(mtk & (f < SMALL_F), 1, 0), 0)  # per channel
    if tl.max(small, 0) > 0:
        groups = tl.reduce(tl.where(small > 0, 1 << tl.minimum(ck // SMALL_GROUP, 31), 0), 0, _bit_or)
        if tl.atomic_or(fz + 1 + i_c * H + i_h, groups) == 0:
            tl.store(fz + 1 + NC * H + tl.atomic_add(fz, 1), i_c * H + i_h)


@triton.jit
def chunk_parallel_decay_kernel(g, lb, bb, fb, fz, chunks, T, NT, NC, H: tl.constexpr, K: tl.constexpr,
                    BT: tl.constexpr, BK: tl.constexpr, HAS_LB: tl.constexpr, VARLEN: tl.constexpr,
                    CHUNK_SPREAD: tl.constexpr, HALF_SPREAD: tl.constexpr, FLAG_SMALL: tl.constexpr):
    """b, the within-chunk cumsum of log f, into bb [B·T, H, K] fp32, and the chunk tier's verdict into fb: one
    program per (chunk, head, K-block). The parallel kernels' chunk tier reads b (a log and a scan per element
    fewer there), and so do the sequential walks (their steps are latency-bound).

    fb (int32, zeroed by the caller) = [fallback count, halves count | leaves [NC·H] | fallback list [NC·H] |
    halves list [NC·H]]. A chunk where some channel decays by e^{-CHUNK_SPREAD} or more leaves the chunk tier: for
    the halves tier if each of its halves decays by less than e^{-HALF_SPREAD} in every channel (leaves[c·H + h]
    bit 1), else for the fallback (bit 2). The K-block that first sets a bit appends c·H + h to that bit's list,
    which the later launches walk instead of a grid over every chunk (the chunk-tier launches skip the chunks whose
    leaves are set); the halves launch skips the chunks that another K-block sent to the fallback.

    FLAG_SMALL: fz (int32, zeroed) = [count | flags [NC·H] | list [NC·H]] lists the chunks (and heads) holding a
    forget gate below SMALL_F, whose dβ `chunk_parallel_bwd_small_kernel` sums exactly; its flag is a bit mask of
    the SMALL_GROUP-channel groups holding one."""
    i_c, i_h, i_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)  # chunks on axis 0 (2^31)
    t0, t1 = chunk_bounds(chunks, i_c, T, NT, BT, VARLEN)
    n = (t1 - t0).to(tl.int32)
    ck = i_k * BK + tl.arange(0, BK)
    offk, mtk = chunk_tile(n, ck, H, K, BK, BT)
    g, bb = g + (t0 * H + i_h) * K, bb + (t0 * H + i_h) * K
    beta = load_beta(lb, i_h, K, ck, HAS_LB)
    a, _, _, _, f = gates(tl.load(g + offk, mask=mtk, other=0.0).to(tl.float32), beta, HAS_LB)
    if FLAG_SMALL:
        # f ≥ β: a K-block whose bounds all reach SMALL_F holds no small gate and skips the tile's reductions.
        # Flagged before the scan, so that the tile of f is dead there (held across it, it takes registers).
        if tl.min(tl.where(ck < K, beta, 1.0), 0) < SMALL_F:
            _flag_small(f, mtk, ck, fz, i_c, i_h, NC, H)
    b = tl.cumsum(tl.where(mtk, a, 0.0), 0)
    tl.store(bb + offk, b, mask=mtk)
    # the verdict from the chunk's last row, read back (a reduction of the tile in registers would take it in a
    # second layout, and the compiler would redo the gate math for it: twice the instructions)
    tl.debug_barrier()
    b_end = tl.load(bb + (n - 1) * (H * K) + ck, mask=ck < tl.where(n > 0, K, 0), other=0.0)
    if -tl.min(b_end, 0) >= CHUNK_SPREAD:
        b_mid = tl.load(bb + (tl.minimum(n, BT // 2) - 1) * (H * K) + ck, mask=ck < K, other=0.0)
        halves = tl.maximum(-tl.min(b_mid, 0), tl.max(b_mid - b_end, 0))
        leaves = fb + 2 + i_c * H + i_h
        if halves < HALF_SPREAD:
            if tl.atomic_or(leaves, 1) == 0:  # the first K-block to find it appends the chunk
                tl.store(fb + 2 + 2 * NC * H + tl.atomic_add(fb + 1, 1), i_c * H + i_h)
        elif (tl.atomic_or(leaves, 2) & 2) == 0:
            tl.store(fb + 2 + NC * H + tl.atomic_add(fb, 1), i_c * H + i_h)


@triton.jit
def chunk_parallel_fwd_o_kernel(
    o, g, i, lb, h, y, a_out, bb, fb, chunks, scale, T, NT, NC,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    O_ACT: tl.constexpr, I_ACT: tl.constexpr, HAS_LB: tl.constexpr, VARLEN: tl.constexpr,
    MAX_SPREAD: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr, STORE_A: tl.constexpr, TIER: tl.constexpr,
):
    """One program per (chunk, V-block, head); loops over K-blocks of BK (A and y accumulate over them).

    Three launches by TIER: 0, the chunk tier (grid (NC, NV, H)), from the within-chunk cumsum b that
    `chunk_parallel_decay_kernel` stored in bb (no log, no scan here); then on a small grid (P, NV, 1) that walks a
    list of that kernel's, 1 the halves tier on the chunks listed for it and 2 the sub-block or exact tier (per
    K-block) on the fallback's; the chunk-tier launch leaves the listed chunks to them (a flag read per program).
    STORE_A: the first V-block also stores the causal A [BT, BT] of its chunk and head (in a_out's dtype) for the
    backward's dv."""
    i_v = tl.program_id(1)
    if TIER == 0:
        if tl.load(fb + 2 + tl.program_id(0) * H + tl.program_id(2)) == 0:  # a listed chunk is a later launch's
            _fwd_o_chunk(o, g, i, lb, h, y, a_out, bb, chunks, scale, T, NT, tl.program_id(0), i_v, tl.program_id(2),
                         H, K, V, BT, BK, BV, O_ACT, I_ACT, HAS_LB, VARLEN, MAX_SPREAD, DT, PREC, STORE_A, TIER)
    else:
        count, entries = tier_list(fb, NC, H, TIER)
        for e in range(tl.program_id(0), count, tl.num_programs(0)):
            c_h = tl.load(entries + e)
            if listed(fb, c_h, TIER):
                _fwd_o_chunk(o, g, i, lb, h, y, a_out, bb, chunks, scale, T, NT, c_h // H, i_v, c_h % H, H, K, V,
                             BT, BK, BV, O_ACT, I_ACT, HAS_LB, VARLEN, MAX_SPREAD, DT, PREC, STORE_A, TIER)


@triton.jit
def _fwd_o_chunk(o, g, i, lb, h, y, a_out, bb, chunks, scale, T, NT, i_c, i_v, i_h, H: tl.constexpr,
                 K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                 O_ACT: tl.constexpr, I_ACT: tl.constexpr, HAS_LB: tl.constexpr, VARLEN: tl.constexpr,
                 MAX_SPREAD: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr, STORE_A: tl.constexpr,
                 TIER: tl.constexpr):
    """`chunk_parallel_fwd_o_kernel`'s work on chunk i_c, V-block i_v, head i_h."""
    t0, t1 = chunk_bounds(chunks, i_c, T, NT, BT, VARLEN)
    n = (t1 - t0).to(tl.int32)
    # the chunk's rows and head as one int64 offset per pointer; the tiles' offsets from there are int32
    o, g, bb = o + (t0 * H + i_h) * K, g + (t0 * H + i_h) * K, bb + (t0 * H + i_h) * K
    i, y = i + (t0 * H + i_h) * V, y + (t0 * H + i_h) * V
    h += (i_c.to(tl.int64) * H + i_h) * V * K
    if n > 0:  # padding chunks: nothing
        cv = i_v * BV + tl.arange(0, BV)
        rows = tl.arange(0, BT)
        offv, mtv = chunk_tile(n, cv, H, V, BV, BT)
        i_t = tl.load(i + offv, mask=mtv, other=0.0)  # issued first: its latency hides behind the K loop
        out = tl.zeros([BT, BV], dtype=tl.float32)
        A = tl.zeros([BT, BT], dtype=tl.float32)
        for kb in range(0, tl.cdiv(K, BK)):
            ck = kb * BK + tl.arange(0, BK)
            offk, mtk, beta, q, a, k = load_gates(o, g, lb, n, ck, i_h, scale, H, K, BK, BT, O_ACT, HAS_LB)
            h_t = tl.load(h + (cv[:, None] * K + ck[None, :]), mask=(cv < V)[:, None] & (ck < K)[None, :], other=0.0)
            if TIER == 2:
                a = tl.where(mtk, a, 0.0)
                c, r, b_last = chunk_decay(a, BT, BK)
                A_k, ec, enc = intra_A(q, k, a, c, r, -tl.min(tl.min(c, 1), 0), BT, BK, MAX_SPREAD, DT, PREC)
                A += A_k
                eb = ec * expand_rows(fast_exp(r), BT, BK)
            elif TIER == 1:
                e_q, e_k, em, _, across, up, _ = half_decay(bb, n, offk, mtk, ck, H, K, BT)
                qe = q * e_q
                ke = k * e_k
                A_k = tl.dot(tl.where(up, qe, 0.0).to(DT), tl.trans(ke.to(DT)), input_precision=PREC)
                A_k += tl.dot(tl.where(up, 0.0, qe).to(DT), tl.trans((ke * across).to(DT)), input_precision=PREC)
                A += tl.where(rows[:, None] >= rows[None, :], A_k, 0.0)
                eb = e_q * em
            else:
                e_q, e_k, m = ref_decay(bb, n, offk, mtk, ck, H, K)
                A_k = tl.dot((q * e_q).to(DT), tl.trans((k * e_k).to(DT)), input_precision=PREC)
                A += tl.where(rows[:, None] >= rows[None, :], A_k, 0.0)
                eb = e_q * fast_exp(m)[None, :]
            out += tl.dot((q * eb).to(DT), tl.trans(h_t.to(DT)), input_precision=PREC)

        v = tl.where(mtv, act(i_t.to(tl.float32), I_ACT), 0.0)
        out += causal_av(A, v, DT, PREC)
        tl.store(y + offv, out.to(y.dtype.element_ty), mask=mtv)
        if STORE_A:
            if i_v == 0:
                a_out += (i_c.to(tl.int64) * H + i_h) * BT * BT
                tl.store(a_out + (rows[:, None] * BT + rows[None, :]), A.to(a_out.dtype.element_ty))
