"""Which launch settings of the fused-chunk kernels are fastest on this GPU? Every (V-block, warps, stages,
tokens per step) combination of each direction, timed and checked, fastest first.

    PYTHONPATH=. python benchmarks/gpu_fused_chunk_sweep.py [--shapes 8x2048x16,8x2048x8] [--directions bwd,fwd]
        [--budget-s 480] [--out F]
    TRITON_INTERPRET=1 PYTHONPATH=. python benchmarks/gpu_fused_chunk_sweep.py --device cpu --shapes 1x40x1 \
        --head-dim 16 --budget-s 20        # a smoke test of this script on a CPU

Per shape (B × T × H, K = V = 128, bf16, β and silu as in `hgrn2 bench ops`): the forward alone, and the
backward alone (`torch.autograd.grad` of a kept forward graph), for each setting of the direction's fields of
`FusedChunkConfig` (the default row: the shipped defaults, "auto" where the backward's form and steps follow
`fused_chunk.bwd_form`). Each setting's output is compared with the default
setting's (bf16 relative error ≤ 1e-2, else it is reported as WRONG); settings that fail to compile are
reported, not fatal.
Times are medians of `triton.testing.do_bench`. The last lines are a table of the three fastest settings per
shape and direction next to the default; copy the winners into `FusedChunkConfig`'s defaults.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import time

import torch
import triton

from hgrn2.ops.triton import hgrn2_fused_chunk_triton
from hgrn2.ops.triton.config import FusedChunkConfig

# per direction: max_bv, num_warps, num_stages, tokens per step (and the backward's form, bwd_split). Pruned
# where the offline sm_90 compile (tests/ops/triton/compile_sm90.py chunk-grid) shows heavy spills: 4 warps in
# the backward; V-blocks of 32 and pipelining stages are left out as never faster.
GRID = {
    "bwd": dict(max_bv=(128, 64), num_warps=(8, 16), num_stages=(None,), block_t=(16, 32), split=(False, True)),
    "fwd": dict(max_bv=(128, 64), num_warps=(4, 8), num_stages=(None, 1), block_t=(16, 32)),
}
# a setting's keys → FusedChunkConfig's fields, per direction
FIELDS = {d: {"max_bv": f"max_bv_{d}", "num_warps": f"num_warps_{d}", "num_stages": f"num_stages_{d}",
              "block_t": f"block_t_{d}"} for d in ("fwd", "bwd")}
FIELDS["bwd"]["split"] = "bwd_split"
# the shipped settings, per direction (timed first, the reference for every other setting)
DEFAULT = {d: {k: getattr(FusedChunkConfig(), f) for k, f in FIELDS[d].items()} for d in ("fwd", "bwd")}


def rel(a, b) -> float:
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm()).item()


def inputs(B, T, H, K, device, seed=0):
    gen = torch.Generator(device=device).manual_seed(seed)
    o, g, i = (torch.randn(B, T, H, K, device=device, generator=gen).bfloat16().requires_grad_() for _ in range(3))
    lb = torch.rand(H, K, device=device, generator=gen) * 0.9
    dy = torch.randn(B, T, H, K, device=device, generator=gen).bfloat16()
    return o, g, i, lb, dy


def bench(fn, device) -> float:
    if device.type == "cuda":
        return triton.testing.do_bench(fn, return_mode="median")
    t0 = time.perf_counter()  # CPU smoke runs (interpreted kernels, also on a GPU machine): one call
    fn()
    return 1e3 * (time.perf_counter() - t0)


def config(direction: str, setting: dict) -> FusedChunkConfig:
    return dataclasses.replace(FusedChunkConfig(), **{FIELDS[direction][k]: v for k, v in setting.items()})


def measure(direction: str, xs, cfg: FusedChunkConfig) -> tuple[float, torch.Tensor]:
    """(median ms, result) of one direction with the settings cfg."""
    o, g, i, lb, dy = xs
    K = o.shape[-1]

    def fwd():
        return hgrn2_fused_chunk_triton(o, g, i, lb, scale=K ** -0.5, o_act="silu", config=cfg)[0]

    if direction == "fwd":
        with torch.no_grad():
            return bench(fwd, o.device), fwd()
    y = fwd()  # the graph is kept: only the backward kernels run below

    def bwd():
        return torch.autograd.grad(y, (o, g, i), dy, retain_graph=True)

    return bench(bwd, o.device), torch.cat([t.flatten() for t in bwd()])


def sweep_shape(shape, head_dim, directions, device, deadline, log) -> list[dict]:
    B, T, H = shape
    xs = inputs(B, T, H, head_dim, device)
    rows = []
    for direction in directions:
        grid = GRID[direction]
        default = DEFAULT[direction]
        settings = [default] + [dict(zip(grid, v)) for v in itertools.product(*grid.values())
                                if dict(zip(grid, v)) != default]
        want = None
        for setting in settings:
            if time.time() > deadline:
                log(f"budget spent: {direction} {shape} stops")
                break
            row = {"shape": f"{B}x{T}x{H}", "direction": direction, **setting}
            try:
                t0 = time.time()
                ms, out = measure(direction, xs, config(direction, setting))
                row["ms"], row["first_s"] = ms, round(time.time() - t0, 1)
                want = out if want is None else want
                row["err_vs_default"] = rel(out, want)
                row["status"] = "ok" if row["err_vs_default"] <= 1e-2 else "WRONG"
            except Exception as e:  # noqa: BLE001 - a failing setting is a result, not a crash
                row["status"] = f"{type(e).__name__}: {str(e)[:120]}"
            log(json.dumps(row))
            rows.append(row)
    return rows


def summary(rows) -> str:
    lines = ["shape       dir  split max_bv warps stages BT     ms    vs default"]
    for key in sorted({(r["shape"], r["direction"]) for r in rows}):
        ok = [r for r in rows if (r["shape"], r["direction"]) == key and r.get("status") == "ok"]
        if not ok:
            continue
        base = ok[0]["ms"]  # the default setting runs first
        for r in [ok[0]] + sorted(ok[1:], key=lambda r: r["ms"])[:3]:
            split = {True: "yes", False: "-", None: "auto"}[r.get("split", False)]  # None: fused_chunk.bwd_form
            lines.append(f"{r['shape']:<11} {r['direction']:<4} {split:>5} "
                         f"{r['max_bv']:>6} {r['num_warps'] or '-':>5} {r['num_stages'] or '-':>6} "
                         f"{r['block_t'] or '-':>3} {r['ms']:>7.3f}  {r['ms'] / base:>6.2f}x")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="8x2048x16,8x2048x8", help="comma list of BxTxH")
    p.add_argument("--directions", default="bwd,fwd", help="in this order (the backward is 5x the forward)")
    p.add_argument("--budget-s", type=float, default=480)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", default=None, help="write every row as JSON here")
    args = p.parse_args()
    deadline = time.time() + args.budget_s
    name = torch.cuda.get_device_name() if args.device == "cuda" else args.device
    print(f"# {name}  torch {torch.__version__}  triton {triton.__version__}", flush=True)
    rows = []
    for shape in args.shapes.split(","):
        rows += sweep_shape(tuple(int(x) for x in shape.split("x")), args.head_dim, args.directions.split(","),
                            args.device, deadline,
                            lambda s: print(s, flush=True))
        if args.out:
            with open(args.out, "w") as f:
                json.dump(rows, f, indent=1)
    print(summary(rows))


if __name__ == "__main__":
    main()
