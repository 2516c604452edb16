"""A sweep of independent training runs: resumable, several at once on one device, one progress bar in steps.

A sweep is a list of specs (any picklable object with a `run_id` string and a `total_steps` int) and a training
function, called as

    train_fn(spec, device, deadline=..., on_step=..., checkpoint_dir=..., **options) -> result dict

which trains one run, calls `on_step()` after every optimiser step, checkpoints into `checkpoint_dir` and continues
from the newest checkpoint there, stops after the step that passes `deadline` (a `time.time()` value) and returns
a JSON-able dict with at least `run_id` and `complete` (False when the deadline cut it).

Each finished run is saved atomically as `OUT/runs/<run id>.json`; a sweep skips the runs whose file says
complete, so a killed sweep continues where it stopped. With `concurrent` > 1 the runs train in worker processes
that share the device(s) (small models leave a GPU mostly idle); `cuda` with several GPUs spreads them over all.
Under torchrun every process trains its share of the runs (rank r: runs r, r + world, ...; `cuda`: its local GPU),
then all wait for each other and read every result; only rank 0 (`distributed.main_process()`) writes the tables.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import traceback
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import asdict, is_dataclass
from multiprocessing import get_context
from pathlib import Path

import torch
from tqdm.auto import tqdm

from hgrn2.data.files import write_json
from hgrn2.train.guard import RunError, RunLock

REPORT_SECONDS = 0.5  # a worker sends its step count at most this often


def read_result(path: Path) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def finished_results(specs: list, out: Path) -> list[dict]:
    """The saved results (complete or cut) of those of `specs` that have one in `out`/runs, in the order of `specs`."""
    return [res for s in specs if (res := read_result(out / "runs" / f"{s.run_id}.json"))]


def best_device() -> str:
    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def devices(device: str) -> list[str]:
    """`cuda` with several GPUs spreads the runs over all of them."""
    if device == "cuda" and torch.cuda.device_count() > 1:
        return [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    return [device]


class StepCounter:
    """`on_step` for a training function: counts steps and hands them to `report(n)` at most every 0.5 s."""

    def __init__(self, report: Callable[[int], None]):
        self.report, self.pending, self.last = report, 0, time.time()

    def __call__(self) -> None:
        self.pending += 1
        if time.time() - self.last > REPORT_SECONDS:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            self.report(self.pending)
        self.pending, self.last = 0, time.time()


def _ranks() -> tuple[int, int]:
    """(rank, world) under torchrun, joining a gloo group for the final wait; (0, 1) alone."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not torch.distributed.is_initialized():
        from datetime import timedelta

        # the ranks wait for each other's whole share of the runs, which may take days
        torch.distributed.init_process_group("gloo", timeout=timedelta(days=30))
    return int(os.environ.get("RANK", "0")), world


def _spec_dict(spec) -> dict:
    return asdict(spec) if is_dataclass(spec) else dict(vars(spec))


def run_and_save(train_fn: Callable, spec, device: str, out: Path, deadline: float | None, threads: int | None,
                 report: Callable[[int], None] | None, options: dict) -> dict:
    """Train one run (unless the budget is spent) and save its result. A failing run is reported, not raised,
    so that one bad setting does not end the sweep."""
    if threads:
        torch.set_num_threads(threads)
    if deadline is not None and time.time() > deadline:
        return dict(run_id=spec.run_id, spec=_spec_dict(spec), not_run=True)
    ckpt = out / "checkpoints" / spec.run_id
    counter = StepCounter(report or (lambda n: None))
    try:
        result = train_fn(spec, device, deadline=deadline, on_step=counter, checkpoint_dir=ckpt, **options)
    except RunError as e:  # diverged, or its folder in use: one line says it all
        return dict(run_id=spec.run_id, spec=_spec_dict(spec), error=str(e))
    except Exception:
        return dict(run_id=spec.run_id, spec=_spec_dict(spec), error=traceback.format_exc())
    finally:
        counter.flush()
    write_json(out / "runs" / f"{spec.run_id}.json", result)
    if result["complete"]:
        shutil.rmtree(ckpt, ignore_errors=True)
    return result


class _QueueReport:
    """A picklable `report` that sends (run id, steps) to the parent's queue."""

    def __init__(self, queue, run_id: str):
        self.queue, self.run_id = queue, run_id

    def __call__(self, n: int) -> None:
        self.queue.put((self.run_id, n))


def sweep(specs: list, out: Path, device: str, train_fn: Callable, *, concurrent: int = 1,
          max_minutes: float | None = None, name: str = "sweep", summary: Callable[[dict], str] | None = None,
          prepare: Callable[[list], None] | None = None, options: dict | None = None) -> tuple[list[dict], int]:
    """Run (or resume) the sweep; returns the results of `specs` (finished before or now) and the number of runs
    that failed. `prepare(todo)` runs first (e.g. draws the data the runs share); `options` go to `train_fn`;
    `summary(result)` is the line printed when a run finishes."""
    rank, world = _ranks()
    if world == 1:
        lock = RunLock(str(out))  # a second sweep into this folder is refused before it trains or writes anything
        try:
            return _sweep(specs, out, device, train_fn, concurrent, max_minutes, name, summary, prepare,
                          options or {})
        finally:
            lock.release()
    if device == "cuda":
        device = f"cuda:{os.environ.get('LOCAL_RANK', '0')}"
    todo = [s for s in specs if not (read_result(out / "runs" / f"{s.run_id}.json") or {}).get("complete")]
    mine = {s.run_id for s in todo[rank::world]}
    _, errors = _sweep([s for s in specs if s.run_id not in {t.run_id for t in todo} or s.run_id in mine], out,
                       device, train_fn, concurrent, max_minutes, f"{name} (rank {rank})", summary, prepare,
                       options or {})
    failed = torch.tensor([errors])
    torch.distributed.all_reduce(failed)  # also the wait for every rank's share
    torch.distributed.destroy_process_group()
    done = {res["run_id"]: res for res in finished_results(specs, out)}
    return [done[s.run_id] for s in specs if s.run_id in done], int(failed)


def _sweep(specs, out, device, train_fn, concurrent, max_minutes, name, summary, prepare, options):
    deadline = time.time() + 60 * max_minutes if max_minutes else None
    done = {res["run_id"]: res for res in finished_results(specs, out)}
    todo = [s for s in specs if not done.get(s.run_id, {}).get("complete")]
    print(f"{name}: {len(specs)} runs, {len(specs) - len(todo)} already done, {len(todo)} to train on {device}"
          + (f" ({concurrent} at a time)" if concurrent > 1 else "") + f"; results in {out}")
    if not todo:
        return [done[s.run_id] for s in specs], 0
    if prepare is not None:
        prepare(todo)
    devs = devices(device)
    threads = max(1, (os.cpu_count() or 1) // max(concurrent, 1))
    # one bar over all steps of all runs; a run that stops early (or is cut) counts its remaining steps
    bar = tqdm(total=sum(s.total_steps for s in todo), desc=f"{name} steps", unit="step", dynamic_ncols=True)
    seen = dict.fromkeys((s.run_id for s in todo), 0)
    errors, finished = 0, 0

    def advance(run_id: str, n: int) -> None:
        seen[run_id] += n
        bar.update(n)

    def report(spec, result: dict) -> None:
        nonlocal errors, finished
        if "error" in result:
            errors += 1
            # the whole traceback once; after that, its last line
            tqdm.write(f"{result['run_id']} failed:\n" + (result["error"] if errors == 1 else
                                                            result["error"].strip().splitlines()[-1]))
        elif not result.get("not_run"):
            done[result["run_id"]] = result
            tqdm.write(summary(result) if summary else f"{result['run_id']}: done")
        finished += 1
        bar.update(max(0, spec.total_steps - seen[spec.run_id]))
        bar.set_postfix(runs=f"{finished}/{len(todo)}")

    if concurrent <= 1:
        for i, spec in enumerate(todo):
            bar.set_postfix_str(f"run {i + 1}/{len(todo)}: {spec.run_id}")
            result = run_and_save(train_fn, spec, devs[i % len(devs)], out, deadline, None,
                                  lambda n, rid=spec.run_id: advance(rid, n), options)
            report(spec, result)
    else:
        ctx = get_context("spawn")
        with ctx.Manager() as manager, ProcessPoolExecutor(concurrent, mp_context=ctx) as pool:
            events = manager.Queue()
            futures = {pool.submit(run_and_save, train_fn, spec, devs[i % len(devs)], out, deadline, threads,
                                   _QueueReport(events, spec.run_id), options): spec for i, spec in enumerate(todo)}
            pending = set(futures)
            while pending:
                ready, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
                while not events.empty():  # the steps workers reported before their results arrived
                    advance(*events.get())
                for f in ready:
                    spec = futures[f]
                    try:
                        result = f.result()
                    except Exception:  # a worker died (out of memory, a crash in a kernel)
                        result = dict(run_id=spec.run_id, spec=_spec_dict(spec), error=traceback.format_exc())
                    report(spec, result)
    bar.close()
    if errors:
        print(f"{errors} run(s) failed; their results are missing from the table")
    return [done[s.run_id] for s in specs if s.run_id in done], errors


__all__ = ["sweep", "run_and_save", "StepCounter", "read_result", "finished_results", "best_device",
           "devices"]
