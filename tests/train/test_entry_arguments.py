"""The experiment commands refuse a bad argument in one line before any run starts (nothing trained, nothing
written), instead of failing run by run."""

from __future__ import annotations

import pytest

from hgrn2.cli import console


@pytest.fixture(autouse=True)
def _no_traceback(monkeypatch):
    monkeypatch.delenv("HGRN2_TRACEBACK", raising=False)


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


@pytest.mark.parametrize("argv, message", [
    (["--epochs", "0"], "--epochs: expected a positive number, got 0"),
    (["--mixers", "bogus"], "--mixers: unknown token mixer 'bogus'"),
    (["--mixers", "hgrn2,bogus"], "--mixers: unknown token mixer 'bogus'"),
    (["--dims", "64", "0"], "--dims: expected a positive number, got 0"),
    (["--lrs", "nan"], "--lrs: expected positive finite learning rates, got nan"),
    (["--lrs=-1e-3"], "--lrs: expected positive finite learning rates"),
    (["--max-minutes", "-1"], "--max-minutes: expected a positive number of minutes"),
])
def test_mqar_refuses_before_any_run(argv, message, tmp_path, capsys):
    assert console(["mqar", "--out", str(tmp_path / "out"), "--device", "cpu", *argv]) == 2
    assert message in _one_line(capsys)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("value", ["-1", "0", "nan"])
def test_ablate_refuses_a_budget_that_trains_nothing(value, tmp_path, capsys):
    assert console(["ablate", "expand", "--scale", "smoke", "--out", str(tmp_path / "out"),
                    "--max-minutes", value]) == 2
    assert "--max-minutes: expected a positive number of minutes" in _one_line(capsys)
    assert not (tmp_path / "out").exists()


def test_vision_eval_on_a_language_model_run(tmp_path, capsys):
    """A run folder of `hgrn2 train` (its checkpoint as the trainer writes it) is named, not a TypeError."""
    import torch

    from hgrn2.train import checkpoint

    state = {"step": 1, "model": {"w": torch.zeros(1)}, "optimizer": {}, "rng": [], "loss_sum": 0.0,
             "loss_count": 0, "config": {"arch": "hgrn2", "max_steps": 1}, "world": 1}
    checkpoint.save(str(tmp_path / "lm" / "checkpoints"), 1, state, keep_last=1)
    assert console(["vision", "eval", "--run", str(tmp_path / "lm")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "is not a `hgrn2 vision train` run" in err
