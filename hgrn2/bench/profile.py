"""`hgrn2 bench profile`: where the time of a layer's forward+backward or of a training step goes.

--target layer   the layers of `hgrn2 bench layer` (ours, fla's HGRN2Attention), one fwd+bwd under torch.profiler:
                 the device time per step of every kernel (CPU: operator), grouped into matmul, recurrence, norm
                 and other, so that the layer's ratio reads as (projections + recurrence + glue) for both.
--target train   the models of `hgrn2 bench train` (same step: bf16 autocast, backward, fused AdamW): wall ms/step
                 and, on CUDA, one traced step's GPU busy and idle time per phase (forward, backward, optimizer) and
                 the idle time spent waiting for a launch (the kernel after the gap was launched after the one
                 before ended), i.e. whether the step is bound by the GPU or by the CPU that launches its kernels.

--target rows    the recurrence rows of `hgrn2 bench gate` named by --rows (e.g. "fast forgetting,closed gates")
                 under torch.profiler: each row's kernels in launch order, µs per step each (a kernel's k-th
                 launch within a step as name#k).

    hgrn2 bench profile --target layer
    hgrn2 bench profile --target train --models hgrn2,fla [--trace-dir DIR]
    hgrn2 bench profile --target rows --rows "fast forgetting,fast forgetting β ≥ 0.01"
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections import defaultdict

import torch

from hgrn2.bench import layer as layer_bench
from hgrn2.bench import train as train_bench
from hgrn2.bench.common import (
    command_of,
    environment,
    fla_available,
    format_table,
    time_ms,
    write_result,
)

GROUPS = (  # first match wins: kernel-name fragments → group (fla's silu kernels, swish_*, are "other")
    ("matmul", ("gemm", "sm90_xmma", "cutlass", "nvjet", "splitk", "ampere", "matmul", "aten::mm", "aten::addmm")),
    ("norm", ("norm",)),
    ("recurrence", ("cp_", "chunk", "gla", "hgrn", "recurrent")),
)
PHASES = ("forward", "backward", "optimizer")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    train_bench.add_arguments(parser)  # the model of `bench train` (--models, --hidden, ..., --quick, --out)
    parser.set_defaults(shapes="8x2048", models="hgrn2,fla")
    parser.add_argument("--target", choices=("layer", "train", "rows"), default="layer")
    parser.add_argument("--rows", default=None, help="--target rows: the gate's rows, comma-separated (default: all "
                                                     "of the recurrence)")
    parser.add_argument("--shape", default=None, help="BATCHxSEQ (default: 8x2048; --quick: 1x64)")
    parser.add_argument("--layer-hidden", type=int, default=2048, help="--target layer: the layer's width")
    parser.add_argument("--profiled-steps", type=int, default=5, help="steps under the profiler (tables per step)")
    parser.add_argument("--trace-dir", default=None, help="--target train: keep each model's Chrome trace here")


def group_of(name: str) -> str:
    low = name.lower()
    return next((g for g, keys in GROUPS if any(k in low for k in keys)), "other")


def kernel_table(step, steps: int, cuda: bool) -> list[tuple[str, float, int]]:
    """[(kernel name, µs per step, calls per step)] of `step`'s CUDA kernels (CPU: operators' self time), the
    costliest first."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
        if cuda:
            torch.cuda.synchronize()
    us, calls = defaultdict(float), defaultdict(int)
    if cuda:
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                us[e.name] += e.device_time / steps
                calls[e.name] += 1
    else:
        for e in prof.key_averages():
            us[e.key] += e.self_cpu_time_total / steps
            calls[e.key] += e.count
    return sorted(((n, us[n], calls[n] // steps) for n in us), key=lambda r: -r[1])


def kernel_sequence(step, steps: int) -> list[tuple[str, float]]:
    """[(kernel, µs)] of one CUDA `step` in launch order, each averaged over `steps` profiled steps; a name that
    recurs within a step gets its occurrence, name#k."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    events = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                    key=lambda e: e.time_range.start)
    return launch_order([(e.name, e.device_time) for e in events], steps)


def launch_order(kernels: list[tuple[str, float]], steps: int) -> list[tuple[str, float]]:
    """`kernels` [(name, µs)] of `steps` equal steps in launch order → one step's [(label, mean µs)], a name's
    k-th launch within a step labelled name#k (k > 1)."""
    per_step = len(kernels) // steps
    out: dict[str, float] = {}
    for k in range(steps):
        seen: dict[str, int] = defaultdict(int)
        for name, us in kernels[k * per_step:(k + 1) * per_step]:
            seen[name] += 1
            label = name if seen[name] == 1 else f"{name}#{seen[name]}"
            out[label] = out.get(label, 0.0) + us / steps
    return list(out.items())


def profile_rows(args, device) -> list[dict]:
    """The gate's recurrence rows (`hgrn2.bench.gate.rows_spec`): each one's timed ms and, on CUDA, its kernels in
    launch order (on a CPU, its operators' self time)."""
    import hgrn2.ops as ops
    from hgrn2.bench import gate

    cuda = device.type == "cuda"
    spec = gate.select_rows(gate.rows_spec(args.quick, device, torch.bfloat16 if cuda else torch.float32), args.rows)
    spec = [s for s in spec if "inputs" in s]  # the recurrence's rows (not the layer or cross entropy)
    if not spec:
        raise ValueError("--rows: names no row of the recurrence")
    rows = []
    for s in spec:
        inputs = s["inputs"]
        step = gate.op_call(ops, inputs, torch.randn_like(inputs[2]), grad=s["grad"], **s.get("kw", {}))
        ms = time_ms(step, device=device, inputs=inputs, warmup=2 if args.quick else 20, rep=3 if args.quick else 100)
        table = (kernel_sequence(step, args.profiled_steps) if cuda
                 else [(n, us) for n, us, _ in kernel_table(step, args.profiled_steps, cuda)])
        rows += [{"row": s["name"], "kernel": name, "us_per_step": us} for name, us in table]
        rows.append({"row": s["name"], "kernel": "(timed)", "us_per_step": 1e3 * ms})
    return rows


def profile_layers(args, device) -> list[dict]:
    cuda = device.type == "cuda"
    B, T = _shape(args)
    d, expand = (64, 32) if args.quick else (args.layer_hidden, args.expand)
    dtype = torch.bfloat16 if cuda else torch.float32
    with_fla = cuda and fla_available()
    if not with_fla:
        print("skipped: fla's HGRN2Attention: needs CUDA and flash-linear-attention", flush=True)
    x, dy, lb = layer_bench.step_inputs(B, T, d, device, dtype)
    rows = []
    for name, layer in layer_bench.layers(d, expand, device, dtype, None if cuda else "chunk", with_fla).items():
        def step(layer=layer):
            layer(x, lower_bound=lb)[0].backward(dy)
            x.grad = None

        ms = time_ms(step, device=device, inputs=[x, lb], warmup=5 if args.quick else 50, rep=20 if args.quick else 300)
        table = kernel_table(step, args.profiled_steps, cuda)
        by_group = defaultdict(float)
        for kernel, us, n in table:
            by_group[group_of(kernel)] += us
            print(f"  {name:5s} {us:9.1f} us  x{n:<3d} [{group_of(kernel):10s}] {kernel[:100]}")
        rows += [{"model": name, "part": g, "us_per_step": by_group[g]} for g in sorted(by_group, key=by_group.get,
                                                                                          reverse=True)]
        rows.append({"model": name, "part": "fwd+bwd (timed)", "us_per_step": 1e3 * ms})
    return rows


def phased_step(model, opt, x) -> None:
    from torch.profiler import record_function

    with record_function("forward"), torch.autocast(x.device.type, dtype=torch.bfloat16):
        loss = model(input_ids=x, labels=x, use_cache=False).loss
    with record_function("backward"):
        loss.backward()
    with record_function("optimizer"):
        opt.step()
        opt.zero_grad(set_to_none=True)


def trace_summary(path: str) -> tuple[dict, float]:
    """GPU busy / idle / launch-starved µs of one traced step per phase, and its GPU span, from a Chrome trace."""
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
    end = None
    for e in gpu:
        t_launch = launch.get(e.get("args", {}).get("correlation"))
        phase = next((name for name, a, b in phases if t_launch is not None and a <= t_launch <= b), "other")
        row = out[phase]
        row["kernels"] += 1
        start, stop = e["ts"], e["ts"] + e["dur"]
        if end is not None and start > end:
            row["idle_us"] += start - end
            if t_launch is not None and t_launch > end:  # the GPU waited for this launch
                row["starved_us"] += start - end
        row["busy_us"] += max(0.0, stop - max(start, end or start))
        end = stop if end is None else max(end, stop)
    span = (gpu[-1]["ts"] + gpu[-1]["dur"] - gpu[0]["ts"]) if gpu else 0.0
    return out, span


def profile_train(args, device) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    x_shape = _shape(args)
    if not cuda:
        print("skipped: the GPU's busy and idle time per phase: needs CUDA", flush=True)
    rows = []
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        if name == "fla" and not fla_available():
            print("skipped: fla: needs CUDA and flash-linear-attention", flush=True)
            continue
        model = train_bench.build(name, args).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=cuda)
        gen = torch.Generator().manual_seed(args.seed)
        x = torch.randint(0, args.vocab, x_shape, generator=gen).to(device)
        for _ in range(args.warmup):
            train_bench.train_step(model, opt, x)
        walls = []
        for _ in range(args.rounds):
            _sync(cuda)
            t0 = time.perf_counter()
            for _ in range(args.steps):
                train_bench.train_step(model, opt, x)
            _sync(cuda)
            walls.append(1e3 * (time.perf_counter() - t0) / args.steps)
        rows.append({"model": name, "part": "wall ms/step", "ms": statistics.median(walls)})
        if cuda:
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                phased_step(model, opt, x)
                torch.cuda.synchronize()
            folder = args.trace_dir or tempfile.mkdtemp()
            os.makedirs(folder, exist_ok=True)
            trace = os.path.join(folder, f"trace_{name}.json")
            prof.export_chrome_trace(trace)
            phases, span = trace_summary(trace)
            if not args.trace_dir:
                os.remove(trace)
            rows.append({"model": name, "part": "GPU span of one step", "ms": span / 1e3})
            rows += [{"model": name, "part": p, "kernels": r["kernels"], "busy_ms": r["busy_us"] / 1e3,
                      "idle_ms": r["idle_us"] / 1e3, "starved_ms": r["starved_us"] / 1e3} for p, r in phases.items()]
        del model, opt
        if cuda:
            torch.cuda.empty_cache()
    return rows


def _sync(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


def _shape(args) -> tuple[int, int]:
    shape = args.shape or ("1x64" if args.quick else "8x2048")
    try:
        B, T = (int(v) for v in shape.split("x"))
    except ValueError:
        raise ValueError(f"--shape: expected BATCHxSEQ, got {shape!r}") from None
    return B, T


def run(args: argparse.Namespace) -> int:
    if args.quick:
        args.hidden, args.layers, args.expand, args.intermediate, args.vocab = 64, 2, 16, 128, 256
        args.warmup, args.steps, args.rounds, args.profiled_steps = 1, 2, 1, 1
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rows = {"layer": profile_layers, "train": profile_train, "rows": profile_rows}[args.target](args, device)
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "command_line")}
    path = write_result(args.out, f"profile_{args.target}", environment(device), rows, command_of(args),
                        quick=args.quick, args=settings)
    print(f"wrote {path}")
    if args.target == "layer":
        print(format_table(rows, [("model", "model", ""), ("part", "part", ""), ("µs per step", "us_per_step", ".1f")]))
    elif args.target == "rows":
        print(format_table(rows, [("row", "row", ""), ("kernel", "kernel", ""), ("µs per step", "us_per_step", ".1f")]))
    else:
        print(format_table(rows, [("model", "model", ""), ("part", "part", ""), ("ms", "ms", ".2f"),
                                  ("kernels", "kernels", "d"), ("busy ms", "busy_ms", ".2f"),
                                  ("idle ms", "idle_ms", ".2f"), ("starved ms", "starved_ms", ".2f")]))
    return 0
