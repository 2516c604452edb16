"""Triton backends: `hgrn2_triton` and `hgrn1_triton`, with the contracts of `hgrn2.ops.hgrn2` / `hgrn2.ops.hgrn1`.

`hgrn2_triton` picks one of three HGRN2 kernels:
- `recurrent.py` (decode): a few tokens without autograd;
- `cp.py` (chunk-parallel, 64-token chunks): training (autograd) on at least CP_TRAIN_MIN_WORK token·heads,
  and few long sequences, whose sequential walk would leave most of the GPU idle (≤ 64 pairs); H200, bf16
  K = V = 128, fwd+bwd ms cp vs chunk (`benchmarks/gpu_dispatch.py`, BENCHMARKS.md tenth session): B8 T2048 H16
  2.61 vs 3.47, B32 T512 H16 2.63 vs 3.47, B64 T256 H8 1.36 vs 1.75, B2 T8192 H16 2.72 vs 9.82, but B128 T256
  H2 (65K token·heads) 1.20 vs 0.89;
- `chunk.py` (sequential over 16- or 32-token blocks, one program per sequence·head·V-block): the rest — small
  training inputs and inference on many sequences (forward alone at B8 T2048 H16: 0.50 ms vs cp 0.80).
Both chunk kernels meet the same accuracy bounds (tests/test_triton_chunk.py, test_triton_cp.py).
"""

from __future__ import annotations

import torch

from ._interpret import patch_interpreter

patch_interpreter()

from .chunk import hgrn2_chunk_triton  # noqa: E402
from .cp import hgrn2_cp_triton  # noqa: E402
from .recurrent import hgrn2_recurrent_triton  # noqa: E402

__all__ = ["hgrn2_triton", "hgrn1_triton", "hgrn2_chunk_triton", "hgrn2_cp_triton"]

DECODE_MAX_T = 16  # at or below this many tokens, without autograd, the recurrent (decode) kernel is used
# the chunk-parallel kernels take inputs of at most this many (sequence, head) pairs and at least CP_MIN_T
# tokens per sequence, and, with autograd, any input of at least CP_TRAIN_MIN_WORK tokens × heads
CP_MAX_PROGRAMS = 64
CP_MIN_T = 1024
CP_TRAIN_MIN_WORK = 131072


def takes_cp(n_seq: int, n_heads: int, n_tokens: int, grad: bool) -> bool:
    """Whether `hgrn2_triton` runs n_seq sequences of n_tokens in all on the chunk-parallel kernels (grad: with
    autograd)."""
    few_long = n_seq * n_heads <= CP_MAX_PROGRAMS and n_tokens >= CP_MIN_T * n_seq
    return few_long or (grad and n_tokens * n_heads >= CP_TRAIN_MIN_WORK)


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
    if takes_cp(n_seq, o.shape[2], o.shape[0] * o.shape[1], grad):
        return hgrn2_cp_triton(o, g, i, lower_bound, **kw)
    return hgrn2_chunk_triton(o, g, i, lower_bound, **kw)

def hgrn1_triton(i, g, lower_bound=None, **kw):
    """HGRN1's element-wise recurrence on Triton (see `hgrn2.ops.hgrn1`)."""
    from .hgrn1 import hgrn1_triton as impl
    return impl(i, g, lower_bound, **kw)
