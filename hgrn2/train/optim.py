"""Optimisers (AdamW / Adam with decay on matrices only) and learning-rate schedules with linear warmup.

Schedules are pure functions of the step, so resuming needs only the step number.
"""

from __future__ import annotations

import math

import torch


def build_optimizer(model: torch.nn.Module, name: str, lr: float, betas, eps: float, weight_decay: float,
                    fused: bool = False):
    """Two parameter groups: matrices (dim >= 2: projections, embeddings) decayed; vectors (norms, biases,
    lower bounds) not. `fused`: torch's fused kernels; else torch's default for the device (foreach on CUDA)."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    cls = {"adamw": torch.optim.AdamW, "adam": torch.optim.Adam}[name]
    return cls(groups, lr=lr, betas=tuple(betas), eps=eps, **({"fused": True} if fused else {}))


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
        if torch.is_tensor(group["lr"]):
            group["lr"].fill_(lr)  # in place: a captured CUDA graph reads this tensor
        else:
            group["lr"] = lr


def set_capturable(optimizer: torch.optim.Optimizer, device: torch.device | None) -> None:
    """`device`: steps a CUDA graph can capture, each group's learning rate a float32 tensor there (which `set_lr`
    changes in place) and the step counts there too; None: ordinary steps, float rates, step counts on the CPU.
    A loaded state dict brings back the mode it was saved in, so this runs again after loading."""
    for group in optimizer.param_groups:
        group["capturable"] = device is not None
        lr = float(group["lr"])
        group["lr"] = lr if device is None else torch.tensor(lr, device=device)
        for p in group["params"]:
            state = optimizer.state.get(p, {})
            if torch.is_tensor(state.get("step")):
                state["step"] = state["step"].to(device or "cpu")
