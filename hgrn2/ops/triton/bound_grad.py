"""The lower bound's gradient where the Triton kernels' own is not accurate: heads with a bound β near 0.

The kernels form dβ = σ(−g)·(d log f / f − dk) from d log f's reverse running sum, whose terms cancel: its fp32
rounding (absolute, relative to the gradient's scale) is multiplied by σ(−g)/f ≤ 1/β. For the heads holding a
channel with β < THETA, `exact_bound_grad` recomputes dβ with the torch chunk backend, whose d log f sums only the
pairs that straddle each token (`hgrn2.ops.chunk._Chunked`), and writes it over the kernels' rows. Which heads those
are, `LowBoundHeads` finds in the forward and sends to the host while the GPU runs on.
"""

from __future__ import annotations

import torch

from ..checks import capturing
from ..chunk import hgrn2_chunk
from ..flip import run_scan
from ._common import ACTS

# The kernels' dβ errs by d log f's rounding times σ(−g)/f ≤ 1/β: at β ≥ 2^-8 at most a few 1e-4 of the gradient's
# scale in fp32 (any gates), under bf16 training's own rounding, while the model's bounds β_l = l/L ≥ 1/L stay above
# it for up to 256 layers.
THETA = 2.0 ** -8

_ACT_NAMES = {code: name for name, code in ACTS.items()}


def _tracing(x: torch.Tensor) -> bool:
    """Whether torch.compile traces or a CUDA graph is captured: neither can record a choice made on the host."""
    return torch.compiler.is_compiling() or capturing(x)


class LowBoundHeads:
    """The heads of a bound [H, K] that hold some β < THETA, taken in the forward for its backward.

    On CUDA the flags go to pinned host memory by a non-blocking copy followed by an event, taken before the
    forward's kernels, so the backward waits only for that event (passed long before, or under activation
    checkpointing just before the recomputed forward), not for the GPU's whole queue as a synchronous read would;
    a choice-free alternative, the chunk backend's recomputation for every head on every call, costs many times the
    kernels' own work (hundreds of launches).
    """

    def __init__(self, lower_bound: torch.Tensor):
        flags = (lower_bound.detach() < THETA).any(-1)
        self.event = None
        if flags.is_cuda:
            self.flags = torch.empty(flags.shape, dtype=torch.bool, pin_memory=True).copy_(flags, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record(torch.cuda.current_stream(flags.device))
        else:
            self.flags = flags

    @classmethod
    def of(cls, lower_bound: torch.Tensor | None, needs_grad: bool) -> LowBoundHeads | None:
        """For a forward whose bound needs a gradient; None without one, or while torch.compile traces or a CUDA
        graph is captured (then the kernels' dβ is kept)."""
        if lower_bound is None or not needs_grad or _tracing(lower_bound):
            return None
        return cls(lower_bound)

    def on(self, device: torch.device) -> torch.Tensor | None:
        """The flagged heads' indices (ascending, int64) on device, or None if no head is flagged."""
        if self.event is not None:
            self.event.synchronize()
        heads = self.flags.nonzero().squeeze(1)
        if heads.numel() == 0:
            return None
        # pinned and non-blocking: a copy from pageable memory would wait for the stream
        return heads.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else heads


def exact_bound_grad(dlb: torch.Tensor, low: LowBoundHeads | None, o: torch.Tensor, g: torch.Tensor, i: torch.Tensor,
                     lower_bound: torch.Tensor, initial_state: torch.Tensor | None, cu_seqlens: torch.Tensor | None,
                     dy: torch.Tensor, dht: torch.Tensor | None, scale: float, o_act: int, i_act: int,
                     reverse: bool = False) -> torch.Tensor:
    """dlb [H, K] (the kernels' d lower_bound) with the rows of the heads that `low` flagged replaced by the chunk
    backend's exact ones; the other arguments as the kernels' backward took them (act codes of `ACTS`; reverse: the
    scan ran from the last token, recomputed here by flipping time).

    No host sync on the way (packed sequences: one, in the recomputation); dlb as it is when `low` is None or while
    torch.compile traces or a CUDA graph is captured.
    """
    heads = None if low is None or _tracing(dlb) else low.on(dlb.device)
    if heads is None:
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
