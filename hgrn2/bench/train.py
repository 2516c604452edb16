"""`hgrn2 bench train`: training throughput (tokens/s) and peak memory of full causal LMs, side by side.

Models of the same width, depth and MLP size (default ~370M parameters: d=1024, 24 layers, expand 128, SwiGLU
2816, vocab 32000): our HGRN2, fla's HGRN2ForCausalLM (when importable; its default fused settings) and
transformers' LlamaForCausalLM with SDPA (head dim 64). Each step is forward + backward + AdamW on random tokens
under bf16 autocast with fp32 weights; `--warmup` untimed steps, then `--rounds` rounds of `--steps` steps timed
between CUDA synchronises, the rounds interleaved over the models (a GPU's speed drifts between runs and within one,
so single short timings do not compare). Reported: the median round, the range of the rounds, and our HGRN2's
ratio to each other model per shape.

A model runs eagerly, with its blocks compiled (`name+compile`, or every plain name with `--compile`), or, for our
HGRN2, with the whole step replayed as one CUDA graph (`hgrn2+graph`, or plain `hgrn2` with `--cuda-graph`;
`hgrn2.train.graphed`, warmed up and captured anew in each round, outside the timing).

    hgrn2 bench train                    # writes benchmarks/results/<device>/train.json
    hgrn2 bench train --models hgrn2,hgrn2+compile,hgrn2+graph,fla,llama --shapes 8x2048
    hgrn2 bench train --quick            # tiny CPU smoke run of the same code path
"""

from __future__ import annotations

import argparse
import json
import time

from hgrn2.bench.common import add_output_argument, command_of, environment, write_result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", default="hgrn2,fla,llama",
                        help="comma list of hgrn2, fla, llama, each optionally +compile (hgrn2 also +graph)")
    parser.add_argument("--shapes", default="8x2048,4x4096", help="comma list of BATCHxSEQ")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--expand", type=int, default=128, help="HGRN2 head dimension (expand ratio)")
    parser.add_argument("--intermediate", type=int, default=2816, help="SwiGLU width (fla's default for d=1024)")
    parser.add_argument("--heads", type=int, default=0, help="Llama attention heads (0: hidden / 64)")
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=3,
                        help="timed rounds per model and shape, interleaved over the models; the median is reported")
    parser.add_argument("--compile", action="store_true", help="torch.compile each block (models named plainly)")
    parser.add_argument("--cuda-graph", action="store_true",
                        help="replay plain hgrn2's whole step as one CUDA graph (GPU only)")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="after timing, profile one step and print its N costliest kernels (GPU time)")
    parser.add_argument("--seed", type=int, default=0)
    add_output_argument(parser)
    parser.add_argument("--quick", action="store_true", help="tiny CPU-sized smoke run (d=64, 2 layers, 2x64)")


def run(args: argparse.Namespace) -> int:
    import torch

    if args.quick:
        args.hidden, args.layers, args.expand, args.intermediate, args.vocab = 64, 2, 16, 128, 256
        args.shapes, args.warmup, args.steps, args.rounds = "2x64", 1, 2, 2
    if args.rounds < 1:
        raise ValueError(f"--rounds: expected at least 1, got {args.rounds}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    modes = {name: model_mode(name, args, device) for name in names}
    rows = {(name, b, t): {"model": name, "mode": modes[name], "batch": b, "seq_len": t} for name in names
            for b, t in shapes}
    models = {}
    for name in names:
        try:
            models[name] = [build(name.partition("+")[0], args), None]  # on the CPU until its first round
        except Exception as e:  # noqa: BLE001 - a missing/broken optional model is a row, not a crash
            for b, t in shapes:
                rows[name, b, t]["status"] = f"unavailable: {e}"
    timed_rounds(models, modes, rows, shapes, args, device)
    rows = list(rows.values())
    print(f"wrote {save(args, device, rows)}")
    print_table(rows, args.rounds)
    return 0


def model_mode(name: str, args, device) -> str:
    """"eager", "compile" or "graph" for a --models entry (`base` or `base+mode`); a bad entry is a ValueError."""
    base, _, mode = name.partition("+")
    if base not in BUILDERS:
        raise ValueError(f"--models: unknown model {base!r} in {name!r}; choose from {sorted(BUILDERS)}")
    if mode not in ("", "compile", "graph") or (mode == "graph" and base != "hgrn2"):
        raise ValueError(f"--models: {name!r}: a model takes +compile, and only hgrn2 takes +graph")
    mode = mode or ("graph" if args.cuda_graph and base == "hgrn2" else "compile" if args.compile else "eager")
    if mode == "graph" and device.type != "cuda":
        raise ValueError(f"--cuda-graph / {base}+graph: needs a CUDA device, got {device.type}")
    return mode


def timed_rounds(models: dict, modes: dict, rows: dict, shapes, args, device) -> None:
    """`args.rounds` rounds over the models (A B C A B C ...), so a drift of the GPU's speed over the run (clocks,
    temperature) spreads over all of them; a model and its optimiser wait on the CPU while the others run.
    models: name -> [model, optimiser or None]; modes: name -> model_mode; rows: (name, batch, seq_len) -> row,
    filled in place."""
    import torch

    offload = device.type == "cuda" and len(models) > 1
    for r in range(args.rounds):
        for name, entry in models.items():
            model, opt = entry
            if offload or r == 0:
                _place(model, opt, device)
            if opt is None:
                opt = entry[1] = _prepare(model, modes[name], device)
            for b, t in shapes:
                row = rows[name, b, t]
                if row.get("status", "ok") != "ok":
                    continue
                warmup = args.warmup if r == 0 else min(args.warmup, 1)  # later rounds: caches back after the move
                res = measure(model, opt, b, t, args.vocab, warmup, args.steps, device, args.seed,
                              args.profile if r == args.rounds - 1 else 0, graph=modes[name] == "graph")
                _record(row, res, model, first=r == 0)
                print(json.dumps({"round": r, **row}), flush=True)
                save(args, device, list(rows.values()))  # a run cut short keeps what it measured
            if offload:
                _place(model, opt, torch.device("cpu"))
                torch.cuda.empty_cache()


def _prepare(model, mode: str, device):
    """On the model's first round: its blocks compiled (mode "compile") and its AdamW, capturable with its
    learning rate a CUDA tensor for mode "graph"."""
    import torch

    if mode == "compile":
        for block in model.model.layers:
            block.compile()
    graph = mode == "graph"
    lr = torch.tensor(1e-4, device=device) if graph else 1e-4
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1, fused=device.type == "cuda",
                             capturable=graph)


def _place(model, opt, device) -> None:
    """Move the model and its optimiser state there; the optimiser follows the model's parameters also where the
    move made new Parameter objects (PyTorch keeps them between CPU and CUDA, not for every device)."""
    from collections import defaultdict

    import torch

    before = list(model.parameters())
    model.to(device)
    if opt is None:
        return
    new = {id(a): b for a, b in zip(before, model.parameters())}
    for group in opt.param_groups:
        group["params"] = [new[id(p)] for p in group["params"]]
    opt.state = defaultdict(dict, {new[id(p)]: {k: v.to(device) if torch.is_tensor(v) else v for k, v in st.items()}
                                   for p, st in opt.state.items()})


def _record(row: dict, res: dict, model, first: bool) -> None:
    """Fold one round's measurement into the row: medians of tokens/s and ms/step over the rounds so far; peak
    memory and warm-up time from the first round (the only one with this model alone on the GPU from its start)."""
    import statistics

    if first:
        row["params"] = sum(p.numel() for p in model.parameters())
    if res["status"] != "ok":
        row.update(res)
        return
    rounds = row.setdefault("tok_per_s_rounds", [])
    rounds.append(res["tok_per_s"])
    median = statistics.median(rounds)
    row.update(status="ok", tok_per_s=median, step_ms=1e3 * row["batch"] * row["seq_len"] / median, loss=res["loss"])
    if first:
        row.update(peak_gib=res["peak_gib"], warmup_s=res["warmup_s"])


def save(args, device, rows):
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "command_line")}
    return write_result(args.out, "train", environment(device), rows, command_of(args), quick=args.quick,
                        args=settings)


# ----------------------------------------------------------------------------------------------------------------


def _hgrn2(args):
    from hgrn2.models import HGRN2Config, HGRN2ForCausalLM

    return HGRN2ForCausalLM(HGRN2Config(hidden_size=args.hidden, num_hidden_layers=args.layers,
                                        expand_ratio=args.expand, intermediate_size=args.intermediate,
                                        vocab_size=args.vocab))


def _fla(args):
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("fla's Triton kernels need a GPU")
    from fla.models import HGRN2Config, HGRN2ForCausalLM

    return HGRN2ForCausalLM(HGRN2Config(hidden_size=args.hidden, num_hidden_layers=args.layers,
                                        expand_ratio=args.expand, intermediate_size=args.intermediate,
                                        vocab_size=args.vocab))


def _llama(args):
    from transformers import LlamaConfig, LlamaForCausalLM

    heads = args.heads or max(1, args.hidden // 64)
    return LlamaForCausalLM(LlamaConfig(hidden_size=args.hidden, num_hidden_layers=args.layers,
                                        num_attention_heads=heads, num_key_value_heads=heads,
                                        intermediate_size=args.intermediate, vocab_size=args.vocab,
                                        max_position_embeddings=8192, attn_implementation="sdpa"))


BUILDERS = {"hgrn2": _hgrn2, "fla": _fla, "llama": _llama}


def build(name: str, args):
    import torch

    torch.manual_seed(args.seed)
    return BUILDERS[name](args)


def measure(model, opt, batch, seq_len, vocab, warmup, steps, device, seed, profile=0, graph=False) -> dict:
    """Time `steps` full training steps after `warmup`; tokens/s, ms/step, peak memory (CUDA) and final loss.
    `profile` > 0: then print that many rows of one profiled step. `graph`: the step replayed as one CUDA graph,
    captured after warmup − 1 (at least 1) eager steps, the capture the last untimed step."""
    import torch

    from hgrn2.train.graphed import GraphedStep

    gen = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randint(0, vocab, (batch, seq_len), generator=gen).to(device)
    graphed = GraphedStep(lambda ids: _loss(model, ids, cache=False), opt, warmup=max(1, warmup - 1)) if graph else None
    if graphed is not None:
        warmup = graphed.warmup + 1

    def step():
        return graphed(x)[0] if graphed is not None else train_step(model, opt, x)

    cuda = device.type == "cuda"
    try:
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        for _ in range(warmup):
            step()
        if cuda:
            torch.cuda.synchronize()
        warmup_s = time.perf_counter() - t0  # includes compiling / autotuning kernels on first use
        t0 = time.perf_counter()
        for _ in range(steps):
            loss = step().detach()
        if cuda:
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
    except torch.cuda.OutOfMemoryError:
        opt.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()
        return {"status": "OOM"}
    if profile:
        print_profile(step, profile, cuda)
    opt.zero_grad(set_to_none=True)  # a graph's gradients live in its memory pool, freed with it
    return {"status": "ok", "tok_per_s": batch * seq_len * steps / dt, "step_ms": 1e3 * dt / steps,
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None, "loss": loss.item(),
            "warmup_s": round(warmup_s, 1)}


def train_step(model, opt, x):
    """One timed step: forward and backward under bf16 autocast on tokens x [B, T] (also the labels), AdamW.
    Returns the loss."""
    loss = _loss(model, x)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def _loss(model, x, cache: bool = True):
    """The causal-LM loss on tokens x under bf16 autocast (its weight cache off while a CUDA graph is captured)."""
    import torch

    with torch.autocast(x.device.type, dtype=torch.bfloat16, cache_enabled=cache):
        # no KV cache (transformers' Llama builds one by default, training or not)
        return model(input_ids=x, labels=x, use_cache=False).loss


def print_profile(step, top: int, cuda: bool) -> None:
    """One more step under torch.profiler: its `top` costliest operators by device (else CPU) self time, then
    the same split by input shapes."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities, record_shapes=True) as prof:
        step()
    sort = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=sort, row_limit=top, max_name_column_width=60), flush=True)
    # the same operators split by input shapes: which tensors the element-wise passes run over
    print(prof.key_averages(group_by_input_shape=True).table(sort_by=sort, row_limit=top, max_name_column_width=40,
                                                             max_shapes_column_width=70), flush=True)


def print_table(rows, rounds: int = 1) -> None:
    head = (f"{'model':<13} {'shape':>10} {'params':>9} {'tok/s':>10} {'range':>15} {'ms/step':>9} {'peak GiB':>9}"
            "  status")
    print(f"tokens/s: median of {rounds} interleaved round(s); range: the slowest and fastest round")
    print(head)
    print("-" * len(head))
    for r in rows:
        shape = f"{r['batch']}x{r['seq_len']}"
        params = f"{r['params'] / 1e6:.1f}M" if "params" in r else "-"
        if r.get("status") == "ok":
            peak = f"{r['peak_gib']:.1f}" if r["peak_gib"] is not None else "-"
            spread = f"{min(r['tok_per_s_rounds']):.0f}-{max(r['tok_per_s_rounds']):.0f}"
            print(f"{r['model']:<13} {shape:>10} {params:>9} {r['tok_per_s']:>10.0f} {spread:>15} {r['step_ms']:>9.1f}"
                  f" {peak:>9}  ok")
        else:
            print(f"{r['model']:<13} {shape:>10} {params:>9} {'-':>10} {'-':>15} {'-':>9} {'-':>9}"
                  f"  {r.get('status', 'not run')[:80]}")
    for line in ratios(rows):
        print(line)


def ratios(rows) -> list[str]:
    """Per shape: each of our HGRN2 rows' median tokens/s over each other row's, and its peak memory over theirs."""
    ok = {(r["model"], r["batch"], r["seq_len"]): r for r in rows if r.get("status") == "ok"}
    lines = []
    for (name, b, t), ours in ok.items():
        if name.partition("+")[0] != "hgrn2":
            continue
        parts = [f"{ours['tok_per_s'] / r['tok_per_s']:.2f}x {other}'s tokens/s"
                 + (f" at {ours['peak_gib'] / r['peak_gib']:.2f}x its peak memory" if r["peak_gib"] else "")
                 for (other, b2, t2), r in ok.items() if (b2, t2) == (b, t) and other != name]
        if parts:
            lines.append(f"{name} {b}x{t}: " + "; ".join(parts))
    return lines
