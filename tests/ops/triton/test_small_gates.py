"""dβ where a forget gate is below SMALL_F (β near 0 behind closed gates): `chunk_parallel_bwd_small_kernel` sums
dL/df there directly, on the chunks the forward listed, on the device; the other gates keep the main kernel's share.
A bound that needs a gradient always takes the chunk-parallel kernels (`hgrn2_fused_chunk_triton` hands it over)."""

import pytest
import torch
import triton
import triton.language as tl

from hgrn2.ops.triton import chunk_parallel as cp
from hgrn2.ops.triton.chunk_parallel import hgrn2_chunk_parallel_triton
from hgrn2.ops.triton.chunk_parallel_bwd import _sub_decays
from hgrn2.ops.triton.config import launch_config
from hgrn2.ops.triton.fused_chunk import hgrn2_fused_chunk_triton

from .harness import DEV, check, gpu, make_inputs, needs_triton, run_both

pytestmark = [needs_triton,
              # in chunks that decay by nearly the chunk tier's bound, its A overflows above the diagonal (pairs
              # t < s, masked out; the interpreter's numpy warns)
              pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning",
                                         "ignore:invalid value encountered:RuntimeWarning")]
FAMILIES = [hgrn2_fused_chunk_triton, hgrn2_chunk_parallel_triton]


def small_bound_inputs(T=75, heads=3, n_states=3, dtype=torch.float32, V=16):
    """β in [2^-8, 0.9) but head 1's channels 0-3 at 0, 4-7 at 1e-6 and 8 at 2^-9, behind closed gates on tokens
    10-39: the main kernel's dβ is off by orders of magnitude there."""
    o, g, i, beta, h0 = make_inputs(1, T, heads, 16, V, lb=(2.0 ** -8, 0.9), n_states=n_states, dtype=dtype)
    beta[1, :4], beta[1, 4:8], beta[1, 8] = 0.0, 1e-6, 2.0 ** -9
    g[:, 10:40, 1, :9] = -30.0
    return [o, g, i, beta, h0]


@pytest.mark.parametrize("fn", FAMILIES)
def test_exact_with_packed_sequences_and_states(fn):
    """Every output and gradient (dβ too) against fp64, with packed sequences, initial states and a final-state
    gradient, through either family's entry point."""
    cu = torch.tensor([0, 30, 31, 75], device=DEV)
    check(*run_both(small_bound_inputs(), fn, scale=0.5, o_act="silu", cu_seqlens=cu, output_final_state=True))


def test_exact_through_the_dispatch():
    """`hgrn2(..., backend="triton")` on a short input (which would take the fused-chunk kernels): exact too (the
    reversed scan: tests/ops/test_reverse.py)."""
    from hgrn2.ops import hgrn2

    def op(o, g, i, lb, **kw):
        return hgrn2(o, g, i, lb, backend="triton", **kw)

    check(*run_both(small_bound_inputs(T=40, n_states=1), op, scale=0.5, o_act="silu", output_final_state=True))


@pytest.mark.parametrize("steps", [0, 1, 10**6], ids=["channel-form", "both-forms", "pair-form"])
def test_exact_in_either_form(steps):
    """The small-gates kernel takes each chunk in the pair form (NP (row, channel) pairs per step) unless that takes
    more than `pair_steps_per_channel` steps per channel holding a small gate, then in the channel form: a few rows
    across many channels (2 steps, 12 channels) in the first chunk, many rows in two channels (3 steps) in the
    last, taken in one form each or one chunk in each. Every gradient, dβ too, against fp64, in bf16 (tf32x3
    products of fp32 operands) and in fp32."""
    for dtype in (torch.float32, torch.bfloat16):
        o, g, i, beta, h0 = make_inputs(1, 96, 2, 16, 32, lb=(2.0 ** -8, 0.9), n_states=1, dtype=dtype)
        beta[1, :12] = 0.0
        g[:, [5, 20], 1, :12] = -30.0  # rows 5 and 20 of the first chunk (32 tokens in fp32, 64 in bf16)
        g[:, 70:94, 1, 3:5] = -30.0  # 24 rows of the last chunk
        with launch_config(chunk_parallel=cp.ChunkParallelConfig(pair_steps_per_channel=steps)):
            check(*run_both([o, g, i, beta, h0], hgrn2_chunk_parallel_triton, scale=0.5, o_act="silu",
                            output_final_state=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_channel_form_carries_state_across_sub_chunks(dtype):
    """The channel form's 16-row sub-chunks take their start states and end-state gradients from the chunk's ends:
    channels at β 0 that keep their state (g = +3) but for closed gates at rows 84 and 109, so that the chunk-start
    state, the earlier sub-chunks' inputs, the later ones' outputs and the chunk-end gradient all reach a small gate
    across one or more sub-chunk boundaries (chunks of 32 rows in fp32, 64 in bf16; an initial state and a
    final-state gradient). Every gradient, dβ too, against fp64."""
    o, g, i, beta, h0 = make_inputs(1, 150, 2, 16, 16, lb=(2.0 ** -8, 0.9), n_states=1, dtype=dtype)
    beta[1, 2:6] = 0.0
    g[:, :, 1, 2:6] = 3.0
    g[:, [84, 109], 1, 2:6] = -30.0
    with launch_config(chunk_parallel=cp.ChunkParallelConfig(pair_steps_per_channel=0)):
        check(*run_both([o, g, i, beta, h0], hgrn2_chunk_parallel_triton, scale=0.5, o_act="silu",
                        output_final_state=True))


@pytest.mark.parametrize("block_k", [16, None], ids=["k-blocks-16", "k-block-128"])
def test_pairs_past_one_step(block_k):
    """More pairs than one step holds (NP = 16), in rows whose small gates lie in several channels: K = 160 in the
    pair form's K-blocks of 16 (four of its ten hold a small gate, the first 18 pairs in two steps, the others 6
    each; the rest skipped) or of 128 and 32 (30 pairs in two steps, then 6); the channel form is never chosen."""
    o, g, i, beta, h0 = make_inputs(1, 40, 1, 160, 16, lb=(2.0 ** -8, 0.9), n_states=1)
    chans = [0, 7, 8, 100, 130, 159]
    beta[0, chans] = 0.0
    g[:, 3:9, 0, chans] = -30.0
    with launch_config(chunk_parallel=cp.ChunkParallelConfig(pair_steps_per_channel=10**6, block_k_pairs=block_k)):
        check(*run_both([o, g, i, beta, h0], hgrn2_chunk_parallel_triton, scale=0.5, o_act="silu",
                        output_final_state=True))


@pytest.mark.parametrize("channels", [[40], [5, 63]], ids=["second-block", "both-blocks"])
@pytest.mark.parametrize("block_k", [None, 16])
def test_exact_in_later_k_blocks(channels, block_k):
    """K = 64 in fp32 (32- or 16-wide K-blocks in the small-gates kernel, one 64-wide block in the decay kernel):
    the channel-group mask sends each K-block only the chunks whose small gates lie in its channels."""
    o, g, i, beta, h0 = make_inputs(1, 70, 2, 64, 16, lb=(2.0 ** -8, 0.9), n_states=1)
    for c in channels:
        beta[1, c] = 0.0
        g[:, 20:50, 1, c] = -30.0
    with launch_config(chunk_parallel=cp.ChunkParallelConfig(block_k_small=block_k, small_programs_per_sm=1)):
        check(*run_both([o, g, i, beta, h0], hgrn2_chunk_parallel_triton, scale=0.5, o_act="silu",
                        output_final_state=True))


@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
@pytest.mark.parametrize("sub_block, dtype", [(32, torch.float32), (16, torch.float32), (32, torch.bfloat16)],
                         ids=["32-fp32", "16-fp32", "32-bf16"])
def test_exact_over_v_sub_blocks(varlen, sub_block, dtype):
    """V = 48 walked in sub-blocks of 32 (two, the second partly past V) or 16 (three): every gradient, dβ too,
    against fp64. In fp32 the parallel kernels split V in two as well, so dβ's partial sums have a row per V-block
    and the small-gates kernel adds into the first."""
    cu = torch.tensor([0, 30, 31, 75], device=DEV) if varlen else None
    inputs = small_bound_inputs(n_states=3 if varlen else 1, dtype=dtype, V=48)
    with launch_config(chunk_parallel=cp.ChunkParallelConfig(sub_block_v_small=sub_block)):
        check(*run_both(inputs, hgrn2_chunk_parallel_triton, scale=0.5, o_act="silu", i_act="silu", cu_seqlens=cu,
                        output_final_state=True))


def test_listed_chunks():
    """The forward lists exactly the (chunk, head) pairs holding a gate below SMALL_F, and only when the bound needs
    a gradient."""
    o, g, i, beta, _ = make_inputs(1, 100, 2, 16, 16, lb=(0.01, 0.9))  # 32-token chunks in fp32
    beta[1, 3] = 0.0
    g[0, 70, 1, 3] = -30.0  # chunk 2 of head 1
    key = cp.config_key(None, cp.ChunkParallelConfig)
    for flag, want in ((True, [2 * 2 + 1]), (False, None)):
        fz = cp.chunk_parallel_fwd(o, g, i, beta, None, None, 1.0, 0, 0, False, True, True, flag, key)[6]
        if want is None:
            assert fz.numel() == 0
        else:
            count = int(fz[0])
            assert sorted(fz[1 + 2 * 4:][:count].tolist()) == want
            assert fz[1:1 + 2 * 4].tolist() == [0, 0, 0, 0, 0, 1, 0, 0]  # channel 3: group 0's bit


@pytest.mark.parametrize("bound, listed", [(2.0 ** -8, False), (2.0 ** -8 * (1 - 2.0 ** -20), True)],
                         ids=["at-SMALL_F", "just-below"])
def test_blocks_whose_bounds_reach_small_f_list_nothing(bound, listed):
    """f ≥ β: the decay kernel skips its search in a K-block whose bounds all reach SMALL_F; a bound just below it
    behind a closed gate (f → β) is still found."""
    o, g, i, beta, _ = make_inputs(1, 64, 2, 16, 16, lb=(0.01, 0.9))
    beta[1, 5] = bound
    g[0, 40, 1, 5] = -80.0
    key = cp.config_key(None, cp.ChunkParallelConfig)
    fz = cp.chunk_parallel_fwd(o, g, i, beta, None, None, 1.0, 0, 0, False, True, True, True, key)[6]
    assert int(fz[0]) == listed


def test_inference_lists_nothing(monkeypatch):
    """Without grad mode no backward follows: the forward does not look for small gates, even for a bound that
    requires a gradient (autograd still reports it as needing one)."""
    o, g, i, beta, _ = small_bound_inputs(T=40, n_states=None)
    beta.requires_grad_()
    flags = []
    real = cp.chunk_parallel_fwd

    def spy(*args):
        flags.append(args[12])
        return real(*args)

    monkeypatch.setattr(cp, "chunk_parallel_fwd", spy)
    with torch.no_grad():
        hgrn2_chunk_parallel_triton(o, g, i, beta, scale=0.5, o_act="silu")
    hgrn2_chunk_parallel_triton(o, g, i, beta, scale=0.5, o_act="silu")
    assert flags == [False, True]


def test_main_kernel_alone_is_off():
    """Without the listed chunks' exact sums the main kernel's dβ misses the small gates' share (so the test above
    can fail): its error is far past the tolerance."""
    o, g, i, beta, _ = small_bound_inputs(T=40, n_states=None)
    dy = torch.randn_like(i)
    key = cp.config_key(None, cp.ChunkParallelConfig)
    y, ht, h, a, bb, fb, fz = cp.chunk_parallel_fwd(o, g, i, beta, None, None, 0.5, 1, 0, False, True, True, True,
                                                    key)
    dlb = cp.chunk_parallel_bwd(o, g, i, beta, None, None, h, a, bb, fb, fz, dy, None, 0.5, 1, 0, key)[3]
    dlb_main = cp.chunk_parallel_bwd(o, g, i, beta, None, None, h, a, bb, fb, fz[:0], dy, None, 0.5, 1, 0, key)[3]
    b = beta.clone().requires_grad_()
    (want,) = torch.autograd.grad(hgrn2_chunk_parallel_triton(o, g, i, b, scale=0.5, o_act="silu")[0], b, dy)
    assert torch.equal(dlb, want)
    assert not torch.allclose(dlb_main[1, :9], dlb[1, :9], rtol=1e-2)
    assert torch.equal(dlb_main[0], dlb[0]) and torch.equal(dlb_main[2], dlb[2])


# --- GPU only -------------------------------------------------------------------------------------------------

def _bound_grad(fn, o, g, i, beta, dy):
    y, _ = fn(o, g, i, beta, scale=0.5, o_act="silu")
    (d,) = torch.autograd.grad(y, beta, dy)
    return d


@gpu
@pytest.mark.parametrize("small", [False, True])
def test_gpu_no_host_sync(small):
    """Forward and backward with a bound that needs a gradient make no synchronizing CUDA call (the sync debug mode
    raises on one), with and without small gates."""
    o, g, i, beta, _ = make_inputs(2, 256, 4, 64, 64, lb=(0.5, 0.9), dtype=torch.bfloat16)
    if small:
        beta[2] = 0.0
        g[:, 100:120, 2] = -30.0
    beta.requires_grad_()
    dy = torch.randn_like(i)
    _bound_grad(hgrn2_chunk_parallel_triton, o, g, i, beta, dy)  # compiles the kernels first
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        _bound_grad(hgrn2_chunk_parallel_triton, o, g, i, beta, dy)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@gpu
def test_gpu_cuda_graph_is_exact():
    """A forward and backward captured in a CUDA graph replay to the eager dβ bit for bit, small gates included
    (the list of chunks lives on the device)."""
    o, g, i, beta, _ = make_inputs(2, 256, 2, 64, 64, lb=(0.5, 0.9), dtype=torch.bfloat16)
    beta[1] = 0.0
    g[:, 30:50, 1] = -30.0
    beta.requires_grad_()
    dy = torch.randn_like(i)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # warm-up (kernel compilation) outside the capture
            _bound_grad(hgrn2_chunk_parallel_triton, o, g, i, beta, dy)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = _bound_grad(hgrn2_chunk_parallel_triton, o, g, i, beta, dy)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, _bound_grad(hgrn2_chunk_parallel_triton, o, g, i, beta, dy))


@triton.jit
def _decays_kernel(a_ptr, p_ptr, q_ptr, al_ptr, ga_ptr, BT: tl.constexpr):
    SB: tl.constexpr = 16
    r = tl.arange(0, BT)
    a = tl.load(a_ptr + r)
    a_next = tl.load(a_ptr + r + 1, mask=r + 1 < BT, other=0.0)
    P, Q, alpha, gamma = _sub_decays(tl.reshape(a, (BT // SB, SB)), tl.reshape(a_next, (BT // SB, SB)), SB)
    sq = (r[:, None] // SB) * (SB * SB) + (r[:, None] % SB) * SB + tl.arange(0, SB)[None, :]  # [NB, SB, SB] flat
    tl.store(p_ptr + sq, tl.reshape(P, (BT, SB)))
    tl.store(q_ptr + sq, tl.reshape(Q, (BT, SB)))
    tl.store(al_ptr + r, tl.reshape(alpha, (BT,)))
    tl.store(ga_ptr + r, tl.reshape(gamma, (BT,)))


@pytest.mark.parametrize("BT", [32, 64])
def test_sub_chunk_decays_against_their_definitions(BT):
    """`_sub_decays` (each 16-row sub-chunk's decays, row scans) against the decays summed in fp64 from their
    definitions, on log f from -80 (closed) to near 0 with the chunk cut short (rows past n hold 0, as the kernel
    masks them): every entry that is not negligible within 1e-5."""
    gen = torch.Generator().manual_seed(BT)
    scales = torch.tensor([0.01, 1.0, 80.0], dtype=torch.float64)
    for top in (3, 2):  # log f up to -80 (closed gates) and up to -1 (decays that stay visible across the chunk)
        a = -torch.rand(BT, generator=gen, dtype=torch.float64) * scales[torch.randint(0, top, (BT,), generator=gen)]
        a[BT - 5:] = 0.0  # past the chunk's end
        _check_decays(a, BT)


def _check_decays(a: torch.Tensor, BT: int) -> None:
    SB, NB = 16, BT // 16
    a = a.float().double()  # the kernel's inputs, exactly
    outs = [torch.empty(NB, SB, SB, device=DEV), torch.empty(NB, SB, SB, device=DEV), torch.empty(BT, device=DEV),
            torch.empty(BT, device=DEV)]
    _decays_kernel[(1,)](a.float().to(DEV), *outs, BT=BT)
    blocks = a.view(NB, SB)
    c = torch.cat([blocks.new_zeros(NB, 1), blocks.cumsum(1)], 1)  # c[j, x] = Σ_{τ<x} a_τ within sub-chunk j
    t, u = torch.arange(SB)[:, None], torch.arange(SB)[None, :]
    P = torch.where(u >= t, (c[:, u + 1] - c[:, t + 1]).exp(), 0.0)  # Σ_{t<τ≤u} (fp64: exact enough)
    Q = torch.where(u < t, (c[:, t] - c[:, u + 1]).exp(), 0.0)  # Σ_{s<τ<t}, s = u
    alpha, gamma = c[:, :SB].exp().flatten(), (c[:, SB:] - c[:, 1:]).exp().flatten()
    for got, want in zip(outs, (P, Q, alpha, gamma)):
        got = got.double().cpu()
        big = want > 1e-30
        assert ((got - want).abs()[big] / want[big]).max() < 1e-5
        assert (got[~big].abs() < 1e-25).all()
