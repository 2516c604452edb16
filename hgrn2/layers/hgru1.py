"""HGRU1: the token mixer of HGRN (Qin et al., NeurIPS 2023), real and complex, on `hgrn2.ops.hgrn1`.

Real (`HGRU1`), as in the HGRN2 paper's HGRN1 baseline (Doraemonzzz/hgru2-pytorch,
`hgru2_pytorch/modules/hgru1_real_1d.py`, whose `expand_ratio` also gives the "Naive" state expansion):

    i = act_i(i_proj x),  g = f_proj x,  o = act_o(o_proj x)          each [expand · hidden]
    f = β + (1 − β)·σ(g),  h_t = f_t ⊙ h_{t−1} + (1 − f_t) ⊙ i_t
    out = out_proj(norm(h ⊙ o))

Complex (`HGRU1Complex`), as in the HGRN paper and its MQAR runs (Doraemonzzz/hgru-pytorch `hgru/hgru1d.py`
class `Hgru1d`, used by OpenNLPLab/Zoology `zoology/mixers/hgrn1.py`):

    [Re x̃, Im x̃] = silu(input_proj x) (interleaved pairs),  λ = β + (1 − β)·σ(lambda_proj x),  θ learned [d]
    h_t = λ_t e^{iθ} ⊙ h_{t−1} + (1 − λ_t) ⊙ x̃_t
    out = out_proj(LayerNorm([Re h, Im h]) ⊙ silu(gate x))

Both keep a recurrent state of one vector per sequence ([B, expand·d] float32, or [B, d] complex64).
Padded positions (attention_mask = 0) get f = 1 and zero input (and, in the complex HGRU, no rotation), so
they leave the state as it was, wherever they sit and whatever state comes in.
"""

from __future__ import annotations

import math
from collections.abc import Collection

import torch
import torch.nn as nn

from .. import ops
from ..ops.gates import ACTIVATIONS, activate
from .norm import build_norm

PAD_LOGIT = 1e4  # σ(1e4) = 1, σ(−1e4) = 0 exactly in every float dtype: 1 − f = 0, f = 1 (to rounding with β)


def check_choice(name: str, value: object, choices: Collection[object]) -> None:
    if value not in choices:
        raise ValueError(f"`{name}`: expected one of {choices}, got {value!r}")


def check_positive_int(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"`{name}`: expected a positive int, got {value!r}")


def check_call(x: torch.Tensor, hidden_size: int, attention_mask: torch.Tensor | None,
               cu_seqlens: torch.Tensor | None) -> None:
    """Shapes of a mixer call: x [B, T, hidden]; attention_mask [B, T]; not both mask and cu_seqlens."""
    if not isinstance(x, torch.Tensor) or x.ndim != 3 or x.shape[-1] != hidden_size:
        got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"`x`: expected a tensor of shape [batch, seq_len, {hidden_size}], got {got}")
    if attention_mask is not None:
        if tuple(attention_mask.shape) != tuple(x.shape[:2]):
            raise ValueError(f"`attention_mask`: expected shape {tuple(x.shape[:2])} (batch, seq_len), "
                             f"got {tuple(attention_mask.shape)}")
        if cu_seqlens is not None:
            raise ValueError("`attention_mask`: pass either attention_mask (padding) or cu_seqlens (packing)")


def mask_gates(i: torch.Tensor, g: torch.Tensor,
               attention_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero input and f = 1 at padded positions, so the recurrence carries the state through them unchanged."""
    if attention_mask is None:
        return i, g
    keep = attention_mask.to(torch.bool)[..., None]
    return i * keep, g.masked_fill(~keep, PAD_LOGIT)


def check_lower_bound(lower_bound: torch.Tensor | None, hidden_size: int) -> None:
    if lower_bound is not None and tuple(lower_bound.shape) != (hidden_size,):
        raise ValueError(f"`lower_bound`: expected shape ({hidden_size},), got {tuple(lower_bound.shape)}")


class HGRU1(nn.Module):
    """Real HGRU on x [B, T, hidden]; state [B, expand · hidden] float32.

    Options: expand (state channels per hidden channel, 1 = HGRN1), i_act / o_act (None, "silu", "sigmoid"),
    norm ("layernorm", "rmsnorm", None), norm_eps, bias, backend (for `hgrn2.ops.hgrn1`).
    """

    def __init__(self, hidden_size: int, *, layer_idx: int = 0, expand: int = 1, i_act: str | None = "silu",
                 o_act: str | None = "sigmoid", norm: str | None = "layernorm", norm_eps: float = 1e-5,
                 bias: bool = True, backend: str | None = None):
        super().__init__()
        check_positive_int("hidden_size", hidden_size)
        check_positive_int("expand", expand)
        check_choice("i_act", i_act, ACTIVATIONS)
        check_choice("o_act", o_act, ACTIVATIONS)
        self.hidden_size, self.layer_idx, self.expand = hidden_size, layer_idx, expand
        self.i_act, self.o_act, self.backend = i_act, o_act, backend
        inner = expand * hidden_size
        self.i_proj = nn.Linear(hidden_size, inner, bias=bias)
        self.f_proj = nn.Linear(hidden_size, inner, bias=bias)
        self.o_proj = nn.Linear(hidden_size, inner, bias=bias)
        self.norm = build_norm(norm, inner, norm_eps)
        self.out_proj = nn.Linear(inner, hidden_size, bias=bias)

    def forward(self, x: torch.Tensor, lower_bound: torch.Tensor | None = None, state: torch.Tensor | None = None,
                use_cache: bool = False, attention_mask: torch.Tensor | None = None,
                cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x [B, T, hidden]; lower_bound [hidden] (β, repeated over the `expand` copies) or None.

        Returns (y [B, T, hidden], state [N, expand·hidden] float32 if use_cache else None).
        """
        check_call(x, self.hidden_size, attention_mask, cu_seqlens)
        check_lower_bound(lower_bound, self.hidden_size)
        i, g = mask_gates(activate(self.i_proj(x), self.i_act), self.f_proj(x), attention_mask)
        lb = None if lower_bound is None else lower_bound.repeat_interleave(self.expand)
        h, new_state = ops.hgrn1(i, g, lb, initial_state=state, output_final_state=use_cache,
                                 cu_seqlens=cu_seqlens, backend=self.backend)
        y = self.out_proj(self.norm(h * activate(self.o_proj(x), self.o_act)))
        return y, new_state


class HGRU1Complex(nn.Module):
    """Complex HGRU on x [B, T, hidden]; state [B, hidden] complex64.

    θ (`theta` [hidden]) starts at 10000^(−2j/hidden) for channel j and is learned. Options: act (for the input
    and the output gate, default "silu" as in `Hgru1d`), norm, norm_eps, bias, backend.
    """

    def __init__(self, hidden_size: int, *, layer_idx: int = 0, act: str | None = "silu",
                 norm: str | None = "layernorm", norm_eps: float = 1e-5, bias: bool = True,
                 backend: str | None = None):
        super().__init__()
        check_positive_int("hidden_size", hidden_size)
        check_choice("act", act, ACTIVATIONS)
        self.hidden_size, self.layer_idx, self.act, self.backend = hidden_size, layer_idx, act, backend
        self.input_proj = nn.Linear(hidden_size, 2 * hidden_size, bias=bias)
        self.lambda_proj = nn.Linear(hidden_size, hidden_size, bias=bias)
        self.theta = nn.Parameter(torch.empty(hidden_size))
        self.gate = nn.Linear(hidden_size, 2 * hidden_size, bias=bias)
        self.norm = build_norm(norm, 2 * hidden_size, norm_eps)
        self.out_proj = nn.Linear(2 * hidden_size, hidden_size, bias=bias)
        self.reset_theta()

    @torch.no_grad()
    def reset_theta(self) -> None:
        d = self.hidden_size
        self.theta.copy_(torch.exp(-2 * math.log(10000) / d * torch.arange(d, dtype=torch.float64)))

    def forward(self, x: torch.Tensor, lower_bound: torch.Tensor | None = None, state: torch.Tensor | None = None,
                use_cache: bool = False, attention_mask: torch.Tensor | None = None,
                cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x [B, T, hidden]; lower_bound [hidden] or None. Returns (y [B, T, hidden], state [N, hidden] complex64
        if use_cache else None)."""
        check_call(x, self.hidden_size, attention_mask, cu_seqlens)
        check_lower_bound(lower_bound, self.hidden_size)
        u = activate(self.input_proj(x), self.act)
        u = u.to(torch.promote_types(u.dtype, torch.float32)).unflatten(-1, (self.hidden_size, 2))
        i, g = mask_gates(torch.complex(u[..., 0], u[..., 1]), self.lambda_proj(x), attention_mask)
        spin = None
        if attention_mask is not None:
            # f = 1 at a padded position still rotates the state by e^{iθ}. Feeding i_t·e^{iθP_t} (P_t = padded
            # positions so far) makes the op return h_t·e^{iθP_t}, so multiplying back by e^{−iθP_t} is exact.
            skipped = (attention_mask == 0).cumsum(1)[..., None] * self.theta.to(u.dtype)
            spin = torch.polar(torch.ones_like(skipped), skipped)
            i = i * spin
        h, new_state = ops.hgrn1(i, g, lower_bound, theta=self.theta, initial_state=state,
                                 output_final_state=use_cache, cu_seqlens=cu_seqlens, backend=self.backend)
        if spin is not None:
            h = h * spin.conj()
            new_state = None if new_state is None else new_state * spin[:, -1].conj().to(new_state.dtype)
        feature = self.norm(torch.cat([h.real, h.imag], -1).to(x.dtype))
        return self.out_proj(feature * activate(self.gate(x), self.act)), new_state


__all__ = ["HGRU1", "HGRU1Complex"]
