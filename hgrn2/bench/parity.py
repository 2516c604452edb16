"""`hgrn2 bench train-parity`: our HGRN2 and fla's trained side by side from the same initial weights on the same
batches of real text, to show that our fast paths do not change what the model learns.

Both models start from fla's initialisation (`--seed`), loaded into ours by name (the state dicts match), and train
under bf16 autocast with AdamW (betas 0.9, 0.95, weight decay 0.1, a linear warm-up then constant), gradient clipping
at 1.0, on the same batches of a `hgrn2 data prepare` directory. Ours steps as `hgrn2 train` does by default on
one GPU, the step replayed as a CUDA graph (`--eager`: eager steps); fla steps eagerly. Writes every step's loss, the
largest relative difference between the curves and their plot. Without a GPU fla cannot run: its row says so and
ours trains alone (the CPU smoke run, `--quick`).

    hgrn2 bench train-parity --data DIR            # the 374M shape, 200 steps of 8 × 2048 tokens
    hgrn2 bench train-parity --data DIR --quick    # tiny shapes, 8 steps
"""

from __future__ import annotations

import argparse
import contextlib
import math
import tempfile
from pathlib import Path

import torch

from hgrn2.bench.common import add_output_argument, command_of, environment, fla_available, write_result
from hgrn2.train.graphed import GraphedStep, train_step


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", required=True, help="a directory written by `hgrn2 data prepare`")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--intermediate", type=int, default=2816)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--warmup", type=int, default=20, help="linear warm-up steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eager", action="store_true", help="our steps eager rather than a CUDA graph")
    parser.add_argument("--quick", action="store_true", help="tiny shapes (d 64, 2 layers, 2 × 64 tokens), 8 steps")
    add_output_argument(parser)


def run(args: argparse.Namespace) -> int:
    from hgrn2.data.packed import PackedDataset, read_meta

    if args.quick:
        args.steps, args.batch, args.seq_len, args.hidden, args.layers, args.intermediate = 8, 2, 64, 64, 2, 128
        args.warmup, args.lr = 2, 3e-3
    for flag in ("steps", "batch", "seq_len", "hidden", "layers", "intermediate"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')}: expected a positive int, got {getattr(args, flag)}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    graph = device.type == "cuda" and not args.eager
    meta = read_meta(args.data)
    vocab = meta["vocab_size"]
    batches = sample_batches(PackedDataset(args.data, "train", args.seq_len), args.steps, args.batch, args.seed)
    fla_model, ours = build_pair(args, vocab, device)
    rows = [dict(model="hgrn2", mode="graph" if graph else "eager",
                 losses=train_curve(ours, batches, args, device, graph))]
    if fla_model is None:
        rows.append(dict(model="fla", mode="eager", status="unavailable: fla's Triton kernels need a GPU"))
    else:
        rows.append(dict(model="fla", mode="eager", losses=train_curve(fla_model, batches, args, device, False)))
    summary = compare(rows)
    figure = plot(rows, args)
    path = write_result(args.out, "train_parity", environment(device), rows, command_of(args), quick=args.quick,
                        figure=figure, summary=summary, data=data_summary(meta),
                        settings={k: getattr(args, k) for k in ("steps", "batch", "seq_len", "hidden", "layers",
                                                                 "intermediate", "lr", "warmup", "seed")})
    for r in rows:
        if "losses" in r:
            print(f"{r['model']:6s} {r['mode']:5s} loss {r['losses'][0]:.4f} → {r['losses'][-1]:.4f}")
        else:
            print(f"{r['model']:6s} {r['status']}")
    if summary:
        print(f"largest relative difference over {args.steps} steps: {summary['max_rel_diff']:.2e}; "
              f"last 20 steps' mean loss: ours {summary['ours_last20']:.4f}, fla {summary['fla_last20']:.4f}")
    print(f"wrote {path}")
    return 0


def data_summary(meta: dict) -> dict:
    """What the curves trained on, from the data's meta.json: its training split and where it came from (the
    distinct source names, a `hgrn2 data corpus` file name starting with its package)."""
    train = meta["splits"]["train"]
    sources = meta.get("sources")  # per split from `hgrn2 data prepare`; a description string from other writers
    train_sources = sources.get("train") if isinstance(sources, dict) else sources
    # files (`hgrn2 data prepare` of local files) or one description (a data set's name, `write_corpus`)
    names = ([train_sources] if isinstance(train_sources, str)
             else sorted({Path(p).name.split("__")[0] for p in train_sources or []}))
    source = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return {"vocab_size": meta["vocab_size"], "train_tokens": train["tokens"], "documents": train.get("documents"),
            "source": source or "unnamed"}


def sample_batches(dataset, steps: int, batch: int, seed: int) -> list[torch.Tensor]:
    """steps × [batch, seq_len] windows in a seeded order, cycling through the split when it is shorter."""
    if len(dataset) == 0:
        raise ValueError("--data: the train split holds no window of --seq-len tokens")
    g = torch.Generator().manual_seed(seed)
    need = steps * batch
    order = torch.cat([torch.randperm(len(dataset), generator=g) for _ in range(math.ceil(need / len(dataset)))])
    return [torch.stack([dataset[int(i)] for i in order[s * batch:(s + 1) * batch]]) for s in range(steps)]


def build_pair(args, vocab: int, device: torch.device):
    """(fla's model or None without a GPU, ours), both float32 on `device` with the same weights."""
    from hgrn2.models import HGRN2ForCausalLM
    from hgrn2.models.convert import config_from_fla

    expand = min(128, args.hidden // 4)
    fla_cfg = dict(model_type="hgrn2", hidden_size=args.hidden, num_hidden_layers=args.layers, expand_ratio=expand,
                   intermediate_size=args.intermediate, vocab_size=vocab)
    torch.manual_seed(args.seed)
    fla_model = None
    if device.type == "cuda" and fla_available():
        from fla.models import HGRN2Config
        from fla.models import HGRN2ForCausalLM as FlaHGRN2

        fla_model = FlaHGRN2(HGRN2Config(**{k: v for k, v in fla_cfg.items() if k != "model_type"})).to(device)
    ours = HGRN2ForCausalLM(config_from_fla(fla_cfg)).to(device)
    if fla_model is not None:
        ours.load_state_dict(fla_model.state_dict(), strict=True)
    return fla_model, ours


def train_curve(model, batches: list[torch.Tensor], args, device: torch.device, graph: bool) -> list[float]:
    """Each step's training loss: AdamW with a linear warm-up, clipping at 1.0, bf16 autocast on CUDA; the step is
    `hgrn2.train.graphed.train_step`, replayed as a CUDA graph with `graph`."""
    model.train()
    cuda = device.type == "cuda"
    lr0 = torch.tensor(0.0, device=device) if graph else 0.0
    opt = torch.optim.AdamW(model.parameters(), lr=lr0, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8,
                            fused=cuda, capturable=graph)

    def compute_loss(x):
        autocast = torch.autocast("cuda", torch.bfloat16, cache_enabled=not graph) if cuda else contextlib.nullcontext()
        with autocast:
            return model(input_ids=x, labels=x).loss

    if graph:
        step = GraphedStep(compute_loss, opt, max_norm=1.0)
    else:
        def step(x):
            return train_step(compute_loss, opt, [x], max_norm=1.0)

    losses = []
    for s, x in enumerate(batches):
        lr = args.lr * min(1.0, (s + 1) / max(1, args.warmup))
        if graph:
            opt.param_groups[0]["lr"].fill_(lr)  # in place: the captured step reads this tensor
        else:
            opt.param_groups[0]["lr"] = lr
        losses.append(step(x.to(device, non_blocking=True))[0].clone())  # a replay overwrites the graph's output
    return [float(v) for v in torch.stack(losses).float().cpu()]


def compare(rows: list[dict]) -> dict | None:
    curves = {r["model"]: r["losses"] for r in rows if "losses" in r}
    if len(curves) < 2:
        return None
    ours, fla = curves["hgrn2"], curves["fla"]
    rel = [abs(a - b) / abs(b) for a, b in zip(ours, fla)]
    tail = min(20, len(ours))
    return dict(max_rel_diff=max(rel), max_rel_diff_step=rel.index(max(rel)) + 1,
                ours_last20=sum(ours[-tail:]) / tail, fla_last20=sum(fla[-tail:]) / tail)


def plot(rows: list[dict], args) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in rows:
        if "losses" in r:
            ax.plot(range(1, len(r["losses"]) + 1), r["losses"], label=f"{r['model']} ({r['mode']})", lw=1)
    ax.set(xlabel="step", ylabel="training loss", title=f"From the same weights: d {args.hidden}, {args.layers} "
                                                           f"layers, {args.batch} × {args.seq_len} tokens a step")
    ax.legend()
    path = Path(tempfile.mkdtemp()) / "train_parity.png"
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return str(path)
