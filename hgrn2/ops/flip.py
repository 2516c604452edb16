"""Time reversal of packed or batched sequences: the reverse scan of the paths that have no reverse walk."""

from __future__ import annotations

from collections.abc import Callable

import torch


def reversal_index(cu_seqlens: torch.Tensor, T: int, device: torch.device) -> torch.Tensor:
    """[T] positions that reverse each packed sequence of `cu_seqlens` on its own (its own inverse)."""
    cu = cu_seqlens.to(device=device, dtype=torch.long)
    pos = torch.arange(T, device=device)
    seq = torch.searchsorted(cu[1:], pos, right=True)  # the packed sequence of each position
    return cu[seq] + cu[seq + 1] - 1 - pos


def run_scan(fn: Callable, o: torch.Tensor, g: torch.Tensor, i: torch.Tensor, *args, reverse: bool = False,
             cu_seqlens: torch.Tensor | None = None, **kw) -> tuple[torch.Tensor, torch.Tensor | None]:
    """fn(o, g, i, ...): (y, final state); with `reverse`, its scan from the last token to the first, by flipping
    o, g, i in and y back out (each packed sequence on its own)."""
    if not reverse:
        return fn(o, g, i, *args, cu_seqlens=cu_seqlens, **kw)
    if cu_seqlens is None:
        def flip(x):
            return x.flip(1)
    else:
        index = reversal_index(cu_seqlens, o.shape[1], o.device)  # one index for the three inputs and the output

        def flip(x):
            return x.index_select(1, index)
    y, state = fn(flip(o), flip(g), flip(i), *args, cu_seqlens=cu_seqlens, **kw)
    return flip(y), state
