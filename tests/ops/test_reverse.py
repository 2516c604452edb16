"""`hgrn2(..., reverse=True)` — the scan from the last token to the first — against the fp64 reference run on
time-flipped inputs (each packed sequence flipped on its own): outputs, final state and every gradient, on every
backend and both Triton training families; and the fused-chunk kernels' in-place reverse walk (no flips)."""

import pytest
import torch

from hgrn2.ops import hgrn2, hgrn2_reference
from hgrn2.ops.triton import DispatchConfig, launch_config

from .triton.harness import DEV, check, make_inputs, needs_triton, override

slow = pytest.mark.slow


def flipped_reference(o, g, i, lb, *, initial_state=None, cu_seqlens=None, output_final_state=False, **kw):
    """The reference on each sequence with its tokens reversed, one packed sequence at a time."""
    bounds = [0, o.shape[1]] if cu_seqlens is None else cu_seqlens.tolist()
    ys, hts = [], []
    for n, (s, e) in enumerate(zip(bounds[:-1], bounds[1:])):
        h0 = initial_state if cu_seqlens is None or initial_state is None else initial_state[n:n + 1]
        y, ht = hgrn2_reference(o[:, s:e].flip(1), g[:, s:e].flip(1), i[:, s:e].flip(1), lb, initial_state=h0,
                                output_final_state=output_final_state, **kw)
        ys.append(y.flip(1))
        hts.append(ht)
    return torch.cat(ys, 1), (torch.cat(hts) if output_final_state else None)


def run_reverse(inputs, backend, **kw):
    """(y, final state, leaves) of `hgrn2(..., reverse=True)` and of the flipped fp64 reference, after backward
    of the same random cotangents of the output and the final state."""
    leaves = [None if x is None else x.clone().requires_grad_() for x in inputs]
    ref_leaves = [None if x is None else x.detach().double().requires_grad_() for x in inputs]
    y, ht = hgrn2(*leaves[:4], initial_state=leaves[4], backend=backend, reverse=True, **kw)
    y_ref, ht_ref = flipped_reference(*ref_leaves[:4], initial_state=ref_leaves[4], **kw)
    dy, dht = torch.randn_like(y_ref), torch.randn_like(ht_ref)
    ((y.double() * dy).sum() + (ht.double() * dht).sum()).backward()
    ((y_ref * dy).sum() + (ht_ref * dht).sum()).backward()
    return (y, ht, leaves), (y_ref, ht_ref, ref_leaves)


PATHS = {  # path → (backend, launch-config context)
    "reference": ("reference", lambda: launch_config()),
    "chunk": ("chunk", lambda: launch_config()),
    "fused": ("triton", lambda: override("fused_chunk", bwd_split=False)),  # small shapes take the fused chunk
    "fused-split": ("triton", lambda: override("fused_chunk", bwd_split=True)),
    "fused-split-v": ("triton", lambda: override("fused_chunk", max_bv_fwd=16, max_bv_bwd=16)),
    "parallel": ("triton", lambda: launch_config(dispatch=DispatchConfig(parallel_train_min_work=1))),
}
TRITON = {"fused", "fused-split", "fused-split-v", "parallel"}


def case(path, T, cu, *marks):
    return pytest.param(path, T, cu, marks=[*marks, *([needs_triton] if path in TRITON else [])])


@pytest.mark.parametrize("path,T,cu", [
    case("reference", 37, None),
    case("chunk", 37, None),
    case("chunk", 70, [0, 33, 34, 70]),
    case("fused", 37, None),
    case("fused", 70, [0, 33, 34, 70]),
    case("fused-split", 37, [0, 20, 23, 37]),
    case("fused-split-v", 37, [0, 20, 23, 37]),
    case("parallel", 37, None),
    case("parallel", 70, [0, 33, 34, 70]),
    case("fused-split", 70, None, slow),
    case("reference", 37, [0, 20, 23, 37], slow),
])
def test_reverse_matches_flipped_reference(path, T, cu):
    backend, config = PATHS[path]
    B = 2 if cu is None else 1
    cu_seqlens = None if cu is None else torch.tensor(cu, device=DEV)
    inputs = make_inputs(B, T, 2, 16, 32, n_states=B if cu is None else len(cu) - 1)
    with config():
        got, ref = run_reverse(inputs, backend, scale=0.25, o_act="silu", i_act="sigmoid", output_final_state=True,
                               cu_seqlens=cu_seqlens)
    check(got, ref)


@needs_triton
@pytest.mark.parametrize("cu", [None, [0, 3, 9]])
def test_reverse_decode_path(cu):
    """A few tokens without autograd take the recurrent Triton kernel, reversed by flipping."""
    B = 2 if cu is None else 1
    cu_seqlens = None if cu is None else torch.tensor(cu, device=DEV)
    o, g, i, lb, h0 = make_inputs(B, 9, 2, 16, 16, n_states=B if cu is None else len(cu) - 1)
    kw = dict(initial_state=h0, output_final_state=True, cu_seqlens=cu_seqlens)
    y, ht = hgrn2(o, g, i, lb, backend="triton", reverse=True, **kw)
    y_ref, ht_ref = flipped_reference(o.double(), g.double(), i.double(), lb.double(), **{**kw, "initial_state":
                                      h0.double()})
    torch.testing.assert_close(y, y_ref.float(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(ht, ht_ref.float(), rtol=1e-4, atol=1e-4)


def _no_copies(*args, **kwargs):
    raise AssertionError("the fused-chunk reverse walk copied a tensor in time order")


@needs_triton
@pytest.mark.parametrize("cu", [None, [0, 20, 37]])
def test_fused_chunk_reverse_takes_no_flips(monkeypatch, cu):
    """The fused-chunk kernels read and write the tensors in place: forward and backward with flips and index
    selects disabled give the flipped reference's results (a bound without a gradient: one that needs one takes the
    chunk-parallel kernels, which flip time)."""
    B = 2 if cu is None else 1
    cu_seqlens = None if cu is None else torch.tensor(cu, device=DEV)
    inputs = make_inputs(B, 37, 1, 16, 16, n_states=B if cu is None else len(cu) - 1)
    leaves = [x.clone().requires_grad_(n != 3) for n, x in enumerate(inputs)]
    kw = dict(initial_state=leaves[4], output_final_state=True, cu_seqlens=cu_seqlens)
    with monkeypatch.context() as m:
        for obj in (torch, torch.Tensor):
            m.setattr(obj, "flip", _no_copies)
            m.setattr(obj, "index_select", _no_copies)
        y, ht = hgrn2(*leaves[:4], backend="triton", reverse=True, **kw)
        (y.sum() + ht.sum()).backward()
    ref = [x.detach().double().requires_grad_() for x in inputs]
    y_ref, ht_ref = flipped_reference(*ref[:4], **{**kw, "initial_state": ref[4]})
    (y_ref.sum() + ht_ref.sum()).backward()
    check((y, ht, leaves), (y_ref, ht_ref, ref))


def test_reverse_must_be_a_bool():
    o, g, i, *_ = make_inputs(1, 4, 1, 16, 16)
    with pytest.raises(ValueError, match="reverse"):
        hgrn2(o, g, i, reverse=1, backend="chunk")


@needs_triton
def test_fused_chunk_reverse_small_bound_gradient():
    """Bounds below SMALL_F: their gradient comes from the chunk-parallel kernels' exact sum, reversed as well."""
    inputs = make_inputs(1, 37, 2, 16, 16, lb=(0.0, 2.0 ** -9), n_states=2)
    with override("fused_chunk", bwd_split=False):
        got, ref = run_reverse(inputs, "triton", output_final_state=True, cu_seqlens=torch.tensor([0, 15, 37]))
    check(got, ref)
