"""The MQAR language model of zoology (HazyResearch/zoology `zoology/model.py`), built from hgrn2 token mixers.

    x = embed(ids) (+ learned positions, attention only)
    2 × block:  r = dropout(x) + r;  x = mixer(LayerNorm₁(r));  r = x + r;  x = LayerNorm₂(r)
    logits = LayerNorm_f(x + r) · embedᵀ          (tied head)

The blocks are zoology's `TransformerBlock` with `state_mixer = Identity` (the paper's MQAR runs have no MLP):
the block still ends in its second LayerNorm, whose output is what the next block adds to the residual. Dropout
0.1 applies to the embeddings (zoology's `embed_dropout`; `resid_dropout` is 0), and inside the attention mixer to
its attention weights (the MQAR preset's `attention_dropout`, zoology's MHA `dropout`). Weights are initialised
as zoology's `_init_weights`: every Linear and Embedding N(0, 0.02), biases 0, output projections N(0,
0.02/√(2·layers)). The LayerNorms are `hgrn2.layers.LayerNorm` (nn.LayerNorm's parameters and float32 result
for float32 inputs; one Triton kernel per direction on CUDA, where PyTorch's narrow-row backward was a quarter of
the MQAR step).
"""

from __future__ import annotations

import importlib
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..layers.norm import LayerNorm

# names of the output projections (zoology rescales `out_proj`; hgrn2's HGRU2 and Attention call it `o_proj`)
_OUTPUT_PROJECTIONS = ("out_proj", "o_proj")


def _resolve_mixer(mixer: str | type) -> type:
    """A class, a name in `hgrn2.layers.TOKEN_MIXERS`, or "module:Class" (your own mixer)."""
    if not isinstance(mixer, str):
        return mixer
    if ":" in mixer:
        module, name = mixer.split(":")
        return getattr(importlib.import_module(module), name)
    from hgrn2.layers import get_token_mixer  # imported here: the layers pull in the kernels

    return get_token_mixer(mixer)


class Block(nn.Module):
    """One zoology block: pre-LayerNorm token mixer, then LayerNorm (identity state mixer). x, r [B, T, d]."""

    def __init__(self, mixer: nn.Module, d_model: int, dropout: float, eps: float):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.norm1 = LayerNorm(d_model, eps=eps)
        self.mixer = mixer
        self.norm2 = LayerNorm(d_model, eps=eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        residual = self.dropout(x) if residual is None else self.dropout(x) + residual
        y, _ = self.mixer(self.norm1(residual))
        residual = y + residual
        return self.norm2(residual), residual


class ZoologyLM(nn.Module):
    """Token ids [B, T] → logits [B, T, V], or [B, Q, V] at the given positions [B, Q] (the head is only
    computed where it is needed: MQAR supervises kv of T positions)."""

    def __init__(self, mixer: str | type, d_model: int, vocab_size: int = 8192, n_layers: int = 2,
                 max_position_embeddings: int = 0, embed_dropout: float = 0.1, layer_norm_eps: float = 1e-5,
                 mixer_options: dict | None = None):
        super().__init__()
        cls = _resolve_mixer(mixer)
        self.embed = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(max_position_embeddings, d_model) if max_position_embeddings > 0 else None
        self.blocks = nn.ModuleList(
            Block(cls(d_model, layer_idx=i, **(mixer_options or {})), d_model, embed_dropout if i == 0 else 0.0,
                  layer_norm_eps)
            for i in range(n_layers)
        )
        self.norm_f = LayerNorm(d_model, eps=layer_norm_eps)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02) -> None:
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=std)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
        for name, m in self.named_modules():
            if isinstance(m, nn.Linear) and name.rsplit(".", 1)[-1] in _OUTPUT_PROJECTIONS:
                nn.init.normal_(m.weight, std=std / math.sqrt(2 * len(self.blocks)))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids [B, T] (int32/int64); positions [B, Q] or None. Returns logits [B, Q or T, V]."""
        T = input_ids.shape[1]
        x = self.embed(input_ids)
        if self.pos is not None:
            if T > self.pos.num_embeddings:
                raise ValueError(f"`input_ids`: length {T} exceeds max_position_embeddings={self.pos.num_embeddings}")
            x = x + self.pos.weight[:T]
        residual = None
        for block in self.blocks:
            x, residual = block(x, residual)
        h = self.norm_f(x + residual)
        if positions is not None:
            h = h.gather(1, positions.long().unsqueeze(-1).expand(-1, -1, h.shape[-1]))
        return F.linear(h, self.embed.weight)
