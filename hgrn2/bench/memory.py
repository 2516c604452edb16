"""`hgrn2 bench memory`: what autograd keeps for the backward of one training step, by dtype and shape.

Peak training memory is weights and optimiser state plus these saved activations; counting tensors (not
allocator blocks) works on any device, a CPU included, so regressions show in CPU tests. The command runs one
step of a preset's architecture at a small width (fp32 weights under bf16 autocast, as `hgrn2 train` does; on a
CPU the Triton backend needs TRITON_INTERPRET=1, so that its custom ops save what they save on a GPU):

    TRITON_INTERPRET=1 hgrn2 bench memory --hidden 1024 --batch 1 --seq 96
"""

from __future__ import annotations

import collections

import torch

from hgrn2.bench.common import add_output_argument, command_of, environment, format_table, write_result


def saved_tensor_bytes(step, device_type: str,
                       autocast_dtype: torch.dtype | None = torch.bfloat16) -> collections.Counter:
    """Run `step()` (forward and backward) and return {"dtype (shape)": bytes} of every tensor autograd saved,
    each storage counted once (views of one storage share it), parameters left out (they exist anyway); under
    autocast unless `autocast_dtype` is None."""
    seen, by_kind = set(), collections.Counter()

    def pack(t):
        storage = t.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())
        if key not in seen and t.numel() > 0 and not isinstance(t, torch.nn.Parameter):
            seen.add(key)
            by_kind[f"{str(t.dtype).removeprefix('torch.')} {tuple(t.shape)}"] += storage.nbytes()
        return t

    enabled = autocast_dtype is not None
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            torch.autocast(device_type=device_type, dtype=autocast_dtype or torch.bfloat16, enabled=enabled):
        step()
    return by_kind


def activation_bytes(by_kind: collections.Counter, batch: int, seq: int) -> dict[str, int]:
    """The entries of `saved_tensor_bytes` shaped [batch, seq, ...] or [batch·seq, ...] (pick batch·seq unlike
    any weight's dimension, so that weights and their autocast copies do not match)."""
    prefixes = (f"({batch}, {seq},", f"({batch * seq},")
    return {k: n for k, n in by_kind.items() if k.split(" ", 1)[1].startswith(prefixes)}


def add_arguments(parser) -> None:
    parser.add_argument("--preset", default="fla-1.3b")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=96)
    parser.add_argument("--backend", default="triton", help="the recurrence's backend (triton: its custom ops)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    add_output_argument(parser)


def run(args) -> int:
    from hgrn2.models import HGRN2Config, HGRN2ForCausalLM

    cfg = HGRN2Config.from_preset(args.preset, hidden_size=args.hidden, num_hidden_layers=args.layers,
                                  vocab_size=1024, backend=args.backend)
    model = HGRN2ForCausalLM(cfg).to(args.device)
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.seq), device=args.device)
    by_kind = saved_tensor_bytes(lambda: model(ids, labels=ids).loss.backward(), torch.device(args.device).type)
    act = activation_bytes(by_kind, args.batch, args.seq)
    per_element = args.batch * args.seq * args.hidden * args.layers
    rows = [{"tensor": kind, "mib": n / 2**20, "bytes_per_element_per_layer": n / per_element}
            for kind, n in sorted(act.items(), key=lambda kv: -kv[1])]
    total = {"tensor": "all activations", "mib": sum(act.values()) / 2**20,
             "bytes_per_element_per_layer": sum(act.values()) / per_element}
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "command_line")}
    path = write_result(args.out, "memory", environment(args.device), [total, *rows], command_of(args),
                        args=settings, saved_mib=sum(by_kind.values()) / 2**20)
    print(f"wrote {path}")
    print(f"{args.preset} architecture, d={args.hidden}, {args.layers} layers, B={args.batch} T={args.seq}, bf16 "
          f"autocast: saved {sum(by_kind.values()) / 2**20:.2f} MiB")
    print(format_table([total, *rows], [("tensor", "tensor", ""), ("MiB", "mib", ".3f"),
                                        ("bytes / element / layer", "bytes_per_element_per_layer", ".1f")]))
    return 0
