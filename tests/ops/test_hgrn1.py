"""The torch scan backend of `hgrn2.ops.hgrn1` against the fp64 step-loop reference."""

import pytest
import torch

from hgrn2.bench.common import rel_err
from hgrn2.ops import hgrn1
from hgrn2.ops.scan import LinearScan


def make(B, T, D, *, complex_=False, dtype=torch.float32, g_scale=3.0, beta=None, state=False, n_state=None):
    """Fresh random inputs (leaf tensors with grad) for hgrn1: i, g, lower_bound, theta, initial_state."""
    i = torch.randn(B, T, D, dtype=dtype)
    if complex_:
        i = torch.complex(i, torch.randn_like(i))
    g = torch.randn(B, T, D, dtype=dtype) * g_scale
    lb = None if beta is None else torch.full((D,), beta, dtype=dtype) if isinstance(beta, float) else beta
    theta = torch.rand(D, dtype=dtype) * 3 if complex_ else None
    h0 = torch.randn(n_state or B, D, dtype=i.dtype) if state else None
    leaves = [t for t in (i, g, lb, theta, h0) if t is not None]
    for t in leaves:
        t.requires_grad_(True)
    return dict(i=i, g=g, lower_bound=lb, theta=theta, initial_state=h0), leaves


def run(args, backend, **kw):
    a = dict(args)
    i, g, lb = a.pop("i"), a.pop("g"), a.pop("lower_bound")
    return hgrn1(i, g, lb, backend=backend, **a, **kw)


def as64(args):
    """The same inputs as float64 (complex128) leaves, for the oracle."""
    out, leaves = {}, []
    for k, v in args.items():
        if v is None:
            out[k] = None
            continue
        w = v.detach().to(torch.complex128 if v.is_complex() else torch.float64).requires_grad_(True)
        out[k] = w
        leaves.append(w)
    return out, leaves


def compare(args, leaves, tol, **kw):
    """Outputs, final states and every gradient of the scan vs the fp64 reference."""
    ref_args, ref_leaves = as64(args)
    h, hf = run(args, "scan", output_final_state=True, **kw)
    r, rf = run(ref_args, "reference", output_final_state=True, **kw)
    assert h.dtype == args["i"].dtype and h.shape == r.shape
    assert torch.isfinite(torch.view_as_real(h) if h.is_complex() else h).all()
    assert rel_err(_r(h), _r(r)) < tol and rel_err(_r(hf), _r(rf)) < tol
    wh, wf = torch.randn_like(_r(r)), torch.randn_like(_r(rf))
    grads = torch.autograd.grad((_r(h) * wh.to(_r(h).dtype)).sum() + (_r(hf) * wf.to(_r(hf).dtype)).sum(), leaves)
    ref_grads = torch.autograd.grad((_r(r) * wh).sum() + (_r(rf) * wf).sum(), ref_leaves)
    for gr, rg in zip(grads, ref_grads):
        assert torch.isfinite(_r(gr)).all()
        assert rel_err(_r(gr), _r(rg)) < tol


def _r(x):
    return torch.view_as_real(x) if x.is_complex() else x


@pytest.mark.parametrize("T", [1, 2, 7, 33, 100])
@pytest.mark.parametrize("complex_", [False, True])
def test_matches_reference(T, complex_):
    args, leaves = make(2, T, 6, complex_=complex_, beta=torch.rand(6) * 0.9, state=True)
    compare(args, leaves, 1e-5)


@pytest.mark.parametrize("complex_", [False, True])
def test_no_bound_no_state(complex_):
    args, leaves = make(3, 19, 4, complex_=complex_)
    compare(args, leaves, 1e-5)


@pytest.mark.parametrize("g_scale,beta", [(30.0, None), (30.0, 0.999), (1.0, 0.999)])
@pytest.mark.parametrize("complex_", [False, True])
def test_extreme_gates(g_scale, beta, complex_):
    args, leaves = make(2, 301, 5, complex_=complex_, g_scale=1.0, beta=beta, state=True)
    with torch.no_grad():  # logits at the extremes ±30 (f → 0, f → 1), mixed with moderate ones
        args["g"].copy_(torch.where(torch.rand_like(args["g"]) < 0.5, 1.0, -1.0) * g_scale)
    compare(args, leaves, 1e-5)


def test_long_sequence_near_one():
    args, leaves = make(1, 4099, 3, g_scale=1.0, beta=0.999, state=True)
    compare(args, leaves, 1e-4)


def test_varlen_equals_per_sequence():
    cu = torch.tensor([0, 5, 6, 23, 40])
    args, leaves = make(1, 40, 4, complex_=True, beta=0.5, state=True, n_state=4)
    compare(args, leaves, 1e-5, cu_seqlens=cu)
    h, hf = run(args, "scan", output_final_state=True, cu_seqlens=cu)
    for n in range(4):
        s, e = cu[n].item(), cu[n + 1].item()
        hn, hfn = hgrn1(args["i"][:, s:e], args["g"][:, s:e], args["lower_bound"], theta=args["theta"],
                        initial_state=args["initial_state"][n:n + 1], output_final_state=True, backend="scan")
        assert rel_err(_r(h[:, s:e]), _r(hn)) < 1e-6 and rel_err(_r(hf[n]), _r(hfn[0])) < 1e-6


def test_low_precision_inputs():
    args, _ = make(2, 50, 8, dtype=torch.bfloat16, beta=0.9, state=False)
    h, hf = run(args, "scan", output_final_state=True)
    ref_args, _ = as64(args)
    r, _ = run(ref_args, "reference")
    assert h.dtype == torch.bfloat16 and hf.dtype == torch.float32
    assert rel_err(h, r) < 1e-2


@pytest.mark.parametrize("complex_", [False, True])
def test_gradcheck(complex_):
    args, leaves = make(2, 9, 3, complex_=complex_, dtype=torch.float64, beta=torch.rand(3, dtype=torch.float64),
                        state=True)

    def fn(*xs):
        a = dict(zip([k for k, v in args.items() if v is not None], xs))
        h, hf = hgrn1(a["i"], a["g"], a.get("lower_bound"), theta=a.get("theta"),
                      initial_state=a.get("initial_state"), output_final_state=True, backend="scan")
        return h, hf

    assert torch.autograd.gradcheck(fn, leaves)


def test_linear_scan_second_order():
    a = (torch.rand(2, 11, 3, dtype=torch.float64) * 0.9).requires_grad_(True)
    u = torch.randn(2, 11, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(LinearScan.apply, (a, u))


def test_auto_backend_uses_scan_for_long_cpu_input():
    args, _ = make(1, 40, 4, beta=0.5)
    h, _ = run(args, None)
    r, _ = run(args, "scan")
    assert torch.equal(h, r)


def test_initial_state_dtype_checked():
    """A complex state for a real recurrence, or an integer one, is refused rather than truncated."""
    args, _ = make(2, 5, 3, state=True)
    for bad in (args["initial_state"].detach().to(torch.complex64), args["initial_state"].detach().long()):
        with pytest.raises(ValueError, match="`initial_state`"):
            run({**args, "initial_state": bad}, "scan")
    args, _ = make(2, 5, 3, complex_=True, state=True)
    run(args, "scan")
