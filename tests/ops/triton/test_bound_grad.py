"""The lower bound's gradient below THETA (`bound_grad.exact_bound_grad`): recomputed exactly for the heads that hold
such a bound, in both training families, with packed sequences, initial states and a final-state cotangent."""

import pytest
import torch

from hgrn2.ops.triton import bound_grad
from hgrn2.ops.triton.bound_grad import THETA, exact_bound_grad
from hgrn2.ops.triton.chunk_parallel import hgrn2_chunk_parallel_triton
from hgrn2.ops.triton.fused_chunk import hgrn2_fused_chunk_triton

from .harness import DEV, check, make_inputs, needs_triton, run_both

pytestmark = needs_triton
FAMILIES = [hgrn2_fused_chunk_triton, hgrn2_chunk_parallel_triton]


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


# the chunk-parallel chunk tier also runs the chunks past its bound, whose outputs the fallback launch rewrites (the
# interpreter's numpy warns of their overflow)
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning",
                            "ignore:invalid value encountered:RuntimeWarning")
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


def test_kept_while_compiling(exact_calls, monkeypatch):
    """While torch.compile traces, the kernels' dβ is returned as it is (no host sync can be recorded)."""
    o, g, i, beta, _ = make_inputs(1, 20, 2, 16, 16, lb=(0.0, 0.0))
    dlb = torch.randn_like(beta)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert exact_bound_grad(dlb, o, g, i, beta, None, None, torch.randn_like(i), None, 1.0, 0, 0) is dlb
    assert exact_calls == []
