"""Is an MQAR training step bound by the GPU's work or by launching its kernels? Steps/s and a torch.profiler table
of one run alone on the device.

    PYTHONPATH=. python benchmarks/profile_mqar_step.py [--mixer hgrn2] [--d 128] [--L 512] [--batch 128]
        [--compile | --cuda-graph]

Random MQAR-shaped batches (the data pipeline is not timed): token ids, 64 query positions per row. The last
line before the table compares the GPU's kernel time per step with the wall time: a step of these small
models may be bound by launching its ~hundreds of kernels rather than by running them. `--compile` compiles
each block (as `hgrn2 train` does; fewer, fused kernels); `--cuda-graph` captures the whole step (forward,
backward, AdamW) as one CUDA graph and replays it (`hgrn2.train.graphed`, as `hgrn2 mqar --cuda-graph` trains:
no launch cost at all, the bound for the other two).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from hgrn2.models.zoology import ZoologyLM
from hgrn2.train.graphed import GraphedStep


def build(args, dev):
    """The step to time: a callable that runs one training step on a fixed random MQAR-shaped batch."""
    options = dict(expand_ratio=min(args.d, 128), o_act="sigmoid", i_act="silu", scale=1.0, norm="layernorm",
                   bias=True) if args.mixer == "hgrn2" else {}
    model = ZoologyLM(args.mixer, args.d, max_position_embeddings=args.L if args.mixer == "attention" else 0,
                      mixer_options=options).to(dev)
    if args.compile:
        for block in model.blocks:
            block.compile()
    cuda = dev.type == "cuda"
    lr = torch.tensor(1e-3, device=dev) if args.cuda_graph else 1e-3
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1, fused=cuda, capturable=args.cuda_graph)
    ids = torch.randint(1, 8192, (args.batch, args.L), device=dev, dtype=torch.int32)
    pos = torch.sort(torch.rand(args.batch, args.L, device=dev).argsort(-1)[:, : args.queries], -1).values
    tgt = torch.randint(4096, 8192, (args.batch, args.queries), device=dev)

    def compute_loss(ids, pos, tgt):
        # autocast's weight cache must be off while a graph is captured
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=cuda, cache_enabled=not args.cuda_graph):
            return F.cross_entropy(model(ids, pos).flatten(0, 1).float(), tgt.flatten())

    if args.cuda_graph:  # as `hgrn2 mqar --cuda-graph` trains
        graphed = GraphedStep(compute_loss, opt, pad_values=(0, 0, -100))
        return lambda: graphed(ids, pos, tgt)

    def step():
        opt.zero_grad(set_to_none=True)
        compute_loss(ids, pos, tgt).backward()
        opt.step()

    return step


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mixer", default="hgrn2")
    p.add_argument("--d", type=int, default=128)
    p.add_argument("--L", type=int, default=512)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--queries", type=int, default=64)
    p.add_argument("--device", default="cuda")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--compile", action="store_true", help="torch.compile each block")
    mode.add_argument("--cuda-graph", action="store_true", help="replay the whole step as one CUDA graph")
    p.add_argument("--steps", type=int, default=50, help="timed steps (after 10 warm-up steps)")
    args = p.parse_args()
    dev = torch.device(args.device)
    if args.cuda_graph and dev.type != "cuda":
        p.error("--cuda-graph needs --device cuda")
    step = build(args, dev)
    for _ in range(10):
        step()
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    sync()
    dt = (time.perf_counter() - t0) / args.steps
    how = " compiled" if args.compile else " CUDA graph" if args.cuda_graph else ""
    print(f"{args.mixer} d={args.d} L={args.L} B={args.batch}{how}: {dt * 1e3:.2f} ms/step ({1 / dt:.0f} steps/s)")
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    n_prof = 5
    with profile(activities=acts) as prof:
        for _ in range(n_prof):
            step()
        sync()
    events = prof.key_averages()
    if dev.type == "cuda":
        # kernels only: the operators that launch them carry the same time as their own "self" device time
        busy = sum(e.self_device_time_total for e in events if e.device_type == DeviceType.CUDA) / n_prof / 1e3
        cpu = sum(e.self_cpu_time_total for e in events) / n_prof / 1e3
        print(f"GPU kernel time {busy:.2f} ms/step, CPU time {cpu:.2f} ms/step (under the profiler) of "
              f"{dt * 1e3:.2f} ms wall ({100 * busy / (dt * 1e3):.0f}% busy)")
    key = "cuda_time_total" if dev.type == "cuda" else "cpu_time_total"
    print(events.table(sort_by=key, row_limit=18, max_name_column_width=60))


if __name__ == "__main__":
    main()
