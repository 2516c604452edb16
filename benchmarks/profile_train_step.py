"""Is a training step of `hgrn2 bench train`'s model bound by the GPU or by the CPU that launches its kernels?

    PYTHONPATH=. python benchmarks/profile_train_step.py --models hgrn2,fla --dir DIR

Per model (the ~370M models of `hgrn2 bench train`, the same step: bf16 autocast, backward, fused AdamW):
1. wall ms/step at --shape (default 8x2048) after warm-up, the median of --rounds rounds of --steps steps;
2. one step under torch.profiler: the GPU's busy time (union of kernel intervals), its idle time between the
   first and last kernel, split by phase (forward / backward / optimizer, by where each kernel was launched), and
   the idle time spent waiting for a launch (the kernel after the gap was launched after the one before ended);
   the Chrome trace goes to DIR;
3. ms/step at a tiny shape (--tiny, default 1x64), whose GPU work is negligible: the CPU's cost of issuing one
   step (for ours the chunk-parallel kernels are forced on, as at the large shape);
4. cProfile of those tiny steps: the Python functions costing the most CPU, in DIR.
`--label-check-ab` also times our model without its cross entropy's label check and the host sync it makes.
"""

from __future__ import annotations

import argparse
import cProfile
import gzip
import io
import json
import os
import pstats
import time

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from hgrn2.bench.train import add_arguments, build, train_step

PHASES = ("forward", "backward", "optimizer")


def tokens(shape, vocab, device):
    b, t = shape
    gen = torch.Generator().manual_seed(0)
    return torch.randint(0, vocab, (b, t), generator=gen).to(device)


def wall_ms(model, opt, x, warmup, steps, rounds, label_check_ab=False):
    """Median ms/step over `rounds` rounds of `steps` steps; with label_check_ab, also without our cross entropy's
    label check, the rounds alternating between the two: {variant: ms}."""
    import statistics

    import hgrn2.ops.cross_entropy as ce

    for _ in range(warmup):
        train_step(model, opt, x)
    checks = {"": ce.check_labels}
    if label_check_ab:
        checks["no label check"] = lambda *a: None
    times = {name: [] for name in checks}
    for _ in range(rounds):
        for name, check in checks.items():
            ce.check_labels = check
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(steps):
                train_step(model, opt, x)
            torch.cuda.synchronize()
            times[name].append(1e3 * (time.perf_counter() - t0) / steps)
    ce.check_labels = checks[""]
    return {name: statistics.median(t) for name, t in times.items()}


def phased_step(model, opt, x):
    with record_function("forward"), torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(input_ids=x, labels=x, use_cache=False).loss
    with record_function("backward"):
        loss.backward()
    with record_function("optimizer"):
        opt.step()
        opt.zero_grad(set_to_none=True)


def trace_summary(path):
    """GPU busy / idle time of one traced step, per phase, from the Chrome trace at path."""
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    phases = [(e["name"], e["ts"], e["ts"] + e["dur"]) for e in events
              if e.get("ph") == "X" and e.get("name") in PHASES and e.get("cat") == "user_annotation"]
    # Triton and cuBLAS launch through the driver API, PyTorch's own kernels through the runtime API
    launch = {e["args"]["correlation"]: e["ts"] for e in events
              if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    gpu = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")),
                 key=lambda e: e["ts"])
    out = {p: dict(kernels=0, busy_us=0.0, idle_us=0.0, starved_us=0.0) for p in (*PHASES, "other")}
    gaps, end = [], None
    for e in gpu:
        t_launch = launch.get(e.get("args", {}).get("correlation"))
        phase = next((name for name, a, b in phases if t_launch is not None and a <= t_launch <= b), "other")
        row = out[phase]
        row["kernels"] += 1
        start, stop = e["ts"], e["ts"] + e["dur"]
        if end is not None and start > end:
            gap = start - end
            row["idle_us"] += gap
            if t_launch is not None and t_launch > end:  # the GPU waited for this launch
                row["starved_us"] += gap
                gaps.append((gap, phase, e["name"][:70]))
        row["busy_us"] += max(0.0, stop - max(start, end or start))
        end = stop if end is None else max(end, stop)
    span = (gpu[-1]["ts"] + gpu[-1]["dur"] - gpu[0]["ts"]) if gpu else 0.0
    return out, span, sorted(gaps, reverse=True)[:15]


def report_trace(name, out, span, gaps):
    lines = [f"{name}: traced step, GPU span {span / 1e3:.1f} ms",
             f"  {'phase':<10} {'kernels':>8} {'busy ms':>9} {'idle ms':>9} {'starved ms':>11}"]
    for p, r in out.items():
        lines.append(f"  {p:<10} {r['kernels']:>8} {r['busy_us'] / 1e3:>9.2f} {r['idle_us'] / 1e3:>9.2f} "
                     f"{r['starved_us'] / 1e3:>11.2f}")
    lines.append("  largest gaps waiting for a launch (us, phase, next kernel):")
    lines += [f"    {g:8.1f}  {p:<9} {k}" for g, p, k in gaps]
    return "\n".join(lines)


def cpu_profile(model, opt, x, steps, path):
    for _ in range(3):
        train_step(model, opt, x)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        train_step(model, opt, x)
    torch.cuda.synchronize()
    ms = 1e3 * (time.perf_counter() - t0) / steps
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        train_step(model, opt, x)
    torch.cuda.synchronize()
    prof.disable()
    s = io.StringIO()
    stats = pstats.Stats(prof, stream=s)
    stats.sort_stats("tottime").print_stats(45)
    stats.sort_stats("cumulative").print_stats(60)
    with open(path, "w") as f:
        f.write(f"{steps} steps, per-call times below are totals over them\n{s.getvalue()}")
    return ms


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_arguments(parser)
    parser.add_argument("--shape", default="8x2048")
    parser.add_argument("--tiny", default="1x64")
    parser.add_argument("--dir", default="profile_train")
    parser.add_argument("--label-check-ab", action="store_true",
                        help="also time our model without its cross entropy's label check (a host sync), the "
                             "rounds alternating")
    args = parser.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    dev = torch.device("cuda")
    shape = tuple(int(v) for v in args.shape.split("x"))
    tiny = tuple(int(v) for v in args.tiny.split("x"))
    table = []
    for name in args.models.split(","):
        model = build(name, args).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=True)
        x = tokens(shape, args.vocab, dev)
        walls = wall_ms(model, opt, x, args.warmup, args.steps, args.rounds, args.label_check_ab and name == "hgrn2")
        wall = walls[""]
        for variant, ms in walls.items():
            if variant:
                print(f"{name} {variant}: {ms:.1f} ms/step (with it: {wall:.1f})", flush=True)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            phased_step(model, opt, x)
            torch.cuda.synchronize()
        trace = os.path.join(args.dir, f"trace_{name}.json")
        prof.export_chrome_trace(trace)
        out, span, gaps = trace_summary(trace)
        print(report_trace(name, out, span, gaps), flush=True)
        with open(trace, "rb") as f, gzip.open(trace + ".gz", "wb") as g:
            g.write(f.read())
        os.remove(trace)
        from hgrn2.ops.triton import DispatchConfig, launch_config
        xt = tokens(tiny, args.vocab, dev)
        # the kernels of the large shape (chunk-parallel) on the tiny one too
        with launch_config(dispatch=DispatchConfig(parallel_train_min_work=0)):
            cpu = cpu_profile(model, opt, xt, 20, os.path.join(args.dir, f"cprofile_{name}.txt"))
        busy = sum(r["busy_us"] for r in out.values()) / 1e3
        table.append((name, wall, busy, span / 1e3, cpu))
        del model, opt
        torch.cuda.empty_cache()
    print(f"\n{'model':<8} {'wall ms':>8} {'GPU busy':>9} {'GPU span':>9} {'tiny-step ms (CPU)':>19}")
    for name, wall, busy, span, cpu in table:
        print(f"{name:<8} {wall:>8.1f} {busy:>9.1f} {span:>9.1f} {cpu:>19.1f}")


if __name__ == "__main__":
    main()
