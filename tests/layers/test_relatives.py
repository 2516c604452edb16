"""HGRN2's relatives as token mixers: HGRU1 (real, complex), the PESE variants and softmax attention."""

import math

import pytest
import torch
import torch.nn.functional as F

from hgrn2.bench.common import rel_err
from hgrn2.layers.attention import Attention
from hgrn2.layers.hgru1 import HGRU1, HGRU1Complex
from hgrn2.layers.pese import GLTIPESE, GLTPESE, KPPESE, KRPPESE, LRPESE, NaivePESE

D = 16
MIXERS = {
    "hgrn1": (HGRU1, {}),
    "hgrn1_rms_expand": (HGRU1, dict(expand=2, norm="rmsnorm", i_act=None, o_act="silu", bias=False)),
    "hgrn1_complex": (HGRU1Complex, {}),
    "naive": (NaivePESE, {}),
    "lr": (LRPESE, dict(rank=4)),
    "glt": (GLTPESE, {}),
    "glti": (GLTIPESE, dict(expand=4)),
    "krp": (KRPPESE, dict(expand=3)),
    "kp": (KPPESE, {}),
    "attention": (Attention, dict(num_heads=2)),
    "attention_norope": (Attention, dict(num_heads=4, rope=False)),
}


def build(name, dtype=torch.float64):
    cls, options = MIXERS[name]
    torch.manual_seed(1)
    return cls(D, layer_idx=1, **options).to(dtype)


def inputs(B=2, T=13, dtype=torch.float64):
    return torch.randn(B, T, D, dtype=dtype), torch.rand(D, dtype=dtype) * 0.9


def assert_close(a, b, tol=1e-10):
    if isinstance(a, tuple):
        for x, y in zip(a, b):
            assert_close(x, y, tol)
        return
    if a.dtype == torch.bool:
        assert torch.equal(a, b)
        return
    a, b = (torch.view_as_real(t) if t.is_complex() else t for t in (a, b))
    assert a.shape == b.shape and rel_err(a, b) < tol


@pytest.mark.parametrize("name", list(MIXERS))
def test_forward_backward_shapes(name):
    m = build(name, torch.float32)
    x, lb = inputs(dtype=torch.float32)
    x.requires_grad_(True)
    y, state = m(x, lb)
    assert y.shape == x.shape and y.dtype == x.dtype and state is None
    y.square().sum().backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    for pname, p in m.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), pname


@pytest.mark.parametrize("name", list(MIXERS))
def test_decode_equals_full_forward(name):
    m = build(name)
    x, lb = inputs(T=11)
    y, final = m(x, lb, use_cache=True)
    y_pre, state = m(x[:, :5], lb, use_cache=True)  # prefill, then one token at a time
    ys = [y_pre]
    for t in range(5, 11):
        yt, state = m(x[:, t:t + 1], lb, state=state, use_cache=True)
        ys.append(yt)
    assert_close(torch.cat(ys, 1), y)
    assert_close(state, final)


@pytest.mark.parametrize("name", list(MIXERS))
def test_left_padding(name):
    m = build(name)
    x, lb = inputs(B=3, T=12)
    lengths = [12, 7, 1]
    mask = torch.zeros(3, 12, dtype=torch.long)
    for b, n in enumerate(lengths):
        mask[b, 12 - n:] = 1
    junk = torch.randn_like(x) * 50
    xp = torch.where(mask[..., None].bool(), x, junk)
    y, state = m(xp, lb, use_cache=True, attention_mask=mask)
    x_next = torch.randn(3, 2, D, dtype=x.dtype)
    y_next, _ = m(x_next, lb, state=state)  # decoding after a padded prompt
    for b, n in enumerate(lengths):
        ref, ref_state = m(x[b:b + 1, 12 - n:], lb, use_cache=True)
        assert_close(y[b:b + 1, 12 - n:], ref)
        ref_next, _ = m(x_next[b:b + 1], lb, state=ref_state)
        assert_close(y_next[b:b + 1], ref_next)


@pytest.mark.parametrize("name", list(MIXERS))
def test_padding_after_a_state_leaves_it_unchanged(name):
    """Padded positions in a later call (state ≠ 0) are skipped exactly: f = 1 and no input there."""
    m = build(name)
    x, lb = inputs(B=2, T=9)
    _, state = m(x[:, :5], lb, use_cache=True)
    mask = torch.ones(2, 4, dtype=torch.long)
    mask[1, :2] = 0
    chunk = torch.where(mask[..., None].bool(), x[:, 5:], torch.randn_like(x[:, 5:]) * 50)
    y, new_state = m(chunk, lb, state=state, use_cache=True, attention_mask=mask)
    _, state1 = m(x[1:, :5], lb, use_cache=True)
    ref, ref_state = m(x[1:, 7:], lb, state=state1, use_cache=True)
    assert_close(y[1:, 2:], ref)
    if not isinstance(new_state, tuple):  # attention keeps the padded keys, masked
        assert_close(new_state[1:], ref_state)
    y_next, _ = m(x[:, 8:], lb, state=new_state)
    assert_close(y_next[1:], m(x[1:, 8:], lb, state=ref_state)[0])


@pytest.mark.parametrize("name", list(MIXERS))
def test_packed_sequences_equal_separate(name):
    m = build(name)
    x, lb = inputs(B=1, T=20)
    cu = torch.tensor([0, 6, 7, 20])
    y, _ = m(x, lb, cu_seqlens=cu)
    for s, e in zip(cu[:-1].tolist(), cu[1:].tolist()):
        assert_close(y[:, s:e], m(x[:, s:e], lb)[0])


def test_lower_bound_is_used_and_ignored_by_attention():
    x, lb = inputs()
    for name in ("hgrn1", "hgrn1_complex", "glt"):
        m = build(name)
        assert rel_err(m(x, lb)[0], m(x)[0]) > 1e-3
    m = build("attention")
    assert torch.equal(m(x, lb)[0], m(x)[0])


def test_hgru1_complex_matches_the_authors_parameterisation():
    """An independent real/imaginary step loop written after `Hgru1d.forward_naive` (Doraemonzzz/hgru-pytorch)."""
    m = build("hgrn1_complex")
    x, lb = inputs(T=9)
    inp = F.silu(m.input_proj(x))
    re_in, im_in = inp[..., 0::2], inp[..., 1::2]  # rearrange("... (e k) -> ... e k", k=2)
    lam = lb + (1 - lb) * torch.sigmoid(m.lambda_proj(x))
    g_re, g_im = lam * torch.cos(m.theta), lam * torch.sin(m.theta)
    re_in, im_in = (1 - lam) * re_in, (1 - lam) * im_in
    hr = hi = torch.zeros(2, D, dtype=x.dtype)
    feats = []
    for t in range(9):
        hr, hi = g_re[:, t] * hr - g_im[:, t] * hi + re_in[:, t], g_re[:, t] * hi + g_im[:, t] * hr + im_in[:, t]
        feats.append(torch.cat([hr, hi], -1))
    ref = m.out_proj(m.norm(torch.stack(feats, 1)) * F.silu(m.gate(x)))
    assert_close(m(x, lb)[0], ref)
    d = torch.arange(D, dtype=torch.float64)
    assert torch.allclose(m.theta, 10000 ** (-2 * d / D))


def test_hgru1_matches_definition():
    m = build("hgrn1")
    x, lb = inputs(T=7)
    i, o = F.silu(m.i_proj(x)), torch.sigmoid(m.o_proj(x))
    f = lb + (1 - lb) * torch.sigmoid(m.f_proj(x))
    h, hs = torch.zeros(2, D, dtype=x.dtype), []
    for t in range(7):
        h = f[:, t] * h + (1 - f[:, t]) * i[:, t]
        hs.append(h)
    assert_close(m(x, lb)[0], m.out_proj(m.norm(torch.stack(hs, 1) * o)))


def test_attention_matches_explicit_softmax():
    m = build("attention_norope")
    x, _ = inputs(T=9)
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :3] = 0
    q, k, v = m.qkv_proj(x).unflatten(-1, (3, 4, 4)).unbind(2)
    scores = torch.einsum("bthe,bshe->bhts", q, k) / math.sqrt(4)
    allowed = torch.ones(9, 9, dtype=torch.bool).tril()[None, None] & mask.bool()[:, None, None, :]
    p = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    ref = m.o_proj(torch.einsum("bhts,bshe->bthe", p, v).reshape(2, 9, D))
    y, _ = m(x, attention_mask=mask)
    assert_close(y[0], ref[0])
    assert_close(y[1, 3:], ref[1, 3:])


def test_attention_dropout_drops_attention_weights_in_training_only():
    """zoology's MHA (its MQAR runs: 0.1): dropout on the attention probabilities, rescaled by 1/(1 − p)."""
    torch.manual_seed(0)
    m = Attention(D, num_heads=1, rope=False, attention_dropout=0.5).double()
    x = torch.randn(2, 9, D, dtype=torch.float64)
    m.eval()
    y_eval, _ = m(x)
    plain = Attention(D, num_heads=1, rope=False).double()
    plain.load_state_dict(m.state_dict())
    assert_close(y_eval, plain.train()(x)[0])  # eval: no dropout at all
    m.train()
    draws = torch.stack([m(x)[0] for _ in range(400)])
    assert not torch.allclose(draws[0], y_eval)  # weights dropped
    # unbiased: the mean over draws approaches the eval output (the o_proj is linear), and spreads less than a draw
    err_mean = (draws.mean(0) - y_eval).norm() / y_eval.norm()
    err_draw = (draws[0] - y_eval).norm() / y_eval.norm()
    assert err_mean < 0.25 * err_draw
    with pytest.raises(ValueError, match="`attention_dropout`"):
        Attention(D, attention_dropout=1.0)


def test_rope_is_relative():
    """RoPE is a rotation (norms kept) and q·k depends only on the position difference."""
    from hgrn2.layers.attention import rope
    x = torch.randn(1, 5, 2, 8, dtype=torch.float64)
    pos = torch.arange(5)[None]
    r = rope(x, pos, 10000.0)
    assert torch.allclose(r.norm(dim=-1), x.norm(dim=-1))
    a, b = rope(x, pos + 7, 10000.0), rope(x, pos + 3, 10000.0)
    assert torch.allclose((a[:, 1:] * a[:, :-1]).sum(-1), (b[:, 1:] * b[:, :-1]).sum(-1))


@pytest.mark.parametrize("build_bad", [
    lambda: HGRU1(D, expand=0),
    lambda: HGRU1(D, norm="batchnorm"),
    lambda: HGRU1(D, i_act="relu"),
    lambda: HGRU1Complex(D, act="tanh"),
    lambda: GLTPESE(D, expand=3),
    lambda: LRPESE(D, rank=0),
    lambda: KRPPESE(D, expand=1.5),
    lambda: Attention(D, num_heads=3),
    lambda: Attention(6, num_heads=2),
])
def test_bad_options(build_bad):
    with pytest.raises(ValueError, match="`"):
        build_bad()


@pytest.mark.parametrize("name", ["hgrn1", "krp", "attention"])
def test_bad_calls(name):
    m = build(name)
    x, lb = inputs()
    with pytest.raises(ValueError, match="`x`"):
        m(x[..., :-1])
    with pytest.raises(ValueError, match="`attention_mask`"):
        m(x, attention_mask=torch.ones(2, 12))
    if name != "attention":
        with pytest.raises(ValueError, match="`lower_bound`"):
            m(x, lb[:-1])


@pytest.mark.parametrize("name", ["hgrn1_complex", "krp", "attention"])
def test_low_precision_runs(name):
    m = build(name, torch.bfloat16)
    x, lb = inputs(dtype=torch.bfloat16)
    y, state = m(x, lb.float(), use_cache=True)
    ref, _ = build(name)(x.double(), lb.double())
    assert y.dtype == torch.bfloat16 and rel_err(y, ref) < 5e-2
