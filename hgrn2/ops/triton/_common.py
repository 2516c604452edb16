"""Helpers shared by the HGRN2 training kernels (fused-chunk and chunk-parallel): host-side launch helpers, and
the Triton building blocks — gate math, activations, the diagonal block, the chunk geometry.

Everything here runs in registers on fp32 tiles. Notation for one BT-token sub-block (BT = 16 by default) of
one head: q [BT, K] (activated, scaled output gate), k = 1 − f [BT, K], a = log f [BT, K], b = cumsum(a)
within the sub-block (so b ≤ 0 and non-increasing down the rows), v [BT, BV].
"""

import functools

import torch
import triton
import triton.language as tl

from ._interpret import INTERPRET

ACTS = {None: 0, "silu": 1, "sigmoid": 2}  # activation names → the kernels' ACT codes
# Forget gates below this take dβ from `chunk_parallel_bwd_small_kernel`'s exact sum. Elsewhere dβ = Σ σ(−g)·(d log f
# / f − dk) from d log f's running sum, whose terms cancel: its fp32 rounding, relative to the gradient's scale, is
# multiplied by σ(−g)/f < 1/SMALL_F, a few 1e-4 of the scale at most, under bf16 training's own rounding.
SMALL_F = tl.constexpr(2.0 ** -8)
# `chunk_parallel_decay_kernel` marks which groups of this many channels hold such a gate (a bit each), so that the
# K-blocks of `chunk_parallel_bwd_small_kernel` without one skip the chunk (channels from 496 on share bit 31)
SMALL_GROUP = tl.constexpr(16)


@functools.cache
def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of `device` (1 off CUDA): launch grids are sized against it."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1


def state_precision(dt, prec: str) -> str:
    """tl.dot precision of the backward's products on fp32 state operands: the inputs' where fp32 inputs ask for
    more than one tf32 pass, else three tf32 passes (a single one truncates the state inside the MMA)."""
    return prec if dt == tl.float32 and prec != "tf32" else "tf32x3"


def seq_layout(o: torch.Tensor, cu_seqlens: torch.Tensor | None) -> tuple[int, int, int, int]:
    """(B, T, H, N) of inputs [B, T, H, K], N the number of sequences (B, or packed ones with cu_seqlens)."""
    B, T, H, _ = o.shape
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    return B, T, H, N

# The kernels' transcendentals take the PTX approximations with denormals flushed (`fast_exp`, `fast_log`,
# `fast_rcp`): one MUFU op each. tl.exp / tl.log check the range around their (non-flushing) MUFU op and `/` is
# IEEE division, a dozen instructions per element in kernels whose time is their instruction count. Under
# TRITON_INTERPRET the kernels run as numpy, which cannot run PTX: there they fall back to tl.exp, tl.log and `/`.
_INTERPRET = tl.constexpr(INTERPRET)


@triton.jit
def fast_exp(x):
    """e^x [fp32]: ex2.approx.ftz (2^-22 relative; results below 2^-126 are 0)."""
    if _INTERPRET:
        return tl.exp(x)
    else:
        return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f", [x * 1.4426950408889634],
                                         dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def fast_log(x):
    """ln x [fp32] for normal x > 0: lg2.approx.ftz (2^-22 absolute) times ln 2."""
    if _INTERPRET:
        return tl.log(x)
    else:
        return tl.inline_asm_elementwise("lg2.approx.ftz.f32 $0, $1;", "=f,f", [x.to(tl.float32)], dtype=tl.float32,
                                         is_pure=True, pack=1) * 0.6931471805599453


@triton.jit
def fast_rcp(x):
    """1 / x [fp32]: rcp.approx.ftz (1 ulp)."""
    if _INTERPRET:
        return 1.0 / x
    else:
        return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [x.to(tl.float32)], dtype=tl.float32,
                                         is_pure=True, pack=1)


@triton.jit
def sigmoid(x):
    return fast_rcp(1.0 + fast_exp(-x))


@triton.jit
def seq_bounds(cu_seqlens, i_n, T, VARLEN: tl.constexpr):
    """[bos, eos) of sequence i_n as rows of the flattened [B·T] token axis."""
    if VARLEN:
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
    else:
        bos = i_n.to(tl.int64) * T
        eos = bos + T
    return bos, eos


@triton.jit
def load_beta(lb, i_h, K, ck, HAS_LB: tl.constexpr):
    """β [BK] of head i_h in fp32 (zeros without a bound)."""
    if HAS_LB:
        return tl.load(lb + i_h * K + ck, mask=ck < K, other=0.0).to(tl.float32)
    else:
        return tl.zeros(ck.shape, dtype=tl.float32)


@triton.jit
def step_tile(t0, bos, eos, i_h, H, K: tl.constexpr, V: tl.constexpr, ck, cv, BK: tl.constexpr, BV: tl.constexpr,
              BT: tl.constexpr, REVERSE: tl.constexpr):
    """Offsets and masks (rows in [bos, eos)) of the BT-token sub-block from logical row t0: ([BT, BK], [BT, BV]).

    REVERSE walks the sequence from its last token: logical row t lies at row bos + eos − 1 − t of memory, so a
    reverse scan reads and writes the tensors in place (the masks stay on the logical rows). Column masks only
    where the block is padded, so that the masks are constant along rows and the loads vectorise.
    """
    tok = t0 + tl.arange(0, BT)
    mt = (tok >= bos) & (tok < eos)
    if REVERSE:
        row = bos + eos - 1 - tok
    else:
        row = tok
    offk = (row[:, None] * H + i_h) * K + ck[None, :]
    offv = (row[:, None] * H + i_h) * V + cv[None, :]
    if BK == K:
        mtk = tl.broadcast_to(mt[:, None], (BT, BK))
    else:
        mtk = mt[:, None] & (ck < K)[None, :]
    if V % BV == 0:
        mtv = tl.broadcast_to(mt[:, None], (BT, BV))
    else:
        mtv = mt[:, None] & (cv < V)[None, :]
    return offk, offv, mtk, mtv


@triton.jit
def gates(g, beta, HAS_LB: tl.constexpr):
    """Forget gate from logits g [R, K] and bound β [K]: returns (log f, k = 1 − f, σ(g), σ(−g), f).

    f = β + (1 − β)σ(g) and k = (1 − β)σ(−g) are sums of positive terms, so both keep full relative precision.
    log f is log1p(−k) where f ≥ 1/2 and log f directly below. log1p(−k) = log(u) + (−k − (u − 1))/u with
    u = fl(1 − k): u − 1 is exact (Sterbenz) and the residual is below half an ulp of 1, so taking 1/u ≈ 1
    costs < 3e-8 absolute. Three transcendental ops per element (exp, reciprocal, log): SFU throughput is
    a bottleneck of these kernels, so every one counts.
    """
    e = fast_exp(-tl.abs(g))
    r = fast_rcp(1.0 + e)
    s_pos = tl.where(g >= 0, r, e * r)
    s_neg = tl.where(g >= 0, e * r, r)
    if HAS_LB:
        k = (1.0 - beta[None, :]) * s_neg
        f = beta[None, :] + (1.0 - beta[None, :]) * s_pos
    else:
        k = s_neg
        f = s_pos
    near_one = k < 0.5
    u = tl.where(near_one, 1.0 - k, f)
    a = fast_log(u) + tl.where(near_one, -k - (u - 1.0), 0.0)
    # f underflows only when β ≈ 0 and g < −69; there log f = log σ(g) = g to fp32 precision
    a = tl.where(f > 1e-30, a, g)
    return a, k, s_pos, s_neg, f


@triton.jit
def act(x, ACT: tl.constexpr):
    """ACT: 0 identity, 1 silu, 2 sigmoid."""
    if ACT == 1:
        return x * sigmoid(x)
    elif ACT == 2:
        return sigmoid(x)
    else:
        return x


@triton.jit
def act_and_grad(x, ACT: tl.constexpr):
    """(act(x), act'(x)) from one sigmoid."""
    if ACT == 1:
        s = sigmoid(x)
        return x * s, s * (1.0 + x * (1.0 - s))
    elif ACT == 2:
        s = sigmoid(x)
        return s, s * (1.0 - s)
    else:
        return x, tl.full(x.shape, 1.0, tl.float32)


@triton.jit
def take_row(x, rows, j):
    """Row j of a register tile x [R, C] as a [C] vector (a masked reduction: Triton cannot index registers)."""
    return tl.sum(tl.where(rows[:, None] == j, x, 0.0), 0)


# The exact tiers form every exponent as a sum of a = log f over only the tokens it spans: a difference of two
# cumulative sums (b_t − b_s) keeps their rounding, ε·|b|, which reaches 1e-4 where gates are closed although the
# exponent itself may be near 0. The sums grow one row per step of the loops over the block's rows (no scans,
# whose layouts the compiler would impose on the fast tiers' code too), one target row at a time: a single
# exponential per step serves A, or dq and dk together, and the last step's exponents are the decay to the end.


@triton.jit
def suffix_exponent(a, rows):
    """Σ_{u > t} a_u [BT, K]: the exponent of the decay from each row to the block's end."""
    BT: tl.constexpr = a.shape[0]
    e = tl.zeros(a.shape, dtype=tl.float32)
    for j in range(1, BT):
        e += tl.where(rows[:, None] < j, take_row(a, rows, j)[None, :], 0.0)
    return e


@triton.jit
def _span_to(e, a, rows, j):
    """The exponents Σ_{s<u≤j} a_u on the rows s ≤ j (−∞ below) from those up to row j − 1 (a step of the loops)."""
    return tl.where(rows[:, None] < j, e + take_row(a, rows, j)[None, :], tl.where(rows[:, None] == j, 0.0, e))


@triton.jit
def exact_A(q, k, a, rows, A):
    """A [BT, BT] plus the causal block Σ_k q_t k_s e^{Σ_{s<u≤t} a_u}, one target row t at a time, and the last
    row's exponents Σ_{u>s} a_u [BT, K] (the decay from each row to the block's end)."""
    BT: tl.constexpr = q.shape[0]
    e = tl.full(q.shape, float("-inf"), tl.float32)
    for j in range(BT):
        e = _span_to(e, a, rows, j)
        A += tl.where(rows[:, None] == j, tl.sum(k * take_row(q, rows, j)[None, :] * fast_exp(e), 1)[None, :], 0.0)
    return A, e


@triton.jit
def exact_pair_grads(q, k, a, dA, rows):
    """dq, dk [BT, K] of the causal block from dA [BT, BT] (causally masked), exponents as in `exact_A`: per
    target row j, its dq row and every source's share of dk from one exponential."""
    BT: tl.constexpr = q.shape[0]
    dAf = dA.to(tl.float32)
    dq = tl.zeros(q.shape, dtype=tl.float32)
    dk = tl.zeros(q.shape, dtype=tl.float32)
    e = tl.full(q.shape, float("-inf"), tl.float32)
    for j in range(BT):
        e = _span_to(e, a, rows, j)
        w = take_row(dAf, rows, j)[:, None] * fast_exp(e)  # dA[j, s] e^{b_j − b_s} on the rows s
        dq += tl.where(rows[:, None] == j, tl.sum(w * k, 0)[None, :], 0.0)
        dk += w * take_row(q, rows, j)[None, :]
    return dq, dk


@triton.jit
def decay_to_end(a, b, b_last, spread, MAX_SPREAD: tl.constexpr):
    """e^{b_last − b} [BT, K], the decay from each row to the sub-block's end, computed exactly as
    `diag_block` does (its fast path reuses e^{m − b}; the exact tier sums a = log f over the later rows): the state
    updates of the forward and of both backward sweeps must round k ⊙ e^{b_last − b} to the same dot operand (see
    `diag_grads`)."""
    # one return after the branch: Triton 3.6 cannot lower returns inside a branch on a runtime value
    if spread < 2 * MAX_SPREAD:
        m = 0.5 * b_last
        w = fast_exp(-(b - m[None, :])) * fast_exp(m)[None, :]
    else:
        w = fast_exp(suffix_exponent(a, tl.arange(0, b.shape[0])))
    return w


@triton.jit
def causal_av(A, v, DT: tl.constexpr, PREC: tl.constexpr):
    """A v for a causal block A [BT, BT] and v [BT, BV], keeping a non-finite v[s] out of the rows t < s.

    In the product those rows hold A[t, s] = 0, and 0·inf = NaN would carry the bad value back in time; the
    non-finite entries enter as 0 and each column is NaN from its first non-finite row on (the true value there is
    non-finite too). Which rows those are, a second product with the lower-triangular ones finds, in the layout of
    the first: a reduction over the rows would cross warps through shared memory at every step of the walks.
    """
    BT: tl.constexpr = v.shape[0]
    rows = tl.arange(0, BT)
    good = tl.abs(v) < float("inf")  # false for inf and NaN
    out = tl.dot(A.to(DT), tl.where(good, v, 0.0).to(DT), input_precision=PREC)
    lower = tl.where(rows[:, None] >= rows[None, :], 1.0, 0.0).to(DT)
    hits = tl.dot(lower, tl.where(good, 0.0, 1.0).to(DT), input_precision=PREC)
    return tl.where(hits > 0, float("nan"), out)


@triton.jit
def diag_block(q, k, a, b, b_last, spread, MAX_SPREAD: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr):
    """The diagonal block and the sub-block's decay factors: returns (A, e^{b}, e^{b_last − b}).

    A[t, s] = Σ_k q[t,k]·k[s,k]·e^{b[t,k] − b[s,k]} for s ≤ t, else 0 ([BT, BT]). When the block's decay
    spread (max over channels of b[0] − b[BT−1], here −b_last) is below 2·MAX_SPREAD (120), A is one
    tensor-core product (q e^{b − m})(k e^{m − b})ᵀ about the reference m = b_last / 2 per channel: |b − m| ≤
    spread / 2, so neither factor exceeds e^{60} (a reference at the block's start would allow a spread of 60 only,
    and heads with small bounds would take the exact tier often); e^{b} = e^{b − m}·e^{m} and e^{b_last − b} =
    e^{m − b}·e^{m} reuse them (two exponentials per element in all). Otherwise A is exact, one row at a time with
    the exponent masked before exp (blocks that forget more than e^-120 within BT tokens), each exponent a sum of
    a = log f over the tokens it spans (`exact_A`).
    """
    BT: tl.constexpr = q.shape[0]
    rows = tl.arange(0, BT)
    causal = rows[:, None] >= rows[None, :]
    if spread < 2 * MAX_SPREAD:
        m = 0.5 * b_last
        em = fast_exp(m)[None, :]
        d = b - m[None, :]
        e_q = fast_exp(d)
        e_k = fast_exp(-d)
        eb = e_q * em
        w_end = e_k * em
        A = tl.dot((q * e_q).to(DT), tl.trans((k * e_k).to(DT)), input_precision=PREC)
    else:
        eb = fast_exp(b)
        A, e = exact_A(q, k, a, rows, tl.zeros([BT, BT], dtype=tl.float32))
        w_end = fast_exp(e)
    return tl.where(causal, A, 0.0), eb, w_end


@triton.jit
def diag_grads(q, k, a, b_last, eb, w_end, dA, spread, MAX_SPREAD: tl.constexpr, DT: tl.constexpr,
                PREC: tl.constexpr):
    """Backward of the diagonal block given dA [BT, BT] (causally masked) and `diag_block`'s factors:
    returns (dq, dk, q ⊙ dq − k ⊙ dk) [BT, K], the last being the block's share of d log f's running sum.

    That share cancels pair by pair (Σ over the block is 0: A depends on b only through differences), and
    d log f is the small remainder of large terms. On the fast path each pair (t, s) enters dq through the
    rounded operand (k e^{−b})_s and dk through (q e^{b})_t, so the share is formed from the same rounded
    operands, (q e^{b}) ⊙ dot(dA, k e^{−b}) − (k e^{−b}) ⊙ dot(dAᵀ, q e^{b}): then the pairs cancel to fp32
    rounding instead of leaving bf16's 4e-3 of every term in d log f (and in dg, dβ). The fast path gets e^{−b}
    as e^{b_last − b}·e^{−b_last} (a [K] exponential)."""
    BT: tl.constexpr = q.shape[0]
    rows = tl.arange(0, BT)
    if spread < MAX_SPREAD:
        enb = w_end * fast_exp(-b_last)[None, :]
        dAc = dA.to(DT)
        ke = (k * enb).to(DT)
        qe = (q * eb).to(DT)
        dq_raw = tl.dot(dAc, ke, input_precision=PREC)
        dk_raw = tl.dot(tl.trans(dAc), qe, input_precision=PREC)
        dq = eb * dq_raw
        dk = enb * dk_raw
        db = qe.to(tl.float32) * dq_raw - ke.to(tl.float32) * dk_raw
    else:
        dq, dk = exact_pair_grads(q, k, a, dA, rows)
        db = q * dq - k * dk
    return dq, dk, db


# --- chunk-parallel kernels: chunk geometry, the decay within a chunk, the intra-chunk block ---


@triton.jit
def chunk_bounds(chunks, i_c, T, NT, BT: tl.constexpr, VARLEN: tl.constexpr):
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
def chunk_tile(n, cols, H: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, BT: tl.constexpr):
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
def chunk_offset(chunk_offsets, i_n, NT, VARLEN: tl.constexpr):
    """Global index of sequence i_n's first chunk."""
    if VARLEN:
        return tl.load(chunk_offsets + i_n).to(tl.int64)
    else:
        return i_n.to(tl.int64) * NT


@triton.jit
def chunk_decay(a, BT: tl.constexpr, BK: tl.constexpr):
    """a = log f [BT, BK] (0 on padded rows) → (c, r, b_last): c the inclusive cumsum within 16-row
    sub-blocks, r [NB, BK] the exclusive prefix of the sub-block sums (b = c + r on each sub-block's rows), b_last
    the chunk's total."""
    NB: tl.constexpr = BT // 16
    a3 = tl.reshape(a, [NB, 16, BK])
    c = tl.reshape(tl.cumsum(a3, 1), [BT, BK])
    s = tl.sum(a3, 1)
    cs = tl.cumsum(s, 0)
    r = cs - s
    b_last = tl.sum(s, 0)
    return c, r, b_last


@triton.jit
def expand_rows(x, BT: tl.constexpr, BK: tl.constexpr):
    """[NB, BK] per-sub-block rows → [BT, BK] (each row of x repeated on its sub-block's 16 rows)."""
    NB: tl.constexpr = BT // 16
    return tl.reshape(tl.broadcast_to(x[:, None, :], [NB, 16, BK]), [BT, BK])


@triton.jit
def sub_decay(r, j, BT: tl.constexpr, BK: tl.constexpr):
    """E_j [BT, BK]: e^{r_i − r_j} on the rows of sub-block i ≥ j, 0 above (every exponent ≤ 0)."""
    NB: tl.constexpr = BT // 16
    ib = tl.arange(0, NB)
    r_j = tl.sum(tl.where(ib[:, None] == j, r, 0.0), 0)
    e = tl.where(ib[:, None] >= j, fast_exp(tl.minimum(r - r_j[None, :], 0.0)), 0.0)
    return expand_rows(e, BT, BK)


@triton.jit
def ref_decay(bb, n, offk, mtk, ck, H: tl.constexpr, K: tl.constexpr):
    """Chunk tier: from b (the within-chunk cumsum of log f, bb at the chunk's first row and head) and the
    reference m = b_last / 2 per channel, returns (e^{b − m}, e^{m − b}) [BT, BK] and m [BK]. |b − m| ≤
    (−b_last) / 2, so both factors stay within e^{±60} while the chunk's decay is below CHUNK_SPREAD = 120 (a
    reference at the chunk's start would allow only 60)."""
    m = 0.5 * tl.load(bb + (n - 1) * (H * K) + ck, mask=ck < K, other=0.0)
    d = tl.load(bb + offk, mask=mtk, other=0.0) - m[None, :]
    return fast_exp(d), fast_exp(-d), m


@triton.jit
def half_decay(bb, n, offk, mtk, ck, H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr):
    """Halves tier: from b (bb at the chunk's first row and head), a reference per half of the chunk, m₁ = b_mid / 2
    on the first BT/2 rows and m₂ = (b_mid + b_last) / 2 on the others (b_mid: b at the first half's last row), so
    that |b − m| stays within half a half's decay. Returns, per row and its half's m, e^{b − m} and e^{m − b}
    [BT, BK] (rows past the chunk's end as its last row), e^{m} and e^{b_last − m} [BT, BK], the factor
    e^{m₂ − m₁} = e^{b_last / 2} on the first half's rows (1 on the others) that takes k e^{m₁ − b} to k e^{m₂ − b}
    for the pairs across the halves (every such factor ≤ 1), the first half's rows [BT, 1] and b_last [BK]."""
    b_last = tl.load(bb + (n - 1) * (H * K) + ck, mask=ck < K, other=0.0)
    b_mid = tl.load(bb + (tl.minimum(n, BT // 2) - 1) * (H * K) + ck, mask=ck < K, other=0.0)
    m1 = 0.5 * b_mid
    m2 = 0.5 * (b_mid + b_last)
    up = (tl.arange(0, BT) < BT // 2)[:, None]
    d = tl.where(mtk, tl.load(bb + offk, mask=mtk, other=0.0), b_last[None, :]) - tl.where(up, m1[None, :],
                                                                                          m2[None, :])
    em = tl.where(up, fast_exp(m1)[None, :], fast_exp(m2)[None, :])
    el = tl.where(up, fast_exp(b_last - m1)[None, :], fast_exp(b_last - m2)[None, :])
    across = tl.where(up, fast_exp(0.5 * b_last)[None, :], 1.0)
    return fast_exp(d), fast_exp(-d), em, el, across, up, b_last


@triton.jit
def tier_list(fb, NC, H: tl.constexpr, TIER: tl.constexpr):
    """(length, first entry) of the chunk list that the launch of TIER walks: 1 the halves tier's, 2 the
    fallback's (fb's layout: `chunk_parallel_decay_kernel`)."""
    if TIER == 1:
        return tl.load(fb + 1), fb + 2 + 2 * NC * H
    else:
        return tl.load(fb), fb + 2 + NC * H


@triton.jit
def listed(fb, c_h, TIER: tl.constexpr):
    """Whether the launch of TIER takes list entry c_h: the halves tier leaves the chunks that another K-block of
    `chunk_parallel_decay_kernel` sent to the fallback."""
    if TIER == 1:
        return tl.load(fb + 2 + c_h) < 2
    else:
        return c_h >= 0


@triton.jit
def intra_A(q, k, a, c, r, spread, BT: tl.constexpr, BK: tl.constexpr, MAX_SPREAD: tl.constexpr,
             DT: tl.constexpr, PREC: tl.constexpr):
    """The causal intra-chunk block A [BT, BT] and e^{c}, e^{−c} (the latter only meaningful on the fast path, and
    capped at e^{80} so that it stays finite elsewhere)."""
    NB: tl.constexpr = BT // 16
    rows = tl.arange(0, BT)
    blk = rows // 16
    causal = rows[:, None] >= rows[None, :]
    ec = fast_exp(c)
    enc = fast_exp(tl.minimum(-c, 80.0))  # outside the branch: Triton 3.6 cannot merge the two branches' layouts
    A = tl.zeros([BT, BT], dtype=tl.float32)
    if spread < MAX_SPREAD:
        qt = q * ec
        kt = k * enc
        for j in tl.static_range(NB):
            Ej = sub_decay(r, j, BT, BK)
            kj = tl.where((blk == j)[:, None], kt, 0.0)
            A += tl.dot((qt * Ej).to(DT), tl.trans(kj.to(DT)), input_precision=PREC)
    else:
        A, _ = exact_A(q, k, a, rows, A)
    return tl.where(causal, A, 0.0), ec, enc


@triton.jit
def walk_loads(xk, bb, xv, left, ck, cv, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
                BV: tl.constexpr, BT: tl.constexpr):
    """One step's loads of the sequential walks (pointers at a chunk's first row and head; `left` rows from there
    to the sequence's end, ≤ 0 for no chunk): xk [BT, BK] (g or o), b [BT, BK], b's last row [BK] (the chunk's
    decay) and xv [BT, BV] (i or dy)."""
    offk, mtk = chunk_tile(left, ck, H, K, BK, BT)
    offv, mtv = chunk_tile(left, cv, H, V, BV, BT)
    b_last = tl.load(bb + (tl.minimum(left, BT) - 1) * (H * K) + ck, mask=ck < tl.where(left > 0, K, 0), other=0.0)
    return (tl.load(xk + offk, mask=mtk, other=0.0), tl.load(bb + offk, mask=mtk, other=0.0), b_last,
            tl.load(xv + offv, mask=mtv, other=0.0))


@triton.jit
def load_gates(o, g, lb, n, ck, i_h, scale, H: tl.constexpr, K: tl.constexpr, BK: tl.constexpr,
                BT: tl.constexpr, O_ACT: tl.constexpr, HAS_LB: tl.constexpr):
    """One K-block of a chunk (o, g at its first row and head): (offsets, mask, β, q = act(o)·scale, log f, k).
    The chunk tier does not use log f, and the compiler drops its computation there."""
    offk, mtk = chunk_tile(n, ck, H, K, BK, BT)
    o_t = tl.load(o + offk, mask=mtk, other=0.0)
    g_t = tl.load(g + offk, mask=mtk, other=0.0)
    beta = load_beta(lb, i_h, K, ck, HAS_LB)
    q = act(o_t.to(tl.float32), O_ACT) * scale
    a, k, _, _, _ = gates(g_t.to(tl.float32), beta, HAS_LB)
    return offk, mtk, beta, q, a, tl.where(mtk, k, 0.0)
