"""The Triton RMSNorm, LayerNorm and SwiGLU kernels (`hgrn2.ops.triton.norm`, `.swiglu`) behind
`hgrn2.ops.norm.rms_norm`, `.layer_norm` and `hgrn2.ops.swiglu.swiglu_linear` (the cross-entropy kernels:
tests/ops/test_cross_entropy.py; all three in one model step at the end): outputs and every gradient against the
fp64 composite, no less accurate than the composite in the same dtype, odd sizes, more rows than backward
programs. On the CPU the kernels run in Triton's interpreter (the CUDA-only dispatch is forced)."""

import pytest
import torch
import torch.nn.functional as F

import hgrn2.ops.norm as norm_mod
import hgrn2.ops.swiglu as swiglu_mod
from hgrn2.bench.common import rel_err
from hgrn2.ops.norm import add_rms_norm, layer_norm, rms_norm
from hgrn2.ops.swiglu import swiglu_linear

pytest.importorskip("triton")
DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def use_triton(monkeypatch):
    """Take the Triton path for every float input, on the CPU too (interpreter)."""
    monkeypatch.setattr(norm_mod, "_use_triton", lambda x: x.dtype != torch.float64)
    monkeypatch.setattr(swiglu_mod, "_use_triton", lambda g: g.dtype != torch.float64)


def rms_composite(x, w, eps):
    dt = torch.promote_types(x.dtype, torch.float32)
    xf = x.to(dt)
    return (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps) * w.to(dt)).to(x.dtype)


def run(fn, args, dy):
    leaves = [a.detach().clone().requires_grad_() for a in args]
    y = fn(*leaves)
    y.backward(dy.to(y.dtype))
    return [y] + [leaf.grad for leaf in leaves]


def check_against(ours, composite, exact, dtype):
    """Every tensor of ours within 1e-5 of fp64 (fp32 inputs) or no worse than the composite's (half)."""
    for a, c, e in zip(ours, composite, exact):
        assert a.dtype == c.dtype and a.shape == c.shape
        if dtype == torch.float32:
            assert rel_err(a, e) <= 1e-5
        else:
            assert rel_err(a, e) <= max(1.05 * rel_err(c, e), 1e-3), (rel_err(a, e), rel_err(c, e))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(4, 37, 100), (3, 256)])
def test_rms_norm(use_triton, dtype, shape):
    x = (torch.randn(shape) * 2 + 0.5).to(DEV, dtype)
    w = (1 + 0.3 * torch.randn(shape[-1])).to(DEV)
    dy = torch.randn(shape, device=DEV).to(dtype)
    ours = run(lambda x, w: rms_norm(x, w, 1e-5), (x, w), dy)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(norm_mod, "_use_triton", lambda x: False)
        comp = run(lambda x, w: rms_norm(x, w, 1e-5), (x, w), dy)
    exact = run(lambda x, w: rms_composite(x, w, 1e-5), (x.double(), w.double()), dy.double())
    check_against(ours, comp, exact, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(4, 37, 100), (3, 256), (70, 128)])
@pytest.mark.parametrize("affine", ["weight+bias", "weight", "none"])
def test_layer_norm(use_triton, dtype, shape, affine):
    x = (torch.randn(shape) * 2 + 0.5).to(DEV, dtype)
    params = [(1 + 0.3 * torch.randn(shape[-1])).to(DEV)] if affine != "none" else []
    params += [(0.2 * torch.randn(shape[-1])).to(DEV)] if affine == "weight+bias" else []

    def ln(x, *p):
        return layer_norm(x, *(list(p) + [None, None])[:2], 1e-5)

    dy = torch.randn(shape, device=DEV).to(dtype)
    ours = run(ln, (x, *params), dy)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(norm_mod, "_use_triton", lambda x: False)
        comp = run(ln, (x, *params), dy)
    exact = run(lambda x, *p: F.layer_norm(x, x.shape[-1:], *(list(p) + [None, None])[:2], 1e-5),
                (x.double(), *(p.double() for p in params)), dy.double())
    check_against(ours, comp, exact, dtype)


@pytest.mark.parametrize("dtypes", [(torch.float32, torch.bfloat16, torch.bfloat16),  # the block under autocast
                                    (torch.float32, torch.float32, None), (torch.bfloat16, torch.bfloat16, None),
                                    (torch.float16, torch.float32, torch.float16)])
@pytest.mark.parametrize("shape", [(4, 37, 100), (70, 128)])
def test_add_rms_norm(use_triton, dtypes, shape):
    """(x + res, rms_norm(x + res)) with a gradient flowing into both outputs: the kernels against the composite
    (x + res, then rms_norm, autograd summing r's two gradients) and the fp64 values."""
    x_dt, res_dt, out_dt = dtypes
    x, res = (torch.randn(shape) * 2).to(DEV, x_dt), torch.randn(shape).to(DEV, res_dt)
    w = (1 + 0.3 * torch.randn(shape[-1])).to(DEV)
    dr, dy = torch.randn(shape, device=DEV), torch.randn(shape, device=DEV)

    def fused(x, res, w):
        return add_rms_norm(x, res, w, 1e-5, out_dt)

    def composite(x, res, w):
        r = x + res
        return r, rms_norm(r, w, 1e-5, out_dt)

    def grads(fn, args):
        leaves = [a.detach().clone().requires_grad_() for a in args]
        r, y = fn(*leaves)
        torch.autograd.backward([r, y], [dr.to(r.dtype), dy.to(y.dtype)])
        return [r, y] + [leaf.grad for leaf in leaves]

    ours = grads(fused, (x, res, w))
    with pytest.MonkeyPatch.context() as m:
        m.setattr(norm_mod, "_use_triton", lambda x: False)
        comp = grads(composite, (x, res, w))
        assert all(torch.equal(a, b) for a, b in zip(grads(fused, (x, res, w)), comp))  # the fallback is exact
    exact = grads(lambda x, res, w: (x + res, rms_composite(x + res, w, 1e-5)),
                  (x.double(), res.double(), w.double()))
    for a, c, e in zip(ours, comp, exact):
        assert a.dtype == c.dtype and a.shape == c.shape
        assert rel_err(a, e) <= max(1.05 * rel_err(c, e), 1e-5), (rel_err(a, e), rel_err(c, e))
    with pytest.raises(ValueError, match="`res`: expected x's shape"):
        add_rms_norm(x, res[:1], w, 1e-5)


def test_norm_bwd_more_rows_than_programs():
    """Several row tiles per backward program, the last one partly empty: RMSNorm and LayerNorm."""
    from hgrn2.ops.triton.norm import (
        _bwd_programs,
        _launch_shape,
        layer_norm_bwd,
        layer_norm_fwd,
        rms_norm_bwd,
        rms_norm_fwd,
    )

    cap = _bwd_programs(torch.empty(0, device=DEV), 10**9)  # the most programs on this device
    x = torch.randn(2 * cap * _launch_shape(40)[0] + 45, 40, device=DEV)
    w, b, dy = torch.randn(40, device=DEV), torch.randn(40, device=DEV), torch.randn_like(x)
    xd, wd, bd = (t.double().requires_grad_() for t in (x, w, b))

    y, rstd = rms_norm_fwd(x, w, 1e-6, x.dtype)
    dx, dw = rms_norm_bwd(dy, x, w, rstd)
    rms_composite(xd, wd, 1e-6).backward(dy.double())
    assert rel_err(dx, xd.grad) < 1e-5 and rel_err(dw, wd.grad) < 1e-5

    xd.grad = wd.grad = None
    y2, mean, rstd = layer_norm_fwd(x, w, b, 1e-6)
    dx, dw, db = layer_norm_bwd(dy, x, w, mean, rstd, True)
    want = F.layer_norm(xd, (40,), wd, bd, 1e-6)
    want.backward(dy.double())
    assert rel_err(y2, want) < 1e-6 and rel_err(dx, xd.grad) < 1e-5
    assert rel_err(dw, wd.grad) < 1e-5 and rel_err(db, bd.grad) < 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_swiglu_linear(use_triton, dtype):
    g, u = (torch.randn(3, 37, 100).to(DEV, dtype) for _ in range(2))  # 11100 elements: a partial block
    w = (torch.randn(24, 100) / 10).to(DEV, dtype)
    b = torch.randn(24).to(DEV, dtype)
    dy = torch.randn(3, 37, 24, device=DEV).to(dtype)
    ours = run(swiglu_linear, (g, u, w, b), dy)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(swiglu_mod, "_use_triton", lambda g: False)
        comp = run(swiglu_linear, (g, u, w, b), dy)
    exact = run(lambda g, u, w, b: F.linear(F.silu(g) * u, w, b), (g.double(), u.double(), w.double(), b.double()),
                dy.double())
    check_against(ours, comp, exact, dtype)


def test_swiglu_extreme_gates():
    """silu's derivative at large |g| (σ → 0 or 1) stays finite and exact in fp32."""
    from hgrn2.ops.triton.swiglu import swiglu_bwd, swiglu_fwd

    g = torch.tensor([-100.0, -30.0, -5.0, 0.0, 5.0, 30.0, 100.0], device=DEV)
    u, dp = torch.full_like(g, 0.7), torch.full_like(g, 1.3)
    gd = g.double().requires_grad_()
    p = F.silu(gd) * 0.7
    p.backward(torch.full_like(gd, 1.3))
    # GPUs flush fp32 subnormals (silu(-100) = -3.7e-42) to zero
    tiny = torch.finfo(torch.float32).tiny
    # and their exp is ex2.approx of a rounded g·log2(e): a few 1e-6 relative at |g| = 30, hence rtol 1e-5
    assert torch.allclose(swiglu_fwd(g, u).double(), p, rtol=1e-5, atol=tiny)
    dg, du, p2 = swiglu_bwd(g, u, dp)
    assert torch.isfinite(dg).all()
    assert torch.allclose(dg.double(), gd.grad, rtol=1e-5, atol=tiny)
    assert torch.allclose(du.double(), 1.3 * F.silu(gd), rtol=1e-5) and torch.equal(p2, swiglu_fwd(g, u))


def test_custom_ops_pass_opcheck():
    from hgrn2.ops.triton.norm import (
        add_rms_norm_bwd,
        add_rms_norm_fwd,
        layer_norm_bwd,
        layer_norm_fwd,
        rms_norm_bwd,
        rms_norm_fwd,
    )
    from hgrn2.ops.triton.swiglu import swiglu_bwd, swiglu_fwd

    x, w, dy = torch.randn(5, 24, device=DEV), torch.randn(24, device=DEV), torch.randn(5, 24, device=DEV)
    rstd = rms_norm_fwd(x, w, 1e-6, x.dtype)[1]
    torch.library.opcheck(rms_norm_fwd.op, (x, w, 1e-6, torch.bfloat16))
    torch.library.opcheck(rms_norm_bwd.op, (dy, x, w, rstd))
    _, mean, rstd = layer_norm_fwd(x, w, dy[0], 1e-6)
    torch.library.opcheck(layer_norm_fwd.op, (x, w, dy[0], 1e-6))
    torch.library.opcheck(layer_norm_fwd.op, (x, None, None, 1e-6))
    torch.library.opcheck(layer_norm_bwd.op, (dy, x, w, mean, rstd, True))
    torch.library.opcheck(layer_norm_bwd.op, (dy, x, None, mean, rstd, False))
    r, _, rstd = add_rms_norm_fwd(x, dy.bfloat16(), w, 1e-6, torch.bfloat16)
    torch.library.opcheck(add_rms_norm_fwd.op, (x, dy.bfloat16(), w, 1e-6, torch.bfloat16))
    torch.library.opcheck(add_rms_norm_bwd.op, (dy.bfloat16(), dy, r, w, rstd, torch.float32, torch.bfloat16))
    torch.library.opcheck(swiglu_fwd.op, (x, dy))
    torch.library.opcheck(swiglu_bwd.op, (x, dy, w.expand(5, 24).contiguous()))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_takes_the_kernels():
    x = torch.randn(4, 8, 64, device="cuda", dtype=torch.bfloat16)
    assert norm_mod._use_triton(x) and swiglu_mod._use_triton(x)
    assert not norm_mod._use_triton(x.double()) and not norm_mod._use_triton(x.cpu())


def test_model_training_step_same_with_kernels(monkeypatch):
    """The fla-1.3b architecture (RMSNorm ×3 per layer, SwiGLU, chunked cross entropy) at a tiny width: loss
    and every parameter's gradient with the kernels equal the composite's to fp32 rounding."""
    import hgrn2.ops.cross_entropy as ce_mod
    from hgrn2.models import HGRN2Config, HGRN2ForCausalLM

    cfg = HGRN2Config.from_preset("fla-1.3b", hidden_size=64, num_hidden_layers=2, expand_ratio=32,
                                  vocab_size=97, backend="chunk")
    model = HGRN2ForCausalLM(cfg).to(DEV)
    ids = torch.randint(0, 97, (2, 33), device=DEV)

    def step(kernels):
        monkeypatch.setattr(norm_mod, "_use_triton", lambda x: kernels)
        monkeypatch.setattr(swiglu_mod, "_use_triton", lambda g: kernels)
        monkeypatch.setattr(ce_mod, "_use_triton", lambda h: kernels)
        model.zero_grad()
        loss = model(ids, labels=ids).loss
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    loss_k, grads_k = step(True)
    loss_c, grads_c = step(False)
    assert torch.allclose(loss_k, loss_c, rtol=1e-6)
    for name, g in grads_c.items():
        assert rel_err(grads_k[name], g) < 1e-5, name


def test_mqar_model_training_step_same_with_kernels(monkeypatch):
    """zoology's MQAR model with the HGRN2 mixer (five LayerNorms a step, with weight and bias): loss and every
    parameter's gradient with the LayerNorm kernel equal PyTorch's to fp32 rounding."""
    from hgrn2.models.zoology import ZoologyLM

    torch.manual_seed(0)
    model = ZoologyLM("hgrn2", 32, vocab_size=50, embed_dropout=0.0,
                      mixer_options={"expand_ratio": 16, "norm": "layernorm", "bias": True}).to(DEV)
    ids = torch.randint(0, 50, (2, 21), device=DEV)

    def step(kernels):
        monkeypatch.setattr(norm_mod, "_use_triton", lambda x: kernels)
        model.zero_grad()
        loss = F.cross_entropy(model(ids).flatten(0, 1), ids.flatten())
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    loss_k, grads_k = step(True)
    loss_c, grads_c = step(False)
    assert torch.allclose(loss_k, loss_c, rtol=1e-6)
    for name, g in grads_c.items():
        assert rel_err(grads_k[name], g) < 1e-5, name


@pytest.mark.parametrize("kernels", [False, True])
def test_rms_norm_out_dtype_is_the_cast_fused(monkeypatch, kernels):
    """rms_norm(x, out_dtype=bf16) == rms_norm(x).to(bf16), forward and gradients bit for bit (the block's
    norms hand the fp32 residual to the projections this way under autocast)."""
    monkeypatch.setattr(norm_mod, "_use_triton", lambda x: kernels)
    x = torch.randn(3, 29, 72, device=DEV)
    w = 1 + 0.3 * torch.randn(72, device=DEV)
    dy = torch.randn(3, 29, 72, device=DEV).bfloat16()
    fused = run(lambda x, w: rms_norm(x, w, 1e-6, torch.bfloat16), (x, w), dy)
    cast = run(lambda x, w: rms_norm(x, w, 1e-6).to(torch.bfloat16), (x, w), dy)
    assert fused[0].dtype == torch.bfloat16 and fused[1].dtype == torch.float32
    for a, b in zip(fused, cast):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="`out_dtype`"):
        rms_norm(x, w, 1e-6, torch.int32)


def test_empty_inputs():
    from hgrn2.ops.triton.norm import layer_norm_bwd, layer_norm_fwd, rms_norm_bwd, rms_norm_fwd
    from hgrn2.ops.triton.swiglu import swiglu_bwd, swiglu_fwd

    x, w = torch.randn(0, 8, device=DEV), torch.randn(8, device=DEV)
    y, rstd = rms_norm_fwd(x, w, 1e-6, x.dtype)
    dx, dw = rms_norm_bwd(x, x, w, rstd)
    assert y.shape == dx.shape == (0, 8) and torch.equal(dw, torch.zeros(8, device=DEV))
    y, mean, rstd = layer_norm_fwd(x, w, w, 1e-6)
    dx, dw, db = layer_norm_bwd(x, x, w, mean, rstd, True)
    assert y.shape == dx.shape == (0, 8) and torch.equal(dw, torch.zeros(8, device=DEV)) and torch.equal(dw, db)
    assert swiglu_fwd(x, x).shape == (0, 8) and all(t.shape == (0, 8) for t in swiglu_bwd(x, x, x))


def test_glue_compiles_as_one_graph(use_triton, monkeypatch):
    """torch.compile(fullgraph=True) through the three glue ops (kernels forced; aot_eager, so no compiler is
    needed): no graph break, the eager values and gradients."""
    import hgrn2.ops.cross_entropy as ce_mod
    from hgrn2.ops.cross_entropy import linear_cross_entropy

    monkeypatch.setattr(ce_mod, "_use_triton", lambda h: h.dtype != torch.float64)

    def f(x, w, g, u, wd, wv, labels):
        y = rms_norm(x, w, 1e-6, torch.bfloat16)
        return y.float().sum() + swiglu_linear(g, u, wd).sum() + linear_cross_entropy(x, wv, labels, chunk_size=4)

    torch._dynamo.reset()
    leaves = [torch.randn(*s, device=DEV, requires_grad=True) for s in ((6, 16), (16,), (6, 32), (6, 32), (8, 32),
                                                                       (50, 16))]
    labels = torch.randint(0, 50, (6,), device=DEV)
    eager = f(*leaves, labels)
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)(*leaves, labels)
    torch.testing.assert_close(compiled, eager)
    for a, b in zip(torch.autograd.grad(compiled, leaves), torch.autograd.grad(eager, leaves)):
        torch.testing.assert_close(a, b)
