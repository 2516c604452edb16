"""Where an MQAR training step spends its time (steps/s and a torch.profiler table), one run alone on the device.

    PYTHONPATH=. python benchmarks/profile_mqar_step.py [--mixer hgrn2] [--d 128] [--L 512] [--batch 128] [--compile]

Random MQAR-shaped batches (the data pipeline is not timed): token ids, 64 query positions per row. `--compile`
compiles each block (as `hgrn2 train` does): whether a step of these small models is launch-bound.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from hgrn2.models.zoology import ZoologyLM


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mixer", default="hgrn2")
    p.add_argument("--d", type=int, default=128)
    p.add_argument("--L", type=int, default=512)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--queries", type=int, default=64)
    p.add_argument("--device", default="cuda")
    p.add_argument("--compile", action="store_true", help="torch.compile each block")
    p.add_argument("--steps", type=int, default=50, help="timed steps (after 10 warm-up steps)")
    args = p.parse_args()
    dev = torch.device(args.device)
    options = dict(expand_ratio=min(args.d, 128), o_act="sigmoid", i_act="silu", scale=1.0, norm="layernorm",
                   bias=True) if args.mixer == "hgrn2" else {}
    model = ZoologyLM(args.mixer, args.d, max_position_embeddings=args.L if args.mixer == "attention" else 0,
                      mixer_options=options).to(dev)
    if args.compile:
        for block in model.blocks:
            block.compile()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1, fused=dev.type == "cuda")
    ids = torch.randint(1, 8192, (args.batch, args.L), device=dev, dtype=torch.int32)
    pos = torch.sort(torch.rand(args.batch, args.L, device=dev).argsort(-1)[:, : args.queries], -1).values
    tgt = torch.randint(4096, 8192, (args.batch, args.queries), device=dev)

    def step():
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            logits = model(ids, pos)
            loss = F.cross_entropy(logits.flatten(0, 1).float(), tgt.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(10):
        step()
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    n = args.steps
    for _ in range(n):
        step()
    sync()
    dt = (time.perf_counter() - t0) / n
    print(f"{args.mixer} d={args.d} L={args.L} B={args.batch}{' compiled' if args.compile else ''}: "
          f"{dt * 1e3:.2f} ms/step ({1 / dt:.0f} steps/s)")
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(5):
            step()
        sync()
    key = "cuda_time_total" if dev.type == "cuda" else "cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=18, max_name_column_width=60))


if __name__ == "__main__":
    main()
