"""Triton backends: `hgrn2_triton` (chunked kernels; the decode kernel for a few tokens) and `hgrn1_triton`.

Both follow the contracts of `hgrn2.ops.hgrn2` / `hgrn2.ops.hgrn1`.
"""

from __future__ import annotations

import torch

from .chunk import hgrn2_chunk_triton
from .recurrent import hgrn2_recurrent_triton

__all__ = ["hgrn2_triton", "hgrn1_triton", "hgrn2_chunk_triton"]

DECODE_MAX_T = 16  # at or below this many tokens, without autograd, the recurrent (decode) kernel is used


def _needs_grad(*xs) -> bool:
    return torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in xs)


def hgrn2_triton(o, g, i, lower_bound=None, *, scale=1.0, o_act=None, i_act=None, initial_state=None,
                 output_final_state=False, cu_seqlens=None):
    """HGRN2 on Triton: o, g [B, T, H, K], i [B, T, H, V] → (y [B, T, H, V], final state [N, H, V, K] or None)."""
    kw = dict(scale=scale, o_act=o_act, i_act=i_act, initial_state=initial_state,
              output_final_state=output_final_state, cu_seqlens=cu_seqlens)
    if o.shape[1] <= DECODE_MAX_T and not _needs_grad(o, g, i, lower_bound, initial_state):
        return hgrn2_recurrent_triton(o, g, i, lower_bound, **kw)
    return hgrn2_chunk_triton(o, g, i, lower_bound, **kw)


def hgrn1_triton(i, g, lower_bound=None, **kw):
    """HGRN1's element-wise recurrence on Triton (see `hgrn2.ops.hgrn1`)."""
    from .hgrn1 import hgrn1_triton as impl
    return impl(i, g, lower_bound, **kw)
