"""HGRU2: the HGRN2 token mixer (gated linear RNN with outer-product state expansion).

    o = act_o(q_proj x),  g = f_proj x,  i = act_i(i_proj x)          per head: [K] gates, [V] input, V = K
    f = β + (1 − β)·σ(g),  h_t = h_{t−1}·Diag(f_t) + i_t ⊗ (1 − f_t),  y_t = scale · h_t·o_t
    out = o_proj(g_norm(y))

Projections are named as in fla (`q_proj` is the output gate, playing GLA's query). Both conventions load:
fla's checkpoints use o_act="silu", i_act=None, scale=K**-0.5, RMSNorm; the paper uses o_act="sigmoid",
i_act="silu", scale=1. The lower bound β is owned by the model (one row of Γ per layer) and passed in.
`min_log_forget` (off by default) raises the logits so that log f ≥ it, as the authors' MQAR code clamps the
log decay at −3 (`ops.gates.clamp_forget_logits`).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from .. import ops
from ..ops.gates import ACTIVATIONS, activate, check_min_log_forget
from ..ops.projection import linears, rms_norm_linears
from .conv import ShortConv
from .norm import RMSNorm, build_norm

# the op's [B, H, V, K] state, or (state, q_conv, f_conv, i_conv) with short convolutions
HGRU2State = torch.Tensor | tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


class HGRU2(nn.Module):
    """HGRN2 mixer on x [B, T, hidden]; H = hidden / expand_ratio heads of state [V, K] = [e, e].

    The recurrent state (`state` in / out) is the op's [B, H, V, K] float32 tensor, or the tuple
    (recurrent, q_conv, f_conv, i_conv) when `use_short_conv` (conv states [B, D, conv_size − 1]).
    """

    def __init__(self, hidden_size: int, *, layer_idx: int = 0, expand_ratio: int = 128, o_act: str | None = "silu",
                 i_act: str | None = None, scale: float | str = "auto", norm: str | None = "rmsnorm",
                 norm_eps: float = 1e-5, bias: bool = False, use_short_conv: bool = False, conv_size: int = 4,
                 min_log_forget: float | None = None, backend: str | None = None):
        super().__init__()
        if not isinstance(expand_ratio, int) or expand_ratio <= 0:
            raise ValueError(f"`expand_ratio`: expected a positive int, got {expand_ratio!r}")
        if hidden_size % expand_ratio:
            raise ValueError(f"`expand_ratio`: expected a divisor of hidden_size={hidden_size} "
                             f"(heads = hidden_size / expand_ratio), got {expand_ratio}")
        for name, act in (("o_act", o_act), ("i_act", i_act)):
            if act not in ACTIVATIONS:
                raise ValueError(f"`{name}`: expected one of {ACTIVATIONS}, got {act!r}")
        if scale == "auto":
            scale = expand_ratio ** -0.5
        if isinstance(scale, bool) or not isinstance(scale, int | float) or not math.isfinite(scale):
            raise ValueError(f"`scale`: expected 'auto' or a finite number, got {scale!r}")
        self.hidden_size, self.layer_idx = hidden_size, layer_idx
        self.num_heads, self.head_dim = hidden_size // expand_ratio, expand_ratio
        self.o_act, self.i_act, self.scale, self.backend = o_act, i_act, float(scale), backend
        if min_log_forget is not None:
            check_min_log_forget(min_log_forget)
        self.min_log_forget = min_log_forget
        self.q_proj = nn.Linear(hidden_size, hidden_size, bias=bias)
        self.f_proj = nn.Linear(hidden_size, hidden_size, bias=bias)
        self.i_proj = nn.Linear(hidden_size, hidden_size, bias=bias)
        self.use_short_conv = use_short_conv
        if use_short_conv:
            self.q_conv1d = ShortConv(hidden_size, conv_size)
            self.f_conv1d = ShortConv(hidden_size, conv_size)
            self.i_conv1d = ShortConv(hidden_size, conv_size)
        self.g_norm = build_norm(norm, hidden_size, norm_eps)
        self.o_proj = nn.Linear(hidden_size, hidden_size, bias=bias)

    def forward(self, x: torch.Tensor, lower_bound: torch.Tensor | None = None, state: HGRU2State | None = None,
                use_cache: bool = False, attention_mask: torch.Tensor | None = None,
                cu_seqlens: torch.Tensor | None = None, prenorm: tuple | None = None
                ) -> tuple[torch.Tensor, HGRU2State | None] | tuple[torch.Tensor, HGRU2State | None, torch.Tensor]:
        """x [B, T, hidden]; lower_bound [hidden] or None; attention_mask [B, T] 0/1 (left padding).

        prenorm: (norm, res, out_dtype) with norm an RMSNorm and res [B, T, hidden] or None: x is then the residual
        stream before the block's pre-norm, which this call applies, r = x + res (or x) and h = norm(r, out_dtype),
        in decoding as one kernel with the q/f/i projections.

        Returns (y [B, T, hidden], new state or None), and r last with prenorm.
        """
        if not isinstance(x, torch.Tensor) or x.ndim != 3 or x.shape[-1] != self.hidden_size:
            raise ValueError(f"`x`: expected a [batch, seq_len, {self.hidden_size}] tensor, got "
                             f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
        if lower_bound is not None and tuple(lower_bound.shape) != (self.hidden_size,):
            raise ValueError(f"`lower_bound`: expected shape ({self.hidden_size},), got {tuple(lower_bound.shape)}")
        projs = (self.q_proj, self.f_proj, self.i_proj)
        weights, biases = [p.weight for p in projs], [p.bias for p in projs]
        if prenorm is None:
            q, f, i = linears(x, weights, biases)
            return self._mix(q, f, i, lower_bound, state, use_cache, attention_mask, cu_seqlens)
        norm, res, out_dtype = prenorm
        r, (q, f, i) = rms_norm_linears(x, norm.weight, norm.eps, weights, biases, res=res, out_dtype=out_dtype)
        return *self._mix(q, f, i, lower_bound, state, use_cache, attention_mask, cu_seqlens), r

    def _mix(self, q: torch.Tensor, f: torch.Tensor, i: torch.Tensor, lower_bound: torch.Tensor | None = None,
             state: HGRU2State | None = None, use_cache: bool = False, attention_mask: torch.Tensor | None = None,
             cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, HGRU2State | None]:
        """Everything after the q/f/i projections [B, T, hidden]."""
        B, T, D = q.shape
        H, K = self.num_heads, self.head_dim
        rec, convs = (state, (None,) * 3) if not isinstance(state, tuple) else (state[0], state[1:])
        i_act = self.i_act
        keep = _padding_keep(attention_mask, q, state, cu_seqlens, use_cache)
        if keep is not None and self.use_short_conv:
            # zero the raw projections so padding looks like the conv's start-of-sequence zeros
            q, f, i = q * keep, f * keep, i * keep
        new_convs = (None,) * 3
        if self.use_short_conv:
            if cu_seqlens is not None:
                raise ValueError("`cu_seqlens`: packed sequences are not supported with use_short_conv=True")
            (q, cq), (f, cf), (i, ci) = (conv(t, s) for conv, t, s in
                                         zip((self.q_conv1d, self.f_conv1d, self.i_conv1d), (q, f, i), convs))
            new_convs = (cq, cf, ci)
        if keep is not None:
            # Padded tokens must leave the state untouched. With left padding the state is zero up to the first
            # real token (checked in `_padding_keep`), so a zero input there keeps it zero: h = 0·f + 0 ⊗ (1 − f).
            # The input activation is applied here because act(0) need not be 0 (sigmoid).
            i, i_act = activate(i, i_act) * keep, None
        lb = None if lower_bound is None else lower_bound.view(H, K)
        if self.min_log_forget is not None:
            f = ops.clamp_forget_logits(f.view(B, T, H, K), lb, self.min_log_forget)
        y, new_rec = ops.hgrn2(q.view(B, T, H, K), f.view(B, T, H, K), i.view(B, T, H, K), lb, scale=self.scale,
                               o_act=self.o_act, i_act=i_act, initial_state=rec, output_final_state=use_cache,
                               cu_seqlens=cu_seqlens, backend=self.backend)
        y = y.reshape(B, T, D)
        if isinstance(self.g_norm, RMSNorm):  # norm and projection as one kernel in decoding
            out = rms_norm_linears(y, self.g_norm.weight, self.g_norm.eps, (self.o_proj.weight,),
                                   (self.o_proj.bias,))[1][0]
        else:
            out = self.o_proj(self.g_norm(y))
        if not use_cache:
            return out, None
        return out, ((new_rec, *new_convs) if self.use_short_conv else new_rec)


def _padding_keep(mask: torch.Tensor | None, x: torch.Tensor, state,
                  cu_seqlens: torch.Tensor | None, use_cache: bool) -> torch.Tensor | None:
    """[B, T, 1] 0/1 multiplier for the input at padded positions, or None when nothing is padded.

    Left padding (zeros, then ones, per row) keeps the state exact, provided a row padded in this call starts
    from a zero state (as in `generate`, where padding sits in the prompt). Right padding is accepted only when
    no state flows in or out (training, classification): outputs at real tokens are exact, the state is not.
    """
    if mask is None:
        return None
    if mask.shape != x.shape[:2]:
        raise ValueError(f"`attention_mask`: expected shape {tuple(x.shape[:2])} (batch, seq_len), "
                         f"got {tuple(mask.shape)}")
    if cu_seqlens is not None:
        raise ValueError("`attention_mask`: pass either attention_mask (padding) or cu_seqlens (packing), not both")
    m = mask.to(torch.bool)
    if bool(m.all()):
        return None
    left = not bool((m[:, 1:] < m[:, :-1]).any())
    right = not bool((m[:, 1:] > m[:, :-1]).any())
    if not left and (use_cache or state is not None or not right):
        raise ValueError("`attention_mask`: expected left padding (per row: zeros, then ones), or right padding "
                         "without a recurrent state in or out (use_cache=False); other padding would change the "
                         "state")
    if state is not None:
        padded = ~m[:, 0]
        states = state if isinstance(state, tuple) else (state,)
        if any(bool(s[padded].ne(0).any()) for s in states if s is not None):
            raise ValueError("`attention_mask`: padded rows must start from a zero state; pad only the first call")
    return m.unsqueeze(-1).to(x.dtype)
