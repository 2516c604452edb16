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
   A[t, s] = Σ_k q_t k_s e^{b_t − b_s}, in one of three tiers per K-block:
   - chunk tier (the chunk's largest decay, max over channels of −b_last, below CHUNK_SPREAD = 120):
     A = (q e^{b − m})(k e^{m − b})ᵀ, one product, with the reference m = b_last / 2 per channel, so that every
     factor lies in [e^{−60}, e^{60}];
   - sub-block tier (the largest 16-token spread below MAX_SPREAD = 60): A = Σ_j (q e^{c} ⊙ E_j)(k e^{−c} on
     sub-block j)ᵀ with E_j[t] = e^{r_{i(t)} − r_j} (i(t) ≥ j, else 0): every factor bounded;
   - otherwise an exact column loop with the exponent masked before exp.
   The chunk tier reads b from `cp_decay_kernel` and holds no code of the other two; a second launch
   (FALLBACK) redoes the chunks that leave it (listed by `cp_decay_kernel`), in the sub-block or exact tier per
   K-block, over the first launch's output.
"""

import triton
import triton.language as tl

from ._common import _act, _exp, _gates, _load_beta, _row, _seq_bounds


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
def _chunk_tile(n, cols, H: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, BT: tl.constexpr):
    """In-chunk int32 offsets [BT, BD] of a [B·T, H, D] tensor's columns `cols` (a block of BD) from the
    chunk's first token and head — the caller adds that base to the pointer as one int64 scalar (per-element
    int64 index math cost more instructions than the gates) — and the mask of the chunk's n rows and D columns."""
    rows = tl.arange(0, BT)
    off = rows[:, None] * (H * D) + cols[None, :]
    mask = (rows < n)[:, None]
    if D % BD != 0:
        mask = mask & (cols < D)[None, :]
    return off, tl.broadcast_to(mask, off.shape)


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
    e = tl.where(ib[:, None] >= j, _exp(tl.minimum(r - r_j[None, :], 0.0)), 0.0)
    return _expand_rows(e, BT, BK)


@triton.jit
def _ref_decay(bb, n, offk, mtk, ck, H: tl.constexpr, K: tl.constexpr):
    """Chunk tier: from b (the within-chunk cumsum of log f, bb at the chunk's first row and head) and the
    reference m = b_last / 2 per channel, returns (e^{b − m}, e^{m − b}) [BT, BK] and m [BK]. |b − m| ≤
    (−b_last) / 2, so both factors stay within e^{±60} while the chunk's decay is below CHUNK_SPREAD = 120 (a
    reference at the chunk's start would allow only 60)."""
    m = 0.5 * tl.load(bb + (n - 1) * (H * K) + ck, mask=ck < K, other=0.0)
    d = tl.load(bb + offk, mask=mtk, other=0.0) - m[None, :]
    return _exp(d), _exp(-d), m


@triton.jit
def _intra_A(q, k, c, r, R, spread, BT: tl.constexpr, BK: tl.constexpr, MAX_SPREAD: tl.constexpr,
             DT: tl.constexpr, PREC: tl.constexpr):
    """The causal intra-chunk block A [BT, BT] and e^{c}, e^{−c} (the latter only meaningful on the fast path)."""
    NB: tl.constexpr = BT // 16
    rows = tl.arange(0, BT)
    blk = rows // 16
    causal = rows[:, None] >= rows[None, :]
    ec = _exp(c)
    A = tl.zeros([BT, BT], dtype=tl.float32)
    if spread < MAX_SPREAD:
        enc = _exp(-c)
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
            w = _exp(tl.where(rows[:, None] >= j, b - b_j[None, :], float("-inf")))
            A += tl.where(rows[None, :] == j, tl.sum(q * k_j[None, :] * w, 1)[:, None], 0.0)
    return tl.where(causal, A, 0.0), ec, enc


@triton.jit
def cp_fwd_h_kernel(
    g, i, lb, bb, h0, h, ht, cu_seqlens, chunk_offsets, T, NT,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    NV: tl.constexpr, I_ACT: tl.constexpr, HAS_LB: tl.constexpr, HAS_H0: tl.constexpr, STORE_HT: tl.constexpr,
    VARLEN: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr,
):
    """Walks one sequence's chunks for a [BV, BK] block of the state. b (the within-chunk cumsum of log f) comes
    from `cp_decay_kernel`, so a step holds no log and no row scan: its latency is what the walk costs."""
    i_kv, i_nh = tl.program_id(0), tl.program_id(1)
    i_k, i_v = i_kv // NV, i_kv % NV
    i_n, i_h = i_nh // H, i_nh % H
    bos, eos = _seq_bounds(cu_seqlens, i_n, T, VARLEN)
    ck = i_k * BK + tl.arange(0, BK)
    cv = i_v * BV + tl.arange(0, BV)
    beta = _load_beta(lb, i_h, K, ck, HAS_LB)
    s_pos = cv[:, None] * K + ck[None, :]
    s_mask = (cv < V)[:, None] & (ck < K)[None, :]
    if HAS_H0:
        S = tl.load(h0 + i_nh.to(tl.int64) * V * K + s_pos, mask=s_mask, other=0.0).to(tl.float32)
    else:
        S = tl.zeros([BV, BK], dtype=tl.float32)
    # pointers at the sequence's first row and this head (int64 scalars), moved one chunk per step; the tiles'
    # offsets from there are int32
    g, bb, i = g + (bos * H + i_h) * K, bb + (bos * H + i_h) * K, i + (bos * H + i_h) * V
    h += (_chunk_offset(chunk_offsets, i_n, NT, VARLEN) * H + i_h) * V * K
    left = (eos - bos).to(tl.int32)  # rows from the current chunk's start to the sequence's end
    g_nx, b_nx, bl_nx, i_nx = _walk_loads(g, bb, i, left, ck, cv, H, K, V, BK, BV, BT)
    for _ in range(0, tl.cdiv(left, BT)):
        g_t, b_t, bl_t, i_t = g_nx, b_nx, bl_nx, i_nx
        _, mtk = _chunk_tile(left, ck, H, K, BK, BT)
        _, mtv = _chunk_tile(left, cv, H, V, BV, BT)
        g, bb, i, left = g + BT * H * K, bb + BT * H * K, i + BT * H * V, left - BT
        g_nx, b_nx, bl_nx, i_nx = _walk_loads(g, bb, i, left, ck, cv, H, K, V, BK, BV, BT)

        tl.store(h + s_pos, S.to(h.dtype.element_ty), mask=s_mask)
        h += H * V * K
        _, k, _, _, _ = _gates(g_t.to(tl.float32), beta, HAS_LB)
        w = tl.where(mtk, k * _exp(bl_t[None, :] - b_t), 0.0)
        v = tl.where(mtv, _act(i_t.to(tl.float32), I_ACT), 0.0)
        S = S * _exp(bl_t)[None, :] + tl.dot(tl.trans(v.to(DT)), w.to(DT), input_precision=PREC)

    if STORE_HT:
        tl.store(ht + i_nh.to(tl.int64) * V * K + s_pos, S, mask=s_mask)


@triton.jit
def _walk_loads(xk, bb, xv, left, ck, cv, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
                BV: tl.constexpr, BT: tl.constexpr):
    """One step's loads of the sequential walks (pointers at a chunk's first row and head; `left` rows from there
    to the sequence's end, ≤ 0 for no chunk): xk [BT, BK] (g or o), b [BT, BK], b's last row [BK] (the chunk's
    decay) and xv [BT, BV] (i or dy)."""
    offk, mtk = _chunk_tile(left, ck, H, K, BK, BT)
    offv, mtv = _chunk_tile(left, cv, H, V, BV, BT)
    b_last = tl.load(bb + (tl.minimum(left, BT) - 1) * (H * K) + ck, mask=ck < tl.where(left > 0, K, 0), other=0.0)
    return (tl.load(xk + offk, mask=mtk, other=0.0), tl.load(bb + offk, mask=mtk, other=0.0), b_last,
            tl.load(xv + offv, mask=mtv, other=0.0))


@triton.jit
def cp_decay_kernel(g, lb, bb, fb, chunks, T, NT, NC, H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr,
                    BK: tl.constexpr, HAS_LB: tl.constexpr, VARLEN: tl.constexpr, CHUNK_SPREAD: tl.constexpr):
    """b, the within-chunk cumsum of log f, into bb [B·T, H, K] fp32, and the chunk tier's verdict into fb: one
    program per (chunk, head, K-block). The parallel kernels' chunk tier reads b (a log and a scan per element
    fewer there), and so do the sequential walks (their steps are latency-bound).

    fb (int32, zeroed by the caller) = [count | leaves [NC·H] | list [NC·H]]: leaves[c·H + h] = 1 where some
    channel of the chunk decays by e^{-CHUNK_SPREAD} or more (it leaves the chunk tier), and the program that sets
    it first appends c·H + h to the list (count: the list's length), which the fallback launches walk instead of
    a grid over every chunk (the chunk-tier launches read no verdict: they take every chunk)."""
    i_c, i_h, i_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)  # chunks on axis 0 (2^31)
    t0, t1 = _chunk_bounds(chunks, i_c, T, NT, BT, VARLEN)
    n = (t1 - t0).to(tl.int32)
    ck = i_k * BK + tl.arange(0, BK)
    offk, mtk = _chunk_tile(n, ck, H, K, BK, BT)
    g, bb = g + (t0 * H + i_h) * K, bb + (t0 * H + i_h) * K
    a, _, _, _, _ = _gates(tl.load(g + offk, mask=mtk, other=0.0).to(tl.float32), _load_beta(lb, i_h, K, ck, HAS_LB),
                           HAS_LB)
    b = tl.cumsum(tl.where(mtk, a, 0.0), 0)
    tl.store(bb + offk, b, mask=mtk)
    # the verdict from the chunk's last row, read back (a reduction of the tile in registers would take it in a
    # second layout, and the compiler would redo the gate math for it: twice the instructions)
    tl.debug_barrier()
    b_end = tl.load(bb + (n - 1) * (H * K) + ck, mask=ck < tl.where(n > 0, K, 0), other=0.0)
    if -tl.min(b_end, 0) >= CHUNK_SPREAD:
        if tl.atomic_or(fb + 1 + i_c * H + i_h, 1) == 0:  # the first K-block to find it appends the chunk
            tl.store(fb + 1 + NC * H + tl.atomic_add(fb, 1), i_c * H + i_h)


@triton.jit
def _load_gates(o, g, lb, n, ck, i_h, scale, H: tl.constexpr, K: tl.constexpr, BK: tl.constexpr,
                BT: tl.constexpr, O_ACT: tl.constexpr, HAS_LB: tl.constexpr):
    """One K-block of a chunk (o, g at its first row and head): (offsets, mask, β, q = act(o)·scale, log f, k).
    The chunk tier does not use log f, and the compiler drops its computation there."""
    offk, mtk = _chunk_tile(n, ck, H, K, BK, BT)
    o_t = tl.load(o + offk, mask=mtk, other=0.0)
    g_t = tl.load(g + offk, mask=mtk, other=0.0)
    beta = _load_beta(lb, i_h, K, ck, HAS_LB)
    q = _act(o_t.to(tl.float32), O_ACT) * scale
    a, k, _, _, _ = _gates(g_t.to(tl.float32), beta, HAS_LB)
    return offk, mtk, beta, q, a, tl.where(mtk, k, 0.0)


@triton.jit
def cp_fwd_o_kernel(
    o, g, i, lb, h, y, a_out, bb, fb, chunks, scale, T, NT, NC,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    O_ACT: tl.constexpr, I_ACT: tl.constexpr, HAS_LB: tl.constexpr, VARLEN: tl.constexpr,
    MAX_SPREAD: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr, STORE_A: tl.constexpr, FALLBACK: tl.constexpr,
):
    """One program per (chunk, V-block, head); loops over K-blocks of BK (A and y accumulate over them).

    Two launches: the first (FALLBACK off, grid (NC, NV, H)) takes the chunk tier everywhere, from the within-chunk
    cumsum b that `cp_decay_kernel` stored in bb (no log, no scan here); the second (FALLBACK on, a small grid
    (P, NV, 1)) walks the chunks that `cp_decay_kernel` listed in fb as leaving the chunk tier, in the sub-block or
    exact tier per K-block, and rewrites every output of theirs (the first launch wrote them too, possibly
    non-finite: it reads no verdict, whose load would stall every program before its first tile). STORE_A: the
    first V-block also stores the causal A [BT, BT] of its chunk and head (in a_out's dtype) for the backward's
    dv."""
    i_v = tl.program_id(1)
    if FALLBACK:
        for e in range(tl.program_id(0), tl.load(fb), tl.num_programs(0)):
            c_h = tl.load(fb + 1 + NC * H + e)
            _fwd_o_chunk(o, g, i, lb, h, y, a_out, bb, chunks, scale, T, NT, c_h // H, i_v, c_h % H, H, K, V, BT,
                         BK, BV, O_ACT, I_ACT, HAS_LB, VARLEN, MAX_SPREAD, DT, PREC, STORE_A, FALLBACK)
    else:
        _fwd_o_chunk(o, g, i, lb, h, y, a_out, bb, chunks, scale, T, NT, tl.program_id(0), i_v, tl.program_id(2), H,
                     K, V, BT, BK, BV, O_ACT, I_ACT, HAS_LB, VARLEN, MAX_SPREAD, DT, PREC, STORE_A, FALLBACK)


@triton.jit
def _fwd_o_chunk(o, g, i, lb, h, y, a_out, bb, chunks, scale, T, NT, i_c, i_v, i_h, H: tl.constexpr,
                 K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                 O_ACT: tl.constexpr, I_ACT: tl.constexpr, HAS_LB: tl.constexpr, VARLEN: tl.constexpr,
                 MAX_SPREAD: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr, STORE_A: tl.constexpr,
                 FALLBACK: tl.constexpr):
    """`cp_fwd_o_kernel`'s work on chunk i_c, V-block i_v, head i_h."""
    t0, t1 = _chunk_bounds(chunks, i_c, T, NT, BT, VARLEN)
    n = (t1 - t0).to(tl.int32)
    # the chunk's rows and head as one int64 offset per pointer; the tiles' offsets from there are int32
    o, g, bb = o + (t0 * H + i_h) * K, g + (t0 * H + i_h) * K, bb + (t0 * H + i_h) * K
    i, y = i + (t0 * H + i_h) * V, y + (t0 * H + i_h) * V
    h += (i_c.to(tl.int64) * H + i_h) * V * K
    if n > 0:  # padding chunks: nothing (the chunk tier also takes fb's chunks; see `cp_fwd_o_kernel`)
        cv = i_v * BV + tl.arange(0, BV)
        rows = tl.arange(0, BT)
        offv, mtv = _chunk_tile(n, cv, H, V, BV, BT)
        i_t = tl.load(i + offv, mask=mtv, other=0.0)  # issued first: its latency hides behind the K loop
        out = tl.zeros([BT, BV], dtype=tl.float32)
        A = tl.zeros([BT, BT], dtype=tl.float32)
        for kb in range(0, tl.cdiv(K, BK)):
            ck = kb * BK + tl.arange(0, BK)
            offk, mtk, beta, q, a, k = _load_gates(o, g, lb, n, ck, i_h, scale, H, K, BK, BT, O_ACT, HAS_LB)
            h_t = tl.load(h + (cv[:, None] * K + ck[None, :]), mask=(cv < V)[:, None] & (ck < K)[None, :], other=0.0)
            if FALLBACK:
                a = tl.where(mtk, a, 0.0)
                c, r, R, b_last = _chunk_decay(a, BT, BK)
                A_k, ec, enc = _intra_A(q, k, c, r, R, -tl.min(tl.min(c, 1), 0), BT, BK, MAX_SPREAD, DT, PREC)
                A += A_k
                eb = ec * _expand_rows(_exp(r), BT, BK)
            else:
                e_q, e_k, m = _ref_decay(bb, n, offk, mtk, ck, H, K)
                A_k = tl.dot((q * e_q).to(DT), tl.trans((k * e_k).to(DT)), input_precision=PREC)
                A += tl.where(rows[:, None] >= rows[None, :], A_k, 0.0)
                eb = e_q * _exp(m)[None, :]
            out += tl.dot((q * eb).to(DT), tl.trans(h_t.to(DT)), input_precision=PREC)

        v = tl.where(mtv, _act(i_t.to(tl.float32), I_ACT), 0.0)
        out += tl.dot(A.to(DT), v.to(DT), input_precision=PREC)
        tl.store(y + offv, out.to(y.dtype.element_ty), mask=mtv)
        if STORE_A:
            if i_v == 0:
                a_out += (i_c.to(tl.int64) * H + i_h) * BT * BT
                tl.store(a_out + (rows[:, None] * BT + rows[None, :]), A.to(a_out.dtype.element_ty))
