"""The chunk-parallel Triton kernels (`hgrn2_chunk_parallel_triton`) against the fp64 step-loop reference.

Outputs, final states and every gradient (do, dg, di, dβ, d initial_state, with a final-state cotangent).
Without a GPU these run in the Triton interpreter at small shapes; each kernel branch (the three intra-chunk
tiers in both launches, saved and rebuilt A and b, fused and split backward, split K and V blocks, varlen, each
dot dtype) runs in the default tier at least once, the rest under `slow`. The GPU-only tests at the end cover
real head sizes and torch.compile.
"""

import pytest
import torch
import triton.language as tl

from hgrn2.ops import hgrn2_reference
from hgrn2.ops.triton import chunk_parallel as parallel_mod
from hgrn2.ops.triton.chunk_parallel import hgrn2_chunk_parallel_triton
from hgrn2.ops.triton.config import ChunkParallelConfig

from .harness import DEV, NAMES, check, gpu, make_inputs, needs_triton, override, rel_err, time_limit
from .harness import run_both as _run_both

pytestmark = needs_triton
slow = pytest.mark.slow


def run_both(inputs, fn=hgrn2_chunk_parallel_triton, **kw):
    return _run_both(inputs, fn, **kw)


# in chunks that decay by nearly the chunk tier's bound, its A = (q e^{b_t − m})(k e^{m − b_s})ᵀ overflows above the
# diagonal (pairs t < s, where e^{b_t − b_s} > 1; masked out): the interpreter's numpy warns
PAST_TIER = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning",
                                       "ignore:invalid value encountered:RuntimeWarning")


@pytest.fixture(autouse=True)
def production_chunks():
    """fp32 inputs normally run in 32-token chunks (block_t_fp32); here they take the bf16 path's 64 (the math is
    the same, and the interpreter computes every dot in fp32), except where a test sets it."""
    with override("chunk_parallel", block_t_fp32=ChunkParallelConfig().block_t):
        yield


@pytest.fixture
def small_blocks():
    """Blocks of 16: V = 32 runs as two programs whose partial do/dg are summed, the parallel kernels loop
    over two K-blocks, the sequential state kernels run K = 32 as two column blocks."""
    with override("chunk_parallel", block_v=16, block_k=16, block_k_bwd=16, block_k_seq=16):
        yield


@pytest.mark.parametrize("T,K,V,o_act,i_act", [
    (150, 16, 32, "silu", "sigmoid"),  # three chunks, the last partial
    (37, 32, 16, None, None),  # one partial chunk, T not a multiple of 16
    pytest.param(64, 24, 20, "sigmoid", "silu", marks=slow),  # exactly one chunk; padded K, V
    pytest.param(77, 16, 16, "silu", None, marks=slow),
])
def test_fp32_matches_reference(T, K, V, o_act, i_act):
    inputs = make_inputs(2, T, 2, K, V, n_states=2)
    kw = dict(scale=K ** -0.5, o_act=o_act, i_act=i_act, output_final_state=True)
    check(*run_both(inputs, **kw))


def test_sequential_blocks_shrink_for_few_sequence_heads(monkeypatch):
    """With few (sequence, head) pairs the sequential state kernels take smaller blocks (K first, then V, down
    to 32 × 32) until their programs fill half the SMs; the results stay the reference's."""
    monkeypatch.setattr(parallel_mod, "sm_count", lambda device: 132)
    o = torch.empty(1, 64, 16, 128, dtype=torch.bfloat16)
    cfg = ChunkParallelConfig()
    blocks = {nh: parallel_mod._config(o, o, nh, cfg) for nh in (1, 16, 32, 128)}
    seq_blocks = {nh: (b.bk_seq, b.bv_seq) for nh, b in blocks.items()}
    assert seq_blocks == {1: (32, 32), 16: (32, 64), 32: (32, 128), 128: (64, 128)}
    monkeypatch.setattr(parallel_mod, "sm_count", lambda device: 64)  # K = V = 64 at N·H = 2: 32 × 32 blocks
    inputs = make_inputs(1, 70, 2, 64, 64, n_states=1)
    check(*run_both(inputs, scale=0.125, o_act="silu", output_final_state=True))


@slow
def test_default_blocks_at_head_size_64():
    """K = V = 64 with the default blocks (fwd K-block 64, backward K-loop of two 32-wide blocks, whole V)."""
    inputs = make_inputs(1, 130, 1, 64, 64, n_states=1)
    check(*run_both(inputs, scale=0.125, o_act="silu", output_final_state=True))


@PAST_TIER  # without a bound (β = 0) some chunks decay past e^-120
def test_no_state_no_bound_split_blocks(small_blocks):
    inputs = make_inputs(1, 70, 2, 32, 32, lb=None)
    check(*run_both(inputs, o_act="sigmoid", i_act="silu"))


@slow
def test_split_blocks_with_states(small_blocks):
    inputs = make_inputs(1, 70, 2, 32, 32, n_states=1)
    check(*run_both(inputs, scale=0.3, o_act="silu", output_final_state=True))


def test_float64_inputs_and_initial_state_without_final():
    """fp64 inputs run in fp32 and come back as fp64; an initial state without the final one."""
    inputs = make_inputs(1, 40, 1, 16, 16, n_states=1, dtype=torch.float64)
    inputs[3], inputs[4] = inputs[3].double(), inputs[4].double()
    got, ref = run_both(inputs, scale=0.5, o_act="silu")
    assert got[0].dtype == torch.float64
    check(got, ref)


# the intra-chunk tiers (chunk_parallel_fwd.py), forced by the thresholds (chunk_max_spread, half_max_spread,
# max_spread)
TIERS = {"chunk": (120.0, 120.0, 60.0), "halves": (-1.0, 120.0, 60.0), "sub-block": (-1.0, -1.0, 60.0),
         "exact": (-1.0, -1.0, -1.0)}


def tier(name: str, **fields):
    """The config override that sends every chunk to the tier `name` (the halves tier for fp32 dot operands too)."""
    chunk, half, sub = TIERS[name]
    return override("chunk_parallel", chunk_max_spread=chunk, half_max_spread=half, half_max_spread_fp32=half,
                    max_spread=sub, **fields)


@pytest.mark.parametrize("name", ["halves", "sub-block", pytest.param("exact", marks=slow)])
def test_fallback_tiers_everywhere(name):
    """The later launches' tiers, normally only for chunks that decay by more than e^-120, on ordinary inputs."""
    with tier(name):
        inputs = make_inputs(1, 70, 1, 16, 16, n_states=1)
        check(*run_both(inputs, scale=0.5, o_act="silu", i_act="sigmoid", output_final_state=True))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy overflows, on purpose
def test_fallback_takes_exactly_the_chunks_past_the_chunk_tier():
    """A chunk that decays by e^-1920 (g = −30 at β = 0 on every token) is the second launch's: forced into the
    chunk tier it overflows, and every other chunk's output is unchanged, bit for bit."""
    o, g, i, beta, _ = make_inputs(1, 192, 1, 16, 16)
    g[:, 64:128] = -30.0
    beta = torch.zeros_like(beta)
    y_ref, _ = hgrn2_chunk_parallel_triton(o, g, i, beta)
    assert torch.isfinite(y_ref).all()
    with override("chunk_parallel", chunk_max_spread=1e9):
        y, _ = hgrn2_chunk_parallel_triton(o, g, i, beta)
    assert not torch.isfinite(y[:, 64:128]).all()
    assert torch.equal(y[:, :64], y_ref[:, :64]) and torch.equal(y[:, 128:], y_ref[:, 128:])


@pytest.mark.parametrize("name", ["halves", pytest.param("sub-block", marks=slow)])
def test_later_tiers_with_packed_sequences(name):
    """Packed sequences in the listed launches' tiers: chunks cut short by a sequence's end (5 and 6 tokens, within
    the first half; 40 tokens, into the second) and padding chunks."""
    lens = [5, 70, 40]
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), device=DEV, dtype=torch.int32)
    with tier(name):
        inputs = make_inputs(1, sum(lens), 2, 16, 16, n_states=len(lens))
        check(*run_both(inputs, cu_seqlens=cu, scale=0.5, o_act="silu", i_act="sigmoid", output_final_state=True))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy overflows, on purpose
def test_each_chunk_takes_the_tier_its_decay_allows():
    """bf16 inputs: chunk 1 decays by ~e^-195 (g = −3 at β = 0: ~e^-98 per half): the halves tier; chunk 2 by
    e^-1920 (g = −30): the fallback; in head 1 one channel of chunk 1 in each K-block of the decay kernel decides,
    and channel 100's g = −30 sends the chunk to the fallback although channel 0 may list it for the halves tier.
    Every tier agrees with the reference, and forcing the chunk tier on all chunks overflows those two chunks only,
    every other chunk's output unchanged to the bit."""
    o, g, i, beta, h0 = make_inputs(1, 250, 2, 128, 16, n_states=1, dtype=torch.bfloat16)
    beta = torch.zeros_like(beta)
    g[:, 64:128, 0, :8] = -3.0
    g[:, 128:192, 0, 0] = -30.0
    g[:, 64:128, 1, 0] = -3.0
    g[:, 64:128, 1, 100] = -30.0
    _, fb, _ = parallel_mod._decay(g, beta, None, 4, 250, 4, 64, ChunkParallelConfig(), tl.bfloat16)
    n_chunks, H = 4, 2
    fallback, halves = fb[2 + n_chunks * H:2 + n_chunks * H + fb[0]], fb[2 + 2 * n_chunks * H:][:fb[1]]
    assert sorted(fallback.tolist()) == [1 * H + 1, 2 * H + 0]  # (chunk 1, head 1) and (chunk 2, head 0)
    # head 1 is listed there too where channel 0's K-block ran first (the halves launch then skips it)
    assert 1 * H + 0 in halves.tolist() and set(halves.tolist()) <= {1 * H + 0, 1 * H + 1}
    kw = dict(scale=0.125, o_act="silu", output_final_state=True)
    check(*run_both([o, g, i, beta, h0], **kw))
    y_ref, _ = hgrn2_chunk_parallel_triton(o, g, i, beta, initial_state=h0, **kw)
    with override("chunk_parallel", chunk_max_spread=1e9):
        y, _ = hgrn2_chunk_parallel_triton(o, g, i, beta, initial_state=h0, **kw)
    assert not torch.isfinite(y[:, 64:192]).all()
    assert torch.equal(y[:, :64], y_ref[:, :64]) and torch.equal(y[:, 192:], y_ref[:, 192:])


@pytest.mark.parametrize("walk", [256.0, -1.0])
def test_bf16_fast_forgetting(walk):
    """Heads that forget by ~e^-150 per chunk in bf16 (β = 0, g lowered by 2, as a first layer may learn): the
    halves tier, and the forward walk's decay from b's difference (walk_max_spread 256) or, forced, from sums
    over the later rows."""
    o, g, i, beta, h0 = make_inputs(1, 200, 2, 32, 32, n_states=1)
    beta[:, :4] = 0.0
    g[..., :4] -= 2.0
    inputs = [x.to(torch.bfloat16) for x in (o, g, i)] + [beta, h0]
    with override("chunk_parallel", walk_max_spread=walk):
        check(*run_both(inputs, scale=32 ** -0.5, o_act="silu", output_final_state=True))


@pytest.mark.parametrize("name", ["exact", pytest.param("chunk", marks=slow), pytest.param("sub-block", marks=slow),
                                  pytest.param("halves", marks=slow)])
def test_split_backward(small_blocks, name):
    """A rebuilt in the backward (save_a off), which then takes two launches (dv; dq/dk/dg), and b computed there
    again (save_b off); split K and V blocks (one of each in the exact tier, whose column loop is the
    interpreter's slowest path)."""
    with tier(name, save_a=False, save_b=False, bwd_split=None):
        kv = 16 if name == "exact" else 32
        inputs = make_inputs(1, 40 if name == "exact" else 70, 1, kv, kv, n_states=1)
        check(*run_both(inputs, scale=0.3, o_act="silu", i_act="sigmoid", output_final_state=True))


@pytest.mark.parametrize("split,name", [
    (True, "sub-block"), (False, "chunk"),
    *(pytest.param(sp, n, marks=slow) for sp, n in [(True, "chunk"), (True, "exact"), (False, "sub-block"),
                                                     (False, "exact")]),
])
def test_saved_A(small_blocks, split, name):
    """save_a: the forward keeps A and the backward's dv reads it (split and fused backward; every intra tier;
    V split in two blocks, of which only the first stores A)."""
    with tier(name, save_a=True, bwd_split=split):
        inputs = make_inputs(1, 40 if name == "exact" else 70, 1, 32, 32, n_states=1)
        check(*run_both(inputs, scale=0.3, o_act="silu", i_act="sigmoid", output_final_state=True))


def test_A_and_b_are_kept_only_for_a_backward(monkeypatch):
    """The default keeps A and b when a gradient will be taken, and not in inference (no_grad or no leaf needing
    one)."""
    cfg = ChunkParallelConfig()
    assert cfg.save_a and cfg.save_b and cfg.bwd_split is None
    kept = []
    fwd = parallel_mod.chunk_parallel_fwd

    def spy(*args):
        out = fwd(*args)
        kept.append((out[3].numel() > 0, out[4].numel() > 0))
        return out

    monkeypatch.setattr(parallel_mod, "chunk_parallel_fwd", spy)
    o, g, i, lb, _ = make_inputs(1, 20, 1, 16, 16)
    hgrn2_chunk_parallel_triton(o, g, i.requires_grad_(), lb)
    with torch.no_grad():
        hgrn2_chunk_parallel_triton(o, g, i, lb)
    hgrn2_chunk_parallel_triton(o, g, i.detach(), lb)
    assert kept == [(True, True), (False, False), (False, False)]


def test_inference_forward_equals_the_autograd_one():
    """Without a gradient to take, the forward skips the autograd node: the same output and final state, bit for
    bit, and no graph."""
    o, g, i, lb, h0 = make_inputs(2, 70, 2, 16, 32, n_states=2)
    kw = dict(scale=0.25, o_act="silu", i_act="sigmoid", initial_state=h0, output_final_state=True)
    y, ht = hgrn2_chunk_parallel_triton(o, g, i.requires_grad_(), lb, **kw)
    with torch.no_grad():
        y_inf, ht_inf = hgrn2_chunk_parallel_triton(o, g, i, lb, **kw)
    assert y.grad_fn is not None and y_inf.grad_fn is None and ht_inf.grad_fn is None
    assert torch.equal(y.detach(), y_inf) and torch.equal(ht.detach(), ht_inf)


@pytest.mark.parametrize("save_b", [False, pytest.param(True, marks=slow)])
def test_saved_A_varlen_bf16(save_b):
    """save_a with packed sequences (padding chunks) and bf16 operands (A kept in bf16), b kept or not."""
    with override("chunk_parallel", save_a=True, save_b=save_b):
        lens = [5, 70, 17]
        cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), device=DEV, dtype=torch.int32)
        inputs = make_inputs(1, sum(lens), 2, 32, 32, n_states=len(lens), dtype=torch.bfloat16)
        check(*run_both(inputs, cu_seqlens=cu, scale=32 ** -0.5, o_act="silu", output_final_state=True))


def test_32_token_chunks():
    """The fp32 default (block_t_fp32 = 32)."""
    with override("chunk_parallel", block_t_fp32=32):
        inputs = make_inputs(1, 75, 2, 16, 16, n_states=1)
        check(*run_both(inputs, scale=0.5, o_act="silu", output_final_state=True))


@PAST_TIER
def test_extreme_gates():
    """g = ±30 on a quarter of the entries, β from 0 to 0.999: the 16-token spread reaches hundreds, so the
    exact intra path runs on some chunks and the fast path on others; no overflow, fp32 accuracy."""
    o, g, i, _, h0 = make_inputs(1, 100, 2, 16, 32, n_states=1)
    wild = torch.rand_like(g) < 0.25
    g = torch.where(wild, 30.0 * torch.sign(torch.randn_like(g)), g)
    g[:, :20, 0] = -30.0  # head 0 forgets almost everything for 20 tokens
    g[:, 64:] = g[:, 64:].clamp(-2, 2)  # a calm second chunk: the chunk tier there
    beta = torch.tensor([0.0, 0.5, 0.9, 0.999], device=o.device).repeat(2, 4)
    kw = dict(scale=0.25, o_act="silu", output_final_state=True)
    got, ref = run_both([o, g, i, beta, h0], **kw)
    check(got, ref)  # dβ too: the gates below SMALL_F take the exact sum of `chunk_parallel_bwd_small_kernel`


@PAST_TIER
@slow
def test_all_gates_saturated():
    """Every gate at ±30: outputs and all gradients but dg to fp32 accuracy; dg (entries ~σ'(30) ≈ 1e-13)
    to an absolute error far below the scale of the other gradients."""
    o, g, i, _, h0 = make_inputs(2, 40, 2, 16, 16, n_states=2)
    g = 30.0 * torch.sign(torch.randn_like(g))
    beta = torch.tensor([0.0, 0.3, 0.999, 0.7], device=o.device).repeat(2, 4)
    got, ref = run_both([o, g, i, beta, h0], o_act="sigmoid", output_final_state=True)
    check(got, ref, skip=("g",))
    dg, dg_ref = got[2][1].grad, ref[2][1].grad
    assert torch.isfinite(dg).all() and torch.isfinite(got[2][3].grad).all()
    assert (dg.double() - dg_ref).abs().max() <= 1e-5 * ref[2][2].grad.abs().max()


@slow
def test_long_sequence_slow_decay():
    """400 tokens (7 chunks) with β up to 0.999: long-range accumulation through the stored chunk states."""
    inputs = make_inputs(1, 400, 1, 16, 16, g_scale=1.0, lb=(0.9, 0.999), n_states=1)
    check(*run_both(inputs, scale=0.25, o_act="silu", output_final_state=True))


@slow
def test_bf16():
    """bf16 dot operands, as rounded on the GPU (`_interpret.py`); 300 tokens: d log f's cancelling terms must be
    formed from the rounded operands."""
    inputs = make_inputs(2, 300, 2, 32, 32, n_states=2, dtype=torch.bfloat16)
    check(*run_both(inputs, scale=32 ** -0.5, o_act="silu", output_final_state=True))


def test_fp16():
    """fp16 inputs: fp32 dot operands and fp32 stored states (32-token chunks outside these tests)."""
    inputs = make_inputs(1, 70, 1, 32, 32, n_states=1, dtype=torch.float16)
    check(*run_both(inputs, scale=32 ** -0.5, o_act="silu", output_final_state=True))


@pytest.mark.parametrize("lens", [[5, 70, 17, 1, 64], pytest.param([130], marks=slow)])
def test_varlen_equals_per_sequence_runs(lens):
    """Packed sequences (one of a single token, one of exactly 64, one over 2 chunks): no chunk crosses a boundary."""
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), device=DEV, dtype=torch.int32)
    o, g, i, beta, h0 = make_inputs(1, sum(lens), 2, 16, 16, n_states=len(lens))
    kw = dict(scale=0.5, o_act="silu", i_act="silu", output_final_state=True)
    got, ref = run_both([o, g, i, beta, h0], cu_seqlens=cu, **kw)
    check(got, ref)
    y, ht, _ = got
    for n, (s, e) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        with torch.no_grad():
            y_n, ht_n = hgrn2_chunk_parallel_triton(o[:, s:e], g[:, s:e], i[:, s:e], beta,
                                                    initial_state=h0[n:n + 1], **kw)
        assert rel_err(y[:, s:e], y_n) <= 1e-6 and rel_err(ht[n:n + 1], ht_n) <= 1e-6


def test_same_as_fused_chunk_kernel():
    """Agrees with the fused-chunk kernel (hgrn2_fused_chunk_triton) to fp32 rounding, gradients included."""
    from hgrn2.ops.triton.fused_chunk import hgrn2_fused_chunk_triton
    inputs = make_inputs(1, 80, 2, 16, 16, n_states=1)
    kw = dict(scale=0.5, o_act="silu", output_final_state=True)
    torch.manual_seed(1)
    a, _ = run_both(inputs, fn=hgrn2_chunk_parallel_triton, **kw)
    torch.manual_seed(1)
    b, _ = run_both(inputs, fn=hgrn2_fused_chunk_triton, **kw)
    assert rel_err(a[0], b[0]) <= 1e-5 and rel_err(a[1], b[1]) <= 1e-5
    for x, x2 in zip(a[2], b[2]):
        assert rel_err(x.grad, x2.grad) <= 1e-4


def test_custom_op_registration():
    """Schema and fake (meta) implementation: what torch.compile relies on (autograd is `_ChunkParallel`'s)."""
    o, g, i, beta, h0 = make_inputs(1, 20, 2, 16, 16, n_states=1)
    key = ChunkParallelConfig().key
    for save in (True, False):
        torch.library.opcheck(parallel_mod.chunk_parallel_fwd.op,
                              (o, g, i, beta, h0, None, 0.5, 1, 0, True, save, save, save, key))
    _, _, h, a, b, fb, fz = parallel_mod.chunk_parallel_fwd(o, g, i, beta, h0, None, 0.5, 1, 0, True, True, True,
                                                            True, key)
    dy, dht = torch.randn_like(i), torch.randn_like(h0)
    torch.library.opcheck(parallel_mod.chunk_parallel_bwd.op,
                          (o, g, i, beta, h0, None, h, a, b, fb, fz, dy, dht, 0.5, 1, 0, key))


def test_compiled_graph_calls_the_custom_ops():
    """Under torch.compile (AOTAutograd, run eagerly) forward and backward go through hgrn2::chunk_parallel_fwd /
    chunk_parallel_bwd, with the eager path's gradients, and the config current at trace time is a constant of
    the graph."""
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
        y, ht = hgrn2_chunk_parallel_triton(o, g, i, lb, scale=0.5, o_act="silu", initial_state=h0,
                                            output_final_state=True)
        return y.square().sum() + ht.sum()

    grads = []
    for fn in (f, torch.compile(f, backend=backend, fullgraph=True)):
        leaves = [x.clone().requires_grad_() for x in inputs]
        fn(*leaves).backward()
        grads.append([x.grad for x in leaves])
    assert any("hgrn2.chunk_parallel_fwd" in g for g in graphs)
    assert any("hgrn2.chunk_parallel_bwd" in g for g in graphs)
    assert any("block_t_fp32=64" in g for g in graphs)  # production_chunks' config, by its key
    for a, b in zip(*grads):
        assert rel_err(a, b) <= 1e-5


def test_bad_activation_is_a_clear_error():
    o, g, i, *_ = make_inputs(1, 4, 1, 16, 16)
    with pytest.raises(ValueError, match="o_act"):
        hgrn2_chunk_parallel_triton(o, g, i, o_act="gelu")


# --- GPU only: real head sizes, long sequences, compile ----------------------------------------------------

@pytest.fixture(autouse=True)
def gpu_time_limit():
    """Compile + run of one GPU test takes about a minute; a hung kernel ends the process with tracebacks."""
    with time_limit(90):
        yield


@gpu
@pytest.mark.parametrize("K", [64, 128, 256])
def test_gpu_bf16_head_sizes(K):
    inputs = make_inputs(2, 2048, 4, K, K, n_states=2, dtype=torch.bfloat16)
    kw = dict(scale=K ** -0.5, o_act="silu", output_final_state=True)
    check(*run_both(inputs, **kw))


@gpu
def test_gpu_fp32():
    inputs = make_inputs(2, 300, 2, 64, 64, n_states=2)
    check(*run_both(inputs, scale=0.125, o_act="silu", output_final_state=True))


@gpu
def test_gpu_varlen_bf16():
    cu = torch.tensor([0, 100, 1000, 1001, 2048], device=DEV, dtype=torch.int32)
    inputs = make_inputs(1, 2048, 4, 128, 128, n_states=4, dtype=torch.bfloat16)
    check(*run_both(inputs, cu_seqlens=cu, scale=128 ** -0.5, o_act="silu", output_final_state=True))


@gpu
def test_gpu_torch_compile():
    inputs = make_inputs(2, 256, 2, 64, 64, n_states=2, dtype=torch.bfloat16)
    leaves = [x.clone().requires_grad_() for x in inputs]

    @torch.compile(fullgraph=True)
    def f(o, g, i, lb, h0):
        y, ht = hgrn2_chunk_parallel_triton(o, g, i, lb, scale=0.125, o_act="silu", initial_state=h0,
                                            output_final_state=True)
        return y.float().square().sum() + ht.sum()

    f(*leaves).backward()
    ref = [x.detach().double().requires_grad_() for x in inputs]
    y, ht = hgrn2_reference(*ref[:4], scale=0.125, o_act="silu", initial_state=ref[4], output_final_state=True)
    (y.square().sum() + ht.sum()).backward()
    for name, x, x_ref in zip(NAMES, leaves, ref):
        assert rel_err(x.grad, x_ref.grad) <= 2e-2, name
