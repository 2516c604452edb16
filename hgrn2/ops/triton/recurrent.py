"""HGRN2 token by token in one Triton kernel: the decoding path (a few tokens from a cached state).

Each program owns one head of one sequence and a block of BV rows of its [V, K] state, kept in fp32 registers
for the whole loop over tokens. The gate is computed in registers from the raw logits,

    f = β + (1 − β)·σ(g),   1 − f = (1 − β)·σ(−g)      (both sums of positive terms: no cancellation)
    h ← h·Diag(f) + i ⊗ (1 − f),   y = scale · h·act_o(o)

so neither k = 1 − f nor log f is ever written to memory. The grid is (N·H, V / BV): splitting V keeps a
batch of one sequence spread over the GPU. Forward only; training goes through the fused-chunk or
chunk-parallel kernels.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import ACTS
from ._device import cdiv, launch_pdl, next_pow2, triton_op


@triton.jit
def _act(x, ACT: tl.constexpr):
    if ACT == 1:
        x = x * tl.sigmoid(x)
    elif ACT == 2:
        x = tl.sigmoid(x)
    return x


@triton.jit
def _hgrn2_recurrent_kernel(
    o, g, i, lb, h0, y, ht, cu_seqlens, scale, T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    O_ACT: tl.constexpr, I_ACT: tl.constexpr, HAS_LB: tl.constexpr, HAS_H0: tl.constexpr, STORE_HT: tl.constexpr,
    IS_VARLEN: tl.constexpr, PDL: tl.constexpr,
):
    if PDL:  # launched before the previous kernel has drained: wait for its writes
        tl.extra.cuda.gdc_wait()
    i_nh, i_v = tl.program_id(0), tl.program_id(1)  # x: the large dimension
    i_n, i_h = i_nh // H, i_nh % H
    if IS_VARLEN:
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
    else:
        bos = i_n.to(tl.int64) * T
        eos = bos + T
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    m_h = m_v[:, None] & m_k[None, :]
    # one-minus-bound and bound of this head, loaded once
    if HAS_LB:
        beta = tl.load(lb + i_h * K + o_k, mask=m_k, other=0).to(tl.float32)
    else:
        beta = tl.zeros([BK], dtype=tl.float32)
    p_state = (i_nh.to(tl.int64) * V + o_v[:, None]) * K + o_k[None, :]
    if HAS_H0:
        b_h = tl.load(h0 + p_state, mask=m_h, other=0).to(tl.float32)
    else:
        b_h = tl.zeros([BV, BK], dtype=tl.float32)

    for t in range(bos, eos):
        p_k = (t * H + i_h) * K + o_k
        p_v = (t * H + i_h) * V + o_v
        b_o = _act(tl.load(o + p_k, mask=m_k, other=0).to(tl.float32), O_ACT) * scale
        b_g = tl.load(g + p_k, mask=m_k, other=0).to(tl.float32)
        b_i = _act(tl.load(i + p_v, mask=m_v, other=0).to(tl.float32), I_ACT)
        b_f = beta + (1 - beta) * tl.sigmoid(b_g)
        b_k = (1 - beta) * tl.sigmoid(-b_g)
        b_h = b_h * b_f[None, :] + b_i[:, None] * b_k[None, :]
        b_y = tl.sum(b_h * b_o[None, :], axis=1)
        tl.store(y + p_v, b_y.to(y.dtype.element_ty), mask=m_v)

    if STORE_HT:
        tl.store(ht + p_state, b_h, mask=m_h)


def hgrn2_recurrent_triton(o: torch.Tensor, g: torch.Tensor, i: torch.Tensor, lower_bound: torch.Tensor | None = None,
                           *, scale: float = 1.0, o_act: str | None = None, i_act: str | None = None,
                           initial_state: torch.Tensor | None = None, output_final_state: bool = False,
                           cu_seqlens: torch.Tensor | None = None, final_state_out: torch.Tensor | None = None,
                           ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """HGRN2 step by step on the GPU; the contract of `hgrn2.ops.hgrn2` (forward only).

    o, g: [B, T, H, K]; i: [B, T, H, V]; lower_bound: [H, K] or None; initial_state: [N, H, V, K] (any float
    dtype, read as fp32). Returns y [B, T, H, V] in i's dtype and the final state [N, H, V, K] float32 or None.

    `final_state_out`: an fp32 [N, H, V, K] tensor to write the final state into (implies output_final_state).
    It may be `initial_state` itself, for a cache that updates its state in place: every program reads its block
    of the state before the loop and writes the same block after it, so aliasing is safe.
    """
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                       for t in (o, g, i, lower_bound, initial_state)):
        raise RuntimeError("hgrn2_recurrent_triton is forward-only (decoding); train with hgrn2_triton "
                           "or call it under torch.no_grad()")
    B, T, H, K = o.shape
    V = i.shape[-1]
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    if final_state_out is not None:
        if final_state_out.shape != (N, H, V, K) or final_state_out.dtype != torch.float32 \
                or not final_state_out.is_contiguous():
            raise ValueError(f"final_state_out must be a contiguous float32 tensor of shape {(N, H, V, K)}, got "
                             f"{final_state_out.dtype} {tuple(final_state_out.shape)}")
        output_final_state = True
    ht = None
    if output_final_state:
        ht = final_state_out if final_state_out is not None else o.new_empty(N, H, V, K, dtype=torch.float32)
    args = (o, g, i, lower_bound, initial_state, ht, cu_seqlens, float(scale), ACTS[o_act], ACTS[i_act])
    return _launch(*args), ht


@triton_op("hgrn2::hgrn2_recurrent", mutates_args=("ht",))
def _launch(o: torch.Tensor, g: torch.Tensor, i: torch.Tensor, lb: torch.Tensor | None, h0: torch.Tensor | None,
            ht: torch.Tensor | None, cu_seqlens: torch.Tensor | None, scale: float, o_act: int,
            i_act: int) -> torch.Tensor:
    """y [B, T, H, V]; writes the final state into `ht` when given."""
    B, T, H, K = o.shape
    V = i.shape[-1]
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    o, g, i = o.contiguous(), g.contiguous(), i.contiguous()
    h0 = None if h0 is None else h0.contiguous()
    lb = None if lb is None else lb.contiguous()
    y = torch.empty_like(i)
    BK = next_pow2(K)
    # Enough programs to fill the GPU at B = 1 (16 heads → 256 programs), larger blocks once there are many heads.
    BV = min(next_pow2(V), 8 if N * H < 64 else 16 if N * H < 512 else 32)
    pdl = launch_pdl(o)
    _hgrn2_recurrent_kernel[(N * H, cdiv(V, BV))](
        o, g, i, lb, h0, y, ht, cu_seqlens, scale, T,
        H=H, K=K, V=V, BK=BK, BV=BV, O_ACT=o_act, I_ACT=i_act, HAS_LB=lb is not None,
        HAS_H0=h0 is not None, STORE_HT=ht is not None, IS_VARLEN=cu_seqlens is not None, PDL=pdl,
        num_warps=max(1, min(8, BV * BK // 512)),  # about 16 fp32 state values per thread
        launch_pdl=pdl,
    )
    return y


@_launch.register_fake
def _(o, g, i, lb, h0, ht, cu_seqlens, scale, o_act, i_act):
    return torch.empty_like(i)
