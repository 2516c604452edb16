"""`hgrn2 bench lra-share`: training steps/s of an LRA preset when several runs share one GPU.

`hgrn2 lra --concurrent N` trains N runs at once in worker processes: an LRA model is small, so one run alone
leaves the GPU waiting on its host. This times the preset's training step (forward, backward, AdamW; random inputs
of the task's shape, LRA's lengths for ListOps) in one process alone, then in N processes started together, and
with `--mps` in N processes under NVIDIA MPS (the daemon started for that phase and stopped after), each process
timing `--steps` steps once all have warmed up. Processes on one GPU without MPS take turns on it; under MPS their
kernels run side by side.

    hgrn2 bench lra-share --processes 3 --mps
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from hgrn2.data.lra import tasks as lra_tasks
from hgrn2.models.lra import MIXERS
from hgrn2.train.mps import CONTROL, mps_daemon

from .common import add_output_argument, command_of, environment, format_table, write_result
from .report import LRA_SHARE_COLUMNS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task", default="listops", help="LRA task whose preset is timed (default listops)")
    parser.add_argument("--model", default="hgrn2", choices=MIXERS, help="its model (default hgrn2)")
    parser.add_argument("--processes", type=int, default=3, help="runs sharing the device (default 3)")
    parser.add_argument("--steps", type=int, default=60, help="timed steps per process (default 60)")
    parser.add_argument("--mps", action="store_true",
                        help="also time the processes under NVIDIA MPS (started and stopped by the command)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="a tiny model, 2 processes, 3 steps (a smoke run)")
    add_output_argument(parser)


def run(args: argparse.Namespace) -> int:
    if args.quick:
        args.processes, args.steps = 2, 3
    if lra_tasks.check_task(args.task).dual:
        print(f"hgrn2 bench lra-share: error: --task: {args.task}'s pairs of documents are not timed here",
              file=sys.stderr)
        return 2
    for name in ("processes", "steps"):
        if getattr(args, name) < 1:
            print(f"hgrn2 bench lra-share: error: --{name}: expected at least 1, got {getattr(args, name)}",
                  file=sys.stderr)
            return 2
    if args.mps and (torch.device(args.device).type != "cuda" or shutil.which(CONTROL) is None):
        print("hgrn2 bench lra-share: error: --mps: needs a CUDA device and nvidia-cuda-mps-control on the PATH",
              file=sys.stderr)
        return 2
    phases = [("alone", 1, False), ("shared", args.processes, False)]
    phases += [("MPS", args.processes, True)] * args.mps
    rows = []
    for phase, n, mps in phases:
        each = _phase(args, n, mps)
        rows.append({"phase": phase, "processes": n, "steps_per_s": each, "each": " / ".join(f"{s:.2f}" for s in each),
                     "total": sum(each)})
        print(f"{phase}: {rows[-1]['each']} steps/s", flush=True)
    for r in rows:
        r["vs_alone"] = r["total"] / rows[0]["total"]
    note = (f"{args.task} preset, {args.model}; {args.steps} timed steps per process after warm-up, all processes "
            "timing at once")
    path = write_result(args.out, "lra_share", environment(args.device), rows, command_of(args), quick=args.quick,
                        note=note)
    print(f"wrote {path}")
    print(format_table(rows, LRA_SHARE_COLUMNS))
    return 0


def _phase(args: argparse.Namespace, n: int, mps: bool) -> list[float]:
    """Steps/s of each of `n` worker processes (`python -m hgrn2.bench.lra_share`), under MPS when `mps`."""
    with tempfile.TemporaryDirectory() as tmp, mps_daemon() if mps else contextlib.nullcontext():
        spec = json.dumps({"task": args.task, "model": args.model, "device": args.device, "steps": args.steps,
                           "quick": args.quick, "world": n, "barrier": tmp})
        procs = [subprocess.Popen([sys.executable, "-m", "hgrn2.bench.lra_share", spec, str(rank)],
                                  stdout=subprocess.PIPE, text=True) for rank in range(n)]
        outs = [p.communicate()[0] for p in procs]
    failed = [rank for rank, p in enumerate(procs) if p.returncode != 0]
    if failed:
        raise RuntimeError(f"lra-share worker(s) {failed} failed (their errors are above)")
    return [json.loads(out.strip().splitlines()[-1])["steps_per_s"] for out in outs]


def _worker(spec: dict, rank: int) -> None:
    """Build the preset's model and optimiser, warm up, wait for every process at the barrier, time the steps."""
    import hgrn2.train.lra as lra
    from hgrn2.models.lra import LRAClassifier

    parser = argparse.ArgumentParser()
    lra.add_run_arguments(parser)
    opts = ["--model-options", json.dumps({"hidden_size": 8, "num_layers": 1})] if spec["quick"] else []
    cfg, tr, _ = lra.build(spec["task"], spec["model"], parser.parse_args(opts))
    device = torch.device(spec["device"])
    batch, length = (2, 64) if spec["quick"] else (tr["batch_size"], lra_tasks.TASKS[spec["task"]].max_len)
    g = torch.Generator().manual_seed(rank)
    y = torch.randint(0, cfg.num_classes, (batch,), generator=g).to(device)
    if cfg.vocab_size is None:  # pixels: whole images, as batch_tensors gives them
        x, mask = torch.rand(batch, length, cfg.in_channels, generator=g).to(device), None
    else:  # tokens: lengths as LRA's ListOps draws them (else a quarter to all of max_len), padded to the longest
        low, high = (501, 2000) if spec["task"] == "listops" and not spec["quick"] else (length // 4, length)
        lengths = torch.randint(low, high + 1, (batch,), generator=g)
        x = torch.randint(1, cfg.vocab_size, (batch, int(lengths.max())), generator=g).to(device)
        mask = (torch.arange(x.shape[1])[None] < lengths[:, None]).to(device)
    torch.manual_seed(0)
    model = LRAClassifier(cfg).to(device)
    opt = lra.build_lra_optimizer(model, tr["lr"], tr["weight_decay"])
    amp = device.type == "cuda" and tr["precision"] == "bf16"

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, torch.bfloat16, enabled=amp):
            logits = model(x, mask).float()
        F.cross_entropy(logits, y).backward()
        opt.step()

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    for _ in range(2 if spec["quick"] else 8):
        step()
    sync()
    barrier = Path(spec["barrier"])
    (barrier / f"ready-{rank}").touch()
    while len(list(barrier.glob("ready-*"))) < spec["world"]:
        time.sleep(0.01)
    start = time.perf_counter()
    for _ in range(spec["steps"]):
        step()
    sync()
    print(json.dumps({"steps_per_s": spec["steps"] / (time.perf_counter() - start)}))


if __name__ == "__main__":
    _worker(json.loads(sys.argv[1]), int(sys.argv[2]))
