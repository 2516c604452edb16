"""Parameter-efficient state expansion (PESE) for HGRN1: the alternatives HGRN2's outer product is compared with.

The HGRN2 paper (Qin et al., 2024, arXiv 2404.07904, Table 2) expands HGRN1's state from d to n·d channels with
Naive, LR, GLT, GLTI, KRP and KP maps. The paper gives names, not code; the structures below follow the authors'
exploration code in Doraemonzzz/hgru-pytorch (`hgru/shgru_v19_low_rank.py`, `shgru_v22_group_linear_better_more_
params.py`, `glt_no_share.py`, `glt.py`, `kr.py`, `kronecker.py`) and its successor's
`hgru2_pytorch/modules/hgru1_real_1d.py` (Naive = HGRU1 with every projection widened to n·d). All but Naive
share one frame (x [B, T, d], expanded features laid out as [d, n] → index j·n + k):

    [a, b, o] = in_proj x                                      each [d]
    i = silu(E_i(a)),  g = E_f(b)                              E: R^d → R^{n·d}
    f = β + (1 − β)·σ(g),  h_t = f_t ⊙ h_{t−1} + (1 − f_t) ⊙ i_t   in n·d channels (β repeated over the n copies)
    out = out_proj(norm(C(h) ⊙ σ(o)))                          C: R^{n·d} → R^d

with these expansions E and contractions C (parameters per E, without biases):

    LR    E(x) = U₂U₁x, U₁ [r×d], U₂ [nd×r]                       r·(d + nd)     C = low-rank V₂V₁, [nd→r→d]
    GLT   x split in n groups of d/n; group k ↦ W_k x_k, W_k [d×d/n]     d²     C(h)_j = Σ_k w_k h_{j,k}
    GLTI  GLT after mixing the groups with a learned [n×n] matrix   d² + n²    C as GLT
    KRP   E(x)_{j,k} = x_j·W_{j,k}, W [d×n] (row-wise Khatri–Rao)      n·d    C as GLT
    KP    E(x) = (A x) ⊗ u, A [d×d], u [n] (Kronecker product)       d² + n     C as GLT
    Naive HGRU1(expand=n): i, f, o projections d → n·d, norm over n·d, out_proj n·d → d.

`expand` n defaults to 2, the ratio of the authors' code (and of the "hgrn2_lm_expand2" run in OpenNLPLab/HGRN2).
State: [B, n·d] float32.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .. import ops
from ..ops.gates import activate
from .hgru1 import HGRU1, build_norm, check_call, check_lower_bound, check_positive_int, mask_gates


class LowRank(nn.Sequential):
    """x [..., d_in] → [..., d_out] through rank r: Linear(d_in, r) then Linear(r, d_out)."""

    def __init__(self, d_in: int, d_out: int, rank: int, bias: bool):
        super().__init__(nn.Linear(d_in, rank, bias=bias), nn.Linear(rank, d_out, bias=bias))


class GroupLinear(nn.Module):
    """GLT(I): x [..., d] split in n groups of d/n, (groups mixed by [n×n] if `interact`), group k ↦ W_k x_k ∈ R^d;
    output [..., d·n] with the copy index innermost."""

    def __init__(self, d: int, n: int, interact: bool):
        super().__init__()
        if d % n:
            raise ValueError(f"`expand`: expected a divisor of hidden_size={d} for group linear maps, got {n}")
        self.n = n
        self.weight = nn.Parameter(torch.empty(n, d // n, d))
        nn.init.xavier_uniform_(self.weight)
        self.mix = nn.Parameter(torch.empty(n, n)) if interact else None
        if interact:
            nn.init.xavier_uniform_(self.mix)

    def forward(self, x):
        x = x.unflatten(-1, (self.n, -1))  # [..., n, d/n]
        if self.mix is not None:
            x = torch.einsum("...kc,kl->...lc", x, self.mix)
        return torch.einsum("...kc,kcd->...dk", x, self.weight).flatten(-2)


class KhatriRao(nn.Module):
    """KRP: x [..., d] → [..., d·n], y_{j,k} = x_j·W_{j,k}."""

    def __init__(self, d: int, n: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(d, n))
        nn.init.xavier_uniform_(self.weight)

    def forward(self, x):
        return (x[..., None] * self.weight).flatten(-2)


class Kronecker(nn.Module):
    """KP: x [..., d] → [..., d·n], y = (A x) ⊗ u."""

    def __init__(self, d: int, n: int):
        super().__init__()
        self.proj = nn.Linear(d, d, bias=False)
        self.u = nn.Parameter(torch.randn(n) * 0.1)  # random, as in `kronecker.py`: equal copies would stay equal

    def forward(self, x):
        return (self.proj(x)[..., None] * self.u).flatten(-2)


class CopySum(nn.Module):
    """C: h [..., d·n] → [..., d], a learned weighted sum over the n copies of each channel."""

    def __init__(self, n: int):
        super().__init__()
        self.n = n
        self.weight = nn.Parameter(torch.full((n,), 1.0 / n))

    def forward(self, h):
        return h.unflatten(-1, (-1, self.n)) @ self.weight.to(h.dtype)


class _PESE(nn.Module):
    """The shared frame: in_proj → expand (i, g) → element-wise HGRN recurrence in n·d → contract → gate, norm."""

    def __init__(self, hidden_size: int, *, layer_idx: int = 0, expand: int = 2, norm: str | None = "layernorm",
                 norm_eps: float = 1e-5, bias: bool = True, backend: str | None = None):
        super().__init__()
        check_positive_int("hidden_size", hidden_size)
        check_positive_int("expand", expand)
        self.hidden_size, self.layer_idx, self.expand, self.backend = hidden_size, layer_idx, expand, backend
        self.in_proj = nn.Linear(hidden_size, 3 * hidden_size, bias=bias)
        self.up_i, self.up_f, self.down = self.build(hidden_size, expand, bias)
        self.norm = build_norm(norm, hidden_size, norm_eps)
        self.out_proj = nn.Linear(hidden_size, hidden_size, bias=bias)

    def build(self, d: int, n: int, bias: bool) -> tuple[nn.Module, nn.Module, nn.Module]:
        """(E_i, E_f, C) for this method."""
        raise NotImplementedError

    def forward(self, x, lower_bound=None, state=None, use_cache=False, attention_mask=None, cu_seqlens=None):
        """x [B, T, hidden]; lower_bound [hidden] or None. Returns (y [B, T, hidden], state [N, n·hidden] float32
        if use_cache else None)."""
        check_call(x, self.hidden_size, attention_mask, cu_seqlens)
        check_lower_bound(lower_bound, self.hidden_size)
        a, b, o = self.in_proj(x).chunk(3, dim=-1)
        i, g = mask_gates(activate(self.up_i(a), "silu"), self.up_f(b), attention_mask)
        lb = None if lower_bound is None else lower_bound.repeat_interleave(self.expand)
        h, new_state = ops.hgrn1(i, g, lb, initial_state=state, output_final_state=use_cache,
                                 cu_seqlens=cu_seqlens, backend=self.backend)
        return self.out_proj(self.norm(self.down(h) * torch.sigmoid(o))), new_state


class NaivePESE(HGRU1):
    """Naive expansion: HGRU1 with its i, f, o projections widened to n·d (n = `expand`, default 2)."""

    def __init__(self, hidden_size: int, *, layer_idx: int = 0, expand: int = 2, **options):
        super().__init__(hidden_size, layer_idx=layer_idx, expand=expand, **options)


class LRPESE(_PESE):
    """Low-rank expansion and contraction through rank `rank` (default min(128, hidden), as the authors' gate_dim)."""

    def __init__(self, hidden_size: int, *, rank: int | None = None, **options):
        self.rank = min(128, hidden_size) if rank is None else rank
        check_positive_int("rank", self.rank)
        super().__init__(hidden_size, **options)

    def build(self, d, n, bias):
        r = self.rank
        return LowRank(d, n * d, r, bias), LowRank(d, n * d, r, bias), LowRank(n * d, d, r, bias)


class GLTPESE(_PESE):
    """Group linear transformation (n groups of d/n channels, each mapped to d); needs n | d."""

    def build(self, d, n, bias):
        return GroupLinear(d, n, interact=False), GroupLinear(d, n, interact=False), CopySum(n)


class GLTIPESE(_PESE):
    """Group linear transformation with interaction: groups mixed by a learned n×n matrix first; needs n | d."""

    def build(self, d, n, bias):
        return GroupLinear(d, n, interact=True), GroupLinear(d, n, interact=True), CopySum(n)


class KRPPESE(_PESE):
    """Khatri–Rao product expansion: channel j copied n times with learned scales W[j, :]."""

    def build(self, d, n, bias):
        return KhatriRao(d, n), KhatriRao(d, n), CopySum(n)


class KPPESE(_PESE):
    """Kronecker product expansion: (A x) ⊗ u with A [d×d], u [n]."""

    def build(self, d, n, bias):
        return Kronecker(d, n), Kronecker(d, n), CopySum(n)


__all__ = ["NaivePESE", "LRPESE", "GLTPESE", "GLTIPESE", "KRPPESE", "KPPESE"]
