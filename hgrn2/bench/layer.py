"""`hgrn2 bench layer`: the HGRU2 token mixer with its projections against fla's `HGRN2Attention`, forward+backward.

Both layers at the same width and head size (default d = 2048, head 128, bf16, B8 × T2048), the same input
x ~ N(0, 1) and lower bound β ~ U(0, 0.9), output gradient random; the median of three rounds of
`hgrn2.bench.common.time_ms`, the layers interleaved in each, with x's gradient reset each call. The projections
are the same work in both, so the layer's ratio is diluted from the op's (`hgrn2 bench ops`);
`hgrn2 bench profile --target layer` splits the time kernel by kernel.

    hgrn2 bench layer                     # writes benchmarks/results/<device>/layer.json
    hgrn2 bench layer --quick             # d 64, head 32, B1 T64; on a CPU ours only
"""

from __future__ import annotations

import argparse

import torch

from hgrn2.bench.common import (
    TIMING_ROUNDS,
    add_output_argument,
    command_of,
    environment,
    fla_available,
    format_table,
    interleaved,
    time_ms,
    write_result,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shape", default="8x2048", help="BATCHxSEQ")
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--expand", type=int, default=128, help="head size (expand ratio)")
    parser.add_argument("--quick", action="store_true", help="tiny shapes (d 64, head 32, 1x64), also on a CPU")
    parser.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    parser.add_argument("--backend", default=None, help="our backend (default: triton on CUDA, chunk on a CPU)")
    add_output_argument(parser)


def layers(d: int, expand: int, device, dtype, backend: str | None, with_fla: bool) -> dict:
    """{"ours": HGRU2, "fla": HGRN2Attention (when `with_fla`)} at layer index 1 (a layer with a lower bound)."""
    from hgrn2.layers.hgru2 import HGRU2

    out = {"ours": HGRU2(d, layer_idx=1, expand_ratio=expand, backend=backend).to(device, dtype)}
    if with_fla:
        from fla.layers.hgrn2 import HGRN2Attention

        out["fla"] = HGRN2Attention(hidden_size=d, expand_ratio=expand, layer_idx=1).to(device, dtype)
    return out


def step_inputs(B: int, T: int, d: int, device, dtype):
    """x [B, T, d] (a leaf), the output gradient and a lower bound [d] in (0, 0.9)."""
    torch.manual_seed(1)
    x = torch.randn(B, T, d, device=device, dtype=dtype, requires_grad=True)
    return x, torch.randn_like(x), torch.rand(d, device=device) * 0.9


def run(args: argparse.Namespace) -> int:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda = device.type == "cuda"
    if args.quick:
        args.shape, args.hidden, args.expand = "1x64", 64, 32
    try:
        B, T = (int(v) for v in args.shape.split("x"))
    except ValueError:
        raise ValueError(f"--shape: expected BATCHxSEQ, got {args.shape!r}") from None
    dtype = torch.bfloat16 if cuda else torch.float32
    backend = args.backend or ("triton" if cuda else "chunk")
    with_fla = fla_available() and cuda
    if not with_fla:
        print("skipped: fla's HGRN2Attention: needs CUDA and flash-linear-attention", flush=True)
    x, dy, lb = step_inputs(B, T, args.hidden, device, dtype)
    warmup, rep = (5, 20) if args.quick else (25, 100)
    timed = {name: lambda layer=layer: time_ms(lambda: layer(x, lower_bound=lb)[0].backward(dy), device=device,
                                               inputs=[x, lb], warmup=warmup, rep=rep, grad_to_none=[x])
             for name, layer in layers(args.hidden, args.expand, device, dtype, backend, with_fla).items()}
    errors: dict[str, str] = {}
    ms = interleaved(errors, timed, 1 if args.quick else TIMING_ROUNDS)
    if errors:
        raise RuntimeError(f"timing failed: {errors}")
    rows = [{"layer": name, "mode": "fwd+bwd", "shape": f"B={B} T={T} d={args.hidden}", "B": B, "T": T,
             "hidden": args.hidden, "expand": args.expand, "ms": ms[f"{name}_ms"]} for name in timed]
    fla_ms = next((r["ms"] for r in rows if r["layer"] == "fla"), None)
    for r in rows:
        r["vs_fla"] = r["ms"] / fla_ms if fla_ms else None
    path = write_result(args.out, "layer", environment(device), rows, command_of(args), quick=args.quick,
                        backend=backend, dtype=str(dtype).removeprefix("torch."))
    print(f"wrote {path}")
    print(format_table(rows, [("layer", "layer", ""), ("shape", "shape", ""), ("fwd+bwd ms", "ms", ".4f"),
                              ("/ fla", "vs_fla", ".3f")]))
    return 0
