"""SwiGLU feed-forward block, named and sized exactly like fla's `GatedMLP` (HGRN2MLP)."""

from __future__ import annotations

import torch
import torch.nn as nn

from ..ops.projection import linears, rms_norm_swiglu_mlp
from ..ops.swiglu import swiglu_linear


def glu_intermediate_size(hidden_size: int, hidden_ratio: float | None = 4) -> int:
    """fla's rule: int(hidden · ratio · 2/3) rounded up to a multiple of 256 (2048, ratio 4 → 5632)."""
    ratio = 4 if hidden_ratio is None else hidden_ratio
    n = int(hidden_size * ratio * 2 / 3)
    return 256 * ((n + 255) // 256)


class GLU(nn.Module):
    """down_proj(silu(gate_proj(x)) · up_proj(x)); x [..., hidden] → [..., hidden]."""

    def __init__(self, hidden_size: int, hidden_ratio: float | None = 4, intermediate_size: int | None = None,
                 hidden_act: str = "swish", bias: bool = False):
        super().__init__()
        if hidden_act not in ("swish", "silu"):
            raise ValueError(f"`hidden_act`: expected 'swish' (= 'silu'), got {hidden_act!r}")
        if intermediate_size is None:
            intermediate_size = glu_intermediate_size(hidden_size, hidden_ratio)
        if intermediate_size <= 0:
            raise ValueError(f"`intermediate_size`: expected a positive int, got {intermediate_size}")
        self.intermediate_size = intermediate_size
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)

    def forward(self, x: torch.Tensor, prenorm: tuple | None = None
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """x [..., hidden] → [..., hidden]. prenorm: (norm, res, out_dtype) as in `HGRU2.forward`: x is then the
        residual stream before the pre-norm RMSNorm `norm`, r = x + res (or x), the MLP reads norm(r, out_dtype)
        (in decoding, norm, gate, up and SwiGLU as one kernel), and r is returned last."""
        if prenorm is not None:
            norm, res, out_dtype = prenorm
            r, y = rms_norm_swiglu_mlp(x, norm.weight, norm.eps, self.gate_proj.weight, self.up_proj.weight,
                                       self.down_proj.weight,
                                       (self.gate_proj.bias, self.up_proj.bias, self.down_proj.bias),
                                       res=res, out_dtype=out_dtype)
            return y, r
        # gate and up as one autograd node; down_proj's weights through swiglu_linear, whose backward recomputes
        # silu(g) · u instead of keeping it
        g, u = linears(x, (self.gate_proj.weight, self.up_proj.weight), (self.gate_proj.bias, self.up_proj.bias))
        return swiglu_linear(g, u, self.down_proj.weight, self.down_proj.bias)
