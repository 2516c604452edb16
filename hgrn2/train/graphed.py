"""A training step replayed as one CUDA graph, for small models whose steps are bound by launching kernels.

    step = GraphedStep(compute_loss, optimizer, pad_values=(0, 0, -100))
    for batch in batches:          # tuples of CUDA tensors, batch dimension first
        loss = step(*batch)        # the step's detached loss; no host sync

`compute_loss(*batch)` runs the forward and returns the scalar loss; the step adds zero_grad, backward and
`optimizer.step()`. The first `warmup` calls run eagerly on a side stream (real training steps, as
`torch.cuda.graph` requires before a capture), the next call captures the whole step once, and every call from
then on copies its batch into the captured (static) tensors and replays the graph: one launch per step instead
of hundreds. The first batch fixes the static shapes; a smaller batch (an epoch's last) fills the first rows
and pads the rest with `pad_values` (one per batch tensor); with an ignored target there (−100 for
`F.cross_entropy`), the loss and the gradients are the smaller batch's.

The step must not sync with the host, the optimizer must be capturable (`capturable=True`, its learning rate a
CUDA tensor that schedulers change in place between replays), and autocast must run with `cache_enabled=False`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


class GraphedStep:
    def __init__(self, compute_loss: Callable[..., torch.Tensor], optimizer: torch.optim.Optimizer,
                 pad_values: Sequence[int | float], warmup: int = 3):
        for group in optimizer.param_groups:
            if not group.get("capturable") or not (torch.is_tensor(group["lr"]) and group["lr"].is_cuda):
                raise ValueError("`optimizer`: expected capturable=True and the learning rate as a CUDA tensor "
                                 "(a float would be frozen into the graph)")
        self.compute_loss, self.optimizer = compute_loss, optimizer
        self.pad_values, self.warmup = tuple(pad_values), warmup
        self.calls, self.static, self.graph, self.loss = 0, None, None, None

    def _step(self) -> torch.Tensor:
        self.optimizer.zero_grad(set_to_none=True)  # captured with no grads: backward writes, not accumulates
        loss = self.compute_loss(*self.static)
        loss.backward()
        self.optimizer.step()
        return loss.detach()

    def _fill(self, batch: Sequence[torch.Tensor]) -> None:
        if self.static is None:
            self.static = [t.clone() for t in batch]
        pad_into(self.static, batch, self.pad_values)

    def __call__(self, *batch: torch.Tensor) -> torch.Tensor:
        """One training step on `batch`; returns its loss (a tensor the next call overwrites)."""
        self._fill(batch)
        if self.calls < self.warmup:
            self.calls += 1
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                loss = self._step()
            torch.cuda.current_stream().wait_stream(side)
            return loss
        if self.graph is None:
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):  # records the step; nothing runs until the replay below
                self.loss = self._step()
        self.graph.replay()
        return self.loss


def pad_into(static: Sequence[torch.Tensor], batch: Sequence[torch.Tensor], pad_values: Sequence[int | float]) -> None:
    """Copy each batch tensor into the first rows of its static tensor and fill the remaining rows with its pad
    value. A batch tensor may have fewer rows than its static tensor, nothing else may differ."""
    if not len(static) == len(batch) == len(pad_values):
        raise ValueError(f"batch: expected {len(static)} tensors (one per static tensor and pad value), "
                         f"got {len(batch)}")
    for s, t, pad in zip(static, batch, pad_values):
        if t.shape[1:] != s.shape[1:] or t.shape[0] > s.shape[0] or t.dtype != s.dtype:
            raise ValueError(f"batch: expected at most {tuple(s.shape)} {s.dtype} (the first batch's shape), "
                             f"got {tuple(t.shape)} {t.dtype}")
        s[: len(t)].copy_(t)
        s[len(t):].fill_(pad)
