"""One GPU check of the Triton chunk kernels: compile times, correctness, timings vs fla and SDPA (< 4 minutes).

    PYTHONPATH=. python benchmarks/gpu_kernel_check.py          (fla importable for its rows; optional)

Each step runs in its own subprocess with a hard time limit (killed on expiry, reported as TIMEOUT), so a slow
compile, a hung kernel or fla's autotuning cannot stall the whole run. Progress is printed as it happens; a
short table comes last. Steps: first launch (compile + run) of forward and backward per dtype and head size;
fp64-reference check (outputs, final state, all gradients) at B=2 T=300 H=2 K=V=64; timings of ours with
V-blocks of 128 and 64 and of SDPA; then fla's chunk_gla (its autotuning is timed separately): agreement and
timings at B=8 T=2048 H=16 K=V=128 bf16.
"""

import json
import os
import signal
import subprocess
import sys
import time

TOTAL_S = 230  # the whole run stays below 4 minutes
DEV = os.environ.get("CHECK_DEVICE", "cuda")  # "cpu" with TRITON_INTERPRET=1 only to smoke-test this script
STEPS = [  # (name, time limit in s)
    ("compile fp32 K=32", 40), ("compile bf16 K=32", 40), ("compile fp32 K=128", 40), ("compile bf16 K=128", 40),
    ("reference fp32", 40), ("reference bf16", 40), ("bench ours", 60), ("fla", 150),
]


def sync():
    import torch
    if DEV == "cuda":
        torch.cuda.synchronize()


def inputs(B, T, H, K, dtype, grad=True, states=True, g_scale=2.0):
    import torch
    o, g, i = (torch.randn(B, T, H, K, device=DEV) for _ in range(3))
    g = g * g_scale
    lb = 0.05 + 0.9 * torch.rand(H, K, device=DEV)
    h0 = torch.randn(B, H, K, K, device=DEV) if states else None
    xs = [o.to(dtype), g.to(dtype), i.to(dtype), lb, h0]
    return [None if x is None else x.requires_grad_(grad) for x in xs]


def ours(o, g, i, lb, h0=None, final=False):
    from hgrn2.ops.triton.chunk import hgrn2_chunk_triton
    return hgrn2_chunk_triton(o, g, i, lb, scale=o.shape[-1] ** -0.5, o_act="silu", initial_state=h0,
                              output_final_state=final)


def rel(x, ref):
    x, ref = x.detach().double(), ref.detach().double()
    return ((x - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def step_compile(dtype_name, K):
    import torch
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    # H=16 at K=128: N·H = 128 as at B=8 T=2048, so the heuristic picks the block sizes of the benchmark shape
    xs = inputs(8, 64, 16, K, dtype) if K == 128 else inputs(2, 64, 2, K, dtype)
    out = {}
    for run in ("first", "second"):
        t = time.perf_counter()
        y, ht = ours(*xs, final=True)
        sync()
        t_fwd = time.perf_counter()
        (y.float().sum() + ht.sum()).backward()
        sync()
        out[f"{run}_fwd_s"], out[f"{run}_bwd_s"] = t_fwd - t, time.perf_counter() - t_fwd
        print(f"  {run} run: fwd {out[f'{run}_fwd_s']:.2f} s, bwd {out[f'{run}_bwd_s']:.2f} s", flush=True)
    out["finite"] = bool(torch.isfinite(y).all() and all(torch.isfinite(x.grad).all() for x in xs if x is not None))
    out["ok"] = out["finite"]
    return out


def step_reference(dtype_name):
    import torch

    from hgrn2.ops import hgrn2_reference
    dtype, tol = {"fp32": (torch.float32, 1e-4), "bf16": (torch.bfloat16, 2e-2)}[dtype_name]
    xs = inputs(2, 300, 2, 64, dtype)
    refs = [x.detach().double().requires_grad_() for x in xs]
    y, ht = ours(*xs, final=True)
    y_ref, ht_ref = hgrn2_reference(*refs[:4], scale=0.125, o_act="silu", initial_state=refs[4],
                                    output_final_state=True)
    dy, dht = torch.randn_like(y_ref), torch.randn_like(ht_ref)
    ((y.double() * dy).sum() + (ht.double() * dht).sum()).backward()
    ((y_ref * dy).sum() + (ht_ref * dht).sum()).backward()
    errs = {"y": rel(y, y_ref), "ht": rel(ht, ht_ref)}
    errs.update({f"d{n}": rel(x.grad, r.grad) for n, x, r in zip(("o", "g", "i", "lb", "h0"), xs, refs)})
    print("  " + " ".join(f"{k} {v:.1e}" for k, v in errs.items()), flush=True)
    return {"max_err": max(errs.values()), "tol": tol, "ok": max(errs.values()) <= tol, **errs}


def timed(fn, grad_of=None):
    import triton
    return float(triton.testing.do_bench(fn, grad_to_none=grad_of, return_mode="median"))


def fwd_only(fn, *xs):
    def step():
        fn(*xs)
    return step


def fwd_bwd(fn, xs, dy):
    def step():
        fn(*xs)[0].backward(dy)
    return step


def step_bench_ours():
    import torch

    from hgrn2.ops.triton import chunk as chunk_mod
    out = {}
    for B, T in ((8, 2048), (2, 8192)):
        xs = inputs(B, T, 16, 128, torch.bfloat16, states=False)[:4]
        dy = torch.randn_like(xs[2])
        for max_bv in (128, 64):
            chunk_mod.MAX_BV = max_bv
            with torch.no_grad():
                f = timed(fwd_only(ours, *xs))
            fb = timed(fwd_bwd(ours, xs, dy), grad_of=xs[:3])
            out[f"ours BV<={max_bv} B={B} T={T}"] = (f, fb)
            print(f"  ours MAX_BV={max_bv} B={B} T={T}: fwd {f:.3f} ms, fwd+bwd {fb:.3f} ms", flush=True)
        q, k, v = (torch.randn(B, 16, T, 128, device=DEV, dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        with torch.no_grad():
            f = timed(fwd_only(sdpa, q, k, v))
        fb = timed(fwd_bwd(sdpa, (q, k, v), torch.ones_like(q)), grad_of=[q, k, v])
        out[f"sdpa B={B} T={T}"] = (f, fb)
        print(f"  sdpa B={B} T={T}: fwd {f:.3f} ms, fwd+bwd {fb:.3f} ms", flush=True)
    return {"ok": True, "times": out}


def sdpa(q, k, v):
    """Causal flash attention, returned as a 1-tuple like the other implementations."""
    import torch.nn.functional as F
    return (F.scaled_dot_product_attention(q, k, v, is_causal=True),)


def fla_fn(o, g, i, lb, h0=None, final=False):
    """fla's HGRN2Attention glue between the projections and chunk_gla, then chunk_gla."""
    import torch
    import torch.nn.functional as F
    from fla.ops.gla import chunk_gla
    q = F.silu(o)
    lg = F.logsigmoid(g)
    lg = torch.logaddexp(lb.log(), torch.log1p(-lb) + lg)
    k = 1 - lg.exp()
    return chunk_gla(q, k.to(i.dtype), i, lg, scale=o.shape[-1] ** -0.5, initial_state=h0, output_final_state=final,
                     state_v_first=True)


def step_fla():
    import torch
    xs = inputs(8, 2048, 16, 128, torch.bfloat16, states=False)[:4]
    dy = torch.randn_like(xs[2])
    t = time.perf_counter()
    y_fla = fla_fn(*xs)[0]
    g_fla = torch.autograd.grad(y_fla, xs[:3], dy)
    sync()
    print(f"  fla first fwd+bwd (autotune + compile): {time.perf_counter() - t:.1f} s", flush=True)
    y = ours(*xs)[0]
    g_ours = torch.autograd.grad(y, xs[:3], dy)
    errs = {"y": rel(y, y_fla), **{f"d{n}": rel(a, b) for n, a, b in zip("ogi", g_ours, g_fla)}}
    print("  ours vs fla: " + " ".join(f"{k} {v:.1e}" for k, v in errs.items()), flush=True)
    out = {"errs": errs, "ok": max(errs.values()) <= 3e-2, "times": {}}
    for B, T in ((8, 2048), (2, 8192)):
        xs = inputs(B, T, 16, 128, torch.bfloat16, states=False)[:4]
        dy = torch.randn_like(xs[2])
        with torch.no_grad():
            f = timed(fwd_only(fla_fn, *xs))
        fb = timed(fwd_bwd(fla_fn, xs, dy), grad_of=xs[:3])
        out["times"][f"fla B={B} T={T}"] = (f, fb)
        print(f"  fla B={B} T={T}: fwd {f:.3f} ms, fwd+bwd {fb:.3f} ms", flush=True)
    return out


def run_step(name):
    kind, *args = name.split()
    if kind == "compile":
        return step_compile(args[0], int(args[1].split("=")[1]))
    if kind == "reference":
        return step_reference(args[0])
    return {"bench": step_bench_ours, "fla": step_fla}[kind]()


def child(name, limit):
    signal.alarm(limit + 5)  # second line of defence behind the parent's kill
    t = time.perf_counter()
    res = run_step(name)
    res["wall_s"] = time.perf_counter() - t
    print("RESULT " + json.dumps(res), flush=True)


def main():
    start = time.perf_counter()
    results = {}
    for name, limit in STEPS:
        left = TOTAL_S - (time.perf_counter() - start)
        if left < 10:
            results[name] = {"ok": False, "status": "SKIPPED (total budget)"}
            print(f"== {name}: skipped, {left:.0f} s left", flush=True)
            continue
        limit = int(min(limit, left))
        print(f"== {name} (limit {limit} s)", flush=True)
        p = subprocess.Popen([sys.executable, __file__, "--step", name, str(limit)], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            stdout, _ = p.communicate(timeout=limit)
            res = {"ok": False, "status": f"FAILED (exit code {p.returncode})"}
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            stdout, _ = p.communicate()
            res = {"ok": False, "status": f"TIMEOUT after {limit} s"}
        for line in stdout.splitlines():
            if line.startswith("RESULT "):
                res = {**json.loads(line[7:]), "status": "ok"}
            else:
                print(line, flush=True)
        if not res["ok"] and res["status"] == "ok":
            res["status"] = "WRONG"
        results[name] = res
        print(f"   -> {res['status']}{'' if res['ok'] else ' (NOT OK)'} in {res.get('wall_s', float('nan')):.1f} s",
              flush=True)

    print("\n== summary (bf16, H=16, K=V=128; median ms)", flush=True)
    for name, res in results.items():
        extra = f"max err {res['max_err']:.1e}" if "max_err" in res else ""
        print(f"{name:22s} {res['status']:28s} {'ok' if res['ok'] else 'NOT OK':6s} {extra}", flush=True)
    times = {**results["bench ours"].get("times", {}), **results["fla"].get("times", {})}
    print(f"{'impl':26s} {'fwd ms':>8s} {'fwd+bwd ms':>11s}")
    for key, (f, fb) in times.items():
        print(f"{key:26s} {f:8.3f} {fb:11.3f}", flush=True)
    print(f"total {time.perf_counter() - start:.0f} s", flush=True)
    sys.exit(0 if all(r["ok"] for n, r in results.items() if n != "fla") else 1)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--step":
        child(sys.argv[2], int(sys.argv[3]))
    else:
        main()
