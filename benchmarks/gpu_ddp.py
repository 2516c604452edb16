"""Do DDP and FSDP2 on several GPUs give the one-GPU loss curve, and how do they scale?

The 0.15b preset in bf16 on one GPU with gradient accumulation, then on --nproc GPUs under torchrun with DDP and
with FSDP2, same global batch, same data: per-step losses side by side, and tokens/s (median of each run's second
half). A standalone tool, not an `hgrn2 bench` command: it launches `hgrn2 train` under torchrun.

    python3 benchmarks/gpu_ddp.py [--steps 40] [--preset hgrn2-0.15b] [--nproc 2] [--work DIR] [--out DIR]

The corpus is synthetic (a noisy periodic source over the preset's vocabulary, so the loss falls), written to
--work (default: a temporary folder) with each run's log.jsonl; the result goes to --out (default
benchmarks/results/<device>x<nproc>/)/ddp.json.
"""

from __future__ import annotations

import argparse
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
    args = ap.parse_args()
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
