"""The lower bound's gradient below THETA (`bound_grad.exact_bound_grad`): recomputed exactly for the heads that hold
such a bound, in both training families, with packed sequences, initial states and a final-state cotangent; which
heads, `bound_grad.LowBoundHeads` takes in each forward without a host sync in the backward."""

import pytest
import torch

from hgrn2.ops.chunk import hgrn2_chunk
from hgrn2.ops.triton import bound_grad
from hgrn2.ops.triton.bound_grad import THETA, LowBoundHeads, exact_bound_grad
from hgrn2.ops.triton.chunk_parallel import hgrn2_chunk_parallel_triton
from hgrn2.ops.triton.fused_chunk import hgrn2_fused_chunk_triton

from .harness import DEV, check, gpu, make_inputs, needs_triton, run_both

pytestmark = needs_triton
FAMILIES = [hgrn2_fused_chunk_triton, hgrn2_chunk_parallel_triton]
# the chunk-parallel chunk tier also runs the chunks past its bound, whose outputs the fallback launch rewrites (the
# interpreter's numpy warns of their overflow)
OVERFLOW_WARNINGS = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning",
                                               "ignore:invalid value encountered:RuntimeWarning")


@pytest.fixture
def exact_calls(monkeypatch):
    """The number of heads of each exact recomputation (a spy on the chunk backend it runs)."""
    calls = []

    def spy(o, *args, **kw):
        calls.append(o.shape[2])
        return real(o, *args, **kw)

    real = bound_grad.hgrn2_chunk
    monkeypatch.setattr(bound_grad, "hgrn2_chunk", spy)
    return calls


@OVERFLOW_WARNINGS
@pytest.mark.parametrize("fn", FAMILIES)
def test_exact_bound_grad_only_below_theta(exact_calls, fn):
    """Bounds ≥ THETA keep the kernels' dβ; a head with β = 0 and 1e-6 channels behind closed gates (where the
    kernels' dβ is off by orders of magnitude) gets the reference's dβ, the other heads' rows untouched."""
    cu = torch.tensor([0, 30, 31, 75], device=DEV)
    kw = dict(scale=0.5, o_act="silu", cu_seqlens=cu, output_final_state=True)
    o, g, i, beta, h0 = make_inputs(1, 75, 3, 16, 16, lb=(THETA, 0.9), n_states=3)
    check(*run_both([o, g, i, beta, h0], fn, **kw))
    assert exact_calls == []

    beta[1, :4], beta[1, 4:8] = 0.0, 1e-6
    g[:, 10:40, 1, :8] = -30.0
    check(*run_both([o, g, i, beta, h0], fn, **kw))
    assert exact_calls == [1]


def _bound_grad(fn, o, g, i, beta, dy):
    """dβ of Σ y·dy for a leaf β."""
    y, _ = fn(o, g, i, beta, scale=0.5, o_act="silu")
    (d,) = torch.autograd.grad(y, beta, dy)
    return d


@OVERFLOW_WARNINGS
@pytest.mark.parametrize("fn", FAMILIES)
def test_heads_follow_the_bound_each_call(exact_calls, monkeypatch, fn):
    """As β moves below THETA and back between calls, each backward recomputes the heads its own forward flagged,
    and dβ equals bit for bit the kernels' dβ with those heads' rows replaced by the chunk backend's (what a
    synchronous read of β in the backward gives)."""
    o, g, i, beta, _ = make_inputs(1, 24, 3, 16, 16, lb=(0.5, 0.9))
    dy = torch.randn_like(i)
    for low in ([], [1], [0, 2], []):
        b = beta.clone()
        b[low, :3] = 0.0
        b.requires_grad_()
        exact_calls.clear()
        got = _bound_grad(fn, o, g, i, b, dy)
        assert exact_calls == ([len(low)] if low else [])
        with monkeypatch.context() as m:
            m.setattr(bound_grad, "THETA", -1.0)  # nothing flagged: the kernels' dβ
            want = _bound_grad(fn, o, g, i, b, dy)
        if low:
            sub = b.detach()[low].requires_grad_()
            y, _ = hgrn2_chunk(o[:, :, low], g[:, :, low], i[:, :, low], sub, scale=0.5, o_act="silu")
            want[low] = torch.autograd.grad(y, sub, dy[:, :, low])[0]
        assert torch.equal(got, want)


@OVERFLOW_WARNINGS
@pytest.mark.parametrize("fn", FAMILIES)
def test_flags_under_autocast(exact_calls, fn):
    """Under autocast (bf16 projections, the bound in fp32 as the model passes it) the flagged head is still
    recomputed."""
    o, g, i, beta, _ = make_inputs(1, 20, 2, 16, 16, lb=(0.5, 0.9), dtype=torch.bfloat16)
    beta[0, 5] = 0.0
    beta.requires_grad_()
    with torch.autocast(DEV, dtype=torch.bfloat16):
        d = _bound_grad(fn, o, g, i, beta, torch.randn_like(i))
    assert exact_calls == [1]
    assert torch.isfinite(d).all()


def test_no_flags_without_a_bound_gradient_or_while_compiling(monkeypatch):
    """No bound, no gradient for it, or torch.compile tracing: nothing is read, and the backward keeps the kernels'
    dβ."""
    beta = torch.zeros(2, 16, device=DEV)
    assert LowBoundHeads.of(None, True) is None
    assert LowBoundHeads.of(beta, False) is None
    assert LowBoundHeads.of(beta, True) is not None
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert LowBoundHeads.of(beta, True) is None


def test_kept_while_compiling(exact_calls, monkeypatch):
    """While torch.compile traces, the kernels' dβ is returned as it is (no host choice can be recorded), even for
    heads a forward outside the trace flagged."""
    o, g, i, beta, _ = make_inputs(1, 20, 2, 16, 16, lb=(0.0, 0.0))
    dlb = torch.randn_like(beta)
    low = LowBoundHeads(beta)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert exact_bound_grad(dlb, low, o, g, i, beta, None, None, torch.randn_like(i), None, 1.0, 0, 0) is dlb
    assert exact_calls == []


# --- GPU only -------------------------------------------------------------------------------------------------

@gpu
@pytest.mark.parametrize("fn", FAMILIES)
@pytest.mark.parametrize("flagged", [False, True])
def test_gpu_backward_without_host_sync(fn, flagged):
    """Forward and backward with a bound that needs a gradient make no synchronizing CUDA call (the sync debug mode
    raises on one), with and without a flagged head."""
    o, g, i, beta, _ = make_inputs(2, 128, 4, 64, 64, lb=(0.5, 0.9), dtype=torch.bfloat16)
    if flagged:
        beta[2] = 0.0
    beta.requires_grad_()
    dy = torch.randn_like(i)
    _bound_grad(fn, o, g, i, beta, dy)  # compiles the kernels first
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        _bound_grad(fn, o, g, i, beta, dy)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@gpu
@pytest.mark.parametrize("fn", FAMILIES)
def test_gpu_cuda_graph_keeps_kernel_grad(monkeypatch, fn):
    """A forward and backward captured in a CUDA graph run without a host read, and their replay gives the kernels'
    dβ (as documented: the exact recomputation needs a host choice, which a graph cannot record)."""
    o, g, i, beta, _ = make_inputs(2, 64, 2, 64, 64, lb=(0.5, 0.9), dtype=torch.bfloat16)
    beta[1] = 0.0
    beta.requires_grad_()
    dy = torch.randn_like(i)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # warm-up (kernel compilation) outside the capture
            _bound_grad(fn, o, g, i, beta, dy)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = _bound_grad(fn, o, g, i, beta, dy)
    graph.replay()
    torch.cuda.synchronize()
    monkeypatch.setattr(bound_grad, "THETA", -1.0)  # nothing flagged: the kernels' dβ
    assert torch.equal(captured, _bound_grad(fn, o, g, i, beta, dy))
