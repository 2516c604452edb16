"""Relative L2 error of every output and gradient of the Triton HGRN2 kernels against the fp64 reference, on a GPU.

    PYTHONPATH=. python benchmarks/gpu_accuracy.py [--kernels fused,parallel] [--out errors.json]

The tests assert bounds; this prints the numbers (per tensor, dtype and shape; for ours and for fla's glue +
chunk_gla, as its HGRN2 layer calls them), so a failing bound can be traced to one gradient.
`fused+fp32dots` runs the fused-chunk kernels on bf16 inputs with fp32 tl.dot operands (tf32x3),
which separates the error of bf16 dot operands from the rest.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time

import torch
import triton.language as tl

from hgrn2.bench.ops import fla_chunk, fla_modules
from hgrn2.ops import hgrn2_reference
from hgrn2.ops.triton import fused_chunk as fused_mod

NAMES = ("y", "final", "do", "dg", "di", "dbeta", "dh0")
CASES = [  # (label, B, T, H, K, V, g_scale, beta range)
    ("T300 K64", 2, 300, 2, 64, 64, 2.0, (0.05, 0.95)),
    ("T300 K128", 2, 300, 2, 128, 128, 2.0, (0.05, 0.95)),
    ("T300 K256", 2, 300, 2, 256, 256, 2.0, (0.05, 0.95)),
    ("T4096 slow", 1, 4096, 2, 64, 64, 1.0, (0.5, 0.999)),
    ("T2048 K128 nolb", 2, 2048, 4, 128, 128, 1.0, None),
]


def rel(x, ref):
    x, ref = x.detach().double(), ref.detach().double()
    return ((x - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def kernels(names):
    out = {}
    for name in names:
        if name == "fused":
            out[name] = fused_mod.hgrn2_fused_chunk_triton
        elif name == "fused+fp32dots":
            out[name] = _chunk_fp32_dots
        elif name == "fla":
            fla = fla_modules()
            if fla is None:
                print("fla: not installed")
                continue
            out[name] = functools.partial(_fla, fla)
        elif name == "parallel":
            from hgrn2.ops.triton.chunk_parallel import hgrn2_chunk_parallel_triton
            out[name] = hgrn2_chunk_parallel_triton
    return out


def _fla(fla, o, g, i, lb, *, scale, o_act, initial_state, output_final_state):
    """fla's HGRN2Attention between its projections and its kernel: glue + chunk_gla (o_act is silu there)."""
    assert o_act == "silu" and lb is not None
    y, ht = fla_chunk(fla, o, g, i, lb, scale, initial_state, output_final_state)
    return y, ht.float()


def _chunk_fp32_dots(*args, **kw):
    original = fused_mod._config

    def config(o, i, n, direction, cfg):
        BK, BV, NV, launch, dt, prec = original(o, i, n, direction, cfg)
        return (BK, BV, NV, launch, tl.float32, "tf32x3") if dt == tl.bfloat16 else (BK, BV, NV, launch, dt, prec)

    fused_mod._config = config
    try:
        return fused_mod.hgrn2_fused_chunk_triton(*args, **kw)
    finally:
        fused_mod._config = original


@functools.cache
def reference(case, dtype, device):
    """Inputs (rounded to `dtype`), cotangents and the fp64 reference's outputs and gradients for one case."""
    _, B, T, H, K, V, g_scale, lb = case
    torch.manual_seed(0)
    o = torch.randn(B, T, H, K, device=device).to(dtype)
    g = (torch.randn(B, T, H, K, device=device) * g_scale).to(dtype)
    i = torch.randn(B, T, H, V, device=device).to(dtype)
    beta = None if lb is None else lb[0] + (lb[1] - lb[0]) * torch.rand(H, K, device=device)
    h0 = torch.randn(B, H, V, K, device=device)
    inputs = [o, g, i, beta, h0]
    kw = dict(scale=K ** -0.5, o_act="silu", output_final_state=True)
    refs = [None if x is None else x.detach().double().requires_grad_() for x in inputs]
    y_ref, ht_ref = hgrn2_reference(*refs[:4], initial_state=refs[4], **kw)
    dy, dht = torch.randn_like(y_ref), torch.randn_like(ht_ref)
    ((y_ref * dy).sum() + (ht_ref * dht).sum()).backward()
    want = [y_ref.detach(), ht_ref.detach()] + [None if x is None else x.grad for x in refs]
    return inputs, kw, dy, dht, want


def errors(fn, case, dtype, device):
    inputs, kw, dy, dht, want = reference(case, dtype, device)
    leaves = [None if x is None else x.clone().requires_grad_() for x in inputs]
    y, ht = fn(*leaves[:4], initial_state=leaves[4], **kw)
    ((y.double() * dy).sum() + (ht.double() * dht).sum()).backward()
    got = [y, ht] + [None if x is None else x.grad for x in leaves]
    return {n: (None if a is None else rel(a, b)) for n, a, b in zip(NAMES, got, want)}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--kernels", default="fused,parallel,fla")
    p.add_argument("--out", default=None)
    p.add_argument("--device", default="cuda")
    p.add_argument("--cases", default="", help="comma list of case labels (default: all)")
    p.add_argument("--dtypes", default="float32,bfloat16,float16")
    args = p.parse_args()
    cases = [c for c in CASES if not args.cases or c[0] in args.cases.split(",")]
    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    rows = []
    print(f"{'kernel':16} {'dtype':9} {'case':16} " + " ".join(f"{n:>8}" for n in NAMES), flush=True)
    for kname, fn in kernels(args.kernels.split(",")).items():
        for dtype in dtypes:
            if kname == "chunk+fp32dots" and dtype != torch.bfloat16:
                continue
            for case in cases:
                t0 = time.time()
                if kname == "fla" and case[-1] is None:
                    continue  # fla's glue needs a lower bound
                try:
                    err = errors(fn, case, dtype, args.device)
                except Exception as e:  # one failure must not hide the rest
                    print(f"{kname:16} {str(dtype)[6:]:9} {case[0]:16} ERROR {type(e).__name__}: {e}", flush=True)
                    continue
                rows.append(dict(kernel=kname, dtype=str(dtype), case=case[0], errors=err))
                cells = " ".join("       -" if v is None else f"{v:8.1e}" for v in err.values())
                print(f"{kname:16} {str(dtype)[6:]:9} {case[0]:16} {cells}  ({time.time() - t0:.0f}s)", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
