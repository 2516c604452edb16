"""Triton backends: `hgrn2_triton` and `hgrn1_triton`, with the contracts of `hgrn2.ops.hgrn2` / `hgrn2.ops.hgrn1`.

`hgrn2_triton` picks one of three HGRN2 kernels:
- `recurrent.py` (decode): a few tokens without autograd;
- `cp.py` (chunk-parallel, 64-token chunks): whenever a gradient is needed, and for inference on few long
  sequences. Its backward restarts the d log f sum in every chunk; the sequential kernel's backward runs that
  sum over the whole sequence and loses dβ and dg in bf16 (H100, bf16, vs fp64: dβ rel. error 0.2–1.0 and dg
  up to 3.7e-2 for `chunk.py`; dβ 1e-2–4e-2 and dg ≤ 1.5e-2 for `cp.py` — BENCHMARKS.md, "Accuracy");
- `chunk.py` (sequential over 16-token blocks, one program per sequence·head·V-block): inference otherwise,
  where its forward is the fastest (bf16 B=8 T=2048 H=16 K=V=128: 0.62 ms vs cp 1.01 ms; at B=2 T=8192 cp
  wins, 1.26 vs 2.19 ms — `benchmarks/gpu_cp_check.py`).
"""

from __future__ import annotations

import torch

from .chunk import hgrn2_chunk_triton
from .cp import hgrn2_cp_triton
from .recurrent import hgrn2_recurrent_triton

__all__ = ["hgrn2_triton", "hgrn1_triton", "hgrn2_chunk_triton", "hgrn2_cp_triton"]

DECODE_MAX_T = 16  # at or below this many tokens, without autograd, the recurrent (decode) kernel is used
# without autograd, the chunk-parallel kernels take inputs of at most this many (sequence, head) pairs and at
# least CP_MIN_T tokens per sequence
CP_MAX_PROGRAMS = 64
CP_MIN_T = 1024


def _needs_grad(*xs) -> bool:
    return torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in xs)


def hgrn2_triton(o, g, i, lower_bound=None, *, scale=1.0, o_act=None, i_act=None, initial_state=None,
                 output_final_state=False, cu_seqlens=None):
    """HGRN2 on Triton: o, g [B, T, H, K], i [B, T, H, V] → (y [B, T, H, V], final state [N, H, V, K] or None)."""
    kw = dict(scale=scale, o_act=o_act, i_act=i_act, initial_state=initial_state,
              output_final_state=output_final_state, cu_seqlens=cu_seqlens)
    grad = _needs_grad(o, g, i, lower_bound, initial_state)
    if o.shape[1] <= DECODE_MAX_T and not grad:
        return hgrn2_recurrent_triton(o, g, i, lower_bound, **kw)
    n_seq = o.shape[0] if cu_seqlens is None else cu_seqlens.numel() - 1
    few_long = n_seq * o.shape[2] <= CP_MAX_PROGRAMS and o.shape[0] * o.shape[1] >= CP_MIN_T * n_seq
    if grad or few_long:
        return hgrn2_cp_triton(o, g, i, lower_bound, **kw)
    return hgrn2_chunk_triton(o, g, i, lower_bound, **kw)


def hgrn1_triton(i, g, lower_bound=None, **kw):
    """HGRN1's element-wise recurrence on Triton (see `hgrn2.ops.hgrn1`)."""
    from .hgrn1 import hgrn1_triton as impl
    return impl(i, g, lower_bound, **kw)
