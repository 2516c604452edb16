"""The shared harness of the Triton kernel tests: input makers, the fp64 reference comparison (outputs, final
state, every gradient), tolerances by dtype and launch-config overrides.

Without a GPU the kernels run in the Triton interpreter (tests/conftest.py sets TRITON_INTERPRET=1), whose bf16
rounding is the GPU's (`hgrn2/ops/triton/_interpret.py`), so the same tolerances hold on both.
"""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import os

import pytest
import torch

from hgrn2.bench.common import rel_err
from hgrn2.ops.reference import hgrn2_reference
from hgrn2.ops.triton.config import ChunkParallelConfig, DispatchConfig, FusedChunkConfig, current, launch_config

__all__ = ["CUDA", "DEV", "NAMES", "TOL", "check", "gpu", "make_inputs", "needs_triton", "override", "rel_err",
           "run_both", "time_limit"]

CUDA = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEV = "cuda" if CUDA else "cpu"
NAMES = ("o", "g", "i", "lower_bound", "initial_state")
# relative error bounds against the fp64 reference, by input dtype: fp32 math (and fp32 dot operands) for
# fp32 / fp64 inputs, bf16 dot operands (or fp16 inputs) otherwise
TOL = {torch.float64: 1e-4, torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 2e-2}

needs_triton = pytest.mark.skipif(not (CUDA or INTERPRET), reason="needs CUDA or TRITON_INTERPRET=1")
gpu = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")

_FAMILIES = {"fused_chunk": FusedChunkConfig, "chunk_parallel": ChunkParallelConfig, "dispatch": DispatchConfig}


@contextlib.contextmanager
def override(family: str, **fields):
    """The current config of `family` ("fused_chunk", "chunk_parallel", "dispatch") with `fields` replaced, for
    the block."""
    cfg = dataclasses.replace(current(_FAMILIES[family]), **fields)
    with launch_config(**{family: cfg}):
        yield cfg


def make_inputs(B, T, H, K, V, *, g_scale=2.0, lb=(0.05, 0.95), n_states=None, dtype=torch.float32, device=DEV):
    """[o, g, i, β, h0]: random raw projections; lb=(lo, hi) draws β uniformly in [lo, hi) (None leaves it out);
    n_states initial states (None: none)."""
    o = torch.randn(B, T, H, K, device=device)
    g = torch.randn(B, T, H, K, device=device) * g_scale
    i = torch.randn(B, T, H, V, device=device)
    beta = None if lb is None else lb[0] + (lb[1] - lb[0]) * torch.rand(H, K, device=device)
    h0 = None if n_states is None else torch.randn(n_states, H, V, K, device=device)
    return [o.to(dtype), g.to(dtype), i.to(dtype), beta, h0]


def run_both(inputs, fn, bound_grad=True, reference=hgrn2_reference, **kw):
    """fn's outputs and gradients and the fp64 reference's for the same inputs and random cotangents (a random
    final-state cotangent too when the final state is returned): ((y, ht, leaves), (y_ref, ht_ref, ref_leaves)).
    bound_grad=False: the bound takes no gradient (the fused-chunk kernels hand one that does to the chunk-parallel
    ones); reference: the fp64 function to compare with (another for a reversed scan)."""
    final = kw.get("output_final_state", False)
    leaves = [None if x is None else x.clone().requires_grad_(bound_grad or n != 3) for n, x in enumerate(inputs)]
    ref_leaves = [None if x is None else x.detach().double().requires_grad_() for x in inputs]
    y, ht = fn(*leaves[:4], initial_state=leaves[4], **kw)
    y_ref, ht_ref = reference(*ref_leaves[:4], initial_state=ref_leaves[4], **kw)
    dy = torch.randn_like(y_ref)
    loss, loss_ref = (y.double() * dy).sum(), (y_ref * dy).sum()
    if final:
        dht = torch.randn_like(ht_ref)
        loss, loss_ref = loss + (ht.double() * dht).sum(), loss_ref + (ht_ref * dht).sum()
    loss.backward()
    loss_ref.backward()
    return (y, ht, leaves), (y_ref, ht_ref, ref_leaves)


def check(got, ref, tol=None, skip=()):
    """Every output, the final state and every gradient (but those named in skip) within tol (None: by the
    inputs' dtype) of the reference's."""
    (y, ht, leaves), (y_ref, ht_ref, ref_leaves) = got, ref
    tol = TOL[leaves[2].dtype] if tol is None else tol
    assert y.dtype == leaves[2].dtype
    assert rel_err(y, y_ref) <= tol, f"y: {rel_err(y, y_ref):.2e}"
    if ht_ref is not None:
        assert ht.dtype == torch.float32 and ht.shape == ht_ref.shape
        assert rel_err(ht, ht_ref) <= tol, f"final state: {rel_err(ht, ht_ref):.2e}"
    for name, x, x_ref in zip(NAMES, leaves, ref_leaves):
        if x is None or name in skip or not x.requires_grad:
            continue
        assert x.grad is not None, f"d{name} missing"
        assert torch.isfinite(x.grad).all(), f"d{name} not finite"
        err = rel_err(x.grad, x_ref.grad)
        assert err <= tol, f"d{name}: {err:.2e}"


@contextlib.contextmanager
def time_limit(seconds: float):
    """On a GPU, end the process with every thread's traceback if the block runs past `seconds` (a hung kernel
    blocks in C, where only faulthandler's thread acts)."""
    if CUDA:
        faulthandler.dump_traceback_later(seconds, exit=True)
    try:
        yield
    finally:
        if CUDA:
            faulthandler.cancel_dump_traceback_later()
