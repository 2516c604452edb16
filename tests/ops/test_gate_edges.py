"""Gradients at the edges of the gate range, and causality for any input values, on every HGRN2 backend.

Ground truth is a plain fp64 step loop written from the equations. A gradient counts as exact when its absolute
error stays within the rounding of a random-gate run of the same shape and dtype, measured against that run's
gradient scale (closed or open gates make some true gradients tiny; their error must be tiny too).
"""

import importlib.util

import pytest
import torch

from hgrn2.ops import hgrn2, log_forget

B, T, H, K, V = 1, 65, 1, 16, 16
GRAD_NAMES = ("o", "g", "i", "lower_bound", "initial_state")
TRITON = pytest.param("triton", marks=pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                                         reason="triton not installed"))
BACKENDS = ["reference", "chunk", TRITON]


def device(backend: str) -> torch.device:
    """Triton runs compiled on a GPU when there is one, else under its interpreter on the CPU."""
    return torch.device("cuda" if backend == "triton" and torch.cuda.is_available() else "cpu")


def step_loop(o, g, i, beta, h0):
    """y_t = h_t·o_t with h_t = h_{t-1}·Diag(f_t) + i_t ⊗ (1 − f_t), f = β + (1 − β)σ(g), in fp64 one token at a
    time; 1 − f is written (1 − β)σ(−g), the same quantity without fp64's own cancellation as f → 1."""
    beta = torch.zeros(o.shape[-2:], dtype=o.dtype) if beta is None else beta
    f = beta + (1 - beta) * torch.sigmoid(g)
    k = (1 - beta) * torch.sigmoid(-g)
    h, ys = h0, []
    for t in range(o.shape[1]):
        h = h * f[:, t, :, None, :] + i[:, t, :, :, None] * k[:, t, :, None, :]
        ys.append(torch.einsum("bhvk,bhk->bhv", h, o[:, t]))
    return torch.stack(ys, 1), h


def inputs(gate, beta, dtype, seed=0, T=T):
    """(o, g, i, β, h0) in `dtype`; `gate` a constant logit, "mixed" (uniform in ±80) or "random" (3·N(0, 1))."""
    gen = torch.Generator().manual_seed(seed)
    o, i = (torch.randn(B, T, H, D, generator=gen) for D in (K, V))
    h0 = torch.randn(B, H, V, K, generator=gen)
    if gate == "random":
        g = 3 * torch.randn(B, T, H, K, generator=gen)
    elif gate == "mixed":
        g = 160 * torch.rand(B, T, H, K, generator=gen) - 80
    else:
        g = torch.full((B, T, H, K), float(gate))
    lb = {"random": torch.rand(H, K, generator=gen), None: None}.get(beta)
    lb = torch.full((H, K), beta) if lb is None and beta not in ("random", None) else lb
    o, g, i = (x.to(dtype) for x in (o, g, i))
    return [o, g, i, lb, h0]  # β and the state stay float32 (bf16 rounds 0.999 to 1), as in the model


def gradients(fn, xs, weights):
    leaves = [None if x is None else x.detach().clone().requires_grad_() for x in xs]
    y, s = fn(*leaves)
    ((y.double() * weights[0]).sum() + (s.double() * weights[1]).sum()).backward()
    return {n: x.grad for n, x in zip(GRAD_NAMES, leaves) if x is not None}


def errors(backend, xs):
    """Largest absolute error of each gradient of `backend` against the fp64 step loop, and each one's scale."""
    gen = torch.Generator().manual_seed(1)
    weights = (torch.randn(*xs[2].shape, generator=gen, dtype=torch.float64),
               torch.randn(*xs[4].shape, generator=gen, dtype=torch.float64))

    def op(o, g, i, lb, h0):
        return hgrn2(o, g, i, lb, initial_state=h0, output_final_state=True, backend=backend)

    dev = device(backend)
    got = gradients(op, [None if x is None else x.to(dev) for x in xs], [w.to(dev) for w in weights])
    got = {n: gr.cpu() for n, gr in got.items()}
    true = gradients(step_loop, [None if x is None else x.double() for x in xs], weights)
    for n, gr in got.items():
        assert torch.isfinite(gr).all(), f"{n}: non-finite gradient"
    return ({n: (got[n].double() - true[n]).abs().max().item() for n in got},
            {n: true[n].abs().max().item() for n in true})


def check_edges(backend, gate, beta, dtype, length=T):
    """Each gradient's error ≤ 4 × the larger of this backend's and the step-by-step reference's in a random-gate
    run (at least 4 ulps of its scale), scaled up where the edge case's gradient is the larger (open gates sum
    more tokens), and never below the rounding of a sum over the sequence, ε·scale·√length: with open gates a
    gradient such as the initial state's sums every token, where the random-gate run's sums only the first few."""
    rand = inputs("random", "random" if beta is not None else None, dtype, T=length)
    (err0, scale0), (err_ref, _) = errors(backend, rand), errors("reference", rand)
    err, scale = errors(backend, inputs(gate, beta, dtype, T=length))
    eps = torch.finfo(dtype).eps
    tol = {n: max(4 * max(err0[n], err_ref[n], eps * scale0[n]) * max(1.0, scale[n] / scale0[n]),
                  eps * scale[n] * length ** 0.5) for n in err}
    bad = {n: f"{err[n]:.2e} > {tol[n]:.2e}" for n in err if not err[n] <= tol[n]}
    assert not bad, f"{backend} gate={gate} β={beta} {dtype}: {bad}"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("gate, beta", [(-30.0, 0.0), (-30.0, 1e-6), (30.0, 0.999), (80.0, 0.999), (30.0, None),
                                        (-30.0, None), (80.0, None), (-80.0, None), ("mixed", 0.0), ("mixed", None)])
def test_gate_edge_gradients_fp32(backend, gate, beta):
    check_edges(backend, gate, beta, torch.float32)


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("beta", [0.0, 1e-6, 0.5, 0.999, None])
@pytest.mark.parametrize("gate", [-80.0, -30.0, 30.0, 80.0, "mixed"])
def test_gate_edge_gradients_grid(backend, gate, beta, dtype):
    check_edges(backend, gate, beta, dtype)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")
# in chunks that decay by nearly the chunk tier's bound, its A overflows above the diagonal (pairs t < s, masked
# out; the interpreter's numpy warns)
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning",
                            "ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("gate, beta", [(-30.0, 0.0), (-30.0, 1e-6), (-80.0, None), ("mixed", 0.0), ("mixed", None)])
def test_gate_edge_gradients_chunk_parallel(gate, beta):
    """The chunk-parallel Triton kernels, which `backend="triton"` takes for long sequences, here at 65 tokens."""
    from hgrn2.ops.triton import DispatchConfig, launch_config

    with launch_config(dispatch=DispatchConfig(parallel_train_min_work=1)):
        check_edges("triton", gate, beta, torch.float32)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("gate, beta", [(-30.0, 0.0), (-30.0, 1e-6), (30.0, 0.999), (-80.0, None), (80.0, None),
                                        ("mixed", 0.0), ("mixed", None)])
def test_gate_edge_gradients_long_gpu(gate, beta):
    """1100 tokens of one sequence and head: the chunk-parallel Triton kernels (`takes_chunk_parallel`), compiled."""
    check_edges("triton", gate, beta, torch.float32, length=1100)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["o", "g", "i"])
@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_bad_value_stays_in_the_future(backend, name, bad):
    """A non-finite input at t = 40 leaves every output before t = 40 finite and unchanged (to rounding: a Triton
    block picks its exact or factorised form from all of its tokens' gates)."""
    o, g, i, lb, _ = (None if x is None else x.to(device(backend)) for x in inputs("random", "random", torch.float32))
    y0, _ = hgrn2(o, g, i, lb, backend=backend)
    x = {"o": o, "g": g, "i": i}[name]
    x[:, 40] = bad
    y, _ = hgrn2(o, g, i, lb, backend=backend)
    gate_limit = name == "g" and bad in (float("inf"), float("-inf"))  # f = 1 or f = β: a valid gate
    assert torch.isfinite(y[:, :40]).all() and torch.isfinite(y[:, 40]).all() == gate_limit
    assert torch.allclose(y[:, :40], y0[:, :40], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("gate, beta", [(-30.0, 0.0), (30.0, 0.999), (-80.0, 1e-6), (3.0, 0.5)])
def test_log_forget_derivatives(gate, beta):
    """∂ log f/∂β = σ(−g)/f and ∂ log f/∂g = (1 − β)σ(g)σ(−g)/f to a few ulps (β = 0 exactly included)."""
    g, lb = torch.tensor([gate], requires_grad=True), torch.tensor([beta], requires_grad=True)
    log_forget(g, lb).backward()
    g64, b64 = g.detach().double(), lb.detach().double()  # the fp32 values themselves
    f = b64 + (1 - b64) * torch.sigmoid(g64)
    assert torch.allclose(lb.grad.double(), torch.sigmoid(-g64) / f, rtol=1e-5, atol=0)
    assert torch.allclose(g.grad.double(), (1 - b64) * torch.sigmoid(g64) * torch.sigmoid(-g64) / f, rtol=1e-5, atol=0)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")
@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_bad_value_stays_in_the_future_chunk_parallel(bad):
    """The same for the chunk-parallel Triton kernels, which `backend="triton"` takes for long sequences."""
    from hgrn2.ops.triton import hgrn2_chunk_parallel_triton

    o, g, i, lb, _ = (x.to(device("triton")) for x in inputs("random", "random", torch.float32) if x is not None)
    y0, _ = hgrn2_chunk_parallel_triton(o, g, i, lb)
    i[:, 40] = bad
    y, _ = hgrn2_chunk_parallel_triton(o, g, i, lb)
    assert torch.isfinite(y[:, :40]).all() and not torch.isfinite(y[:, 40]).all()
    assert torch.allclose(y[:, :40], y0[:, :40], rtol=1e-5, atol=1e-5)
