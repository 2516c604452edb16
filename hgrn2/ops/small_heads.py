"""HGRN2 with small heads through HGRN1's element-wise scan: the torch path of `hgrn2.ops.hgrn2_small_heads`."""

from __future__ import annotations

from collections.abc import Callable

import torch

from .gates import activate


def hgrn2_elementwise(hgrn1: Callable, o: torch.Tensor, g: torch.Tensor, i: torch.Tensor,
                      lower_bound: torch.Tensor | None = None, *, scale: float = 1.0, o_act: str | None = None,
                      reverse: bool = False, bidirectional: bool = False, backend: str | None = None) -> torch.Tensor:
    """HGRN2's output by `hgrn1` (the op, with `backend`) over the H·V·K state entries.

    h_t[v, k] = f_t[k]·h_{t−1}[v, k] + (1 − f_t[k])·i_t[v] is element-wise once i is repeated over k and f over v,
    as the authors' LRA code runs it (`HgruRealFunction` on the expanded state). Reverse scans flip time;
    `bidirectional` runs both directions as one batch of twice the size.
    """
    if bidirectional:
        B = o.shape[0]
        y = hgrn2_elementwise(hgrn1, *(torch.cat([t, t.flip(1)]) for t in (o, g, i)), lower_bound, scale=scale,
                              o_act=o_act, backend=backend)
        return y[:B] + y[B:].flip(1)
    if reverse:
        return hgrn2_elementwise(hgrn1, o.flip(1), g.flip(1), i.flip(1), lower_bound, scale=scale, o_act=o_act,
                                 backend=backend).flip(1)
    B, T, H, K = o.shape
    V = i.shape[-1]
    x = i[..., :, None].expand(B, T, H, V, K).reshape(B, T, H * V * K)
    gate = g[..., None, :].expand(B, T, H, V, K).reshape(B, T, H * V * K)
    lb = None if lower_bound is None else lower_bound[:, None, :].expand(H, V, K).reshape(-1)
    h = hgrn1(x, gate, lb, backend=backend)[0].view(B, T, H, V, K)
    # a product and a sum over K, not einsum: einsum's batched matmul of B·T·H tiny [V, K] matrices runs as
    # thousands of cuBLAS launches
    return scale * (h * activate(o, o_act).to(h.dtype)[..., None, :]).sum(-1)
