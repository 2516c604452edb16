"""Triton building blocks shared by the HGRN2 chunk kernels: gate math, activations, the 16-token diagonal block.

Everything here runs in registers on fp32 tiles. Notation for one BT-token sub-block (BT = 16 by default) of
one head: q [BT, K] (activated, scaled output gate), k = 1 − f [BT, K], a = log f [BT, K], b = cumsum(a)
within the sub-block (so b ≤ 0 and non-increasing down the rows), v [BT, BV].
"""

import triton
import triton.language as tl

from ._interpret import INTERPRET

# The kernels' transcendentals take the PTX approximations with denormals flushed (`_exp`, `_log`, `_rcp`): one
# MUFU op each. tl.exp / tl.log check the range around their (non-flushing) MUFU op and `/` is IEEE division, a
# dozen instructions per element in kernels whose time is their instruction count. Under TRITON_INTERPRET the
# kernels run as numpy, which cannot run PTX: there they fall back to tl.exp, tl.log and `/`.
_INTERPRET = tl.constexpr(INTERPRET)


@triton.jit
def _exp(x):
    """e^x [fp32]: ex2.approx.ftz (2^-22 relative; results below 2^-126 are 0)."""
    if _INTERPRET:
        return tl.exp(x)
    else:
        return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f", [x * 1.4426950408889634],
                                         dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def _log(x):
    """ln x [fp32] for normal x > 0: lg2.approx.ftz (2^-22 absolute) times ln 2."""
    if _INTERPRET:
        return tl.log(x)
    else:
        return tl.inline_asm_elementwise("lg2.approx.ftz.f32 $0, $1;", "=f,f", [x.to(tl.float32)], dtype=tl.float32,
                                         is_pure=True, pack=1) * 0.6931471805599453


@triton.jit
def _rcp(x):
    """1 / x [fp32]: rcp.approx.ftz (1 ulp)."""
    if _INTERPRET:
        return 1.0 / x
    else:
        return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [x.to(tl.float32)], dtype=tl.float32,
                                         is_pure=True, pack=1)


@triton.jit
def _sigmoid(x):
    return _rcp(1.0 + _exp(-x))


@triton.jit
def _seq_bounds(cu_seqlens, i_n, T, VARLEN: tl.constexpr):
    """[bos, eos) of sequence i_n as rows of the flattened [B·T] token axis."""
    if VARLEN:
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
    else:
        bos = i_n.to(tl.int64) * T
        eos = bos + T
    return bos, eos


@triton.jit
def _load_beta(lb, i_h, K, ck, HAS_LB: tl.constexpr):
    """β [BK] of head i_h in fp32 (zeros without a bound)."""
    if HAS_LB:
        return tl.load(lb + i_h * K + ck, mask=ck < K, other=0.0).to(tl.float32)
    else:
        return tl.zeros(ck.shape, dtype=tl.float32)


@triton.jit
def _tile(t0, bos, eos, i_h, H, K: tl.constexpr, V: tl.constexpr, ck, cv, BK: tl.constexpr, BV: tl.constexpr,
          BT: tl.constexpr):
    """Offsets and masks (rows in [bos, eos)) of the BT-token sub-block from row t0: ([BT, BK], [BT, BV]).

    Column masks only where the block is padded, so that the masks are constant along rows and the loads
    vectorise.
    """
    tok = t0 + tl.arange(0, BT)
    mt = (tok >= bos) & (tok < eos)
    offk = (tok[:, None] * H + i_h) * K + ck[None, :]
    offv = (tok[:, None] * H + i_h) * V + cv[None, :]
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
def _gates(g, beta, HAS_LB: tl.constexpr):
    """Forget gate from logits g [R, K] and bound β [K]: returns (log f, k = 1 − f, σ(g), σ(−g), f).

    f = β + (1 − β)σ(g) and k = (1 − β)σ(−g) are sums of positive terms, so both keep full relative precision.
    log f is log1p(−k) where f ≥ 1/2 and log f directly below. log1p(−k) = log(u) + (−k − (u − 1))/u with
    u = fl(1 − k): u − 1 is exact (Sterbenz) and the residual is below half an ulp of 1, so taking 1/u ≈ 1
    costs < 3e-8 absolute. Three transcendental ops per element (exp, reciprocal, log): SFU throughput is
    a bottleneck of these kernels, so every one counts.
    """
    e = _exp(-tl.abs(g))
    r = _rcp(1.0 + e)
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
    a = _log(u) + tl.where(near_one, -k - (u - 1.0), 0.0)
    # f underflows only when β ≈ 0 and g < −69; there log f = log σ(g) = g to fp32 precision
    a = tl.where(f > 1e-30, a, g)
    return a, k, s_pos, s_neg, f


@triton.jit
def _act(x, ACT: tl.constexpr):
    """ACT: 0 identity, 1 silu, 2 sigmoid."""
    if ACT == 1:
        return x * _sigmoid(x)
    elif ACT == 2:
        return _sigmoid(x)
    else:
        return x


@triton.jit
def _act_and_grad(x, ACT: tl.constexpr):
    """(act(x), act'(x)) from one sigmoid."""
    if ACT == 1:
        s = _sigmoid(x)
        return x * s, s * (1.0 + x * (1.0 - s))
    elif ACT == 2:
        s = _sigmoid(x)
        return s, s * (1.0 - s)
    else:
        return x, tl.full(x.shape, 1.0, tl.float32)


@triton.jit
def _row(x, rows, j):
    """Row j of a register tile x [R, C] as a [C] vector (a masked reduction: Triton cannot index registers)."""
    return tl.sum(tl.where(rows[:, None] == j, x, 0.0), 0)


@triton.jit
def _col(x, cols, j):
    """Column j of a register tile x [R, C] as an [R] vector."""
    return tl.sum(tl.where(cols[None, :] == j, x, 0.0), 1)


@triton.jit
def _w_end(b, b_last, spread, MAX_SPREAD: tl.constexpr):
    """e^{b_last − b} [BT, K], the decay from each row to the sub-block's end, computed exactly as
    `_diag_block` does (its fast path reuses e^{−b}): the state updates of the forward and of both backward
    sweeps must round k ⊙ e^{b_last − b} to the same dot operand (see `_diag_grads`)."""
    # one return after the branch: Triton 3.6 cannot lower returns inside a branch on a runtime value
    if spread < MAX_SPREAD:
        w = _exp(b_last)[None, :] * _exp(-b)
    else:
        w = _exp(b_last[None, :] - b)
    return w


@triton.jit
def _diag_block(q, k, b, b_last, spread, MAX_SPREAD: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr):
    """The diagonal block and the sub-block's decay factors: returns (A, e^{b}, e^{b_last − b}).

    A[t, s] = Σ_k q[t,k]·k[s,k]·e^{b[t,k] − b[s,k]} for s ≤ t, else 0 ([BT, BT]). When the block's decay
    spread (max over channels of b[0] − b[BT−1], here −b_last) is below MAX_SPREAD (60), A is one tensor-core
    product (q e^{b})(k e^{−b})ᵀ — k e^{−b} ≤ e^{60} cannot overflow — and e^{b_last − b} = e^{b_last}·e^{−b}
    reuses e^{−b} (two exponentials per element in all). Otherwise A is exact, one column at a time with the
    exponent masked before exp (blocks that forget more than e^-60 within BT tokens).
    """
    BT: tl.constexpr = q.shape[0]
    rows = tl.arange(0, BT)
    causal = rows[:, None] >= rows[None, :]
    eb = _exp(b)
    if spread < MAX_SPREAD:
        enb = _exp(-b)
        w_end = _exp(b_last)[None, :] * enb
        A = tl.dot((q * eb).to(DT), tl.trans((k * enb).to(DT)), input_precision=PREC)
    else:
        w_end = _exp(b_last[None, :] - b)
        A = tl.zeros([BT, BT], dtype=tl.float32)
        for j in range(BT):
            k_j = _row(k, rows, j)
            b_j = _row(b, rows, j)
            w = _exp(tl.where(rows[:, None] >= j, b - b_j[None, :], float("-inf")))
            A += tl.where(rows[None, :] == j, tl.sum(q * k_j[None, :] * w, 1)[:, None], 0.0)
    return tl.where(causal, A, 0.0), eb, w_end


@triton.jit
def _diag_grads(q, k, b, b_last, eb, w_end, dA, spread, MAX_SPREAD: tl.constexpr, DT: tl.constexpr,
                PREC: tl.constexpr):
    """Backward of the diagonal block given dA [BT, BT] (causally masked) and `_diag_block`'s factors:
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
        enb = w_end * _exp(-b_last)[None, :]
        dAc = dA.to(DT)
        ke = (k * enb).to(DT)
        qe = (q * eb).to(DT)
        dq_raw = tl.dot(dAc, ke, input_precision=PREC)
        dk_raw = tl.dot(tl.trans(dAc), qe, input_precision=PREC)
        dq = eb * dq_raw
        dk = enb * dk_raw
        db = qe.to(tl.float32) * dq_raw - ke.to(tl.float32) * dk_raw
    else:
        dq = tl.zeros(q.shape, dtype=tl.float32)
        for j in range(BT):  # token j as the source s: feeds rows t ≥ j of dq
            b_j = _row(b, rows, j)
            wq = _exp(tl.where(rows[:, None] >= j, b - b_j[None, :], float("-inf")))
            dq += _col(dA, rows, j)[:, None] * _row(k, rows, j)[None, :] * wq
        dk = tl.zeros(q.shape, dtype=tl.float32)
        for j in range(BT):  # token j as the target t: feeds rows s ≤ j of dk
            b_j = _row(b, rows, j)
            wk = _exp(tl.where(rows[:, None] <= j, b_j[None, :] - b, float("-inf")))
            dk += _row(dA, rows, j)[:, None] * _row(q, rows, j)[None, :] * wk
        db = q * dq - k * dk
    return dq, dk, db
