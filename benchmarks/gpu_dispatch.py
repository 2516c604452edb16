"""Which HGRN2 training kernel should `hgrn2_triton` dispatch to? The fused-chunk kernels against the
chunk-parallel ones, per shape, on one GPU.

    PYTHONPATH=. python benchmarks/gpu_dispatch.py [--shapes 8x2048x8,4x4096x8,...] [--out F]
    TRITON_INTERPRET=1 PYTHONPATH=. python benchmarks/gpu_dispatch.py --device cpu --shapes 1x64x1 --head-dim 16

Per shape (B × T × H, K = V = 128, bf16, β and silu as in `hgrn2 bench ops`): forward and forward+backward
medians (`triton.testing.do_bench`) of `hgrn2_fused_chunk_triton` ("fused") and `hgrn2_chunk_parallel_triton`
("parallel") with their shipped settings, the two outputs' relative difference, and the kernel `hgrn2_triton` picks
for training (`DispatchConfig`, `takes_chunk_parallel`). The default shapes hold 16K tokens at 16 to 128
sequence·heads.
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
from gpu_fused_chunk_sweep import bench, inputs  # the sweep's timer and inputs (this folder is on sys.path)

from hgrn2.ops import triton as tri

SHAPES = "16x1024x8,8x2048x8,4x4096x8,2x8192x8,8x2048x16,4x4096x16,2x8192x16,1x16384x16"
KERNELS = {"fused": tri.hgrn2_fused_chunk_triton, "parallel": tri.hgrn2_chunk_parallel_triton}


def time_shape(B: int, T: int, H: int, K: int, device) -> dict:
    o, g, i, lb, dy = inputs(B, T, H, K, device)
    picks = "parallel" if tri.takes_chunk_parallel(B, H, B * T, grad=True) else "fused"
    row = {"shape": f"{B}x{T}x{H}", "picks": picks}
    outs = {}
    for name, kernel in KERNELS.items():
        def fwd(kernel=kernel):
            return kernel(o, g, i, lb, scale=K ** -0.5, o_act="silu")[0]

        def fwd_bwd():
            return torch.autograd.grad(fwd(), (o, g, i), dy)

        with torch.no_grad():
            row[f"{name}_fwd_ms"] = bench(fwd, device)
        row[f"{name}_fwdbwd_ms"] = bench(fwd_bwd, device)
        outs[name] = torch.cat([fwd().flatten()] + [t.flatten() for t in fwd_bwd()]).float()
    row["rel_diff"] = ((outs["parallel"] - outs["fused"]).norm() / outs["fused"].norm()).item()
    row["faster"] = min(KERNELS, key=lambda n: row[f"{n}_fwdbwd_ms"])
    return row


def table(rows) -> str:
    lines = ["shape         N*H  fused fwd  par. fwd  fused f+b  par. f+b    faster     picks  rel_diff"]
    for r in rows:
        B, _, H = (int(x) for x in r["shape"].split("x"))
        lines.append(f"{r['shape']:<12} {B * H:>4} {r['fused_fwd_ms']:>10.3f} {r['parallel_fwd_ms']:>9.3f} "
                     f"{r['fused_fwdbwd_ms']:>10.3f} {r['parallel_fwdbwd_ms']:>9.3f} {r['faster']:>9} {r['picks']:>9} "
                     f"{r['rel_diff']:>9.1e}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default=SHAPES, help="comma list of BxTxH")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", default=None, help="write the rows as JSON here")
    args = p.parse_args()
    device = torch.device(args.device)
    name = torch.cuda.get_device_name() if device.type == "cuda" else args.device
    print(f"# {name}  torch {torch.__version__}  triton {triton.__version__}  bf16 K=V={args.head_dim}", flush=True)
    rows = []
    for shape in args.shapes.split(","):
        rows.append(time_shape(*(int(x) for x in shape.split("x")), args.head_dim, device))
        print(json.dumps(rows[-1]), flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(rows, f, indent=1)
    print(table(rows))


if __name__ == "__main__":
    main()
