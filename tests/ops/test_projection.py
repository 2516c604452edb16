"""`hgrn2.ops.projection.linears`: several projections of one input as one autograd node."""

import pytest
import torch
import torch.nn.functional as F

from hgrn2.ops.projection import linears


def _params(sizes, d, bias, dtype=torch.float64):
    ws = [torch.randn(n, d, dtype=dtype, requires_grad=True) for n in sizes]
    bs = [torch.randn(n, dtype=dtype, requires_grad=True) if b else None for n, b in zip(sizes, bias)]
    return ws, bs


@pytest.mark.parametrize("bias", [(False, False, False), (True, False, True)])
def test_matches_separate_linears_with_gradients(bias):
    torch.manual_seed(0)
    x = torch.randn(3, 5, 8, dtype=torch.float64, requires_grad=True)
    ws, bs = _params((8, 4, 6), 8, bias)
    ys = linears(x, ws, bs)
    refs = [F.linear(x, w, b) for w, b in zip(ws, bs)]
    for y, r in zip(ys, refs):
        assert y.is_contiguous() and torch.allclose(y, r)
    dys = [torch.randn_like(r) for r in refs]
    leaves = [x, *ws, *(b for b in bs if b is not None)]
    ours = torch.autograd.grad(ys, leaves, dys)
    ref = torch.autograd.grad(refs, leaves, dys)
    for a, b in zip(ours, ref):
        assert torch.allclose(a, b)


def test_unused_output_and_frozen_weight():
    torch.manual_seed(1)
    x = torch.randn(7, 8, dtype=torch.float64, requires_grad=True)
    ws, bs = _params((8, 4), 8, (True, True))
    ws[0].requires_grad_(False)
    y0, y1 = linears(x, ws, bs)
    y1.square().sum().backward()  # y0 unused: its weight and bias get no gradient
    assert bs[0].grad is None and ws[1].grad is not None
    x_ref = x.detach().clone().requires_grad_()
    F.linear(x_ref, ws[1], bs[1]).square().sum().backward()
    assert torch.allclose(x.grad, x_ref.grad)


def test_autocast_computes_as_nn_linear():
    """Under CPU bf16 autocast: outputs equal to nn.Linear's, gradients in the parameters' dtype and close."""
    torch.manual_seed(2)
    x = torch.randn(16, 32, requires_grad=True)
    ws, bs = _params((32, 16), 32, (False, True), dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ys = linears(x, ws, bs)
        refs = [F.linear(x, w, b) for w, b in zip(ws, bs)]
    for y, r in zip(ys, refs):
        assert y.dtype == r.dtype == torch.bfloat16 and torch.equal(y, r)
    dys = [torch.randn_like(r) for r in refs]
    leaves = [x, *ws, bs[1]]
    ours = torch.autograd.grad(ys, leaves, dys)
    ref = torch.autograd.grad(refs, leaves, dys)
    for a, b in zip(ours, ref):
        assert a.dtype == b.dtype == torch.float32
        assert (a - b).norm() <= 1e-2 * b.norm()


def test_without_autograd_equals_separate_linears():
    x = torch.randn(4, 8)
    ws, bs = _params((8, 4), 8, (True, False), dtype=torch.float32)
    with torch.no_grad():
        for y, w, b in zip(linears(x, ws, bs), ws, bs):
            assert torch.equal(y, F.linear(x, w, b))


def test_bad_shapes_are_clear_errors():
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match=r"weights\[1\]"):
        linears(x, [torch.randn(4, 8), torch.randn(4, 7)])
    with pytest.raises(ValueError, match=r"biases\[0\]"):
        linears(x, [torch.randn(4, 8)], [torch.randn(5)])
    with pytest.raises(ValueError, match="as many biases"):
        linears(x, [torch.randn(4, 8)], [None, None])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_bias_gradient_on_cuda_is_the_fp32_sum(dtype):
    """On CUDA a half-precision bias gradient is one matmul with a row of ones: the rows' sum accumulated in fp32,
    as the fp64 sum to fp32 rounding, at LRA's narrow shape and a wide one."""
    from hgrn2.ops.projection import _bias_grad

    for n, c in ((128 * 1990, 64), (4099, 2048)):
        dy = torch.randn(n, c, device="cuda").to(dtype)
        ref = dy.double().sum(0)
        got = _bias_grad(dy, torch.float32)
        assert got.dtype == torch.float32 and got.shape == (c,)
        assert (got.double() - ref).abs().max() <= 1e-5 * dy.double().abs().sum(0).max()
