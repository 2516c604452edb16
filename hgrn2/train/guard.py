"""What every training loop guarantees about its run directory, shared by `train`, `lra`, `vision`, `mqar` and
`ablate`: one process at a time (`RunLock`), a stop before a non-finite step reaches a checkpoint (`FiniteWatch`),
and a resume only with the settings the run started with (`check_resume`).

Failures are `RunError`s: one line for the user (the CLI prints it and exits 1; under torchrun rank 0 alone prints
one that every rank raised alike), what was saved before is intact.
"""

from __future__ import annotations

import contextlib
import os
import sys

import torch

STOPPED = ("stopped without saving it: the checkpoints, if any, hold finite steps only (lower the learning rate or "
           "clip gradients, and start again from the newest one or from scratch)")


class RunError(RuntimeError):
    """A run cannot go on; its message is one line and names what to do. `every_rank`: under torchrun every rank
    raises it with the same message (a divergence, a refused lock), which rank 0 alone prints (`print_error`)."""

    def __init__(self, message: str, every_rank: bool = False):
        super().__init__(message)
        self.every_rank = every_rank


class Diverged(RunError):
    """The loss or the gradient norm turned non-finite; the checkpoints hold only finite steps."""


def print_error(name: str, e: BaseException) -> None:
    """`NAME: error: E` on stderr; on rank 0 alone where every rank of a torchrun launch raised the same error."""
    from . import distributed as D

    if getattr(e, "every_rank", False) and not D.main_process():
        return
    print(f"{name}: error: {e}", file=sys.stderr)


def train_command(name: str, build) -> int:
    """The exit status of a training command: `build()` makes its trainer (bad input: exit 2; the run folder in use,
    no intact checkpoint: exit 1), whose `train()` then runs (a full disk, a diverged run: exit 1, what was saved is
    intact); a failure is printed as one line `NAME: error: ...`. The process group is left on return."""
    from . import distributed as D

    try:
        trainer = build()
    except (ValueError, FileNotFoundError, FileExistsError, RunError) as e:
        print_error(name, e)
        D.shutdown()
        return 1 if isinstance(e, RunError) else 2
    try:
        trainer.train()
    except (OSError, RunError) as e:
        print_error(name, e)  # before D.shutdown's barrier, so that rank 0 has printed before any rank exits
        return 1
    finally:
        del trainer  # before the process group goes (D.shutdown)
        D.shutdown()
    return 0


class RunLock:
    """An exclusive lock (flock) on `<directory>/.lock` for as long as the run trains in it. Under torchrun rank 0
    takes it and every rank learns the outcome, so that all refuse together."""

    def __init__(self, directory: str, d=None):
        from . import distributed as D

        self.file = None
        error = self._take(directory) if d is None or d.main else None
        if d is not None:
            error = D.gather_objects(error, d)[0]  # rank 0's outcome
        if error:
            raise RunError(error, every_rank=d is not None and d.world > 1)

    def _take(self, directory: str) -> str | None:
        import fcntl

        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, ".lock")
        f = open(path, "a+")  # noqa: SIM115 - held open for the run's lifetime
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.seek(0)
            holder = f.read().strip() or "?"
            f.close()
            return (f"{directory} is in use by another process (pid {holder}); wait for it to finish or use another "
                    "output directory")
        f.truncate(0)
        f.write(str(os.getpid()))
        f.flush()
        self.file = f
        return None

    def release(self) -> None:
        if self.file is not None:
            self.file.close()  # closing drops the flock
            self.file = None

    def __del__(self):
        self.release()


class FiniteWatch:
    """Remembers on the device the first step whose loss or gradient norm was not finite (no host sync per step);
    `check()` reads it, and is called before anything is saved."""

    def __init__(self, device: torch.device, every_rank: bool = False):
        """`every_rank`: the watched values are summed over the ranks of a torchrun launch, so that every rank stops
        at the same check with the same `Diverged`."""
        self.first_bad = torch.zeros((), dtype=torch.int64, device=device)  # 0: every step finite
        self.every_rank = every_rank

    def update(self, step: int, *values: torch.Tensor | None) -> None:
        ok = torch.stack([v.detach().float().isfinite().all() for v in values if v is not None]).all()
        self.first_bad = torch.where((self.first_bad == 0) & ~ok, step, self.first_bad)

    def bad_step(self) -> int | None:
        step = int(self.first_bad)
        return step or None

    def check(self, what: str = "") -> None:
        step = self.bad_step()
        if step is not None:
            raise Diverged(f"the loss or gradient norm is not finite from step {step}{what}; {STOPPED}",
                           every_rank=self.every_rank)


@contextlib.contextmanager
def step_values(step: int):
    """The context of training step `step` (1-based): from the second step on, a ValueError of the model's value
    checks (a lower bound at 1, say) comes from weights that left their range, not from the input (the first step
    ran on the same shapes), and is reported as `Diverged`."""
    try:
        yield
    except ValueError as e:
        if step <= 1:
            raise
        raise Diverged(f"the model's values left their range at step {step} ({str(e).splitlines()[0][:200]}); "
                       f"{STOPPED}") from e


def same_path(a, b) -> bool:
    """Two spellings of one path (a trailing slash, `..`, a symlink) are the same."""
    if not a or not b:
        return a == b
    return os.path.realpath(str(a)) == os.path.realpath(str(b))


def absolute(settings: dict, paths) -> dict:
    """`settings` with its `paths` keys made absolute, as a checkpoint keeps them: a relative path resolved later
    from another working directory would name another folder."""
    return {**settings, **{k: os.path.abspath(str(settings[k])) for k in paths if settings.get(k)}}


def check_resume(where: str, saved: dict, now: dict, *, fixed, paths=(), extendable=()) -> list[str]:
    """Compare a run's saved settings with this call's: a change to a `fixed` key (or to the resolved `paths`) is
    refused in one line; a change of an `extendable` key (epochs, steps) is allowed and returned as one line each.
    Keys absent from `saved` (checkpoints from before they were kept) are not compared."""
    changed = {k: (saved[k], now[k]) for k in fixed if k in saved and k in now and saved[k] != now[k]}
    changed |= {k: (saved[k], now[k]) for k in paths if k in saved and k in now and not same_path(saved[k], now[k])}
    if changed:
        what = ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in changed.items())
        raise ValueError(f"{where} holds a run started with other settings ({what}); resume it with its own, "
                         "or use another output directory")
    return [f"{k} {saved[k]} -> {now[k]}: the run continues with the new value"
            for k in extendable if k in saved and k in now and saved[k] != now[k]]
