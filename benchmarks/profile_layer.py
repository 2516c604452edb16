"""Where the HGRU2 layer's forward+backward time goes: ours against fla's `HGRN2Attention`, kernel by kernel.

    python benchmarks/profile_layer.py                      (B8 T2048 d2048, bf16, as `hgrn2 bench ops`'s layer row)
    python benchmarks/profile_layer.py --shape 8x2048 --steps 10

Prints do_bench medians of each layer's fwd+bwd, then per layer the GPU time per step of every kernel
(torch.profiler), grouped into matmuls, the recurrence, the norm and the rest, so that the layer ratio can be
read as (projections + recurrence + glue) for both. Inputs as `hgrn2 bench ops`: x ~ N(0, 1), β ~ U(0, 0.9).
"""

import argparse
from collections import defaultdict

import torch
import triton

from hgrn2.layers.hgru2 import HGRU2

GROUPS = (  # first match wins: kernel-name fragments → group
    ("matmul", ("gemm", "sm90_xmma", "cutlass", "nvjet", "splitk", "ampere", "matmul")),
    ("norm", ("norm",)),
    ("recurrence", ("cp_", "chunk", "gla")),  # fla's recurrence kernels all say chunk_ (its silu: other)
)


def group_of(name: str) -> str:
    low = name.lower()
    return next((g for g, keys in GROUPS if any(k in low for k in keys)), "other")


def kernel_table(step, steps: int) -> list[tuple[str, float, int]]:
    """[(kernel name, µs per step, calls per step)] of `step`'s CUDA kernels, the costliest first."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    us, calls = defaultdict(float), defaultdict(int)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            us[e.name] += e.device_time / steps
            calls[e.name] += 1
    return sorted(((n, us[n], calls[n] // steps) for n in us), key=lambda r: -r[1])


def report(label: str, ms: float, table) -> None:
    print(f"\n== {label}: fwd+bwd {ms:.4f} ms (do_bench median); GPU kernels per step:")
    by_group = defaultdict(float)
    for name, us, n in table:
        by_group[group_of(name)] += us
        print(f"  {us:9.1f} us  x{n:<3d} [{group_of(name):10s}] {name[:110]}")
    total = sum(by_group.values())
    print("  -- by group (us): " + ", ".join(f"{g} {v:.1f}" for g, v in sorted(by_group.items(), key=lambda x: -x[1]))
          + f"; sum {total:.1f}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="8x2048", help="BxT")
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--steps", type=int, default=10, help="profiled steps (the table is per step)")
    a = p.parse_args()
    B, T = map(int, a.shape.split("x"))
    d, dev, dt = a.hidden, "cuda", torch.bfloat16
    torch.manual_seed(1)
    x = torch.randn(B, T, d, device=dev, dtype=dt, requires_grad=True)
    dy = torch.randn_like(x)
    lb = torch.rand(d, device=dev) * 0.9
    layers = {"ours": HGRU2(d, layer_idx=1, expand_ratio=128).to(dev, dt)}
    try:
        from fla.layers.hgrn2 import HGRN2Attention
        layers["fla"] = HGRN2Attention(hidden_size=d, expand_ratio=128, layer_idx=1).to(dev, dt)
    except ImportError as e:
        print(f"fla not importable ({e}): ours only")
    for label, layer in layers.items():
        def step(layer=layer):
            layer(x, lower_bound=lb)[0].backward(dy)
            x.grad = None
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        ms = triton.testing.do_bench(step, warmup=50, rep=300)
        report(label, ms, kernel_table(step, a.steps))


if __name__ == "__main__":
    main()
