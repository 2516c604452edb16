"""Softmax attention: the Transformer baseline token mixer (causal, multi-head, `F.scaled_dot_product_attention`).

    q, k, v = split(qkv_proj x)            [B, T, H, e] each, e = hidden / H
    q, k ← RoPE(q, k) at each token's position (optional)
    y = o_proj(dropout(softmax(q kᵀ / √e + causal and padding mask)) v)      dropout: training only

Positions count real tokens only, so a left-padded row gets the same positions (and outputs) as the unpadded one.
The decoding state is the KV cache `(k, v, valid)`: keys (after RoPE) and values [B, H, S, e] concatenated over
time, and valid [B, S] bool marking which cached positions were real tokens (padded keys stay masked later on).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .hgru1 import check_call, check_positive_int


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate halves of x [B, T, H, e] by angle pos·theta^(−2j/e) (GPT-NeoX / Llama layout); pos [B, T]."""
    e = x.shape[-1]
    inv = theta ** (-torch.arange(0, e, 2, device=x.device, dtype=torch.float32) / e)
    ang = pos.float()[..., None, None] * inv  # [B, T, 1, e/2]
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)
    x1, x2 = x.float().chunk(2, dim=-1)
    return (x.float() * cos + torch.cat([-x2, x1], -1) * sin).to(x.dtype)


class Attention(nn.Module):
    """Multi-head causal softmax attention on x [B, T, hidden].

    Options: num_heads (default hidden / head_dim), head_dim (default 64, or hidden if smaller), rope (True),
    rope_theta (10000), bias (False), attention_dropout (0.0: the probability of dropping an attention weight
    while training, as zoology's MHA; its MQAR runs use 0.1). `lower_bound` is accepted and ignored.
    """

    uses_lower_bound = False  # models then create no bound, a parameter DDP would find without a gradient

    def __init__(self, hidden_size: int, *, layer_idx: int = 0, num_heads: int | None = None, head_dim: int = 64,
                 rope: bool = True, rope_theta: float = 10000.0, bias: bool = False, attention_dropout: float = 0.0):
        super().__init__()
        check_positive_int("hidden_size", hidden_size)
        if num_heads is None:
            check_positive_int("head_dim", head_dim)
            num_heads = max(1, hidden_size // head_dim)
        check_positive_int("num_heads", num_heads)
        if hidden_size % num_heads:
            raise ValueError(f"`num_heads`: expected a divisor of hidden_size={hidden_size}, got {num_heads}")
        self.head_dim = hidden_size // num_heads
        if rope and self.head_dim % 2:
            raise ValueError(f"`rope`: needs an even head dimension, got hidden_size / num_heads = {self.head_dim}")
        self.hidden_size, self.layer_idx, self.num_heads = hidden_size, layer_idx, num_heads
        if not 0.0 <= attention_dropout < 1.0:
            raise ValueError(f"`attention_dropout`: expected a probability in [0, 1), got {attention_dropout!r}")
        self.rope, self.rope_theta, self.attention_dropout = rope, rope_theta, float(attention_dropout)
        self.qkv_proj = nn.Linear(hidden_size, 3 * hidden_size, bias=bias)
        self.o_proj = nn.Linear(hidden_size, hidden_size, bias=bias)

    def forward(self, x, lower_bound=None, state=None, use_cache=False, attention_mask=None, cu_seqlens=None):
        """x [B, T, hidden]; state (k, v, valid) from a previous call or None; attention_mask [B, T] 0/1.

        Returns (y [B, T, hidden], (k, v, valid) if use_cache else None).
        """
        check_call(x, self.hidden_size, attention_mask, cu_seqlens)
        B, T, _ = x.shape
        if cu_seqlens is not None and (state is not None or use_cache):
            raise ValueError("`cu_seqlens`: packed sequences cannot be combined with a KV cache (state/use_cache)")
        q, k, v = self.qkv_proj(x).unflatten(-1, (3, self.num_heads, self.head_dim)).unbind(2)
        valid_new = (torch.ones(B, T, dtype=torch.bool, device=x.device) if attention_mask is None
                     else attention_mask.to(torch.bool))
        if state is None:
            k_past = v_past = None
            valid_past = valid_new[:, :0]
        else:
            k_past, v_past, valid_past = state
        if self.rope:
            pos = _positions(valid_past, valid_new, cu_seqlens)
            q, k = rope(q, pos, self.rope_theta), rope(k, pos, self.rope_theta)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, T, e]
        if k_past is not None:
            k, v = torch.cat([k_past.to(k.dtype), k], 2), torch.cat([v_past.to(v.dtype), v], 2)
        valid = torch.cat([valid_past, valid_new], 1)
        # without a mask or a cache every token is real: no check on the device (a host sync, which also
        # rules out CUDA-graph capture)
        mask = _mask(valid, T, cu_seqlens, all_valid=attention_mask is None and state is None)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None and T > 1,
                                           dropout_p=self.attention_dropout if self.training else 0.0)
        y = self.o_proj(y.transpose(1, 2).reshape(B, T, self.hidden_size))
        return y, ((k, v, valid) if use_cache else None)


def _positions(valid_past: torch.Tensor, valid_new: torch.Tensor, cu_seqlens: torch.Tensor | None) -> torch.Tensor:
    """RoPE position of each new token [B, T]: the number of real tokens before it (in its own packed sequence)."""
    count = valid_new.long().cumsum(1) - 1 + valid_past.long().sum(1, keepdim=True)
    if cu_seqlens is not None:  # restart at every sequence start
        count = count - count[:, cu_seqlens[:-1].long()][:, _sequence_ids(cu_seqlens, count.shape[1])]
    return count.clamp(min=0)


def _sequence_ids(cu_seqlens: torch.Tensor, T: int) -> torch.Tensor:
    """[T] index of the packed sequence each position belongs to."""
    starts = torch.zeros(T, dtype=torch.long, device=cu_seqlens.device).index_fill(0, cu_seqlens[1:-1].long(), 1)
    return starts.cumsum(0)


def _mask(valid: torch.Tensor, T: int, cu_seqlens: torch.Tensor | None, all_valid: bool) -> torch.Tensor | None:
    """Boolean SDPA mask [B, 1, T, S] (True = attend), or None when plain causal attention is exact.
    all_valid: the caller knows every token is real (else `valid` is checked)."""
    B, S = valid.shape
    if cu_seqlens is None and (all_valid or bool(valid.all())):
        return None if S == T or T == 1 else _causal(T, S, valid.device)[None, None]
    allowed = _causal(T, S, valid.device)[None] & valid[:, None, :]
    if cu_seqlens is not None:
        seq = _sequence_ids(cu_seqlens, S)
        allowed = allowed & (seq[:, None] == seq[None, :])
    # A padded query may see no real key; letting it see itself keeps softmax finite (its output is unused).
    self_key = torch.arange(S, device=valid.device)[None] == torch.arange(T, device=valid.device)[:, None] + S - T
    return (allowed | self_key)[:, None]


def _causal(T: int, S: int, device) -> torch.Tensor:
    """[T, S] True where key s ≤ query t, queries being the last T of S positions."""
    return torch.ones(T, S, dtype=torch.bool, device=device).tril(S - T)


__all__ = ["Attention"]
