"""The training engine (`hgrn2.train.engine`) on a toy task, and the run folders of the loops it replaced: an LRA
or vision checkpoint in the layout the earlier loops wrote resumes to the same weights as a run that never
stopped."""

import json
import math
import shutil
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from hgrn2.cli import main as cli_main
from hgrn2.train import checkpoint as ckpt
from hgrn2.train import guard, sharded
from hgrn2.train.engine import Engine, Task, cosine
from tests.train.test_guarantees import lra_args, lra_run_dir, steps_of
from tests.train.test_vision import check_resume_trains_the_same_weights, make_fashion_fixture


class Regression(Task):
    """A linear model on fixed data with dropout (an RNG the resume must restore); batches of a per-epoch order."""

    def __init__(self, n=48, batch=8, poison_at=None):
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 4, generator=g), torch.randn(n, generator=g)
        torch.manual_seed(1)
        self.model = torch.nn.Sequential(torch.nn.Dropout(0.2), torch.nn.Linear(4, 1))
        self.batch, self.steps_per_epoch, self.poison_at, self.calls = batch, n // batch, poison_at, 0

    def batches(self, epoch, start):
        order = torch.randperm(len(self.x), generator=torch.Generator().manual_seed(epoch))
        for it in range(start, self.steps_per_epoch):
            idx = order[it * self.batch:(it + 1) * self.batch]
            yield self.x[idx], self.y[idx]

    def loss(self, model, x, y):
        self.calls += 1
        loss = F.mse_loss(model(x)[:, 0], y)
        return loss * math.nan if self.calls == self.poison_at else loss

    def evaluate(self, model):
        with torch.no_grad():
            return {"mse": F.mse_loss(model(self.x)[:, 0], self.y).item()}

    def score(self, entry):
        return -entry["mse"]


def engine(task, directory, **kw):
    opt = torch.optim.AdamW(task.model.parameters(), lr=1e-2)
    return Engine(task, opt, lambda step, epoch: cosine(1e-2, step, 40), checkpoint_dir=directory,
                  mid_epoch=True, clip=1.0, **kw)


def weights(task):
    return [p.detach().clone() for p in task.model.parameters()]


def test_a_limit_inside_an_epoch_saves_and_resumes_at_the_iteration(tmp_path):
    whole = Regression()
    ref = engine(whole, tmp_path / "whole").fit(3)
    task = Regression()
    fit = engine(task, tmp_path / "parts").fit(3, max_steps=4)  # epoch 0 has 6 steps
    assert (fit.stopped, fit.step, fit.history) == ("max_steps", 4, [])
    assert steps_of(tmp_path / "parts") == [4] and sharded.read_latest(str(tmp_path / "parts"))["iteration"] == 4
    assert engine(Regression(), tmp_path / "parts").fit(3, max_steps=11).stopped == "max_steps"
    task = Regression()
    fit = engine(task, tmp_path / "parts").fit(3)
    assert fit.step == ref.step == 18 and fit.stopped is None
    drop = lambda h: [{k: v for k, v in e.items() if k != "seconds"} for e in h]  # noqa: E731
    assert drop(fit.history) == drop(ref.history)  # the epochs' metrics and sums, whichever call trained them
    assert all(torch.equal(a, b) for a, b in zip(weights(task), weights(whole)))


def test_the_best_epoch_is_the_tasks_best_score(tmp_path):
    e = engine(Regression(), tmp_path)
    assert e.best() is None
    history = e.fit(4).history
    assert e.best() is min(history, key=lambda h: h["mse"]) and len({h["mse"] for h in history}) == 4


def test_a_deadline_stops_after_the_step_that_passes_it(tmp_path):
    fit = engine(Regression(), tmp_path).fit(3, deadline=time.time() - 1)
    assert (fit.stopped, fit.step) == ("max_minutes", 1) and steps_of(tmp_path) == [1]
    e = engine(Regression(), tmp_path)
    e.start()
    assert (e.step, e.iteration) == (1, 1) and e.nothing_to_train(3) is None
    assert e.nothing_to_train(3, max_steps=1) == "it is at step 1, --max-steps is 1"
    e.close()


def test_divergence_stops_and_keeps_the_last_finite_checkpoint(tmp_path):
    with pytest.raises(guard.Diverged, match="not finite from step 9 "):
        engine(Regression(poison_at=9), tmp_path, ckpt_every=4, keep_last=5).fit(3)
    assert steps_of(tmp_path) == [4, 6, 8]  # every 4 steps and the epoch end: none after the NaN
    state = sharded.read_latest(str(tmp_path))
    assert all(v.isfinite().all() for v in state["model"].values())


def test_a_second_engine_on_a_run_folder_is_refused(tmp_path):
    first = engine(Regression(), tmp_path)
    first.start()
    with pytest.raises(guard.RunError, match="in use by another process"):
        engine(Regression(), tmp_path).start()
    first.close()
    engine(Regression(), tmp_path).fit(1)


def test_engine_arguments_are_checked():
    with pytest.raises(ValueError, match="`cuda_graph`: needs a CUDA device"):
        engine(Regression(), None, cuda_graph=True)
    with pytest.raises(ValueError, match="`name_by`"):
        engine(Regression(), None, name_by="epoch")


# --- run folders of the earlier loops -------------------------------------------------------------------------------

# the keys the loops wrote before they trained on the engine
OLD_LRA = {"model", "optimizer", "step", "epoch", "iteration", "history", "rng", "epoch_sums", "settings", "epochs"}
OLD_VISION = {"model", "optimizer", "ema", "epoch", "step", "best_acc1", "rng", "config", "model_config"}


def _to_old_layout(directory: Path, keys: set) -> None:
    """Rewrite the newest checkpoint in `directory` as the earlier loop's single file, with its keys only (the
    optimiser's state as `optimizer.state_dict()` keeps it: by parameter index)."""
    found = sharded.list_checkpoints(str(directory))
    step, path = found[-1]
    state = sharded.read_latest(str(directory))
    names = [name for group in state["param_groups"] for name in group["params"]]
    optim = sharded.read_model(path, "optim")
    state["optimizer"] = {"state": {i: optim[n] for i, n in enumerate(names) if n in optim},
                          "param_groups": [{**g, "params": [names.index(n) for n in g["params"]]}
                                           for g in state["param_groups"]]}
    assert keys <= set(state)
    for _, p in found:
        shutil.rmtree(p)
    ckpt.save(str(directory), step, {k: state[k] for k in keys}, keep_last=2)


def test_an_lra_run_folder_of_the_earlier_loop_resumes_to_the_same_run(tmp_path):
    assert cli_main(lra_args(tmp_path / "whole", "--ckpt-every", "0")) == 0
    assert cli_main(lra_args(tmp_path / "old", "--ckpt-every", "0", "--max-steps", "7")) == 0  # inside epoch 2
    run = lra_run_dir(tmp_path / "old")
    _to_old_layout(run / "ckpt", OLD_LRA)
    assert sharded.read_latest(str(run / "ckpt"))["iteration"] == 2
    assert cli_main(lra_args(tmp_path / "old", "--ckpt-every", "0")) == 0
    whole, old = (json.loads((lra_run_dir(tmp_path / n) / "result.json").read_text()) for n in ("whole", "old"))
    strip = lambda r: [{k: v for k, v in h.items() if k not in ("epoch_time", "complete")}  # noqa: E731
                       for h in r["history"]]
    assert old["steps"] == whole["steps"] == 10 and strip(old) == strip(whole)
    a, b = (sharded.read_latest(str(lra_run_dir(tmp_path / n) / "ckpt"))["model"] for n in ("whole", "old"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_vision_run_folder_of_the_earlier_loop_resumes_to_the_same_run(tmp_path):
    images = make_fashion_fixture(tmp_path / "images")
    check_resume_trains_the_same_weights(images, tmp_path, between=lambda ckpts: _to_old_layout(ckpts, OLD_VISION))


@pytest.mark.parametrize("saved, resumed", [(None, True), (True, None)])
def test_a_resume_keeps_the_optimisers_own_step_kind(tmp_path, saved, resumed):
    """`fused` says how this process steps, not what it learned: a checkpoint of the other kind resumes into the
    optimiser as built, to the weights of a run that never stopped (CPU's fused AdamW rounds a little otherwise)."""
    def build(fused):
        return lambda model: torch.optim.AdamW(model.parameters(), lr=1e-2, fused=fused)

    def run(task, directory, fused, **kw):
        e = Engine(task, build(fused), lambda step, epoch: cosine(1e-2, step, 40), checkpoint_dir=directory,
                   mid_epoch=True, clip=1.0)
        return e, e.fit(3, **kw)

    whole = Regression()
    run(whole, tmp_path / "whole", resumed)
    run(Regression(), tmp_path / "parts", saved, max_steps=7)
    task = Regression()
    e, fit = run(task, tmp_path / "parts", resumed)
    assert fit.step == 18 and [g["fused"] for g in e.optimizer.param_groups] == [resumed]
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(weights(task), weights(whole)))
