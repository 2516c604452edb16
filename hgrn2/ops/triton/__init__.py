"""Triton backends: `hgrn2_triton` and `hgrn1_triton`, with the contracts of `hgrn2.ops.hgrn2` / `hgrn2.ops.hgrn1`.

`hgrn2_triton` picks one of three HGRN2 kernels:
- `recurrent.py` (decode): a few tokens without autograd;
- `chunk.py` (sequential over 16- or 32-token blocks, one program per sequence·head·V-block): the default,
  fastest when the sequence·head pairs fill the GPU (bf16 K=V=128 on an H100, `benchmarks/gpu_dispatch.py`:
  B=8 T=2048 H=16 fwd 0.49 ms vs cp 1.02, fwd+bwd 3.47 vs 4.57; 128 pairs at H=8 too);
- `cp.py` (chunk-parallel, 64-token chunks): few long sequences, whose sequential walk would leave most of
  the GPU idle (≤ 64 pairs: B=8 T=2048 H=8 fwd+bwd 2.31 vs 2.51 ms, B=2 T=8192 H=16 4.70 vs 9.81).
Both chunk kernels meet the same accuracy bounds (tests/test_triton_chunk.py, test_triton_cp.py).
"""

from __future__ import annotations

import torch

from ._interpret import patch_interpreter_bf16

patch_interpreter_bf16()

from .chunk import hgrn2_chunk_triton  # noqa: E402
from .cp import hgrn2_cp_triton  # noqa: E402
from .recurrent import hgrn2_recurrent_triton  # noqa: E402

__all__ = ["hgrn2_triton", "hgrn1_triton", "hgrn2_chunk_triton", "hgrn2_cp_triton"]

DECODE_MAX_T = 16  # at or below this many tokens, without autograd, the recurrent (decode) kernel is used
# the chunk-parallel kernels take inputs of at most this many (sequence, head) pairs and at least CP_MIN_T
# tokens per sequence
CP_MAX_PROGRAMS = 64
CP_MIN_T = 1024


def takes_cp(n_seq: int, n_heads: int, n_tokens: int) -> bool:
    """Whether `hgrn2_triton` runs n_seq sequences of n_tokens in all on the chunk-parallel kernels."""
    return n_seq * n_heads <= CP_MAX_PROGRAMS and n_tokens >= CP_MIN_T * n_seq


def _needs_grad(*xs) -> bool:
    return torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in xs)


def hgrn2_triton(o, g, i, lower_bound=None, *, scale=1.0, o_act=None, i_act=None, initial_state=None,
                 output_final_state=False, cu_seqlens=None):
    """HGRN2 on Triton: o, g [B, T, H, K], i [B, T, H, V] → (y [B, T, H, V], final state [N, H, V, K] or None)."""
    kw = dict(scale=scale, o_act=o_act, i_act=i_act, initial_state=initial_state,
              output_final_state=output_final_state, cu_seqlens=cu_seqlens)
    if o.shape[1] <= DECODE_MAX_T and not _needs_grad(o, g, i, lower_bound, initial_state):
        return hgrn2_recurrent_triton(o, g, i, lower_bound, **kw)
    n_seq = o.shape[0] if cu_seqlens is None else cu_seqlens.numel() - 1
    if takes_cp(n_seq, o.shape[2], o.shape[0] * o.shape[1]):
        return hgrn2_cp_triton(o, g, i, lower_bound, **kw)
    return hgrn2_chunk_triton(o, g, i, lower_bound, **kw)

def hgrn1_triton(i, g, lower_bound=None, **kw):
    """HGRN1's element-wise recurrence on Triton (see `hgrn2.ops.hgrn1`)."""
    from .hgrn1 import hgrn1_triton as impl
    return impl(i, g, lower_bound, **kw)
