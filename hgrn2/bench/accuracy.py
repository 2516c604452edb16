"""`hgrn2 bench accuracy`: relative L2 error of every output and gradient against the fp64 step-by-step reference.

Per implementation, dtype and case: y, the final state, and the gradients of o, g, i, β and the initial state
(`hgrn2.bench.common.rel_err`), with random output and final-state cotangents. Implementations: `triton` (the public
op with backend="triton": the kernel its dispatch picks for the shape), `chunk` (the PyTorch chunkwise path) and
`fla` (fla's HGRN2Attention glue + chunk_gla, as its layer calls them; bf16 only by default, its autotuning takes
minutes per dtype). The tests assert bounds; this prints the numbers, so a failing bound can be traced to one tensor.

    hgrn2 bench accuracy                       # writes benchmarks/results/<device>/accuracy.json
    hgrn2 bench accuracy --quick               # tiny cases, on a CPU the chunk path only
"""

from __future__ import annotations

import argparse
import functools
import time

import torch

from hgrn2.bench.common import (
    add_output_argument,
    command_of,
    environment,
    fla_available,
    format_table,
    rel_err,
    write_result,
)

NAMES = ("y", "final", "do", "dg", "di", "dbeta", "dh0")
CASES = [  # (label, B, T, H, K, g scale, β range or None)
    ("T300 K64", 2, 300, 2, 64, 2.0, (0.05, 0.95)),
    ("T300 K128", 2, 300, 2, 128, 2.0, (0.05, 0.95)),
    ("T300 K256", 2, 300, 2, 256, 2.0, (0.05, 0.95)),
    ("T4096 slow", 1, 4096, 2, 64, 1.0, (0.5, 0.999)),
    ("T2048 K128 nolb", 2, 2048, 4, 128, 1.0, None),
    ("T2048 H16 K128", 2, 2048, 16, 128, 2.0, (0.05, 0.95)),
]
QUICK_CASES = [("T40 K16", 1, 40, 2, 16, 2.0, (0.05, 0.95)), ("T40 K16 nolb", 1, 40, 2, 16, 1.0, None)]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--impls", default="triton,chunk,fla", help="comma list of triton, chunk, fla")
    parser.add_argument("--dtypes", default="float32,bfloat16,float16")
    parser.add_argument("--fla-dtypes", default="bfloat16", help="the dtypes fla runs in (its autotuning is slow)")
    parser.add_argument("--cases", default="", help="comma list of case labels (default: all)")
    parser.add_argument("--quick", action="store_true", help="two tiny cases in float32 (also on a CPU)")
    parser.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    add_output_argument(parser)


def implementations(names: list[str], cuda: bool) -> dict:
    from hgrn2.ops import hgrn2

    out = {}
    for name in names:
        if name in ("triton", "fla") and not cuda:
            print(f"skipped: {name}: needs CUDA", flush=True)
        elif name == "fla" and not fla_available():
            print("skipped: fla: flash-linear-attention is not importable", flush=True)
        elif name == "fla":
            from hgrn2.bench.ops import fla_chunk, fla_modules
            out[name] = functools.partial(_fla, fla_modules(), fla_chunk)
        elif name in ("triton", "chunk"):
            out[name] = functools.partial(hgrn2, backend=name)
        else:
            raise ValueError(f"--impls: unknown implementation {name!r}; choose from triton, chunk, fla")
    return out


def _fla(fla, fla_chunk, o, g, i, lb, *, scale, o_act, initial_state, output_final_state):
    """fla's HGRN2Attention between its projections and its kernel (its output gate is silu)."""
    assert o_act == "silu" and lb is not None
    y, ht = fla_chunk(fla, o, g, i, lb, scale, initial_state, output_final_state)
    return y, ht.float()


@functools.cache
def reference(case, dtype, device):
    """Inputs (rounded to `dtype`), cotangents and the fp64 reference's outputs and gradients for one case."""
    from hgrn2.ops import hgrn2_reference

    _, B, T, H, K, g_scale, lb = case
    torch.manual_seed(0)
    o = torch.randn(B, T, H, K, device=device).to(dtype)
    g = (torch.randn(B, T, H, K, device=device) * g_scale).to(dtype)
    i = torch.randn(B, T, H, K, device=device).to(dtype)
    beta = None if lb is None else lb[0] + (lb[1] - lb[0]) * torch.rand(H, K, device=device)
    h0 = torch.randn(B, H, K, K, device=device)
    inputs = [o, g, i, beta, h0]
    kw = dict(scale=K ** -0.5, o_act="silu", output_final_state=True)
    refs = [None if x is None else x.detach().double().requires_grad_() for x in inputs]
    y_ref, ht_ref = hgrn2_reference(*refs[:4], initial_state=refs[4], **kw)
    dy, dht = torch.randn_like(y_ref), torch.randn_like(ht_ref)
    ((y_ref * dy).sum() + (ht_ref * dht).sum()).backward()
    want = [y_ref.detach(), ht_ref.detach()] + [None if x is None else x.grad for x in refs]
    return inputs, kw, dy, dht, want


def errors(fn, case, dtype, device) -> dict:
    inputs, kw, dy, dht, want = reference(case, dtype, device)
    leaves = [None if x is None else x.clone().requires_grad_() for x in inputs]
    y, ht = fn(*leaves[:4], initial_state=leaves[4], **kw)
    ((y.double() * dy).sum() + (ht.double() * dht).sum()).backward()
    got = [y, ht] + [None if x is None else x.grad for x in leaves]
    return {n: (None if a is None else rel_err(a, b)) for n, a, b in zip(NAMES, got, want)}


def run(args: argparse.Namespace) -> int:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cases = QUICK_CASES if args.quick else [c for c in CASES if not args.cases or c[0] in args.cases.split(",")]
    dtypes = [torch.float32] if args.quick else [getattr(torch, d) for d in args.dtypes.split(",")]
    fla_dtypes = set(args.fla_dtypes.split(","))
    rows = []
    for name, fn in implementations(args.impls.split(","), device.type == "cuda").items():
        for dtype in dtypes:
            if name == "fla" and str(dtype).removeprefix("torch.") not in fla_dtypes:
                continue
            for case in cases:
                if name == "fla" and case[-1] is None:
                    continue  # fla's glue needs a lower bound
                t0 = time.time()
                row = {"impl": name, "dtype": str(dtype).removeprefix("torch."), "case": case[0]}
                try:
                    row.update(errors(fn, case, dtype, device))
                except Exception as e:  # noqa: BLE001 - one failure must not hide the rest
                    row["error"] = f"{type(e).__name__}: {e}"[:300]
                rows.append(row)
                print(f"{name:7s} {row['dtype']:9s} {case[0]:16s} ({time.time() - t0:.0f} s)", flush=True)
    path = write_result(args.out, "accuracy", environment(device), rows, command_of(args), quick=args.quick)
    print(f"wrote {path}")
    print(format_table(rows, [("impl", "impl", ""), ("dtype", "dtype", ""), ("case", "case", "")]
                       + [(n, n, ".1e") for n in NAMES]))
    return 0
