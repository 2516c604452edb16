"""Time reversal of packed or batched sequences: the reverse scan of the paths that have no reverse walk."""

from __future__ import annotations

from collections.abc import Callable

import torch


def flip_time(x: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
    """x [B, T, ...] with each sequence's tokens in reverse order (each packed sequence of `cu_seqlens` on its own);
    its own inverse."""
    if cu_seqlens is None:
        return x.flip(1)
    cu = cu_seqlens.to(device=x.device, dtype=torch.long)
    pos = torch.arange(x.shape[1], device=x.device)
    seq = torch.searchsorted(cu[1:], pos, right=True)  # the packed sequence of each position
    return x.index_select(1, cu[seq] + cu[seq + 1] - 1 - pos)


def run_reversed(fn: Callable, o: torch.Tensor, g: torch.Tensor, i: torch.Tensor, *args,
                 cu_seqlens: torch.Tensor | None = None, **kw) -> tuple[torch.Tensor, torch.Tensor | None]:
    """fn's scan from the last token to the first by flipping o, g, i in and the output back: (y, final state)."""
    y, state = fn(flip_time(o, cu_seqlens), flip_time(g, cu_seqlens), flip_time(i, cu_seqlens), *args,
                  cu_seqlens=cu_seqlens, **kw)
    return flip_time(y, cu_seqlens), state
