"""`hgrn2 bench ops`: the recurrence against fla and SDPA FlashAttention, on one GPU, in one run.

Rows (bf16, H = 16, K = V = 128):
  seq     B·T = 16K tokens, forward and forward+backward, from the raw projections:
          ours  = hgrn2.ops.hgrn2(o, g, i, β, scale=K^-½, o_act="silu", backend="triton")
          fla   = the glue of fla's HGRN2Attention.forward + chunk_gla(state_v_first=True)
          sdpa  = causal scaled_dot_product_attention on the FlashAttention backend, same B, T, H, D
  decode  one token from a state, B ∈ {1, 64}: ours (the public op; and the Triton kernel replayed from a CUDA graph,
          as the CUDA-graph decode runs it) vs fla's fused_recurrent_gla (with the same glue)
  hgrn1   the element-wise HGRN1 scan at an MQAR shape vs fla's fused_recurrent_hgrn, forward+backward
  rmsnorm hgrn2.ops.norm.rms_norm vs fla's fused RMSNorm (16K rows of 2048), forward+backward; add+rmsnorm
          the residual step (fp32 stream + branch, then the norm) fused, vs fla's prenorm RMSNorm
  swiglu  hgrn2.ops.swiglu.swiglu_linear vs fla's swiglu_linear (16K rows, 5632 → 2048), forward+backward
  ce      hgrn2.ops.cross_entropy.linear_cross_entropy vs fla's FusedLinearCrossEntropyLoss (16K rows,
          d = 1024, vocabulary 32000)
          (the glue rows also time the plain PyTorch composite, in the row's note)

Before timing, ours is checked against fla (relative error of outputs and input gradients). The floor of a row
is max(bytes / copy bandwidth, FLOPs / bf16 matmul rate), both measured at the start of the run. Times are
medians of `hgrn2.bench.common.time_ms`; inputs rotate through several copies when one copy fits in L2.
The forward rows also time ours replayed from a CUDA graph: the GPU's time alone, where an eager call of short
kernels waits on the host's launches. Columns that need CUDA (fla, SDPA's FlashAttention, the graphs) are skipped
on a CPU with one "skipped: needs CUDA" line; anything else that cannot run becomes a note in its row, never a
crash. The result goes to `--out DIR`/ops.json (default benchmarks/results/<device>/), rewritten after every row.

    hgrn2 bench ops --skip hgrn1          # the GPU run (a few minutes; fla autotunes on its first calls)
    hgrn2 bench ops --quick               # tiny shapes, also on a CPU
"""

from __future__ import annotations

import argparse
import json
import math
import time
import traceback

import torch
import torch.nn.functional as F

from hgrn2.bench.common import (
    TIMING_ROUNDS,
    add_output_argument,
    command_of,
    environment,
    fla_available,
    graph_ms,
    interleaved,
    rel_err,
    time_ms,
    write_result,
)
from hgrn2.bench.report import decode_table, ops_tables

H, D = 16, 128  # heads and head size of every row (quick runs: 2 and 32)
TOKENS = 16384
SEQ_LENS = (512, 2048, 8192, 32768)
SKIPPABLE = {"seq", "decode", "glue", "hgrn1"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="tiny shapes, a smoke run (works on the CPU)")
    add_output_argument(parser)
    parser.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    parser.add_argument("--backend", default=None, help="our backend (default: triton on CUDA, reference on CPU)")
    parser.add_argument("--budget-s", type=float, default=360.0, help="skip the remaining rows after this long")
    parser.add_argument("--skip", default="",
                        help="comma-separated row kinds to skip: seq,decode,glue,hgrn1 (glue: rmsnorm,swiglu,ce)")


# ---------------------------------------------------------------------------------------------------------------
# timing and ceilings


class Timer:
    """`time_ms` at this run's warm-up and repetitions (fewer for --quick)."""

    def __init__(self, device: torch.device, quick: bool):
        self.device = device
        self.warmup, self.rep = (5, 20) if quick else (25, 100)

    def __call__(self, fn, grad_to_none=None, inputs=None) -> float:
        return time_ms(fn, device=self.device, inputs=inputs, warmup=self.warmup, rep=self.rep,
                       grad_to_none=grad_to_none)


def ceilings(device: torch.device, timer: Timer, quick: bool) -> dict:
    """Device copy bandwidth (bytes read + written per second) and bf16 matmul rate, measured now."""
    n = (16 if quick else 512) << 20
    a = torch.randint(1, 255, (n,), dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    t_copy = timer(lambda: b.copy_(a), inputs=[a])
    m = 512 if quick else 8192
    dt = torch.bfloat16 if device.type == "cuda" else torch.float32
    x, y = torch.randn(m, m, device=device, dtype=dt), torch.randn(m, m, device=device, dtype=dt)
    t_mm = timer(lambda: x @ y, inputs=[x, y])
    return {"copy_bytes_per_s": 2 * n / (t_copy * 1e-3), "matmul_flops_per_s": 2 * m**3 / (t_mm * 1e-3)}


def l2_bytes(device: torch.device) -> int:
    if device.type != "cuda":
        return 0
    return int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 << 20))


def copies_for(nbytes: int, device: torch.device) -> int:
    """How many input copies to rotate through so that each call reads from outside L2."""
    return max(1, min(64, math.ceil(2 * l2_bytes(device) / max(nbytes, 1))))


# ---------------------------------------------------------------------------------------------------------------
# the three implementations of the recurrence


def fla_modules() -> dict | None:
    if not fla_available():
        return None
    try:
        from fla.layers.hgrn2 import HGRN2Attention
        from fla.modules import FusedLinearCrossEntropyLoss, RMSNorm
        from fla.modules.activations import swiglu_linear
        from fla.ops.gla import chunk_gla, fused_recurrent_gla
        from fla.ops.hgrn import fused_recurrent_hgrn
    except Exception:  # noqa: BLE001 - any import failure means "no fla column"
        return None
    return {"chunk_gla": chunk_gla, "fused_recurrent_gla": fused_recurrent_gla, "HGRN2Attention": HGRN2Attention,
            "fused_recurrent_hgrn": fused_recurrent_hgrn, "RMSNorm": RMSNorm, "swiglu_linear": swiglu_linear,
            "FusedLinearCrossEntropyLoss": FusedLinearCrossEntropyLoss}


def fla_glue(o, g, i, lb):
    """fla HGRN2Attention.forward between the projections and the kernel: q, k and the log-gate."""
    q = F.silu(o)
    lg = F.logsigmoid(g)
    lg = torch.logaddexp(lb.log(), torch.log1p(-lb) + lg)
    k = 1 - lg.exp()
    return q, k.to(i), lg


def fla_chunk(fla, o, g, i, lb, scale, h0=None, final=False):
    q, k, lg = fla_glue(o, g, i, lb)
    return fla["chunk_gla"](q, k, i, lg, scale=scale, initial_state=h0, output_final_state=final,
                            state_v_first=True)


def fla_decode(fla, o, g, i, lb, scale, h0):
    q, k, lg = fla_glue(o, g, i, lb)
    return fla["fused_recurrent_gla"](q, k, i, gk=lg, scale=scale, initial_state=h0, output_final_state=True,
                                      state_v_first=True)


def ours(o, g, i, lb, scale, backend, h0=None, final=False):
    from hgrn2.ops import hgrn2
    return hgrn2(o, g, i, lb, scale=scale, o_act="silu", initial_state=h0, output_final_state=final,
                 backend=backend)


def sdpa(q, k, v):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backends = [SDPBackend.FLASH_ATTENTION] if q.is_cuda else [SDPBackend.MATH]
    with sdpa_kernel(backends):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


# ---------------------------------------------------------------------------------------------------------------
# rows


def gate_inputs(B, T, ctx, requires_grad=False):
    """Random raw projections o, g, i [B, T, H, D] and a bound β [H, D] in (0, 0.9)."""
    H, D, device, dtype = ctx["H"], ctx["D"], ctx["device"], ctx["dtype"]
    o = torch.randn(B, T, H, D, device=device, dtype=dtype)
    g = torch.randn(B, T, H, D, device=device, dtype=dtype) * 2
    i = torch.randn(B, T, H, D, device=device, dtype=dtype)
    lb = torch.rand(H, D, device=device) * 0.9
    return [t.requires_grad_(requires_grad) for t in (o, g, i)] + [lb]


def fwd_bwd(fn, inputs, dy):
    """A callable running fn(*inputs) and its backward with output gradient dy."""
    def step():
        y = fn(*inputs)[0]
        y.backward(dy)
    return step


def compare(row, a_fn, b_fn, inputs, dy, n_grad=3) -> None:
    """Record relative errors of a vs b in `row`: outputs, and gradients of the first `n_grad` inputs."""
    try:
        ya = a_fn(*inputs)[0]
        ga = torch.autograd.grad(ya, inputs[:n_grad], dy)
        yb = b_fn(*inputs)[0]
        gb = torch.autograd.grad(yb, inputs[:n_grad], dy)
    except Exception as e:  # noqa: BLE001
        row["compare_error"] = f"{type(e).__name__}: {e}"[:300]
        return
    row["err_vs_fla_y"] = rel_err(ya, yb)
    row["err_vs_fla_grad"] = max(rel_err(x, y) for x, y in zip(ga, gb))


def seq_rows(B, T, ctx) -> list[dict]:
    dt, timer, fla, H, D = ctx["dtype"], ctx["timer"], ctx["fla"], ctx["H"], ctx["D"]
    scale = D ** -0.5
    o, g, i, lb = gate_inputs(B, T, ctx, requires_grad=True)
    args = (o, g, i, lb)
    dy = torch.randn_like(i)

    def ours_fn(o, g, i, lb):
        return ours(o, g, i, lb, scale, ctx["backend"])

    def fla_fn(o, g, i, lb):
        return fla_chunk(fla, o, g, i, lb, scale)

    n = B * T * H * D
    bytes_fwd, bytes_bwd = 4 * n * dt.itemsize, 7 * n * dt.itemsize
    # chunkwise work per token and head (chunk 64): intra-chunk 2·64·(K + V), state read and update 4·K·V
    flops_fwd = B * T * H * (2 * 64 * 2 * D + 4 * D * D)
    shape = f"B={B} T={T}"
    rows = []
    for mode in ("fwd", "fwd+bwd"):
        row = {"kind": "seq", "mode": mode, "shape": shape, "B": B, "T": T,
               "floor_ms": floor_ms(ctx, bytes_fwd + (bytes_bwd if mode != "fwd" else 0),
                                    flops_fwd * (3 if mode != "fwd" else 1))}
        if mode == "fwd" and fla:
            compare(row, ours_fn, fla_fn, args, dy)
        thunks = {"ours": lambda m=mode: measure(timer, ours_fn, args, dy, m)}
        if mode == "fwd" and ctx["cuda"]:
            thunks["ours_graph"] = lambda: graph_ms(lambda: ours_fn(*args), timer)
        if fla:
            thunks["fla"] = lambda m=mode: measure(timer, fla_fn, args, dy, m)
        if ctx["cuda"]:
            thunks["sdpa"] = lambda m=mode: sdpa_ms(B, T, ctx, m)
        with torch.no_grad() if mode == "fwd" else torch.enable_grad():
            row.update(interleaved(row, thunks, ctx["rounds"]))
        row.setdefault("fla_ms", None)
        rows.append(row)
    return rows


def first_calls(ctx, B, T) -> dict:
    """Seconds of the first forward+backward of ours and of fla at (B, T): compilation, and fla's autotuning
    (minutes: every chunk_gla kernel tries its configs once per process), kept out of the timed rows."""
    o, g, i, lb = gate_inputs(B, T, ctx, requires_grad=True)
    dy = torch.randn_like(i)
    fns = {"ours": lambda *a: ours(*a, ctx["D"] ** -0.5, ctx["backend"])}
    if ctx["fla"]:
        fns["fla"] = lambda *a: fla_chunk(ctx["fla"], *a, ctx["D"] ** -0.5)
    out = {}
    for name, fn in fns.items():
        t0 = time.time()
        fwd_bwd(fn, (o, g, i, lb), dy)()
        if o.is_cuda:
            torch.cuda.synchronize()
        out[name] = round(time.time() - t0, 1)
    return out


def measure(timer, fn, args, dy, mode):
    if mode == "fwd":
        return timer(lambda: fn(*args))
    return timer(fwd_bwd(fn, args, dy), grad_to_none=list(args[:3]))


def sdpa_ms(B, T, ctx, mode):
    dev, dt, H, D = ctx["device"], ctx["dtype"], ctx["H"], ctx["D"]
    q, k, v = (torch.randn(B, H, T, D, device=dev, dtype=dt, requires_grad=mode != "fwd") for _ in range(3))
    if mode == "fwd":
        with torch.no_grad():
            return ctx["timer"](lambda: sdpa(q, k, v))
    dy = torch.randn_like(q)
    return ctx["timer"](lambda: sdpa(q, k, v).backward(dy), grad_to_none=[q, k, v])


def decode_rows(B, ctx) -> list[dict]:
    """One token from a state: ours (the Triton decode kernel, and the public op) vs fla fused_recurrent_gla."""
    dev, dt, timer, fla, H, D = ctx["device"], ctx["dtype"], ctx["timer"], ctx["fla"], ctx["H"], ctx["D"]
    scale = D ** -0.5
    state_bytes = B * H * D * D * 4
    n = copies_for(state_bytes, dev)
    sets = [gate_inputs(B, 1, ctx) + [torch.randn(B, H, D, D, device=dev)] for _ in range(n)]
    row = {"kind": "decode", "mode": "fwd", "shape": f"B={B} T=1", "B": B, "T": 1, "copies": n,
           "floor_ms": floor_ms(ctx, 2 * state_bytes + 4 * B * H * D * dt.itemsize, 4 * B * H * D * D)}
    counter = iter(range(1 << 62))

    def rotate(fn):
        return lambda: fn(*sets[next(counter) % n])

    def kernel_fn(o, g, i, lb, h0):
        from hgrn2.ops.triton.recurrent import hgrn2_recurrent_triton
        return hgrn2_recurrent_triton(o, g, i, lb, scale=scale, o_act="silu", initial_state=h0,
                                      output_final_state=True)

    def api_fn(o, g, i, lb, h0):
        return ours(o, g, i, lb, scale, ctx["backend"], h0=h0, final=True)

    def fla_fn(o, g, i, lb, h0):
        return fla_decode(fla, o, g, i, lb, scale, h0)

    with torch.no_grad():
        if fla:
            y_ref, s_ref = fla_fn(*sets[0])
            y, s = kernel_fn(*sets[0])
            row["err_vs_fla_y"], row["err_vs_fla_state"] = rel_err(y, y_ref), rel_err(s, s_ref)
        # the kernel as the CUDA-graph decode runs it (a graph of one call per copy); the op and fla's call eager
        thunks = {"ours_graph": lambda: graph_ms(rotate(kernel_fn), timer, n)} if ctx["cuda"] else {}
        thunks["ours_api"] = lambda: timer(rotate(api_fn))
        if fla:
            thunks["fla"] = lambda: timer(rotate(fla_fn))
        row.update(interleaved(row, thunks, ctx["rounds"]))
    row.setdefault("fla_ms", None)
    return [row]


def hgrn1_rows(ctx) -> list[dict]:
    """HGRN1's element-wise scan, forward+backward at an MQAR shape, vs fla's fused_recurrent_hgrn."""
    dev, dt, timer, fla = ctx["device"], ctx["dtype"], ctx["timer"], ctx["fla"]
    B, T, Dm = (2, 64, 32) if ctx["quick"] else (128, 512, 512)
    x, g = (torch.randn(B, T, Dm, device=dev, dtype=dt, requires_grad=True) for _ in range(2))
    lb = torch.rand(Dm, device=dev) * 0.9
    dy = torch.randn_like(x)
    n = B * T * Dm
    row = {"kind": "hgrn1", "mode": "fwd+bwd", "shape": f"B={B} T={T} D={Dm}", "B": B, "T": T,
           "floor_ms": floor_ms(ctx, 6 * n * dt.itemsize, 0)}

    def ours_fn(x, g):
        from hgrn2.ops import hgrn1
        return hgrn1(x, g, lb, backend=ctx["hgrn1_backend"])

    def fla_fn(x, g):
        # fla's HGRNAttention glue: log f cast back to the activations' dtype, input gated by 1 − exp(log f)
        lf = F.logsigmoid(g)
        lf = torch.logaddexp(lb.log(), torch.log1p(-lb) + lf).to(lf)
        return fla["fused_recurrent_hgrn"](x * (1 - lf.exp()), lf)

    if fla:
        compare(row, ours_fn, fla_fn, (x, g), dy, n_grad=2)
    thunks = {"ours": lambda: timer(fwd_bwd(ours_fn, (x, g), dy), grad_to_none=[x, g])}
    if fla:
        thunks["fla"] = lambda: timer(fwd_bwd(fla_fn, (x, g), dy), grad_to_none=[x, g])
    row.update(interleaved(row, thunks, ctx["rounds"]))
    return [row]


def glue_rows(ctx) -> list[dict]:
    """The model's glue around the recurrence, forward+backward: RMSNorm, SwiGLU + down projection, and the LM
    head's cross entropy; ours, fla's fused module and the PyTorch composite (in the note)."""
    from hgrn2.ops.cross_entropy import linear_cross_entropy
    from hgrn2.ops.norm import add_rms_norm, rms_norm
    from hgrn2.ops.swiglu import swiglu_linear

    dev, dt, fla = ctx["device"], ctx["dtype"], ctx["fla"]
    N, d, inter, V, d_head = (64, 64, 176, 1000, 64) if ctx["quick"] else (TOKENS, H * D, 5632, 32000, 1024)

    def leaf(*shape, scale=1.0, dtype=dt):
        return (torch.randn(*shape, device=dev, dtype=dtype) * scale).requires_grad_()

    x, w = leaf(N, d), (1 + 0.1 * torch.randn(d, device=dev)).requires_grad_()
    g, u, wd = leaf(N, inter), leaf(N, inter), leaf(d, inter, scale=inter ** -0.5)
    h, wv = leaf(N, d_head), leaf(V, d_head, scale=d_head ** -0.5)
    labels = torch.randint(0, V, (N,), device=dev)
    dy = torch.randn(N, d, device=dev, dtype=dt)
    fla_norm = fla["RMSNorm"](d, eps=1e-5).to(dev) if fla else None
    fla_ce = fla["FusedLinearCrossEntropyLoss"]() if fla else None

    def rms_composite():
        xf = x.float()
        return (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + 1e-5) * w).to(x.dtype)

    # a block's residual step: fp32 residual stream + a branch output in dt, then the next pre-norm
    resid, branch = leaf(N, d, dtype=torch.float32), leaf(N, d)
    add_cot = (torch.randn(N, d, device=dev), dy)  # r's gradient from later blocks, the normalised output's

    def add_norm_separate():  # the unfused path: the add, then the norm kernel
        r = resid + branch
        return r, rms_norm(r, w, 1e-5, dt)

    specs = [  # kind, shape, floor bytes, floor FLOPs, leaves, cotangent, {ours, composite, fla}
        ("rmsnorm", f"N={N} D={d}", 5 * N * d * dt.itemsize, 0, [x, w], dy,
         {"ours": lambda: rms_norm(x, w, 1e-5), "composite": rms_composite,
          "fla": fla_norm and (lambda: fla_norm(x))}),
        ("add+rmsnorm", f"N={N} D={d}", 28 * N * d, 0, [resid, branch, w], add_cot,
         {"ours": lambda: add_rms_norm(resid, branch, w, 1e-5, dt), "composite": add_norm_separate,
          "fla": fla_norm and (lambda: fla_norm(branch, residual=resid, prenorm=True, residual_in_fp32=True)[::-1])}),
        ("swiglu", f"N={N} I={inter}", 6 * N * inter * dt.itemsize, 6 * N * inter * d, [g, u, wd], dy,
         {"ours": lambda: swiglu_linear(g, u, wd), "composite": lambda: F.linear(F.silu(g) * u, wd),
          "fla": fla and (lambda: fla["swiglu_linear"](g, u, wd, None))}),
        ("ce", f"N={N} V={V}", 0, 6 * N * d_head * V, [h, wv], None,
         {"ours": lambda: linear_cross_entropy(h, wv, labels),
          "composite": lambda: F.cross_entropy((h @ wv.t()).float(), labels),
          "fla": fla_ce and (lambda: fla_ce(h, labels, wv))}),
    ]
    rows = []
    for kind, shape, nbytes, flops, leaves, cot, impls in specs:
        row = {"kind": kind, "mode": "fwd+bwd", "shape": shape, "B": N, "T": 1,
               "floor_ms": floor_ms(ctx, nbytes, flops)}
        ms = interleaved(row, {name: lambda fn=fn, cot=cot, leaves=leaves: _time_fwd_bwd(ctx, fn, cot, leaves)
                               for name, fn in impls.items() if fn}, ctx["rounds"])
        row["ours_ms"], row["fla_ms"] = ms.get("ours_ms"), ms.get("fla_ms")
        row["note"] = f"composite {ms['composite_ms']:.4f} ms" if ms.get("composite_ms") else None
        rows.append(row)
    return rows


def _time_fwd_bwd(ctx, fn, cotangent, leaves) -> float:
    """fn() then its backward (with `cotangent`, or none for a scalar; a tuple of them for a tuple of outputs),
    the leaves' grads reset each time."""
    def step():
        out = fn()
        if isinstance(out, tuple):
            torch.autograd.backward(out, cotangent)
        else:
            out.backward(cotangent)
    return ctx["timer"](step, grad_to_none=leaves)


def floor_ms(ctx, nbytes, flops) -> float:
    c = ctx["ceilings"]
    return 1e3 * max(nbytes / c["copy_bytes_per_s"], flops / c["matmul_flops_per_s"])


# ---------------------------------------------------------------------------------------------------------------
# report


def notes(rows) -> str:
    """The rows' notes and errors, one line each (the table leaves them out)."""
    return "\n".join(f"{r['kind']} {r['shape']}: {k}: {v}" for r in rows for k, v in r.items()
                     if v and (k.endswith("_error") or k == "note") and not str(v).startswith("composite"))


def run(args: argparse.Namespace) -> int:
    skip = set(filter(None, args.skip.split(",")))
    if skip - SKIPPABLE:
        raise ValueError(f"--skip: unknown row kinds {sorted(skip - SKIPPABLE)}; choose from {sorted(SKIPPABLE)}")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    quick, cuda = args.quick, device.type == "cuda"
    timer = Timer(device, quick)
    fla = fla_modules() if cuda else None
    backend = args.backend or ("triton" if cuda else "reference")
    ctx = {"device": device, "quick": quick, "cuda": cuda, "H": 2 if quick else H, "D": 32 if quick else D,
           "timer": timer, "fla": fla, "dtype": torch.bfloat16 if cuda else torch.float32, "backend": backend,
           "hgrn1_backend": backend, "rounds": 1 if quick else TIMING_ROUNDS}
    ctx["ceilings"] = ceilings(device, timer, quick)
    env = environment(device)
    extra = {"quick": quick, "ceilings": ctx["ceilings"], "backend": backend}
    print(f"# {env['device']}  torch {env['versions']['torch']}  triton {env['versions']['triton']}  "
          f"fla {env['versions']['fla'] if fla else 'no'}  copy {ctx['ceilings']['copy_bytes_per_s'] / 1e12:.2f} TB/s  "
          f"matmul {ctx['ceilings']['matmul_flops_per_s'] / 1e12:.1f} TFLOP/s", flush=True)
    if not cuda:
        print("skipped: the fla and SDPA-flash columns and the Triton decode kernel: needs CUDA", flush=True)
    elif fla is None:
        print("skipped: the fla columns: flash-linear-attention is not importable", flush=True)

    seq_lens = (32, 64) if quick else SEQ_LENS
    tokens = 64 if quick else TOKENS
    if "seq" not in skip:
        extra["first_call_s"] = first_calls(ctx, max(1, tokens // seq_lens[1]), seq_lens[1])
        print(f"# first calls (compile / autotune), s: {extra['first_call_s']}", flush=True)
    # the target shape, the decode step and the glue first: the long seq rows must not crowd them out
    jobs = [(f"seq T={T}", lambda T=T: seq_rows(max(1, tokens // T), T, ctx))
            for T in sorted(seq_lens, key=lambda T: T != seq_lens[1]) if "seq" not in skip]
    if "decode" not in skip:
        jobs[1:1] = [(f"decode B={B}", lambda B=B: decode_rows(B, ctx)) for B in ((1, 4) if quick else (1, 64))]
    if "glue" not in skip:
        jobs.insert(1, ("glue", lambda: glue_rows(ctx)))
    if "hgrn1" not in skip:
        jobs.append(("hgrn1", lambda: hgrn1_rows(ctx)))

    rows, t0, path = [], time.time(), None
    for name, job in jobs:
        if time.time() - t0 > args.budget_s:
            rows.append({"kind": name, "mode": "-", "shape": "-", "note": f"skipped: over --budget-s {args.budget_s}"})
            continue
        try:
            new = job()
        except Exception as e:  # noqa: BLE001 - one broken row must not lose the others
            new = [{"kind": name, "mode": "-", "shape": "-", "note": f"failed: {type(e).__name__}: {e}"[:400],
                    "traceback": traceback.format_exc()[-2000:]}]
        for r in new:
            print(json.dumps({k: v for k, v in r.items() if k != "traceback"}), flush=True)
        rows += new
        # after every row: a run killed by a time limit keeps what it measured
        path = write_result(args.out, "ops", env, rows, command_of(args), **extra)
        if cuda:
            torch.cuda.empty_cache()
    if path is None:
        path = write_result(args.out, "ops", env, rows, command_of(args), **extra)
    print(f"wrote {path}")
    if notes(rows):
        print(notes(rows))
    tables = (ops_tables({"rows": rows}), decode_table({"rows": rows}))
    print("\n\n".join(t for t in tables if t.count("\n") > 1))
    return 0
