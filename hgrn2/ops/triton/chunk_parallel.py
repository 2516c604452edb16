"""HGRN2 on the chunk-parallel Triton kernels of `chunk_parallel_fwd.py` / `chunk_parallel_bwd.py`, with autograd.

`hgrn2_chunk_parallel_triton` has exactly the contract of `hgrn2_fused_chunk_triton` (and `hgrn2.ops.hgrn2`). The
launchers `chunk_parallel_fwd` / `chunk_parallel_bwd` are the custom ops `hgrn2::chunk_parallel_fwd` /
`hgrn2::chunk_parallel_bwd` under torch.compile (opaque nodes; `_device.triton_op`); the chunk-start states h are an
extra output of the forward (saved for the backward, not recomputed), with a static upper-bound shape in varlen mode.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton.language as tl

from ._common import ACTS, seq_layout, sm_count, state_precision
from ._device import cdiv, next_pow2, triton_op
from .chunk_parallel_bwd import chunk_parallel_bwd_dh_kernel, chunk_parallel_bwd_kernel, chunk_parallel_bwd_small_kernel
from .chunk_parallel_fwd import chunk_parallel_decay_kernel, chunk_parallel_fwd_h_kernel, chunk_parallel_fwd_o_kernel
from .config import ChunkParallelConfig, config_key, from_key


def _dot_dtype(o, i, cfg: ChunkParallelConfig):
    if torch.bfloat16 in (o.dtype, i.dtype) and torch.float32 not in (o.dtype, i.dtype):
        return tl.bfloat16, "tf32"
    if torch.float32 in (o.dtype, i.dtype):
        return tl.float32, cfg.fp32_dot_precision
    return tl.float32, "tf32"  # fp16: e^{±60} factors need fp32's range


def chunk_size(o: torch.Tensor, cfg: ChunkParallelConfig) -> int:
    """Tokens per chunk for inputs of o's dtype (fp32 / fp16 inputs take fp32 dot operands: smaller chunks)."""
    return cfg.block_t if o.dtype == torch.bfloat16 else cfg.block_t_fp32


class _Blocks(NamedTuple):
    bk: int  # K-block of the forward
    bk_bwd: int  # K-block of the backward
    bk_small: int  # K-block of the small-gates dβ kernel
    bv_small: int  # V sub-block of the small-gates dβ kernel's loop over V
    bv: int  # V-block of the chunk-parallel kernels
    bk_seq: int  # K-block of the sequential state walks
    bv_seq: int  # V-block of the sequential state walks
    warps: int
    warps_bwd: int
    warps_seq: int


def _config(o, i, n_seq_heads: int, cfg: ChunkParallelConfig) -> _Blocks:
    """Blocks and warps of every kernel for inputs of n_seq_heads (sequence, head) pairs."""
    # fp32 dot operands for fp32 and fp16 inputs (fp16's range cannot hold e^{±60})
    return _blocks(o.shape[-1], i.shape[-1], o.dtype != torch.bfloat16, n_seq_heads, sm_count(o.device), cfg)


@functools.lru_cache(maxsize=1024)
def _blocks(K: int, V: int, fp32: bool, n_seq_heads: int, sms: int, cfg: ChunkParallelConfig) -> _Blocks:
    """`_config` of hashable arguments, cached: a launch's host time is the bound of mid-sized calls."""
    kp, vp = max(16, next_pow2(K)), max(16, next_pow2(V))
    cap = 32 if fp32 else kp  # fp32 (ieee dots): at most 32-wide K-blocks
    bk = max(16, min(kp, cap, cfg.block_k))
    bk_bwd = max(16, min(kp, cap, cfg.block_k_bwd))
    bk_small = max(16, min(kp, cap, cfg.block_k_small or cfg.block_k_bwd))
    bv_small = max(16, min(vp, cfg.sub_block_v_small))
    bv = max(16, min(vp, cfg.block_v or (32 if fp32 else 128)))
    bk_seq = max(16, min(kp, cap, cfg.block_k_seq or kp))
    bv_seq = max(16, min(vp, cfg.block_v_seq or (64 if fp32 else 128)))
    # the sequential walks take T/BT dependent steps per program: with few (sequence, head) pairs their blocks
    # shrink (K first: V-blocks repeat the gate math) to fill more SMs, down to 32 × 32
    while (bk_seq > 32 or bv_seq > 32) and (n_seq_heads * cdiv(K, bk_seq) * cdiv(V, bv_seq)
                                             < cfg.seq_split_below * sms):
        if bk_seq > 32:
            bk_seq //= 2
        else:
            bv_seq //= 2
    bt = cfg.block_t_fp32 if fp32 else cfg.block_t
    warps = cfg.num_warps
    warps_bwd = cfg.num_warps_bwd or (8 if bt * max(bk_bwd, bv) >= 4096 else 4)
    warps_seq = cfg.num_warps_seq or (8 if bk_seq * bv_seq >= 4096 else 4)
    return _Blocks(bk, bk_bwd, bk_small, bv_small, bv, bk_seq, bv_seq, warps, warps_bwd, warps_seq)


def _num_chunks(o, cu_seqlens, cfg: ChunkParallelConfig):
    """Upper bound of the number of chunks (the h tensors' first dimension): exact without cu_seqlens."""
    B, T, H, N = seq_layout(o, cu_seqlens)
    bt = chunk_size(o, cfg)
    return B * cdiv(T, bt) if cu_seqlens is None else cdiv(T, bt) + N


def _chunk_tables(cu_seqlens, T, n_chunks, BT):
    """Varlen: (chunks [n_chunks, 2] int32 = [t0, t1) of each chunk (0, 0 for padding), chunk_offsets [N + 1]),
    built on the device without a host sync."""
    if cu_seqlens is None:
        return None, None
    cu = cu_seqlens.to(torch.int64)
    nts = (cu[1:] - cu[:-1] + BT - 1) // BT
    offs = torch.cat([cu.new_zeros(1), nts.cumsum(0)])
    ids = torch.arange(n_chunks, device=cu.device)
    seq = torch.searchsorted(offs[1:], ids, right=True).clamp(max=cu.numel() - 2)
    valid = ids < offs[-1]
    t0 = cu[seq] + (ids - offs[seq]) * BT
    t1 = torch.minimum(t0 + BT, cu[seq + 1])
    chunks = torch.stack([torch.where(valid, t0, 0), torch.where(valid, t1, 0)], 1).to(torch.int32).contiguous()
    return chunks, offs.to(torch.int32)


def _state_dtype(o, cfg: ChunkParallelConfig):
    return cfg.state_dtype or (o.dtype if o.dtype != torch.float16 else torch.float32)


@triton_op("hgrn2::chunk_parallel_fwd")
def chunk_parallel_fwd(o: torch.Tensor, g: torch.Tensor, i: torch.Tensor, lower_bound: torch.Tensor | None,
           initial_state: torch.Tensor | None, cu_seqlens: torch.Tensor | None, scale: float, o_act: int,
           i_act: int, output_final_state: bool, save_a: bool, save_b: bool, flag_small: bool, config: str,
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                      torch.Tensor]:
    """y [B, T, H, V] (i's dtype), the final state [N, H, V, K] fp32 (empty when not requested), the
    chunk-start states h [n_chunks, H, V, K], with save_a the intra-chunk A [n_chunks, H, BT, BT] and with save_b
    b [B, T, H, K] fp32 and the chunk tier's verdicts fb (`_decay`) (else empty), and with flag_small the list fz of
    the chunks holding a gate below SMALL_F (else empty), for the backward. config: the key of a
    ChunkParallelConfig."""
    cfg = from_key(config)
    B, T, H, N = seq_layout(o, cu_seqlens)
    K, V = o.shape[-1], i.shape[-1]
    bk, bk_bwd, bk_small, bv_small, bv, bk_seq, bv_seq, warps, warps_bwd, warps_seq = _config(o, i, N * H, cfg)
    bt = chunk_size(o, cfg)
    dt, prec = _dot_dtype(o, i, cfg)
    NT = cdiv(T, bt)
    n_chunks = _num_chunks(o, cu_seqlens, cfg)
    chunks, offs = _chunk_tables(cu_seqlens, T, n_chunks, bt)
    # varlen: the padding slots past the real chunks are never read (their programs are fully masked)
    h = o.new_empty(n_chunks, H, V, K, dtype=_state_dtype(o, cfg))
    y = torch.empty_like(i)
    ht = o.new_empty(N, H, V, K, dtype=torch.float32) if output_final_state else o.new_empty(0, dtype=torch.float32)
    bb, fb, fz = _decay(g, lower_bound, chunks, n_chunks, T, NT, bt, cfg, dt, flag_small)
    nv_seq = cdiv(V, bv_seq)
    chunk_parallel_fwd_h_kernel[(cdiv(K, bk_seq) * nv_seq, N * H)](
        g, i, lower_bound, bb, initial_state, h, ht, cu_seqlens, offs, T, NT,
        H=H, K=K, V=V, BT=bt, BK=bk_seq, BV=bv_seq, NV=nv_seq, I_ACT=i_act, HAS_LB=lower_bound is not None,
        HAS_H0=initial_state is not None, STORE_HT=output_final_state, VARLEN=cu_seqlens is not None,
        WALK_SPREAD=cfg.walk_max_spread if dt == tl.bfloat16 else cfg.chunk_max_spread, DT=dt, PREC=prec,
        num_warps=warps_seq, maxnreg=cfg.maxnreg_seq,
    )
    a_saved = _empty_a(o, i, n_chunks, H, save_a, cfg)
    for tier in range(3):  # the unlisted chunks, then those listed for the halves tier, then the fallback's
        chunk_parallel_fwd_o_kernel[_parallel_grid(o, n_chunks, cdiv(V, bv), H, tier)](
            o, g, i, lower_bound, h, y, a_saved, bb, fb, chunks, scale, T, NT, n_chunks,
            H=H, K=K, V=V, BT=bt, BK=bk, BV=bv, O_ACT=o_act, I_ACT=i_act, HAS_LB=lower_bound is not None,
            VARLEN=cu_seqlens is not None, MAX_SPREAD=cfg.max_spread, DT=dt, PREC=prec,
            STORE_A=a_saved.numel() > 0, TIER=tier, num_warps=warps,
        )
    if not save_b:
        bb, fb = bb.new_empty(0), fb.new_empty(0)
    return y, ht, h, a_saved, bb, fb, fz


def _decay(g, lower_bound, chunks, n_chunks, T, NT, bt, cfg, dt, flag_small=False):
    """(b [B, T, H, K] fp32, the within-chunk cumsum of log f, fb and fz) from `chunk_parallel_decay_kernel`, for
    the sequential and parallel kernels (the backward's too, unless the forward's was kept (save_b)). fb: int32
    [2 + 3 · n_chunks · H], the lists of the chunks that leave the chunk tier (kernel's docstring); fz
    (flag_small and a bound, else empty): the same for the chunks holding a gate below SMALL_F. dt: the dot
    operands' dtype, which picks the halves tier's bound."""
    H, K = g.shape[-2], g.shape[-1]
    bb = torch.empty_like(g, dtype=torch.float32)
    fb = torch.zeros(_fb_size(n_chunks, H), device=g.device, dtype=torch.int32)
    flag_small = flag_small and lower_bound is not None
    fz = torch.zeros(1 + 2 * n_chunks * H if flag_small else 0, device=g.device, dtype=torch.int32)
    bk = min(cfg.block_k_decay, max(16, next_pow2(K)))
    chunk_parallel_decay_kernel[(n_chunks, H, cdiv(K, bk))](
        g, lower_bound, bb, fb, fz, chunks, T, NT, n_chunks, H=H, K=K, BT=bt, BK=bk,
        HAS_LB=lower_bound is not None, VARLEN=chunks is not None, CHUNK_SPREAD=cfg.chunk_max_spread,
        HALF_SPREAD=cfg.half_max_spread if dt == tl.bfloat16 else cfg.half_max_spread_fp32, FLAG_SMALL=flag_small,
        num_warps=4,
    )
    return bb, fb, fz


def _fb_size(n_chunks: int, H: int) -> int:
    """Length of the chunk-tier verdicts fb: two counts, a flag per (chunk, head) and two lists."""
    return 2 + 3 * n_chunks * H


def _parallel_grid(o, n_chunks, NV, H, tier):
    """Grid of a parallel launch: one program per (chunk, V-block, head) in the chunk tier (0); the launches of
    the other tiers walk fb's lists (normally empty: B·T = 16K tokens of random gates at β ~ U(0, 0.9) decay by
    ~e^-52 per chunk at most) on a few programs per SM, not one per chunk."""
    if tier:
        return max(1, min(n_chunks * H, 2 * sm_count(o.device))), NV, 1
    return n_chunks, NV, H


def _empty_a(o, i, n_chunks, H, save_a, cfg):
    """The tensor the forward keeps A in (the dot operands' dtype), or an empty one."""
    bt = chunk_size(o, cfg)
    dtype = torch.bfloat16 if _dot_dtype(o, i, cfg)[0] == tl.bfloat16 else torch.float32
    return o.new_empty((n_chunks, H, bt, bt) if save_a else (0,), dtype=dtype)


@chunk_parallel_fwd.register_fake
def _(o, g, i, lower_bound, initial_state, cu_seqlens, scale, o_act, i_act, output_final_state, save_a, save_b,
      flag_small, config):
    cfg = from_key(config)
    B, T, H, N = seq_layout(o, cu_seqlens)
    shape = (N, H, i.shape[-1], o.shape[-1]) if output_final_state else (0,)
    n_chunks = _num_chunks(o, cu_seqlens, cfg)
    h = o.new_empty(n_chunks, H, i.shape[-1], o.shape[-1], dtype=_state_dtype(o, cfg))
    b_saved = torch.empty_like(g, dtype=torch.float32) if save_b else o.new_empty(0, dtype=torch.float32)
    fb = o.new_empty(_fb_size(n_chunks, g.shape[-2]) if save_b else 0, dtype=torch.int32)
    fz = o.new_empty(1 + 2 * n_chunks * g.shape[-2] if flag_small and lower_bound is not None else 0,
                     dtype=torch.int32)
    return (torch.empty_like(i), o.new_empty(shape, dtype=torch.float32), h, _empty_a(o, i, n_chunks, H, save_a, cfg),
            b_saved, fb, fz)


@triton_op("hgrn2::chunk_parallel_bwd")
def chunk_parallel_bwd(o: torch.Tensor, g: torch.Tensor, i: torch.Tensor, lower_bound: torch.Tensor | None,
           initial_state: torch.Tensor | None, cu_seqlens: torch.Tensor | None, h: torch.Tensor,
           a_saved: torch.Tensor, b_saved: torch.Tensor, fb_saved: torch.Tensor, fz: torch.Tensor, dy: torch.Tensor,
           dht: torch.Tensor | None, scale: float, o_act: int, i_act: int, config: str,
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients (do, dg, di, d lower_bound [H, K] or empty, d initial_state or empty). a_saved, b_saved,
    fb_saved: the forward's A, b and chunk-tier verdicts, or empty (then the backward rebuilds A / computes b and
    the verdicts again). fz: the forward's list of chunks holding a gate below SMALL_F, or empty (then dβ of such
    gates is left out). config: the key of a ChunkParallelConfig."""
    cfg = from_key(config)
    B, T, H, N = seq_layout(o, cu_seqlens)
    K, V = o.shape[-1], i.shape[-1]
    bk, bk_bwd, bk_small, bv_small, bv, bk_seq, bv_seq, warps, warps_bwd, warps_seq = _config(o, i, N * H, cfg)
    bt = chunk_size(o, cfg)
    dt, prec = _dot_dtype(o, i, cfg)
    NT = cdiv(T, bt)
    n_chunks = h.shape[0]
    chunks, offs = _chunk_tables(cu_seqlens, T, n_chunks, bt)
    NV = cdiv(V, bv)
    dh = torch.empty_like(h)
    dh0 = o.new_empty(N, H, V, K, dtype=torch.float32) if initial_state is not None else o.new_empty(0)
    if NV == 1:
        do, dg = torch.empty_like(o)[None], torch.empty_like(g)[None]
    else:  # per-V-block partial sums, added below
        do = o.new_empty(NV, *o.shape, dtype=torch.float32)
        dg = torch.empty_like(do)
    di = torch.empty_like(i)
    dlb = o.new_empty(0)
    if lower_bound is not None:  # every real chunk writes its column: only varlen's padding chunks need the zeros
        # a column per (V-block, chunk), so that their sum reads rows
        dlb = (o.new_empty if cu_seqlens is None else o.new_zeros)(H, K, NV * n_chunks, dtype=torch.float32)
    if b_saved.numel():
        bb, fb = b_saved, fb_saved
    else:
        bb, fb, _ = _decay(g, lower_bound, chunks, n_chunks, T, NT, bt, cfg, dt)
    nv_seq = cdiv(V, bv_seq)
    chunk_parallel_bwd_dh_kernel[(cdiv(K, bk_seq) * nv_seq, N * H)](
        o, bb, dy, dht, dh, dh0, cu_seqlens, offs, scale, T, NT,
        H=H, K=K, V=V, BT=bt, BK=bk_seq, BV=bv_seq, NV=nv_seq, O_ACT=o_act, HAS_DHT=dht is not None,
        STORE_DH0=initial_state is not None, VARLEN=cu_seqlens is not None, DT=dt, PREC=prec, num_warps=warps_seq,
        maxnreg=cfg.maxnreg_seq,
    )
    args = (o, g, i, lower_bound, h, a_saved, dh, dy, do, dg, di, dlb, bb, fb, chunks, scale, T, NT, n_chunks, B * T)
    kw = dict(H=H, K=K, V=V, BT=bt, BK=bk_bwd, BV=bv, O_ACT=o_act, I_ACT=i_act,
              HAS_LB=lower_bound is not None, VARLEN=cu_seqlens is not None, MAX_SPREAD=cfg.max_spread,
              DT=dt, PREC=prec, LOAD_A=a_saved.numel() > 0, num_warps=warps_bwd)
    split = cfg.bwd_split if cfg.bwd_split is not None else a_saved.numel() == 0
    for flags in ((dict(DV=True, DQK=False), dict(DV=False, DQK=True)) if split else (dict(DV=True, DQK=True),)):
        for tier in range(3):  # as in the forward
            chunk_parallel_bwd_kernel[_parallel_grid(o, n_chunks, NV, H, tier)](*args, **kw, **flags, TIER=tier)
    if fz.numel():
        sprec = state_precision(dt, prec)
        # several programs per SM walk the listed chunks (each one's work is latency-bound), all of K and V each;
        # they add into V-block 0's columns of dlb, which the parallel launches above have written. The pair form's
        # launch chooses each chunk's form, then the channel form's launch takes the chunks left to it.
        programs = max(1, min(n_chunks * H, max(1, cfg.small_programs_per_sm) * sm_count(o.device)))
        form = torch.empty(n_chunks * H, dtype=torch.int8, device=o.device)  # each listed chunk's form
        bk_pairs = min(cfg.block_k_pairs or 128, max(16, next_pow2(K)))
        for FORM, bk, warps in ((0, bk_pairs, cfg.num_warps_small), (1, bk_small, cfg.num_warps_channels)):
            chunk_parallel_bwd_small_kernel[(programs,)](
                o, g, i, lower_bound, h, dh, dy, dlb, fz, form, chunks, scale, T, NT, n_chunks, NV * n_chunks, H=H,
                K=K, V=V, BT=bt, BK=bk, BVS=bv_small, O_ACT=o_act, I_ACT=i_act, VARLEN=cu_seqlens is not None,
                SPREC=sprec, FORM=FORM, NP=cfg.pairs_per_step_small, PAIRS_PER_CHANNEL=cfg.pair_steps_per_channel,
                num_warps=warps, maxnreg=cfg.maxnreg_small,
            )
    do = do[0] if NV == 1 else do.sum(0).to(o.dtype)
    dg = dg[0] if NV == 1 else dg.sum(0).to(g.dtype)
    if lower_bound is not None:
        dlb = dlb.sum(-1).to(lower_bound.dtype)
    if initial_state is not None:
        dh0 = dh0.to(initial_state.dtype)
    return do, dg, di, dlb, dh0


@chunk_parallel_bwd.register_fake
def _(o, g, i, lower_bound, initial_state, cu_seqlens, h, a_saved, b_saved, fb_saved, fz, dy, dht, scale, o_act,
      i_act, config):
    dlb = torch.empty_like(lower_bound) if lower_bound is not None else o.new_empty(0)
    dh0 = torch.empty_like(initial_state) if initial_state is not None else o.new_empty(0)
    return torch.empty_like(o), torch.empty_like(g), torch.empty_like(i), dlb, dh0


class _ChunkParallel(torch.autograd.Function):
    """`chunk_parallel_fwd` with autograd: (y, final state); h, A and b are kept for `chunk_parallel_bwd`."""

    @staticmethod
    def forward(ctx, o, g, i, lower_bound, initial_state, cu_seqlens, scale, o_act, i_act, output_final_state,
                save_a, save_b, grad, config):
        # the small gates are listed only for a backward that forms dβ (needs_input_grad holds without grad mode too)
        y, ht, h, a_saved, b_saved, fb, fz = chunk_parallel_fwd(
            o, g, i, lower_bound, initial_state, cu_seqlens, scale, o_act, i_act, output_final_state, save_a, save_b,
            grad and ctx.needs_input_grad[3], config)
        ctx.save_for_backward(o, g, i, lower_bound, initial_state, cu_seqlens, h, a_saved, b_saved, fb, fz)
        ctx.args = (scale, o_act, i_act, output_final_state, config)
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None: no zero tensors are made
        return y, ht

    @staticmethod
    def backward(ctx, dy, dht):
        o, g, i, lower_bound, initial_state, cu_seqlens, h, a_saved, b_saved, fb, fz = ctx.saved_tensors
        scale, o_act, i_act, output_final_state, config = ctx.args
        dy = torch.zeros_like(i) if dy is None else dy.contiguous()
        dht = dht.contiguous() if output_final_state and dht is not None else None
        do, dg, di, dlb, dh0 = chunk_parallel_bwd(o, g, i, lower_bound, initial_state, cu_seqlens, h, a_saved,
                                                  b_saved, fb, fz, dy, dht, scale, o_act, i_act, config)
        return (do, dg, di, dlb if lower_bound is not None else None, dh0 if initial_state is not None else None,
                None, None, None, None, None, None, None, None, None)


def hgrn2_chunk_parallel_triton(o: torch.Tensor, g: torch.Tensor, i: torch.Tensor,
                                lower_bound: torch.Tensor | None = None, *, scale: float = 1.0,
                                o_act: str | None = None, i_act: str | None = None,
                                initial_state: torch.Tensor | None = None, output_final_state: bool = False,
                                cu_seqlens: torch.Tensor | None = None, config: ChunkParallelConfig | None = None,
                                ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """HGRN2 by the chunk-parallel Triton kernels; arguments and result as `hgrn2.ops.hgrn2` (shapes there); config:
    the launch settings (None: the current ones, see `config.launch_config`).

    float64 inputs run in float32 (the kernels accumulate in float32) and are cast back.
    """
    if o_act not in ACTS:
        raise ValueError(f"o_act must be one of {list(ACTS)}, got {o_act!r}")
    if i_act not in ACTS:
        raise ValueError(f"i_act must be one of {list(ACTS)}, got {i_act!r}")
    key = config_key(config, ChunkParallelConfig)
    cfg = from_key(key)
    in_dtype = i.dtype
    # A and b are kept only for a backward (inference and evaluation hold neither)
    grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (o, g, i, lower_bound, initial_state))
    if torch.float64 in (o.dtype, g.dtype, i.dtype):
        o, g, i = o.float(), g.float(), i.float()
    args = (o.contiguous(), g.contiguous(), i.contiguous(),
            None if lower_bound is None else lower_bound.contiguous(),
            None if initial_state is None else initial_state.contiguous(),
            None if cu_seqlens is None else cu_seqlens.to(o.device).contiguous(),
            float(scale), ACTS[o_act], ACTS[i_act], bool(output_final_state))
    if grad:
        y, ht = _ChunkParallel.apply(*args, cfg.save_a, cfg.save_b, True, key)
    else:  # no autograd node: its bookkeeping is a tenth of a mid-sized forward's host time
        y, ht = chunk_parallel_fwd(*args, False, False, False, key)[:2]
    return y.to(in_dtype), (ht if output_final_state else None)
