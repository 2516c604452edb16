"""HGRN2 ops: the reference against the definition, the chunkwise backend against the fp64 reference."""

import pytest
import torch

from hgrn2.bench.common import rel_err
from hgrn2.ops import (
    DECODE_MAX_T,
    HGRN2_BACKENDS,
    _pick,
    activate,
    clamp_forget_logits,
    hgrn2,
    log_forget,
    lower_bounds_from_logits,
    one_minus_forget,
)


def make(B=2, T=37, H=2, K=8, V=6, *, gscale=3.0, lb=0.5, dtype=torch.float64, state=True, seed=None):
    if seed is not None:
        torch.manual_seed(seed)
    o = torch.randn(B, T, H, K, dtype=dtype)
    g = torch.randn(B, T, H, K, dtype=dtype) * gscale
    i = torch.randn(B, T, H, V, dtype=dtype)
    beta = None if lb is None else torch.rand(H, K, dtype=dtype) * lb
    h0 = torch.randn(B, H, V, K, dtype=dtype) if state else None
    return o, g, i, beta, h0


def test_gate_math_matches_definition():
    g = torch.linspace(-40, 40, 801, dtype=torch.float64)
    beta = torch.tensor([0.0, 0.3, 0.999], dtype=torch.float64)[:, None]
    f = beta + (1 - beta) * torch.sigmoid(g)
    assert torch.allclose(log_forget(g, beta).exp(), f, rtol=1e-12, atol=0)
    # 1 − f computed directly keeps full relative precision where 1 − exp(log f) has none.
    assert torch.allclose(one_minus_forget(g, beta), (1 - beta) * torch.sigmoid(-g), rtol=1e-12, atol=0)
    assert one_minus_forget(torch.tensor(30.0), None) > 0


def test_lower_bounds_cumax():
    beta = lower_bounds_from_logits(torch.randn(6, 10))
    assert torch.all(beta[0] == 0)
    assert torch.all(beta[1:] >= beta[:-1]) and torch.all(beta < 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_lower_bounds_stay_below_one(dtype):
    """A first layer whose share is below the half-ulp at 1 would make the last bound 1 − p0 round to 1."""
    beta = lower_bounds_from_logits(torch.tensor([[-40.0], [0.0], [0.0]], dtype=dtype))
    assert beta[-1] < 1 and beta[-1] > 1 - 2 * torch.finfo(dtype).eps


def test_reference_equals_closed_form():
    """y_t = Σ_{s≤t} (q_t ⊙ Π_{s<r≤t} f_r ⊙ k_s) · v_s + (q_t ⊙ Π_{r≤t} f_r) · h0 — no recurrence involved."""
    o, g, i, beta, h0 = make(B=1, T=9, H=1, K=3, V=2)
    y, _ = hgrn2(o, g, i, beta, initial_state=h0, scale=0.7, backend="reference")
    f = beta + (1 - beta) * torch.sigmoid(g[0, :, 0])
    k, q, v = 1 - f, 0.7 * o[0, :, 0], i[0, :, 0]
    for t in range(9):
        acc = (q[t] * f[: t + 1].prod(0)) @ h0[0, 0].T
        for s in range(t + 1):
            acc = acc + (q[t] * f[s + 1 : t + 1].prod(0) * k[s]).sum() * v[s]
        assert torch.allclose(y[0, t, 0], acc, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("T", [1, 17, 40, 64, 65, 150])
@pytest.mark.parametrize("lb", [None, 0.999])
def test_chunk_matches_reference_fp32(T, lb):
    o, g, i, beta, h0 = make(T=T, lb=lb, seed=T)
    args = dict(scale=0.3, o_act="silu", i_act="sigmoid", output_final_state=True)
    leaves = [x.float().requires_grad_() if x is not None else None for x in (o, g, i, beta, h0)]
    ref = [x.clone().requires_grad_() if x is not None else None for x in (o, g, i, beta, h0)]
    y, s = hgrn2(*leaves[:4], initial_state=leaves[4], backend="chunk", **args)
    yr, sr = hgrn2(*ref[:4], initial_state=ref[4], backend="reference", **args)
    assert y.dtype == torch.float32 and s.dtype == torch.float32
    assert rel_err(y, yr) < 1e-5 and rel_err(s, sr) < 1e-5
    wy, ws = torch.randn_like(yr), torch.randn_like(sr)
    ((y * wy).sum() + (s * ws).sum()).backward()
    ((yr * wy).sum() + (sr * ws).sum()).backward()
    for a, b in zip(leaves, ref):
        if a is not None:
            assert rel_err(a.grad, b.grad) < 1e-4


def test_auto_backend_takes_the_step_loop_only_for_short_inference():
    short, long = torch.randn(2, DECODE_MAX_T, 1, 4), torch.randn(2, DECODE_MAX_T + 1, 1, 4)
    trained = short.clone().requires_grad_()
    assert _pick(None, HGRN2_BACKENDS, short, "chunk", short, None) == "reference"
    assert _pick(None, HGRN2_BACKENDS, long, "chunk", long, None) == "chunk"
    assert _pick(None, HGRN2_BACKENDS, trained, "chunk", trained, None) == "chunk"
    with torch.no_grad():
        assert _pick(None, HGRN2_BACKENDS, trained, "chunk", trained, None) == "reference"


def test_chunk_gradcheck_fp64():
    o, g, i, beta, h0 = make(B=1, T=70, H=1, K=3, V=2, seed=1)
    xs = [x.requires_grad_() for x in (o, g, i, beta, h0)]

    def fn(o, g, i, beta, h0):
        return hgrn2(o, g, i, beta, initial_state=h0, output_final_state=True, o_act="silu", backend="chunk")

    assert torch.autograd.gradcheck(fn, xs, eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("gval", [30.0, -30.0])
@pytest.mark.parametrize("lb", [None, 0.999])
def test_extreme_gates(gval, lb):
    o, g, i, beta, h0 = make(T=130, lb=None, seed=2)
    g = g.sign() * gval if gval < 0 else torch.full_like(g, gval)
    beta = None if lb is None else torch.full_like(o[0, 0], lb)
    xs = [x.float().requires_grad_() if x is not None else None for x in (o, g, i, beta, h0)]
    y, s = hgrn2(*xs[:4], initial_state=xs[4], output_final_state=True, backend="chunk")
    yr, sr = hgrn2(o, g, i, beta, initial_state=h0, output_final_state=True, backend="reference")
    assert torch.isfinite(y).all() and torch.isfinite(s).all()
    assert rel_err(y, yr) < 1e-5 and rel_err(s, sr) < 1e-5
    (y.sum() + s.sum()).backward()
    assert all(torch.isfinite(x.grad).all() for x in xs if x is not None)


def test_long_sequence_bf16_no_nan():
    o, g, i, beta, _ = make(B=1, T=4099, H=2, K=16, V=16, lb=0.99, dtype=torch.float32, state=False, seed=3)
    y, s = hgrn2(o.bfloat16(), g.bfloat16(), i.bfloat16(), beta, output_final_state=True, backend="chunk")
    yr, _ = hgrn2(o.bfloat16().double(), g.bfloat16().double(), i.bfloat16().double(), beta.double(),
                  backend="chunk")
    assert y.dtype == torch.bfloat16 and torch.isfinite(y).all()
    assert rel_err(y, yr) < 2e-2


@pytest.mark.parametrize("backend", ["reference", "chunk"])
def test_varlen_equals_separate_runs(backend):
    o, g, i, beta, _ = make(B=1, T=150, seed=4)
    cu = torch.tensor([0, 5, 70, 71, 150])
    h0 = torch.randn(4, *o.shape[2:3], i.shape[-1], o.shape[-1], dtype=o.dtype)
    y, s = hgrn2(o, g, i, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu, backend=backend)
    for n in range(4):
        sl = slice(cu[n], cu[n + 1])
        yn, sn = hgrn2(o[:, sl], g[:, sl], i[:, sl], beta, initial_state=h0[n : n + 1], output_final_state=True,
                       backend="reference")
        assert rel_err(y[:, sl], yn) < 1e-12 and rel_err(s[n : n + 1], sn) < 1e-12


def test_state_carries_across_calls():
    """Running two halves with the state handed over equals one run: the basis of prefill + decode."""
    o, g, i, beta, _ = make(T=100, state=False, seed=5)
    y, s = hgrn2(o, g, i, beta, output_final_state=True, backend="chunk")
    y1, s1 = hgrn2(o[:, :61], g[:, :61], i[:, :61], beta, output_final_state=True, backend="chunk")
    y2, s2 = hgrn2(o[:, 61:], g[:, 61:], i[:, 61:], beta, initial_state=s1, output_final_state=True,
                   backend="reference")
    assert rel_err(torch.cat([y1, y2], 1), y) < 1e-12 and rel_err(s2, s) < 1e-12


def test_bad_input_errors():
    o, g, i, beta, h0 = make()
    with pytest.raises(ValueError, match="`g`"):
        hgrn2(o, g[:, :-1], i)
    with pytest.raises(ValueError, match="`i`"):
        hgrn2(o, g, i[:, :, :1])
    with pytest.raises(ValueError, match="`o`"):
        hgrn2(o[0], g, i)
    with pytest.raises(ValueError, match="`lower_bound`"):
        hgrn2(o, g, i, beta[:1])
    with pytest.raises(ValueError, match="`initial_state`"):
        hgrn2(o, g, i, beta, initial_state=h0[:1])
    for bad in (h0.to(torch.complex64), h0.long(), h0.bool()):
        with pytest.raises(ValueError, match="`initial_state`"):
            hgrn2(o, g, i, beta, initial_state=bad)
    with pytest.raises(ValueError, match="`cu_seqlens`"):
        hgrn2(o[:1], g[:1], i[:1], cu_seqlens=torch.tensor([0, 20, 10, 37]))
    with pytest.raises(ValueError, match="`cu_seqlens`"):
        hgrn2(o[:1], g[:1], i[:1], cu_seqlens=torch.tensor([0, 20, 30]))
    with pytest.raises(ValueError, match="`cu_seqlens`"):
        hgrn2(o, g, i, cu_seqlens=torch.tensor([0, 37]))
    with pytest.raises(ValueError, match="`backend`"):
        hgrn2(o, g, i, backend="cuda")
    with pytest.raises(ValueError, match="`o_act`"):
        hgrn2(o, g, i, o_act="gelu")
    with pytest.raises(ValueError, match="`o`"):
        hgrn2(o.long(), g, i)


def test_zero_lower_bound_has_finite_gradients():
    o, g, i, _, _ = make(T=20, seed=6)
    beta = torch.zeros(o.shape[2], o.shape[3], dtype=o.dtype, requires_grad=True)
    y, _ = hgrn2(o, g, i, beta, backend="chunk")
    y.sum().backward()
    assert torch.isfinite(beta.grad).all()
    yr, _ = hgrn2(o, g, i, None, backend="reference")
    assert rel_err(y, yr) < 1e-12


@pytest.mark.parametrize("with_bound", [False, True])
def test_clamp_forget_logits(with_bound):
    """log f ≥ m after the clamp; gates already above it unchanged; no gradient where it acts; β ≥ e^m: no-op."""
    m = -3.0
    g = (torch.randn(4, 9, 2, 8, dtype=torch.float64) * 6).requires_grad_()
    beta = torch.rand(2, 8, dtype=torch.float64) * 0.1 if with_bound else None
    if with_bound:
        beta[0, :4] = 0.2  # above e^-3 ≈ 0.0498: these channels never need the clamp
    gc = clamp_forget_logits(g, beta, m)
    lf, lfc = log_forget(g, beta), log_forget(gc, beta)
    assert (lfc >= m - 1e-9).all()
    keep = lf >= m
    assert torch.equal(gc[keep], g[keep]) and (~keep).any() and keep.any()
    assert torch.allclose(lfc[~keep], torch.full_like(lfc[~keep], m), atol=1e-9)
    gc.sum().backward()
    assert torch.equal(g.grad[~keep], torch.zeros_like(g.grad[~keep])) and (g.grad[keep] == 1).all()
    if with_bound:
        assert torch.equal(gc[..., 0, :4], g[..., 0, :4])
    with pytest.raises(ValueError, match="`min_log_forget`"):
        clamp_forget_logits(g, beta, 0.0)


def test_layer_min_log_forget_is_the_op_on_clamped_logits():
    from hgrn2.layers.hgru2 import HGRU2

    torch.manual_seed(0)
    m = HGRU2(16, expand_ratio=8, min_log_forget=-3.0, backend="reference").double()
    plain = HGRU2(16, expand_ratio=8, backend="reference").double()
    plain.load_state_dict(m.state_dict())
    x = torch.randn(2, 7, 16, dtype=torch.float64) * 4
    beta = torch.rand(16, dtype=torch.float64) * 0.1
    with torch.no_grad():  # the plain layer fed the clamped logits by hand
        plain.f_proj.weight.zero_()
        plain.f_proj.bias = torch.nn.Parameter(torch.zeros(16, dtype=torch.float64))
    g = m.f_proj(x)
    gc = clamp_forget_logits(g.view(2, 7, 2, 8), beta.view(2, 8), -3.0).view(2, 7, 16)
    assert not torch.equal(g, gc)  # the clamp acts on this input
    y, _ = m(x, lower_bound=beta)
    o, i = activate(m.q_proj(x), m.o_act), m.i_proj(x)
    y_ref, _ = hgrn2(o.view(2, 7, 2, 8), gc.view(2, 7, 2, 8), i.view(2, 7, 2, 8), beta.view(2, 8),
                     scale=m.scale, o_act=None, i_act=m.i_act, backend="reference")
    assert torch.allclose(y, m.o_proj(m.g_norm(y_ref.reshape(2, 7, 16))), atol=1e-12)
    with pytest.raises(ValueError, match="`min_log_forget`"):
        HGRU2(16, expand_ratio=8, min_log_forget=1.0)
