"""The small-batch projection kernels (`hgrn2.ops.triton.gemv`) and their dispatch in `hgrn2.ops.projection`:
against the fp64 products, odd sizes (N, K not multiples of any block), 1–4 rows, with and without biases, one to
three weights per launch and the SwiGLU pair; no less accurate than F.linear in the same dtype; the layers take
them only without a backward. On the CPU the kernels run in Triton's interpreter (the CUDA-only dispatch is forced).
"""

import pytest
import torch
import torch.nn.functional as F

import hgrn2.ops.projection as proj
from hgrn2.bench.common import rel_err

pytest.importorskip("triton")
from hgrn2.ops.norm import add_rms_norm  # noqa: E402
from hgrn2.ops.triton.gemv import MAX_ROWS, gemv, gemv_swiglu  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def use_gemv(monkeypatch):
    """Take the kernels for every eligible float input, on the CPU too (interpreter)."""
    monkeypatch.setattr(proj, "use_glue_kernels", lambda x: x.dtype != torch.float64)


def tensors(m, n, k, count, dtype, bias):
    x = torch.randn(m, k, device=DEV).to(dtype)
    ws = [(torch.randn(n, k, device=DEV) / k**0.5).to(dtype) for _ in range(count)]
    bs = [torch.randn(n, device=DEV).to(dtype) for _ in range(count)] if bias else []
    return x, ws, bs


def test_max_rows_matches_dispatch():
    assert proj.MAX_GEMV_ROWS == MAX_ROWS


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("m,n,k,count,bias", [(1, 37, 70, 1, False), (3, 16, 129, 3, True), (4, 9, 64, 2, False),
                                              (2, 16, 128, 1, True), (4, 130, 33, 3, False)])
def test_gemv_against_fp64(m, n, k, count, bias, dtype):
    x, ws, bs = tensors(m, n, k, count, dtype, bias)
    ys = gemv(x, ws, bs, None, None, 0.0)
    assert len(ys) == count
    for j, (y, w) in enumerate(zip(ys, ws)):
        ref = x.double() @ w.double().t() + (bs[j].double() if bias else 0)
        same_dtype = F.linear(x, w, bs[j] if bias else None)
        assert y.dtype == dtype and y.shape == (m, n)
        # one rounding of an fp32 sum, as F.linear: no worse than it (plus an ulp of slack for the sum's order)
        assert rel_err(y, ref) <= max(1.5 * rel_err(same_dtype, ref), 2 * torch.finfo(dtype).eps)


@pytest.mark.parametrize("bias", [False, True])
def test_gemv_swiglu_against_fp64(bias):
    x, (wg, wu), bs = tensors(4, 45, 100, 2, torch.bfloat16, bias)
    g = x.double() @ wg.double().t() + (bs[0].double() if bias else 0)
    u = x.double() @ wu.double().t() + (bs[1].double() if bias else 0)
    ref = F.silu(g) * u
    y, = gemv_swiglu(x, wg, wu, bs, None, None, 0.0)
    # the product of unrounded fp32 sums, rounded once: within bf16's rounding of the result
    assert y.shape == (4, 45) and rel_err(y, ref) < 2 * torch.finfo(torch.bfloat16).eps


def rms_fp64(r, gamma, eps=1e-5):
    r = r.double()
    return r * torch.rsqrt(r.square().mean(-1, keepdim=True) + eps) * gamma.double()


@pytest.mark.parametrize("swiglu", [False, True])
@pytest.mark.parametrize("m,n,k", [(1, 24, 64), (3, 37, 70)])
def test_norm_prologue_against_fp64(m, n, k, swiglu):
    """r = x + res (rounded to x's dtype, as the add), h = rms_norm(r)·gamma, then the projections: the kernel
    writes r and the outputs."""
    x, ws, _ = tensors(m, n, k, 2, torch.bfloat16, False)
    res = torch.randn_like(x)
    gamma = 1 + 0.3 * torch.randn(k, device=DEV)
    r_ref = (x + res).double()
    h = rms_fp64(r_ref, gamma)
    if swiglu:
        y, r = gemv_swiglu(x, ws[0], ws[1], [], res, gamma, 1e-5)
        ref = F.silu(h @ ws[0].double().t()) * (h @ ws[1].double().t())
        outs, refs = [y], [ref]
    else:
        *outs, r = gemv(x, ws, [], res, gamma, 1e-5)
        refs = [h @ w.double().t() for w in ws]
    assert torch.equal(r, x + res)
    for y, ref in zip(outs, refs):
        # unrounded h: within bf16's rounding of the result (the unfused path also rounds h)
        assert rel_err(y, ref) < 2 * torch.finfo(torch.bfloat16).eps
    ys = gemv(x, ws[:1], [], None, gamma, 1e-5)  # a norm without a residual
    assert len(ys) == 1 and rel_err(ys[0], rms_fp64(x, gamma) @ ws[0].double().t()) < 2 * torch.finfo(
        torch.bfloat16).eps


def test_layers_take_the_kernels_only_without_backward(use_gemv, monkeypatch):
    calls = []
    import hgrn2.ops.triton.gemv as kernels

    for name in ("gemv", "gemv_swiglu"):
        fn = getattr(kernels, name)
        monkeypatch.setattr(kernels, name, lambda *a, _fn=fn, _n=name: calls.append(_n) or _fn(*a))
    x, (wq, wf, wi), _ = tensors(2, 24, 24, 3, torch.bfloat16, False)
    x, res = x[:, None], torch.randn(2, 1, 24, device=DEV).to(torch.bfloat16)
    gamma = torch.rand(24, device=DEV) + 0.5
    gate, up = (torch.randn(40, 24, device=DEV).to(torch.bfloat16) for _ in range(2))
    down = torch.randn(24, 40, device=DEV).to(torch.bfloat16)

    def run(x, res):
        outs = proj.linears(x, (wq, wf, wi))
        r1, normed = proj.rms_norm_linears(x, gamma, 1e-5, (wq, wf, wi), res=res)
        r2, mlp = proj.rms_norm_swiglu_mlp(x, gamma, 1e-5, gate, up, down, res=res)
        return outs, r1, normed, r2, mlp

    with torch.no_grad():
        fast = run(x, res)
    assert calls == ["gemv", "gemv", "gemv_swiglu", "gemv"]
    calls.clear()
    plain = run(x.clone().requires_grad_(), res)  # autograd: the unfused ops
    assert calls == []
    for a, b in zip((*fast[0], fast[1], *fast[2], fast[3], fast[4]), (*plain[0], plain[1], *plain[2], plain[3],
                                                                       plain[4])):
        assert a.shape == b.shape and rel_err(a, b.detach()) < 2e-2
    r, _ = add_rms_norm(x, res, gamma, 1e-5)
    assert torch.equal(fast[1], r) and torch.equal(fast[3], r)
    with torch.no_grad():
        proj.linears(torch.randn(MAX_ROWS + 1, 1, 24, device=DEV).to(torch.bfloat16), (wq, wf, wi))  # too many rows
        proj.linears(x, (wq, wf, wi), (wq[0], None, None))  # a bias for one weight only
        proj.linears(x[..., :20], (wq[:, :20],))  # a strided weight
    assert calls == []
    with torch.no_grad():  # a residual in fp32: the norm runs on its own, the projection still in the kernel
        proj.rms_norm_linears(x, gamma, 1e-5, (wq,), res=res.float(), out_dtype=x.dtype)
    assert calls == ["gemv"]


def test_decode_logits_match_without_kernels(use_gemv, monkeypatch):
    """A tiny model's decode step through the kernels gives the logits of the plain path."""
    from hgrn2.models import HGRN2Config, HGRN2ForCausalLM

    cfg = HGRN2Config(hidden_size=64, num_hidden_layers=2, expand_ratio=16, intermediate_size=96, vocab_size=50)
    model = HGRN2ForCausalLM(cfg).to(DEV).to(torch.bfloat16).eval()
    ids = torch.randint(0, 50, (2, 5), device=DEV)

    def step():
        with torch.no_grad():
            out = model(ids, use_cache=True)
            cache = out.past_key_values if hasattr(out, "past_key_values") else out.cache
            return model(ids[:, -1:], use_cache=True, past_key_values=cache).logits

    fast = step()
    monkeypatch.setattr(proj, "use_glue_kernels", lambda x: False)
    plain = step()
    assert rel_err(fast, plain) < 2e-2


def test_dispatch_leaves_what_the_kernel_cannot_take(use_gemv):
    """More weights than the kernel's three, a strided bias, a bias of the wrong length, weights on another device:
    the unfused path (right values, or its error), never the kernel on pointers it would misread."""
    x, ws, _ = tensors(2, 8, 16, 4, torch.float32, False)
    with torch.no_grad():
        for y, w in zip(proj.linears(x, ws), ws):  # four weights of one shape
            assert torch.allclose(y, F.linear(x, w))
        b = torch.randn(8, 3, device=DEV)[:, 1]  # a column: stride 3
        y, = proj.linears(x, ws[:1], (b,))
        assert torch.allclose(y, F.linear(x, ws[0], b))
        with pytest.raises(ValueError, match="biases"):
            proj.rms_norm_linears(x, torch.ones(16, device=DEV), 1e-5, ws[:1], (torch.randn(3, device=DEV),))
    meta = ws[0].to("meta")
    assert not proj._use_gemv(x, (meta,), (None,))
    assert not proj._use_gemv(x, ws[:1], (None,), res=x.to("meta"))
    assert not proj._use_gemv(x, ws[:1], (None,), norm_weight=torch.ones(16, device="meta"))
