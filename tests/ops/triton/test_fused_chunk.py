"""The fused-chunk Triton kernels (`hgrn2_fused_chunk_triton`) against the fp64 step-loop reference: outputs,
final states and every gradient.

Without a GPU these run in the Triton interpreter at small shapes; each kernel branch (forward and backward
step sizes, fused and split backward, fast and exact diagonal blocks, V split, varlen, each dot dtype) runs in the
default tier at least once, the rest of the grid under `slow`. The GPU-only tests at the end cover real head
sizes, long sequences, torch.compile and a second device.
"""

import pytest
import torch

from hgrn2.ops import hgrn2, hgrn2_reference
from hgrn2.ops.triton import fused_chunk as fused_chunk_mod
from hgrn2.ops.triton import hgrn2_fused_chunk_triton, hgrn2_triton
from hgrn2.ops.triton.config import FusedChunkConfig

from .harness import DEV, NAMES, check, gpu, make_inputs, needs_triton, override, rel_err, time_limit
from .harness import run_both as _run_both

pytestmark = needs_triton
slow = pytest.mark.slow


def run_both(inputs, **kw):
    """The fused-chunk kernels against fp64 with a bound that takes no gradient (one that does is handed to the
    chunk-parallel kernels: tests/ops/triton/test_small_gates.py)."""
    return _run_both(inputs, hgrn2_fused_chunk_triton, bound_grad=False, **kw)


FUSED, SPLIT = False, True
BOTH_SLOW_SPLIT = [FUSED, pytest.param(SPLIT, marks=slow)]  # fused in the default tier, split under slow
BOTH_SLOW_FUSED = [pytest.param(FUSED, marks=slow), SPLIT]


@pytest.fixture(params=[FUSED, SPLIT], ids=["fused", "split"])
def bwd(request):
    """The backward's reverse sweep fused (one kernel) or split (state sweep + parallel per-step kernel)."""
    with override("fused_chunk", bwd_split=request.param):
        yield request.param


@pytest.fixture
def split_v():
    """V-blocks of 16, so that V = 32 runs as two programs whose partial gradients are summed."""
    with override("fused_chunk", max_bv_fwd=16, max_bv_bwd=16):
        yield


@pytest.mark.parametrize("T,K,V,o_act,i_act,bwd", [
    (37, 16, 32, "silu", "sigmoid", FUSED),
    (29, 24, 20, "sigmoid", "sigmoid", SPLIT),  # padded K, V
    pytest.param(70, 32, 16, None, None, FUSED, marks=slow),
    pytest.param(70, 32, 16, None, None, SPLIT, marks=slow),
    pytest.param(37, 16, 32, "silu", "sigmoid", SPLIT, marks=slow),
    pytest.param(29, 24, 20, "sigmoid", "sigmoid", FUSED, marks=slow),
], indirect=["bwd"])
def test_fp32_matches_reference(T, K, V, o_act, i_act, bwd):
    inputs = make_inputs(2, T, 2, K, V, n_states=2)
    kw = dict(scale=K ** -0.5, o_act=o_act, i_act=i_act, output_final_state=True)
    check(*run_both(inputs, **kw))


@pytest.mark.parametrize("bwd", [FUSED, SPLIT], indirect=True)
def test_exact_diagonal_path_everywhere(bwd):
    """The exact diagonal block (normally only for fast-forgetting steps) on ordinary inputs."""
    with override("fused_chunk", max_spread=-1.0):
        inputs = make_inputs(1, 20, 2, 16, 16, n_states=1)
        check(*run_both(inputs, scale=0.5, o_act="silu", output_final_state=True))


@pytest.mark.parametrize("block_t_fwd,block_t_bwd,max_spread,bwd", [
    (32, 32, 60.0, FUSED),
    pytest.param(32, 32, 60.0, SPLIT, marks=slow),
    pytest.param(32, 16, -1.0, FUSED, marks=slow),
    pytest.param(32, 16, -1.0, SPLIT, marks=slow),
    pytest.param(16, 32, -1.0, FUSED, marks=slow),
    pytest.param(16, 32, -1.0, SPLIT, marks=slow),
], indirect=["bwd"])
def test_step_sizes(block_t_fwd, block_t_bwd, max_spread, bwd):
    """16- and 32-token steps in either sweep, with fast and exact diagonal blocks, odd length, states."""
    with override("fused_chunk", block_t_fwd=block_t_fwd, block_t_bwd=block_t_bwd, max_spread=max_spread):
        inputs = make_inputs(1, 75, 2, 16, 16, n_states=1)
        check(*run_both(inputs, scale=0.5, o_act="silu", i_act="sigmoid", output_final_state=True))


@pytest.mark.parametrize("bwd", BOTH_SLOW_FUSED, indirect=True)
def test_backward_does_not_read_the_forward_state(split_v, bwd):
    """The backward recomputes the final state in its own steps, so its gradients are the same bits whatever
    the forward's step: d log f's final-state share cancels against its other terms only in the backward's
    rounding."""
    inputs = make_inputs(1, 40, 2, 16, 32, g_scale=1.0, lb=(0.5, 0.999), n_states=1, dtype=torch.bfloat16)
    dy, dht = torch.randn(1, 40, 2, 32, dtype=torch.bfloat16), torch.randn(1, 2, 32, 16)
    grads = []
    for block_t in (16, 32):
        with override("fused_chunk", block_t_fwd=block_t):
            leaves = [x.clone().requires_grad_(n != 3) for n, x in enumerate(inputs)]
            y, ht = hgrn2_fused_chunk_triton(*leaves[:4], initial_state=leaves[4], scale=0.25, o_act="silu",
                                             output_final_state=True)
            torch.autograd.backward((y, ht), (dy.to(y.device), dht.to(ht.device)))
        grads.append([x.grad for x in leaves])
    for name, a, b in zip(NAMES, *grads):
        assert (a is None and b is None) or torch.equal(a, b), name


def test_backward_form_follows_the_v_split(monkeypatch):
    """By default bf16 inputs whose V is split take the split backward at 32-token steps; whole V blocks and
    fp32 operands the fused one at 16."""
    import triton.language as tl

    cfg = FusedChunkConfig()
    assert fused_chunk_mod.bwd_form(2, tl.bfloat16, cfg) == (True, 32)
    assert fused_chunk_mod.bwd_form(1, tl.bfloat16, cfg) == (False, 16)
    assert fused_chunk_mod.bwd_form(2, tl.float32, cfg) == (False, 16)
    assert fused_chunk_mod.bwd_form(2, tl.bfloat16, FusedChunkConfig(bwd_split=False, block_t_bwd=32)) == (False, 32)
    launched = []
    for name in ("_reverse_split", "_reverse_fused"):
        real = getattr(fused_chunk_mod, name)
        monkeypatch.setattr(fused_chunk_mod, name,
                            lambda *a, _real=real, _n=name, **k: launched.append(_n) or _real(*a, **k))
    inputs = make_inputs(1, 40, 2, 16, 32, n_states=1, dtype=torch.bfloat16)
    for max_bv, want in ((16, "_reverse_split"), (128, "_reverse_fused")):
        with override("fused_chunk", max_bv_bwd=max_bv):
            check(*run_both(inputs, scale=0.25, o_act="silu", output_final_state=True))
        assert launched[-1] == want


@pytest.mark.parametrize("bwd", BOTH_SLOW_SPLIT, indirect=True)
def test_split_v_blocks_and_no_bound(split_v, bwd):
    inputs = make_inputs(2, 33, 2, 16, 32, lb=None)
    check(*run_both(inputs, o_act="sigmoid", i_act="silu"))


@pytest.mark.parametrize("bwd", BOTH_SLOW_FUSED, indirect=True)
def test_extreme_gates(split_v, bwd):
    """g = ±30 (f → β or f → 1) on a quarter of the entries, β from 0 to 0.999: no overflow, fp32 accuracy.

    The spread of log f inside a 16-token step reaches ~480 here, so the exact diagonal path runs too.
    """
    o, g, i, _, h0 = make_inputs(1, 45, 2, 16, 32, n_states=1)
    wild = torch.rand_like(g) < 0.25
    g = torch.where(wild, 30.0 * torch.sign(torch.randn_like(g)), g)
    g[:, :20, 0] = -30.0  # head 0 forgets almost everything for 20 tokens
    beta = torch.tensor([0.0, 0.5, 0.9, 0.999], device=o.device).repeat(2, 4)
    kw = dict(scale=0.25, o_act="silu", output_final_state=True)
    got, ref = run_both([o, g, i, beta, h0], **kw)
    check(got, ref)


@pytest.mark.parametrize("dtype,bwd_steps", [(torch.float32, None), (torch.bfloat16, None),
                                             (torch.bfloat16, 32)])
def test_one_product_tier_about_the_midpoint(dtype, bwd_steps):
    """A head with β = 0 and log f ≈ −3 per token: its 32-token forward steps decay by ~e^-96, between the 60 a
    reference at the step's start allows and the 120 of the midpoint reference, so `diag_block` forms A in one
    product with factors up to e^{±48}; outputs, states and every gradient still match fp64. bwd_steps 32: the
    split backward in 32-token steps too, whose diagonal gradients take the exact tier there (`diag_grads`)
    beside `diag_block`'s one product."""
    o, g, i, _, h0 = make_inputs(1, 70, 2, 16, 32, n_states=1, dtype=dtype)
    g = g.float()
    g[:, :, 0] = -2.95 + 0.3 * torch.randn_like(g[:, :, 0])  # σ(g) ≈ e^-3
    beta = torch.tensor([0.0, 0.5], device=o.device)[:, None].repeat(1, 16)
    split = {} if bwd_steps is None else dict(bwd_split=True, block_t_bwd=bwd_steps, max_bv_bwd=16)
    with override("fused_chunk", **split):
        got, ref = run_both([o, g.to(dtype), i, beta, h0], scale=0.25, o_act="silu", output_final_state=True)
    check(got, ref)


@pytest.mark.parametrize("bwd", BOTH_SLOW_SPLIT, indirect=True)
def test_all_gates_saturated(bwd):
    """Every gate at ±30: outputs and all gradients but dg to fp32 accuracy; dg, whose entries are all
    ~σ'(30) ≈ 1e-13, to an absolute error far below the scale of the other gradients."""
    o, g, i, _, h0 = make_inputs(1, 40, 2, 16, 16, n_states=1)
    g = 30.0 * torch.sign(torch.randn_like(g))
    beta = torch.tensor([0.0, 0.3, 0.999, 0.7], device=o.device).repeat(2, 4)
    got, ref = run_both([o, g, i, beta, h0], o_act="sigmoid", output_final_state=True)
    check(got, ref, skip=("g",))
    dg, dg_ref = got[2][1].grad, ref[2][1].grad
    assert torch.isfinite(dg).all()
    assert (dg.double() - dg_ref).abs().max() <= 1e-5 * ref[2][2].grad.abs().max()


@slow
def test_long_sequence_slow_decay(bwd):
    """600 tokens with β up to 0.999 (memory ~1000 tokens): long-range accumulation in fp32."""
    inputs = make_inputs(1, 600, 1, 16, 16, g_scale=1.0, lb=(0.9, 0.999), n_states=1)
    check(*run_both(inputs, scale=0.25, o_act="silu", output_final_state=True))


def test_short_sequence_without_grad():
    """A few tokens and no autograd: the decode route."""
    o, g, i, beta, h0 = make_inputs(2, 5, 2, 16, 16, n_states=2)
    with torch.no_grad():
        y, ht = hgrn2_triton(o, g, i, beta, o_act="silu", initial_state=h0, output_final_state=True)
    y_ref, ht_ref = hgrn2_reference(o, g, i, beta, o_act="silu", initial_state=h0, output_final_state=True)
    assert rel_err(y, y_ref) <= 1e-4 and rel_err(ht, ht_ref) <= 1e-4


@slow
def test_bf16(bwd):
    """bf16 dot operands (the interpreter rounds as the GPU does). 300 tokens (19 sequential steps): d log f is a
    running sum whose terms cancel, so they must be formed from the rounded operands."""
    inputs = make_inputs(2, 300, 2, 32, 32, n_states=2, dtype=torch.bfloat16)
    check(*run_both(inputs, scale=32 ** -0.5, o_act="silu", output_final_state=True))


def test_fp16():
    """fp16 inputs: fp32 dot operands in 3 tf32 passes (fp16 cannot hold the e^{±60} factors)."""
    inputs = make_inputs(1, 20, 1, 16, 16, n_states=1, dtype=torch.float16)
    check(*run_both(inputs, scale=0.25, o_act="silu", output_final_state=True))


@pytest.mark.parametrize("bwd", BOTH_SLOW_FUSED, indirect=True)
def test_varlen_equals_per_sequence_runs(bwd):
    lens = [5, 40, 17]
    cu = torch.tensor([0, 5, 45, 62], device=DEV, dtype=torch.int32)
    o, g, i, beta, h0 = make_inputs(1, sum(lens), 2, 16, 16, n_states=3)
    kw = dict(scale=0.5, o_act="silu", i_act="silu", output_final_state=True)
    got, ref = run_both([o, g, i, beta, h0], cu_seqlens=cu, **kw)
    check(got, ref)
    y, ht, _ = got
    for n, (s, e) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        with torch.no_grad():
            y_n, ht_n = hgrn2_fused_chunk_triton(o[:, s:e], g[:, s:e], i[:, s:e], beta, initial_state=h0[n:n + 1],
                                                 **kw)
        assert rel_err(y[:, s:e], y_n) <= 1e-6 and rel_err(ht[n:n + 1], ht_n) <= 1e-6


def test_dispatch_and_float64_inputs():
    inputs = make_inputs(1, 20, 1, 16, 16, dtype=torch.float64)
    y, _ = hgrn2(*inputs[:4], backend="triton")
    y_ref, _ = hgrn2_reference(*inputs[:4])
    assert y.dtype == torch.float64 and rel_err(y, y_ref) <= 1e-5


def test_custom_op_registration():
    """Schema and fake (meta) implementation: what torch.compile relies on (autograd is `_FusedChunk`'s)."""
    o, g, i, beta, h0 = make_inputs(1, 20, 1, 16, 16, n_states=1)
    key = FusedChunkConfig().key
    torch.library.opcheck(fused_chunk_mod.fused_chunk_fwd.op, (o, g, i, beta, h0, None, 0.5, 1, 0, True, False, key))
    dy = torch.randn_like(i)
    torch.library.opcheck(fused_chunk_mod.fused_chunk_bwd.op, (o, g, i, beta, h0, None, dy, None, 0.5, 1, 0, True, key))


def test_bad_activation_is_a_clear_error():
    o, g, i, *_ = make_inputs(1, 4, 1, 16, 16)
    with pytest.raises(ValueError, match="o_act"):
        hgrn2(o, g, i, o_act="gelu", backend="triton")


# --- GPU only: real head sizes, long sequences, compile, a second device ---------------------------------

@pytest.fixture(autouse=True)
def gpu_time_limit():
    """Compile + run of one GPU test takes well under a minute; a hung kernel ends the process with tracebacks."""
    with time_limit(60):
        yield


@gpu
@pytest.mark.parametrize("K,V", [(64, 64), (128, 128), (256, 256), (128, 64)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_gpu_head_sizes(K, V, dtype, bwd):
    inputs = make_inputs(2, 300, 2, K, V, n_states=2, dtype=dtype)
    kw = dict(scale=K ** -0.5, o_act="silu", output_final_state=True)
    check(*run_both(inputs, **kw))


@gpu
@pytest.mark.parametrize("T", [4096, 65536])
def test_gpu_long_sequences(T, bwd):
    """Long sequences, slow decay: all gradients at 4K; outputs and final state at 64K (the fp64 step-loop
    reference's autograd graph would not be reasonable there)."""
    inputs = make_inputs(1, T, 2, 64, 64, g_scale=1.0, lb=(0.5, 0.999), n_states=1, dtype=torch.bfloat16)
    kw = dict(scale=0.125, o_act="silu", output_final_state=True)
    if T <= 8192:
        check(*run_both(inputs, **kw))
        return
    o, g, i, beta, h0 = inputs
    with torch.no_grad():
        y, ht = hgrn2_fused_chunk_triton(o, g, i, beta, initial_state=h0, **kw)
        y_ref, ht_ref = hgrn2_reference(o.double(), g.double(), i.double(), beta.double(),
                                        initial_state=h0.double(), **kw)
    assert torch.isfinite(y).all() and rel_err(y, y_ref) <= 2e-2 and rel_err(ht, ht_ref) <= 2e-2


@gpu
def test_gpu_torch_compile():
    inputs = make_inputs(2, 128, 2, 64, 64, n_states=2, dtype=torch.bfloat16)
    leaves = [x.clone().requires_grad_(n != 3) for n, x in enumerate(inputs)]

    @torch.compile(fullgraph=True)
    def f(o, g, i, lb, h0):
        y, ht = hgrn2_fused_chunk_triton(o, g, i, lb, scale=0.125, o_act="silu", initial_state=h0,
                                         output_final_state=True)
        return y.float().square().sum() + ht.sum()

    f(*leaves).backward()
    ref = [x.detach().double().requires_grad_() for x in inputs]
    y, ht = hgrn2_reference(*ref[:4], scale=0.125, o_act="silu", initial_state=ref[4], output_final_state=True)
    (y.square().sum() + ht.sum()).backward()
    for name, x, x_ref in zip(NAMES, leaves, ref):
        if x.requires_grad:
            assert rel_err(x.grad, x_ref.grad) <= 2e-2, name


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_gpu_second_device():
    inputs = make_inputs(2, 100, 2, 64, 64, n_states=2, device="cuda:1")
    kw = dict(scale=0.125, o_act="silu", output_final_state=True)
    check(*run_both(inputs, **kw))


@slow
def test_launch_sweep_script_runs(tmp_path):
    """benchmarks/gpu_fused_chunk_sweep.py (the GPU tuning run) on the CPU interpreter, a few settings, each checked
    against the default setting's output."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(root)}
    out = tmp_path / "sweep.json"
    subprocess.run([sys.executable, "benchmarks/gpu_fused_chunk_sweep.py", "--device", "cpu", "--shapes", "1x20x1",
                    "--head-dim", "16", "--budget-s", "6", "--out", str(out)], cwd=root, env=env, check=True,
                   capture_output=True)
    rows = json.loads(out.read_text())
    assert rows[0]["status"] == "ok", rows[0]  # a kernel error is a row, not a crash: show it
    assert rows[0]["max_bv"] == 128 and rows[0]["err_vs_default"] == 0.0
    assert len(rows) >= 3 and all(r["status"] == "ok" for r in rows)
    assert any(r.get("split") for r in rows)  # the split backward is among the first settings
