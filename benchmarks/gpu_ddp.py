"""Do DDP and FSDP2 on several GPUs give the one-GPU loss curve, and how do they scale?

Two modes. The default: the 0.15b preset in bf16 on one GPU with gradient accumulation, then on --nproc GPUs
under torchrun with DDP and with FSDP2, same global batch, same data: per-step losses side by side, and tokens/s
(median of each run's second half). It launches `hgrn2 train` under torchrun.

    python3 benchmarks/gpu_ddp.py [--steps 40] [--preset hgrn2-0.15b] [--nproc 2] [--work DIR] [--out DIR]

The corpus is synthetic (a noisy periodic source over the preset's vocabulary, so the loss falls), written to
--work (default: a temporary folder) with each run's log.jsonl; the result goes to --out (default
benchmarks/results/<device>x<nproc>/)/ddp.json.

`--fsdp-variants [NAME ...]`: this process itself, launched by torchrun, trains the preset with each variant of the
library's FSDP2 options (`distributed.wrap`, the train config keys `fsdp_reshard`, `fsdp_param_dtype`,
`fsdp_prefetch`, `fsdp_unit`, `fused_optimizer`) and DDP, one after the other on the same global batches (the
synthetic source, drawn per step), and reports tokens/s (the second half of the steps) and the losses; then it times
saving and loading a checkpoint (model and AdamW state) the old way (full state dicts gathered to rank 0,
`torch.save`, every rank reading the file) against the sharded one (`torch.distributed.checkpoint`,
`hgrn2.train.sharded`). One process measures the one-GPU baselines (no wrapping, with torch's default optimiser
kernels and with the fused ones; its checkpoint times too), which the run on several GPUs reads with --baseline to
print each variant's speed-up and its largest loss difference against the baseline with the same optimiser kernels.
On an H200 host (each call meant to stay under 4 minutes at --steps 20):

    python3 benchmarks/gpu_ddp.py --fsdp-variants --preset hgrn2-1b --steps 20 --batch 16 --micro 4
    torchrun --standalone --nproc_per_node 2 benchmarks/gpu_ddp.py --fsdp-variants --preset hgrn2-1b \
        --steps 20 --batch 16 --micro 4 --baseline benchmarks/results/h200/fsdp_variants.json

(the first writes benchmarks/results/h200/fsdp_variants.json, the second .../h200x2/fsdp_variants.json; names:
VARIANTS below; --no-checkpoint skips the checkpoint times; --profile DIR adds where each variant's step time goes;
a CPU check: --device cpu --preset tiny with gloo).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from hgrn2.bench.common import add_output_argument, environment, write_result  # noqa: E402
from hgrn2.data.prepare import write_corpus  # noqa: E402

# name: (parallel, fsdp_reshard, fsdp_param_dtype, fsdp_prefetch, fused_optimizer, fsdp_unit); "fsdp" is the
# library's default; "alone" runs on one process, unwrapped (the baselines, one per optimiser kernel); "-u3": three
# blocks per FSDP2 unit, "-whole": all blocks in one unit
VARIANTS = {
    "1 GPU": ("alone", "auto", "fp32", 1, False, 1),
    "1 GPU fused": ("alone", "auto", "fp32", 1, True, 1),
    "ddp": ("ddp", "auto", "fp32", 1, False, 1),
    "ddp-fused": ("ddp", "auto", "fp32", 1, True, 1),
    "fsdp": ("fsdp", "auto", "fp32", 1, False, 1),
    "fsdp-never": ("fsdp", "never", "fp32", 1, False, 1),
    "fsdp-bf16": ("fsdp", "auto", "bf16", 1, False, 1),
    "fsdp-bf16-never": ("fsdp", "never", "bf16", 1, False, 1),
    "fsdp-bf16-never-p2": ("fsdp", "never", "bf16", 2, False, 1),
    "fsdp-bf16-never-fused": ("fsdp", "never", "bf16", 1, True, 1),
    "fsdp-never-u3": ("fsdp", "never", "fp32", 1, False, 3),
    "fsdp-never-whole": ("fsdp", "never", "fp32", 1, False, 10**6),
    "fsdp-bf16-never-u3": ("fsdp", "never", "bf16", 1, False, 3),
    "fsdp-bf16-never-whole": ("fsdp", "never", "bf16", 1, False, 10**6),
}


def corpus(path: str, vocab: int, n_train: int, n_val: int) -> None:
    rng = np.random.default_rng(0)

    def ids(n):
        base = (np.arange(n) * 7 + rng.integers(0, 3, n)) % vocab
        return np.where(rng.random(n) < 0.2, rng.integers(0, vocab, n), base)

    write_corpus(path, {"train": ids(n_train), "val": ids(n_val)}, vocab_size=vocab)


def train(args, name: str, nproc: int, parallel: str) -> dict:
    out = os.path.join(args.work, name)
    overrides = [f"data={args.work}/data", f"out_dir={out}", f"max_steps={args.steps}", "warmup_steps=5",
                 f"batch_size={args.batch}", f"micro_batch_size={args.micro}", f"seq_len={args.seq_len}",
                 f"parallel={parallel}", "log_every=1", "eval_every=0", "eval_sequences=16", "save_every=0",
                 "resume=false", "progress=false", "tensorboard=false", "num_workers=2", f"device={args.device}",
                 *args.set]
    launcher = [sys.executable, "-m", "hgrn2.cli"]
    if nproc > 1:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
                    "-m", "hgrn2.cli"]
    cmd = launcher + ["train", "--config", args.preset, "--set", *overrides]
    start = time.time()
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT))
    print(f"{name}: exit {p.returncode} after {time.time() - start:.0f} s", flush=True)
    if p.returncode:
        print(p.stdout[-2000:] + p.stderr[-4000:])
        return {}
    with open(os.path.join(out, "log.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    train_rows = [r for r in rows if r["kind"] == "train"]
    val = [r["val_loss"] for r in rows if r["kind"] == "val"]
    # tokens/s over the second half of the run (Triton compiles and the allocator warm up in the first)
    late = train_rows[len(train_rows) // 2:]
    return {"loss": {r["step"]: r["loss"] for r in train_rows}, "val_loss": val[-1] if val else None,
            "tok_per_s": float(np.median([r["tok_per_s"] for r in late]))}


def source_batch(step: int, batch: int, seq_len: int, vocab: int, seed: int = 0) -> torch.Tensor:
    """The global batch of `step` [batch, seq_len] from the noisy periodic source: the same on every rank and
    for every world size (each rank takes its rows)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    n = batch * seq_len
    base = (torch.arange(n) * 7 + torch.randint(0, 3, (n,), generator=g)) % vocab
    noisy = torch.where(torch.rand(n, generator=g) < 0.2, torch.randint(0, vocab, (n,), generator=g), base)
    return noisy.view(batch, seq_len)


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _vocab(cfg, args) -> int:
    """The preset's vocabulary, else --vocab."""
    v = cfg.model.get("vocab_size", "auto")
    return args.vocab if v == "auto" else int(v)


_TEMPLATE: dict = {}


def _fresh(args, cfg, d, variant: str):
    """The preset's model (the same initial weights on every rank) wrapped as `variant`, and AdamW."""
    from hgrn2.train import distributed as D
    from hgrn2.train.model_factory import build_model
    from hgrn2.train.optim import build_optimizer

    if "model" not in _TEMPLATE:  # built once: a 1B model's initialisation on the CPU takes many seconds
        torch.manual_seed(cfg.seed)
        _TEMPLATE["model"] = build_model(cfg.arch, cfg.model, _vocab(cfg, args))
    model = copy.deepcopy(_TEMPLATE["model"]).to(d.device)
    how, reshard, dtype, prefetch, fused, unit = VARIANTS[variant]
    if how != "alone":
        model = D.wrap(model, how, d, reshard=reshard, param_dtype=dtype, prefetch=prefetch, unit=unit)
    return model, build_optimizer(model, cfg.optimizer, cfg.lr, cfg.betas, cfg.eps, cfg.weight_decay, fused)


def measure_variant(args, cfg, d, variant: str) -> dict:
    """Train `args.steps` steps; tokens/s over the second half, the losses (mean over ranks)."""
    import contextlib

    from hgrn2.train import distributed as D
    from hgrn2.train.graphed import train_step

    model, opt = _fresh(args, cfg, d, variant)
    accum = args.batch // (args.micro * d.world)
    rows = args.micro * accum
    vocab = _vocab(cfg, args)
    amp = torch.autocast(d.device.type, dtype=torch.bfloat16) if d.device.type == "cuda" else contextlib.nullcontext()

    def micro_loss(x):
        with amp:
            return model(input_ids=x, labels=x).loss

    losses, half = [], args.steps // 2
    for step in range(args.steps):
        if step == half:
            _sync(d.device)
            t0 = time.time()
        x = source_batch(step, args.batch, args.seq_len, vocab)[d.rank * rows:(d.rank + 1) * rows].to(d.device)
        loss, _ = train_step(micro_loss, opt, [x], accum, max_norm=cfg.grad_clip or None,
                             sync=lambda last: D.no_sync(model, last))
        losses.append(D.mean(loss, d))
    _sync(d.device)
    seconds = time.time() - t0
    memory = torch.cuda.max_memory_allocated(d.device) / 2**30 if d.device.type == "cuda" else None
    out = {"tok_per_s": (args.steps - half) * args.batch * args.seq_len / seconds,
           "loss": [float(v) for v in losses], "peak_gib": memory}
    if args.profile:
        def step(i):
            x = source_batch(args.steps + i, args.batch, args.seq_len, vocab)[d.rank * rows:(d.rank + 1) * rows]
            train_step(micro_loss, opt, [x.to(d.device)], accum, max_norm=cfg.grad_clip or None,
                       sync=lambda last: D.no_sync(model, last))
        out["profile"] = profile_steps(step, 2, os.path.join(args.profile, f"{variant}.rank{d.rank}"), d.device)
    return out


def _union(intervals: list[tuple[float, float]]) -> float:
    """The total length the intervals cover."""
    return sum(b - a for a, b in _merged(intervals))


def profile_steps(step, n: int, path: str, device: torch.device) -> dict:
    """Run `step(i)` n times under the profiler; per step (ms): the GPU's span, the time any kernel runs, the time
    only communication kernels run (exposed communication), the optimiser's kernels and idle time. The tables by
    GPU time and by host time go to `path`.txt."""
    from torch.profiler import ProfilerActivity, profile

    os.makedirs(os.path.dirname(path), exist_ok=True)
    cuda = device.type == "cuda"
    _sync(device)
    with profile(activities=[ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * cuda) as prof:
        for i in range(n):
            step(i)
        _sync(device)
    with open(path + ".txt", "w") as f:  # the GPU's time by kernel, then the host's by operator (what it waits on)
        averages = prof.key_averages()
        for key in ("self_device_time_total",) * cuda + ("cpu_time_total",):
            f.write(averages.table(sort_by=key, row_limit=30, max_name_column_width=80) + "\n")
    prof.export_chrome_trace(path + ".json")
    with open(path + ".json") as f:
        kernels = [e for e in json.load(f)["traceEvents"] if e.get("cat") == "kernel" and "dur" in e]
    os.remove(path + ".json")
    if not kernels:
        return {}
    iv = [(e["ts"], e["ts"] + e["dur"], e["name"].lower()) for e in kernels]
    span = max(b for _, b, _ in iv) - min(a for a, _, _ in iv)
    busy = _union([(a, b) for a, b, _ in iv])
    compute = _union([(a, b) for a, b, k in iv if "nccl" not in k])
    optim = sum(b - a for a, b, k in iv if "adam" in k or "multi_tensor" in k)
    out = {k: v / n / 1e3 for k, v in {"span_ms": span, "busy_ms": busy, "exposed_comm_ms": busy - compute,
                                      "comm_ms": sum(b - a for a, b, k in iv if "nccl" in k),
                                      "optimizer_ms": optim, "idle_ms": span - busy}.items()}
    return {**out, **_exposed(iv, n)}


def _merged(intervals: list[tuple[float, float]]) -> list[list[float]]:
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def _exposed(iv: list[tuple[float, float, str]], n: int) -> dict:
    """Per collective kind, the ms per step its kernels run with no compute kernel beside them, and the five
    longest such stretches (ms into the profile, length, collective, the compute kernel before)."""
    import bisect

    compute = _merged([(a, b) for a, b, k in iv if "nccl" not in k])
    starts = [a for a, _ in compute]
    ends = sorted((b, k) for _, b, k in iv if "nccl" not in k)  # the compute kernel that ended last before a point
    end_times = [b for b, _ in ends]
    by_kind: dict[str, float] = {}
    stretches = []
    for a, b, k in iv:
        if "nccl" not in k:
            continue
        kind = next((c for c in ("allgather", "reducescatter", "allreduce") if c in k.replace("_", "")), "other")
        covered, i = 0.0, max(0, bisect.bisect_right(starts, a) - 1)
        while i < len(compute) and compute[i][0] < b:
            covered += max(0.0, min(b, compute[i][1]) - max(a, compute[i][0]))
            i += 1
        by_kind[kind] = by_kind.get(kind, 0.0) + (b - a - covered)
        j = bisect.bisect_right(end_times, a) - 1
        stretches.append((b - a - covered, a, kind, ends[j][1] if j >= 0 else ""))
    t0 = min(a for a, _, _ in iv)
    top = sorted(stretches, reverse=True)[:5]
    return {"exposed_by_ms": {k: v / n / 1e3 for k, v in by_kind.items()},
            "exposed_top": [{"at_ms": (a - t0) / 1e3, "ms": e / 1e3, "kind": kind, "after": before[:60]}
                            for e, a, kind, before in top]}


def _release(d) -> None:
    """Free the last measurement's model and optimiser (gone with its frame) before the next one."""
    import gc

    gc.collect()
    if d.device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(d.device)


def _folder_bytes(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(path) for f in files)


def measure_checkpoints(args, cfg, d, work: str) -> list[dict]:
    """Save and load time of the model and AdamW state (after one step, so the moments exist), wrapped as the
    library's default `parallel` (alone on one process): the old way and the sharded one."""
    import shutil

    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    from hgrn2.train import checkpoint as ckpt
    from hgrn2.train import distributed as D
    from hgrn2.train import sharded

    model, opt = _fresh(args, cfg, d, cfg.parallel if d.world > 1 else "1 GPU")
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    out = []

    def timed(fn) -> float:
        D.barrier(d)
        _sync(d.device)
        t0 = time.time()
        fn()
        _sync(d.device)
        D.barrier(d)
        return time.time() - t0

    old_dir, new_dir = os.path.join(work, "ckpt_old"), os.path.join(work, "ckpt_new")

    def old_save():
        model_sd, optim_sd = get_state_dict(D.unwrap(model), opt,
                                            options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if d.main:
            ckpt.save(old_dir, 1, {"step": 1, "model": model_sd, "optimizer": optim_sd}, keep_last=1)

    save_s = timed(old_save)
    load_s = timed(lambda: sharded.load_latest(old_dir, model, opt, d))  # every rank reads the whole file
    out.append({"checkpoint": "full state to rank 0 + torch.save", "save_s": save_s, "load_s": load_s,
                "gib": _folder_bytes(ckpt.list_checkpoints(old_dir)[-1]) / 2**30 if d.main else None})
    save_s = timed(lambda: sharded.save(new_dir, 1, model, opt, {"step": 1}, d, keep_last=1))
    load_s = timed(lambda: sharded.load_latest(new_dir, model, opt, d))
    out.append({"checkpoint": "sharded (torch.distributed.checkpoint)", "save_s": save_s, "load_s": load_s,
                "gib": _folder_bytes(sharded.list_checkpoints(new_dir)[-1][1]) / 2**30 if d.main else None})
    if d.main:
        for folder in (old_dir, new_dir):
            shutil.rmtree(folder, ignore_errors=True)
    return out


def variants_main(args) -> None:
    """--fsdp-variants: this process (one of torchrun's, or alone) measures the variants and the checkpoints."""
    import shutil

    from hgrn2.bench.common import format_table
    from hgrn2.train import distributed as D
    from hgrn2.train.config import make_config

    d = D.init(args.device)
    fits = [n for n, v in VARIANTS.items() if (v[0] == "alone") == (d.world == 1)]
    names = args.fsdp_variants or fits
    unknown = [n for n in names if n not in fits]
    if unknown or args.batch % (args.micro * d.world):
        raise SystemExit(f"gpu_ddp.py: error: --fsdp-variants: {unknown} not for {d.world} rank(s), choose from "
                         f"{fits}" if unknown else f"gpu_ddp.py: error: --batch {args.batch} is not a multiple of "
                         f"--micro {args.micro} × {d.world} ranks")
    cfg = make_config(args.preset, [f"seq_len={args.seq_len}", *args.set])
    work = D.gather_objects(args.work or tempfile.mkdtemp(prefix="hgrn2_fsdp_"), d)[0]  # rank 0's folder
    baseline = json.load(open(args.baseline)) if args.baseline else None
    rows = []
    for name in names:
        try:
            r = measure_variant(args, cfg, d, name)
        except Exception as e:  # noqa: BLE001 - a variant that fails on every rank alike; the others still run
            rows.append({"run": name, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"})
            if d.main:
                print(f"{name}: failed ({rows[-1]['error']})", flush=True)
            continue
        finally:
            _release(d)
        row = {"run": name, "tok_per_s": r["tok_per_s"], "peak_gib": r["peak_gib"], **r.get("profile", {})}
        if baseline:  # against the one-process run with the same optimiser kernels, where the baseline has it
            ones = {b["run"]: b for b in baseline["rows"] if "tok_per_s" in b}
            one = ones.get("1 GPU fused" if VARIANTS[name][4] else "1 GPU", baseline["rows"][0])
            row["speedup_vs_1gpu"] = r["tok_per_s"] / one["tok_per_s"]
            row["max_rel_loss_diff_vs_1gpu"] = max(abs(a - b) / abs(b) for a, b in zip(r["loss"], one["loss"]))
        rows.append({**row, "loss": r["loss"]})
        if d.main:
            print(f"{row['run']}: {r['tok_per_s']:.0f} tokens/s", flush=True)
    checkpoints = [] if args.no_checkpoint else measure_checkpoints(args, cfg, d, work)
    if d.main:
        env = environment(args.device if d.device.type != "cuda" else "cuda:0", gpus=d.world)
        path = write_result(args.out, "fsdp_variants", env, rows, shlex.join(["python3", *sys.argv]),
                            checkpoints=checkpoints, preset=args.preset, steps=args.steps, batch=args.batch,
                            micro=args.micro, seq_len=args.seq_len, world_size=d.world)
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
        print(f"wrote {path}\n\n{args.preset}, {d.world} rank(s), {args.batch}×{args.seq_len} tokens per step, "
              f"micro {args.micro}")
        print(format_table(rows, [("run", "run", ""), ("tokens/s", "tok_per_s", ".0f"),
                                  ("× 1 GPU", "speedup_vs_1gpu", ".2f"), ("peak GiB", "peak_gib", ".1f"),
                                  ("max rel. loss diff", "max_rel_loss_diff_vs_1gpu", ".1e"),
                                  ("span ms", "span_ms", ".1f"), ("idle ms", "idle_ms", ".1f"),
                                  ("exposed comm ms", "exposed_comm_ms", ".1f"),
                                  ("optimizer ms", "optimizer_ms", ".1f"),
                                  ("error", "error", "")]))
        for r in rows:
            if r.get("exposed_by_ms"):
                print(f"{r['run']}: exposed ms per step {r['exposed_by_ms']}; longest {r['exposed_top']}")
        if checkpoints:
            print("\n" + format_table(checkpoints, [("checkpoint", "checkpoint", ""), ("save s", "save_s", ".1f"),
                                             ("load s", "load_s", ".1f"), ("GiB", "gib", ".1f")]))
    D.shutdown()


def _max_diff(loss: dict, ref: dict) -> float | None:
    """The largest relative difference of a run's per-step losses from the one-GPU run's."""
    return max(abs(loss[s] - ref[s]) / ref[s] for s in ref) if ref else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_output_argument(ap)
    ap.add_argument("--work", default=None, help="corpus and run logs (default: a temporary folder)")
    ap.add_argument("--preset", default="hgrn2-0.15b")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=32, help="sequences per optimiser step, all GPUs together")
    ap.add_argument("--micro", type=int, default=8, help="sequences per GPU per forward")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=32000, help="of the synthetic corpus (the preset's vocabulary)")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--device", default="cuda", help="cpu: a plumbing check with gloo")
    ap.add_argument("--set", nargs="*", default=[], help="more overrides (KEY=VALUE), after the ones above")
    ap.add_argument("--fsdp-variants", nargs="*", metavar="NAME", help=f"measure these in this process (under "
                    f"torchrun; none named: all of {', '.join(VARIANTS)}) and the checkpoint times")
    ap.add_argument("--baseline", help="--fsdp-variants: the one-GPU run's fsdp_variants.json (speed-ups, losses)")
    ap.add_argument("--no-checkpoint", action="store_true", help="--fsdp-variants: skip the checkpoint times")
    ap.add_argument("--profile", metavar="DIR", help="--fsdp-variants: profile two more steps of each variant "
                    "(kernel tables per rank into DIR; per-step GPU span, busy, exposed communication, optimiser "
                    "and idle ms into the result)")
    args = ap.parse_args()
    if args.fsdp_variants is not None:
        return variants_main(args)
    args.work = args.work or tempfile.mkdtemp(prefix="hgrn2_ddp_")
    tokens = (args.steps + 1) * args.batch * (args.seq_len + 1)
    corpus(os.path.join(args.work, "data"), args.vocab, tokens, 64 * (args.seq_len + 1))

    runs = {"1 GPU": train(args, "one", 1, "ddp")}
    for parallel in ("ddp", "fsdp"):
        runs[f"{args.nproc} GPU {parallel}"] = train(args, parallel, args.nproc, parallel)
    runs = {k: v for k, v in runs.items() if v}
    rows = [{"run": name, "tok_per_s": r["tok_per_s"], "val_loss": r["val_loss"],
             "max_rel_loss_diff_vs_1gpu": _max_diff(r["loss"], runs.get("1 GPU", {}).get("loss", {})),
             "loss": r["loss"]} for name, r in runs.items()]
    one = next((r["tok_per_s"] for r in rows if r["run"] == "1 GPU"), None)
    for r in rows:
        r["speedup_vs_1gpu"] = r["tok_per_s"] / one if one else None
    env = environment(args.device if args.device != "cuda" else "cuda:0", gpus=args.nproc)
    path = write_result(args.out, "ddp", env, rows, shlex.join(["python3", *sys.argv]),
                        args={k: v for k, v in vars(args).items() if k not in ("out", "work")},
                        torch_cuda_devices=torch.cuda.device_count())
    print(f"wrote {path}")

    names = list(runs)
    print(f"\n{args.preset} {' '.join(args.set)}, {args.batch}×{args.seq_len} tokens per step, micro {args.micro}")
    print("step " + "".join(f"{n:>14}" for n in names))
    ref = runs.get("1 GPU", {}).get("loss", {})
    for step in sorted(ref):
        if step in (1, 2, 5) or step % 5 == 0:
            print(f"{step:4d} " + "".join(f"{runs[n]['loss'].get(step, float('nan')):14.4f}" for n in names))
    for n in names:
        diff = _max_diff(runs[n]["loss"], ref)
        print(f"{n:>12}: tokens/s {runs[n]['tok_per_s']:9.0f}, final val loss {runs[n]['val_loss']}, "
              f"max rel. loss diff vs 1 GPU {'-' if diff is None else f'{diff:.2e}'}")


if __name__ == "__main__":
    main()
