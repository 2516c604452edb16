"""Triton backends: `hgrn2_triton` and `hgrn1_triton`, with the contracts of `hgrn2.ops.hgrn2` / `hgrn2.ops.hgrn1`.

`hgrn2_triton` picks one of three HGRN2 kernel families (thresholds in `config.DispatchConfig`):
- `recurrent.py` (decode): a few tokens without autograd;
- `chunk_parallel.py` (chunk-start states by a short sequential walk, then every 64-token chunk in parallel):
  training (autograd) on many tokens × heads, and few long sequences, whose sequential walk would leave most of
  the GPU idle;
- `fused_chunk.py` (one program walks a sequence in 16- or 32-token steps, the state in registers): the rest —
  small training inputs and inference on many sequences, where it moves the fewest bytes.
Both training families meet the same accuracy bounds (tests/ops/triton); a lower bound that needs a gradient always
takes the chunk-parallel kernels, whose dβ is exact at any gate (`chunk_parallel_bwd_small_kernel`). Launch
settings: `config.py`.
"""

from __future__ import annotations

from typing import Any

import torch

from ..flip import run_scan
from ._interpret import patch_interpreter

patch_interpreter()

from .chunk_parallel import hgrn2_chunk_parallel_triton  # noqa: E402
from .config import (  # noqa: E402
    ChunkParallelConfig,
    DispatchConfig,
    FusedChunkConfig,
    current_dispatch,
    launch_config,
)
from .fused_chunk import hgrn2_fused_chunk_triton  # noqa: E402
from .recurrent import hgrn2_recurrent_triton  # noqa: E402

__all__ = ["hgrn2_triton", "hgrn1_triton", "hgrn2_fused_chunk_triton", "hgrn2_chunk_parallel_triton",
           "hgrn2_recurrent_triton", "takes_chunk_parallel", "launch_config", "FusedChunkConfig",
           "ChunkParallelConfig", "DispatchConfig"]


def takes_chunk_parallel(n_seq: int, n_heads: int, n_tokens: int, grad: bool,
                         config: DispatchConfig | None = None) -> bool:
    """Whether `hgrn2_triton` runs n_seq sequences of n_tokens in all on the chunk-parallel kernels (grad: with
    autograd; config: the thresholds, None for the current ones)."""
    cfg = current_dispatch(config)
    few_long = n_seq * n_heads <= cfg.parallel_max_programs and n_tokens >= cfg.parallel_min_t * n_seq
    return few_long or (grad and n_tokens * n_heads >= cfg.parallel_train_min_work)


def _needs_grad(*xs) -> bool:
    return torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in xs)


def hgrn2_triton(o: torch.Tensor, g: torch.Tensor, i: torch.Tensor, lower_bound: torch.Tensor | None = None, *,
                 scale: float = 1.0, o_act: str | None = None, i_act: str | None = None,
                 initial_state: torch.Tensor | None = None, output_final_state: bool = False,
                 cu_seqlens: torch.Tensor | None = None, reverse: bool = False
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """HGRN2 on Triton: o, g [B, T, H, K], i [B, T, H, V] → (y [B, T, H, V], final state [N, H, V, K] or None);
    reverse: the fused-chunk kernels walk backwards in place, the other families flip time (`flip.run_scan`)."""
    kw = dict(scale=scale, o_act=o_act, i_act=i_act, initial_state=initial_state,
              output_final_state=output_final_state, cu_seqlens=cu_seqlens)
    grad = _needs_grad(o, g, i, lower_bound, initial_state)
    cfg = current_dispatch()
    n_seq = o.shape[0] if cu_seqlens is None else cu_seqlens.numel() - 1
    if o.shape[1] <= cfg.decode_max_t and not grad:
        fn = hgrn2_recurrent_triton
    elif takes_chunk_parallel(n_seq, o.shape[2], o.shape[0] * o.shape[1], grad, cfg):
        fn = hgrn2_chunk_parallel_triton
    else:
        return hgrn2_fused_chunk_triton(o, g, i, lower_bound, reverse=reverse, **kw)
    return run_scan(fn, o, g, i, lower_bound, reverse=reverse, **kw)


def hgrn1_triton(i: torch.Tensor, g: torch.Tensor, lower_bound: torch.Tensor | None = None,
                 **kw: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """HGRN1's element-wise recurrence on Triton (see `hgrn2.ops.hgrn1`)."""
    from .hgrn1 import hgrn1_triton as impl
    return impl(i, g, lower_bound, **kw)
