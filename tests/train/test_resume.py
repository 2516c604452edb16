"""Exact resume after SIGKILL: a run killed mid-way and restarted logs the same losses, validation losses and final
weights as a run that never stopped; with its newest checkpoint truncated it falls back to the previous one and
still matches."""

import os
import signal
import subprocess
import time

import pytest
from safetensors.torch import load_file

from tests.train.helpers import ROOT, base_overrides, env, losses, make_corpus, run_train, train_cmd


def _kill_after_checkpoint(overrides, out_dir, step):
    """Start a run and SIGKILL it as soon as the checkpoint of `step` is complete."""
    p = subprocess.Popen(train_cmd(overrides), cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    marker = os.path.join(out_dir, "checkpoints", f"step_{step:08d}")  # renamed into place when complete
    deadline = time.time() + 120
    while not os.path.exists(marker):
        assert p.poll() is None, p.stdout.read().decode()[-3000:]
        assert time.time() < deadline, "run did not reach the checkpoint in time"
        time.sleep(0.005)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert p.returncode == -signal.SIGKILL
    assert not os.path.exists(os.path.join(out_dir, "final")), "the run finished before it was killed"


@pytest.mark.slow
def test_sigkill_then_resume_reproduces_the_uninterrupted_run(tmp_path):
    data = make_corpus(tmp_path / "data")
    max_steps = 80  # long enough that the kill lands mid-run; the tiny model does ~50 steps/s
    ref_dir, cut_dir = str(tmp_path / "ref"), str(tmp_path / "cut")
    run_train(base_overrides(data, ref_dir, max_steps=max_steps))
    ref = losses(ref_dir)
    assert len(ref) == max_steps and ref[max_steps] < ref[1] - 0.5  # it trains

    overrides = base_overrides(data, cut_dir, max_steps=max_steps)
    _kill_after_checkpoint(overrides, cut_dir, 12)
    # corrupt the newest checkpoint: resume must warn and use the one before
    ckpts = sorted(f for f in os.listdir(os.path.join(cut_dir, "checkpoints")) if not f.endswith(".tmp"))
    newest = os.path.join(cut_dir, "checkpoints", ckpts[-1], "__0_0.distcp")
    with open(newest, "r+b") as f:
        f.truncate(os.path.getsize(newest) // 2)
    p = run_train(overrides)
    assert "is unusable" in p.stderr
    resumed_from = int(p.stdout.split("resumed from step ")[1].split()[0])
    assert 8 <= resumed_from < max_steps and resumed_from == int(ckpts[-2][5:13])

    got = losses(cut_dir)
    assert sorted(got) == list(range(1, max_steps + 1))  # no step missing or logged twice
    assert got == ref  # bit-exact: same data order, RNG (dropout), optimiser state and schedule
    assert losses(cut_dir, "val", "val_loss") == losses(ref_dir, "val", "val_loss")
    a = load_file(os.path.join(ref_dir, "final", "model.safetensors"))
    b = load_file(os.path.join(cut_dir, "final", "model.safetensors"))
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
