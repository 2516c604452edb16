"""`hgrn2 lra TASK...`: train and evaluate Long Range Arena classifiers with the authors' per-task presets.

    hgrn2 lra listops pathfinder --models hgrn2 hgrn1 --out runs/lra --max-minutes 60
    torchrun --nproc-per-node 4 -m hgrn2.cli lra pathx --out runs/lra
    hgrn2 lra listops --variants preset mask-padding layernorm --out runs/abl   # the preset's ablation variants
    hgrn2 lra listops --seed 2222 1 2 --concurrent 3 --mps --out runs/lra # three runs side by side on one GPU
    hgrn2 lra --report --out runs/lra            # the paper-style table and the curves
    hgrn2 lra --report --out runs/lra --record   # also benchmarks/results/<device>/lra.json with the curves
    hgrn2 lra --report --out runs/lra --record --keep-recorded  # ... keeping its rows of runs not under runs/lra

Each (task, model) run lives in `<out>/<task>-<model>/`: `result.json` (settings, learning curve per epoch: train
loss and accuracy, validation and test accuracy; time per epoch; the best validation accuracy and the test accuracy
at that epoch, as LRA reports), `log.jsonl` (the running epoch loss every `--log-every` steps), and
checkpoints under `ckpt/` (every `--ckpt-every` steps, at each epoch end and when a time or step limit stops the
run). Running the same command again resumes exactly: model, optimiser, step, data order and random state; with
other settings it is refused (more `--epochs` excepted), and a run already past `--epochs` or `--max-steps` trains
nothing. A step whose loss or gradient norm is not finite stops the run before anything of it is saved.
`result.json` holds the environment of the machine that trained the run (device, versions, commit), which
`--record` writes into the record wherever it runs; each row names the commit its run trained at.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import multiprocessing
import os
from pathlib import Path

import numpy as np
import torch

from hgrn2.bench.common import (
    RESULTS_DIR,
    SEEDS_NOTE,
    add_record_argument,
    best_val_reading,
    command_of,
    lra_run_label,
    runs_environment,
    seeds_cell,
    write_result,
)
from hgrn2.data.lra import tasks as lra_tasks
from hgrn2.models.lra import MIXERS
from hgrn2.train import distributed
from hgrn2.train.lra import (
    PAPER,
    PAPER_ORDER,
    PRESET,
    SEED_DEFAULTS,
    add_run_arguments,
    build,
    check_at_least,
    load_options,
    load_preset,
    run_name,
    settings_of,
    train_run,
)
from hgrn2.train.mps import mps_daemon
from hgrn2.train.plot import pyplot


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("tasks", nargs="*", help=f"tasks: {', '.join(lra_tasks.TASKS)}")
    p.add_argument("--models", nargs="+", default=["hgrn2"], choices=MIXERS, help="encoders to train (default hgrn2)")
    p.add_argument("--variants", nargs="+", metavar="NAME",
                   help=f"ablation variants from the preset's `variants` section, one run each into "
                        f"TASK-MODEL+NAME/ ({PRESET!r}: the preset itself, into TASK-MODEL/); default: {PRESET}")
    add_run_arguments(p)
    p.add_argument("--concurrent", type=int, default=1, metavar="N",
                   help="train N of the runs (models, variants, seeds) at once in worker processes sharing the "
                        "device, spread over the GPUs when there are several (default 1: one after the other)")
    p.add_argument("--mps", action="store_true",
                   help="with --concurrent on a GPU: run the workers under an NVIDIA MPS daemon that the command "
                        "starts and stops, so that their kernels share the GPU instead of taking turns on it")
    p.add_argument("--prepare-data", action="store_true",
                   help="generate (or check) the tasks' data sets, ListOps' token caches included, and stop: to "
                        "prepare them on a CPU machine, or once before runs start")
    p.add_argument("--report", action="store_true", help="print the table over the runs in --out and plot curves")
    add_record_argument(p)
    p.add_argument("--keep-recorded", action="store_true",
                   help="with --record: keep the existing record's rows of runs that are not under --out (a row of "
                        "a run under --out replaces its old one), with the commits they trained at, and draw their "
                        "curves (dashed) in its figure")


def results_in(out: str | Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(Path(out).glob("*/result.json"))]


def _run_key(result: dict) -> tuple[str, str, str | None]:
    """(model, whose settings, variant) of a result.json; one written before `--settings-of` used its model's own,
    one written before `--variants` none."""
    return result["model"], result.get("settings_of", result["model"]), result.get("variant")


def report(out: str | Path) -> str:
    """The paper-style table (test accuracy at the best validation epoch, %) over the runs under `out`."""
    results = results_in(out)
    names = ("ListOps", "Text", "Retrieval", "Image", "Pathfinder", "Path-X")
    rows = [f"| model | {' | '.join(names)} | Avg |", "|---" * (len(names) + 2) + "|"]
    for label, values in PAPER.items():
        rows.append(f"| {label} | " + " | ".join(f"{v:.2f}" for v in values) + f" | {np.mean(values):.2f} |")
    for key in dict.fromkeys(map(_run_key, results)):
        cells = []
        for task in PAPER_ORDER:
            runs = [r for r in results if _run_key(r) == key and r["task"] == task]
            cells.append(seeds_cell([(r["test_acc_at_best_val"], r["epochs_done"], r["train"]["epochs"])
                                     for r in runs]) or "–")
        rows.append(f"| {lra_run_label(*key)} (here) | " + " | ".join(cells) + " | |")
    rows.append(f"\n({SEEDS_NOTE})")
    return "\n".join(rows)


def gpu_minutes(result: dict) -> np.ndarray:
    """GPU-minutes spent by the end of each epoch of a run's history: each epoch's wall time (training and
    evaluation) times the run's GPUs, summed."""
    return np.cumsum([h["epoch_time"] for h in result["history"]]) * result.get("world_size", 1) / 60


def plot(out: str | Path, recorded: list[dict] = ()) -> Path | None:
    """Validation accuracy per epoch (top) and against GPU-minutes (bottom: each epoch's wall time, training and
    evaluation, times the run's GPUs), one column per task, one line per run; None without matplotlib or runs.
    `recorded`: rows of a record (`--keep-recorded`) drawn dashed beside the runs, their epochs at the run's mean
    time per epoch (a record keeps no per-epoch times)."""
    results = results_in(out) + [_as_result(r) for r in recorded if r.get("curve") and not r.get("read_from_preset")]
    plt = pyplot() if results else None
    if plt is None:
        return None
    task_list = [t for t in (*PAPER_ORDER, "fashion_mnist") if any(r["task"] == t for r in results)]
    fig, axes = plt.subplots(2, len(task_list), figsize=(5.5 * len(task_list), 7), squeeze=False)
    colors = plt.get_cmap("tab20").colors  # more runs than tab10's ten colours
    for col, task in enumerate(task_list):
        by_epoch, by_minutes = axes[0][col], axes[1][col]
        runs = [r for r in results if r["task"] == task and r["history"]]
        for k, r in enumerate(runs):
            label = lra_run_label(*_run_key(r), r.get("seed")) + (" (recorded)" if r.get("recorded") else "")
            style = dict(label=label, color=colors[k % len(colors)], linestyle="--" if r.get("recorded") else "-")
            val = [h["val_acc"] for h in r["history"]]
            minutes = gpu_minutes(r)
            by_epoch.plot([h["epoch"] for h in r["history"]], val, **style)
            by_minutes.plot(minutes, val, **style)
        by_epoch.set(title=task, xlabel="epoch", ylabel="val accuracy")
        by_minutes.set(xlabel="GPU-minutes (a shared GPU counts whole)", ylabel="val accuracy")
        if runs:  # no finished epoch yet: empty panels
            by_minutes.legend(fontsize="x-small", loc="lower right")
    path = Path(out) / ("curves+recorded.png" if recorded else "curves.png")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _as_result(row: dict) -> dict:
    """A record's row as `plot` reads a run's result.json."""
    history = [{"epoch": e, "val_acc": val, "test_acc": test, "epoch_time": row["time_per_epoch_s"] or 0.0}
               for e, val, test in row["curve"]]
    return {"task": row["task"], "model": row["model"], "settings_of": row["settings"], "variant": row["variant"],
            "seed": row["seed"], "world_size": row.get("world_size", 1), "history": history, "recorded": True}


def _check_limits(args: argparse.Namespace) -> None:
    # the fewest examples (images) that leave each split one: ListOps holds out 2 %, Pathfinder 10 % twice
    for flag, low in (("examples", 3), ("images", 10), ("workers", 1), ("concurrent", 1), ("max_minutes", None),
                      ("max_steps", 1), ("ckpt_every", 0), ("log_every", 1), ("data_seed", 0)):
        check_at_least(flag, getattr(args, flag), low)
    for seed in _seeds(args):
        check_at_least("seed", seed, 0)


def _seeds(args: argparse.Namespace) -> list[int]:
    """--seed's values, each once, in order (an int where a caller built the namespace with one)."""
    return list(dict.fromkeys(args.seed if isinstance(args.seed, list | tuple) else [args.seed]))


def _check_graphable(built: dict) -> None:
    """A CUDA graph replays one shape: token batches keep their task's whole length, the positions past a batch's
    longest sequence masked, and per-group BatchNorm statistics (bn_group) would count those positions."""
    for (task, _, _), (cfg, _, _) in built.items():
        if cfg.vocab_size is not None and cfg.bn_group is not None:
            raise ValueError(f"`--cuda-graph`: task {task!r} with bn_group {cfg.bn_group}: its batches would be padded "
                             "to the whole length, and per-group BatchNorm statistics cannot leave that padding out")


def run(args: argparse.Namespace) -> int:
    if getattr(args, "keep_recorded", False) and args.record is None:
        raise ValueError("`--keep-recorded`: keeps rows of the record that --record writes; give --record too")
    if args.report:
        print(report(args.out))
        path = plot(args.out)
        if path:
            print(f"wrote {path}")
        if args.record is not None:
            print(f"wrote record {record_results(args, path)}")
        return 0
    if not args.tasks:
        raise ValueError("`tasks`: give at least one task (or --report)")
    _check_limits(args)
    # every setting is checked before any data is generated
    variants = [None if v == PRESET else v for v in dict.fromkeys(args.variants or [PRESET])]
    runs = [(task, variant, mixer) for task in args.tasks for variant in variants for mixer in args.models]
    built = {(task, variant, mixer): build(task, mixer, args, variant) for task, variant, mixer in runs}
    batches = sorted({tr["batch_size"] for _, tr, _ in built.values()})
    if args.cuda_graph:
        _check_graphable(built)
    jobs = [(task, mixer, variant, seed) for task, variant, mixer in runs for seed in _seeds(args)]
    if getattr(args, "prepare_data", False):
        for task, load in _data_sets(jobs, built, args):
            data = lra_tasks.load(task, **load)
            sizes = " / ".join(f"{len(data[s].labels):,}" for s in ("train", "val", "test"))
            print(f"{task}: {sizes} examples (train / val / test), fingerprint {lra_tasks.fingerprint(data)}")
        return 0
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if getattr(args, "mps", False) and not (args.concurrent > 1 and len(jobs) > 1 and cuda):
        raise ValueError("`--mps`: shares a GPU between the worker processes of --concurrent N (N > 1, several runs, "
                         "a CUDA device)")
    if args.concurrent > 1 and len(jobs) > 1:
        summary = _train_side_by_side(jobs, built, args, cuda)
        _print_summary(summary)
        if args.record is not None:
            print(f"wrote record {record_results(args, plot(args.out))}")
        return 1 if len(summary) < len(jobs) else 0
    d = distributed.init(args.device)
    if args.cuda_graph and (d.device.type != "cuda" or d.world > 1):
        raise ValueError(f"`--cuda-graph`: needs one CUDA device, got {d.world} process(es) on {d.device}")
    summary = []
    try:
        for batch in batches:
            if batch % d.world:
                raise ValueError(f"`--batch-size`: {batch} is not divisible by the {d.world} processes")
        for task, mixer, variant, seed in jobs:
            summary.append(train_run(task, mixer, argparse.Namespace(**{**vars(args), "seed": seed}), d, variant))
    finally:
        distributed.shutdown()
    if d.main:
        _print_summary(summary)
        if args.record is not None:
            print(f"wrote record {record_results(args, plot(args.out))}")
    return 0


def _print_summary(summary: list[dict]) -> None:
    print("| task | model | params | epochs | best val | test at best val | s/epoch | stopped |")
    print("|---|---|---|---|---|---|---|---|")
    def fmt(v):
        return "–" if v is None else f"{v:.4f}"

    for r in summary:
        best = r["best_val_acc"]
        sec = r["time_per_epoch_s"]
        label = lra_run_label(*_run_key(r), r.get("seed"))
        print(f"| {r['task']} | {label} | {r['parameters']} | {r['epochs_done']} | {fmt(best)} | "
              f"{fmt(r['test_acc_at_best_val'])} | {'–' if sec is None else f'{sec:.1f}'} | {r['stopped']} |")


def _data_sets(jobs: list[tuple], built: dict, args: argparse.Namespace) -> list[tuple[str, dict]]:
    """(task, `lra_tasks.load` options) of each data set the runs read, once each."""
    found = {(t, tuple(load_options(t, args, built[(t, v, m)][2]).items())) for t, m, v, _ in jobs}
    return [(task, dict(load)) for task, load in sorted(found, key=str)]


def _train_side_by_side(jobs: list[tuple], built: dict, args: argparse.Namespace, cuda: bool) -> list[dict]:
    """Each (task, mixer, variant, seed) run in one of `--concurrent` worker processes sharing the device (over
    all GPUs when there are several): one small LRA model's step leaves a GPU mostly idle while the host launches
    its kernels. The data sets are prepared here first, once; a failing run is named in one line and the others go
    on. The results of the runs that returned, in the order of `jobs`."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ValueError("`--concurrent`: trains runs side by side in worker processes of one launch; under torchrun "
                         "every process takes part in each run (use one or the other)")
    for task, load in _data_sets(jobs, built, args):
        lra_tasks.load(task, **load)  # generated (or checked) once, before the workers read it
    gpus = torch.cuda.device_count() if cuda else 0
    workers = min(args.concurrent, len(jobs))
    threads = max(1, (os.cpu_count() or 1) // workers)
    names = {job: run_name(job[0], job[1], settings_of(job[1], args), job[2], job[3]) for job in jobs}
    print(f"{len(jobs)} runs, {workers} at a time on {f'{gpus} GPU(s)' if cuda else 'the CPU'}; results in {args.out}")
    results = {}
    ctx = multiprocessing.get_context("spawn")
    with mps_daemon() if getattr(args, "mps", False) else contextlib.nullcontext(), \
            concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        futures = {pool.submit(_train_in_worker, task, mixer, variant,
                               argparse.Namespace(**{**vars(args), "seed": seed, "progress": False}),
                               k % gpus if gpus else None, threads): (task, mixer, variant, seed)
                   for k, (task, mixer, variant, seed) in enumerate(jobs)}
        for future in concurrent.futures.as_completed(futures):
            job = futures[future]
            try:
                results[job] = r = future.result()
            except Exception as e:  # noqa: BLE001 - one run's failure is reported, the others train on
                print(f"{names[job]}: failed: {type(e).__name__}: {str(e).strip().splitlines()[-1]}")
            else:
                print(f"{names[job]}: {r['epochs_done']} of {r['train']['epochs']} epochs ({r['stopped'] or 'done'})")
    return [results[job] for job in jobs if job in results]


def _train_in_worker(task: str, mixer: str, variant: str | None, args: argparse.Namespace, gpu: int | None,
                     threads: int) -> dict:
    torch.set_num_threads(threads)
    if gpu is not None:
        torch.cuda.set_device(gpu)
        d = distributed.Dist(0, 1, gpu, torch.device("cuda", gpu))
    else:
        d = distributed.init(args.device)
    return train_run(task, mixer, args, d, variant)


def record_results(args: argparse.Namespace, figure: Path | None) -> Path:
    """`lra.json`: one row per run under --out (test accuracy at the best validation epoch, and at the last epoch and
    the best over epochs, the LRA code's other readings; epochs done, time per epoch; the curve [epoch, val, test]
    per epoch; the commit it trained at), the paper's numbers beside, the curves as its figure; in the environment
    the runs recorded where they trained. `--keep-recorded`: the existing record's rows of other runs stay."""
    results = results_in(args.out)
    if not results:
        raise ValueError(f"--record: no finished epoch under {args.out} (no */result.json)")
    rows = [{"task": r["task"], "model": r["model"], "settings": _run_key(r)[1], "variant": _run_key(r)[2],
             "variant_note": r.get("variant_note"), "seed": r.get("seed", SEED_DEFAULTS["seed"]),
             "parameters": r["parameters"],
             "test_acc": r["test_acc_at_best_val"], "best_val_acc": r["best_val_acc"],
             "test_acc_last": r.get("test_acc_last"), "test_acc_max": r.get("test_acc_max"),
             "epochs_done": r["epochs_done"], "epochs": r["train"]["epochs"], "steps": r["steps"],
             "time_per_epoch_s": r["time_per_epoch_s"], "stopped": r["stopped"], "world_size": r["world_size"],
             "commit": (r.get("environment") or {}).get("commit"),
             "curve": [[h["epoch"], round(h["val_acc"], 6), round(h["test_acc"], 6)] for h in r["history"]]}
            for r in results]
    rows += _prefix_rows(rows, args.config)
    env = runs_environment([r.get("environment") for r in results], args.out)
    kept = _kept_rows(args, env, rows) if getattr(args, "keep_recorded", False) else []
    if kept:
        figure = plot(args.out, kept)
        commits = sorted({str(r["commit"]) for r in rows + kept if r["commit"]})
        env = {**env, "commit": ", ".join(commits) + (" (per row)" if len(commits) > 1 else "")}
    order = {t: k for k, t in enumerate((*PAPER_ORDER, *lra_tasks.TASKS))}
    rows = sorted(rows + kept, key=lambda r: (order.get(r["task"], len(order)), r["model"], r["seed"]))
    paper = {label: dict(zip(PAPER_ORDER, values)) for label, values in PAPER.items()}
    return write_result(args.record or None, "lra", env, rows, command_of(args), figure=figure, paper=paper)


def _row_key(row: dict) -> tuple:
    return row["task"], row["model"], row["settings"], row["variant"], row["seed"]


def _kept_rows(args: argparse.Namespace, env: dict, rows: list[dict]) -> list[dict]:
    """The rows of the record that --record is about to replace whose runs are not among `rows`; a row recorded
    without its own commit takes the record's."""
    path = Path(args.record or RESULTS_DIR / env["device_slug"]) / "lra.json"
    if not path.is_file():
        raise ValueError(f"`--keep-recorded`: no record at {path} to keep rows of")
    old = json.loads(path.read_text())
    if old["device"] != env["device"]:
        raise ValueError(f"`--keep-recorded`: {path} holds runs on {old['device']}, those under {args.out} ran on "
                         f"{env['device']}; record each device's runs apart")
    new = {_row_key(r) for r in rows}
    return [{**r, "commit": r.get("commit") or old["commit"]} for r in old["rows"] if _row_key(r) not in new]


def _prefix_rows(rows: list[dict], config_dir: str | Path) -> list[dict]:
    """A row for each prefix variant (`_variant`) without a run of its own, read from the preset's run of the same
    model and seed where that has trained past the variant's epochs: its curve up to them, the test accuracy at the
    first best validation epoch there (`read_from_preset`: the epochs the preset's run had)."""
    out = []
    for r in rows:
        if r["variant"] or r["settings"] != r["model"]:
            continue
        for name, entry in (load_preset(r["task"], config_dir).get("variants") or {}).items():
            n = entry["train"]["epochs"] if entry.get("prefix") else 0
            curve = [c for c in r["curve"] if c[0] <= n]
            own = any((o["task"], o["model"], o["settings"], o["variant"], o["seed"]) ==
                      (r["task"], r["model"], r["model"], name, r["seed"]) for o in rows)
            if not n or len(curve) < n or own:
                continue
            val, test = best_val_reading(curve, n)
            out.append({**r, "variant": name, "variant_note": entry.get("note"), "test_acc": test,
                        "best_val_acc": val, "test_acc_last": curve[-1][2], "test_acc_max": max(c[2] for c in curve),
                        "epochs_done": n, "epochs": n, "steps": r["steps"] * n // r["epochs_done"],
                        "stopped": None, "curve": curve, "read_from_preset": r["epochs_done"]})
    return out


__all__ = ["report", "plot", "gpu_minutes", "record_results", "add_arguments", "run"]
