"""Shared measuring helpers: one error measure for every accuracy check (tests, benchmarks)."""

from __future__ import annotations

import torch


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """‖x − ref‖ / ‖ref‖ in float64 (the absolute norm when ref is 0)."""
    x, ref = x.detach().double().cpu(), ref.detach().double().cpu()
    den = ref.norm().item()
    return (x - ref).norm().item() / den if den > 0 else (x - ref).norm().item()
