"""PESE (paper Table 2): each expansion's parameter count, and each variant against an fp64 step loop written
from the paper's equations (its Einstein sums, the element-wise HGRN recurrence, the sum over the n copies)."""

import pytest
import torch
import torch.nn.functional as F

from hgrn2.bench.common import rel_err
from hgrn2.layers.pese import GLTIPESE, GLTPESE, KPPESE, KRPPESE, LRPESE, NaivePESE

D, N = 12, 3
VARIANTS = {"naive": NaivePESE, "lr": LRPESE, "glt": GLTPESE, "glti": GLTIPESE, "krp": KRPPESE, "kp": KPPESE}


def table2_count(name: str, d: int, n: int, r: int) -> int:
    """Table 2's parameter count of one map (KRP also has its dense d × d factor, see hgrn2.layers.pese)."""
    return {"naive": n * d * d, "lr": d * r * (n + 1), "glt": d * d, "glti": d * d + n * n, "krp": n * d + d * d,
            "kp": d * d + n}[name]


@pytest.mark.parametrize("name", list(VARIANTS))
@pytest.mark.parametrize("bias", [True, False])
def test_parameter_count(name, bias):
    m = VARIANTS[name](D, expand=N, bias=bias)
    r = D // (N + 1)
    per_map = table2_count(name, D, N, r) + (N * D if bias else 0)
    frame = D * D + (D if bias else 0) + 2 * D  # out_proj, LayerNorm
    assert sum(p.numel() for p in m.parameters()) == 3 * per_map + frame
    for up in (m.up_f, m.up_i, m.up_o):  # three independent maps: g, i and o each expanded
        assert sum(p.numel() for p in up.parameters()) == per_map


def test_defaults():
    assert GLTPESE(16).expand == 4 and LRPESE(40).rank == 8 and LRPESE(90, expand=8).rank == 10


def expand_reference(name: str, up, x: torch.Tensor) -> torch.Tensor:
    """Table 2's Einstein sums on x [T, d] → [T, n, d]."""
    n, d = up.n, up.d
    if name == "naive":
        y = torch.einsum("td,ed->te", x, up.weight).view(-1, n, d)
    elif name == "lr":
        y = torch.einsum("tr,er->te", torch.einsum("td,rd->tr", x, up.down), up.up).view(-1, n, d)
    elif name in ("glt", "glti"):
        xg = x.view(-1, n, d // n)
        if name == "glti":
            xg = torch.einsum("tle,kl->tke", xg, up.mix)
        y = torch.einsum("tke,ked->tkd", xg, up.weight)
    else:  # krp: w [n, d]; kp: u [n, 1]
        y = torch.einsum("td,ed->te", x, up.weight)[:, None, :] * up.scale
    return y + (0 if up.bias is None else up.bias.view(n, d))


def reference(name: str, m, x: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """f = β + (1 − β)σ(g), h_t = f ⊙ h_{t−1} + (1 − f) ⊙ SiLU(i), y_t = Σ_k h_t[k] ⊙ σ(o_t[k]), one step at a time."""
    out = []
    for xb in x:
        g, i, o = (expand_reference(name, up, xb) for up in (m.up_f, m.up_i, m.up_o))
        h = torch.zeros_like(g[0])
        ys = []
        for t in range(len(xb)):
            f = beta + (1 - beta) * torch.sigmoid(g[t])
            h = f * h + (1 - f) * F.silu(i[t])
            ys.append((h * torch.sigmoid(o[t])).sum(0))
        out.append(torch.stack(ys))
    y = torch.stack(out)
    return m.out_proj(F.layer_norm(y, (m.hidden_size,), m.norm.weight, m.norm.bias, m.norm.eps))


@pytest.mark.parametrize("name", list(VARIANTS))
def test_matches_the_papers_equations_in_fp64(name):
    torch.manual_seed(0)
    m = VARIANTS[name](D, expand=N, backend="reference").double()
    for p in m.parameters():  # away from the initial values (identity mix, zero biases) so every term matters
        p.data += 0.3 * torch.randn_like(p)
    x, beta = torch.randn(2, 7, D, dtype=torch.float64), torch.rand(D, dtype=torch.float64) * 0.9
    y, _ = m(x, beta)
    assert rel_err(y, reference(name, m, x, beta)) < 1e-12
