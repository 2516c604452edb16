"""Bytes that autograd keeps for the backward of one training forward pass, by dtype and by the op that saved
them: where the peak memory of training goes, measured on any device (a CPU is enough: it counts tensors, not
allocator blocks).

    TRITON_INTERPRET=1 PYTHONPATH=. python benchmarks/saved_activations.py [--hidden 256] [--layers 2] \
        [--batch 2] [--seq 96]

The model (the `fla-1.3b` preset's architecture at a small width: head dim 128, SwiGLU, RMSNorm) runs with
fp32 weights under bf16 autocast, as `hgrn2 train` does, with the Triton backend (on a CPU: under
TRITON_INTERPRET=1), whose custom ops save what they save on a GPU. Each saved tensor is counted once
per storage (views of one storage count once).
"""

from __future__ import annotations

import argparse

import torch

from hgrn2.bench.memory import activation_bytes, saved_tensor_bytes
from hgrn2.models import HGRN2Config, HGRN2ForCausalLM


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="fla-1.3b")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=96)
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    cfg = HGRN2Config.from_preset(args.preset, hidden_size=args.hidden, num_hidden_layers=args.layers,
                                  vocab_size=1024, backend="triton")
    model = HGRN2ForCausalLM(cfg).to(args.device)
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.seq), device=args.device)
    by_kind = saved_tensor_bytes(lambda: model(ids, labels=ids).loss.backward(), args.device)
    act = activation_bytes(by_kind, args.batch, args.seq)
    per_element = args.batch * args.seq * args.hidden * args.layers
    print(f"{args.preset} architecture, d={args.hidden}, {args.layers} layers, B={args.batch} T={args.seq}, bf16 "
          f"autocast: saved {sum(by_kind.values()) / 2**20:.2f} MiB, of which activations [B, T, ...] "
          f"{sum(act.values()) / 2**20:.2f} MiB = {sum(act.values()) / per_element:.1f} bytes per hidden element "
          f"per layer")
    for kind, n in sorted(act.items(), key=lambda kv: -kv[1]):
        print(f"  {n / 2**20:8.3f} MiB = {n / per_element:5.1f} B/element/layer  {kind}")


if __name__ == "__main__":
    main()
