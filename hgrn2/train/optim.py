"""Optimisers (AdamW / Adam with decay on matrices only) and learning-rate schedules with linear warmup.

Schedules are pure functions of the step, so resuming needs only the step number.
"""

from __future__ import annotations

import math

import torch


def build_optimizer(model: torch.nn.Module, name: str, lr: float, betas, eps: float, weight_decay: float):
    """Two parameter groups: matrices (dim >= 2: projections, embeddings) decayed; vectors (norms, biases,
    lower bounds) not. `fused`/`foreach` are left to torch's defaults for the device."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    cls = {"adamw": torch.optim.AdamW, "adam": torch.optim.Adam}[name]
    return cls(groups, lr=lr, betas=tuple(betas), eps=eps)


def lr_at(step: int, *, schedule: str, lr: float, warmup_steps: int, max_steps: int, min_lr: float = 0.0) -> float:
    """Learning rate for optimiser step `step` (0-based).

    warmup: lr·(step+1)/warmup for step < warmup (never 0, so the first update is not wasted);
    inverse_sqrt (fairseq): lr·sqrt(warmup/(step+1)) afterwards; cosine: from lr to min_lr at max_steps;
    constant: lr.
    """
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if schedule == "constant":
        return lr
    if schedule == "inverse_sqrt":
        return lr * math.sqrt(max(warmup_steps, 1) / (step + 1))
    if schedule == "cosine":
        progress = min(1.0, (step - warmup_steps) / max(1, max_steps - warmup_steps))
        return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * progress))
    raise ValueError(f"schedule must be 'inverse_sqrt', 'cosine' or 'constant', got {schedule!r}")


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
