"""The Triton decode kernel (`hgrn2_recurrent_triton`) against the fp64 step-loop reference."""


import pytest
import torch

from hgrn2.ops.reference import hgrn2_reference
from hgrn2.ops.triton.recurrent import hgrn2_recurrent_triton

from .harness import DEV, TOL, make_inputs, needs_triton, rel_err

pytestmark = needs_triton


def inputs(B, T, H, K, V, dtype=torch.float32, g_scale=3.0, with_lb=True, with_h0=True, N=None):
    """(o, g, i, β ~ U(0, 1) or None, N or B initial states or None)."""
    return make_inputs(B, T, H, K, V, g_scale=g_scale, lb=(0.0, 1.0) if with_lb else None,
                       n_states=(N or B) if with_h0 else None, dtype=dtype)


def reference(o, g, i, lb, h0, **kw):
    o, g, i, lb, h0 = (None if x is None else x.double() for x in (o, g, i, lb, h0))
    return hgrn2_reference(o, g, i, lb, initial_state=h0, output_final_state=True, **kw)


FAST = [(7, None, None, True, True), (7, "silu", None, False, False), (1, "sigmoid", "silu", True, True)]
GRID = [(T, *acts, *opt) for T in (1, 7) for acts in ((None, None), ("silu", None), ("sigmoid", "silu"))
        for opt in ((True, True), (False, False))]


@pytest.mark.parametrize("T,o_act,i_act,with_lb,with_h0",
                         FAST + [pytest.param(*p, marks=pytest.mark.slow) for p in GRID if p not in FAST])
def test_matches_reference_fp32(T, o_act, i_act, with_lb, with_h0):
    o, g, i, lb, h0 = inputs(2, T, 3, 16, 32, with_lb=with_lb, with_h0=with_h0)
    kw = dict(scale=0.25, o_act=o_act, i_act=i_act)
    y, ht = hgrn2_recurrent_triton(o, g, i, lb, initial_state=h0, output_final_state=True, **kw)
    y_ref, ht_ref = reference(o, g, i, lb, h0, **kw)
    assert y.dtype == i.dtype and ht.dtype == torch.float32 and ht.shape == (2, 3, 32, 16)
    assert rel_err(y, y_ref) <= 1e-4
    assert rel_err(ht, ht_ref) <= 1e-4


def test_odd_head_dims_and_no_final_state():
    o, g, i, lb, h0 = inputs(1, 5, 2, 12, 20)
    y, ht = hgrn2_recurrent_triton(o, g, i, lb, initial_state=h0)
    assert ht is None
    assert rel_err(y, reference(o, g, i, lb, h0)[0]) <= 1e-4


def test_bf16():
    o, g, i, lb, h0 = inputs(2, 3, 2, 32, 32, dtype=torch.bfloat16)
    y, ht = hgrn2_recurrent_triton(o, g, i, lb, o_act="silu", initial_state=h0, output_final_state=True)
    y_ref, ht_ref = reference(o, g, i, lb, h0, o_act="silu")
    assert y.dtype == torch.bfloat16
    assert rel_err(y, y_ref) <= TOL[torch.bfloat16] and rel_err(ht, ht_ref) <= TOL[torch.bfloat16]


def test_extreme_gates():
    o, g, i, _, h0 = inputs(2, 9, 2, 16, 16)
    g = torch.where(torch.rand_like(g) < 0.5, -30.0, 30.0)
    lb = torch.full((2, 16), 0.999, device=DEV)
    lb[0, :4] = 0.0
    y, ht = hgrn2_recurrent_triton(o, g, i, lb, initial_state=h0, output_final_state=True)
    y_ref, ht_ref = reference(o, g, i, lb, h0)
    assert torch.isfinite(y).all()
    assert rel_err(y, y_ref) <= 1e-4 and rel_err(ht, ht_ref) <= 1e-4


def test_varlen_equals_separate_runs():
    lens = [3, 1, 6]
    cu = torch.tensor([0, 3, 4, 10], device=DEV, dtype=torch.int32)
    o, g, i, lb, h0 = inputs(1, sum(lens), 2, 16, 16, N=len(lens))
    kw = dict(scale=0.5, o_act="silu")
    y, ht = hgrn2_recurrent_triton(o, g, i, lb, initial_state=h0, output_final_state=True, cu_seqlens=cu, **kw)
    y_ref, ht_ref = reference(o, g, i, lb, h0, cu_seqlens=cu, **kw)
    assert rel_err(y, y_ref) <= 1e-4 and rel_err(ht, ht_ref) <= 1e-4
    c = cu.tolist()
    for n in range(len(lens)):
        s = slice(c[n], c[n + 1])
        y_n, ht_n = hgrn2_recurrent_triton(o[:, s], g[:, s], i[:, s], lb, initial_state=h0[n:n + 1],
                                           output_final_state=True, **kw)
        assert torch.allclose(y[:, s], y_n, rtol=1e-5, atol=1e-6)
        assert torch.allclose(ht[n:n + 1], ht_n, rtol=1e-5, atol=1e-6)


def test_in_place_state_for_the_cache():
    o, g, i, lb, h0 = inputs(2, 4, 2, 16, 32)
    y_ref, ht_ref = reference(o, g, i, lb, h0)
    state = h0.clone()
    y, ht = hgrn2_recurrent_triton(o, g, i, lb, initial_state=state, final_state_out=state)
    assert ht is state
    assert rel_err(y, y_ref) <= 1e-4 and rel_err(state, ht_ref) <= 1e-4


def test_returns_new_state_by_default():
    o, g, i, lb, h0 = inputs(1, 2, 1, 16, 16)
    before = h0.clone()
    _, ht = hgrn2_recurrent_triton(o, g, i, lb, initial_state=h0, output_final_state=True)
    assert torch.equal(h0, before) and ht.data_ptr() != h0.data_ptr()


def test_refuses_grad():
    o, g, i, lb, _ = inputs(1, 2, 1, 16, 16)
    with pytest.raises(RuntimeError, match="forward-only"):
        hgrn2_recurrent_triton(o.detach().requires_grad_(), g, i, lb)
    with torch.no_grad():
        hgrn2_recurrent_triton(o, g, i, lb)


def test_bad_state_buffer():
    o, g, i, lb, h0 = inputs(1, 2, 1, 16, 16)
    with pytest.raises(ValueError, match="final_state_out"):
        hgrn2_recurrent_triton(o, g, i, lb, initial_state=h0, final_state_out=h0.double())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("B", [1, 64])
def test_gpu_decode_step_full_size(B):
    o, g, i, lb, h0 = inputs(B, 1, 16, 128, 128, dtype=torch.bfloat16)
    y, ht = hgrn2_recurrent_triton(o, g, i, lb, scale=128 ** -0.5, o_act="silu", initial_state=h0,
                                   output_final_state=True)
    y_ref, ht_ref = reference(o, g, i, lb, h0, scale=128 ** -0.5, o_act="silu")
    assert rel_err(y, y_ref) <= 2e-2 and rel_err(ht, ht_ref) <= 1e-4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_long_fp32():
    o, g, i, lb, h0 = inputs(3, 200, 4, 64, 128)
    y, ht = hgrn2_recurrent_triton(o, g, i, lb, initial_state=h0, output_final_state=True)
    y_ref, ht_ref = reference(o, g, i, lb, h0)
    assert rel_err(y, y_ref) <= 1e-4 and rel_err(ht, ht_ref) <= 1e-4


def test_custom_op_registration():
    from hgrn2.ops.triton.recurrent import _launch
    o, g, i, lb, h0 = inputs(1, 3, 2, 16, 16)
    ht = torch.empty_like(h0)
    torch.library.opcheck(_launch.op, (o, g, i, lb, h0, ht, None, 0.5, 1, 0))


def test_under_torch_compile():
    o, g, i, lb, h0 = inputs(2, 3, 2, 16, 16)

    def step(o, g, i, lb, h0):
        return hgrn2_recurrent_triton(o, g, i, lb, o_act="silu", initial_state=h0, output_final_state=True)

    y, ht = torch.compile(step, backend="aot_eager", fullgraph=True)(o, g, i, lb, h0)
    y_ref, ht_ref = reference(o, g, i, lb, h0, o_act="silu")
    assert rel_err(y, y_ref) <= 1e-4 and rel_err(ht, ht_ref) <= 1e-4


def test_non_contiguous_inputs():
    o, g, i, lb, h0 = inputs(2, 3, 2, 16, 32)
    o = o.transpose(0, 1).contiguous().transpose(0, 1)
    g = torch.randn(2, 3, 2, 32, device=DEV)[..., ::2]
    h0 = h0.transpose(2, 3).contiguous().transpose(2, 3)
    assert not (o.is_contiguous() or g.is_contiguous() or h0.is_contiguous())
    y, ht = hgrn2_recurrent_triton(o, g, i, lb, initial_state=h0, output_final_state=True)
    y_ref, ht_ref = reference(o, g, i, lb, h0)
    assert rel_err(y, y_ref) <= 1e-4 and rel_err(ht, ht_ref) <= 1e-4
