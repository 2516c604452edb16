"""Causal depthwise short convolution with a decoding cache (fla's `ShortConvolution` without activation)."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class ShortConv(nn.Conv1d):
    """y_t = Σ_{j<W} w_j · x_{t−W+1+j} per channel; weight [D, 1, W] (fla's `*_conv1d.weight` layout).

    forward(x [B, T, D], state [B, D, W−1] or None) → (y [B, T, D], new state [B, D, W−1]); the state holds
    the last W−1 inputs, zeros at the start of a sequence.
    """

    def __init__(self, hidden_size: int, kernel_size: int = 4, bias: bool = False):
        if kernel_size < 1:
            raise ValueError(f"`conv_size`: expected an int >= 1, got {kernel_size}")
        super().__init__(hidden_size, hidden_size, kernel_size, groups=hidden_size, bias=bias)

    def forward(self, x: torch.Tensor, state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        B, T, D = x.shape
        W = self.kernel_size[0]
        xt = x.transpose(1, 2)
        prefix = xt.new_zeros(B, D, W - 1) if state is None else state.to(xt.dtype)
        xp = torch.cat([prefix, xt], dim=-1)
        y = F.conv1d(xp, self.weight, self.bias, groups=D)
        return y.transpose(1, 2).contiguous(), xp[..., xp.shape[-1] - (W - 1):]
