"""The LRA models' small-head HGRN2 mixer: HGRN1's element-wise scan on the expanded state (the old path) against
the fused small-heads kernel (`hgrn2/ops/triton/small_heads.py`), on one GPU.

    PYTHONPATH=. python benchmarks/gpu_small_heads.py [--shape 256x2000x16x4] [--configs 0:0:0,16:64:1,...]
    TRITON_INTERPRET=1 PYTHONPATH=. python benchmarks/gpu_small_heads.py --device cpu --shape 2x8x2x4 --configs 0:0:0

Shape B × T × H × K (V = K), bf16 inputs, an fp32 lower bound with its gradient, sigmoid output gate, both scan
directions summed as the bidirectional LRA mixer runs them, and the forward direction alone. Per row: forward and
forward+backward medians (`hgrn2.bench.common.time_ms`: CUDA events, warm-up, median), and the largest relative
difference to the old path over y and the gradients of o, g, i, β. `--block-heads` sweeps the heads per program
of the fused kernel (0: its default). The rows go to `small_heads.json` (`--out`; default
benchmarks/results/<device>/).
"""

from __future__ import annotations

import argparse

import torch

from hgrn2.bench.common import add_output_argument, command_of, environment, rel_err, time_ms, write_result
from hgrn2.ops import hgrn1
from hgrn2.ops.small_heads import hgrn2_elementwise
from hgrn2.ops.triton.small_heads import hgrn2_small_heads_triton


def make_inputs(B: int, T: int, H: int, K: int, device: str):
    o, g, i = (torch.randn(B, T, H, K, device=device, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    lb = (torch.rand(H, K, device=device) * 0.9).requires_grad_()
    return o, g, i, lb, torch.randn(B, T, H, K, device=device, dtype=torch.bfloat16)


def paths(configs: list[tuple[int, int, int]]) -> dict:
    out = {"old": lambda *a, **kw: hgrn2_elementwise(hgrn1, *a, backend="triton", **kw)}
    for bh, chunk, warps in configs:
        out[f"fused {bh}:{chunk}:{warps}"] = lambda *a, bh=bh, chunk=chunk, warps=warps, **kw: (
            hgrn2_small_heads_triton(*a, block_heads=bh, chunk_size=chunk, num_warps=warps, **kw))
    return out


def run(shape: tuple[int, ...], configs: list[tuple[int, int, int]], device: str) -> list[dict]:
    B, T, H, K = shape
    o, g, i, lb, dy = make_inputs(B, T, H, K, device)
    leaves = (o, g, i, lb)
    print(f"B={B} T={T} H={H} K=V={K} bf16, sigmoid output gate, fp32 lower bound with gradient")
    print(f"{'dirs':<6} {'path':<16} {'fwd ms':>9} {'fwd+bwd ms':>11} {'rel diff':>9}")
    rows = []
    for bidirectional in (True, False):
        ref = None
        for name, fn in paths(configs).items():
            def fwd(fn=fn, bidirectional=bidirectional):
                return fn(o, g, i, lb, o_act="sigmoid", bidirectional=bidirectional)

            def fwd_bwd(fwd=fwd):
                return torch.autograd.grad(fwd(), leaves, dy)

            with torch.no_grad():
                t_f = time_ms(fwd, device=device, inputs=[o, g, i])
            t_fb = time_ms(fwd_bwd, device=device, inputs=[o, g, i])
            got = (fwd(), *fwd_bwd())
            ref = ref or got
            diff = max(rel_err(a, b) for a, b in zip(got, ref))
            print(f"{'both' if bidirectional else 'fwd':<6} {name:<16} {t_f:>9.3f} {t_fb:>11.3f} {diff:>9.1e}")
            rows.append({"directions": "both" if bidirectional else "forward", "path": name, "fwd_ms": t_f,
                         "fwd_bwd_ms": t_fb, "max_rel_diff": diff})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="256x2000x16x4", help="BxTxHxK (V = K)")
    p.add_argument("--configs", default="0:0:0,16:0:4,16:0:2,16:64:1,16:250:1,16:2000:1,4:0:1,4:125:1,1:0:1,1:2000:1",
                   help="the fused kernel's BLOCK_HEADS:CHUNK:WARPS launches to time (0: its choice)")
    p.add_argument("--device", default="cuda")
    add_output_argument(p)
    a = p.parse_args()
    configs = [tuple(int(v) for v in c.split(":")) for c in a.configs.split(",")]
    rows = run(tuple(int(x) for x in a.shape.split("x")), configs, a.device)
    path = write_result(a.out, "small_heads", environment(a.device), rows, command_of(a), shape=a.shape,
                        quick=a.device == "cpu")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
