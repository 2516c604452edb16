import pytest
import torch
import torch.nn.functional as F

from hgrn2.bench.common import rel_err
from hgrn2.layers import GLU, HGRU2, TOKEN_MIXERS, RMSNorm, get_token_mixer, glu_intermediate_size

FLA = dict(o_act="silu", i_act=None, scale="auto", norm="rmsnorm")
PAPER = dict(o_act="sigmoid", i_act="silu", scale=1.0, norm="layernorm")


def direct_hgru2(m: HGRU2, x, beta, h0=None):
    """The layer written out from the paper's equations, in float64, one token at a time."""
    x = x.double()
    B, T, D = x.shape
    H, K = m.num_heads, m.head_dim
    act = {None: lambda t: t, "silu": F.silu, "sigmoid": torch.sigmoid}
    o = act[m.o_act](F.linear(x, m.q_proj.weight.double())).view(B, T, H, K)
    f = torch.sigmoid(F.linear(x, m.f_proj.weight.double())).view(B, T, H, K)
    i = act[m.i_act](F.linear(x, m.i_proj.weight.double())).view(B, T, H, K)
    if beta is not None:
        b = beta.double().view(H, K)
        f = b + (1 - b) * f
    h = torch.zeros(B, H, K, K, dtype=torch.float64) if h0 is None else h0.double()  # [B, H, V, K]
    ys = []
    for t in range(T):
        h = h * f[:, t, :, None, :] + i[:, t, :, :, None] * (1 - f[:, t, :, None, :])
        ys.append(torch.einsum("bhvk,bhk->bhv", h, o[:, t]) * m.scale)
    y = torch.stack(ys, 1).reshape(B, T, D)
    if isinstance(m.g_norm, RMSNorm):
        y = y * torch.rsqrt(y.square().mean(-1, keepdim=True) + m.g_norm.eps) * m.g_norm.weight.double()
    else:
        y = F.layer_norm(y, (D,), m.g_norm.weight.double(), m.g_norm.bias.double(), m.g_norm.eps)
    return F.linear(y, m.o_proj.weight.double()), h


def _layer(conv=False, **kw):
    m = HGRU2(32, expand_ratio=8, backend="reference", use_short_conv=conv, **kw)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn_like(p) * 0.3 + (1 if p.ndim == 1 else 0))
    return m


@pytest.mark.parametrize("conv_name", [FLA, PAPER], ids=["fla", "paper"])
@pytest.mark.parametrize("with_bound", [False, True])
def test_layer_matches_direct_fp64(conv_name, with_bound):
    m = _layer(**conv_name).double()
    x = torch.randn(2, 7, 32, dtype=torch.float64, requires_grad=True)
    beta = torch.rand(32, dtype=torch.float64) * 0.99 if with_bound else None
    h0 = torch.randn(2, 4, 8, 8, dtype=torch.float64)
    y, s = m(x, lower_bound=beta, state=h0, use_cache=True)
    yr, sr = direct_hgru2(m, x, beta, h0)
    assert rel_err(y, yr) < 1e-10 and rel_err(s, sr) < 1e-10
    g = torch.randn_like(y)
    grads = torch.autograd.grad((y * g).sum(), [x, *m.parameters()])
    refs = torch.autograd.grad((yr * g).sum(), [x, *m.parameters()])
    for a, b in zip(grads, refs):
        assert rel_err(a, b) < 1e-10


def test_scale_auto_and_head_count():
    m = HGRU2(64, expand_ratio=16)
    assert m.num_heads == 4 and m.scale == pytest.approx(16 ** -0.5)
    assert {n for n, _ in m.named_parameters()} == {"q_proj.weight", "f_proj.weight", "i_proj.weight",
                                                    "g_norm.weight", "o_proj.weight"}


@pytest.mark.parametrize("conv", [False, True])
def test_chunked_calls_with_state_equal_one_call(conv):
    m = _layer(conv=conv, **PAPER)
    x, beta = torch.randn(2, 11, 32), torch.rand(32) * 0.9
    y, s = m(x, lower_bound=beta, use_cache=True)
    y1, s1 = m(x[:, :6], lower_bound=beta, use_cache=True)
    y2, s2 = m(x[:, 6:], lower_bound=beta, state=s1, use_cache=True)
    assert rel_err(torch.cat([y1, y2], 1), y) < 1e-5
    for a, b in zip(s if conv else [s], s2 if conv else [s2]):
        assert rel_err(b, a) < 1e-5


@pytest.mark.parametrize("convention", [FLA, PAPER], ids=["fla", "paper"])
@pytest.mark.parametrize("conv", [False, True])
def test_left_padding_equals_unpadded(convention, conv):
    m = _layer(conv=conv, **convention)
    x, beta = torch.randn(2, 9, 32), torch.rand(32) * 0.9
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :4] = 0
    y, s = m(x, lower_bound=beta, use_cache=True, attention_mask=mask)
    y1, s1 = m(x[1:, 4:], lower_bound=beta, use_cache=True)
    y0, s0 = m(x[:1], lower_bound=beta, use_cache=True)
    assert rel_err(y[1, 4:], y1[0]) < 1e-5 and rel_err(y[0], y0[0]) < 1e-5
    first = lambda st: st[0] if conv else st  # noqa: E731
    assert rel_err(first(s)[1], first(s1)[0]) < 1e-5 and rel_err(first(s)[0], first(s0)[0]) < 1e-5


def test_padding_errors():
    m = _layer()
    x = torch.randn(2, 5, 32)
    right = torch.tensor([[1, 1, 1, 0, 0], [1] * 5])
    with pytest.raises(ValueError, match="attention_mask"):
        m(x, use_cache=True, attention_mask=right)
    m(x, attention_mask=right)  # right padding without a state: fine
    with pytest.raises(ValueError, match="attention_mask"):
        m(x, attention_mask=torch.tensor([[0, 1, 0, 1, 1], [1] * 5]))
    with pytest.raises(ValueError, match="attention_mask"):
        m(x, attention_mask=torch.ones(2, 4))
    left = torch.tensor([[0, 0, 1, 1, 1], [1] * 5])
    with pytest.raises(ValueError, match="zero state"):
        m(x, state=torch.randn(2, 4, 8, 8), attention_mask=left)
    mc = _layer(conv=True)
    conv_state = (torch.zeros(2, 4, 8, 8), torch.randn(2, 32, 3), torch.zeros(2, 32, 3), torch.zeros(2, 32, 3))
    with pytest.raises(ValueError, match="zero state"):
        mc(x, state=conv_state, attention_mask=left)


def test_bad_options():
    with pytest.raises(ValueError, match="expand_ratio"):
        HGRU2(30, expand_ratio=8)
    with pytest.raises(ValueError, match="expand_ratio"):
        HGRU2(32, expand_ratio=0)
    with pytest.raises(ValueError, match="o_act"):
        HGRU2(32, expand_ratio=8, o_act="relu")
    with pytest.raises(ValueError, match="scale"):
        HGRU2(32, expand_ratio=8, scale="big")
    with pytest.raises(ValueError, match="norm"):
        HGRU2(32, expand_ratio=8, norm="batchnorm")


def test_token_mixer_registry():
    assert get_token_mixer("hgrn2") is HGRU2
    assert set(TOKEN_MIXERS) == {"hgrn2", "hgrn1", "hgrn1_complex", "naive", "lr", "glt", "glti", "krp", "kp",
                                 "attention"}
    with pytest.raises(ValueError, match="hgrn1_complex"):
        get_token_mixer("mamba")


def test_glu_and_rmsnorm():
    assert glu_intermediate_size(2048, 4) == 5632 and glu_intermediate_size(1024, 4) == 2816
    g = GLU(16, intermediate_size=24)
    x = torch.randn(3, 16)
    ref = g.down_proj(F.silu(g.gate_proj(x)) * g.up_proj(x))
    assert torch.equal(g(x), ref)
    n = RMSNorm(16, eps=1e-6)
    with torch.no_grad():
        n.weight.normal_()
    xb = torch.randn(4, 16).bfloat16()
    out = n(xb)
    xf = xb.float()
    ref = (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + 1e-6) * n.weight).bfloat16()
    assert out.dtype == torch.bfloat16 and torch.equal(out, ref)


def test_chunk_backend_matches_reference():
    pytest.importorskip("hgrn2.ops.chunk")
    m = _layer(**FLA)
    x, beta = torch.randn(2, 40, 32), torch.rand(32) * 0.99
    y, s = m(x, lower_bound=beta, use_cache=True)
    m.backend = "chunk"
    y2, s2 = m(x, lower_bound=beta, use_cache=True)
    assert rel_err(y2, y) < 1e-5 and rel_err(s2, s) < 1e-5
