"""Bad arguments to the ops: a one-line ValueError naming the argument; empty inputs: one result on every backend."""

import importlib.util

import pytest
import torch

from hgrn2.ops import hgrn1, hgrn2
from tests.ops.test_gate_edges import device

BACKENDS = ["reference", "chunk", pytest.param("triton", marks=pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="triton not installed"))]


def args(B=1, T=5, H=2, K=4, V=3, dtype=torch.float32):
    return torch.randn(B, T, H, K, dtype=dtype), torch.randn(B, T, H, K, dtype=dtype), torch.randn(B, T, H, V,
                                                                                                     dtype=dtype)


@pytest.mark.parametrize("beta", [1.5, -0.5, 1.0, float("nan")])
def test_lower_bound_outside_unit_interval(beta):
    o, g, i = args()
    with pytest.raises(ValueError, match=r"`lower_bound`: expected values in \[0, 1\)"):
        hgrn2(o, g, i, torch.full((2, 4), beta))


@pytest.mark.parametrize("captured", [False, True])
def test_device_value_checks_skipped_while_a_cuda_graph_is_captured(monkeypatch, captured):
    """A captured graph would replay the check's kernels every step; the eager warm-up before it has checked."""
    import hgrn2.ops.checks as checks

    asserted = []
    monkeypatch.setattr(checks, "reads_on_host", lambda x: False)  # as for a GPU tensor
    monkeypatch.setattr(checks, "capturing", lambda x: captured)
    monkeypatch.setattr(checks.torch, "_assert_async", lambda ok, msg=None: asserted.append(msg))
    o, g, i = args()
    hgrn2(o, g, i, torch.full((2, 4), 0.5), backend="chunk")
    assert asserted == ([] if captured else ["`lower_bound`: expected values in [0, 1)"])


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.complex64])
@pytest.mark.parametrize("name", ["o", "g", "i"])
def test_non_real_float_dtype(name, dtype):
    xs = dict(zip("ogi", args()))
    xs[name] = xs[name].to(dtype)
    with pytest.raises(ValueError, match=f"`{name}`: expected a real floating dtype"):
        hgrn2(xs["o"], xs["g"], xs["i"])


@pytest.mark.parametrize("scale", [None, float("nan"), float("inf"), "0.5", True, torch.tensor(0.5)])
def test_scale_must_be_a_finite_number(scale):
    with pytest.raises(ValueError, match="`scale`: expected a finite number"):
        hgrn2(*args(), scale=scale)


@pytest.mark.parametrize("name", ["o", "g", "i", "lower_bound", "initial_state", "cu_seqlens"])
def test_list_in_place_of_a_tensor(name):
    o, g, i = args()
    kw = dict(o=o, g=g, i=i, lower_bound=torch.rand(2, 4) * 0.5, initial_state=torch.zeros(1, 2, 3, 4),
              cu_seqlens=torch.tensor([0, 2, 5]))
    kw["initial_state"] = torch.zeros(2, 2, 3, 4)  # one state per packed sequence
    kw[name] = kw[name].tolist()
    with pytest.raises(ValueError, match=f"`{name}`: expected a torch.Tensor, got list"):
        hgrn2(kw.pop("o"), kw.pop("g"), kw.pop("i"), kw.pop("lower_bound"), **kw)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("B, H, K, V", [(0, 2, 4, 3), (2, 0, 4, 3), (2, 2, 0, 3), (2, 2, 4, 0)])
def test_empty_inputs_give_one_result_on_every_backend(backend, B, H, K, V):
    dev = device(backend)
    o, g, i = (x.to(dev, copy=True).requires_grad_() for x in args(B=B, T=20, H=H, K=K, V=V))
    y, s = hgrn2(o, g, i, torch.zeros(H, K, device=dev), output_final_state=True, backend=backend)
    assert y.shape == (B, 20, H, V) and y.dtype == i.dtype and not y.any()
    assert s.shape == (B, H, V, K) and s.dtype == torch.float32
    y.sum().backward()
    assert all(x.grad is not None and x.grad.shape == x.shape and not x.grad.any() for x in (o, g, i))


@pytest.mark.parametrize("D", [0, 3])
def test_hgrn1_empty_batch(D):
    i, g = torch.randn(0, 7, D), torch.randn(0, 7, D)
    h, s = hgrn1(i, g, output_final_state=True, backend="scan")
    assert h.shape == (0, 7, D) and s.shape == (0, D)
