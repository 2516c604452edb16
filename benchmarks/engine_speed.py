"""Are the tasks as fast on the one training engine as on the loops it replaced?

Each task's own command, once from an older tree (--base-dir: an exported `hgrn2/` of a commit before the engine)
and once from this one, on the same GPU in one call, the runs of a round one after the other and rounds repeated:
the language model's tokens/s (the hgrn2-0.15b preset on a synthetic corpus), LRA ListOps' training steps/s and
image training's steps/s (the fashion_mnist preset at batch 128). Rows: the eager step, and the CUDA-graph step
(ListOps and images: against the base's eager step, since their loops had no graph; ListOps' graph step pads every
batch to the whole length).

    git archive 9f13181 hgrn2 | tar x -C /tmp/base      # the commit before the engine's first
    python3 benchmarks/engine_speed.py --base-dir /tmp/base [--rounds 2] [--tasks lm,lra,vision]

Each run is a subprocess with PYTHONPATH set to its tree. Its speed comes from its own log.jsonl, which both trees
write the same way: the "train" records' step and time, over the intervals of the run's second half (compiling and
the allocator's warm-up fall in the first) that hold no evaluation; the median interval's steps/s. The result goes
to --out (default benchmarks/results/<device>/)engine_speed.json, rewritten after each task; `--add` keeps the rows of
the tasks not run now from the record already there (one measurement split over calls). A CPU check: --device cpu
--quick (tiny shapes, the record marked quick).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hgrn2.bench.common import add_output_argument, command_of, environment, format_table, write_result  # noqa: E402

FASHION_MNIST = "/usr/share/datasets/fashion-mnist"


def steps_per_s(log: Path) -> float:
    """Median steps/s over consecutive "train" records of the log's second half with no other record between."""
    rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    rates = []
    for a, b in zip(rows, rows[1:]):
        if a.get("kind") == b.get("kind") == "train" and b["step"] > a["step"] and b["time"] > a["time"]:
            rates.append((b["step"] - a["step"]) / (b["time"] - a["time"]))
    if not rates:
        raise ValueError(f"{log}: no two consecutive train records to time")
    return float(np.median(rates[len(rates) // 2:]))


def lm_run(which: str, work: Path, out: Path, args, graph: bool | None) -> tuple[list[str], Path, int]:
    preset, steps = ("tiny", 24) if args.quick else ("hgrn2-0.15b", 60)
    batch, seq = (4, 128) if args.quick else (16, 2048)
    sets = [f"data={work / 'corpus'}", f"out_dir={out}", f"max_steps={steps}", f"batch_size={batch}",
            f"micro_batch_size={batch}", f"seq_len={seq}", "log_every=4", "eval_every=0", "eval_sequences=4",
            "save_every=0", "resume=false", "progress=false", "tensorboard=false", f"device={args.device}",
            *([] if graph is None else [f"cuda_graph={str(graph).lower()}"])]
    return ["train", "--config", preset, "--set", *sets], out / "log.jsonl", batch * seq


def lra_run(which: str, work: Path, out: Path, args, graph: bool | None) -> tuple[list[str], Path, int]:
    steps, examples = (12, 600) if args.quick else (240, 40000)  # below one epoch: no evaluation in between
    return (["lra", "listops", "--models", "hgrn2", "--out", str(out), "--examples", str(examples),
             "--max-steps", str(steps), "--log-every", "3" if args.quick else "20", "--device", args.device,
             *(["--batch-size", "4"] if args.quick else []),
             "--data-dir", str(work / f"lra-data-{which}"),
             "--workers", str(args.workers), *(["--cuda-graph"] if graph else [])],
            out / "listops-hgrn2" / "log.jsonl", 1)


def vision_run(which: str, work: Path, out: Path, args, graph: bool | None) -> tuple[list[str], Path, int]:
    steps, batch = (12, 8) if args.quick else (300, 128)
    sets = [f"data={args.fashion_mnist}", "epochs=1", f"max_steps_per_epoch={steps}", f"batch_size={batch}",
            f"lr_batch={batch}", f"out_dir={out}", "log_every=3" if args.quick else "log_every=20",
            "num_workers=0", f"device={args.device}", *([] if graph is None else [f"cuda_graph={str(graph).lower()}"])]
    return ["vision", "train", "--config", "fashion_mnist", "--set", *sets], out / "log.jsonl", 1


TASKS = {"lm": ("language model hgrn2-0.15b", "tokens/s", lm_run),
         "lra": ("LRA ListOps hgrn2", "steps/s", lra_run),
         "vision": ("image training fashion_mnist", "steps/s", vision_run)}
# per task, the rows: (step, the base tree's cuda_graph, this tree's); None: the key is not passed (the base's loop
# had none; ListOps' graph pads every batch to the whole length, against the base's eager step on trimmed batches)
ROWS = {"lm": [("eager", False, False), ("CUDA graph", True, True)],
        "lra": [("eager", None, None), ("CUDA graph", None, True)],
        "vision": [("eager", None, False), ("CUDA graph", None, True)]}


def run_once(task: str, which: str, tree: str, graph: bool | None, work: Path, args, k: int) -> float:
    out = work / f"{task}-{which}-{graph}-{k}"
    cli, log, scale = TASKS[task][2](which, work, out, args, graph)
    env = dict(os.environ, PYTHONPATH=tree)
    start = time.time()
    p = subprocess.run([sys.executable, "-m", "hgrn2.cli", *cli], cwd=work, env=env, capture_output=True, text=True)
    if p.returncode:
        raise RuntimeError(f"{task} from {tree}: exit {p.returncode}: {(p.stderr or p.stdout)[-3000:]}")
    rate = steps_per_s(log) * scale
    print(f"{task} {which} graph={graph}: {rate:.1f} {TASKS[task][1]} ({time.time() - start:.0f} s)", flush=True)
    return rate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-dir", required=True, help="folder holding the older tree's hgrn2/ package")
    ap.add_argument("--base-label", help="what the base is, for the record (default: --base-dir), e.g. its commit")
    ap.add_argument("--tasks", default="lm,lra,vision", help="comma-separated: " + ", ".join(TASKS))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--workers", type=int, default=8, help="processes generating the ListOps data")
    ap.add_argument("--fashion-mnist", default=FASHION_MNIST, help="folder of the four Fashion-MNIST idx files")
    ap.add_argument("--quick", action="store_true", help="tiny shapes and few steps (a smoke run, marked quick)")
    ap.add_argument("--work", help="folder for the runs (default: a temporary one)")
    ap.add_argument("--add", action="store_true",
                    help="keep the other tasks' rows of the record in --out (a measurement split over several calls)")
    add_output_argument(ap)
    args = ap.parse_args()
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        ap.error(f"--tasks: unknown {unknown}; choose from {', '.join(TASKS)}")
    base = Path(args.base_dir).resolve()
    if not (base / "hgrn2" / "__init__.py").is_file():
        ap.error(f"--base-dir: {base} holds no hgrn2/__init__.py")
    if args.rounds < 1:
        ap.error("--rounds: at least 1")
    if "vision" in tasks and not Path(args.fashion_mnist).is_dir():
        ap.error(f"--fashion-mnist: no folder {args.fashion_mnist} (Debian package dataset-fashion-mnist)")
    args.fashion_mnist = str(Path(args.fashion_mnist).resolve())  # the runs start in their own folder
    kept, command = _kept_rows(args, tasks) if args.add else ([], command_of(args))
    env = environment(args.device)
    rows = list(kept)
    with tempfile.TemporaryDirectory(prefix="engine-speed-") as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        if "lm" in tasks:
            from gpu_ddp import corpus

            corpus(str(work / "corpus"), vocab=256 if args.quick else 32000, n_train=4_000_000, n_val=50_000)
        for task in tasks:  # the record is rewritten after each task: a run cut short keeps the tasks it finished
            rows += measure([task], str(base), work, args)
            path = write_result(args.out, "engine_speed", env, rows, command, quick=args.quick,
                                base=args.base_label or str(args.base_dir), rounds=args.rounds)
    print(format_table(rows, COLUMNS))
    print(f"wrote {path}")


def _kept_rows(args, tasks: list[str]) -> tuple[list[dict], str]:
    """--add: the rows of the record at --out of the tasks not run now (same base and rounds), and both commands."""
    path = Path(args.out or "") / "engine_speed.json" if args.out else None
    if path is None or not path.is_file():
        raise SystemExit(f"--add: no engine_speed.json in --out {args.out!r} to add to")
    rec = json.loads(path.read_text())
    same = (rec.get("base"), rec.get("rounds"), rec.get("quick")) == (args.base_label or str(args.base_dir),
                                                                        args.rounds, args.quick)
    if not same:
        raise SystemExit(f"--add: {path} was measured with another --base-dir, --rounds or --quick")
    now = {TASKS[t][0] for t in tasks}
    return [r for r in rec["rows"] if r["task"] not in now], f"{rec['command']} && {command_of(args)}"


COLUMNS = [("task", "task", ""), ("this tree's step", "step", ""), ("unit", "unit", ""), ("base", "base", ".1f"),
           ("this tree", "tree", ".1f"), ("÷ base", "ratio", ".3f")]


def measure(tasks: list[str], base: str, work: Path, args) -> list[dict]:
    """Per task and row: the median over rounds of the base tree's and this tree's runs, each round running every
    run of the task once (a run two rows share is run once)."""
    rows = []
    for task in tasks:
        table = [r for r in ROWS[task] if r[2] is not True or args.device == "cuda"]
        runs = list(dict.fromkeys([("base", g) for _, g, _ in table] + [("tree", g) for _, _, g in table]))
        rates: dict = {run: [] for run in runs}
        for k in range(args.rounds):
            for which, graph in runs:
                tree = base if which == "base" else str(ROOT)
                rates[(which, graph)].append(run_once(task, which, tree, graph, work, args, k))
        for step, base_graph, tree_graph in table:
            b, t = rates[("base", base_graph)], rates[("tree", tree_graph)]
            rows.append({"task": TASKS[task][0], "step": step, "unit": TASKS[task][1], "base": float(np.median(b)),
                         "tree": float(np.median(t)), "ratio": float(np.median(t) / np.median(b)),
                         "base_rounds": b, "tree_rounds": t})
    return rows


if __name__ == "__main__":
    main()
