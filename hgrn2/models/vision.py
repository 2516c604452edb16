"""HGRN2 image classifiers in the layout of the authors' image models (OpenNLPLab/im, `Hgrn1dVit`).

    patches (p×p, row-major) → Linear → depth × [x += mixer(LN x); x += GLU(LN x)] → mean over patches
    → parameter-free RMS norm → Linear head

No class token, no position embedding and no drop path, as in the authors' code (`Hgrn1dVit` accepts a drop-path
rate but never passes it to its blocks); PyTorch's default initialisation, as there. The token mixer is the
authors' bidirectional HGRU2 (`BiHgru2_1d` of hgru2-pytorch): one set of projections, the gated recurrence run
forwards and backwards over the patches with the same gates, the two outputs summed (each direction includes the
current patch), then LayerNorm and the output projection. Input activation SiLU, output gate sigmoid, scale 1,
biases on.

Lower bounds follow `Hgrn1dVit`: β of layer l = Σ_{j<l} softmax(Γ, 0)_j (layer 0 gets 0), Γ initialised to ones.

`PRESETS` hold the DeiT-Tiny / DeiT-Small sizes. The authors' `hgrn2_vit_*` definitions are not public; the HGRN1
ones (`hgrn1d_vit_*`) give patch 14, depth 12, width 192 / 384. With the HGRN2 mixer a GLU width of 3× the model
width (the `Hgrn1dVit` default, 576 at width 192) gives the paper's 6.1M / 23.8M parameters; HGRN1's 2× would give
4.8M / 18.4M. The expansion ratio (head dimension) is 64: 3 / 6 heads, as DeiT's.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn as nn

from .. import ops
from ..layers.glu import GLU
from ..layers.hgru2 import HGRU2
from ..ops.gates import layer_bounds
from ..ops.projection import linears


@dataclass
class VisionConfig:
    image_size: int = 224
    patch_size: int = 14
    in_channels: int = 3
    num_classes: int = 1000
    hidden_size: int = 192
    num_layers: int = 12
    expand_ratio: int = 64
    glu_size: int = 576
    bidirectional: bool = True
    norm_eps: float = 1e-5
    backend: str | None = None

    def __post_init__(self):
        for name in ("image_size", "patch_size", "in_channels", "num_classes", "hidden_size", "num_layers",
                     "expand_ratio", "glu_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"`{name}`: expected a positive int, got {value!r}")
        if self.image_size % self.patch_size:
            raise ValueError(f"`patch_size`: expected a divisor of image_size={self.image_size}, got {self.patch_size}")
        if self.hidden_size % self.expand_ratio:
            raise ValueError(f"`expand_ratio`: expected a divisor of hidden_size={self.hidden_size}, "
                             f"got {self.expand_ratio}")

    def to_dict(self) -> dict:
        return asdict(self)


PRESETS: dict[str, dict] = {
    "deit_tiny": dict(hidden_size=192, glu_size=576),   # paper: 6.1M parameters
    "deit_small": dict(hidden_size=384, glu_size=1152),  # paper: 23.8M parameters
}


def preset(name: str, **overrides: Any) -> VisionConfig:
    """`VisionConfig` of a named size (`PRESETS`), with fields overridden."""
    if name not in PRESETS:
        raise ValueError(f"`preset`: expected one of {sorted(PRESETS)}, got {name!r}")
    return VisionConfig(**{**PRESETS[name], **overrides})


class BiHGRU2(HGRU2):
    """HGRU2 over whole sequences, both directions with shared projections and gates (y = y→ + y←), or the
    forward direction alone with `bidirectional=False`."""

    def __init__(self, hidden_size: int, *, bidirectional: bool = True, **kw: Any) -> None:
        super().__init__(hidden_size, **kw)
        self.bidirectional = bidirectional

    def forward(self, x: torch.Tensor, lower_bound: torch.Tensor | None = None) -> torch.Tensor:
        """x [B, T, hidden], lower_bound [hidden] or None → [B, T, hidden]."""
        B, T, D = x.shape
        H, K = self.num_heads, self.head_dim
        projs = (self.q_proj, self.f_proj, self.i_proj)
        q, f, i = (t.view(B, T, H, K) for t in linears(x, (p.weight for p in projs), (p.bias for p in projs)))
        lb = None if lower_bound is None else lower_bound.view(H, K)
        kw = dict(scale=self.scale, o_act=self.o_act, i_act=self.i_act, backend=self.backend)
        y, _ = ops.hgrn2(q, f, i, lb, **kw)
        if self.bidirectional:
            y = y + ops.hgrn2(q, f, i, lb, reverse=True, **kw)[0]  # in place on the fused-chunk kernels
        return self.o_proj(self.g_norm(y.reshape(B, T, D)))


class VisionBlock(nn.Module):
    """Pre-norm residual block: x + mixer(LN x), then + GLU(LN x)."""

    def __init__(self, c: VisionConfig, layer_idx: int):
        super().__init__()
        self.token_norm = nn.LayerNorm(c.hidden_size, eps=c.norm_eps)
        self.token_mixer = BiHGRU2(c.hidden_size, bidirectional=c.bidirectional, layer_idx=layer_idx,
                                   expand_ratio=c.expand_ratio, o_act="sigmoid", i_act="silu", scale=1.0,
                                   norm="layernorm", norm_eps=c.norm_eps, bias=True, backend=c.backend)
        self.feature_norm = nn.LayerNorm(c.hidden_size, eps=c.norm_eps)
        self.feature_mixer = GLU(c.hidden_size, intermediate_size=c.glu_size, hidden_act="silu", bias=True)

    def forward(self, x: torch.Tensor, lower_bound: torch.Tensor | None) -> torch.Tensor:
        x = x + self.token_mixer(self.token_norm(x), lower_bound)
        return x + self.feature_mixer(self.feature_norm(x))


class HGRN2ForImageClassification(nn.Module):
    """images [B, C, S, S] → logits [B, num_classes]."""

    def __init__(self, config: VisionConfig):
        super().__init__()
        c = self.config = config
        self.patch_embed = nn.Linear(c.in_channels * c.patch_size ** 2, c.hidden_size)
        self.layers = nn.ModuleList(VisionBlock(c, i) for i in range(c.num_layers))
        # layer 0's bound is 0, so a single layer has none to learn (and DDP refuses parameters without gradients)
        self.lower_bounds = nn.Parameter(torch.ones(c.num_layers, c.hidden_size)) if c.num_layers > 1 else None
        self.head = nn.Linear(c.hidden_size, c.num_classes)

    def patchify(self, images: torch.Tensor) -> torch.Tensor:
        """[B, C, S, S] → [B, (S/p)², p·p·C], patches in row-major order, each flattened as (p1, p2, c)."""
        c = self.config
        if images.ndim != 4 or images.shape[1:] != (c.in_channels, c.image_size, c.image_size):
            raise ValueError(f"`images`: expected shape [B, {c.in_channels}, {c.image_size}, {c.image_size}], "
                             f"got {tuple(images.shape)}")
        B, p, n = images.shape[0], c.patch_size, c.image_size // c.patch_size
        x = images.reshape(B, c.in_channels, n, p, n, p).permute(0, 2, 4, 3, 5, 1)
        return x.reshape(B, n * n, p * p * c.in_channels)

    def layer_lower_bounds(self) -> torch.Tensor:
        """β [L, hidden]: layer l gets Σ_{j<l} softmax(Γ, 0)_j (an exclusive cumulative sum; layer 0 gets 0)."""
        if self.lower_bounds is None:  # one layer
            return self.head.weight.new_zeros(1, self.config.hidden_size, dtype=torch.float32)
        p = self.lower_bounds.float().softmax(0)
        return p.cumsum(0) - p

    def forward_features(self, images: torch.Tensor) -> torch.Tensor:
        """Mean-pooled patch features [B, hidden], before the head's norm."""
        x = self.patch_embed(self.patchify(images))
        betas = layer_bounds(self.layer_lower_bounds() if self.lower_bounds is not None else None, len(self.layers))
        for layer, beta in zip(self.layers, betas):
            x = layer(x, beta)
        return x.mean(1)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.forward_features(images).float()
        x = x / (x.pow(2).mean(-1, keepdim=True).sqrt() + 1e-8)  # the authors' parameter-free SimpleRMSNorm
        return self.head(x.to(self.head.weight.dtype))


def num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())

