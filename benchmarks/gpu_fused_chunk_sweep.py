"""Launch tuning of the sequential chunk kernels on one GPU: every (V-block, warps, stages, tokens per step)
combination of each direction, timed and checked, fastest first.

    PYTHONPATH=. python benchmarks/gpu_chunk_sweep.py [--shapes 8x2048x16,8x2048x8] [--directions bwd,fwd]
        [--budget-s 480] [--out F]
    TRITON_INTERPRET=1 PYTHONPATH=. python benchmarks/gpu_chunk_sweep.py --device cpu --shapes 1x40x1 \
        --head-dim 16 --budget-s 20        # a smoke test of this script on a CPU

Per shape (B × T × H, K = V = 128, bf16, β and silu as in `hgrn2 bench ops`): the forward alone, and the
backward alone (`torch.autograd.grad` of a kept forward graph), for each setting of `chunk.TUNING[direction]`,
`chunk.BLOCK_T_FWD` / `BLOCK_T_BWD` and `chunk.BWD_SPLIT` (the default row: chunk.py's own, "auto" where the
backward's form and steps follow `chunk._bwd_form`). Each setting's output is compared with the default
setting's (bf16 relative error ≤ 1e-2, else it is reported as WRONG); settings that fail to compile are
reported, not fatal.
Times are medians of `triton.testing.do_bench`. The last lines are a table of the three fastest settings per
shape and direction next to the default; copy the winners into `hgrn2/ops/triton/chunk.py`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time

import torch
import triton

from hgrn2.ops.triton import chunk as chunk_mod

# per direction: max_bv, num_warps, num_stages, tokens per step (and the backward's form, chunk.BWD_SPLIT).
# Pruned by the offline sm_90 compile (NOTES.md) and the H100 sweep of 2026-11-23 (BENCHMARKS.md): 4 warps
# spill 1.5-11 KB per thread in the backward, and V-blocks of 32 and pipelining stages never won.
GRID = {
    "bwd": dict(max_bv=(128, 64), num_warps=(8, 16), num_stages=(None,), block_t=(16, 32), split=(False, True)),
    "fwd": dict(max_bv=(128, 64), num_warps=(4, 8), num_stages=(None, 1), block_t=(16, 32)),
}
# the settings chunk.py ships with, per direction (timed first, the reference for every other setting)
DEFAULT = {d: {**chunk_mod.TUNING[d], "block_t": getattr(chunk_mod, f"BLOCK_T_{d.upper()}")} for d in ("fwd", "bwd")}
DEFAULT["bwd"]["split"] = chunk_mod.BWD_SPLIT


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


def apply(direction: str, setting: dict) -> None:
    chunk_mod.TUNING[direction] = {k: setting[k] for k in ("max_bv", "num_warps", "num_stages")}
    setattr(chunk_mod, "BLOCK_T_FWD" if direction == "fwd" else "BLOCK_T_BWD", setting["block_t"])
    if direction == "bwd":
        chunk_mod.BWD_SPLIT = setting["split"]


def measure(direction: str, xs) -> tuple[float, torch.Tensor]:
    """(median ms, result) of one direction with the current settings."""
    o, g, i, lb, dy = xs
    K = o.shape[-1]

    def fwd():
        return chunk_mod.hgrn2_chunk_triton(o, g, i, lb, scale=K ** -0.5, o_act="silu")[0]

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
            apply(direction, setting)
            row = {"shape": f"{B}x{T}x{H}", "direction": direction, **setting}
            try:
                t0 = time.time()
                ms, out = measure(direction, xs)
                row["ms"], row["first_s"] = ms, round(time.time() - t0, 1)
                want = out if want is None else want
                row["err_vs_default"] = rel(out, want)
                row["status"] = "ok" if row["err_vs_default"] <= 1e-2 else "WRONG"
            except Exception as e:  # noqa: BLE001 - a failing setting is a result, not a crash
                row["status"] = f"{type(e).__name__}: {str(e)[:120]}"
            finally:
                apply(direction, default)
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
            split = {True: "yes", False: "-", None: "auto"}[r.get("split", False)]  # None: chunk._bwd_form
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
