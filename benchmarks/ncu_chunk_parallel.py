"""Where does the chunk-parallel op's fwd+bwd spend its time? Timings, a per-kernel profile, or one range for
Nsight Compute, with any `ChunkParallelConfig` field overridden for A/B runs.

    python benchmarks/ncu_chunk_parallel.py --time --profile      (medians by do_bench; torch.profiler table)
    python benchmarks/ncu_chunk_parallel.py --time --set block_k_seq=32 --set maxnreg_seq=128
    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \
        --section WarpStateStats --section LaunchStats python benchmarks/ncu_chunk_parallel.py

Inputs as `hgrn2 bench ops` (bf16, β ~ U(0, 0.9), silu output gate): B·T tokens, H heads, K = V = 128. Gradients
of the leaves are reset to None between timed calls (do_bench's grad_to_none), so the timings hold the op, not
autograd's accumulation into .grad. Without --time / --profile: two warm-up calls, then one fwd+bwd between
cudaProfilerStart/Stop, which ncu captures.
"""

import argparse
import dataclasses

import torch

from hgrn2.ops.triton import hgrn2_chunk_parallel_triton
from hgrn2.ops.triton.config import ChunkParallelConfig


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="8x2048", help="BxT")
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--time", action="store_true", help="do_bench medians of fwd and fwd+bwd")
    p.add_argument("--profile", action="store_true", help="per-kernel GPU time under torch.profiler")
    p.add_argument("--set", action="append", default=[], help="ChunkParallelConfig field=value (int or None)")
    a = p.parse_args()
    fields = {k: None if v == "None" else int(v) for k, v in (kv.split("=") for kv in a.set)}
    cfg = dataclasses.replace(ChunkParallelConfig(), **fields)
    B, T = map(int, a.shape.split("x"))
    torch.manual_seed(1)
    o, g, i = (torch.randn(B, T, a.heads, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    lb = (0.9 * torch.rand(a.heads, 128, device="cuda")).requires_grad_()
    dy = torch.randn_like(o)

    def fwd():
        return hgrn2_chunk_parallel_triton(o, g, i, lb, scale=128 ** -0.5, o_act="silu", config=cfg)[0]

    def step():
        fwd().backward(dy)

    for _ in range(2):
        step()
    torch.cuda.synchronize()
    if a.time:
        import triton
        leaves = [o, g, i, lb]
        t_f = triton.testing.do_bench(fwd, warmup=50, rep=300)
        t_fb = triton.testing.do_bench(step, warmup=50, rep=300, grad_to_none=leaves)
        print(f"TIME shape={a.shape} H={a.heads} set={','.join(a.set) or '-'} fwd_ms={t_f:.4f} fwdbwd_ms={t_fb:.4f}")
    if a.profile:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                step()
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12))
    if not (a.time or a.profile):
        torch.cuda.cudart().cudaProfilerStart()
        step()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
