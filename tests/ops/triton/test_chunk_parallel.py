"""The chunk-parallel Triton kernels (`hgrn2_cp_triton`) against the fp64 step-loop reference.

Outputs, final states and every gradient (do, dg, di, dβ, d initial_state, with a final-state cotangent).
Without a GPU these run in the Triton interpreter (conftest sets TRITON_INTERPRET=1) at small shapes; the
GPU-only tests at the end cover real head sizes and torch.compile.
"""

import faulthandler
import os

import pytest
import torch

from hgrn2.bench.common import rel_err
from hgrn2.ops import hgrn2_reference
from hgrn2.ops.triton import cp as cp_mod
from hgrn2.ops.triton.cp import hgrn2_cp_triton

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


def run_both(inputs, fn=hgrn2_cp_triton, **kw):
    """Kernel outputs/grads and fp64-reference outputs/grads for the same inputs and random cotangents
    (a random final-state cotangent dht too when the final state is returned)."""
    final = kw.get("output_final_state", False)
    leaves = [None if x is None else x.clone().requires_grad_() for x in inputs]
    ref_leaves = [None if x is None else x.detach().double().requires_grad_() for x in inputs]
    y, ht = fn(*leaves[:4], initial_state=leaves[4], **kw)
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
        assert x.grad is not None, f"d{name} missing"
        assert torch.isfinite(x.grad).all(), f"d{name} not finite"
        err = rel_err(x.grad, x_ref.grad)
        assert err <= tol, f"d{name}: {err:.2e}"


@pytest.fixture(autouse=True)
def production_chunks(monkeypatch):
    """fp32 inputs normally run in 32-token chunks (BT_FP32); here they take the bf16 path's 64 (the math is
    the same, and the interpreter computes every dot in fp32), except where a test sets it."""
    monkeypatch.setattr(cp_mod, "BT_FP32", cp_mod.BT)


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 16: V = 32 runs as two programs whose partial do/dg are summed, the parallel kernels loop
    over two K-blocks, the sequential state kernels run K = 32 as two column blocks."""
    monkeypatch.setattr(cp_mod, "BV", 16)
    monkeypatch.setattr(cp_mod, "BK", 16)
    monkeypatch.setattr(cp_mod, "BK_BWD", 16)
    monkeypatch.setattr(cp_mod, "BK_SEQ", 16)


@pytest.mark.parametrize("T,K,V,o_act,i_act", [
    (150, 16, 32, "silu", "sigmoid"),  # three chunks, the last partial
    (37, 32, 16, None, None),  # one partial chunk, T not a multiple of 16
    (64, 24, 20, "sigmoid", "silu"),  # exactly one chunk; padded K, V
    (77, 16, 16, "silu", None),
])
def test_fp32_matches_reference(T, K, V, o_act, i_act):
    inputs = make_inputs(2, T, 2, K, V, n_states=2)
    kw = dict(scale=K ** -0.5, o_act=o_act, i_act=i_act, output_final_state=True)
    check(*run_both(inputs, **kw), tol=1e-4)


def test_sequential_blocks_shrink_for_few_sequence_heads(monkeypatch):
    """With few (sequence, head) pairs the sequential state kernels take smaller blocks (K first, then V, down
    to 32 × 32) until their programs fill half the SMs; the results stay the reference's."""
    monkeypatch.setattr(cp_mod, "_sm_count", lambda device: 132)
    o = torch.empty(1, 64, 16, 128, dtype=torch.bfloat16)
    seq_blocks = {nh: cp_mod._config(o, o, nh)[3:5] for nh in (1, 16, 32, 128)}
    assert seq_blocks == {1: (32, 32), 16: (32, 64), 32: (32, 128), 128: (64, 128)}
    monkeypatch.setattr(cp_mod, "_sm_count", lambda device: 64)  # K = V = 64 at N·H = 4: 32 × 32 blocks
    inputs = make_inputs(2, 150, 2, 64, 64, n_states=2)
    check(*run_both(inputs, scale=0.125, o_act="silu", output_final_state=True), tol=1e-4)


def test_default_blocks_at_head_size_64():
    """K = V = 64 with the default blocks (fwd K-block 64, backward K-loop of two 32-wide blocks, whole V)."""
    inputs = make_inputs(1, 130, 1, 64, 64, n_states=1)
    check(*run_both(inputs, scale=0.125, o_act="silu", output_final_state=True), tol=1e-4)


def test_no_state_no_bound_split_blocks(small_blocks):
    inputs = make_inputs(2, 70, 2, 32, 32, lb=None)
    check(*run_both(inputs, o_act="sigmoid", i_act="silu"), tol=1e-4)


def test_split_blocks_with_states(small_blocks):
    inputs = make_inputs(1, 70, 2, 32, 32, n_states=1)
    check(*run_both(inputs, scale=0.3, o_act="silu", output_final_state=True), tol=1e-4)


def test_float64_inputs_and_initial_state_without_final():
    """fp64 inputs run in fp32 and come back as fp64; an initial state without the final one."""
    inputs = make_inputs(1, 90, 2, 16, 16, n_states=1, dtype=torch.float64)
    inputs[3], inputs[4] = inputs[3].double(), inputs[4].double()
    got, ref = run_both(inputs, scale=0.5, o_act="silu")
    assert got[0].dtype == torch.float64
    check(got, ref, tol=1e-4)


# the intra-chunk tiers (cp_fwd.py), forced by the thresholds: (CHUNK_MAX_SPREAD, FAST_DIAG_MAX_SPREAD)
TIERS = {"chunk": (120.0, 60.0), "sub-block": (-1.0, 60.0), "exact": (-1.0, -1.0)}


def force_tier(monkeypatch, tier):
    chunk, sub = TIERS[tier]
    monkeypatch.setattr(cp_mod, "CHUNK_MAX_SPREAD", chunk)
    monkeypatch.setattr(cp_mod, "FAST_DIAG_MAX_SPREAD", sub)


@pytest.mark.parametrize("tier", ["sub-block", "exact"])
def test_fallback_tiers_everywhere(monkeypatch, tier):
    """The second launch's tiers, normally only for chunks that decay by more than e^-120, on ordinary inputs."""
    force_tier(monkeypatch, tier)
    inputs = make_inputs(1, 70, 1, 16, 16, n_states=1)
    check(*run_both(inputs, scale=0.5, o_act="silu", i_act="sigmoid", output_final_state=True), tol=1e-4)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy overflows, on purpose
def test_fallback_takes_exactly_the_chunks_past_the_chunk_tier(monkeypatch):
    """A chunk that decays by e^-1920 (g = −30 at β = 0 on every token) is the second launch's: forced into the
    chunk tier it overflows, and every other chunk's output is unchanged, bit for bit."""
    o, g, i, beta, _ = make_inputs(1, 192, 1, 16, 16)
    g[:, 64:128] = -30.0
    beta = torch.zeros_like(beta)
    y_ref, _ = hgrn2_cp_triton(o, g, i, beta)
    assert torch.isfinite(y_ref).all()
    monkeypatch.setattr(cp_mod, "CHUNK_MAX_SPREAD", 1e9)
    y, _ = hgrn2_cp_triton(o, g, i, beta)
    assert not torch.isfinite(y[:, 64:128]).all()
    assert torch.equal(y[:, :64], y_ref[:, :64]) and torch.equal(y[:, 128:], y_ref[:, 128:])


@pytest.mark.parametrize("tier", list(TIERS))
def test_split_backward(monkeypatch, small_blocks, tier):
    """A rebuilt in the backward (SAVE_A off), which then takes two launches (dv; dq/dk/dg) by default, and b
    computed there again (SAVE_B off); every intra tier; split K and V blocks."""
    monkeypatch.setattr(cp_mod, "SAVE_A", False)
    monkeypatch.setattr(cp_mod, "SAVE_B", False)
    monkeypatch.setattr(cp_mod, "BWD_SPLIT", None)
    force_tier(monkeypatch, tier)
    inputs = make_inputs(1, 40 if tier == "exact" else 70, 1, 32, 32, n_states=1)
    check(*run_both(inputs, scale=0.3, o_act="silu", i_act="sigmoid", output_final_state=True), tol=1e-4)


@pytest.mark.parametrize("split", [True, False])
@pytest.mark.parametrize("tier", list(TIERS))
def test_saved_A(monkeypatch, small_blocks, split, tier):
    """SAVE_A: the forward keeps A and the backward's dv reads it (split and fused backward; every intra tier;
    V split in two blocks, of which only the first stores A)."""
    monkeypatch.setattr(cp_mod, "SAVE_A", True)
    monkeypatch.setattr(cp_mod, "BWD_SPLIT", split)
    force_tier(monkeypatch, tier)
    inputs = make_inputs(1, 40 if tier == "exact" else 70, 1, 32, 32, n_states=1)
    check(*run_both(inputs, scale=0.3, o_act="silu", i_act="sigmoid", output_final_state=True), tol=1e-4)


def test_A_and_b_are_kept_only_for_a_backward(monkeypatch):
    """The default keeps A and b when a gradient will be taken, and not in inference (no_grad or no leaf needing
    one)."""
    assert cp_mod.SAVE_A and cp_mod.SAVE_B and cp_mod.BWD_SPLIT is None
    kept = []
    fwd = cp_mod.cp_fwd

    def spy(*args):
        out = fwd(*args)
        kept.append((out[3].numel() > 0, out[4].numel() > 0))
        return out

    monkeypatch.setattr(cp_mod, "cp_fwd", spy)
    o, g, i, lb, _ = make_inputs(1, 20, 1, 16, 16)
    hgrn2_cp_triton(o, g, i.requires_grad_(), lb)
    with torch.no_grad():
        hgrn2_cp_triton(o, g, i, lb)
    hgrn2_cp_triton(o, g, i.detach(), lb)
    assert kept == [(True, True), (False, False), (False, False)]


@pytest.mark.parametrize("save_b", [True, False])
def test_saved_A_varlen_bf16(monkeypatch, save_b):
    """SAVE_A with packed sequences (padding chunks) and bf16 operands (A kept in bf16), b kept or not."""
    monkeypatch.setattr(cp_mod, "SAVE_A", True)
    monkeypatch.setattr(cp_mod, "SAVE_B", save_b)
    lens = [5, 70, 17]
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), device=DEV, dtype=torch.int32)
    inputs = make_inputs(1, sum(lens), 2, 32, 32, n_states=len(lens), dtype=torch.bfloat16)
    check(*run_both(inputs, cu_seqlens=cu, scale=32 ** -0.5, o_act="silu", output_final_state=True), tol=2e-2)


def test_32_token_chunks(monkeypatch):
    """The fp32 default (BT_FP32 = 32)."""
    monkeypatch.setattr(cp_mod, "BT_FP32", 32)
    inputs = make_inputs(2, 75, 2, 16, 16, n_states=2)
    check(*run_both(inputs, scale=0.5, o_act="silu", output_final_state=True), tol=1e-4)


# the chunk-tier launch also runs the chunks past its bound (their e^{m − b} overflow: the interpreter's numpy warns),
# and the fallback launch then rewrites every output of theirs
PAST_TIER = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning",
                                       "ignore:invalid value encountered:RuntimeWarning")


@PAST_TIER
def test_extreme_gates():
    """g = ±30 on a quarter of the entries, β from 0 to 0.999: the 16-token spread reaches hundreds, so the
    exact intra path runs on some chunks and the fast path on others; no overflow, fp32 accuracy."""
    o, g, i, _, h0 = make_inputs(2, 100, 2, 16, 32, n_states=2)
    wild = torch.rand_like(g) < 0.25
    g = torch.where(wild, 30.0 * torch.sign(torch.randn_like(g)), g)
    g[:, :20, 0] = -30.0  # head 0 forgets almost everything for 20 tokens
    g[1, 64:] = g[1, 64:].clamp(-2, 2)  # a calm second chunk in sequence 1: the fast path there
    beta = torch.tensor([0.0, 0.5, 0.9, 0.999], device=o.device).repeat(2, 4)
    kw = dict(scale=0.25, o_act="silu", output_final_state=True)
    got, ref = run_both([o, g, i, beta, h0], **kw)
    # dβ = (dL/df)·σ(−g) is formed from d log f / f; at β = 0, g = −30 that divides fp32 rounding by f ≈ e^-30
    check(got, ref, tol=1e-4, skip=("lower_bound",))
    dlb, dlb_ref = got[2][3].grad, ref[2][3].grad
    assert torch.isfinite(dlb).all()
    assert rel_err(dlb[beta > 0], dlb_ref[beta > 0]) <= 1e-4


@PAST_TIER
def test_all_gates_saturated():
    """Every gate at ±30: outputs and all gradients but dg/dβ to fp32 accuracy; dg (entries ~σ'(30) ≈ 1e-13)
    to an absolute error far below the scale of the other gradients."""
    o, g, i, _, h0 = make_inputs(2, 40, 2, 16, 16, n_states=2)
    g = 30.0 * torch.sign(torch.randn_like(g))
    beta = torch.tensor([0.0, 0.3, 0.999, 0.7], device=o.device).repeat(2, 4)
    got, ref = run_both([o, g, i, beta, h0], o_act="sigmoid", output_final_state=True)
    check(got, ref, tol=1e-4, skip=("g", "lower_bound"))
    dg, dg_ref = got[2][1].grad, ref[2][1].grad
    assert torch.isfinite(dg).all() and torch.isfinite(got[2][3].grad).all()
    assert (dg.double() - dg_ref).abs().max() <= 1e-5 * ref[2][2].grad.abs().max()


def test_long_sequence_slow_decay():
    """400 tokens (7 chunks) with β up to 0.999: long-range accumulation through the stored chunk states."""
    inputs = make_inputs(1, 400, 1, 16, 16, g_scale=1.0, lb=(0.9, 0.999), n_states=1)
    check(*run_both(inputs, scale=0.25, o_act="silu", output_final_state=True), tol=1e-4)


def test_bf16():
    """bf16 dot operands, as rounded on the GPU (`_interpret.py`); 300 tokens: before d log f's cancelling
    terms were formed from the rounded operands, dβ was off by 6e-2 here."""
    inputs = make_inputs(2, 300, 2, 32, 32, n_states=2, dtype=torch.bfloat16)
    check(*run_both(inputs, scale=32 ** -0.5, o_act="silu", output_final_state=True), tol=2e-2)


def test_fp16():
    """fp16 inputs: fp32 dot operands and fp32 stored states (32-token chunks outside these tests)."""
    inputs = make_inputs(1, 70, 2, 32, 32, n_states=1, dtype=torch.float16)
    check(*run_both(inputs, scale=32 ** -0.5, o_act="silu", output_final_state=True), tol=2e-2)


@pytest.mark.parametrize("lens", [[5, 70, 17, 1, 64], [130]])
def test_varlen_equals_per_sequence_runs(lens):
    """Packed sequences (one of a single token, one of exactly 64, one over 2 chunks): no chunk crosses a boundary."""
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), device=DEV, dtype=torch.int32)
    o, g, i, beta, h0 = make_inputs(1, sum(lens), 2, 16, 16, n_states=len(lens))
    kw = dict(scale=0.5, o_act="silu", i_act="silu", output_final_state=True)
    got, ref = run_both([o, g, i, beta, h0], cu_seqlens=cu, **kw)
    check(got, ref, tol=1e-4)
    y, ht, _ = got
    for n, (s, e) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        with torch.no_grad():
            y_n, ht_n = hgrn2_cp_triton(o[:, s:e], g[:, s:e], i[:, s:e], beta, initial_state=h0[n:n + 1], **kw)
        assert rel_err(y[:, s:e], y_n) <= 1e-6 and rel_err(ht[n:n + 1], ht_n) <= 1e-6


def test_same_as_sequential_kernel():
    """Agrees with the sequential chunk kernel (hgrn2_chunk_triton) to fp32 rounding, gradients included."""
    from hgrn2.ops.triton.chunk import hgrn2_chunk_triton
    inputs = make_inputs(1, 80, 2, 16, 16, n_states=1)
    kw = dict(scale=0.5, o_act="silu", output_final_state=True)
    torch.manual_seed(1)
    a, _ = run_both(inputs, fn=hgrn2_cp_triton, **kw)
    torch.manual_seed(1)
    b, _ = run_both(inputs, fn=hgrn2_chunk_triton, **kw)
    assert rel_err(a[0], b[0]) <= 1e-5 and rel_err(a[1], b[1]) <= 1e-5
    for x, x2 in zip(a[2], b[2]):
        assert rel_err(x.grad, x2.grad) <= 1e-4


def test_custom_op_registration():
    """Schema and fake (meta) implementation: what torch.compile relies on (autograd is `_CP`'s)."""
    o, g, i, beta, h0 = make_inputs(1, 20, 2, 16, 16, n_states=1)
    for save in (True, False):
        torch.library.opcheck(cp_mod.cp_fwd.op, (o, g, i, beta, h0, None, 0.5, 1, 0, True, save, save))
    _, _, h, a, b, fb = cp_mod.cp_fwd(o, g, i, beta, h0, None, 0.5, 1, 0, True, True, True)
    dy, dht = torch.randn_like(i), torch.randn_like(h0)
    torch.library.opcheck(cp_mod.cp_bwd.op, (o, g, i, beta, h0, None, h, a, b, fb, dy, dht, 0.5, 1, 0))


def test_compiled_graph_calls_the_custom_ops():
    """Under torch.compile (AOTAutograd, run eagerly) forward and backward go through hgrn2::cp_fwd / cp_bwd, with
    the eager path's gradients."""
    inputs = make_inputs(1, 70, 2, 16, 16, n_states=1)
    graphs = []

    def backend(gm, example_inputs):
        from functorch.compile import make_boxed_func
        from torch._functorch.aot_autograd import aot_module_simplified

        def keep(g, _):
            graphs.append(str(g.graph))
            return make_boxed_func(g)
        return aot_module_simplified(gm, example_inputs, fw_compiler=keep, bw_compiler=keep)

    def f(o, g, i, lb, h0):
        y, ht = hgrn2_cp_triton(o, g, i, lb, scale=0.5, o_act="silu", initial_state=h0, output_final_state=True)
        return y.square().sum() + ht.sum()

    grads = []
    for fn in (f, torch.compile(f, backend=backend, fullgraph=True)):
        leaves = [x.clone().requires_grad_() for x in inputs]
        fn(*leaves).backward()
        grads.append([x.grad for x in leaves])
    assert any("hgrn2.cp_fwd" in g for g in graphs) and any("hgrn2.cp_bwd" in g for g in graphs)
    for a, b in zip(*grads):
        assert rel_err(a, b) <= 1e-5


def test_bad_activation_is_a_clear_error():
    o, g, i, *_ = make_inputs(1, 4, 1, 16, 16)
    with pytest.raises(ValueError, match="o_act"):
        hgrn2_cp_triton(o, g, i, o_act="gelu")


# --- GPU only: real head sizes, long sequences, compile ----------------------------------------------------

gpu = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
GPU_TEST_LIMIT_S = 90  # compile + run of one GPU test; a hung kernel blocks in C, where only faulthandler's thread acts


@pytest.fixture(autouse=True)
def hard_time_limit():
    """On a GPU, end the process with every thread's traceback if one test runs past GPU_TEST_LIMIT_S."""
    if CUDA:
        faulthandler.dump_traceback_later(GPU_TEST_LIMIT_S, exit=True)
    yield
    if CUDA:
        faulthandler.cancel_dump_traceback_later()


@gpu
@pytest.mark.parametrize("K", [64, 128, 256])
def test_gpu_bf16_head_sizes(K):
    inputs = make_inputs(2, 2048, 4, K, K, n_states=2, dtype=torch.bfloat16)
    kw = dict(scale=K ** -0.5, o_act="silu", output_final_state=True)
    check(*run_both(inputs, **kw), tol=2e-2)


@gpu
def test_gpu_fp32():
    inputs = make_inputs(2, 300, 2, 64, 64, n_states=2)
    check(*run_both(inputs, scale=0.125, o_act="silu", output_final_state=True), tol=1e-4)


@gpu
def test_gpu_varlen_bf16():
    cu = torch.tensor([0, 100, 1000, 1001, 2048], device=DEV, dtype=torch.int32)
    inputs = make_inputs(1, 2048, 4, 128, 128, n_states=4, dtype=torch.bfloat16)
    check(*run_both(inputs, cu_seqlens=cu, scale=128 ** -0.5, o_act="silu", output_final_state=True), tol=2e-2)


@gpu
def test_gpu_torch_compile():
    inputs = make_inputs(2, 256, 2, 64, 64, n_states=2, dtype=torch.bfloat16)
    leaves = [x.clone().requires_grad_() for x in inputs]

    @torch.compile(fullgraph=True)
    def f(o, g, i, lb, h0):
        y, ht = hgrn2_cp_triton(o, g, i, lb, scale=0.125, o_act="silu", initial_state=h0, output_final_state=True)
        return y.float().square().sum() + ht.sum()

    f(*leaves).backward()
    ref = [x.detach().double().requires_grad_() for x in inputs]
    y, ht = hgrn2_reference(*ref[:4], scale=0.125, o_act="silu", initial_state=ref[4], output_final_state=True)
    (y.square().sum() + ht.sum()).backward()
    for name, x, x_ref in zip(NAMES, leaves, ref):
        assert rel_err(x.grad, x_ref.grad) <= 2e-2, name
