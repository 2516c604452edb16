"""The Triton HGRN1 scan (`hgrn1_triton`), forward and backward, against the fp64 step-loop reference."""


import pytest
import torch

from hgrn2.ops.reference import hgrn1_reference
from hgrn2.ops.triton.hgrn1 import hgrn1_triton

from .harness import DEV, TOL, needs_triton, rel_err

pytestmark = needs_triton


def inputs(B, T, D, *, complex_=False, dtype=torch.float32, with_lb=True, with_h0=True, N=None, g_scale=3.0):
    """Leaf tensors (x, g, lb, theta, h0) with requires_grad; theta is None for the real recurrence."""
    cdt = torch.complex64 if complex_ else torch.float32
    x = torch.randn(B, T, D, device=DEV, dtype=cdt)
    x = x if complex_ else x.to(dtype)
    g = (torch.randn(B, T, D, device=DEV) * g_scale).to(dtype)
    lb = torch.rand(D, device=DEV) if with_lb else None
    theta = torch.randn(D, device=DEV) if complex_ else None
    h0 = torch.randn(N or B, D, device=DEV, dtype=cdt) if with_h0 else None
    return [None if t is None else t.requires_grad_() for t in (x, g, lb, theta, h0)]


def _planes(z):
    return torch.view_as_real(z) if z.is_complex() else z


def run_both(x, g, lb, theta, h0, **kw):
    """(ours, reference) as lists [h, final, grads of x, g, lb, theta, h0 (None where absent)]."""
    def run(fn, args, kw):
        h, hT = fn(args[0], args[1], args[2], theta=args[3], initial_state=args[4], output_final_state=True, **kw)
        loss = (h * wh.to(h.dtype).conj()).real.sum() + (hT * wT.to(hT.dtype).conj()).real.sum()
        leaves = [a for a in args if a is not None]
        grads = iter(torch.autograd.grad(loss, leaves))
        return [h, hT] + [None if a is None else next(grads) for a in args]

    def dbl(t):
        if t is None:
            return None
        return t.detach().to(torch.complex128 if t.is_complex() else torch.float64).requires_grad_()

    B, T, D = x.shape
    N = h0.shape[0] if h0 is not None else (B if kw.get("cu_seqlens") is None else kw["cu_seqlens"].numel() - 1)
    cdt = torch.complex128 if x.is_complex() else torch.float64
    wh, wT = torch.randn(B, T, D, device=DEV, dtype=cdt), torch.randn(N, D, device=DEV, dtype=cdt)
    args = [x, g, lb, theta, h0]
    ref_kw = {k: v for k, v in kw.items() if k != "chunk_size"}
    return run(hgrn1_triton, args, kw), run(hgrn1_reference, [dbl(a) for a in args], ref_kw)


def assert_close(ours, ref, tol):
    names = ["h", "final", "dx", "dg", "dlb", "dtheta", "dh0"]
    for name, a, b in zip(names, ours, ref):
        assert (a is None) == (b is None), name
        if a is not None:
            assert torch.isfinite(_planes(a)).all(), name
            err = rel_err(_planes(a), _planes(b))
            assert err <= tol, f"{name}: rel err {err:.2e} > {tol}"


FAST = [(False, 4, True, True), (True, 5, True, True), (False, None, False, False), (True, 4, False, False)]
GRID = [(c, n, *opt) for c in (False, True) for n in (None, 4, 5) for opt in ((True, True), (False, False))]


@pytest.mark.parametrize("complex_,chunk_size,with_lb,with_h0",
                         FAST + [pytest.param(*p, marks=pytest.mark.slow) for p in GRID if p not in FAST])
def test_matches_reference_fp32(complex_, chunk_size, with_lb, with_h0):
    x, g, lb, theta, h0 = inputs(2, 13, 20, complex_=complex_, with_lb=with_lb, with_h0=with_h0)
    ours, ref = run_both(x, g, lb, theta, h0, chunk_size=chunk_size)
    assert ours[0].dtype == x.dtype and ours[1].dtype == (torch.complex64 if complex_ else torch.float32)
    assert_close(ours, ref, TOL[torch.float32])


def test_bf16():
    x, g, lb, theta, h0 = inputs(2, 17, 24, dtype=torch.bfloat16)
    ours, ref = run_both(x, g, lb, theta, h0, chunk_size=8)
    assert ours[0].dtype == torch.bfloat16 and ours[1].dtype == torch.float32
    assert_close(ours, ref, TOL[torch.bfloat16])


def exact_gate_grads(ref, x, g, lb, theta, h0):
    """dg and dβ from the fp64 reference's h and dx by the closed forms, in fp64:

        dg = (1 − β)σ(g)σ(−g)·(df − dk),   dβ = Σ σ(−g)·(df − dk)

    Autograd through the reference is not accurate enough here: at |g| = 30, sigmoid's backward y(1 − y)
    cancels in fp64 and loses ~eps64 / σ(−30) ≈ 1e-3 relative, and at β = 0 the backward of log β gives NaN.
    """
    h, dx = ref[0].detach(), ref[2]
    gd, beta = g.detach().double(), lb.detach().double()
    s_pos, s_neg = torch.sigmoid(gd), torch.sigmoid(-gd)
    d = dx / ((1 - beta) * s_neg)  # dx = k·d
    h0_ = torch.zeros_like(h[:, :1]) if h0 is None else h0.detach().to(h.dtype)[:, None]
    h_prev = torch.cat([h0_, h[:, :-1]], dim=1)
    z = d * h_prev.conj()
    if theta is not None:
        z = z * torch.polar(torch.ones_like(beta), -theta.detach().double())
    u = z.real - (d * x.detach().to(d.dtype).conj()).real
    return (1 - beta) * s_pos * s_neg * u, (s_neg * u).sum((0, 1))


@pytest.mark.parametrize("complex_", [False, True])
def test_extreme_gates(complex_):
    x, g, lb, theta, h0 = inputs(2, 11, 16, complex_=complex_)
    with torch.no_grad():
        g.copy_(torch.where(torch.rand_like(g) < 0.5, -30.0, 30.0))
        lb.fill_(0.999)
        lb[:4] = 0.0
    ours, ref = run_both(x, g, lb, theta, h0, chunk_size=4)
    ref[3], ref[4] = exact_gate_grads(ref, x, g, lb, theta, h0)
    assert_close(ours, ref, TOL[torch.float32])


@pytest.mark.parametrize("complex_", [False, True])
def test_varlen_equals_separate_runs(complex_):
    cu = torch.tensor([0, 4, 5, 12], device=DEV, dtype=torch.int64)
    x, g, lb, theta, h0 = inputs(1, 12, 20, complex_=complex_, N=3)
    ours, ref = run_both(x, g, lb, theta, h0, cu_seqlens=cu)
    assert_close(ours, ref, TOL[torch.float32])
    c = cu.tolist()
    with torch.no_grad():
        h, hT = hgrn1_triton(x, g, lb, theta=theta, initial_state=h0, output_final_state=True, cu_seqlens=cu)
        for n in range(3):
            s = slice(c[n], c[n + 1])
            h_n, hT_n = hgrn1_triton(x[:, s], g[:, s], lb, theta=theta, initial_state=h0[n:n + 1],
                                     output_final_state=True)
            assert torch.allclose(h[:, s], h_n, rtol=1e-5, atol=1e-6)
            assert torch.allclose(hT[n:n + 1], hT_n, rtol=1e-5, atol=1e-6)


def test_no_final_state_and_output_only_loss():
    x, g, lb, _, h0 = inputs(1, 9, 8)
    h, hT = hgrn1_triton(x, g, lb, initial_state=h0, chunk_size=4)
    assert hT is None
    dx, dh0 = torch.autograd.grad(h.sum(), (x, h0))
    x2, h02 = x.detach().double().requires_grad_(), h0.detach().double().requires_grad_()
    h_ref, _ = hgrn1_reference(x2, g.detach().double(), lb.detach().double(), initial_state=h02)
    dx_ref, dh0_ref = torch.autograd.grad(h_ref.sum(), (x2, h02))
    assert rel_err(h, h_ref) <= 1e-4 and rel_err(dx, dx_ref) <= 1e-4 and rel_err(dh0, dh0_ref) <= 1e-4


def test_under_torch_compile():
    x, g, lb, _, h0 = inputs(2, 6, 8)

    def f(x, g, lb, h0):
        h, hT = hgrn1_triton(x, g, lb, initial_state=h0, output_final_state=True)
        return (h * h).sum() + hT.sum()

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    loss, loss_c = f(x, g, lb, h0), compiled(x, g, lb, h0)
    grads = torch.autograd.grad(loss, (x, g, lb, h0))
    grads_c = torch.autograd.grad(loss_c, (x, g, lb, h0))
    assert torch.allclose(loss, loss_c)
    for a, b in zip(grads, grads_c):
        assert torch.allclose(a, b)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("complex_", [False, True])
@pytest.mark.parametrize("B,T,D", [(1, 1000, 300), (16, 130, 64)])
def test_gpu_larger_shapes(complex_, B, T, D):
    x, g, lb, theta, h0 = inputs(B, T, D, complex_=complex_)
    ours, ref = run_both(x, g, lb, theta, h0)
    assert_close(ours, ref, TOL[torch.float32])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_bf16_many_channels():
    x, g, lb, theta, h0 = inputs(16, 64, 256, dtype=torch.bfloat16, with_h0=False)
    ours, ref = run_both(x, g, lb, theta, h0)
    assert_close(ours, ref, TOL[torch.bfloat16])


@pytest.mark.parametrize("complex_", [False, True])
def test_custom_op_registration(complex_):
    from hgrn2.ops.triton.hgrn1 import _bwd, _fwd
    x, g, lb, theta, h0 = [None if t is None else t.detach() for t in inputs(2, 6, 8, complex_=complex_)]
    torch.library.opcheck(_fwd.op, (x, g, lb, theta, h0, None, True, 3))
    out, final = _fwd(x, g, lb, theta, h0, None, True, 3)
    torch.library.opcheck(_bwd.op, (torch.randn_like(out), torch.randn_like(final), x, g, lb, theta, h0, out, None, 3))


@pytest.mark.parametrize("complex_", [False, True])
def test_non_contiguous_inputs(complex_):
    """Transposed and sliced views give the same values and gradients as contiguous copies."""
    x, _, lb, theta, h0 = inputs(3, 10, 12, complex_=complex_)
    x = x.detach().transpose(0, 1).contiguous().transpose(0, 1).requires_grad_()  # dense, permuted strides
    g = (torch.randn(3, 10, 24, device=DEV) * 3)[..., ::2].requires_grad_()  # strided
    assert not x.is_contiguous() and not g.is_contiguous()
    ours, ref = run_both(x, g, lb, theta, h0, chunk_size=4)
    assert_close(ours, ref, TOL[torch.float32])


def test_real_initial_state_for_complex_input():
    x, g, lb, theta, _ = inputs(2, 5, 8, complex_=True)
    h0 = torch.randn(2, 8, device=DEV, requires_grad=True)
    ours, ref = run_both(x, g, lb, theta, h0)
    assert ours[-1].dtype == torch.float32
    assert_close(ours, ref, TOL[torch.float32])
    with pytest.raises(ValueError, match="initial_state"):
        hgrn1_triton(x.real.detach(), g, lb, initial_state=h0.detach().to(torch.complex64))
