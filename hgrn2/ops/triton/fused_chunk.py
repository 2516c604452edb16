"""HGRN2 on the Triton kernels of `chunk_fwd.py` / `chunk_bwd.py`, with autograd.

`hgrn2_chunk_triton` has the contract of `hgrn2.ops.hgrn2`. Under torch.compile the launchers are the custom ops
`hgrn2::chunk_fwd` and `hgrn2::chunk_bwd` (`_device.triton_op`: opaque nodes whose fake implementations give the
shapes), so compiled models call the kernels as they are.
"""

from __future__ import annotations

import functools

import torch
import triton.language as tl

from ._device import cdiv, next_pow2, triton_op
from .chunk_bwd import hgrn2_bwd_diag_kernel, hgrn2_bwd_dq_kernel, hgrn2_bwd_kernel, hgrn2_bwd_state_kernel
from .chunk_fwd import hgrn2_fwd_kernel

ACTS = {None: 0, "silu": 1, "sigmoid": 2}
# tl.dot precision for fp32 inputs: "ieee" (exact fp32 FMAs, slow, spills), "tf32x3" (3 tensor-core passes,
# ~fp32 accuracy, compiles far leaner), "tf32" (~1e-3 relative)
FP32_DOT_PRECISION = "ieee"
# tokens per sequential step (16 or 32): fewer, larger steps vs more registers per tile. The two backward
# sweeps must share one (dys = dy S is split at the same block boundaries); the forward is independent.
# H100, bf16 B8 T2048 H16 K=V=128 (benchmarks/gpu_chunk_sweep.py, BENCHMARKS.md): forward 0.50 ms at 32
# vs 0.61 at 16; backward 3.01 at 16 vs 3.63 at 32 (its reverse sweep spills more). The backward takes the
# final state from its own forward sweep, not from the forward pass: d log f's final-state share cancels
# against its other terms only if S_T is rounded the backward's way (with the forward's 32-token S_T, dβ was
# 2-3e-2 off at T 4096 on an H100, against 2-7e-3).
BLOCK_T_FWD = 32
BLOCK_T_BWD = None  # None: by the backward's form (`_bwd_form`), 32 split, 16 fused
FAST_DIAG_MAX_SPREAD = 60.0  # diagonal blocks whose log-decay spread is below this take the one-product path
# launch tuning per direction: the widest V-block per program (V is split into ceil(V / BV) programs), warps
# (None: 8 for [BV, BK] states of 8192+ elements, else 4), software-pipelining stages of the token walk (None:
# Triton's default). `benchmarks/gpu_chunk_sweep.py` times the alternatives on a GPU.
TUNING = {"fwd": {"max_bv": 128, "num_warps": None, "num_stages": None},
          "bwd": {"max_bv": 128, "num_warps": None, "num_stages": None}}
# the backward's reverse sweep as one kernel (False), or as a state-only sweep plus a parallel kernel per
# sub-block for the diagonal blocks and the chain rule (True; chunk_bwd.py): fewer live tiles in the sweep,
# more bytes moved (v dS, k e^{b_last-b} dS^T in fp32). None: split when V is split with bf16 operands (the
# state sweep spills least at V-blocks of 64: 220 B per thread at 32-token steps, sm_90 offline). H100, bf16
# B8 T2048 K=V=128 (gpu_chunk_sweep.py, BENCHMARKS.md fifth session): H 8 (V-blocks of 64) split at 32-token
# steps 2.11 ms, fused at 16 2.38, and unsplit V 2.96; H 16 (V whole) fused at 16 2.97, split at 32 3.48.
BWD_SPLIT = None
# split V while the programs fill less than this share of the SMs (see `_config`)
SPLIT_BELOW = {"fwd": 0.5, "bwd": 0.5}


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1


def _config(o: torch.Tensor, i: torch.Tensor, n_seq_heads: int, direction: str):
    """Block sizes, launch options ({"num_warps", "num_stages"}) and the tl.dot operand dtype / precision for
    these inputs, in `direction` "fwd" or "bwd".

    Each program walks one (sequence, head, V-block) from start to end, so the V-blocks are the only source
    of parallelism beyond N·H: split V while the programs fill less than SPLIT_BELOW of the SMs (each split
    repeats the K-side gate and diagonal-block work, a second wave costs more than it saves, and in the
    backward each split adds fp32 partial sums).
    """
    tune = TUNING[direction]
    K, V = o.shape[-1], i.shape[-1]
    if torch.bfloat16 in (o.dtype, i.dtype) and torch.float32 not in (o.dtype, i.dtype):
        dt, prec = tl.bfloat16, "tf32"
    elif torch.float32 in (o.dtype, i.dtype):
        dt, prec = tl.float32, FP32_DOT_PRECISION
    else:  # fp16: its 5-bit exponent cannot hold the e^{±60} factors of the diagonal block, so fp32 operands;
        # 3 tf32 passes, not 1: d log f's pairs cancel only if each factor enters both sides as the same value,
        # and a single tf32 pass truncates inside the MMA (dβ was off by 5e-2 on an H100)
        dt, prec = tl.float32, "tf32x3"
    BK = max(16, next_pow2(K))
    # fp32 dot operands take twice the registers: half the V-block
    BV = max(16, min(next_pow2(V), tune["max_bv"], (16384 if dt == tl.bfloat16 else 8192) // BK))
    while BV > 32 and n_seq_heads * cdiv(V, BV) <= SPLIT_BELOW[direction] * _sm_count(o.device):
        BV //= 2
    launch = {"num_warps": tune["num_warps"] or (8 if BK * BV >= 8192 else 4)}
    if tune["num_stages"]:
        launch["num_stages"] = tune["num_stages"]
    return BK, BV, cdiv(V, BV), launch, dt, prec


def _bwd_form(NV: int, dt) -> tuple[bool, int]:
    """(split, tokens per step) of the backward for NV V-blocks and tl.dot operands of type dt: BWD_SPLIT and
    BLOCK_T_BWD where set, else the H100 sweep's winners (see BWD_SPLIT)."""
    split = BWD_SPLIT if BWD_SPLIT is not None else NV > 1 and dt == tl.bfloat16
    return split, BLOCK_T_BWD or (32 if split else 16)


def _layout(o, cu_seqlens):
    B, T, H, _ = o.shape
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    return B, T, H, N


@triton_op("hgrn2::chunk_fwd")
def chunk_fwd(o: torch.Tensor, g: torch.Tensor, i: torch.Tensor, lower_bound: torch.Tensor | None,
              initial_state: torch.Tensor | None, cu_seqlens: torch.Tensor | None, scale: float, o_act: int,
              i_act: int, output_final_state: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """y [B, T, H, V] (i's dtype) and the final state [N, H, V, K] fp32 (empty when not requested)."""
    B, T, H, N = _layout(o, cu_seqlens)
    K, V = o.shape[-1], i.shape[-1]
    BK, BV, NV, launch, dt, prec = _config(o, i, N * H, "fwd")
    y = torch.empty_like(i)
    ht = o.new_empty(N, H, V, K, dtype=torch.float32) if output_final_state else o.new_empty(0, dtype=torch.float32)
    hgrn2_fwd_kernel[(NV, N * H)](
        o, g, i, lower_bound, initial_state, y, ht, cu_seqlens, scale, T,
        H=H, K=K, V=V, BT=BLOCK_T_FWD, BK=BK, BV=BV, O_ACT=o_act, I_ACT=i_act, HAS_LB=lower_bound is not None,
        HAS_H0=initial_state is not None, STORE_HT=output_final_state, VARLEN=cu_seqlens is not None,
        MAX_SPREAD=FAST_DIAG_MAX_SPREAD, DT=dt, PREC=prec, **launch,
    )
    return y, ht


@chunk_fwd.register_fake
def _(o, g, i, lower_bound, initial_state, cu_seqlens, scale, o_act, i_act, output_final_state):
    B, T, H, N = _layout(o, cu_seqlens)
    shape = (N, H, i.shape[-1], o.shape[-1]) if output_final_state else (0,)
    return torch.empty_like(i), o.new_empty(shape, dtype=torch.float32)


@triton_op("hgrn2::chunk_bwd")
def chunk_bwd(o: torch.Tensor, g: torch.Tensor, i: torch.Tensor, lower_bound: torch.Tensor | None,
              initial_state: torch.Tensor | None, cu_seqlens: torch.Tensor | None,
              dy: torch.Tensor, dht: torch.Tensor | None, scale: float, o_act: int, i_act: int,
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients (do, dg, di, d lower_bound [H, K] or empty, d initial_state or empty)."""
    B, T, H, N = _layout(o, cu_seqlens)
    K, V = o.shape[-1], i.shape[-1]
    BK, BV, NV, launch, dt, prec = _config(o, i, N * H, "bwd")
    ntok = B * T
    # the state dots of the backward take fp32 operands: 3 tf32 passes unless fp32 inputs ask for ieee
    sprec = prec if dt == tl.float32 and prec != "tf32" else "tf32x3"
    split, BT = _bwd_form(NV, dt)
    common = dict(H=H, K=K, V=V, BT=BT, BK=BK, BV=BV, HAS_LB=lower_bound is not None,
                  VARLEN=cu_seqlens is not None, MAX_SPREAD=FAST_DIAG_MAX_SPREAD, DT=dt, PREC=prec, SPREC=sprec,
                  **launch)
    dys = o.new_empty(NV, B, T, H, K, dtype=torch.float32)  # dy S, from the forward sweep
    dh0 = o.new_empty(N, H, V, K, dtype=torch.float32) if initial_state is not None else o.new_empty(0)
    ht = o.new_empty(N, H, V, K, dtype=torch.float32) if dht is not None else o.new_empty(0)  # S_T, recomputed
    hgrn2_bwd_dq_kernel[(NV, N * H)](
        g, i, lower_bound, initial_state, dy, dys, ht, cu_seqlens, T, ntok,
        I_ACT=i_act, HAS_H0=initial_state is not None, STORE_HT=dht is not None, **common,
    )
    reverse = _reverse_split if split else _reverse_fused
    flags = dict(O_ACT=o_act, I_ACT=i_act, HAS_DHT=dht is not None, STORE_DH0=initial_state is not None)
    do, dg, di, dlb = reverse(o, g, i, lower_bound, cu_seqlens, dy, dys, ht, dht, dh0, scale, common, flags)
    if initial_state is not None:
        dh0 = dh0.to(initial_state.dtype)
    return do, dg, di, dlb, dh0


def _reverse_fused(o, g, i, lower_bound, cu_seqlens, dy, dys, ht, dht, dh0, scale, common, flags):
    """The reverse sweep as one kernel (`hgrn2_bwd_kernel`): (do, dg, di, d lower_bound or empty)."""
    B, T, H, N = _layout(o, cu_seqlens)
    NV, K = dys.shape[0], o.shape[-1]
    if NV == 1:
        do, dg = torch.empty_like(o)[None], torch.empty_like(g)[None]
    else:  # per-V-block partial sums, added below
        do, dg = torch.empty_like(dys), torch.empty_like(dys)
    di = torch.empty_like(i)
    dlb = o.new_empty(NV, N, H, K, dtype=torch.float32) if lower_bound is not None else o.new_empty(0)
    hgrn2_bwd_kernel[(NV, N * H)](
        o, g, i, lower_bound, dy, dys, ht, dht, do, dg, di, dlb, dh0, cu_seqlens, scale, T, B * T,
        **flags, **common,
    )
    do = do[0] if NV == 1 else do.sum(0).to(o.dtype)
    dg = dg[0] if NV == 1 else dg.sum(0).to(g.dtype)
    if lower_bound is not None:
        dlb = dlb.sum((0, 1)).to(lower_bound.dtype)
    return do, dg, di, dlb


def _reverse_split(o, g, i, lower_bound, cu_seqlens, dy, dys, ht, dht, dh0, scale, common, flags):
    """The reverse sweep as a state-only sweep and a parallel kernel per sub-block (`hgrn2_bwd_state_kernel`,
    `hgrn2_bwd_diag_kernel`): (do, dg, di, d lower_bound or empty)."""
    B, T, H, N = _layout(o, cu_seqlens)
    NV, K, V = dys.shape[0], o.shape[-1], i.shape[-1]
    BT, ntok = common["BT"], B * T
    nbt = ntok // BT + N + 1  # rows of the per-sub-block tensors (see chunk_bwd._carry_row)
    vds = torch.empty_like(dys)
    dvs = i.new_empty(B, T, H, V, dtype=torch.float32)
    carry = o.new_empty(NV, nbt, H, K, dtype=torch.float32)
    hgrn2_bwd_state_kernel[(NV, N * H)](
        o, g, i, lower_bound, dy, dys, ht, dht, vds, dvs, carry, dh0, cu_seqlens, scale, T, ntok, nbt,
        **flags, **common,
    )
    if NV > 1:  # the V-blocks' partial sums (V is split only when few programs would run)
        dys, vds, carry = dys.sum(0), vds.sum(0), carry.sum(0)
    do, dg, di = torch.empty_like(o), torch.empty_like(g), torch.empty_like(i)
    dlb = o.new_zeros(nbt, H, K, dtype=torch.float32) if lower_bound is not None else o.new_empty(0)
    # varlen: one host sync for the grid (T would launch N times the programs needed)
    longest = T if cu_seqlens is None else int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
    diag = {k: common[k] for k in ("H", "K", "V", "BT", "BK", "HAS_LB", "VARLEN", "MAX_SPREAD", "DT", "PREC")}
    bv = max(16, next_pow2(V))  # all of V: dA sums over it
    # 8 warps at K = V = 128 (offline sm_90 compile, bf16: ~0.5 KB of spills per thread; 4 warps 1.5, 16 warps 1)
    hgrn2_bwd_diag_kernel[(cdiv(longest, BT), N * H)](
        o, g, i, lower_bound, dy, dys, vds, dvs, carry, do, dg, di, dlb, cu_seqlens, scale, T,
        BV=bv, O_ACT=flags["O_ACT"], I_ACT=flags["I_ACT"], num_warps=8 if common["BK"] * bv >= 8192 else 4, **diag,
    )
    if lower_bound is not None:
        dlb = dlb.sum(0).to(lower_bound.dtype)
    return do, dg, di, dlb


@chunk_bwd.register_fake
def _(o, g, i, lower_bound, initial_state, cu_seqlens, dy, dht, scale, o_act, i_act):
    dlb = torch.empty_like(lower_bound) if lower_bound is not None else o.new_empty(0)
    dh0 = torch.empty_like(initial_state) if initial_state is not None else o.new_empty(0)
    return torch.empty_like(o), torch.empty_like(g), torch.empty_like(i), dlb, dh0


class _Chunk(torch.autograd.Function):
    """`chunk_fwd` with autograd: (y, final state)."""

    @staticmethod
    def forward(ctx, o, g, i, lower_bound, initial_state, cu_seqlens, scale, o_act, i_act, output_final_state):
        y, ht = chunk_fwd(o, g, i, lower_bound, initial_state, cu_seqlens, scale, o_act, i_act, output_final_state)
        ctx.save_for_backward(o, g, i, lower_bound, initial_state, cu_seqlens)
        ctx.args = (scale, o_act, i_act, output_final_state)
        ctx.set_materialize_grads(False)
        return y, ht

    @staticmethod
    def backward(ctx, dy, dht):
        o, g, i, lower_bound, initial_state, cu_seqlens = ctx.saved_tensors
        scale, o_act, i_act, output_final_state = ctx.args
        dy = torch.zeros_like(i) if dy is None else dy.contiguous()
        dht = dht.contiguous() if output_final_state and dht is not None else None
        do, dg, di, dlb, dh0 = chunk_bwd(o, g, i, lower_bound, initial_state, cu_seqlens, dy, dht, scale, o_act,
                                         i_act)
        return (do, dg, di, dlb if lower_bound is not None else None, dh0 if initial_state is not None else None,
                None, None, None, None, None)


def hgrn2_chunk_triton(o, g, i, lower_bound=None, *, scale=1.0, o_act=None, i_act=None, initial_state=None,
                       output_final_state=False, cu_seqlens=None):
    """HGRN2 by the fused Triton kernels; arguments and result as `hgrn2.ops.hgrn2` (shapes there).

    float64 inputs run in float32 (the kernels accumulate in float32) and are cast back.
    """
    in_dtype = i.dtype
    if torch.float64 in (o.dtype, g.dtype, i.dtype):
        o, g, i = o.float(), g.float(), i.float()
    y, ht = _Chunk.apply(
        o.contiguous(), g.contiguous(), i.contiguous(),
        None if lower_bound is None else lower_bound.contiguous(),
        None if initial_state is None else initial_state.contiguous(),
        None if cu_seqlens is None else cu_seqlens.to(o.device).contiguous(),
        float(scale), ACTS[o_act], ACTS[i_act], bool(output_final_state),
    )
    return y.to(in_dtype), (ht if output_final_state else None)
