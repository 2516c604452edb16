"""The training engine: one loop, which a task plugs into with its data, model, loss and metrics (`Task`).

    engine = Engine(task, optimizer, schedule, d=dist, checkpoint_dir=DIR, run_dir=RUN, name="run")
    engine.start()                        # lock the run folder, continue from the newest checkpoint (optional)
    fit = engine.fit(epochs, max_steps=..., deadline=...)

The engine owns the step (`graphed.train_step`: bf16 autocast, zero_grad, backward over `accum` micro-batches,
gradient clipping and the optimiser step, or the whole step replayed as one CUDA graph, `graphed.GraphedStep`), the
learning rate (`schedule(step, epoch)`, set before every step), DDP or FSDP2 under torchrun (`distributed.wrap`),
the epochs over the task's batches in their fixed order, the running sums of an epoch (summed over ranks every step,
so that they resume exactly), the evaluation every `eval_every` steps and after every epoch, the task's early stop,
the limits (`max_steps`, `deadline`, `on_step`), divergence (`guard.FiniteWatch`: the run stops and nothing
diverged is saved), the lock on the run folder (`guard.RunLock`), the run log (`logger.RunLogger`: a "train" record
every `log_every` steps with the mean loss since the last one, a "val" record per evaluation), the progress bar and
the checkpoints (`sharded.py`: folders every rank writes its part of, after every epoch, every `ckpt_every` steps
and when a limit stops the run inside an epoch), from the newest of which (or of the single files of earlier
versions) a run continues exactly: at the same iteration of the same epoch, with every RNG of every rank
restored. A task whose run is counted in steps (`Task.by_steps`, the language model) is one epoch of
`steps_per_epoch` steps, which a resume may lengthen: its position is its step.

A checkpoint holds `model`, `optimizer`, `step`, `epoch`, `iteration` (batches of the epoch done), `history` (one
entry per epoch, `Task.entry`), `rng` (one state per rank), `world`, `epoch_sums`, `loss_sum` and `loss_count` (the
losses since the last log record), `seconds`, `run_id` and the task's own keys (`Task.state`). The language model
(`trainer.py`), MQAR, LRA and image classification train on it (`mqar.py`, `lra.py`, `vision.py`).
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from . import checkpoint, guard, sharded
from . import distributed as D
from .graphed import GraphedStep, train_step
from .logger import RunLogger
from .optim import set_capturable, set_lr


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
    it for DDP or FSDP2 and hands the wrapped one to `loss` and `evaluate`)."""

    model: torch.nn.Module
    # one value per batch tensor that fills the rows of an epoch's smaller last batch in a CUDA graph (an ignored
    # target: the loss and gradients stay the smaller batch's); None: every batch has the first one's shape
    pad_values: tuple | None = None
    steps_per_epoch: int | None = None  # None: not known before the epoch ends (no checkpoint inside an epoch)
    by_steps: bool = False  # the run is one epoch of steps_per_epoch steps, its position on resume is its step

    def batches(self, epoch: int, start: int) -> Iterable[tuple[torch.Tensor, ...]]:
        """Epoch `epoch`'s training batches from iteration `start` on, in their fixed order (a step's
        micro-batches stacked: the engine splits its rows into `accum` equal parts)."""
        raise NotImplementedError

    def loss(self, model, *batch: torch.Tensor):
        """The forward and the scalar loss of one (micro-)batch (the engine sets the precision around it), or
        (loss, sums): a float64 vector the engine adds up over the epoch's steps and ranks (default: [loss, 1])."""
        raise NotImplementedError

    def evaluate(self, model) -> dict:
        """The metrics after an epoch or every `eval_every` steps (numbers)."""
        return {}

    def entry(self, end: EpochEnd) -> dict:
        """The epoch's history entry (logged as a "val" record and kept in checkpoints)."""
        return dict(epoch=end.epoch, lr=end.lr, train_loss=end.sums[0] / end.sums[1], **end.metrics,
                    seconds=round(end.seconds, 2))

    def running(self, sums: list[float], step: int, steps_per_s: float) -> dict:
        """Values for the training log record and the progress bar, from the epoch's sums so far, the step and the
        steps per second since the last record."""
        return {}

    def line(self, record: dict) -> str | None:
        """A line printed after each evaluation (its history entry or metrics, with the step)."""
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
        """Called with a checkpoint once the engine has loaded the model and optimiser from it: check its settings,
        restore the task's keys."""


@dataclass
class Fit:
    history: list[dict]
    step: int
    epoch: int  # epochs finished
    seconds: float
    stopped: str | None  # "max_steps", "max_minutes" or "on_step" when a limit stopped it (resumable)
    diverged: bool  # a step's loss or gradient norm was not finite (raise_on_divergence=False)
    early: bool  # the task's early stop


class Engine:
    def __init__(self, task: Task, optimizer, schedule: Callable[[int, int], float], *,
                 d: D.Dist | None = None, device: torch.device | None = None, bf16: bool = False,
                 clip: float | None = None, accum: int = 1, parallel: str = "ddp", fsdp: dict | None = None,
                 cuda_graph: bool = False, checkpoint_dir=None, run_dir=None, lock: bool = True, run_id: str = "",
                 keep_last: int = 1, name_by: str = "step", ckpt_every: int = 0,
                 eval_every: int = 0, mid_epoch: bool = False, log_every: int = 0, tensorboard: bool = False,
                 progress: bool = False, name: str = "", raise_on_divergence: bool = True):
        """`optimizer`: an optimiser of the task's model, or a function of the wrapped model that builds one (FSDP2
        replaces the parameters it shards). `schedule(step, epoch)`: the learning rate of optimiser step `step`
        (0-based) in epoch `epoch`. `d` (None: one process on `device`). `bf16`: autocast to bfloat16. `clip`: the
        global gradient norm clipped to it (0: measured only; None: not measured). `accum`: micro-batches per step.
        `parallel`: "ddp" or "fsdp" under torchrun (`fsdp`: `distributed.wrap`'s options). `cuda_graph`: each
        step replayed as one CUDA graph (`graphed.py`; the optimizer made capturable). `checkpoint_dir` (None: no
        checkpoints) holds the run `run_id` only, `keep_last` checkpoints named by `name_by` ("step" or "epoch").
        `run_dir` (default `checkpoint_dir`) is locked while the run trains (`lock`; False: the caller holds the
        lock) and holds `log.jsonl` when `log_every` > 0 (and TensorBoard's `tb/` with `tensorboard`).
        `eval_every`: evaluate (logged and printed, not kept in the history) every that many steps inside an
        epoch. `mid_epoch`: a limit or `ckpt_every` checkpoints inside an epoch (the task's batches start at any
        iteration); without it a limit ends the epoch early, which is evaluated and not saved.
        `raise_on_divergence`: `guard.Diverged` at the first check (log line, save, epoch end) after a non-finite
        step; else the diverged epoch is evaluated, not saved, and `Fit.diverged` says so."""
        self.d = d or D.Dist(0, 1, 0, device if device is not None else torch.device("cpu"))
        self.device = self.d.device
        if cuda_graph and (self.device.type != "cuda" or self.d.world > 1):
            raise ValueError(f"`cuda_graph`: needs a CUDA device and one process, got {self.d.world} on {self.device}")
        if mid_epoch and task.steps_per_epoch is None:
            raise ValueError("`mid_epoch`: the task must know its steps_per_epoch")
        if name_by not in ("step", "epoch") or (name_by == "epoch" and (mid_epoch or ckpt_every)):
            raise ValueError(f"`name_by`: expected 'step', or 'epoch' without checkpoints inside an epoch, "
                             f"got {name_by!r}")
        self.task, self.schedule = task, schedule
        self.bf16, self.clip, self.accum, self.cuda_graph = bf16, clip, accum, cuda_graph
        self.checkpoint_dir, self.run_id = checkpoint_dir, run_id
        self.keep_last, self.name_by = keep_last, name_by
        self.run_dir = run_dir if run_dir is not None else checkpoint_dir
        self.take_lock = lock
        self.ckpt_every, self.eval_every, self.mid_epoch = ckpt_every, eval_every, mid_epoch
        self.log_every, self.tensorboard = log_every, tensorboard
        self.progress, self.name, self.raise_on_divergence = progress, name, raise_on_divergence
        self.wrapped = D.wrap(task.model, parallel, self.d, **(fsdp or {}))
        self.optimizer = optimizer if isinstance(optimizer, torch.optim.Optimizer) else optimizer(self.wrapped)
        if cuda_graph:  # the learning rate a CUDA tensor, which `set_lr` changes in place under the graph
            set_capturable(self.optimizer, self.device)
        self.step, self.epoch, self.iteration, self.history, self.seconds = 0, 0, 0, [], 0.0
        self.sums: torch.Tensor | None = None
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)  # since the last log record
        self.loss_count, self.one = 0, torch.ones(1, dtype=torch.float64, device=self.device)
        self.lock = self.log = self.bar = self.saved = None
        self.started = False

    # --- start and stop -----------------------------------------------------------------------------------------

    def start(self) -> bool:
        """Lock the run folder, load the newest checkpoint (model, optimiser, position, RNG) and open the run log;
        returns whether there was a checkpoint. Releases the lock if anything fails."""
        if self.run_dir is not None and self.take_lock:
            self.lock = guard.RunLock(str(self.run_dir), self.d if self.d.world > 1 else None)
        try:
            resumed = self._resume()
            if self.d.main:
                self._remove_stale()
            if self.log_every and self.run_dir is not None:
                self.log = RunLogger(str(self.run_dir), enabled=self.d.main, start_step=self.step,
                                     tensorboard=self.tensorboard)
        except BaseException:
            self.close()
            raise
        self.started = True
        return resumed

    def _remove_stale(self) -> None:
        """What an interrupted save left: temporary checkpoint files and folders, a half-rewritten run log."""
        if self.checkpoint_dir is not None:
            sharded.remove_stale(str(self.checkpoint_dir))
        if self.run_dir is not None and os.path.exists(os.path.join(self.run_dir, "log.jsonl.tmp")):
            os.remove(os.path.join(self.run_dir, "log.jsonl.tmp"))

    def close(self) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None
        if self.log is not None:
            self.log.close()
            self.log = None

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
            on_step: Callable[[], bool | None] | None = None, on_epoch: Callable[[dict], None] | None = None) -> Fit:
        """Train to `epochs` (from the newest checkpoint), stopping early, on divergence, at `max_steps`, after the
        step that passes `deadline` (a `time.time()` value) or inside an epoch when `on_step()`, which runs after
        every step, returns True. `on_epoch(entry)` runs after every epoch (after its checkpoint). The run folder
        is unlocked on return."""
        try:
            if not self.started:
                self.start()
            return self._fit(epochs, max_steps, deadline, on_step, on_epoch)
        finally:
            if self.bar is not None:  # closed before an error propagates, so that its message starts a new line
                self.bar.close()
                self.bar = None
            self.close()

    def _fit(self, epochs, max_steps, deadline, on_step, on_epoch) -> Fit:
        task = self.task
        step_fn = self._step_function()
        start = time.time() - self.seconds
        watch = guard.FiniteWatch(self.device, every_rank=self.d.world > 1)
        self.bar = bar = self._bar(epochs)
        self.t_log = time.time()
        stopped, diverged, early, lr, norm = None, False, False, None, None
        while self.epoch < epochs and stopped is None and not (diverged or early):
            t_epoch, first, steps = time.time(), self.iteration, 0
            self.wrapped.train()
            for batch in task.batches(self.epoch, self.iteration):
                new_lr = self.schedule(self.step, self.epoch)
                if new_lr != lr:
                    set_lr(self.optimizer, new_lr)
                    lr = new_lr
                with guard.step_values(self.step + 1):
                    loss, sums, norm = step_fn(batch)
                self.step, self.iteration, steps = self.step + 1, self.iteration + 1, steps + 1
                self._add(loss, sums)
                watch.update(self.step, self.sums_step[0], norm)  # the same on every rank, so that all stop together
                at_end = self.iteration == task.steps_per_epoch
                if bar is not None:
                    bar.update(1)
                if self.log_every and (self.step % self.log_every == 0 or (at_end and self.epoch == epochs - 1)):
                    self._log_step(watch, lr, norm)
                if self.eval_every and self.step % self.eval_every == 0 and not at_end:
                    with self._evaluation(watch):
                        self.validate()
                stopped = ("on_step" if on_step is not None and on_step() and not at_end else
                           "max_steps" if max_steps is not None and self.step >= max_steps else
                           "max_minutes" if deadline is not None and time.time() > deadline else None)
                if stopped is not None:
                    break
                if self.ckpt_every and self.step % self.ckpt_every == 0 and (self.task.by_steps or not at_end):
                    self._save(watch)  # an epoch's end is saved with its history entry, a run of steps' as any step
            else:
                at_end = True
            self.seconds = time.time() - start
            if stopped is not None and self.mid_epoch and not at_end:
                self._save(watch)  # continued at this iteration by the next call
                break
            diverged = watch.bad_step() is not None
            sums = self.sums.tolist() if self.sums is not None else [0.0, 0.0]
            train_time = time.time() - t_epoch
            with self._evaluation(watch):  # a diverged epoch is neither evaluated nor saved
                metrics = task.evaluate(self.wrapped)
            entry = task.entry(EpochEnd(self.epoch, self.step, float(lr if lr is not None else 0.0), sums, metrics,
                                        self.seconds, train_time, time.time() - t_epoch, steps, first == 0))
            self.history.append(entry)
            if self.log is not None and entry:
                self.log.log({"kind": "val", "step": self.step, **entry})
            early = task.done(entry)
            if not diverged and at_end:  # else a limit without mid_epoch cut the epoch short: evaluated, not saved
                self.epoch, self.iteration, self.sums = self.epoch + 1, 0, None
                if self.saved != self.step:
                    self._save(watch)
            self._print(task.line({"step": self.step, **entry}))
            if on_epoch is not None:
                on_epoch(entry)
        return Fit(self.history, self.step, self.epoch, time.time() - start, stopped, diverged, early)

    def _add(self, loss: torch.Tensor, sums: torch.Tensor | None) -> None:
        """Add a step's sums (None: [loss, 1]) and loss, summed over ranks in one reduction (on the device: no host
        sync)."""
        loss = loss.detach().double().reshape(1)
        both = D.total(torch.cat([loss, self.one, loss] if sums is None else [sums, loss]), self.d)
        self.sums_step = both[:-1]
        self.sums = self.sums_step if self.sums is None else self.sums + self.sums_step
        self.loss_sum = self.loss_sum + (both[-1] if self.d.world == 1 else both[-1] / self.d.world)
        self.loss_count += 1

    @contextlib.contextmanager
    def _evaluation(self, watch: guard.FiniteWatch):
        """Around an evaluation of the model as trained so far: a run that stops on divergence stops as diverged
        before it (a diverged model's evaluation fails on its own checks) or in it (weights that left their range
        in the last update, whose loss was still finite)."""
        if not self.raise_on_divergence:
            yield
            return
        watch.check(f" ({self.name})")
        with guard.step_values(self.step):
            yield

    def validate(self) -> dict:
        """Evaluate now (between epochs' ends): logged as a "val" record and printed; returns the record."""
        record = {"step": self.step, **self.task.evaluate(self.wrapped)}
        if self.log is not None and len(record) > 1:
            self.log.log({"kind": "val", **record})
        self._print(self.task.line(record))
        return record

    def _print(self, line: str | None) -> None:
        if line and self.d.main:
            (self.bar.write if self.bar is not None else print)(line)  # above the progress bar

    def _bar(self, epochs: int):
        if not (self.progress and self.d.main):
            return None
        from tqdm.auto import tqdm

        spe = self.task.steps_per_epoch
        return tqdm(total=epochs * spe if spe else None, initial=self.step, desc=self.name, unit="step",
                    dynamic_ncols=True)

    def _log_step(self, watch: guard.FiniteWatch, lr, norm) -> None:
        if self.raise_on_divergence:
            watch.check(f" ({self.name})")
        now = time.time()
        steps = self.loss_count
        record = {"kind": "train", "step": self.step, **({} if self.task.by_steps else {"epoch": self.epoch}),
                  "loss": self.loss_sum.item() / max(steps, 1), "lr": lr,
                  **({} if norm is None else {"grad_norm": float(norm)}),
                  **self.task.running(self.sums.tolist(), self.step, steps / max(now - self.t_log, 1e-9))}
        self.loss_sum, self.loss_count, self.t_log = torch.zeros_like(self.loss_sum), 0, now
        if self.log is not None:
            self.log.log(record)
        if self.bar is not None:
            self.bar.set_postfix({k: f"{v:.4g}" for k, v in record.items()
                                  if k not in ("kind", "step", "epoch") and isinstance(v, float)})

    # --- the step -----------------------------------------------------------------------------------------------

    def _autocast(self):
        # autocast's weight cache must be off while a graph is captured
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16,
                              cache_enabled=not self.cuda_graph)

    def _loss(self, *batch: torch.Tensor, sums: list | None = None) -> torch.Tensor:
        """A micro-batch's loss; the task's sums, if it gives them, appended to `sums`."""
        with self._autocast():
            out = self.task.loss(self.wrapped, *batch)
        loss, task_sums = out if isinstance(out, tuple) else (out, None)
        if sums is not None and task_sums is not None:
            sums.append(task_sums)
        return loss

    def _step_function(self) -> Callable[[tuple], tuple]:
        """One optimiser step on a batch (`graphed.train_step`), returning (loss, the task's sums or None, gradient
        norm or None): eager, or replayed as a CUDA graph."""
        max_norm = None if self.clip is None else (self.clip or math.inf)
        if self.cuda_graph:
            # the task's sums of each call's micro-batches; from the capture on, the graph's own tensors, which
            # every replay rewrites (a replay runs no Python, so it appends nothing)
            captured: list = []
            graphed = GraphedStep(lambda *micro: self._loss(*micro, sums=captured), self.optimizer,
                                  pad_values=self.task.pad_values, accum=self.accum, max_norm=max_norm)

            def replay(batch):
                loss, norm = graphed(*batch)
                del captured[:-self.accum]
                self.task.after_step()
                return loss, sum(captured[1:], captured[0]) if captured else None, norm

            return replay

        def eager(batch):
            sums = []
            loss, norm = train_step(lambda *micro: self._loss(*micro, sums=sums), self.optimizer, batch, self.accum,
                                    max_norm, sync=lambda last: D.no_sync(self.wrapped, last))
            self.optimizer.zero_grad(set_to_none=True)  # no gradients held through evaluation and checkpoints
            self.task.after_step()
            return loss, sum(sums[1:], sums[0]) if sums else None, norm

        return eager

    # --- checkpoints --------------------------------------------------------------------------------------------

    def _save(self, watch: guard.FiniteWatch) -> None:
        if self.checkpoint_dir is None:
            return
        if self.raise_on_divergence:
            watch.check(f" ({self.name})")  # a diverged step is never saved
        self.saved = self.step
        state = dict(step=self.step, epoch=self.epoch, iteration=self.iteration, history=self.history,
                     rng=D.gather_objects(checkpoint.rng_state(self.device), self.d), world=self.d.world,
                     epoch_sums=self.sums.tolist() if self.sums is not None else [], loss_sum=self.loss_sum.item(),
                     loss_count=self.loss_count, seconds=self.seconds, run_id=self.run_id, **self.task.state())
        sharded.save(str(self.checkpoint_dir), self.step if self.name_by == "step" else self.epoch, self.wrapped,
                     self.optimizer, state, self.d, self.keep_last)

    def _resume(self) -> bool:
        if self.checkpoint_dir is None:
            return False
        if self.cuda_graph:  # DCP's state initialisation steps once, with a CPU rate for a tensor one
            set_capturable(self.optimizer, None)
        state = sharded.load_latest(str(self.checkpoint_dir), self.wrapped, self.optimizer, self.d)
        if self.cuda_graph:  # the learning rate a CUDA tensor again, the step counts on the device
            set_capturable(self.optimizer, self.device)
        if state is None:
            return False
        state = _upgrade(state)
        if self.run_id and state.get("run_id", self.run_id) != self.run_id:
            raise ValueError(f"`checkpoint_dir`: holds run {state['run_id']}, not {self.run_id}")
        self.task.load_state(state)
        self.step, self.history, self.seconds = state["step"], state.get("history", []), state.get("seconds", 0.0)
        if self.task.by_steps:
            self.epoch, self.iteration = divmod(self.step, self.task.steps_per_epoch)
        else:
            self.epoch, self.iteration = state["epoch"], state.get("iteration", 0)
        sums = state.get("epoch_sums") or []
        self.sums = torch.tensor(sums, dtype=torch.float64, device=self.device) if sums else None
        self.loss_sum = torch.tensor(float(state.get("loss_sum", 0.0)), dtype=torch.float64, device=self.device)
        self.loss_count = state.get("loss_count", 0)
        rngs = state["rng"]
        if len(rngs) != self.d.world and self.d.main:
            print(f"note: checkpoint written by {len(rngs)} rank(s), resuming on {self.d.world}: every rank takes "
                  "the first rank's RNG state")
        checkpoint.set_rng_state(rngs[self.d.rank] if self.d.rank < len(rngs) else rngs[0], self.device)
        return True


def _upgrade(state: dict) -> dict:
    """A checkpoint of the engine's first layout (`steps`, one RNG dict, a scheduler) in the present one."""
    if "steps" not in state or "step" in state:
        return state
    return {**state, "step": state["steps"], "epoch": len(state["history"]), "rng": [state["rng"]]}


def cosine(lr: float, t: int, total: int, floor: float = 0.0) -> float:
    """Cosine from `lr` at t = 0 to `floor` at t = `total` (torch's CosineAnnealingLR in closed form)."""
    return floor + 0.5 * (lr - floor) * (1 + math.cos(math.pi * t / total))
