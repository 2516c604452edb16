"""The Triton chunk kernels against the fp64 step-loop reference: outputs, final states and every gradient.

Without a GPU these run in the Triton interpreter (conftest sets TRITON_INTERPRET=1) at small shapes; the
GPU-only tests at the end cover real head sizes, long sequences, torch.compile and a second device.
"""

import faulthandler
import os

import pytest
import torch

from hgrn2.bench.common import rel_err
from hgrn2.ops import hgrn2, hgrn2_reference
from hgrn2.ops.triton import chunk as chunk_mod
from hgrn2.ops.triton import hgrn2_chunk_triton, hgrn2_triton

CUDA = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEV = "cuda" if CUDA else "cpu"
pytestmark = pytest.mark.skipif(not (CUDA or INTERPRET), reason="needs CUDA or TRITON_INTERPRET=1")
NAMES = ("o", "g", "i", "lower_bound", "initial_state")


def make_inputs(B, T, H, K, V, *, g_scale=2.0, lb=(0.05, 0.95), n_states=None, dtype=torch.float32, device=DEV):
    """Random raw projections; lb=(lo, hi) draws β uniformly in [lo, hi), None leaves it out."""
    o = torch.randn(B, T, H, K, device=device)
    g = torch.randn(B, T, H, K, device=device) * g_scale
    i = torch.randn(B, T, H, V, device=device)
    beta = None if lb is None else lb[0] + (lb[1] - lb[0]) * torch.rand(H, K, device=device)
    h0 = None if n_states is None else torch.randn(n_states, H, V, K, device=device)
    return [o.to(dtype), g.to(dtype), i.to(dtype), beta, h0]


def run_both(inputs, **kw):
    """Triton outputs/grads and fp64-reference outputs/grads for the same inputs and random cotangents."""
    final = kw.get("output_final_state", False)
    leaves = [None if x is None else x.clone().requires_grad_() for x in inputs]
    ref_leaves = [None if x is None else x.detach().double().requires_grad_() for x in inputs]
    y, ht = hgrn2_chunk_triton(*leaves[:4], initial_state=leaves[4], **kw)
    y_ref, ht_ref = hgrn2_reference(*ref_leaves[:4], initial_state=ref_leaves[4], **kw)
    dy = torch.randn_like(y_ref)
    loss, loss_ref = (y.double() * dy).sum(), (y_ref * dy).sum()
    if final:
        dht = torch.randn_like(ht_ref)
        loss, loss_ref = loss + (ht.double() * dht).sum(), loss_ref + (ht_ref * dht).sum()
    loss.backward()
    loss_ref.backward()
    return (y, ht, leaves), (y_ref, ht_ref, ref_leaves)


def check(got, ref, tol, skip=()):
    (y, ht, leaves), (y_ref, ht_ref, ref_leaves) = got, ref
    assert y.dtype == leaves[2].dtype
    assert rel_err(y, y_ref) <= tol, f"y: {rel_err(y, y_ref):.2e}"
    if ht_ref is not None:
        assert ht.dtype == torch.float32 and ht.shape == ht_ref.shape
        assert rel_err(ht, ht_ref) <= tol, f"final state: {rel_err(ht, ht_ref):.2e}"
    for name, x, x_ref in zip(NAMES, leaves, ref_leaves):
        if x is None or name in skip:
            continue
        assert torch.isfinite(x.grad).all(), f"d{name} not finite"
        err = rel_err(x.grad, x_ref.grad)
        assert err <= tol, f"d{name}: {err:.2e}"


@pytest.fixture(params=[False, True], ids=["fused", "split"])
def bwd(request, monkeypatch):
    """The backward's reverse sweep fused (one kernel) or split (state sweep + parallel per-sub-block kernel)."""
    monkeypatch.setattr(chunk_mod, "BWD_SPLIT", request.param)


@pytest.fixture
def split_v(monkeypatch):
    """Force V-blocks of 16 so that V = 32 runs as two programs whose partial gradients are summed."""
    for direction in ("fwd", "bwd"):
        monkeypatch.setitem(chunk_mod.TUNING[direction], "max_bv", 16)


@pytest.mark.parametrize("T,K,V,o_act,i_act", [
    (37, 16, 32, "silu", "sigmoid"), (70, 32, 16, None, None), (29, 24, 20, "sigmoid", "sigmoid"),  # padded K, V
])
def test_fp32_matches_reference(T, K, V, o_act, i_act, bwd):
    inputs = make_inputs(2, T, 2, K, V, n_states=2)
    kw = dict(scale=K ** -0.5, o_act=o_act, i_act=i_act, output_final_state=True)
    check(*run_both(inputs, **kw), tol=1e-4)


def test_exact_diagonal_path_everywhere(monkeypatch, bwd):
    """The tree-factorised diagonal block (normally only for fast-forgetting blocks) on ordinary inputs."""
    monkeypatch.setattr(chunk_mod, "FAST_DIAG_MAX_SPREAD", -1.0)
    inputs = make_inputs(2, 37, 2, 16, 16, n_states=2)
    check(*run_both(inputs, scale=0.5, o_act="silu", output_final_state=True), tol=1e-4)


@pytest.mark.parametrize("block_t_fwd,block_t_bwd,max_spread", [(32, 32, 60.0), (32, 16, -1.0), (16, 32, -1.0)])
def test_32_token_steps(monkeypatch, block_t_fwd, block_t_bwd, max_spread, bwd):
    """32-token steps (a tuning option) in either sweep: fast and exact diagonal blocks, odd length, states."""
    monkeypatch.setattr(chunk_mod, "BLOCK_T_FWD", block_t_fwd)
    monkeypatch.setattr(chunk_mod, "BLOCK_T_BWD", block_t_bwd)
    monkeypatch.setattr(chunk_mod, "FAST_DIAG_MAX_SPREAD", max_spread)
    inputs = make_inputs(2, 75, 2, 16, 16, n_states=2)
    check(*run_both(inputs, scale=0.5, o_act="silu", i_act="sigmoid", output_final_state=True), tol=1e-4)


def test_backward_does_not_read_the_forward_state(monkeypatch, split_v, bwd):
    """The backward recomputes the final state in its own steps, so its gradients are the same bits whatever
    the forward's step: d log f's final-state share cancels against its other terms only in the backward's
    rounding (on an H100, bf16 T=4096 with slow decay, dβ was 2-3e-2 off with the forward's 32-token S_T)."""
    inputs = make_inputs(1, 83, 2, 16, 32, g_scale=1.0, lb=(0.5, 0.999), n_states=1, dtype=torch.bfloat16)
    dy, dht = torch.randn(1, 83, 2, 32, dtype=torch.bfloat16), torch.randn(1, 2, 32, 16)
    grads = []
    for block_t in (16, 32):
        monkeypatch.setattr(chunk_mod, "BLOCK_T_FWD", block_t)
        leaves = [x.clone().requires_grad_() for x in inputs]
        y, ht = hgrn2_chunk_triton(*leaves[:4], initial_state=leaves[4], scale=0.25, o_act="silu",
                                   output_final_state=True)
        torch.autograd.backward((y, ht), (dy.to(y.device), dht.to(ht.device)))
        grads.append([x.grad for x in leaves])
    for name, a, b in zip(NAMES, *grads):
        assert torch.equal(a, b), name


def test_backward_form_follows_the_v_split(monkeypatch):
    """By default (BWD_SPLIT, BLOCK_T_BWD None) bf16 inputs whose V is split take the split backward at
    32-token steps, the H100 sweep's winner; whole V blocks and fp32 operands the fused one at 16."""
    import triton.language as tl

    assert chunk_mod.BWD_SPLIT is None and chunk_mod.BLOCK_T_BWD is None
    assert chunk_mod._bwd_form(2, tl.bfloat16) == (True, 32)
    assert chunk_mod._bwd_form(1, tl.bfloat16) == (False, 16)
    assert chunk_mod._bwd_form(2, tl.float32) == (False, 16)
    monkeypatch.setattr(chunk_mod, "BWD_SPLIT", False)
    monkeypatch.setattr(chunk_mod, "BLOCK_T_BWD", 32)
    assert chunk_mod._bwd_form(2, tl.bfloat16) == (False, 32)
    launched = []
    for name in ("_reverse_split", "_reverse_fused"):
        real = getattr(chunk_mod, name)
        monkeypatch.setattr(chunk_mod, name, lambda *a, _real=real, _n=name, **k: launched.append(_n) or _real(*a, **k))
    monkeypatch.setattr(chunk_mod, "BWD_SPLIT", None)
    monkeypatch.setattr(chunk_mod, "BLOCK_T_BWD", None)
    for max_bv, want in ((16, "_reverse_split"), (128, "_reverse_fused")):
        monkeypatch.setitem(chunk_mod.TUNING["bwd"], "max_bv", max_bv)
        inputs = make_inputs(1, 40, 2, 16, 32, n_states=1, dtype=torch.bfloat16)
        check(*run_both(inputs, scale=0.25, o_act="silu", output_final_state=True), tol=2e-2)
        assert launched[-1] == want


def test_split_v_blocks_and_no_bound(split_v, bwd):
    inputs = make_inputs(2, 33, 2, 16, 32, lb=None)
    check(*run_both(inputs, o_act="sigmoid", i_act="silu"), tol=1e-4)


def test_extreme_gates(split_v, bwd):
    """g = ±30 (f → β or f → 1) on a quarter of the entries, β from 0 to 0.999: no overflow, fp32 accuracy.

    The spread of log f inside a 16-token block reaches ~480 here, so the exact diagonal path runs too.
    """
    o, g, i, _, h0 = make_inputs(2, 45, 2, 16, 32, n_states=2)
    wild = torch.rand_like(g) < 0.25
    g = torch.where(wild, 30.0 * torch.sign(torch.randn_like(g)), g)
    g[:, :20, 0] = -30.0  # head 0 forgets almost everything for 20 tokens
    beta = torch.tensor([0.0, 0.5, 0.9, 0.999], device=o.device).repeat(2, 4)
    kw = dict(scale=0.25, o_act="silu", output_final_state=True)
    got, ref = run_both([o, g, i, beta, h0], **kw)
    # dβ = (dL/df)·σ(−g) is formed from d log f / f; at β = 0, g = −30 that divides fp32 rounding by f ≈ e^-30
    check(got, ref, tol=1e-4, skip=("lower_bound",))
    dlb, dlb_ref = got[2][3].grad, ref[2][3].grad
    assert torch.isfinite(dlb).all()
    assert rel_err(dlb[beta > 0], dlb_ref[beta > 0]) <= 1e-4


def test_all_gates_saturated(bwd):
    """Every gate at ±30: outputs and all gradients but dg/dβ to fp32 accuracy; dg, whose entries are all
    ~σ'(30) ≈ 1e-13, to an absolute error far below the scale of the other gradients."""
    o, g, i, _, h0 = make_inputs(2, 40, 2, 16, 16, n_states=2)
    g = 30.0 * torch.sign(torch.randn_like(g))
    beta = torch.tensor([0.0, 0.3, 0.999, 0.7], device=o.device).repeat(2, 4)
    got, ref = run_both([o, g, i, beta, h0], o_act="sigmoid", output_final_state=True)
    check(got, ref, tol=1e-4, skip=("g", "lower_bound"))
    dg, dg_ref = got[2][1].grad, ref[2][1].grad
    assert torch.isfinite(dg).all() and torch.isfinite(got[2][3].grad).all()
    assert (dg.double() - dg_ref).abs().max() <= 1e-5 * ref[2][2].grad.abs().max()


def test_long_sequence_slow_decay(bwd):
    """600 tokens with β up to 0.999 (memory ~1000 tokens): long-range accumulation in fp32."""
    inputs = make_inputs(1, 600, 1, 16, 16, g_scale=1.0, lb=(0.9, 0.999), n_states=1)
    check(*run_both(inputs, scale=0.25, o_act="silu", output_final_state=True), tol=1e-4)


def test_short_sequence_without_grad():
    """A few tokens and no autograd: the decode route (or the chunk kernel where it is absent)."""
    o, g, i, beta, h0 = make_inputs(2, 5, 2, 16, 16, n_states=2)
    with torch.no_grad():
        y, ht = hgrn2_triton(o, g, i, beta, o_act="silu", initial_state=h0, output_final_state=True)
    y_ref, ht_ref = hgrn2_reference(o, g, i, beta, o_act="silu", initial_state=h0, output_final_state=True)
    assert rel_err(y, y_ref) <= 1e-4 and rel_err(ht, ht_ref) <= 1e-4


def test_bf16(bwd):
    """bf16 dot operands (the interpreter rounds as the GPU does, see `_interpret.py`). 300 tokens (19 sequential
    blocks): d log f is a running sum whose terms cancel, and before they were formed from the rounded
    operands dβ was off by 5e-2 here (1.0 on an H100 at T = 2048)."""
    inputs = make_inputs(2, 300, 2, 32, 32, n_states=2, dtype=torch.bfloat16)
    kw = dict(scale=32 ** -0.5, o_act="silu", output_final_state=True)
    check(*run_both(inputs, **kw), tol=2e-2)


def test_varlen_equals_per_sequence_runs(bwd):
    lens = [5, 40, 17]
    cu = torch.tensor([0, 5, 45, 62], device=DEV, dtype=torch.int32)
    o, g, i, beta, h0 = make_inputs(1, sum(lens), 2, 16, 16, n_states=3)
    kw = dict(scale=0.5, o_act="silu", i_act="silu", output_final_state=True)
    got, ref = run_both([o, g, i, beta, h0], cu_seqlens=cu, **kw)
    check(got, ref, tol=1e-4)
    y, ht, _ = got
    for n, (s, e) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        y_n, ht_n = hgrn2_chunk_triton(o[:, s:e], g[:, s:e], i[:, s:e], beta, initial_state=h0[n:n + 1], **kw)
        assert rel_err(y[:, s:e], y_n) <= 1e-6 and rel_err(ht[n:n + 1], ht_n) <= 1e-6


def test_dispatch_and_float64_inputs():
    inputs = make_inputs(1, 20, 1, 16, 16, dtype=torch.float64)
    y, _ = hgrn2(*inputs[:4], backend="triton")
    y_ref, _ = hgrn2_reference(*inputs[:4])
    assert y.dtype == torch.float64 and rel_err(y, y_ref) <= 1e-5


def test_custom_op_registration():
    """Schema and fake (meta) implementation: what torch.compile relies on (autograd is `_Chunk`'s)."""
    o, g, i, beta, h0 = make_inputs(2, 20, 2, 16, 16, n_states=2)
    torch.library.opcheck(chunk_mod.chunk_fwd.op, (o, g, i, beta, h0, None, 0.5, 1, 0, True))
    dy = torch.randn_like(i)
    torch.library.opcheck(chunk_mod.chunk_bwd.op, (o, g, i, beta, h0, None, dy, None, 0.5, 1, 0))


def test_bad_activation_is_a_clear_error():
    o, g, i, *_ = make_inputs(1, 4, 1, 16, 16)
    with pytest.raises(ValueError, match="o_act"):
        hgrn2(o, g, i, o_act="gelu", backend="triton")


# --- GPU only: real head sizes, long sequences, compile, a second device ---------------------------------

gpu = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
GPU_TEST_LIMIT_S = 60  # compile + run of one GPU test; a hung kernel blocks in C, where only faulthandler's thread acts


@pytest.fixture(autouse=True)
def hard_time_limit():
    """On a GPU, end the process with every thread's traceback if one test runs past GPU_TEST_LIMIT_S."""
    if CUDA:
        faulthandler.dump_traceback_later(GPU_TEST_LIMIT_S, exit=True)
    yield
    if CUDA:
        faulthandler.cancel_dump_traceback_later()


@gpu
@pytest.mark.parametrize("K,V", [(64, 64), (128, 128), (256, 256), (128, 64)])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 2e-2), (torch.float16, 2e-2)])
def test_gpu_head_sizes(K, V, dtype, tol, bwd):
    inputs = make_inputs(2, 300, 2, K, V, n_states=2, dtype=dtype)
    kw = dict(scale=K ** -0.5, o_act="silu", output_final_state=True)
    check(*run_both(inputs, **kw), tol=tol)


@gpu
@pytest.mark.parametrize("T", [4096, 65536])
def test_gpu_long_sequences(T, bwd):
    """Long sequences, slow decay: all gradients at 4K; outputs and final state at 64K (the fp64 step-loop
    reference's autograd graph would not be reasonable there)."""
    inputs = make_inputs(1, T, 2, 64, 64, g_scale=1.0, lb=(0.5, 0.999), n_states=1, dtype=torch.bfloat16)
    kw = dict(scale=0.125, o_act="silu", output_final_state=True)
    if T <= 8192:
        check(*run_both(inputs, **kw), tol=2e-2)
        return
    o, g, i, beta, h0 = inputs
    with torch.no_grad():
        y, ht = hgrn2_chunk_triton(o, g, i, beta, initial_state=h0, **kw)
        y_ref, ht_ref = hgrn2_reference(o.double(), g.double(), i.double(), beta.double(),
                                        initial_state=h0.double(), **kw)
    assert torch.isfinite(y).all() and rel_err(y, y_ref) <= 2e-2 and rel_err(ht, ht_ref) <= 2e-2


@gpu
def test_gpu_torch_compile():
    inputs = make_inputs(2, 128, 2, 64, 64, n_states=2, dtype=torch.bfloat16)
    leaves = [x.clone().requires_grad_() for x in inputs]

    @torch.compile(fullgraph=True)
    def f(o, g, i, lb, h0):
        y, ht = hgrn2_chunk_triton(o, g, i, lb, scale=0.125, o_act="silu", initial_state=h0,
                                   output_final_state=True)
        return y.float().square().sum() + ht.sum()

    f(*leaves).backward()
    ref = [x.detach().double().requires_grad_() for x in inputs]
    y, ht = hgrn2_reference(*ref[:4], scale=0.125, o_act="silu", initial_state=ref[4], output_final_state=True)
    (y.square().sum() + ht.sum()).backward()
    for name, x, x_ref in zip(NAMES, leaves, ref):
        assert rel_err(x.grad, x_ref.grad) <= 2e-2, name


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_gpu_second_device():
    inputs = make_inputs(2, 100, 2, 64, 64, n_states=2, device="cuda:1")
    kw = dict(scale=0.125, o_act="silu", output_final_state=True)
    check(*run_both(inputs, **kw), tol=1e-4)


def test_launch_sweep_script_runs(tmp_path):
    """benchmarks/gpu_chunk_sweep.py (the GPU tuning run) on the CPU interpreter, a few settings, each checked
    against the default setting's output."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(root)}
    out = tmp_path / "sweep.json"
    subprocess.run([sys.executable, "benchmarks/gpu_chunk_sweep.py", "--device", "cpu", "--shapes", "1x20x1",
                    "--head-dim", "16", "--budget-s", "6", "--out", str(out)], cwd=root, env=env, check=True,
                   capture_output=True)
    rows = json.loads(out.read_text())
    assert rows[0]["status"] == "ok", rows[0]  # a kernel error is a row, not a crash: show it
    assert rows[0]["max_bv"] == 128 and rows[0]["err_vs_default"] == 0.0
    assert len(rows) >= 3 and all(r["status"] == "ok" for r in rows)
    assert any(r.get("split") for r in rows)  # the split backward is among the first settings
