"""The lower bound's gradient where the Triton kernels' own is not accurate: heads with a bound β near 0.

The kernels form dβ = σ(−g)·(d log f / f − dk) from d log f's reverse running sum, whose terms cancel: its fp32
rounding (absolute, relative to the gradient's scale) is multiplied by σ(−g)/f ≤ 1/β. For the heads holding a
channel with β < THETA, `exact_bound_grad` recomputes dβ with the torch chunk backend, whose d log f sums only the
pairs that straddle each token (`hgrn2.ops.chunk._Chunked`), and writes it over the kernels' rows.
"""

from __future__ import annotations

import torch

from ..chunk import hgrn2_chunk
from ..flip import run_scan
from ._common import ACTS

# The kernels' dβ errs by d log f's rounding times σ(−g)/f ≤ 1/β: at β ≥ 2^-8 at most a few 1e-4 of the gradient's
# scale in fp32 (any gates), under bf16 training's own rounding, while the model's bounds β_l = l/L ≥ 1/L stay above
# it for up to 256 layers.
THETA = 2.0 ** -8

_ACT_NAMES = {code: name for name, code in ACTS.items()}


def exact_bound_grad(dlb: torch.Tensor, o: torch.Tensor, g: torch.Tensor, i: torch.Tensor, lower_bound: torch.Tensor,
                     initial_state: torch.Tensor | None, cu_seqlens: torch.Tensor | None, dy: torch.Tensor,
                     dht: torch.Tensor | None, scale: float, o_act: int, i_act: int, reverse: bool = False
                     ) -> torch.Tensor:
    """dlb [H, K] (the kernels' d lower_bound) with the rows of the heads that hold some β < THETA replaced by the
    chunk backend's exact ones; the other arguments as the kernels' backward took them (act codes of `ACTS`; reverse:
    the scan ran from the last token, recomputed here by flipping time).

    One host sync (which heads) per call; none, and dlb as it is, while a CUDA graph is captured or torch.compile
    traces (a data-dependent choice cannot be recorded there).
    """
    if torch.compiler.is_compiling() or (dlb.is_cuda and torch.cuda.is_current_stream_capturing()):
        return dlb
    heads = (lower_bound < THETA).any(-1).nonzero().squeeze(1)  # the host sync
    if heads.numel() == 0:
        return dlb

    def pick(x, dim):
        return None if x is None else x.detach().index_select(dim, heads)

    lb = pick(lower_bound, 0).requires_grad_()
    with torch.enable_grad():
        kw = dict(scale=scale, o_act=_ACT_NAMES[o_act], i_act=_ACT_NAMES[i_act], initial_state=pick(initial_state, 1),
                  output_final_state=dht is not None, cu_seqlens=cu_seqlens)
        args = (pick(o, 2), pick(g, 2), pick(i, 2), lb)
        y, ht = run_scan(hgrn2_chunk, *args, reverse=reverse, **kw)
        outs, grads = [y], [pick(dy, 2)]
        if dht is not None:
            outs.append(ht)
            grads.append(pick(dht, 1))
        (d,) = torch.autograd.grad(outs, lb, grads)
    return dlb.index_copy(0, heads, d.to(dlb.dtype))
