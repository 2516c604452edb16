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


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("argv", [["mqar", "--device", "cuda"], ["ablate", "expand", "--device", "cuda"],
                                  ["generate", "no-model", "--prompt", "hi", "--device", "cuda"],
                                  ["eval", "ppl", "no-model", "no-data", "--device", "cuda:0"],
                                  ["generate", "no-model", "--prompt", "hi", "--device", "foo"]])
def test_a_device_this_machine_lacks_is_refused_before_any_work(argv, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:  # argparse's error: the usage, then the line naming the argument
        console(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "argument --device: " in err.strip().splitlines()[-1]
    assert not list(tmp_path.iterdir())


def test_malformed_yaml_is_one_line_naming_where(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("max_steps: [1, 2\n")
    assert console(["train", "--config", str(bad)]) == 2
    assert f"config {bad}: invalid YAML (line 2, column 1)" in _one_line(capsys)
    assert console(["train", "--config", "tiny", "--set", "betas=[0.9"]) == 2
    assert "--set betas: '[0.9' is not a YAML value" in _one_line(capsys)


def _last_line_after_usage(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize("argv, message", [
    (["data", "prepare", "in.txt", "--out", "{file}"], "argument --out: '{file}' is a file, not a folder"),
    (["data", "prepare", "in.txt", "--out", "{file}/sub"], "cannot be a folder: {file} is a file"),
    (["eval", "ppl", "model", "data", "--out", "{file}"], "argument --out: '{file}' is a file, not a folder"),
    (["data", "corpus", "python-docs", "c", "--max-bytes", "abc"],
     "argument --max-bytes: expected a size like 500000, 2M or 1.5G, got 'abc'"),
    (["data", "corpus", "python-docs", "c", "--max-bytes", "0"], "argument --max-bytes: expected a positive size"),
    (["mqar", "--lrs", "abc"], "argument --lrs: expected numbers (space- or comma-separated), got 'abc'"),
])
def test_argument_errors_name_the_argument(argv, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    file = tmp_path / "afile.txt"
    file.write_text("x")
    with pytest.raises(SystemExit) as e:
        console([a.replace("{file}", str(file)) for a in argv])
    assert e.value.code == 2 and message.replace("{file}", str(file)) in _last_line_after_usage(capsys)


@pytest.mark.parametrize("argv, message", [
    (["train", "--config", "tiny", "--set", "out_dir={file}"], "out_dir: '{file}' is a file, not a folder"),
    (["plot", "run", "--out", "loss.txt"], "--out: 'loss.txt': expected an image file name ending in one of .png"),
    (["mqar", "--seq-lens", "64:100", "--device", "cpu"], "--seq-lens: 64:100: num_kv_pairs must be in [1, seq_len/4]"),
    (["mqar", "--seq-lens", "x:3", "--device", "cpu"], "--seq-lens: expected L or L:kv with positive integers"),
])
def test_run_time_argument_errors_are_one_line(argv, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    file = tmp_path / "afile.txt"
    file.write_text("x")
    assert console([a.replace("{file}", str(file)) for a in argv]) == 2
    assert message.replace("{file}", str(file)) in _one_line(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile.txt"]
