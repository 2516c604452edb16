"""Shared measuring helpers of every `hgrn2 bench` command: one error measure, one timer, one result record.

A result is one JSON per benchmark and device, `benchmarks/results/<device slug>/<benchmark>.json`, holding the
command that produced it, the device, the versions, the commit, the date and the rows (`write_result`).
"""

from __future__ import annotations

import datetime
import importlib.metadata as md
import json
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from hgrn2.data.files import write_json

RESULTS_DIR = Path("benchmarks") / "results"
REQUIRED_KEYS = ("benchmark", "command", "device", "versions", "commit", "date", "rows")
PACKAGES = {"torch": "torch", "triton": "triton", "fla": "flash-linear-attention", "transformers": "transformers"}


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """‖x − ref‖ / ‖ref‖ in float64 (the absolute norm when ref is 0)."""
    x, ref = x.detach().double().cpu(), ref.detach().double().cpu()
    den = ref.norm().item()
    return (x - ref).norm().item() / den if den > 0 else (x - ref).norm().item()


def time_ms(fn: Callable[[], object], *, device: torch.device | str | None = None,
            inputs: list[torch.Tensor] | None = None, warmup: int = 25, rep: int = 100,
            grad_to_none: list[torch.Tensor] | None = None) -> float:
    """Median milliseconds of `fn()`. On CUDA (`device`, else that of `inputs`, else CUDA when available):
    triton's do_bench (CUDA events, L2 flushed between calls, `warmup` and `rep` in ms); on the CPU: a
    perf_counter loop of `max(3, rep // 20)` calls after one warm-up call. `inputs` must not be all zeros: kernels
    that skip work on zero gates or inputs would time a case no model runs. `grad_to_none`: tensors whose .grad is
    reset before each call, so that backward passes do not time the accumulation."""
    for t in inputs or ():
        if t.numel() and not bool(t.detach().ne(0).any()):
            raise ValueError(f"inputs: a tensor of shape {tuple(t.shape)} is all zeros; time on random data")
    if device is not None:
        cuda = torch.device(device).type == "cuda"
    else:
        cuda = inputs[0].is_cuda if inputs else torch.cuda.is_available()
    if cuda:
        import triton

        return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, grad_to_none=grad_to_none,
                                             return_mode="median"))
    fn()
    times = []
    for _ in range(max(3, rep // 20)):
        for t in grad_to_none or ():
            t.grad = None
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


TIMING_ROUNDS = 3  # rounds of `interleaved` in the benchmarks that compare implementations


def graph_ms(fn: Callable[[], object], timer: Callable[..., float], calls: int = 1) -> float:
    """Milliseconds per call of `fn` replayed from one CUDA graph holding `calls` calls (`timer` on the replay,
    divided by `calls`): the GPU's time alone, as a graph-replayed step or decode runs it, without the host's launch
    time, which bounds an eager call when the kernels are short. fn runs under the caller's grad mode."""
    grad = torch.is_grad_enabled()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.set_grad_enabled(grad):
        for _ in range(3):  # warm-up off the capture: compilation, autotuning, allocator pools
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.set_grad_enabled(grad):
        for _ in range(calls):
            fn()
    return timer(graph.replay) / calls


def try_time(row, name, thunk):
    try:
        return thunk()
    except Exception as e:  # noqa: BLE001 - an unavailable backend is a note, not a crash
        row[f"{name}_error"] = f"{type(e).__name__}: {e}"[:300]
        return None


def interleaved(row: dict, thunks: dict, rounds: int) -> dict:
    """{name_ms: median} of each thunk's timings over `rounds` rounds, the thunks interleaved in each: one do_bench
    call can land in a slower mode of the GPU that lasts the whole call (seen on the sequential walks)."""
    times: dict[str, list] = {name: [] for name in thunks}
    for _ in range(rounds):
        for name, thunk in thunks.items():
            if None not in times[name]:
                times[name].append(try_time(row, name, thunk))
    return {f"{name}_ms": None if None in ts else statistics.median(ts) for name, ts in times.items()}


def fla_available() -> bool:
    """fla's kernels run here: it is installed and there is a GPU (its Triton kernels have no CPU path)."""
    if not torch.cuda.is_available():
        return False
    try:
        import fla  # noqa: F401
    except Exception:  # noqa: BLE001 - any import failure means "no fla column"
        return False
    return True


def device_name(device: torch.device | str) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine() or "cpu"


def device_slug(name: str, count: int = 1) -> str:
    """A short folder name for a GPU: "NVIDIA H100 80GB HBM3" → "h100", "NVIDIA GeForce RTX 4090" → "rtx4090", two
    H200s → "h200x2"."""
    words = [w for w in re.split(r"[\s_]+", name.lower()) if w not in ("nvidia", "geforce", "amd", "radeon")]
    head = []
    for w in words:
        head.append(w.split("-")[0])
        if any(c.isdigit() for c in w):
            break
    slug = re.sub(r"[^a-z0-9]", "", "".join(head)) or "gpu"
    return f"{slug}x{count}" if count > 1 else slug


def _version(pkg: str) -> str | None:
    try:
        return md.version(pkg)
    except md.PackageNotFoundError:
        return None


def environment(device: torch.device | str, gpus: int = 1) -> dict:
    """Device name and slug, package versions, the commit of the working tree (with "+dirty" when it has changes)
    and today's UTC date."""
    name = device_name(device)
    slug = device_slug(name, gpus) if torch.device(device).type == "cuda" else "cpu"
    return {"device": name if gpus == 1 else f"{gpus} × {name}", "device_slug": slug,
            "versions": {k: _version(p) for k, p in PACKAGES.items()} | {"python": platform.python_version()},
            "commit": _commit(), "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")}


def _commit() -> str | None:
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "")


def command_of(args) -> str:
    """The command that produced a result: as the CLI received it, else this process's own command line."""
    return getattr(args, "command_line", None) or shlex.join(["python", *sys.argv])


def add_output_argument(parser) -> None:
    parser.add_argument("--out", default=None, metavar="DIR",
                        help=f"folder of the result JSON (default: {RESULTS_DIR}/<device slug>/)")


def add_record_argument(parser) -> None:
    parser.add_argument("--record", nargs="?", const="", default=None, metavar="DIR",
                        help="also write the result as a benchmark record, DIR/<benchmark>.json with its PNG beside "
                             "it (default DIR: benchmarks/results/<device>/), which `hgrn2 bench report` renders")


def write_result(out_dir: str | Path | None, benchmark: str, env: dict, rows: list[dict], command: str,
                 quick: bool = False, figure: str | Path | None = None, file_stem: str | None = None,
                 **extra) -> Path:
    """Write {benchmark, command, device, versions, commit, date, rows, quick, **extra} to
    `out_dir/<file_stem or benchmark>.json` (default folder: benchmarks/results/<device slug>/), atomically; returns
    the path.
    `quick`: a smoke run at tiny shapes, which `hgrn2 bench report` leaves out of BENCHMARKS.md. `figure`: a PNG
    copied beside the JSON as <benchmark>.png (first, so that the record never names a missing figure)."""
    folder = Path(out_dir) if out_dir else RESULTS_DIR / env["device_slug"]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{file_stem or benchmark}.json"
    if figure is not None:
        png = path.with_suffix(".png")
        shutil.copyfile(figure, f"{png}.tmp")
        os.replace(f"{png}.tmp", png)
        extra["figure"] = png.name
    record = {"benchmark": benchmark, "command": command, **env, "rows": rows, "quick": quick, **extra}
    return write_json(path, record, default=str)


ENV_FILE = "environment.json"
ENV_COMMAND = ("python -c \"import json; from hgrn2.bench.common import environment; "
               "print(json.dumps(environment('cuda')))\"")


def runs_environment(envs: list[dict | None], folder: str | Path) -> dict:
    """The environment of a record made from finished runs, as the runs recorded it where they trained (not this
    machine's): their device (refused if they differ), the newest run's versions, every commit, the newest date.
    Runs that recorded none fall back on `folder`/environment.json."""
    found = [e for e in envs if e]
    fallback = Path(folder) / ENV_FILE
    if not found and fallback.is_file():
        found = [json.loads(fallback.read_text())]
    if not found:
        raise ValueError(f"{folder}: its runs record no environment (device, versions, commit); on the machine "
                         f"that trained them, write one: {ENV_COMMAND} > {fallback}")
    devices = sorted({e["device"] for e in found})
    if len(devices) > 1:
        raise ValueError(f"{folder}: its runs were trained on different devices ({', '.join(devices)}); record "
                         "each device's runs from a folder of their own")
    newest = max(found, key=lambda e: e["date"])
    commits = sorted({str(e["commit"]) for e in found})
    return {**newest, "commit": ", ".join(commits) + (" (per run)" if len(commits) > 1 else "")}


LRA_SEED = 2222  # the authors' seed (both LRA launch scripts); `hgrn2 lra --seed`'s default


def lra_run_label(model: str, settings: str, variant: str | None = None, seed: int | None = None) -> str:
    """An LRA run's name in tables and plots: the model, whose preset settings it trained with where not its own
    (`hgrn2 lra --settings-of`), its ablation variant if any (`--variants`), and its seed where given and not the
    authors'."""
    label = model if settings == model else f"{model}, {settings}'s settings"
    label = label if variant is None else f"{label} [{variant}]"
    return label if seed in (None, LRA_SEED) else f"{label} seed {seed}"


# how `seeds_cell`'s values read, for the tables that show them
SEEDS_NOTE = ("*: not finished; – : no run; a ± b (n): mean and sample standard deviation over n seeds' runs equally "
              "far along, the finished ones if any; [k of n seeds]: the others are not as far along")


def best_val_reading(curve: list[list[float]], last_epoch: int) -> tuple[float, float]:
    """(validation, test) accuracy at the first best validation epoch among a curve's [epoch, val, test] rows up to
    `last_epoch`: LRA's reading of a run."""
    _, val, test = max((c for c in curve if c[0] <= last_epoch), key=lambda c: c[1])
    return val, test


def seeds_cell(runs: list[tuple[float | None, int, int]]) -> str | None:
    """An accuracy (a share) in %, from each seed's run as (accuracy, epochs done, epochs planned): one run's, or the
    mean ± sample standard deviation with the count, e.g. "58.10 ± 0.40 (3)". Only runs equally far along are
    averaged: the finished ones if any finished, else the furthest (marked *); "[k of n seeds]" when that leaves
    some out. None without a value."""
    runs = [(100 * a, done, planned) for a, done, planned in runs if a is not None]
    if not runs:
        return None
    finished = [a for a, done, planned in runs if done >= planned]
    if finished:
        accs, star = finished, ""
    else:
        furthest = max(done for _, done, _ in runs)
        accs, star = [a for a, done, _ in runs if done == furthest], "*"
    cell = f"{accs[0]:.2f}" if len(accs) == 1 else \
        f"{statistics.mean(accs):.2f} ± {statistics.stdev(accs):.2f} ({len(accs)})"
    return cell + star + (f" [{len(accs)} of {len(runs)} seeds]" if len(accs) < len(runs) else "")


# the columns of an image classifier's learning curve, as `hgrn2 vision report` prints it and BENCHMARKS.md shows it
VISION_CURVE_COLUMNS = [("epoch", "epoch", "d"), ("train loss", "train_loss", ".4f"), ("val loss", "val_loss", ".4f"),
                        ("top-1 %", "acc1", ".2f"), ("top-5 %", "acc5", ".2f"), ("EMA top-1 %", "ema_acc1", ".2f"),
                        ("lr", "lr", ".2e"), ("images/s", "train_images_per_s", ".0f")]


def format_table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    """A Markdown table: columns are (header, row key, format spec); a missing or None value prints as "-"."""
    def cell(row, key, spec):
        v = row.get(key)
        return "-" if v is None else format(v, spec)

    lines = ["| " + " | ".join(h for h, _, _ in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r, k, s) for _, k, s in columns) + " |" for r in rows]
    return "\n".join(lines)
