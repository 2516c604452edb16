"""The quick GPU tier (marker `gpu_quick`, run by `hgrn2 bench tests --quick`): every Triton kernel with every value
of each of its compile-time flags, once, at a small but real shape, against fp64 — outputs, final states and every
gradient.

A Triton kernel compiles once per set of constexpr flags, block sizes and dtypes, and on a cold GPU machine the
compiles are most of a test run's time; so each case below sets a different combination, chosen so that every value
of every flag comes up at least once in as few cases as that takes (the per-file suites cross them further):

- chunk-parallel (`chunk_parallel_{fwd,bwd}.py`): bf16 / fp32 / fp16 dot operands (64- and 32-token chunks), bound
  none / fixed / with a gradient — the small-gates kernel `chunk_parallel_bwd_small_kernel` (β 0, 1e-6 and 2^-9
  behind g = −80, mixed with large β in one head, g = +80 elsewhere) and, behind those closed gates, the fallback
  launches and their exact tier —, initial / final state each on and off, packed sequences, every o_act / i_act, A
  and b kept (fused and split backward) or rebuilt, inference (no A stored);
- fused-chunk (`fused_chunk_{fwd,bwd}.py`): bf16 / fp32 / fp16, fused and split backward, forward and reverse walk,
  the same flags; a bound with a gradient handed over to the chunk-parallel kernels through `hgrn2_triton`, time
  flipped (no new variant);
- the decode kernel (`recurrent.py`: one token into states updated in place or from none; packed sequences through
  the dispatch), the HGRN1 scan (real with chunked passes, complex packed), RMSNorm / LayerNorm (each affine form,
  the residual add), SwiGLU, cross entropy, and the decode projections (`gemv.py`: biases, three weights; SwiGLU
  with the norm prologue and residual).

On a GPU the shapes are the models' head size 128 over 301 tokens (odd; five 64-token chunks), in 96 (sequence, head)
pairs — the launch blocks of training batches — or, packed, in 12 — the smaller blocks the launchers take to fill
the GPU with few pairs (`config.py`). Without a GPU the same cases run in the Triton interpreter at the smallest
blocks, still over several chunks.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch
import torch.nn.functional as F

import hgrn2.ops.cross_entropy as ce_mod
import hgrn2.ops.norm as norm_mod
import hgrn2.ops.swiglu as swiglu_mod
from hgrn2.ops.cross_entropy import linear_cross_entropy
from hgrn2.ops.norm import add_rms_norm, layer_norm, rms_norm
from hgrn2.ops.reference import hgrn2_reference
from hgrn2.ops.swiglu import swiglu_linear
from hgrn2.ops.triton import hgrn2_triton
from hgrn2.ops.triton.chunk_parallel import hgrn2_chunk_parallel_triton
from hgrn2.ops.triton.fused_chunk import hgrn2_fused_chunk_triton
from hgrn2.ops.triton.gemv import gemv, gemv_swiglu
from hgrn2.ops.triton.recurrent import hgrn2_recurrent_triton

from ..test_reverse import flipped_reference
from . import test_hgrn1 as hgrn1_tests
from .harness import CUDA, DEV, TOL, check, make_inputs, needs_triton, override, rel_err, run_both, time_limit
from .test_norm_swiglu import rms_composite

pytestmark = [needs_triton, pytest.mark.gpu_quick,
              # in chunks that decay by nearly the chunk tier's bound, its A overflows above the diagonal (pairs
              # t < s, masked out; the interpreter's numpy warns)
              pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning",
                                         "ignore:invalid value encountered:RuntimeWarning")]

# (sequences, tokens, heads, head size): on a GPU enough (sequence, head) pairs for the launch blocks of training
# batches; packed sequences (lengths summing to the tokens) in few heads: few pairs, for which the launchers split
# their blocks to fill the GPU (another variant of each kernel)
B, T, H, K = (2, 301, 48, 128) if CUDA else (1, 100, 2, 16)
LENS, PACKED_H = ((100, 1, 200), 4) if CUDA else ((30, 1, 69), 2)
BF16, FP32, FP16 = torch.bfloat16, torch.float32, torch.float16


@pytest.fixture(autouse=True)
def gpu_time_limit():
    """A case compiles a few kernels (seconds each); a hung kernel ends the process with tracebacks."""
    with time_limit(120):
        yield


# --- HGRN2: the chunk-parallel and fused-chunk training kernels ----------------------------------------------------

@dataclasses.dataclass
class Case:
    """One combination of an HGRN2 kernel family's compile-time flags (and the inputs that set them)."""

    entry: str  # "parallel", "fused" (their own entry points) or "dispatch" (`hgrn2_triton`)
    dtype: torch.dtype
    bound: str = "fixed"  # "none"; "fixed" (no gradient); "small": a gradient, small gates included
    h0: bool = True
    final: bool = True
    varlen: bool = False
    reverse: bool = False
    acts: tuple = ("silu", None)  # (o_act, i_act)
    grad: bool = True
    config: dict = dataclasses.field(default_factory=dict)  # {family: launch-config fields}


CASES = {
    # the training path: bf16, a learned bound with small gates, states in and out (fused backward reading the
    # kept A)
    "parallel-bf16-small": Case("parallel", BF16, "small"),
    # the same through the dispatch, walked backwards (fused-chunk hands a bound with a gradient over, time flipped)
    "dispatch-bf16-small-reverse": Case("dispatch", BF16, "small", reverse=True),
    "parallel-fp32-small-split-varlen": Case("parallel", FP32, "small", varlen=True, acts=(None, "sigmoid"),
                                             config={"chunk_parallel": dict(bwd_split=True)}),
    "parallel-fp32-rebuilt": Case("parallel", FP32, "none", h0=False, final=False, acts=("sigmoid", "silu"),
                                  config={"chunk_parallel": dict(save_a=False, save_b=False)}),
    "parallel-fp16": Case("parallel", FP16, final=False),
    # few long sequences without autograd: what the dispatch gives the chunk-parallel kernels in inference
    "parallel-bf16-inference-varlen": Case("parallel", BF16, h0=False, varlen=True, grad=False,
                                           acts=("sigmoid", "silu")),
    "fused-bf16-split-varlen-reverse": Case("fused", BF16, varlen=True, reverse=True,
                                            config={"fused_chunk": dict(bwd_split=True)}),
    "fused-bf16": Case("fused", BF16, config={"fused_chunk": dict(bwd_split=False)}),
    "fused-fp32": Case("fused", FP32, "none", h0=False, final=False, acts=("sigmoid", "silu")),
    "fused-fp16-varlen-reverse": Case("fused", FP16, varlen=True, reverse=True, final=False, acts=(None, "sigmoid"),
                                      config={"fused_chunk": dict(bwd_split=False)}),
}


def small_gates(g, beta):
    """Head 1: β 0, 1e-6 and 2^-9 on channels 0-8 (large on the rest) behind g = −80 on tokens 10-39; head 0: g = +80
    (f = 1) on channels 0-3 of tokens 50-89."""
    beta[1, :4], beta[1, 4:8], beta[1, 8] = 0.0, 1e-6, 2.0 ** -9
    g[:, 10:40, 1, :9] = -80.0
    g[:, 50:90, 0, :4] = 80.0


def hgrn2_inputs(case: Case):
    """([o, g, i, β, h0], cu_seqlens or None) for the case."""
    n_seq = len(LENS) if case.varlen else B
    lb = {"none": None, "fixed": (0.05, 0.95), "small": (2.0 ** -8, 0.9)}[case.bound]
    inputs = make_inputs(1 if case.varlen else B, T, PACKED_H if case.varlen else H, K, K, lb=lb,
                         n_states=n_seq if case.h0 else None, dtype=case.dtype)
    if case.bound == "small":
        small_gates(inputs[1], inputs[3])
    cu = torch.tensor([0, *LENS], device=DEV).cumsum(0).to(torch.int32) if case.varlen else None
    return inputs, cu


def launch_config(case: Case):
    """The case's launch settings for the block (the defaults where it sets none)."""
    ((family, fields),) = case.config.items() if case.config else (("dispatch", {}),)
    return override(family, **fields)


ENTRIES = {"parallel": hgrn2_chunk_parallel_triton, "fused": hgrn2_fused_chunk_triton, "dispatch": hgrn2_triton}


@pytest.mark.parametrize("name", list(CASES))
def test_hgrn2(name):
    case = CASES[name]
    inputs, cu = hgrn2_inputs(case)
    o_act, i_act = case.acts
    kw = dict(scale=K ** -0.5, o_act=o_act, i_act=i_act, output_final_state=case.final, cu_seqlens=cu)
    fn = ENTRIES[case.entry]
    if case.reverse:
        fn = functools.partial(fn, reverse=True)
    with launch_config(case):
        if case.grad:
            check(*run_both(inputs, fn, bound_grad=case.bound == "small",
                            reference=flipped_reference if case.reverse else hgrn2_reference, **kw))
            return
        with torch.no_grad():
            y, ht = fn(*inputs[:4], initial_state=inputs[4], **kw)
    o, g, i, beta, h0 = (None if x is None else x.double() for x in inputs)
    y_ref, ht_ref = hgrn2_reference(o, g, i, beta, initial_state=h0, **kw)
    assert y.dtype == case.dtype and rel_err(y, y_ref) <= TOL[case.dtype], rel_err(y, y_ref)
    assert ht.dtype == FP32 and rel_err(ht, ht_ref) <= TOL[case.dtype], rel_err(ht, ht_ref)


# --- the decode kernel -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("o_act,i_act,in_place", [("silu", None, True), (None, "sigmoid", False)])
def test_recurrent_decode_step(o_act, i_act, in_place):
    """One bf16 token per sequence: into the given states, updated in place (the cache's step), or from none."""
    o, g, i, beta, h0 = make_inputs(B, 1, PACKED_H, K, K, lb=(0.0, 1.0), n_states=B if in_place else None,
                                    dtype=BF16)
    kw = dict(o_act=o_act, i_act=i_act, output_final_state=True)
    y_ref, ht_ref = hgrn2_reference(o.double(), g.double(), i.double(), beta.double(),
                                    initial_state=h0.double() if in_place else None, **kw)
    with torch.no_grad():
        y, ht = hgrn2_recurrent_triton(o, g, i, beta, initial_state=h0, final_state_out=h0, **kw)
    assert (ht is h0) == in_place and y.dtype == BF16
    assert rel_err(y, y_ref) <= TOL[BF16] and rel_err(ht, ht_ref) <= TOL[BF16]


def test_recurrent_packed_through_the_dispatch():
    """A few fp32 tokens without autograd (`hgrn2_triton` takes the decode kernel): packed sequences, no bound, no
    states."""
    lens = (3, 1, 5)
    cu = torch.tensor([0, *lens], device=DEV).cumsum(0).to(torch.int32)
    o, g, i, _, _ = make_inputs(1, sum(lens), PACKED_H, K, K, lb=None)
    kw = dict(scale=0.5, o_act="sigmoid", i_act="silu", cu_seqlens=cu)
    with torch.no_grad():
        y, ht = hgrn2_triton(o, g, i, **kw)
    y_ref, _ = hgrn2_reference(o.double(), g.double(), i.double(), **kw)
    assert ht is None and rel_err(y, y_ref) <= TOL[FP32]


# --- HGRN1 ---------------------------------------------------------------------------------------------------------

# (tokens, channels, chunk): two channel blocks of 128 on the GPU
HGRN1_T, HGRN1_D, HGRN1_CHUNK = (T, 256, 64) if CUDA else (37, 40, 8)


def test_hgrn1_real_bf16_chunked():
    """The three-pass scan (chunk end states, the carry, the outputs) in bf16, with a bound, no initial state."""
    x, g, lb, theta, h0 = hgrn1_tests.inputs(2, HGRN1_T, HGRN1_D, dtype=BF16, with_h0=False)
    ours, ref = hgrn1_tests.run_both(x, g, lb, theta, h0, chunk_size=HGRN1_CHUNK)
    hgrn1_tests.assert_close(ours, ref, TOL[BF16])


def test_hgrn1_complex_packed():
    """The complex recurrence on packed sequences (one pass each), with initial states, no bound."""
    cu = torch.tensor([0, *LENS], device=DEV).cumsum(0)
    x, g, lb, theta, h0 = hgrn1_tests.inputs(1, T, HGRN1_D, complex_=True, with_lb=False, N=len(LENS))
    ours, ref = hgrn1_tests.run_both(x, g, lb, theta, h0, cu_seqlens=cu)
    hgrn1_tests.assert_close(ours, ref, TOL[FP32])


# --- the glue: norms, SwiGLU, cross entropy, decode projections ------------------------------------------------

ROWS, D = (3, 37), 384  # odd rows, a width no block divides


@pytest.fixture
def glue_kernels(monkeypatch):
    """The Triton glue for every float input, on the CPU too (interpreter)."""
    for mod in (norm_mod, swiglu_mod, ce_mod):
        monkeypatch.setattr(mod, "_use_triton", lambda x: x.dtype != torch.float64)


def outputs_and_grads(fn, args, cotangents):
    """fn's outputs (one or a tuple) and its inputs' gradients for these cotangents of the outputs."""
    leaves = [a.detach().clone().requires_grad_() for a in args]
    outs = fn(*leaves)
    outs = outs if isinstance(outs, tuple) else (outs,)
    torch.autograd.backward(outs, [c.to(y.dtype) for y, c in zip(outs, cotangents)])
    return [*outs, *(leaf.grad for leaf in leaves)]


def check_glue(fn, args, cotangents, monkeypatch, exact_fn=None, floor=1e-3):
    """fn's outputs and gradients on the kernels against fp64 (exact_fn's, default fn's): within floor, or no worse
    than the PyTorch composite's in the same dtypes."""
    ours = outputs_and_grads(fn, args, cotangents)
    with monkeypatch.context() as m:
        for mod in (norm_mod, swiglu_mod, ce_mod):
            m.setattr(mod, "_use_triton", lambda x: False)
        comp = outputs_and_grads(fn, args, cotangents)
    exact = outputs_and_grads(exact_fn or fn, [a.double() for a in args], [c.double() for c in cotangents])
    for a, c, e in zip(ours, comp, exact):
        assert a.dtype == c.dtype and a.shape == c.shape and torch.isfinite(a).all()
        assert rel_err(a, e) <= max(1.05 * rel_err(c, e), floor), (rel_err(a, e), rel_err(c, e))


def rand(*shape, dtype=FP32, scale=1.0, shift=0.0):
    return (torch.randn(*shape, device=DEV) * scale + shift).to(dtype)


def test_rms_norm_fp32_to_bf16(glue_kernels, monkeypatch):
    """As the blocks call it under autocast: the fp32 residual stream in, bf16 out."""
    x, w = rand(*ROWS, D, scale=2.0, shift=0.5), rand(D, scale=0.3, shift=1.0)
    check_glue(lambda x, w: rms_norm(x, w, 1e-5, BF16), [x, w], [rand(*ROWS, D)], monkeypatch,
               exact_fn=lambda x, w: rms_composite(x, w, 1e-5))


def test_add_rms_norm(glue_kernels, monkeypatch):
    """(x + res, rms_norm(x + res)) with a gradient into both: fp32 x, bf16 residual and output (the block under
    autocast)."""
    x, res, w = rand(*ROWS, D, scale=2.0), rand(*ROWS, D, dtype=BF16), rand(D, scale=0.3, shift=1.0)
    check_glue(lambda x, res, w: add_rms_norm(x, res, w, 1e-5, BF16), [x, res, w],
               [rand(*ROWS, D), rand(*ROWS, D)], monkeypatch,
               exact_fn=lambda x, res, w: (x + res, rms_composite(x + res, w, 1e-5)))


@pytest.mark.parametrize("affine,dtype", [("weight+bias", FP32), ("none", BF16)], ids=["fp32-affine", "bf16-plain"])
def test_layer_norm(glue_kernels, monkeypatch, affine, dtype):
    x = rand(*ROWS, D, dtype=dtype, scale=2.0, shift=0.5)
    params = [rand(D, scale=0.3, shift=1.0), rand(D, scale=0.2)] if affine == "weight+bias" else []
    check_glue(lambda x, *p: layer_norm(x, *(list(p) + [None, None])[:2], 1e-5), [x, *params], [rand(*ROWS, D)],
               monkeypatch, floor=1e-5 if dtype == FP32 else 1e-3)


def test_swiglu_linear_bf16(glue_kernels, monkeypatch):
    args = [rand(*ROWS, D, dtype=BF16), rand(*ROWS, D, dtype=BF16), rand(96, D, dtype=BF16, scale=0.05),
            rand(96, dtype=BF16)]
    check_glue(swiglu_linear, args, [rand(*ROWS, 96)], monkeypatch)


def test_cross_entropy_bf16(glue_kernels, monkeypatch):
    """Loss and gradients with a full and a partial vocabulary block, some labels ignored, several row chunks."""
    V = 2500
    h, w = rand(19, 64, dtype=BF16, scale=0.5), rand(V, 64, dtype=BF16)
    labels = torch.randint(0, V, (19,), device=DEV)
    labels[::4] = -100

    def loss_grads(kernels, h, w):
        monkeypatch.setattr(ce_mod, "_use_triton", lambda x: kernels and x.dtype != torch.float64)
        h, w = h.detach().requires_grad_(), w.detach().requires_grad_()
        loss = linear_cross_entropy(h, w, labels, chunk_size=7)
        return [loss, *torch.autograd.grad(loss * 1.7, (h, w))]

    ours, comp, exact = loss_grads(True, h, w), loss_grads(False, h, w), loss_grads(False, h.double(), w.double())
    for a, c, e in zip(ours, comp, exact):
        assert a.dtype == c.dtype and rel_err(a, e) <= max(1.05 * rel_err(c, e), 1e-3), (rel_err(a, e), rel_err(c, e))


def test_gemv_three_weights_with_biases():
    x = rand(3, D, dtype=BF16)
    ws = [rand(200, D, dtype=BF16, scale=D ** -0.5) for _ in range(3)]
    bs = [rand(200, dtype=BF16) for _ in range(3)]
    ys = gemv(x, ws, bs, None, None, 0.0)
    for y, w, b in zip(ys, ws, bs):
        ref = x.double() @ w.double().t() + b.double()
        # one rounding of an fp32 sum, as F.linear: no worse than it (plus an ulp of slack for the sum's order)
        bound = max(1.5 * rel_err(F.linear(x, w, b), ref), 2 * torch.finfo(BF16).eps)
        assert y.dtype == BF16 and rel_err(y, ref) <= bound


def test_gemv_swiglu_with_norm_and_residual():
    """The decode step's MLP: r = x + res, h = rms_norm(r)·gamma, silu(h gateᵀ)·(h upᵀ), one row."""
    x, res = rand(1, D, dtype=BF16), rand(1, D, dtype=BF16)
    gate, up = (rand(200, D, dtype=BF16, scale=D ** -0.5) for _ in range(2))
    gamma = rand(D, scale=0.3, shift=1.0)
    y, r = gemv_swiglu(x, gate, up, [], res, gamma, 1e-5)
    h = rms_composite((x + res).double(), gamma.double(), 1e-5)
    assert torch.equal(r, x + res)
    assert rel_err(y, F.silu(h @ gate.double().t()) * (h @ up.double().t())) < 2 * torch.finfo(BF16).eps
