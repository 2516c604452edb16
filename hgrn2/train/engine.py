"""The training engine: one loop, which a task plugs into with its data, model, loss and metrics (`Task`).

    engine = Engine(task, optimizer, schedule, d=dist, checkpoint_dir=DIR, run_dir=RUN, name="run")
    engine.start()                        # lock the run folder, continue from the newest checkpoint (optional)
    fit = engine.fit(epochs, max_steps=..., deadline=...)

The engine owns the step (bf16 autocast on CUDA; zero_grad, backward, gradient clipping and the optimiser step,
or the whole step replayed as one CUDA graph, `graphed.py`), the learning rate (`schedule(step, epoch)`, set before
every step), DDP under torchrun (`distributed.wrap`), the epochs over the task's batches in their fixed order, the
running sums of an epoch (summed over ranks every step, so that they resume exactly), the evaluation after every
epoch and the task's early stop, the limits (`max_steps`, `deadline`), divergence (`guard.FiniteWatch`: the run
stops and nothing diverged is saved), the lock on the run folder (`guard.RunLock`), the run log (`logger.RunLogger`),
the progress bar and the checkpoints (`checkpoint.py`: after every epoch, every `ckpt_every` steps and when a limit
stops the run inside an epoch), from the newest of which a run continues exactly: at the same iteration of the same
epoch, with every RNG of every rank restored.

A checkpoint holds `model`, `optimizer`, `step`, `epoch`, `iteration` (batches of the epoch done), `history` (one
entry per epoch, `Task.entry`), `rng` (one state per rank), `epoch_sums`, `seconds`, `run_id` and the task's own
keys (`Task.state`). MQAR, LRA and image classification train on it (`mqar.py`, `lra.py`, `vision.py`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from . import checkpoint, guard
from . import distributed as D
from .graphed import GraphedStep
from .logger import RunLogger
from .optim import set_lr


@dataclass
class EpochEnd:
    """What the engine knows at the end of an epoch, from which the task makes its history entry."""

    epoch: int  # 0-based index of the epoch just trained
    step: int  # optimiser steps so far
    lr: float  # the last step's learning rate
    sums: list[float]  # the epoch's running sums over every rank (`Task.loss`)
    metrics: dict  # `Task.evaluate`
    seconds: float  # the run's training time so far
    train_time: float  # this epoch's training time in this call
    epoch_time: float  # the same with the evaluation
    steps: int  # steps of this epoch in this call
    whole: bool  # this call trained the whole epoch (it did not continue one)


class Task:
    """What a task supplies; the defaults suit a task without them. `model` is the plain module (the engine wraps
    it for DDP and hands the wrapped one to `loss` and `evaluate`)."""

    model: torch.nn.Module
    # one value per batch tensor that fills the rows of an epoch's smaller last batch in a CUDA graph (an ignored
    # target: the loss and gradients stay the smaller batch's); None: every batch has the first one's shape
    pad_values: tuple | None = None
    steps_per_epoch: int | None = None  # None: not known before the epoch ends (no checkpoint inside an epoch)

    def batches(self, epoch: int, start: int) -> Iterable[tuple[torch.Tensor, ...]]:
        """Epoch `epoch`'s training batches from iteration `start` on, in their fixed order."""
        raise NotImplementedError

    def loss(self, model, *batch: torch.Tensor):
        """The forward and the scalar loss of one batch (the engine sets the precision around it), or (loss, sums):
        a float64 vector the engine adds up over the epoch's steps and ranks (default: [loss, 1])."""
        raise NotImplementedError

    def evaluate(self, model) -> dict:
        """The metrics after an epoch (numbers)."""
        return {}

    def entry(self, end: EpochEnd) -> dict:
        """The epoch's history entry (logged as a "val" record and kept in checkpoints)."""
        return dict(epoch=end.epoch, lr=end.lr, train_loss=end.sums[0] / end.sums[1], **end.metrics,
                    seconds=round(end.seconds, 2))

    def running(self, sums: list[float]) -> dict:
        """Values of the epoch so far for the training log record and the progress bar."""
        return {}

    def line(self, entry: dict) -> str | None:
        """A line printed after each epoch."""
        return None

    def done(self, entry: dict) -> bool:
        """Stop early after an epoch with this entry."""
        return False

    def score(self, entry: dict) -> float:
        """How good an epoch is (higher is better): the best epoch is `Engine.best()`."""
        raise NotImplementedError

    def after_step(self) -> None:
        """Runs after every optimiser step (an EMA of the weights)."""

    def state(self) -> dict:
        """The task's own keys of a checkpoint."""
        return {}

    def load_state(self, state: dict) -> None:
        """Called with a checkpoint before the engine loads it: check its settings, restore the task's keys."""


@dataclass
class Fit:
    history: list[dict]
    step: int
    epoch: int  # epochs finished
    seconds: float
    stopped: str | None  # "max_steps" or "max_minutes" when a limit stopped it (resumable)
    diverged: bool  # a step's loss or gradient norm was not finite (raise_on_divergence=False)
    early: bool  # the task's early stop


class Engine:
    def __init__(self, task: Task, optimizer: torch.optim.Optimizer, schedule: Callable[[int, int], float], *,
                 d: D.Dist | None = None, device: torch.device | None = None, bf16: bool = True,
                 clip: float | None = None, cuda_graph: bool = False, checkpoint_dir=None, run_dir=None,
                 lock: bool = True, run_id: str = "", keep_last: int = 1, name_by: str = "step", ckpt_every: int = 0,
                 mid_epoch: bool = False, log_every: int = 0, progress: bool = False, name: str = "",
                 raise_on_divergence: bool = True):
        """`schedule(step, epoch)`: the learning rate of optimiser step `step` (0-based) in epoch `epoch`.
        `d` (None: one process on `device`). `bf16`: autocast on CUDA. `clip`: the global gradient norm clipped
        to it (0: measured only; None: not measured). `cuda_graph`: the optimizer must be capturable with its
        learning rate a CUDA tensor (`graphed.py`). `checkpoint_dir` (None: no checkpoints) holds the run `run_id`
        only, `keep_last` checkpoints named by `name_by` ("step" or "epoch"). `run_dir` (default
        `checkpoint_dir`) is locked while the run trains (`lock`; False: the caller holds the lock) and holds
        `log.jsonl` when `log_every` > 0. `mid_epoch`: a limit or `ckpt_every` checkpoints inside an epoch (the
        task's batches start at any iteration); without it a limit ends the epoch early, which is evaluated and
        not saved. `raise_on_divergence`: `guard.Diverged` at the first check (log line, save, epoch end) after a
        non-finite step; else the diverged epoch is evaluated, not saved, and `Fit.diverged` says so."""
        self.d = d or D.Dist(0, 1, 0, device if device is not None else torch.device("cpu"))
        self.device = self.d.device
        if cuda_graph and (self.device.type != "cuda" or self.d.world > 1):
            raise ValueError(f"`cuda_graph`: needs a CUDA device and one process, got {self.d.world} on {self.device}")
        if mid_epoch and task.steps_per_epoch is None:
            raise ValueError("`mid_epoch`: the task must know its steps_per_epoch")
        if name_by not in ("step", "epoch") or (name_by == "epoch" and (mid_epoch or ckpt_every)):
            raise ValueError(f"`name_by`: expected 'step', or 'epoch' without checkpoints inside an epoch, "
                             f"got {name_by!r}")
        self.task, self.optimizer, self.schedule = task, optimizer, schedule
        self.bf16, self.clip, self.cuda_graph = bf16, clip, cuda_graph
        self.checkpoint_dir, self.run_id, self.keep_last, self.name_by = checkpoint_dir, run_id, keep_last, name_by
        self.run_dir = run_dir if run_dir is not None else checkpoint_dir
        self.take_lock = lock
        self.ckpt_every, self.mid_epoch, self.log_every = ckpt_every, mid_epoch, log_every
        self.progress, self.name, self.raise_on_divergence = progress, name, raise_on_divergence
        self.model = task.model
        self.wrapped = D.wrap(task.model, "ddp", self.d)
        self.step, self.epoch, self.iteration, self.history, self.seconds = 0, 0, 0, [], 0.0
        self.sums: torch.Tensor | None = None
        self.lock = self.log = None
        self.started = False

    # --- start and stop -----------------------------------------------------------------------------------------

    def start(self) -> bool:
        """Lock the run folder and load the newest checkpoint (model, optimiser, position, RNG); returns whether
        there was one. Releases the lock if loading fails."""
        if self.run_dir is not None and self.take_lock:
            self.lock = guard.RunLock(str(self.run_dir), self.d if self.d.world > 1 else None)
        try:
            resumed = self._resume()
            if self.log_every and self.run_dir is not None:
                self.log = RunLogger(str(self.run_dir), enabled=self.d.main, start_step=self.step,
                                     tensorboard=False)
        except BaseException:
            self.close()
            raise
        self.started = True
        return resumed

    def close(self) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None
        if self.log is not None:
            self.log.close()

    def best(self) -> dict | None:
        """The history entry of the best epoch by `Task.score` (the first of equals; None before any epoch)."""
        return max(self.history, key=self.task.score, default=None)

    def nothing_to_train(self, epochs: int, max_steps: int | None = None) -> str | None:
        """Why the run has nothing left to train under these limits, else None."""
        if self.epoch >= epochs:
            return f"it has trained {self.epoch} epoch(s), --epochs is {epochs}"
        if max_steps is not None and self.step >= max_steps:
            return f"it is at step {self.step}, --max-steps is {max_steps}"
        return None

    # --- the loop -----------------------------------------------------------------------------------------------

    def fit(self, epochs: int, *, max_steps: int | None = None, deadline: float | None = None,
            on_step: Callable[[], None] | None = None, on_epoch: Callable[[dict], None] | None = None) -> Fit:
        """Train to `epochs` (from the newest checkpoint), stopping early, on divergence, at `max_steps` or after
        the step that passes `deadline` (a `time.time()` value). `on_step()` runs after every step,
        `on_epoch(entry)` after every epoch (after its checkpoint). The run folder is unlocked on return."""
        try:
            if not self.started:
                self.start()
            return self._fit(epochs, max_steps, deadline, on_step, on_epoch)
        finally:
            self.close()

    def _fit(self, epochs, max_steps, deadline, on_step, on_epoch) -> Fit:
        task = self.task
        step_fn = self._step_function()
        start = time.time() - self.seconds
        watch = guard.FiniteWatch(self.device)
        bar = self._bar(epochs)
        stopped, diverged, early, lr = None, False, False, None
        while self.epoch < epochs and stopped is None and not (diverged or early):
            t_epoch, first, steps = time.time(), self.iteration, 0
            self.wrapped.train()
            for batch in task.batches(self.epoch, self.iteration):
                new_lr = self.schedule(self.step, self.epoch)
                if new_lr != lr:
                    set_lr(self.optimizer, new_lr)
                    lr = new_lr
                loss, sums, norm = step_fn(batch)
                self.step, self.iteration, steps = self.step + 1, self.iteration + 1, steps + 1
                sums = D.total(sums, self.d)
                self.sums = sums if self.sums is None else self.sums + sums
                watch.update(self.step, sums[0], norm)  # the same on every rank, so that all stop together
                if bar is not None:
                    bar.update(1)
                if on_step is not None:
                    on_step()
                if self.log_every and self.step % self.log_every == 0:
                    self._log_step(watch, loss, lr, bar)
                at_end = self.iteration == task.steps_per_epoch
                if (max_steps is not None and self.step >= max_steps) or (deadline is not None
                                                                          and time.time() > deadline):
                    stopped = "max_steps" if max_steps is not None and self.step >= max_steps else "max_minutes"
                    break
                if self.ckpt_every and self.step % self.ckpt_every == 0 and not at_end:
                    self._save(watch)
            else:
                at_end = True
            self.seconds = time.time() - start
            if stopped is not None and self.mid_epoch and not at_end:
                self._save(watch)  # continued at this iteration by the next call
                break
            if watch.bad_step() is not None and self.raise_on_divergence:
                watch.check(f" ({self.name})")  # a diverged epoch is neither evaluated nor saved
            diverged = watch.bad_step() is not None
            sums = self.sums.tolist() if self.sums is not None else [0.0, 0.0]
            train_time = time.time() - t_epoch
            metrics = task.evaluate(self.wrapped)
            entry = task.entry(EpochEnd(self.epoch, self.step, float(lr if lr is not None else 0.0), sums, metrics,
                                        self.seconds, train_time, time.time() - t_epoch, steps, first == 0))
            self.history.append(entry)
            if self.log is not None:
                self.log.log({"kind": "val", "step": self.step, **entry})
            early = task.done(entry)
            if not diverged and at_end:  # else a limit without mid_epoch cut the epoch short: evaluated, not saved
                self.epoch, self.iteration, self.sums = self.epoch + 1, 0, None
                self._save(watch)
            line = task.line(entry)
            if line and self.d.main:
                (bar.write if bar is not None else print)(line)
            if on_epoch is not None:
                on_epoch(entry)
        if bar is not None:
            bar.close()
        return Fit(self.history, self.step, self.epoch, time.time() - start, stopped, diverged, early)

    def _bar(self, epochs: int):
        if not (self.progress and self.d.main):
            return None
        from tqdm.auto import tqdm

        spe = self.task.steps_per_epoch
        return tqdm(total=epochs * spe if spe else None, initial=self.step, desc=self.name, unit="step")

    def _log_step(self, watch: guard.FiniteWatch, loss: torch.Tensor, lr, bar) -> None:
        if self.raise_on_divergence:
            watch.check(f" ({self.name})")
        running = self.task.running(self.sums.tolist())
        if self.log is not None:
            self.log.log({"kind": "train", "step": self.step, "epoch": self.epoch, "loss": loss.item(), "lr": lr,
                          **running})
        if bar is not None and running:
            bar.set_postfix({k: f"{v:.3f}" for k, v in running.items()})

    # --- the step -----------------------------------------------------------------------------------------------

    def _autocast(self):
        # autocast's weight cache must be off while a graph is captured
        return torch.autocast(self.device.type, dtype=torch.bfloat16,
                              enabled=self.bf16 and self.device.type == "cuda", cache_enabled=not self.cuda_graph)

    def _loss(self, *batch: torch.Tensor):
        with self._autocast():
            out = self.task.loss(self.wrapped, *batch)
        loss, sums = out if isinstance(out, tuple) else (out, None)
        if sums is None:
            sums = torch.stack([loss.detach().double(), loss.new_ones((), dtype=torch.float64)])
        return loss, sums

    def _step_function(self) -> Callable[[tuple], tuple]:
        """One optimiser step on a batch, returning (loss, sums, gradient norm or None): eager, or replayed as
        a CUDA graph."""
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        if self.cuda_graph:
            max_norm = None if self.clip is None else (self.clip or float("inf"))
            graphed = GraphedStep(lambda *b: self._loss(*b)[0], self.optimizer, pad_values=self.task.pad_values,
                                  max_norm=max_norm)

            def replay(batch):
                loss, norm = graphed(*batch)
                self.task.after_step()
                return loss, torch.stack([loss.double(), loss.new_ones((), dtype=torch.float64)]), norm

            return replay

        def eager(batch):
            self.optimizer.zero_grad(set_to_none=True)
            with guard.step_values(self.step + 1):
                loss, sums = self._loss(*batch)
                loss.backward()
            norm = None
            if self.clip:
                norm = torch.nn.utils.clip_grad_norm_(params, self.clip)
            elif self.clip is not None:
                norm = guard.grad_norm(params)
            self.optimizer.step()
            self.task.after_step()
            return loss, sums, norm

        return eager

    # --- checkpoints --------------------------------------------------------------------------------------------

    def _save(self, watch: guard.FiniteWatch) -> None:
        if self.checkpoint_dir is None:
            return
        if self.raise_on_divergence:
            watch.check(f" ({self.name})")  # a diverged step is never saved
        rngs = D.gather_objects(checkpoint.rng_state(self.device), self.d)
        if self.d.main:
            checkpoint.save(str(self.checkpoint_dir), self.step if self.name_by == "step" else self.epoch, dict(
                model=self.model.state_dict(), optimizer=self.optimizer.state_dict(), step=self.step,
                epoch=self.epoch, iteration=self.iteration, history=self.history, rng=rngs,
                epoch_sums=self.sums.tolist() if self.sums is not None else [], seconds=self.seconds,
                run_id=self.run_id, **self.task.state()), keep_last=self.keep_last)
        D.barrier(self.d)

    def _resume(self) -> bool:
        state = checkpoint.load_latest(str(self.checkpoint_dir)) if self.checkpoint_dir is not None else None
        if state is None:
            return False
        state = _upgrade(state)
        if self.run_id and state.get("run_id", self.run_id) != self.run_id:
            raise ValueError(f"`checkpoint_dir`: holds run {state['run_id']}, not {self.run_id}")
        self.task.load_state(state)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step, self.epoch, self.history = state["step"], state["epoch"], state.get("history", [])
        self.iteration, self.seconds = state.get("iteration", 0), state.get("seconds", 0.0)
        sums = state.get("epoch_sums") or []
        self.sums = torch.tensor(sums, dtype=torch.float64, device=self.device) if sums else None
        rngs = state["rng"]
        checkpoint.set_rng_state(rngs[self.d.rank] if self.d.rank < len(rngs) else rngs[0], self.device)
        for group in self.optimizer.param_groups:  # the checkpoint's learning rate, as this optimizer takes it
            lr = float(group["lr"])
            group["lr"] = torch.tensor(lr, device=self.device) if self.cuda_graph else lr
        return True


def _upgrade(state: dict) -> dict:
    """A checkpoint of the engine's first layout (`steps`, one RNG dict, a scheduler) in the present one."""
    if "steps" not in state or "step" in state:
        return state
    return {**state, "step": state["steps"], "epoch": len(state["history"]), "rng": [state["rng"]]}


def cosine(lr: float, t: int, total: int, floor: float = 0.0) -> float:
    """Cosine from `lr` at t = 0 to `floor` at t = `total` (torch's CosineAnnealingLR in closed form)."""
    import math

    return floor + 0.5 * (lr - floor) * (1 + math.cos(math.pi * t / total))
