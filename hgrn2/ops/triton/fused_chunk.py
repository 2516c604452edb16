"""HGRN2 on the Triton kernels of `fused_chunk_fwd.py` / `fused_chunk_bwd.py`, with autograd.

`hgrn2_fused_chunk_triton` has the contract of `hgrn2.ops.hgrn2`. Under torch.compile the launchers are the custom
ops `hgrn2::fused_chunk_fwd` and `hgrn2::fused_chunk_bwd` (`_device.triton_op`: opaque nodes whose fake
implementations give the shapes), so compiled models call the kernels as they are.
"""

from __future__ import annotations

import torch
import triton.language as tl

from ..flip import run_scan
from ._common import ACTS, seq_layout, sm_count, state_precision
from ._device import cdiv, next_pow2, triton_op
from .chunk_parallel import hgrn2_chunk_parallel_triton
from .config import FusedChunkConfig, config_key, from_key
from .fused_chunk_bwd import (
    fused_chunk_bwd_diag_kernel,
    fused_chunk_bwd_dq_kernel,
    fused_chunk_bwd_kernel,
    fused_chunk_bwd_state_kernel,
)
from .fused_chunk_fwd import fused_chunk_fwd_kernel


def _config(o: torch.Tensor, i: torch.Tensor, n_seq_heads: int, direction: str, cfg: FusedChunkConfig):
    """Block sizes, launch options ({"num_warps", "num_stages"}) and the tl.dot operand dtype / precision for
    these inputs, in `direction` "fwd" or "bwd".

    Each program walks one (sequence, head, V-block) from start to end, so the V-blocks are the only source
    of parallelism beyond N·H: split V while the programs fill less than `split_below_*` of the SMs (each split
    repeats the K-side gate and diagonal-block work, a second wave costs more than it saves, and in the
    backward each split adds fp32 partial sums).
    """
    max_bv, warps, stages, split_below = (
        (cfg.max_bv_fwd, cfg.num_warps_fwd, cfg.num_stages_fwd, cfg.split_below_fwd) if direction == "fwd"
        else (cfg.max_bv_bwd, cfg.num_warps_bwd, cfg.num_stages_bwd, cfg.split_below_bwd))
    K, V = o.shape[-1], i.shape[-1]
    if torch.bfloat16 in (o.dtype, i.dtype) and torch.float32 not in (o.dtype, i.dtype):
        dt, prec = tl.bfloat16, "tf32"
    elif torch.float32 in (o.dtype, i.dtype):
        dt, prec = tl.float32, cfg.fp32_dot_precision
    else:  # fp16: its 5-bit exponent cannot hold the e^{±60} factors of the diagonal block, so fp32 operands;
        # 3 tf32 passes, not 1: d log f's pairs cancel only if each factor enters both sides as the same value,
        # and a single tf32 pass truncates inside the MMA
        dt, prec = tl.float32, "tf32x3"
    BK = max(16, next_pow2(K))
    # fp32 dot operands take twice the registers: half the V-block
    BV = max(16, min(next_pow2(V), max_bv, (16384 if dt == tl.bfloat16 else 8192) // BK))
    while BV > 32 and n_seq_heads * cdiv(V, BV) <= split_below * sm_count(o.device):
        BV //= 2
    launch = {"num_warps": warps or (8 if BK * BV >= 8192 else 4)}
    if stages:
        launch["num_stages"] = stages
    return BK, BV, cdiv(V, BV), launch, dt, prec


def bwd_form(NV: int, dt, cfg: FusedChunkConfig) -> tuple[bool, int]:
    """(split, tokens per step) of the backward for NV V-blocks and tl.dot operands of type dt: cfg.bwd_split and
    cfg.block_t_bwd where set, else split exactly where V is split with bf16 operands, at 32-token steps split and
    16 fused (the split sweep holds fewer tiles, so it affords the longer step)."""
    split = cfg.bwd_split if cfg.bwd_split is not None else NV > 1 and dt == tl.bfloat16
    return split, cfg.block_t_bwd or (32 if split else 16)


@triton_op("hgrn2::fused_chunk_fwd")
def fused_chunk_fwd(o: torch.Tensor, g: torch.Tensor, i: torch.Tensor, lower_bound: torch.Tensor | None,
              initial_state: torch.Tensor | None, cu_seqlens: torch.Tensor | None, scale: float, o_act: int,
              i_act: int, output_final_state: bool, reverse: bool, config: str) -> tuple[torch.Tensor, torch.Tensor]:
    """y [B, T, H, V] (i's dtype) and the final state [N, H, V, K] fp32 (empty when not requested); reverse: scan
    each sequence from its last token (in place, see `step_tile`); config: the key of a FusedChunkConfig."""
    cfg = from_key(config)
    B, T, H, N = seq_layout(o, cu_seqlens)
    K, V = o.shape[-1], i.shape[-1]
    BK, BV, NV, launch, dt, prec = _config(o, i, N * H, "fwd", cfg)
    y = torch.empty_like(i)
    ht = o.new_empty(N, H, V, K, dtype=torch.float32) if output_final_state else o.new_empty(0, dtype=torch.float32)
    fused_chunk_fwd_kernel[(NV, N * H)](
        o, g, i, lower_bound, initial_state, y, ht, cu_seqlens, scale, T,
        H=H, K=K, V=V, BT=cfg.block_t_fwd, BK=BK, BV=BV, O_ACT=o_act, I_ACT=i_act, HAS_LB=lower_bound is not None,
        HAS_H0=initial_state is not None, STORE_HT=output_final_state, VARLEN=cu_seqlens is not None,
        MAX_SPREAD=cfg.max_spread, DT=dt, PREC=prec, REVERSE=reverse, **launch,
    )
    return y, ht


@fused_chunk_fwd.register_fake
def _(o, g, i, lower_bound, initial_state, cu_seqlens, scale, o_act, i_act, output_final_state, reverse, config):
    B, T, H, N = seq_layout(o, cu_seqlens)
    shape = (N, H, i.shape[-1], o.shape[-1]) if output_final_state else (0,)
    return torch.empty_like(i), o.new_empty(shape, dtype=torch.float32)


@triton_op("hgrn2::fused_chunk_bwd")
def fused_chunk_bwd(o: torch.Tensor, g: torch.Tensor, i: torch.Tensor, lower_bound: torch.Tensor | None,
              initial_state: torch.Tensor | None, cu_seqlens: torch.Tensor | None,
              dy: torch.Tensor, dht: torch.Tensor | None, scale: float, o_act: int, i_act: int, reverse: bool,
              config: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients (do, dg, di, d initial_state or empty). A bound that needs a gradient takes the chunk-parallel
    kernels (`hgrn2_fused_chunk_triton`), so none of β is formed here."""
    cfg = from_key(config)
    B, T, H, N = seq_layout(o, cu_seqlens)
    K, V = o.shape[-1], i.shape[-1]
    BK, BV, NV, launch, dt, prec = _config(o, i, N * H, "bwd", cfg)
    ntok = B * T
    sprec = state_precision(dt, prec)
    split, BT = bwd_form(NV, dt, cfg)
    common = dict(H=H, K=K, V=V, BT=BT, BK=BK, BV=BV, HAS_LB=lower_bound is not None,
                  VARLEN=cu_seqlens is not None, MAX_SPREAD=cfg.max_spread, DT=dt, PREC=prec, SPREC=sprec,
                  REVERSE=reverse, **launch)
    dys = o.new_empty(NV, B, T, H, K, dtype=torch.float32)  # dy S, from the forward sweep
    dh0 = o.new_empty(N, H, V, K, dtype=torch.float32) if initial_state is not None else o.new_empty(0)
    ht = o.new_empty(N, H, V, K, dtype=torch.float32) if dht is not None else o.new_empty(0)  # S_T, recomputed
    fused_chunk_bwd_dq_kernel[(NV, N * H)](
        g, i, lower_bound, initial_state, dy, dys, ht, cu_seqlens, T, ntok,
        I_ACT=i_act, HAS_H0=initial_state is not None, STORE_HT=dht is not None, **common,
    )
    sweep = _reverse_split if split else _reverse_fused
    flags = dict(O_ACT=o_act, I_ACT=i_act, HAS_DHT=dht is not None, STORE_DH0=initial_state is not None)
    do, dg, di = sweep(o, g, i, lower_bound, cu_seqlens, dy, dys, ht, dht, dh0, scale, common, flags)
    if initial_state is not None:
        dh0 = dh0.to(initial_state.dtype)
    return do, dg, di, dh0


def _reverse_fused(o, g, i, lower_bound, cu_seqlens, dy, dys, ht, dht, dh0, scale, common, flags):
    """The reverse sweep as one kernel (`fused_chunk_bwd_kernel`): (do, dg, di)."""
    B, T, H, N = seq_layout(o, cu_seqlens)
    NV = dys.shape[0]
    if NV == 1:
        do, dg = torch.empty_like(o)[None], torch.empty_like(g)[None]
    else:  # per-V-block partial sums, added below
        do, dg = torch.empty_like(dys), torch.empty_like(dys)
    di = torch.empty_like(i)
    fused_chunk_bwd_kernel[(NV, N * H)](
        o, g, i, lower_bound, dy, dys, ht, dht, do, dg, di, dh0, cu_seqlens, scale, T, B * T,
        **flags, **common,
    )
    do = do[0] if NV == 1 else do.sum(0).to(o.dtype)
    dg = dg[0] if NV == 1 else dg.sum(0).to(g.dtype)
    return do, dg, di


def _reverse_split(o, g, i, lower_bound, cu_seqlens, dy, dys, ht, dht, dh0, scale, common, flags):
    """The reverse sweep as a state-only sweep and a parallel kernel per sub-block (`fused_chunk_bwd_state_kernel`,
    `fused_chunk_bwd_diag_kernel`): (do, dg, di)."""
    B, T, H, N = seq_layout(o, cu_seqlens)
    NV, K, V = dys.shape[0], o.shape[-1], i.shape[-1]
    BT, ntok = common["BT"], B * T
    nbt = ntok // BT + N + 1  # rows of the per-sub-block tensors (see fused_chunk_bwd._carry_row)
    vds = torch.empty_like(dys)
    dvs = i.new_empty(B, T, H, V, dtype=torch.float32)
    carry = o.new_empty(NV, nbt, H, K, dtype=torch.float32)
    fused_chunk_bwd_state_kernel[(NV, N * H)](
        o, g, i, lower_bound, dy, dys, ht, dht, vds, dvs, carry, dh0, cu_seqlens, scale, T, ntok, nbt,
        **flags, **common,
    )
    if NV > 1:  # the V-blocks' partial sums (V is split only when few programs would run)
        dys, vds, carry = dys.sum(0), vds.sum(0), carry.sum(0)
    do, dg, di = torch.empty_like(o), torch.empty_like(g), torch.empty_like(i)
    # varlen: one host sync for the grid (T would launch N times the programs needed)
    longest = T if cu_seqlens is None else int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
    diag = {k: common[k] for k in ("H", "K", "V", "BT", "BK", "HAS_LB", "VARLEN", "MAX_SPREAD", "DT", "PREC",
                                   "REVERSE")}
    bv = max(16, next_pow2(V))  # all of V: dA sums over it
    # 8 warps for 8192+ element tiles: they spill the least (4 and 16 warps spill more, compile_sm90.py)
    fused_chunk_bwd_diag_kernel[(cdiv(longest, BT), N * H)](
        o, g, i, lower_bound, dy, dys, vds, dvs, carry, do, dg, di, cu_seqlens, scale, T,
        BV=bv, O_ACT=flags["O_ACT"], I_ACT=flags["I_ACT"], num_warps=8 if common["BK"] * bv >= 8192 else 4, **diag,
    )
    return do, dg, di


@fused_chunk_bwd.register_fake
def _(o, g, i, lower_bound, initial_state, cu_seqlens, dy, dht, scale, o_act, i_act, reverse, config):
    dh0 = torch.empty_like(initial_state) if initial_state is not None else o.new_empty(0)
    return torch.empty_like(o), torch.empty_like(g), torch.empty_like(i), dh0


class _FusedChunk(torch.autograd.Function):
    """`fused_chunk_fwd` with autograd: (y, final state)."""

    @staticmethod
    def forward(ctx, o, g, i, lower_bound, initial_state, cu_seqlens, scale, o_act, i_act, output_final_state,
                reverse, config):
        y, ht = fused_chunk_fwd(o, g, i, lower_bound, initial_state, cu_seqlens, scale, o_act, i_act,
                                output_final_state, reverse, config)
        ctx.save_for_backward(o, g, i, lower_bound, initial_state, cu_seqlens)
        ctx.args = (scale, o_act, i_act, output_final_state, reverse, config)
        ctx.set_materialize_grads(False)
        return y, ht

    @staticmethod
    def backward(ctx, dy, dht):
        o, g, i, lower_bound, initial_state, cu_seqlens = ctx.saved_tensors
        scale, o_act, i_act, output_final_state, reverse, config = ctx.args
        dy = torch.zeros_like(i) if dy is None else dy.contiguous()
        dht = dht.contiguous() if output_final_state and dht is not None else None
        do, dg, di, dh0 = fused_chunk_bwd(o, g, i, lower_bound, initial_state, cu_seqlens, dy, dht, scale,
                                          o_act, i_act, reverse, config)
        return (do, dg, di, None, dh0 if initial_state is not None else None, None, None, None, None, None, None,
                None)


def hgrn2_fused_chunk_triton(o: torch.Tensor, g: torch.Tensor, i: torch.Tensor, lower_bound: torch.Tensor | None = None,
                             *, scale: float = 1.0, o_act: str | None = None, i_act: str | None = None,
                             initial_state: torch.Tensor | None = None, output_final_state: bool = False,
                             cu_seqlens: torch.Tensor | None = None, config: FusedChunkConfig | None = None,
                             reverse: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """HGRN2 by the fused-chunk Triton kernels; arguments and result as `hgrn2.ops.hgrn2` (shapes there); config:
    the launch settings (None: the current ones, see `config.launch_config`). reverse=True walks each sequence
    from its last token on the tensors as they are (no copies).

    A lower bound that needs a gradient takes the chunk-parallel kernels (`hgrn2_chunk_parallel_triton`, time flipped
    for reverse): their dβ is exact at any gate, where this family's would come from d log f / f, whose running sum
    cancels and errs by its rounding times 1/f. float64 inputs run in float32 (the kernels accumulate in float32) and
    are cast back.
    """
    if lower_bound is not None and lower_bound.requires_grad and torch.is_grad_enabled():
        return run_scan(hgrn2_chunk_parallel_triton, o, g, i, lower_bound, scale=scale, o_act=o_act, i_act=i_act,
                        initial_state=initial_state, output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                        reverse=reverse)
    key = config_key(config, FusedChunkConfig)
    in_dtype = i.dtype
    if torch.float64 in (o.dtype, g.dtype, i.dtype):
        o, g, i = o.float(), g.float(), i.float()
    y, ht = _FusedChunk.apply(
        o.contiguous(), g.contiguous(), i.contiguous(),
        None if lower_bound is None else lower_bound.contiguous(),
        None if initial_state is None else initial_state.contiguous(),
        None if cu_seqlens is None else cu_seqlens.to(o.device).contiguous(),
        float(scale), ACTS[o_act], ACTS[i_act], bool(output_final_state), bool(reverse), key,
    )
    return y.to(in_dtype), (ht if output_final_state else None)
