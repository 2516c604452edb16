"""HGRN1's element-wise recurrence in Triton, forward and backward, real or complex:

    a_t = f_t·e^{iθ},   h_t = a_t ⊙ h_{t-1} + k_t ⊙ x_t,   f_t = β + (1 − β)σ(g_t),   k_t = 1 − f_t = (1 − β)σ(−g_t)

Every program scans one block of BD channels through one chunk of time, carrying its state in fp32 registers
(a complex state as re/im pairs; complex tensors are read through `torch.view_as_real`). When batch × channels
is too small to fill the GPU, time is cut into NC chunks and the linear recurrence is split in three passes:

  1. each chunk scans from a zero state, keeping only its end state E_c and its decay A_c = Π a_t;
  2. a short sequential pass over chunks turns those into every chunk's true start state, S_{c+1} = A_c S_c + E_c;
  3. each chunk scans again from S_c, writing the outputs.

The backward pass is the same recurrence run in reverse with conj(a): d_t = do_t + conj(a_{t+1})·d_{t+1}, and

    dx_t = k_t d_t,   dk_t = Re(d_t·conj(x_t)),   df_t = Re(d_t·conj(h_{t-1})·e^{-iθ}),
    dθ  += f_t·Im(d_t·conj(h_{t-1})·e^{-iθ}),     dg_t = (1 − β)σ(g)σ(−g)(df_t − dk_t),   dβ += σ(−g)(df_t − dk_t)

with h_{t-1} read back from the forward output. Both directions are custom ops under torch.compile
(`_device.triton_op`), differentiable through `_HGRN1`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._device import cdiv, next_pow2, triton_op

MIN_CHUNK = 64  # shortest time chunk worth a second pass over the inputs
TARGET_PROGRAMS = 1024  # enough programs to keep every SM of a large GPU busy


@triton.jit
def _span(cu_seqlens, i_n, i_c, T, CHUNK, IS_VARLEN: tl.constexpr):
    """Token range [bos, eos) of chunk i_c of sequence i_n, and the sequence's first token."""
    if IS_VARLEN:
        seq = tl.load(cu_seqlens + i_n).to(tl.int64)
        end = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
    else:
        seq = i_n.to(tl.int64) * T
        end = seq + T
    bos = seq + i_c * CHUNK
    eos = tl.minimum(bos + CHUNK, end)
    return seq, bos, eos


@triton.jit
def _load2(p, off, mask, CPLX: tl.constexpr):
    """Real and imaginary parts (0 for real tensors) at element offsets `off` of a [..., CPLX] tensor."""
    re = tl.load(p + off * CPLX, mask=mask, other=0).to(tl.float32)
    if CPLX == 2:
        im = tl.load(p + off * 2 + 1, mask=mask, other=0).to(tl.float32)
    else:
        im = tl.zeros_like(re)
    return re, im


@triton.jit
def _store2(p, off, re, im, mask, CPLX: tl.constexpr):
    tl.store(p + off * CPLX, re.to(p.dtype.element_ty), mask=mask)
    if CPLX == 2:
        tl.store(p + off * 2 + 1, im.to(p.dtype.element_ty), mask=mask)


@triton.jit
def _bound(lb, o_d, mask, BD: tl.constexpr, HAS_LB: tl.constexpr):
    """β for a block of channels (0 without a bound)."""
    if HAS_LB:
        beta = tl.load(lb + o_d, mask=mask, other=0).to(tl.float32)
    else:
        beta = tl.zeros([BD], dtype=tl.float32)
    return beta


@triton.jit
def _gates(g, beta, p_g, mask):
    """f, k = 1 − f, σ(g), σ(−g) for one token."""
    b_g = tl.load(g + p_g, mask=mask, other=0).to(tl.float32)
    s_pos, s_neg = tl.sigmoid(b_g), tl.sigmoid(-b_g)
    return beta + (1 - beta) * s_pos, (1 - beta) * s_neg, s_pos, s_neg


@triton.jit
def _fwd_kernel(x, g, lb, theta, h_in, out, end, dec, cu_seqlens, T, CHUNK, NC,
                D: tl.constexpr, BD: tl.constexpr, CPLX: tl.constexpr, HAS_LB: tl.constexpr, HAS_HIN: tl.constexpr,
                STORE_OUT: tl.constexpr, STORE_DEC: tl.constexpr, IS_VARLEN: tl.constexpr):
    """Scan chunk c of sequence n from h_in[n·NC + c] (or 0); write outputs and/or the end state and decay."""
    i_j, i_d = tl.program_id(0), tl.program_id(1)  # x: the large dimension
    i_n, i_c = i_j // NC, i_j % NC
    seq, bos, eos = _span(cu_seqlens, i_n, i_c, T, CHUNK, IS_VARLEN)
    o_d = i_d * BD + tl.arange(0, BD)
    mask = o_d < D
    p_j = i_j.to(tl.int64) * D + o_d
    if HAS_HIN:
        hr, hi = _load2(h_in, p_j, mask, CPLX)
    else:
        hr, hi = tl.zeros([BD], dtype=tl.float32), tl.zeros([BD], dtype=tl.float32)
    if CPLX == 2:
        th = tl.load(theta + o_d, mask=mask, other=0).to(tl.float32)
        cos, sin = tl.cos(th), tl.sin(th)
    beta = _bound(lb, o_d, mask, BD, HAS_LB)
    prod = tl.full([BD], 1.0, dtype=tl.float32)
    for t in range(bos, eos):
        p_t = t * D + o_d
        f, k, _, _ = _gates(g, beta, p_t, mask)
        xr, xi = _load2(x, p_t, mask, CPLX)
        if CPLX == 2:
            hr, hi = f * (cos * hr - sin * hi) + k * xr, f * (cos * hi + sin * hr) + k * xi
        else:
            hr = f * hr + k * xr
        if STORE_DEC:
            prod *= f
        if STORE_OUT:
            _store2(out, p_t, hr, hi, mask, CPLX)
    _store2(end, p_j, hr, hi, mask, CPLX)
    if STORE_DEC:
        if CPLX == 2:
            ang = (eos - bos).to(tl.float32) * th
            _store2(dec, p_j, prod * tl.cos(ang), prod * tl.sin(ang), mask, CPLX)
        else:
            _store2(dec, p_j, prod, prod, mask, CPLX)


@triton.jit
def _carry_kernel(end, dec, init, carry, final, NC, D: tl.constexpr, BD: tl.constexpr, CPLX: tl.constexpr,
                  HAS_INIT: tl.constexpr, REVERSE: tl.constexpr):
    """Chain the chunks of sequence n: carry[c] = state entering chunk c; S ← A_c·S + E_c (conj(A_c) in reverse)."""
    i_n, i_d = tl.program_id(0), tl.program_id(1)
    o_d = i_d * BD + tl.arange(0, BD)
    mask = o_d < D
    if HAS_INIT:
        sr, si = _load2(init, i_n.to(tl.int64) * D + o_d, mask, CPLX)
    else:
        sr, si = tl.zeros([BD], dtype=tl.float32), tl.zeros([BD], dtype=tl.float32)
    for cc in range(0, NC):
        if REVERSE:
            c = NC - 1 - cc
        else:
            c = cc
        p_j = (i_n.to(tl.int64) * NC + c) * D + o_d
        _store2(carry, p_j, sr, si, mask, CPLX)
        ar, ai = _load2(dec, p_j, mask, CPLX)
        er, ei = _load2(end, p_j, mask, CPLX)
        if CPLX == 2:
            if REVERSE:
                ai = -ai
            sr, si = ar * sr - ai * si + er, ar * si + ai * sr + ei
        else:
            sr = ar * sr + er
    _store2(final, i_n.to(tl.int64) * D + o_d, sr, si, mask, CPLX)


@triton.jit
def _bwd_kernel(x, g, lb, theta, h0, out, d_in, dout, dx, dg, dlb, dth, end, dec, cu_seqlens, T, CHUNK, NC,
                D: tl.constexpr, BD: tl.constexpr, CPLX: tl.constexpr, HAS_LB: tl.constexpr, HAS_H0: tl.constexpr,
                HAS_DIN: tl.constexpr, LOCAL: tl.constexpr, IS_VARLEN: tl.constexpr):
    """Reverse scan of chunk c from d_in (the gradient flowing in from later tokens, or 0).

    LOCAL: only the end carry and the decay (pass 1). Otherwise write dx, dg and per-program partial sums of
    dβ, dθ, and the carry leaving the chunk (the gradient of the state before it) into `end`.
    """
    i_j, i_d = tl.program_id(0), tl.program_id(1)  # x: the large dimension
    i_n, i_c = i_j // NC, i_j % NC
    seq, bos, eos = _span(cu_seqlens, i_n, i_c, T, CHUNK, IS_VARLEN)
    o_d = i_d * BD + tl.arange(0, BD)
    mask = o_d < D
    p_j = i_j.to(tl.int64) * D + o_d
    if HAS_DIN:
        dr, di = _load2(d_in, p_j, mask, CPLX)
    else:
        dr, di = tl.zeros([BD], dtype=tl.float32), tl.zeros([BD], dtype=tl.float32)
    if CPLX == 2:
        th = tl.load(theta + o_d, mask=mask, other=0).to(tl.float32)
        cos, sin = tl.cos(th), tl.sin(th)
    prod = tl.full([BD], 1.0, dtype=tl.float32)
    acc_lb = tl.zeros([BD], dtype=tl.float32)
    acc_th = tl.zeros([BD], dtype=tl.float32)
    beta = _bound(lb, o_d, mask, BD, HAS_LB)
    for tt in range(bos, eos):
        t = bos + eos - 1 - tt
        p_t = t * D + o_d
        f, k, s_pos, s_neg = _gates(g, beta, p_t, mask)
        gr, gi = _load2(dout, p_t, mask, CPLX)
        dr, di = dr + gr, di + gi  # d = total gradient of h_t
        if LOCAL:
            prod *= f
        else:
            xr, xi = _load2(x, p_t, mask, CPLX)
            if t > seq:
                pr, pi = _load2(out, p_t - D, mask, CPLX)
            elif HAS_H0:
                pr, pi = _load2(h0, i_n.to(tl.int64) * D + o_d, mask, CPLX)
            else:
                pr, pi = tl.zeros([BD], dtype=tl.float32), tl.zeros([BD], dtype=tl.float32)
            _store2(dx, p_t, k * dr, k * di, mask, CPLX)
            d_k = dr * xr + di * xi
            if CPLX == 2:
                zr, zi = dr * pr + di * pi, di * pr - dr * pi  # d·conj(h_{t-1})
                d_f = zr * cos + zi * sin
                acc_th += f * (zi * cos - zr * sin)
            else:
                d_f = dr * pr
            u = d_f - d_k
            tl.store(dg + p_t, ((1 - beta) * s_pos * s_neg * u).to(dg.dtype.element_ty), mask=mask)
            acc_lb += s_neg * u
        # carry to token t-1: conj(a_t)·d
        if CPLX == 2:
            dr, di = f * (cos * dr + sin * di), f * (cos * di - sin * dr)
        else:
            dr = f * dr
    _store2(end, p_j, dr, di, mask, CPLX)
    if LOCAL:
        if CPLX == 2:
            ang = (eos - bos).to(tl.float32) * th
            _store2(dec, p_j, prod * tl.cos(ang), prod * tl.sin(ang), mask, CPLX)
        else:
            _store2(dec, p_j, prod, prod, mask, CPLX)
    else:
        if HAS_LB:
            tl.store(dlb + p_j, acc_lb, mask=mask)
        if CPLX == 2:
            tl.store(dth + p_j, acc_th, mask=mask)


# ---------------------------------------------------------------------------------------------------------------
# launch helpers


def _planes(z: torch.Tensor | None) -> torch.Tensor | None:
    """A contiguous real view: complex [..., D] → float [..., D, 2]."""
    if z is None:
        return None
    z = z.contiguous()
    return torch.view_as_real(z.resolve_conj()) if z.is_complex() else z


def _layout(x: torch.Tensor, cu_seqlens, chunk: int):
    """(N, T, D, BD, NC, CHUNK, grid over (N·NC, channel blocks)) for a launch."""
    B, T, D = x.shape
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    BD = min(128, max(16, next_pow2(D)))
    nd = cdiv(D, BD)
    if cu_seqlens is not None:
        NC = 1  # packed sequences of unequal lengths: one chunk per sequence
    elif chunk > 0:
        NC = cdiv(T, chunk)
    else:
        NC = max(1, min(T // MIN_CHUNK, cdiv(TARGET_PROGRAMS, N * nd)))
    CHUNK = cdiv(T, NC)
    NC = cdiv(T, CHUNK)
    return N, T, D, BD, NC, CHUNK, (N * NC, nd)


def _contiguous(*ts):
    """Contiguous tensors (outputs made with empty_like then share the kernels' row-major indexing)."""
    return [None if t is None else t.contiguous() for t in ts]


def _warps(BD: int) -> int:
    return max(1, BD // 64)


def _state_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, torch.float32)


@triton_op("hgrn2::hgrn1_fwd")
def _fwd(x: torch.Tensor, g: torch.Tensor, lb: torch.Tensor | None, theta: torch.Tensor | None,
         h0: torch.Tensor | None, cu_seqlens: torch.Tensor | None, want_final: bool,
         chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    N, T, D, BD, NC, CHUNK, grid = _layout(x, cu_seqlens, chunk)
    CPLX = 2 if x.is_complex() else 1
    x, g, lb, theta = _contiguous(x, g, lb, theta)
    xs, h0s = _planes(x), _planes(h0)
    out = torch.empty_like(x)
    final = x.new_empty(N, D, dtype=_state_dtype(x))
    common = dict(D=D, BD=BD, CPLX=CPLX, HAS_LB=lb is not None, IS_VARLEN=cu_seqlens is not None,
                  num_warps=_warps(BD))
    h_in = h0s
    if NC > 1:  # passes 1 and 2: the state entering every chunk
        ends = x.new_empty(N * NC, D, CPLX, dtype=torch.float32)
        decs = torch.empty_like(ends)
        _fwd_kernel[grid](xs, g, lb, theta, None, None, ends, decs, cu_seqlens, T, CHUNK, NC, HAS_HIN=False,
                          STORE_OUT=False, STORE_DEC=True, **common)
        h_in = torch.empty_like(ends)
        _carry_kernel[(N, grid[1])](ends, decs, h0s, h_in, _planes(final), NC, D=D, BD=BD, CPLX=CPLX,
                                    HAS_INIT=h0 is not None, REVERSE=False, num_warps=_warps(BD))
        end = ends  # pass 3 rewrites the chunk end states; the final state came from pass 2
    else:
        end = _planes(final)
    _fwd_kernel[grid](xs, g, lb, theta, h_in, _planes(out), end, None, cu_seqlens, T, CHUNK, NC,
                      HAS_HIN=h_in is not None, STORE_OUT=True, STORE_DEC=False, **common)
    return out, (final if want_final else final.new_empty(0))


@triton_op("hgrn2::hgrn1_bwd")
def _bwd(dout: torch.Tensor, dfinal: torch.Tensor | None, x: torch.Tensor, g: torch.Tensor,
         lb: torch.Tensor | None, theta: torch.Tensor | None, h0: torch.Tensor | None, out: torch.Tensor,
         cu_seqlens: torch.Tensor | None, chunk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                              torch.Tensor, torch.Tensor]:
    N, T, D, BD, NC, CHUNK, grid = _layout(x, cu_seqlens, chunk)
    CPLX = 2 if x.is_complex() else 1
    x, g, lb, theta = _contiguous(x, g, lb, theta)
    xs, h0s, douts = _planes(x), _planes(h0), _planes(dout)
    dfs = _planes(dfinal)
    common = dict(D=D, BD=BD, CPLX=CPLX, HAS_LB=lb is not None, IS_VARLEN=cu_seqlens is not None,
                  num_warps=_warps(BD))
    dh0 = x.new_empty(N, D, dtype=_state_dtype(x))
    d_in = dfs
    if NC > 1:
        ends = x.new_empty(N * NC, D, CPLX, dtype=torch.float32)
        decs = torch.empty_like(ends)
        _bwd_kernel[grid](None, g, lb, theta, None, None, None, douts, None, None, None, None, ends, decs,
                          cu_seqlens, T, CHUNK, NC, HAS_H0=False, HAS_DIN=False, LOCAL=True, **common)
        d_in = torch.empty_like(ends)
        _carry_kernel[(N, grid[1])](ends, decs, dfs, d_in, _planes(dh0), NC, D=D, BD=BD, CPLX=CPLX,
                                    HAS_INIT=dfs is not None, REVERSE=True, num_warps=_warps(BD))
        end = ends
    else:
        end = _planes(dh0)
    dx, dg = torch.empty_like(x), torch.empty_like(g)
    part_lb = None if lb is None else x.new_empty(N * NC, D, dtype=torch.float32)
    part_th = None if theta is None else x.new_empty(N * NC, D, dtype=torch.float32)
    _bwd_kernel[grid](xs, g, lb, theta, h0s, _planes(out), d_in, douts, _planes(dx), dg, part_lb, part_th, end,
                      None, cu_seqlens, T, CHUNK, NC, HAS_H0=h0 is not None, HAS_DIN=d_in is not None, LOCAL=False,
                      **common)
    # custom ops may not return one tensor twice: a fresh empty tensor for each absent gradient
    dlb = x.new_empty(0, dtype=torch.float32) if lb is None else part_lb.sum(0).to(lb.dtype)
    dth = x.new_empty(0, dtype=torch.float32) if theta is None else part_th.sum(0).to(theta.dtype)
    dh0 = x.new_empty(0, dtype=torch.float32) if h0 is None else dh0.to(h0.dtype)
    return dx, dg, dlb, dth, dh0


@_fwd.register_fake
def _(x, g, lb, theta, h0, cu_seqlens, want_final, chunk):
    N = x.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
    final = x.new_empty(N, x.shape[-1], dtype=_state_dtype(x)) if want_final else x.new_empty(0, dtype=_state_dtype(x))
    return torch.empty_like(x), final


@_bwd.register_fake
def _(dout, dfinal, x, g, lb, theta, h0, out, cu_seqlens, chunk):
    def like(t):
        return x.new_empty(0, dtype=torch.float32) if t is None else torch.empty_like(t)
    return torch.empty_like(x), torch.empty_like(g), like(lb), like(theta), like(h0)


class _HGRN1(torch.autograd.Function):
    """`_fwd` with autograd: (h, final state)."""

    @staticmethod
    def forward(ctx, x, g, lb, theta, h0, cu_seqlens, want_final, chunk):
        out, final = _fwd(x, g, lb, theta, h0, cu_seqlens, want_final, chunk)
        ctx.save_for_backward(x, g, lb, theta, h0, out, cu_seqlens)
        ctx.chunk = chunk
        ctx.set_materialize_grads(False)
        return out, final

    @staticmethod
    def backward(ctx, dout, dfinal):
        x, g, lb, theta, h0, out, cu_seqlens = ctx.saved_tensors
        if dfinal is not None and dfinal.numel() == 0:
            dfinal = None
        if dout is None:
            dout = torch.zeros_like(out)
        dx, dg, dlb, dth, dh0 = _bwd(dout, dfinal, x, g, lb, theta, h0, out, cu_seqlens, ctx.chunk)
        return (dx, dg, None if lb is None else dlb, None if theta is None else dth, None if h0 is None else dh0,
                None, None, None)


def hgrn1_triton(i: torch.Tensor, g: torch.Tensor, lower_bound: torch.Tensor | None = None, *,
                 theta: torch.Tensor | None = None, initial_state: torch.Tensor | None = None,
                 output_final_state: bool = False, cu_seqlens: torch.Tensor | None = None,
                 chunk_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """HGRN1's element-wise recurrence on the GPU, differentiable; the contract of `hgrn2.ops.hgrn1`.

    i: [B, T, D] (complex with `theta` [D]); g: [B, T, D] real logits; lower_bound: [D] or None;
    initial_state: [N, D]. Returns h [B, T, D] in i's dtype and the final state [N, D] (float32 / complex64,
    float64 / complex128 for double inputs) or None. `chunk_size` forces the time-chunk length of the
    three-pass scan (None: chosen from the shape so that the GPU fills).
    """
    if initial_state is not None and initial_state.is_complex() != i.is_complex():
        if not i.is_complex():
            raise ValueError(f"`initial_state`: expected a real tensor for real `i`, got {initial_state.dtype}")
        initial_state = initial_state.to(i.dtype)  # a real start for the complex recurrence (differentiable)
    h, final = _HGRN1.apply(i, g, lower_bound, theta, initial_state, cu_seqlens, bool(output_final_state),
                             int(chunk_size or 0))
    return h, (final if output_final_state else None)
