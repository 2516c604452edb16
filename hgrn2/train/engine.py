"""The training engine: one loop, which a task plugs into with its data, model, loss and metrics (`Task`).

    fit = Engine(task, optimizer, scheduler, device=dev, checkpoint_dir=DIR, run_id=ID).fit(epochs, deadline=...)

The engine owns the step (bf16 autocast on CUDA; zero_grad, backward and the optimiser step, or the whole step
replayed as one CUDA graph, `graphed.py`), the epochs over the task's batches in their fixed order, the schedule
stepped once per epoch, the evaluation after every epoch and the task's early stop, the time budget (`deadline`),
divergence (`guard.FiniteWatch`: the run stops and the diverged epoch is not saved), the lock on the checkpoint
folder, and the checkpoints (`checkpoint.py`, after every epoch: model, optimiser, schedule, history, steps, time
and the RNG), from the newest of which `fit` continues exactly. MQAR trains on it (`mqar.py`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

import torch

from . import checkpoint, guard
from .graphed import GraphedStep


class Task(Protocol):
    model: torch.nn.Module
    # one value per batch tensor that fills the rows of an epoch's smaller last batch in a CUDA graph (an ignored
    # target: the loss and gradients stay the smaller batch's); None: every batch has the first one's shape
    pad_values: tuple | None

    def batches(self) -> Iterable[tuple[torch.Tensor, ...]]:
        """One epoch's training batches, in order."""

    def loss(self, *batch: torch.Tensor) -> torch.Tensor:
        """The forward and the scalar loss of one batch (the engine sets the precision around it)."""

    def evaluate(self) -> dict:
        """The metrics after an epoch (numbers), recorded in the epoch's history entry."""

    def done(self, metrics: dict) -> bool:
        """Stop early after an epoch with these metrics."""


@dataclass
class Fit:
    history: list[dict]  # one entry per epoch: epoch, lr, train_loss, the task's metrics, seconds
    steps: int
    seconds: float
    cut: bool  # the deadline stopped it (resumable)
    diverged: bool  # a step's loss was not finite
    early: bool  # the task's early stop


class Engine:
    def __init__(self, task: Task, optimizer: torch.optim.Optimizer, scheduler, *, device: torch.device,
                 cuda_graph: bool = False, checkpoint_dir=None, run_id: str = ""):
        """`cuda_graph`: the optimizer must be capturable with its learning rate a CUDA tensor (`graphed.py`).
        `checkpoint_dir` (None: no checkpoints) holds the run `run_id` only."""
        if cuda_graph and device.type != "cuda":
            raise ValueError(f"`cuda_graph`: needs a CUDA device, got {str(device)!r}")
        self.task, self.optimizer, self.scheduler, self.device = task, optimizer, scheduler, device
        self.cuda_graph, self.checkpoint_dir, self.run_id = cuda_graph, checkpoint_dir, run_id

    def fit(self, epochs: int, *, deadline: float | None = None, on_step: Callable[[], None] | None = None,
            on_epoch: Callable[[dict], None] | None = None) -> Fit:
        """Train to `epochs` (from the newest checkpoint), stopping early, on divergence or after the step that
        passes `deadline` (a `time.time()` value). `on_step()` runs after every step, `on_epoch(entry)` after
        every epoch."""
        lock = guard.RunLock(str(self.checkpoint_dir)) if self.checkpoint_dir is not None else None
        try:
            return self._fit(epochs, deadline, on_step, on_epoch)
        finally:
            if lock is not None:
                lock.release()

    def _fit(self, epochs, deadline, on_step, on_epoch) -> Fit:
        task, dev = self.task, self.device
        history, steps, before = self._resume()
        step = self._step_function()
        start = time.time() - before
        watch = guard.FiniteWatch(dev)
        cut = diverged = early = False
        for epoch in range(len(history), epochs):
            task.model.train()
            loss_sum, batches = torch.zeros((), device=dev), 0
            for batch in task.batches():
                loss = step(batch)
                loss_sum += loss.detach()
                steps, batches = steps + 1, batches + 1
                watch.update(steps, loss)
                if on_step is not None:
                    on_step()
                if deadline is not None and time.time() > deadline:
                    cut = True
                    break
            train_loss = loss_sum.item() / batches  # the batches run (fewer when the budget cut the epoch)
            metrics = task.evaluate()
            history.append(dict(epoch=epoch, lr=float(self.scheduler.get_last_lr()[0]), train_loss=train_loss,
                                **metrics, seconds=round(time.time() - start, 2)))
            diverged = watch.bad_step() is not None
            early = task.done(metrics)
            stop = cut or diverged or early
            if not stop:
                self.scheduler.step()
                self._save(epoch + 1, history, steps, time.time() - start)
            if on_epoch is not None:
                on_epoch(history[-1])
            if stop:
                break
        return Fit(history, steps, time.time() - start, cut, diverged, early)

    def _autocast(self):
        # autocast's weight cache must be off while a graph is captured
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.device.type == "cuda",
                              cache_enabled=not self.cuda_graph)

    def _loss(self, *batch: torch.Tensor) -> torch.Tensor:
        with self._autocast():
            return self.task.loss(*batch)

    def _step_function(self) -> Callable[[tuple], torch.Tensor]:
        """One optimiser step on a batch, returning its loss: eager, or replayed as a CUDA graph."""
        if self.cuda_graph:
            graphed = GraphedStep(self._loss, self.optimizer, pad_values=self.task.pad_values)
            return lambda batch: graphed(*batch)[0]

        def eager(batch):
            self.optimizer.zero_grad(set_to_none=True)
            loss = self._loss(*batch)
            loss.backward()
            self.optimizer.step()
            return loss

        return eager

    def _save(self, epoch: int, history: list[dict], steps: int, seconds: float) -> None:
        if self.checkpoint_dir is None:
            return
        checkpoint.save(str(self.checkpoint_dir), epoch, dict(
            run_id=self.run_id, model=self.task.model.state_dict(), optimizer=self.optimizer.state_dict(),
            scheduler=self.scheduler.state_dict(), history=history, steps=steps, seconds=seconds,
            rng=rng_state(self.device)), keep_last=1)

    def _resume(self) -> tuple[list[dict], int, float]:
        """(history, steps, seconds) of the newest checkpoint, loaded into model, optimiser, schedule and RNG;
        ([], 0, 0.0) without one."""
        state = checkpoint.load_latest(str(self.checkpoint_dir)) if self.checkpoint_dir is not None else None
        if state is None:
            return [], 0, 0.0
        if state["run_id"] != self.run_id:
            raise ValueError(f"`checkpoint_dir`: holds run {state['run_id']}, not {self.run_id}")
        self.task.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        set_rng_state(state["rng"], self.device)
        for group in self.optimizer.param_groups:  # the checkpoint's learning rate, as this optimizer takes it
            lr = float(group["lr"])
            group["lr"] = torch.tensor(lr, device=self.device) if self.cuda_graph else lr
        return state["history"], state["steps"], state["seconds"]


def rng_state(dev: torch.device) -> dict:
    state = {"torch": torch.get_rng_state()}
    if dev.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(dev)  # the run's device, which need not be the current one
    return state


def set_rng_state(state: dict, dev: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    if dev.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], dev)
