"""Parameter-efficient state expansion (PESE): the structured expansions HGRN2's outer product is compared with.

The HGRN2 paper (Qin et al., COLM 2024, §3.1, Table 2 "PESE methods" and Table 3 "PESE Ablation") scales HGRN1's
state from d to n·d channels. Each of HGRN1's dense projections U, V, W: R^d → R^d is replaced by a structured
map E: R^d → R^{n·d}, so that every one of the n copies has its own forget gate, input and output gate:

    g_t = E_g(x_t) + b_u,   i_t = SiLU(E_i(x_t) + b_v),   o_t = σ(E_o(x_t) + b_w)            each in R^{n·d}
    f_t = β + (1 − β) ⊙ σ(g_t)                       β: the layer's lower bound [d], the same for every copy
    h_t = f_t ⊙ h_{t−1} + (1 − f_t) ⊙ i_t             element-wise, in n·d channels
    y_t = Σ_k (h_t ⊙ o_t)[k]  ∈ R^d                  "we simply sum over the dimension corresponding to n"
    out = out_proj(norm(y_t))

The maps, in the paper's Einstein notation (input x [d], copy index k < n, channel j < d; "(n e)" splits d into
n groups of e = d/n):

    Naive  d, (d nd) → nd              y = U x, U [nd×d]                                   n·d²
    LR     d, (d r, r nd) → nd         y = U₂ U₁ x, U₁ [r×d], U₂ [nd×r]                     d·r·(n+1)
    GLT    (n e), (n e d) → n d        y_k = W_k x_k, W_k [d×e]                             d²
    GLTI   (n e), (n e d, n n) → n d   y_k = W_k Σ_l M_{kl} x_l, M [n×n]                    d² + n²
    KRP    d, (n d) → n d              y_{k,j} = w_{k,j} (A x)_j, w [n×d]                   n·d (+ d² for A)
    KP     d, (d d, n) → n d           y_{k,j} = u_k (A x)_j, A [d×d], u [n]                d² + n

LR's rank defaults to d // (n + 1), the paper's "d·r·(n+1) ≈ d²". Table 2 counts only KRP's w [n×d]; Table 3
lists KRP at the same 386M as KP, which needs the dense A [d×d] that KP has too, so KRP here is w ⊙ (A x).
Each map also has a bias [n·d] (the paper's b_u, b_v, b_w) unless bias=False. n (`expand`) is 4 by default, the
ablation's ratio (LR also ran with 8). The layout of the n·d channels is copy-major (index k·d + j).
State: [B, n·d] float32.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn as nn

from .. import ops
from ..ops.gates import activate
from .hgru1 import build_norm, check_call, check_lower_bound, check_positive_int, mask_gates


def _normal(p: nn.Parameter, fan_in: int) -> None:
    nn.init.normal_(p, std=1 / math.sqrt(fan_in))


class Expansion(nn.Module):
    """E: x [..., d] → [..., n·d] (copy-major), plus an optional bias [n·d]. Subclasses define `expand`."""

    def __init__(self, d: int, n: int, bias: bool):
        super().__init__()
        self.d, self.n = d, n
        self.bias = nn.Parameter(torch.zeros(n * d)) if bias else None

    def expand(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def init_weights(self) -> None:
        raise NotImplementedError

    def reset_parameters(self) -> None:
        self.init_weights()
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.expand(x)
        return y if self.bias is None else y + self.bias.to(y.dtype)


class Dense(Expansion):
    """Naive: y = U x with U [n·d × d]."""

    def __init__(self, d: int, n: int, bias: bool):
        super().__init__(d, n, bias)
        self.weight = nn.Parameter(torch.empty(n * d, d))
        self.reset_parameters()

    def init_weights(self) -> None:
        _normal(self.weight, self.d)

    def expand(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.to(x.dtype).T


class LowRank(Expansion):
    """LR: y = U₂ U₁ x with U₁ [r × d], U₂ [n·d × r]."""

    def __init__(self, d: int, n: int, bias: bool, rank: int):
        super().__init__(d, n, bias)
        self.down = nn.Parameter(torch.empty(rank, d))
        self.up = nn.Parameter(torch.empty(n * d, rank))
        self.reset_parameters()

    def init_weights(self) -> None:
        _normal(self.down, self.d)
        _normal(self.up, self.down.shape[0])

    def expand(self, x: torch.Tensor) -> torch.Tensor:
        return (x @ self.down.to(x.dtype).T) @ self.up.to(x.dtype).T


class GroupLinear(Expansion):
    """GLT: x split into n groups of e = d/n channels, y_k = W_k x_k with W_k [d × e]; with `interact` (GLTI) the
    groups are first mixed by a learned M [n × n] (identity at initialisation): y_k = W_k Σ_l M_{kl} x_l."""

    def __init__(self, d: int, n: int, bias: bool, interact: bool):
        if d % n:
            raise ValueError(f"`expand`: expected a divisor of hidden_size={d} for group linear maps, got {n}")
        super().__init__(d, n, bias)
        self.weight = nn.Parameter(torch.empty(n, d // n, d))
        self.mix = nn.Parameter(torch.empty(n, n)) if interact else None
        self.reset_parameters()

    def init_weights(self) -> None:
        _normal(self.weight, self.d // self.n)
        if self.mix is not None:
            nn.init.eye_(self.mix)

    def expand(self, x: torch.Tensor) -> torch.Tensor:
        x = x.unflatten(-1, (self.n, -1))  # [..., n, e]
        if self.mix is not None:
            x = torch.einsum("...le,kl->...ke", x, self.mix.to(x.dtype))
        return torch.einsum("...ke,ked->...kd", x, self.weight.to(x.dtype)).flatten(-2)


class Scaled(Expansion):
    """KRP (`per_channel`): y_{k,j} = w_{k,j} (A x)_j, w [n × d]; KP: y_{k,j} = u_k (A x)_j, u [n]. A [d × d]."""

    def __init__(self, d: int, n: int, bias: bool, per_channel: bool):
        super().__init__(d, n, bias)
        self.weight = nn.Parameter(torch.empty(d, d))
        self.scale = nn.Parameter(torch.empty(n, d) if per_channel else torch.empty(n, 1))
        self.reset_parameters()

    def init_weights(self) -> None:
        _normal(self.weight, self.d)
        nn.init.normal_(self.scale, mean=1.0, std=0.5)  # unequal copies: equal ones would stay equal

    def expand(self, x: torch.Tensor) -> torch.Tensor:
        return ((x @ self.weight.to(x.dtype).T)[..., None, :] * self.scale.to(x.dtype)).flatten(-2)


class PESE(nn.Module):
    """The shared frame (module docstring): expand g, i, o to n·d, element-wise HGRN recurrence, sum the copies.

    Options: expand n (default 4), norm ("layernorm", "rmsnorm", None), norm_eps, bias, backend (for
    `hgrn2.ops.hgrn1`). Subclasses define `expansion(d, n, bias)`.
    """

    def __init__(self, hidden_size: int, *, layer_idx: int = 0, expand: int = 4, norm: str | None = "layernorm",
                 norm_eps: float = 1e-5, bias: bool = True, backend: str | None = None):
        super().__init__()
        check_positive_int("hidden_size", hidden_size)
        check_positive_int("expand", expand)
        self.hidden_size, self.layer_idx, self.expand, self.backend = hidden_size, layer_idx, expand, backend
        self.up_f, self.up_i, self.up_o = (self.expansion(hidden_size, expand, bias) for _ in range(3))
        self.norm = build_norm(norm, hidden_size, norm_eps)
        self.out_proj = nn.Linear(hidden_size, hidden_size, bias=bias)

    def expansion(self, d: int, n: int, bias: bool) -> Expansion:
        raise NotImplementedError

    def forward(self, x: torch.Tensor, lower_bound: torch.Tensor | None = None, state: torch.Tensor | None = None,
                use_cache: bool = False, attention_mask: torch.Tensor | None = None,
                cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x [B, T, hidden]; lower_bound [hidden] or None. Returns (y [B, T, hidden], state [N, n·hidden] float32
        if use_cache else None)."""
        check_call(x, self.hidden_size, attention_mask, cu_seqlens)
        check_lower_bound(lower_bound, self.hidden_size)
        i, g = mask_gates(activate(self.up_i(x), "silu"), self.up_f(x), attention_mask)
        lb = None if lower_bound is None else lower_bound.repeat(self.expand)  # copy-major: β for every copy
        h, new_state = ops.hgrn1(i, g, lb, initial_state=state, output_final_state=use_cache,
                                 cu_seqlens=cu_seqlens, backend=self.backend)
        y = (h * torch.sigmoid(self.up_o(x))).unflatten(-1, (self.expand, -1)).sum(-2)
        return self.out_proj(self.norm(y)), new_state


class NaivePESE(PESE):
    """Naive: dense d → n·d maps (n·d² parameters each)."""

    def expansion(self, d: int, n: int, bias: bool) -> Expansion:
        return Dense(d, n, bias)


class LRPESE(PESE):
    """Low rank: d → r → n·d, rank `rank` (default d // (n + 1), so that d·r·(n+1) ≈ d²)."""

    def __init__(self, hidden_size: int, *, rank: int | None = None, expand: int = 4, **options: Any) -> None:
        self.rank = max(1, hidden_size // (expand + 1)) if rank is None else rank
        check_positive_int("rank", self.rank)
        super().__init__(hidden_size, expand=expand, **options)

    def expansion(self, d: int, n: int, bias: bool) -> Expansion:
        return LowRank(d, n, bias, self.rank)


class GLTPESE(PESE):
    """Group linear transformation (n groups of d/n channels, each mapped to d); needs n | d."""

    def expansion(self, d: int, n: int, bias: bool) -> Expansion:
        return GroupLinear(d, n, bias, interact=False)


class GLTIPESE(PESE):
    """Group linear transformation with interaction (groups mixed by a learned n × n matrix); needs n | d."""

    def expansion(self, d: int, n: int, bias: bool) -> Expansion:
        return GroupLinear(d, n, bias, interact=True)


class KRPPESE(PESE):
    """Khatri–Rao product: copy k of channel j is w_{k,j} (A x)_j."""

    def expansion(self, d: int, n: int, bias: bool) -> Expansion:
        return Scaled(d, n, bias, per_channel=True)


class KPPESE(PESE):
    """Kronecker product: (A x) ⊗ u."""

    def expansion(self, d: int, n: int, bias: bool) -> Expansion:
        return Scaled(d, n, bias, per_channel=False)


__all__ = ["PESE", "NaivePESE", "LRPESE", "GLTPESE", "GLTIPESE", "KRPPESE", "KPPESE"]
