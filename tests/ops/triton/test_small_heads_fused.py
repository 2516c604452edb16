"""`hgrn2_small_heads` on Triton against the fp64 step loop: output and every gradient (o, g, i, β), heads of 1 to 8
(K = V and K ≠ V, not powers of two), both scan directions and both summed, bf16 and fp32 inputs, saturated gates;
and the LRA model on the fused kernel against its torch path."""

import pytest
import torch

from hgrn2.models.lra import LRAClassifier, LRAModelConfig
from hgrn2.ops import hgrn2, hgrn2_small_heads
from hgrn2.ops.triton.small_heads import hgrn2_small_heads_triton

from .harness import DEV, TOL, gpu, needs_triton, rel_err

pytestmark = needs_triton


def _reference(o, g, i, lb, *, scale, o_act, reverse, bidirectional):
    def run(rev):
        return hgrn2(o, g, i, lb, scale=scale, o_act=o_act, reverse=rev, backend="reference")[0]
    return run(False) + run(True) if bidirectional else run(reverse)


def _compare(B, T, H, K, V, *, dtype=torch.float32, lb=(0.05, 0.95), g=None, scale=0.7, o_act="sigmoid",
             reverse=False, bidirectional=False, block_heads=0, chunk_size=0):
    """fn's y and gradients within the dtype's tolerance of the fp64 reference's (g: fixed logits, else random)."""
    o = torch.randn(B, T, H, K, device=DEV)
    g = torch.randn(B, T, H, K, device=DEV) * 2 if g is None else g
    i = torch.randn(B, T, H, V, device=DEV)
    beta = None if lb is None else lb[0] + (lb[1] - lb[0]) * torch.rand(H, K, device=DEV)
    inputs = [o.to(dtype), g.to(dtype), i.to(dtype), beta]
    leaves = [None if x is None else x.clone().requires_grad_() for x in inputs]
    refs = [None if x is None else x.detach().double().requires_grad_() for x in inputs]
    kw = dict(scale=scale, o_act=o_act, reverse=reverse, bidirectional=bidirectional)
    kw_tri = dict(block_heads=block_heads, chunk_size=chunk_size)
    y = hgrn2_small_heads_triton(*leaves, **kw_tri, **kw)
    y_ref = _reference(*refs, **kw)
    assert y.dtype == dtype and y.shape == (B, T, H, V)
    tol = TOL[dtype]
    assert rel_err(y, y_ref) <= tol, f"y: {rel_err(y, y_ref):.2e}"
    dy = torch.randn_like(y_ref)
    (y.double() * dy).sum().backward()
    (y_ref * dy).sum().backward()
    for name, x, x_ref in zip(("o", "g", "i", "lower_bound"), leaves, refs):
        if x is None:
            continue
        assert x.grad.dtype == x.dtype and torch.isfinite(x.grad).all(), f"d{name}"
        assert rel_err(x.grad, x_ref.grad) <= tol, f"d{name}: {rel_err(x.grad, x_ref.grad):.2e}"
    with torch.no_grad():  # without autograd the forward keeps no states: the same output
        assert torch.equal(hgrn2_small_heads_triton(*inputs, **kw_tri, **kw), y.detach())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("K", [1, 2, 4, 8])
def test_square_heads(K, dtype):
    _compare(2, 7, 3, K, K, dtype=dtype)


@pytest.mark.parametrize("K,V", [(2, 8), (8, 1), (3, 5)])
def test_rectangular_heads(K, V):
    _compare(1, 7, 3, K, V, o_act="silu")


@pytest.mark.parametrize("reverse,bidirectional", [(True, False), (False, True)], ids=["reverse", "both"])
@pytest.mark.parametrize("o_act", [None, "silu"])
def test_directions(reverse, bidirectional, o_act):
    _compare(2, 5, 3, 4, 4, o_act=o_act, reverse=reverse, bidirectional=bidirectional, block_heads=2)


@pytest.mark.parametrize("reverse,bidirectional", [(False, False), (True, False), (False, True)],
                         ids=["forward", "reverse", "both"])
def test_time_chunks(reverse, bidirectional):
    """Time cut into chunks of 3 steps (the last one short): states and gradients carried across them."""
    _compare(2, 8, 2, 2, 4, lb=(0.5, 0.99), reverse=reverse, bidirectional=bidirectional, chunk_size=3)


@pytest.mark.parametrize("beta", [0.0, 1e-6, 0.999, None])
def test_saturated_gates(beta):
    """g at ±80 (f → 1 and f → β) next to ordinary logits, β at its edges or absent."""
    B, T, H, K = 1, 7, 2, 4
    g = torch.randn(B, T, H, K, device=DEV) * 2
    g[:, ::3] = 80.0
    g[:, 1::3, :, :2] = -80.0
    _compare(B, T, H, K, K, g=g, lb=None if beta is None else (beta, beta), bidirectional=True)


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_default_launch_at_lra_length(dtype):
    """The LRA mixer's shape (16 heads of 4 × 4, 1000 tokens) on the launch the kernel picks: chunked in time."""
    _compare(4, 1000, 16, 4, 4, dtype=dtype, bidirectional=True)


def test_checks():
    o = torch.randn(1, 3, 2, 4)
    with pytest.raises(ValueError, match="`o`: expected heads of K and V at most 8"):
        hgrn2_small_heads(torch.randn(1, 3, 2, 9), torch.randn(1, 3, 2, 9), o)
    with pytest.raises(ValueError, match="`reverse`: expected False with bidirectional=True"):
        hgrn2_small_heads(o, o, o, reverse=True, bidirectional=True)
    with pytest.raises(ValueError, match="`bidirectional`: expected a bool"):
        hgrn2_small_heads(o, o, o, bidirectional=1)
    with pytest.raises(ValueError, match="`backend`"):
        hgrn2_small_heads(o, o, o, backend="chunk")
    empty = torch.randn(0, 3, 2, 4, requires_grad=True)
    y = hgrn2_small_heads(empty, empty, empty, backend="triton")
    assert y.shape == (0, 3, 2, 4)
    y.sum().backward()
    assert empty.grad.shape == empty.shape


@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")  # σ of the padding's 1e4
@pytest.mark.parametrize("directions", ["bi", "2d"])
def test_lra_model_fused_equals_torch_path(directions):
    """The tiny LRA model (4 heads of 2 × 2, padding masked, lower bounds learnt) gives the same logits and
    gradients on the fused kernel as on HGRN1's element-wise scan."""
    torch.manual_seed(0)
    cfg = LRAModelConfig(num_classes=3, vocab_size=11, hidden_size=4, num_layers=2, directions=directions,
                         norm="layer", expand_ratio=2)
    model = LRAClassifier(cfg).to(DEV)
    ids = torch.randint(2, 11, (2, 9), device=DEV)
    mask = torch.ones(2, 9, dtype=torch.bool, device=DEV)
    mask[0, 7:] = False
    with torch.no_grad():  # a non-zero bound for layer 1
        model.encoder.lower_bounds.normal_()
    results = []
    for backend in ("scan", "triton"):
        for layer in model.encoder.layers:
            layer.mixer.backend = backend
        model.zero_grad()
        logits = model(ids, mask)
        logits.square().sum().backward()
        results.append((logits.detach(), [p.grad.clone() for p in model.parameters()]))
    (want, want_grads), (got, got_grads) = results
    assert rel_err(got, want) <= 1e-5
    for a, b in zip(got_grads, want_grads):
        assert rel_err(a, b) <= 1e-4
