"""`hgrn2.ops.norm` and `hgrn2.ops.swiglu`: the composite's forward bit for bit, exact gradients (fp64 gradcheck),
low-precision gradients no worse than the composite's (also under autocast), and little kept for the backward."""

import pytest
import torch
import torch.nn.functional as F

from hgrn2.bench.common import rel_err
from hgrn2.bench.memory import activation_bytes, saved_tensor_bytes
from hgrn2.models import HGRN2Config, HGRN2ForCausalLM
from hgrn2.ops.norm import layer_norm, rms_norm
from hgrn2.ops.swiglu import swiglu_linear


def rms_composite(x, w, eps):
    dt = torch.promote_types(x.dtype, torch.float32)
    xf = x.to(dt)
    return (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps) * w.to(dt)).to(x.dtype)


def layer_composite(x, w, b, eps):
    dt = torch.promote_types(x.dtype, torch.float32)
    w = None if w is None else w.to(dt)
    b = None if b is None else b.to(dt)
    return F.layer_norm(x.to(dt), x.shape[-1:], w, b, eps).to(x.dtype)


CASES = {  # name: (ours, composite), each a function of (x, weight, bias); swiglu's u is made from x and w
    "rms": (lambda x, w, b: rms_norm(x, w, 1e-5), lambda x, w, b: rms_composite(x, w, 1e-5)),
    "layer": (lambda x, w, b: layer_norm(x, w, b, 1e-5), lambda x, w, b: layer_composite(x, w, b, 1e-5)),
    "layer-no-affine": (lambda x, w, b: layer_norm(x, None, None, 1e-5),
                        lambda x, w, b: layer_composite(x, None, None, 1e-5)),
    "swiglu_linear": (lambda x, w, b: swiglu_linear(x, x.flip(-1) * w.to(x.dtype), proj(x), b.to(x.dtype)),
                      lambda x, w, b: F.linear(F.silu(x) * (x.flip(-1) * w.to(x.dtype)), proj(x), b.to(x.dtype))),
}


def proj(x):
    """swiglu_linear's projection [D, D] for x [..., D] (b is its bias), fixed per D."""
    D = x.shape[-1]
    return (torch.randn(D, D, generator=torch.Generator().manual_seed(D)) / D ** 0.5).to(x.dtype)


def inputs(dtype, D=48):
    x = (torch.randn(3, 7, D) * 2 + 0.5).to(dtype)
    w = (1 + 0.3 * torch.randn(D)).to(torch.float32 if dtype != torch.float64 else dtype)
    b = (0.1 * torch.randn(D)).to(w.dtype)
    return x, w, b


@pytest.mark.parametrize("name", CASES)
def test_gradcheck_fp64(name):
    fn, _ = CASES[name]
    x, w, b = (t.requires_grad_() for t in inputs(torch.float64, D=8))
    assert torch.autograd.gradcheck(fn, (x, w, b))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", CASES)
def test_forward_is_the_composite_and_gradients_as_accurate(name, dtype):
    fn, composite = CASES[name]
    x, w, b = inputs(dtype)
    dy = torch.randn(x.shape).to(dtype)

    def grads(f, args):
        leaves = [a.detach().clone().requires_grad_() for a in args]
        y = f(*leaves)
        y.backward(dy.to(y.dtype))
        return y, [leaf.grad for leaf in leaves]

    y, g = grads(fn, (x, w, b))
    y_c, g_c = grads(composite, (x, w, b))
    y_64, g_64 = grads(composite, (x.double(), w.double(), b.double()))
    assert y.dtype == x.dtype and torch.equal(y, y_c)
    for ours, theirs, exact in zip(g, g_c, g_64):
        if exact is None or exact.abs().max() == 0:
            continue
        assert ours.dtype == theirs.dtype
        assert rel_err(ours, exact) <= max(1.05 * rel_err(theirs, exact), 1e-6)


def test_norms_keep_only_input_and_row_statistics():
    x = torch.randn(4, 64, 256, dtype=torch.bfloat16, requires_grad=True)
    w = torch.ones(256, requires_grad=True)
    for f in (lambda: rms_norm(x, w, 1e-6), lambda: layer_norm(x, w, w, 1e-6)):
        by_kind = saved_tensor_bytes(lambda f=f: f().float().sum().backward(), "cpu", autocast_dtype=None)
        big = {k: n for k, n in by_kind.items() if n >= x.numel()}
        assert big == {"bfloat16 (4, 64, 256)": x.numel() * 2}, by_kind


def test_swiglu_linear_under_autocast_is_nn_linear():
    """fp32 weights, bf16 autocast: the output nn.Linear gives, gradients as accurate as the composite's, and of
    the [.., I] tensors only g and u are kept."""
    g, u = (torch.randn(4, 33, 48, requires_grad=True) for _ in range(2))
    lin = torch.nn.Linear(48, 16)
    dy = torch.randn(4, 33, 16)

    def run(f):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = f()
        return y, torch.autograd.grad(y, (g, u, lin.weight, lin.bias), dy.to(y.dtype))

    y, grads = run(lambda: swiglu_linear(g.bfloat16(), u.bfloat16(), lin.weight, lin.bias))
    y_c, grads_c = run(lambda: lin(F.silu(g.bfloat16()) * u.bfloat16()))
    assert y.dtype == torch.bfloat16 and torch.equal(y, y_c)
    exact = torch.autograd.grad(F.linear(F.silu(g.bfloat16().double()) * u.bfloat16().double(),
                                         lin.weight.bfloat16().double(), lin.bias.bfloat16().double()),
                                (g, u, lin.weight, lin.bias), dy.double(), allow_unused=True)
    for ours, theirs, want in zip(grads, grads_c, exact):
        assert ours.dtype == theirs.dtype
        assert rel_err(ours, want) <= max(1.05 * rel_err(theirs, want), 1e-6)
    gb, ub = (t.detach().bfloat16().requires_grad_() for t in (g, u))
    by_kind = saved_tensor_bytes(lambda: swiglu_linear(gb, ub, lin.weight, lin.bias).sum().backward(), "cpu")
    wide = {k: n for k, n in by_kind.items() if k.endswith("48)") and "(4, 33" in k}
    assert wide == {"bfloat16 (4, 33, 48)": 2 * gb.numel() * 2}, by_kind


def test_bad_shapes_are_clear_errors():
    x = torch.randn(2, 5, 8)
    with pytest.raises(ValueError, match="`weight`: expected shape \\(8,\\)"):
        rms_norm(x, torch.ones(7), 1e-6)
    with pytest.raises(ValueError, match="`bias`"):
        layer_norm(x, torch.ones(8), torch.ones(9), 1e-6)
    with pytest.raises(ValueError, match="`g`, `u`"):
        swiglu_linear(x, x[..., :4], torch.ones(3, 8))
    with pytest.raises(ValueError, match="`weight`: expected \\[out, 8\\]"):
        swiglu_linear(x, x, torch.ones(3, 7))


def test_training_step_activation_memory():
    """The fla-1.3b architecture (head dim 128, SwiGLU, RMSNorm) at a small width, Triton backend, bf16 autocast:
    at most 40 bytes per hidden element per layer kept for the backward (71 with composite norms and SwiGLU and
    an autocast copy of the normalised input per projection)."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    B, T, d, L = 2, 96, 256, 2
    cfg = HGRN2Config.from_preset("fla-1.3b", hidden_size=d, num_hidden_layers=L, vocab_size=1024,
                                  backend="triton")
    model = HGRN2ForCausalLM(cfg).to(dev)
    ids = torch.randint(0, cfg.vocab_size, (B, T), device=dev)
    by_kind = saved_tensor_bytes(lambda: model(ids, labels=ids).loss.backward(), dev)
    act = activation_bytes(by_kind, B, T)
    assert sum(act.values()) / (B * T * d * L) <= 40, act
