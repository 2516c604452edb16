"""A training step replayed as one CUDA graph, so that a slow host does not bound the step.

    step = GraphedStep(compute_loss, optimizer, pad_values=(0, 0, -100))
    for batch in batches:                # tuples of CUDA tensors, batch dimension first
        loss, grad_norm = step(*batch)   # detached tensors the next call overwrites; no host sync

`compute_loss(*micro_batch)` runs the forward and returns the scalar loss; the step (`train_step`) adds
zero_grad, backward over `accum` micro-batches (equal row chunks of the batch, each loss weighted 1/accum),
gradient clipping to `max_norm` with the norm kept on the device (`math.inf`: measured, not clipped; None: neither)
and `optimizer.step()`. The first `warmup` calls run eagerly on a side stream (real training steps, as
`torch.cuda.graph` requires before a capture), the next call captures the whole step once, and every call from
then on copies its batch into the captured (static) tensors and replays the graph: one launch per step instead
of hundreds. The first batch fixes the static shapes. With `pad_values` (one per batch tensor) and no
accumulation, a smaller batch (an epoch's last) fills the first rows and pads the rest; with an ignored target
there (−100 for `F.cross_entropy`), the loss and the gradients are the smaller batch's. Without `pad_values`
every batch must have the first one's shape.

The step must not sync with the host, the optimizer must be capturable (`capturable=True`, its learning rate a
CUDA tensor that schedulers change in place between replays), and autocast must run with `cache_enabled=False`.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence

import torch


def train_step(compute_loss: Callable[..., torch.Tensor], optimizer: torch.optim.Optimizer,
               batch: Sequence[torch.Tensor], accum: int = 1, max_norm: float | None = None,
               sync: Callable[[bool], contextlib.AbstractContextManager] | None = None
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One optimiser step over `accum` micro-batches of `batch`; returns the mean loss (float32, detached) and the
    global gradient norm before clipping (None when `max_norm` is None). Queues its work without a host sync.
    `sync(last)`: the context of each micro-batch's backward (DDP/FSDP2's gradient sync on the last one only)."""
    optimizer.zero_grad(set_to_none=True)  # captured with no grads: the first backward writes, later ones add
    loss = torch.zeros((), device=batch[0].device)
    micros = [tuple(batch)] if accum == 1 else zip(*(t.chunk(accum) for t in batch))  # None entries pass whole
    for a, micro in enumerate(micros):
        with sync(a == accum - 1) if sync is not None else contextlib.nullcontext():
            part = compute_loss(*micro)
            (part / accum).backward()
        loss += part.detach().float() / accum
    norm = None
    if max_norm is not None:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        if math.isinf(max_norm):  # measured only
            norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None], foreach=True)
        else:
            norm = torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # FSDP2 returns a DTensor
    optimizer.step()
    return loss, norm


class GraphedStep:
    def __init__(self, compute_loss: Callable[..., torch.Tensor], optimizer: torch.optim.Optimizer,
                 pad_values: Sequence[int | float] | None = None, warmup: int = 3, accum: int = 1,
                 max_norm: float | None = None):
        if warmup < 1 or accum < 1:
            raise ValueError(f"`warmup` and `accum`: expected at least 1, got {warmup} and {accum}")
        if pad_values is not None and accum > 1:
            raise ValueError("`pad_values`: padding a smaller batch is supported without accumulation only "
                             f"(accum={accum})")
        for group in optimizer.param_groups:
            if not group.get("capturable") or not (torch.is_tensor(group["lr"]) and group["lr"].is_cuda):
                raise ValueError("`optimizer`: expected capturable=True and the learning rate as a CUDA tensor "
                                 "(a float would be frozen into the graph)")
        self.compute_loss, self.optimizer, self.accum, self.max_norm = compute_loss, optimizer, accum, max_norm
        self.pad_values, self.warmup = None if pad_values is None else tuple(pad_values), warmup
        self.calls, self.static, self.graph, self.out = 0, None, None, None

    def _step(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        return train_step(self.compute_loss, self.optimizer, self.static, self.accum, self.max_norm)

    def _fill(self, batch: Sequence[torch.Tensor | None]) -> None:
        if self.static is None:
            if len(batch[0]) % self.accum:
                raise ValueError(f"batch: {len(batch[0])} rows do not split into accum={self.accum} micro-batches")
            self.static = [None if t is None else t.clone() for t in batch]
        if self.pad_values is None:
            shapes, got = [_spec(s) for s in self.static], [_spec(t) for t in batch]
            if got != shapes:
                raise ValueError(f"batch: expected the first batch's shapes {shapes} (no pad_values given), got {got}")
            for s, t in zip(self.static, batch):
                if s is not None:
                    s.copy_(t)
        else:
            pad_into(self.static, batch, self.pad_values)

    def __call__(self, *batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One training step on `batch`; returns its loss and gradient norm (tensors the next call overwrites)."""
        self._fill(batch)
        if self.calls < self.warmup:
            self.calls += 1
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                out = self._step()
            torch.cuda.current_stream().wait_stream(side)
            return out
        if self.graph is None:
            self.graph = torch.cuda.CUDAGraph()
            # records the step (nothing runs until the replay below); thread_local: a data loader's pin-memory
            # thread may allocate pinned memory meanwhile, which the default mode would count against the capture
            with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
                self.out = self._step()
        self.graph.replay()
        return self.out


def pad_into(static: Sequence[torch.Tensor | None], batch: Sequence[torch.Tensor | None],
             pad_values: Sequence[int | float]) -> None:
    """Copy each batch tensor into the first rows of its static tensor and fill the remaining rows with its pad
    value. A batch tensor may have fewer rows than its static tensor, nothing else may differ; an absent input
    (None, e.g. the lengths of equal-length sequences) stays absent."""
    if not len(static) == len(batch) == len(pad_values):
        raise ValueError(f"batch: expected {len(static)} tensors (one per static tensor and pad value), "
                         f"got {len(batch)}")
    for s, t, pad in zip(static, batch, pad_values):
        if s is None and t is None:
            continue
        if s is None or t is None or t.shape[1:] != s.shape[1:] or t.shape[0] > s.shape[0] or t.dtype != s.dtype:
            raise ValueError(f"batch: expected at most {_spec(s)} (the first batch's shape), got {_spec(t)}")
        s[: len(t)].copy_(t)
        s[len(t):].fill_(pad)


def _spec(t: torch.Tensor | None) -> tuple | None:
    """(shape, dtype) of a batch input, None for an absent one."""
    return None if t is None else (tuple(t.shape), t.dtype)
