"""Normalisation layers that compute in (at least) float32 whatever the input dtype, as fla's fused kernels do,
and keep only their input and per-row statistics for the backward (`hgrn2.ops.norm`)."""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from ..ops.norm import add_rms_norm, layer_norm, rms_norm

NORMS = ("rmsnorm", "layernorm", None)


def check_eps(name: str, eps) -> None:
    """A norm's epsilon must be a positive finite number (0 divides by zero on a zero row, < 0 takes a root of a
    negative number)."""
    if isinstance(eps, bool) or not isinstance(eps, int | float) or not (0 < eps < math.inf):
        raise ValueError(f"`{name}`: expected a positive finite number, got {eps!r}")


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x²) + eps) · weight over the last dim, computed in float32, returned in x's dtype.

    Matches fla's `RMSNorm` / `rms_norm_linear` numerics (fp32 statistics and fp32 weight multiply).
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        check_eps("eps", eps)
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def forward(self, x: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """x [..., hidden] → [..., hidden] in out_dtype (default x's dtype)."""
        return rms_norm(x, self.weight, self.eps, out_dtype)

    def add_and_norm(self, x: torch.Tensor, res: torch.Tensor,
                     out_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """A pre-norm residual step, fused: (r, norm(r)) with r = x + res (both [..., hidden])."""
        return add_rms_norm(x, res, self.weight, self.eps, out_dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm computed in float32, returned in the input's dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm(x, self.weight, self.bias, self.eps)


def build_norm(kind: str | None, hidden_size: int, eps: float) -> nn.Module:
    """One of `NORMS`: "rmsnorm", "layernorm" or None (identity)."""
    check_eps("norm_eps", eps)
    if kind == "rmsnorm":
        return RMSNorm(hidden_size, eps=eps)
    if kind == "layernorm":
        return LayerNorm(hidden_size, eps=eps)
    if kind is None:
        return nn.Identity()
    raise ValueError(f"`norm`: expected one of {NORMS}, got {kind!r}")
