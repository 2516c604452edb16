"""`hgrn2 mqar`: the paper's multi-query associative recall sweep (accuracy vs model width, one panel per length).

    hgrn2 mqar                                   # `laptop` on a CPU (minutes), `quick` on a GPU
    hgrn2 mqar --preset full --concurrent 8      # the paper's grid
    hgrn2 mqar --cuda-graph                      # each step replayed as one CUDA graph (GPU)
    hgrn2 mqar --mixers hgrn2 --dims 64 --seq-lens 64 --epochs 2 --train-examples 2000   # a smoke run
    hgrn2 mqar --report --out DIR                # table and figure of the runs finished in DIR, no training
    hgrn2 mqar --preset laptop --record          # also benchmarks/results/<device>/mqar.json for BENCHMARKS.md

Protocol (zoology, as the paper ran it; `hgrn2/configs/mqar.yaml`): data from `hgrn2.data.mqar` (bit-for-bit
zoology's), the model `hgrn2.models.zoology.ZoologyLM`, AdamW (weight decay 0.1), cosine over the epochs stepped
once per epoch (no warm-up), batches in a fixed order, bf16 autocast on CUDA, test accuracy (exact match per
query token, computed in fp32 as zoology does) after every epoch, early stop once it exceeds 0.99. The table
and the plot take, per (mixer, d, L), the max over learning rates of each run's final accuracy.

Each finished run is saved atomically as `OUT/runs/<run id>.json`; a sweep skips runs whose file says complete,
so a killed sweep continues where it stopped. A run in progress checkpoints after every epoch
(`OUT/checkpoints/<run id>/`: model, optimiser, schedule, history and RNG; each run trains on the engine,
`hgrn2.train.engine`) and continues from its last epoch exactly, so a run longer than one sitting finishes over
several (the checkpoint is deleted once the run is complete). `--concurrent N` trains N runs at once in worker
processes that share the GPU(s) (small models leave a GPU mostly idle), and `--max-minutes` stops the sweep in time:
runs cut by the budget are saved as incomplete (marked * in the table) and run again on the next call.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict
from multiprocessing import get_context
from pathlib import Path

import torch
import yaml
from tqdm.auto import tqdm

from hgrn2.bench.common import add_record_argument, command_of, environment, write_result
from hgrn2.data import mqar
from hgrn2.data.files import write_json
from hgrn2.experiments.sweep import best_device, finished_results, sweep
from hgrn2.models.device import device_name
from hgrn2.train.distributed import main_process
from hgrn2.train.mqar import RunSpec, train_run
from hgrn2.train.plot import pyplot

CONFIG_PATH = Path(__file__).resolve().parent.parent / "configs" / "mqar.yaml"


def load_config(path: str | Path = CONFIG_PATH) -> dict:
    with open(path) as f:
        return yaml.safe_load(f)


# ---------------------------------------------------------------------------------------------------------------
# the sweep


def _prepare_data(runs: list[RunSpec], data_dir, workers: int) -> None:
    """Draw (or find cached) every split the runs need, in parallel processes (the draws are sequential per split)."""
    jobs = sorted({(split, r.seq_len, r.kv_pairs, n, r.data_seed, r.vocab_size)
                   for r in runs for split, n in (("train", r.train_examples), ("test", r.test_examples))})
    # a worker process costs seconds to start (torch's import), about what 100,000 draws cost here
    if workers <= 1 or len(jobs) == 1 or sum(job[3] for job in jobs) < 100_000:
        for split, L, kv, n, seed, V in jobs:
            mqar.load(split, L, kv, n, data_seed=seed, vocab_size=V, cache_dir=data_dir)
        return
    with ProcessPoolExecutor(min(workers, len(jobs)), mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(mqar.load, split, L, kv, n, data_seed=seed, vocab_size=V, cache_dir=data_dir)
                   for split, L, kv, n, seed, V in jobs]
        for f in tqdm(as_completed(futures), total=len(futures), desc="MQAR data", leave=False):
            f.result()


def _epoch_line(record: dict) -> None:
    """The latest test accuracy of the run in training, above the progress bar (which names the run)."""
    tqdm.write(f"{record['run_id']}: epoch {record['epoch'] + 1}/{record['epochs']}, test accuracy "
               f"{record['accuracy']:.3f}")


def _summary_line(r: dict) -> str:
    s = r["spec"]
    flags = "".join(f" [{k}]" for k in ("early_stopped", "diverged") if r[k]) + ("" if r["complete"] else " [cut]")
    last = r["history"][-1]  # train loss far below test loss: the run memorised its examples
    # a diverged run's losses are NaN here, or null (None) in a result read back from its strict JSON
    train_loss, test_loss = (math.nan if last[k] is None else last[k] for k in ("train_loss", "test_loss"))
    return (f"{s['mixer']} d={s['d_model']} L={s['seq_len']} lr={s['lr']:g}: acc {r['final_accuracy']:.4f} "
            f"after {r['epochs_run']} epochs, train/test loss {train_loss:.2f}/{test_loss:.2f}, "
            f"{r['seconds']:.0f}s ({r['steps_per_second']:.0f} steps/s){flags}")


def run_sweep(runs: list[RunSpec], out: Path, device: str, concurrent: int = 1, data_dir=None,
              max_minutes: float | None = None, cuda_graph: bool = False) -> tuple[list[dict], int]:
    """Run (or resume) the sweep (`hgrn2.experiments.sweep`); returns the results and the number of failed runs."""
    # longest first (packs the workers better); mixers interleaved, so a budget cut leaves every mixer covered
    order = sorted(runs, key=lambda r: (-r.seq_len * r.train_examples * r.epochs, r.d_model, r.lr))
    options = dict(data_dir=data_dir, cuda_graph=cuda_graph, on_epoch=_epoch_line)
    results, errors = sweep(order, out, device, train_run, concurrent=concurrent, max_minutes=max_minutes,
                            name="MQAR", summary=_summary_line, options=options,
                            prepare=lambda todo: _prepare_data(todo, data_dir, workers=min(os.cpu_count() or 1, 8)))
    by_id = {r["run_id"]: r for r in results}
    return [by_id[r.run_id] for r in runs if r.run_id in by_id], errors


# ---------------------------------------------------------------------------------------------------------------
# reporting


def best_over_lrs(results: list[dict]) -> dict[tuple[str, int, int], dict]:
    """(mixer, d, L) -> the result with the highest final accuracy over learning rates."""
    best: dict[tuple[str, int, int], dict] = {}
    for r in results:
        s = r["spec"]
        key = (s["mixer"], s["d_model"], s["seq_len"])
        if key not in best or r["final_accuracy"] > best[key]["final_accuracy"]:
            best[key] = r
    return best


def table(results: list[dict], mixers, dims, seq_lens) -> str:
    """Accuracy table: rows mixer × d, columns L (max over learning rates of the final accuracy)."""
    best = best_over_lrs(results)
    kv = {r["spec"]["seq_len"]: r["spec"]["kv_pairs"] for r in results}
    titles = [f"L={L} kv={kv.get(L, '?')}" for L in seq_lens]
    w = max([16, *(len(m) + 2 for m in mixers)])
    head = f"{'mixer':<{w}}{'d':>5}" + "".join(f"{t:>15}" for t in titles)
    lines = ["MQAR test accuracy (max over learning rates of the final accuracy; * = cut by the budget, "
             "! = diverged)", head]
    for m in mixers:
        for d in dims:
            cells = []
            for L in seq_lens:
                r = best.get((m, d, L))
                cells.append("-" if r is None else f"{r['final_accuracy']:.3f}" + ("" if r["complete"] else "*")
                             + ("!" if r.get("diverged") else ""))
            lines.append(f"{m:<{w}}{d:>5}" + "".join(f"{c:>15}" for c in cells))
    return "\n".join(lines)


def plot(results: list[dict], mixers, dims, seq_lens, path: Path) -> Path | None:
    """The paper's figure: accuracy vs model dimension, one panel per sequence length."""
    plt = pyplot()
    if plt is None:
        return None
    best = best_over_lrs(results)
    fig, axes = plt.subplots(1, len(seq_lens), figsize=(3.6 * len(seq_lens), 3.2), sharey=True, squeeze=False)
    for ax, L in zip(axes[0], seq_lens):
        for m in mixers:
            pts = [(d, best[(m, d, L)]) for d in dims if (m, d, L) in best]
            if pts:
                line, = ax.plot([d for d, _ in pts], [r["final_accuracy"] for _, r in pts], marker="o", label=m)
                cut = [(d, r["final_accuracy"]) for d, r in pts if not r["complete"]]
                if cut:  # open markers: runs cut by the budget (the table's *)
                    ax.plot(*zip(*cut), "o", color=line.get_color(), markerfacecolor="white", zorder=3)
        kv = next((r["spec"]["kv_pairs"] for r in results if r["spec"]["seq_len"] == L), "?")
        ax.set(title=f"L={L}, kv={kv}", xlabel="model dimension", xscale="log", ylim=(-0.02, 1.02))
        ax.set_xticks(dims, [str(d) for d in dims])
        ax.minorticks_off()
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("accuracy" + (" (open: cut by the budget)" if any(not r["complete"] for r in best.values())
                                        else ""))
    axes[0][-1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------------------------------
# command line


def _csv(kind):
    """argparse type for lists given as `1 2 3` or `1,2,3`."""
    what = {int: "integers", float: "numbers"}.get(kind, "values")

    def parse(text: str) -> list:
        try:
            return [kind(x) for x in text.split(",") if x]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what} (space- or comma-separated), got {text!r}") from None

    return parse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", help="a preset of hgrn2/configs/mqar.yaml: laptop (default on a CPU), quick (default "
                                    "on a GPU) or full")
    p.add_argument("--config", default=str(CONFIG_PATH), help="the YAML file with the protocol and presets")
    p.add_argument("--mixers", type=_csv(str), nargs="+", help="token mixers, e.g. hgrn2 hgrn1_complex attention")
    p.add_argument("--dims", type=_csv(int), nargs="+", help="model widths, e.g. 64 128 256 512")
    p.add_argument("--lrs", type=_csv(float), nargs="+", help="learning rates, e.g. 1e-3 5e-3")
    p.add_argument("--seq-lens", type=_csv(str), nargs="+",
                   help="sequence lengths L (kv pairs from the protocol) or L:kv, e.g. 256 512 or 32:2")
    p.add_argument("--epochs", type=int, help="epochs (the protocol's 64 unless overridden for smoke runs)")
    p.add_argument("--train-examples", type=int, help="training examples per length (protocol: 100000)")
    p.add_argument("--test-examples", type=int, help="test examples per length (protocol: 3000)")
    p.add_argument("--batch-size", type=int, help="override the protocol's batch size for every length")
    p.add_argument("--vocab-size", type=int, help="override the protocol's vocabulary (8192), for smoke runs")
    p.add_argument("--mixer-options", type=json.loads, default={},
                   help='JSON merged into the mixer options, per mixer: \'{"hgrn2": {"backend": "triton"}}\'')
    p.add_argument("--seed", type=int, default=0, help="model initialisation seed")
    p.add_argument("--data-seed", type=int, help="zoology data seed (default 123)")
    p.add_argument("--out", default="runs/mqar", help="output folder (runs/*.json, results.json, table, plot)")
    p.add_argument("--data-dir", help="data cache folder (default ~/.cache/hgrn2/mqar, or $HGRN2_CACHE/mqar)")
    p.add_argument("--device", type=device_name, help="cuda, mps or cpu (default: the best present)")
    p.add_argument("--concurrent", type=int,
                   help="runs trained at once in worker processes sharing the device (default: 8 on CUDA, else 1)")
    p.add_argument("--max-minutes", type=float,
                   help="stop the sweep after this many minutes; cut runs are marked, and resumed by a rerun")
    p.add_argument("--cuda-graph", action="store_true",
                   help="replay each training step as one CUDA graph (these small models are launch-bound)")
    p.add_argument("--list", action="store_true", help="print the runs of the sweep and exit")
    add_record_argument(p)  # written once every run is complete
    p.add_argument("--report", action="store_true",
                   help="train nothing: the table, figure and results.json from the runs already finished in --out "
                        "(e.g. results gathered from several machines)")


def _flat(values):
    return None if values is None else [x for group in values for x in group]


def check_arguments(args: argparse.Namespace) -> None:
    """The command line's numbers and mixer names, refused in one line before any run starts."""
    from hgrn2.layers import TOKEN_MIXERS

    for mixer in _flat(args.mixers) or []:
        if mixer not in TOKEN_MIXERS and ":" not in mixer:
            raise ValueError(f"--mixers: unknown token mixer {mixer!r}; expected one of {sorted(TOKEN_MIXERS)} or "
                             f"module:Class")
    for name in ("dims", "epochs", "train_examples", "test_examples", "batch_size", "vocab_size", "concurrent"):
        for v in (_flat(args.dims) or []) if name == "dims" else [getattr(args, name)]:
            if v is not None and v < 1:
                raise ValueError(f"--{name.replace('_', '-')}: expected a positive number, got {v}")
    for lr in _flat(args.lrs) or []:
        if not (math.isfinite(lr) and lr > 0):
            raise ValueError(f"--lrs: expected positive finite learning rates, got {lr}")
    if args.max_minutes is not None and not (math.isfinite(args.max_minutes) and args.max_minutes > 0):
        raise ValueError(f"--max-minutes: expected a positive number of minutes, got {args.max_minutes}")


def build_runs(args: argparse.Namespace, cfg: dict) -> tuple[list[RunSpec], dict]:
    """The sweep's runs from the preset and the command-line overrides; also the resolved grid."""
    check_arguments(args)
    name = args.preset or "quick"
    if name not in cfg["presets"]:
        raise ValueError(f"--preset: expected one of {sorted(cfg['presets'])}, got {name!r}")
    proto, preset = cfg["protocol"], cfg["presets"][name]
    grid = {k: _flat(getattr(args, k)) or preset[k] for k in ("mixers", "dims", "lrs", "seq_lens")}
    lengths = []
    for item in grid["seq_lens"]:
        L, _, kv = str(item).partition(":")
        if not L.isdigit() or not (kv.isdigit() or not kv) or int(L) < 1:
            raise ValueError(f"--seq-lens: expected L or L:kv with positive integers, got {item!r}")
        L = int(L)
        if not kv and L not in proto["kv_pairs"]:
            raise ValueError(f"--seq-lens: {L} is not in the protocol {sorted(proto['kv_pairs'])}; give it as L:kv")
        kv = int(kv) if kv else proto["kv_pairs"][L]
        try:
            mqar.check_lengths(L, kv)
        except ValueError as e:
            raise ValueError(f"--seq-lens: {item}: {e}") from None
        lengths.append((L, kv))
    grid["seq_lens"] = [L for L, _ in lengths]

    def pick(name, default, fields=preset):
        value = getattr(args, name, None)
        return value if value is not None else fields.get(name, default)

    runs = []
    for mixer in grid["mixers"]:
        options = {**cfg["mixers"].get(mixer, {}), **args.mixer_options.get(mixer, {})}
        fields = {**preset, **preset.get("per_mixer", {}).get(mixer, {})}  # a preset's fields for one mixer
        for L, kv in lengths:
            batch = (args.batch_size or fields.get("batch_size") or proto["batch_size"].get(L)
                     or (512 if L <= 128 else 256 if L <= 256 else 128))
            for d in grid["dims"]:
                opts = dict(options)
                if "expand_ratio" in opts:  # the paper's head dimension: min(d, 128)
                    opts["expand_ratio"] = min(d, opts["expand_ratio"])
                for lr in _flat(args.lrs) or fields["lrs"]:
                    runs.append(RunSpec(
                        mixer=mixer, d_model=d, seq_len=L, kv_pairs=kv, lr=float(lr), batch_size=batch,
                        epochs=pick("epochs", proto["epochs"], fields),
                        train_examples=pick("train_examples", proto["train_examples"], fields),
                        test_examples=pick("test_examples", proto["test_examples"], fields),
                        vocab_size=pick("vocab_size", proto["vocab_size"], fields),
                        data_seed=pick("data_seed", proto["data_seed"], fields), seed=args.seed,
                        weight_decay=proto["weight_decay"], early_stop_accuracy=proto["early_stop_accuracy"],
                        mixer_options=opts))
    grid["max_minutes"] = pick("max_minutes", None)
    return runs, grid


def write_record(args: argparse.Namespace, results: list[dict], device: str, figure: Path | None,
                 wall_seconds: float | None) -> Path:
    """The sweep as a benchmark record (`hgrn2.bench.common.write_result`) at `args.record`/mqar.json, the figure
    copied beside it. `wall_seconds`: the whole command's time, when it trained every run itself."""
    env = environment(device)
    keys = ("final_accuracy", "best_accuracy", "epochs_run", "complete", "steps", "seconds", "steps_per_second")
    rows = [dict(run_id=r["run_id"], **{k: r["spec"][k] for k in ("mixer", "d_model", "seq_len", "kv_pairs", "lr")},
                 **{k: r[k] for k in keys}, commit=env["commit"], date=env["date"], spec=r["spec"]) for r in results]
    extra = dict(threads=torch.get_num_threads()) if not device.startswith("cuda") else {}
    if wall_seconds is not None:
        extra["wall_seconds"] = round(wall_seconds, 1)
    return write_result(args.record or None, "mqar", env, rows, command_of(args), figure=figure, **extra)


def run(args: argparse.Namespace) -> int:
    start = time.time()
    cfg = load_config(args.config)
    device = args.device or best_device()
    if args.preset is None:
        args.preset = "quick" if device.startswith("cuda") else "laptop"
    runs, grid = build_runs(args, cfg)
    out = Path(args.out)
    if args.list:
        for r in runs:
            print(r.run_id, json.dumps(asdict(r), sort_keys=True))
        return 0
    concurrent = args.concurrent or (min(8, len(runs)) if device.startswith("cuda") else 1)
    if args.cuda_graph and not device.startswith("cuda"):
        raise ValueError(f"--cuda-graph: needs a CUDA device, got --device {device}")
    trained_before = args.record is not None and any(r["complete"] for r in finished_results(runs, out))
    if args.report:
        results, errors = finished_results(runs, out), 0
        for r in results:
            print(_summary_line(r))
    else:
        results, errors = run_sweep(runs, out, device, concurrent, args.data_dir, grid["max_minutes"],
                                    args.cuda_graph)
        if not main_process():  # torchrun: rank 0 writes the tables
            return 1 if errors else 0
    text = table(results, grid["mixers"], grid["dims"], grid["seq_lens"])
    print("\n" + text)
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.txt").write_text(text + "\n")
    write_json(out / "results.json", results)
    figure = plot(results, grid["mixers"], grid["dims"], grid["seq_lens"], out / "mqar.png")
    print(f"\nresults: {out / 'results.json'} (one JSON per run in {out / 'runs'})"
          + (f"; figure: {figure}" if figure else ""))
    missing = len(runs) - sum(1 for r in results if r["complete"])
    if missing:
        again = "without --report" if args.report else "again"
        print(f"{missing} of {len(runs)} runs are not complete: run the same command {again} to continue")
    elif args.record is not None:
        wall = None if args.report or trained_before else time.time() - start
        print(f"record: {write_record(args, results, device, figure, wall)}")
    return 1 if errors else 0


__all__ = ["RunSpec", "train_run", "run_sweep", "table", "plot", "write_record", "build_runs",
           "add_arguments", "run"]
