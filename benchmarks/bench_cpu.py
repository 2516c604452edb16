"""CPU benchmark: the torch chunkwise HGRN2 against the step-loop reference (issue: expect well over 10×).

    python benchmarks/bench_cpu.py [--T 2048] [--out results.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import time

import torch

from hgrn2.ops import hgrn2


def median_time(fn, reps: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def _step(xs, beta, K, backend, grad):
    y, _ = hgrn2(*xs, beta, o_act="silu", scale=K**-0.5, backend=backend)
    if grad:
        y.sum().backward()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--B", type=int, default=1)
    p.add_argument("--T", type=int, default=2048)
    p.add_argument("--H", type=int, default=4)
    p.add_argument("--K", type=int, default=128)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    torch.manual_seed(0)
    o, g = torch.randn(2, a.B, a.T, a.H, a.K).unbind(0)
    i = torch.randn(a.B, a.T, a.H, a.K)
    beta = torch.rand(a.H, a.K) * 0.9
    rows = []
    for mode in ("forward", "forward+backward"):
        grad = mode != "forward"
        xs = [x.clone().requires_grad_(grad) for x in (o, g, i)]
        res = {}
        for backend in ("reference", "chunk"):
            with torch.set_grad_enabled(grad):
                res[backend] = median_time(functools.partial(_step, xs, beta, a.K, backend, grad), a.reps)
        rows.append({"mode": mode, **{f"{k}_s": v for k, v in res.items()}, "speedup": res["reference"] / res["chunk"]})
    meta = {"torch": torch.__version__, "threads": torch.get_num_threads(), "cpu": platform.processor() or
            platform.machine(), "shape": dict(B=a.B, T=a.T, H=a.H, K=a.K, V=a.K), "date": time.strftime("%Y-%m-%d")}
    print(f"HGRN2 on CPU, B={a.B} T={a.T} H={a.H} K=V={a.K} fp32, torch {torch.__version__}, "
          f"{meta['threads']} threads")
    print(f"{'mode':<18}{'reference (s)':>15}{'chunk (s)':>12}{'speed-up':>10}")
    for r in rows:
        print(f"{r['mode']:<18}{r['reference_s']:>15.3f}{r['chunk_s']:>12.3f}{r['speedup']:>9.1f}×")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
