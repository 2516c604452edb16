"""The guarantees every training loop gives, tried on each task as a user would (`hgrn2.train.guard`): a diverged run
stops before it saves a non-finite step, a resume with other settings is refused or said in one line, a planted
checkpoint runs no code, a garbled log line loses nothing after it, a second process on a run directory is refused,
and a full disk or unreadable checkpoints end in one line."""

import dataclasses
import json
import math
import os
import pickle
from pathlib import Path

import pytest
import torch

from hgrn2.cli import console
from hgrn2.cli import main as cli_main
from hgrn2.train import checkpoint as ckpt
from hgrn2.train import distributed as D
from hgrn2.train import guard, sharded
from hgrn2.train.config import make_config
from hgrn2.train.logger import read_log
from hgrn2.train.mqar import train_run as mqar_run
from hgrn2.train.trainer import Trainer
from hgrn2.train.vision import VisionTrainer
from tests.train.helpers import base_overrides, make_corpus
from tests.train.test_mqar import tiny_spec
from tests.train.test_vision import fashion_config, make_fashion_fixture

FASHION = Path(__file__).resolve().parents[1] / "fixtures" / "lra" / "fashion-mnist"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("corpus"), n_train=3000, n_val=300)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return make_fashion_fixture(tmp_path_factory.mktemp("fmnist"))


def lm_config(data, out_dir, **kw):
    kw = {"max_steps": 8, "save_every": 4, "eval_every": 4, "dropout": 0.0, **kw}
    return make_config(None, base_overrides(data, str(out_dir), **kw))


def lra_args(out, *extra):
    return ["lra", "fashion_mnist", "--data", str(FASHION), "--out", str(out), "--epochs", "2", "--batch-size", "8",
            "--warmup-steps", "2", "--schedule-steps", "10", "--lr", "3e-3", "--device", "cpu", "--log-every", "1",
            "--ckpt-every", "2", "--model-options", json.dumps({"hidden_size": 8, "num_layers": 1}), *extra]


def lra_run_dir(out) -> Path:
    return Path(out) / "fashion_mnist-hgrn2"


def vision_trainer(images, out, *extra):
    return VisionTrainer(fashion_config(images, out, "epochs=2", *extra), D.init("cpu"))


def steps_of(directory) -> list[int]:
    """The steps of the checkpoints in `directory`: the trainer's folders (`sharded`) or the others' files."""
    return [step for step, _ in sharded.list_checkpoints(str(directory))]


def model_of(path) -> dict:
    return sharded.read_model(path) if os.path.isdir(path) else ckpt.load(path)["model"]


def all_finite(directory) -> bool:
    return all(v.isfinite().all() for _, path in sharded.list_checkpoints(str(directory))
               for v in model_of(path).values() if v.is_floating_point())


def corrupt(directory) -> None:
    """Overwrite the start of every checkpoint file (in every checkpoint folder) in `directory`."""
    for _, path in sharded.list_checkpoints(str(directory)):
        for f in ([os.path.join(path, n) for n in os.listdir(path) if n.endswith(".distcp")]
                  if os.path.isdir(path) else [path]):
            with open(f, "r+b") as fh:
                fh.write(b"garbage")


@pytest.fixture
def poison_after(monkeypatch):
    """`poison_after(k)`: from the k-th AdamW step on, the weights turn NaN, as a diverging run's do."""

    def arm(k: int):
        real, calls = torch.optim.AdamW.step, []

        def step(self, *a, **kw):
            out = real(self, *a, **kw)
            calls.append(1)
            if len(calls) >= k:
                with torch.no_grad():
                    for group in self.param_groups:
                        for p in group["params"]:
                            p.fill_(math.nan)
            return out

        monkeypatch.setattr(torch.optim.AdamW, "step", step)

    return arm


# --- a diverged run -------------------------------------------------------------------------------------------------


def test_diverged_lm_run_keeps_its_finite_checkpoints(corpus, tmp_path, poison_after):
    poison_after(6)  # step 7's loss is NaN
    with pytest.raises(guard.Diverged, match="step 7 ") as e:
        Trainer(lm_config(corpus, tmp_path, max_steps=16)).train()
    assert "\n" not in str(e.value)
    assert steps_of(tmp_path / "checkpoints") == [4] and all_finite(tmp_path / "checkpoints")
    assert not (tmp_path / "final").exists()
    assert all(math.isfinite(r["loss"]) for r in read_log(str(tmp_path / "log.jsonl")) if r["kind"] == "train")


def test_a_divergence_met_first_by_an_evaluation_is_reported_as_one(corpus, tmp_path, poison_after):
    """An evaluation before the next log line or save: the run stops as diverged, not on the evaluation's checks of
    the NaN model (the lower bounds' range)."""
    poison_after(3)  # step 3's update leaves NaN weights; the evaluation after it comes before any log line
    with pytest.raises(guard.Diverged, match="left their range at step 3 "):
        Trainer(lm_config(corpus, tmp_path, max_steps=16, log_every=7, eval_every=3)).train()
    assert not (tmp_path / "final").exists()


def test_lm_cli_with_a_huge_learning_rate_stops_in_one_line(corpus, tmp_path, capsys):
    rc = cli_main(["train", "--set", *base_overrides(corpus, str(tmp_path), max_steps=12, save_every=4, lr=1e4)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and err[-1].startswith("hgrn2 train: error: the ") and "step" in err[-1]
    assert not (tmp_path / "final").exists() and all_finite(tmp_path / "checkpoints")


def test_diverged_lra_run_keeps_its_finite_checkpoints(tmp_path, poison_after):
    poison_after(3)
    with pytest.raises(guard.Diverged, match="step 4 "):
        cli_main(lra_args(tmp_path))
    run = lra_run_dir(tmp_path)
    assert steps_of(run / "ckpt") == [2] and all_finite(run / "ckpt")


def test_diverged_vision_run_keeps_its_finite_checkpoints(images, tmp_path, poison_after):
    poison_after(4)  # 3 steps per epoch: the first epoch's checkpoint is finite
    with pytest.raises(guard.Diverged, match="step 5 "):
        vision_trainer(images, tmp_path, "clip_grad=0").train()
    assert steps_of(tmp_path / "checkpoints") == [1] and all_finite(tmp_path / "checkpoints")


def test_diverged_mqar_run_is_a_result_and_saves_nothing_diverged(tmp_path, poison_after):
    poison_after(20)  # 512 / 32 = 16 steps per epoch: the second epoch diverges
    result = mqar_run(tiny_spec(epochs=4), "cpu", data_dir=tmp_path, checkpoint_dir=tmp_path / "ckpt")
    assert result["diverged"] and result["epochs_run"] == 2 and result["complete"]
    assert steps_of(tmp_path / "ckpt") == [1] and all_finite(tmp_path / "ckpt")


def test_negative_gradient_clipping_is_refused():
    with pytest.raises(ValueError, match="grad_clip must be >= 0, got -1"):
        make_config(None, ["grad_clip=-1"])
    with pytest.raises(ValueError, match="`clip_grad`: expected >= 0"):
        fashion_config("x", "y", "clip_grad=-1")
    with pytest.raises(ValueError, match="`--grad-clip`: expected at least 0"):
        cli_main(lra_args("/nonexistent", "--grad-clip", "-1"))


# --- resumes with other settings ------------------------------------------------------------------------------------


def test_lm_resume_refuses_other_settings_and_says_what_changes(corpus, tmp_path, capsys):
    Trainer(lm_config(corpus, tmp_path)).train()
    for key, value in (("lr", 1e-3), ("schedule", "constant"), ("seed", 5), ("grad_clip", 0.5)):
        with pytest.raises(ValueError, match=rf"other settings \({key} "):
            Trainer(lm_config(corpus, tmp_path, **{key: value}))
    log = (tmp_path / "log.jsonl").read_text()
    capsys.readouterr()
    assert Trainer(lm_config(corpus, tmp_path, max_steps=4)).train() == {"stopped_at": 8}
    printed = capsys.readouterr().out
    assert "at step 8, past max_steps=4: nothing to train" in printed and "the run continues" not in printed
    assert steps_of(tmp_path / "checkpoints") == [4, 8] and (tmp_path / "log.jsonl").read_text() == log
    # the data through a symlink and with a trailing slash is the same data; more steps continue the run
    os.symlink(corpus, tmp_path / "link")
    Trainer(lm_config(str(tmp_path / "link") + "/", tmp_path, max_steps=12)).train()
    assert "max_steps 8 -> 12: the run continues with the new value" in capsys.readouterr().out
    assert steps_of(tmp_path / "checkpoints") == [4, 8, 12]
    with pytest.raises(ValueError, match=r"other settings \(data "):
        Trainer(lm_config(make_corpus(tmp_path / "other", n_train=3000, n_val=300), tmp_path, max_steps=16))


@pytest.mark.parametrize("task", ["lm", "vision"])
def test_a_relative_data_path_means_the_folder_it_named_at_the_start(task, corpus, tmp_path, monkeypatch):
    """The checkpoint keeps the data path absolute: the same relative spelling from another working directory names
    another folder, and the resume is refused."""
    here, there, out = tmp_path / "a", tmp_path / "b", tmp_path / "run"
    here.mkdir()
    if task == "lm":
        os.symlink(corpus, here / "data")
        make_corpus(there / "data", n_train=3000, n_val=300)
        start, again = lm_config("data", out, max_steps=4), lm_config("data", out, max_steps=8)
        run = Trainer
    else:
        make_fashion_fixture(here / "data")
        make_fashion_fixture(there / "data", n_train=64, seed=1)
        start, again = fashion_config("data", out, "epochs=1"), fashion_config("data", out, "epochs=2")

        def run(cfg):
            return VisionTrainer(cfg, D.init("cpu"))
    monkeypatch.chdir(here)
    run(start).train()
    monkeypatch.chdir(there)
    with pytest.raises(ValueError, match=r"other settings \(data "):
        run(again)


def test_lra_resume_refuses_other_seeds_and_data(tmp_path, capsys):
    assert cli_main(lra_args(tmp_path, "--max-steps", "3")) == 0
    for flag, value in (("--data-seed", "3"), ("--lr", "1e-3")):
        with pytest.raises(ValueError, match="other settings"):
            cli_main(lra_args(tmp_path, "--max-steps", "4", flag, value))
    run = lra_run_dir(tmp_path)
    before = (run / "result.json").read_text()
    # another seed is another run, in its own folder: the first run is left as it was
    assert cli_main(lra_args(tmp_path, "--max-steps", "1", "--seed", "5")) == 0
    assert (run.parent / f"{run.name}-seed5" / "result.json").is_file()
    assert (run / "result.json").read_text() == before and steps_of(run / "ckpt") == [2, 3]
    capsys.readouterr()
    assert cli_main(lra_args(tmp_path, "--max-steps", "2")) == 0
    assert "at step 3, --max-steps is 2: nothing to train" in capsys.readouterr().out
    assert (run / "result.json").read_text() == before and steps_of(run / "ckpt") == [2, 3]
    os.symlink(FASHION, tmp_path / "link")
    args = lra_args(tmp_path, "--max-steps", "4", "--epochs", "3")
    args[args.index("--data") + 1] = str(tmp_path / "link") + "/"
    assert cli_main(args) == 0
    assert "--epochs 2 -> 3: the run continues" in capsys.readouterr().out
    assert json.loads((run / "result.json").read_text())["steps"] == 4
    assert cli_main(lra_args(tmp_path, "--max-steps", "5", "--epochs", "3")) == 0  # to epoch 1's end
    capsys.readouterr()
    assert cli_main(lra_args(tmp_path, "--epochs", "1")) == 0  # past the new epochs: one line says so
    printed = capsys.readouterr().out
    assert "trained 1 epoch(s), --epochs is 1: nothing to train" in printed and "the run continues" not in printed


def test_vision_resume_refuses_other_settings_and_keeps_its_config(images, tmp_path, capsys):
    vision_trainer(images, tmp_path).train()
    config = (tmp_path / "config.json").read_text()
    for setting in ("lr=1e-2", "seed=1", "batch_size=16"):
        with pytest.raises(ValueError, match=rf"other settings \({setting.split('=')[0]} "):
            vision_trainer(images, tmp_path, setting)
    assert (tmp_path / "config.json").read_text() == config
    capsys.readouterr()
    assert VisionTrainer(fashion_config(images, tmp_path, "epochs=1"), D.init("cpu")).train() == {}
    printed = capsys.readouterr().out
    assert "has trained 2 epoch(s), epochs=1: nothing to train" in printed and "the run continues" not in printed
    assert steps_of(tmp_path / "checkpoints") == [1, 2]
    os.symlink(images, tmp_path / "link")
    trainer = VisionTrainer(fashion_config(str(tmp_path / "link") + "/", tmp_path, "epochs=3"), D.init("cpu"))
    assert "epochs 2 -> 3: the run continues" in capsys.readouterr().out
    assert trainer.train()["epochs_done"] == 3


# --- checkpoints are data, not code ---------------------------------------------------------------------------------


class Payload:
    """Unpickled with weights_only=False, it would create the folder `path`."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return os.mkdir, (self.path,)


def plant(directory, marker) -> None:
    ckpt.save(str(directory), 1, {"step": 1, "model": Payload(marker)}, keep_last=1)  # a valid sidecar too


def plant_sharded(directory, marker) -> None:
    """A checkpoint folder whose DCP metadata is the payload, with a matching manifest."""
    path = directory / "step_00000001"
    path.mkdir(parents=True)
    torch.save({"step": 1}, path / sharded.TRAIN_STATE)
    (path / ".metadata").write_bytes(pickle.dumps(Payload(marker)))  # what DCP's own reader would unpickle
    (path / sharded.MANIFEST).write_text(json.dumps({n: {"bytes": os.path.getsize(path / n),
                                                         "sha256": ckpt.sha256(str(path / n))}
                                                     for n in (".metadata", sharded.TRAIN_STATE)}))


@pytest.mark.parametrize("task", ["train", "train-sharded", "lra", "vision", "vision-eval", "mqar"])
def test_a_planted_checkpoint_runs_no_code(task, corpus, images, tmp_path, capsys):
    marker = tmp_path / "pwned"
    out = tmp_path / "run"
    if task.startswith("train"):
        (plant if task == "train" else plant_sharded)(out / "checkpoints", marker)
        call = lambda: Trainer(lm_config(corpus, out))  # noqa: E731
    elif task == "lra":
        plant(lra_run_dir(out) / "ckpt", marker)
        call = lambda: cli_main(lra_args(out))  # noqa: E731
    elif task.startswith("vision"):
        plant(out / "checkpoints", marker)
        call = (lambda: vision_trainer(images, out)) if task == "vision" else (  # noqa: E731
            lambda: cli_main(["vision", "eval", "--run", str(out)]))
    else:
        plant(out, marker)
        call = lambda: mqar_run(tiny_spec(), "cpu", data_dir=tmp_path, checkpoint_dir=out)  # noqa: E731
    with pytest.warns(UserWarning, match="unusable .*(Weights only load failed|is not allowed)"):
        if task == "vision-eval":
            assert call() == 2 and "no intact checkpoint" in capsys.readouterr().err
        else:
            with pytest.raises(guard.RunError, match="no intact checkpoint among 1"):
                call()
    assert not marker.exists()


def test_a_checkpoint_entry_stored_as_a_pickle_is_refused(tmp_path):
    """DCP unpickles an entry marked as bytes without weights_only: such an entry (here the payload appended to the
    shard file, its manifest rewritten to match) makes the checkpoint unusable instead of running."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, MetadataIndex

    d = D.Dist(0, 1, 0, torch.device("cpu"))
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(1, 3)).sum().backward()
    opt.step()
    path = Path(sharded.save(str(tmp_path), 1, model, opt, {"step": 1}, d, keep_last=1))
    with open(path / ".metadata", "rb") as f:
        meta = pickle.load(f)
    key = "model.weight"
    info = next(v for k, v in meta.storage_data.items() if k.fqn == key)
    marker = tmp_path / "pwned"
    payload = pickle.dumps(Payload(marker))
    offset = os.path.getsize(path / info.relative_path)
    with open(path / info.relative_path, "ab") as f:
        f.write(payload)
    meta.storage_data = {k: v for k, v in meta.storage_data.items() if k.fqn != key}
    meta.storage_data[MetadataIndex(key)] = _StorageInfo(info.relative_path, offset, len(payload))
    meta.state_dict_metadata[key] = BytesStorageMetadata()
    (path / ".metadata").write_bytes(pickle.dumps(meta))
    (path / sharded.MANIFEST).write_text(json.dumps({n: {"bytes": os.path.getsize(path / n),
                                                         "sha256": ckpt.sha256(str(path / n))}
                                                     for n in os.listdir(path) if n != sharded.MANIFEST}))
    with pytest.warns(UserWarning, match="unusable .*'model.weight' is a pickled object"):
        with pytest.raises(guard.RunError, match="no intact checkpoint among 1"):
            sharded.load_latest(str(tmp_path), model, opt, d)
    assert not marker.exists()


def test_checkpoints_from_before_plain_rng_states_still_load(tmp_path):
    import random

    import numpy as np

    old = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    ckpt.save(str(tmp_path), 1, {"rng": old}, keep_last=1)
    expected = np.random.rand(3)
    ckpt.set_rng_state(sharded.read_latest(str(tmp_path))["rng"])
    assert (np.random.rand(3) == expected).all()


# --- the run log ----------------------------------------------------------------------------------------------------


def test_a_garbled_log_line_is_skipped_and_nothing_after_it_lost(corpus, tmp_path):
    Trainer(lm_config(corpus, tmp_path)).train()
    lines = (tmp_path / "log.jsonl").read_bytes().splitlines(keepends=True)
    lines.insert(3, b'{"kind": "train", "st\x00\n')
    lines.insert(5, b'{"kind": \xff\xfe garbage\n')  # not UTF-8
    (tmp_path / "log.jsonl").write_bytes(b"".join(lines))
    with pytest.warns(UserWarning, match=r"skipped 2 unreadable line\(s\) \(line 4, 6\)"):
        Trainer(lm_config(corpus, tmp_path, max_steps=12)).train()
    steps = [r["step"] for r in read_log(str(tmp_path / "log.jsonl")) if r["kind"] == "train"]
    assert steps == list(range(1, 13))


def test_a_half_written_last_line_is_dropped_quietly(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text('{"kind": "train", "step": 1}\n{"kind": "tr')
    assert read_log(str(path)) == [{"kind": "train", "step": 1}]


def test_a_non_finite_value_is_logged_as_null(tmp_path):
    from hgrn2.train.logger import RunLogger

    log = RunLogger(str(tmp_path), enabled=True, start_step=0, tensorboard=False)
    log.log({"kind": "val", "step": 1, "val_loss": math.nan, "val_ppl": math.inf})
    text = (tmp_path / "log.jsonl").read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert {k: v for k, v in json.loads(text).items() if k != "time"} == \
        {"kind": "val", "step": 1, "val_loss": None, "val_ppl": None}


# --- one process per run directory ----------------------------------------------------------------------------------


@pytest.mark.parametrize("task", ["train", "lra", "vision", "mqar", "ablate"])
def test_a_second_process_on_a_run_directory_is_refused(task, corpus, images, tmp_path):
    out = tmp_path / "run"
    if task == "train":
        where, call = out, lambda: Trainer(lm_config(corpus, out)).train()  # noqa: E731
    elif task == "lra":
        where, call = lra_run_dir(out), lambda: cli_main(lra_args(out, "--max-steps", "1"))  # noqa: E731
    elif task == "vision":
        where, call = out, lambda: vision_trainer(images, out, "max_steps_per_epoch=1").train()  # noqa: E731
    elif task == "mqar":
        where, call = out, lambda: mqar_run(tiny_spec(epochs=1), "cpu", data_dir=tmp_path,  # noqa: E731
                                            checkpoint_dir=out)
    else:
        from hgrn2.experiments.ablate import LMRun, train_lm

        spec = LMRun(model={"hidden_size": 32, "num_hidden_layers": 1, "expand_ratio": 16},
                     train={"max_steps": 2, "seq_len": 32, "batch_size": 4, "micro_batch_size": 4, "eval_every": 0,
                            "save_every": 0, "precision": "fp32"}, data=corpus)
        where, call = out, lambda: train_lm(spec, "cpu", checkpoint_dir=out)  # noqa: E731
    held = guard.RunLock(str(where))
    with pytest.raises(guard.RunError, match=rf"{where} is in use by another process \(pid {os.getpid()}\)"):
        call()
    held.release()
    call()  # free again
    guard.RunLock(str(where)).release()  # and the run let go of it


def test_a_second_lm_process_is_refused_in_one_line(corpus, tmp_path, capsys):
    held = guard.RunLock(str(tmp_path))
    assert console(["train", "--set", *base_overrides(corpus, str(tmp_path), max_steps=2)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("hgrn2 train: error: ") and "is in use by another process" in err[-1]
    held.release()


# --- a full disk, unreadable checkpoints ----------------------------------------------------------------------------


def test_full_disk_in_the_final_export_is_one_line_and_leaves_nothing(corpus, tmp_path, monkeypatch, capsys):
    import transformers.modeling_utils
    from safetensors import SafetensorError

    def full(state, filename, **kw):  # safetensors reports a full disk as its own error, part of the file written
        with open(filename, "wb") as f:
            f.write(b"\0" * 100)
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", full)
    rc = cli_main(["train", "--set", *base_overrides(corpus, str(tmp_path), max_steps=4, save_every=4)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and err[-1].startswith("hgrn2 train: error: could not write") and "No space left" in err[-1]
    assert not (tmp_path / "final.tmp").exists() and not (tmp_path / "final").exists()
    assert steps_of(tmp_path / "checkpoints") == [4]


@pytest.mark.parametrize("task", ["train", "lra", "vision"])
def test_unreadable_checkpoints_are_one_line(task, corpus, images, tmp_path, capsys):
    out = tmp_path / "run"
    if task == "train":
        argv, where = ["train", "--set", *base_overrides(corpus, str(out), max_steps=4)], out / "checkpoints"
    elif task == "lra":
        argv, where = lra_args(out, "--max-steps", "2"), lra_run_dir(out) / "ckpt"
    else:
        argv = ["vision", "train", "--config", "fashion_mnist", "--set", f"data={images}", f"out_dir={out}",
                "model_args={patch_size: 4, hidden_size: 16, num_layers: 2, expand_ratio: 8, glu_size: 24}",
                "batch_size=32", "epochs=1", "max_steps_per_epoch=1", "progress=false"]
        where = out / "checkpoints"
    assert console(argv) == 0
    corrupt(where)
    capsys.readouterr()
    with pytest.warns(UserWarning, match="sha256 mismatch"):
        assert console(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert "no intact checkpoint among" in err[-1] and "Traceback" not in "\n".join(err)


def test_run_lock_under_a_time_limit_is_released_for_the_next_call(corpus, tmp_path):
    """A run stopped by `after_step` (the ablations' time budget) unlocks its folder."""
    trainer = Trainer(lm_config(corpus, tmp_path))
    assert trainer.train(after_step=lambda: True) == {"stopped_at": 1}
    assert Trainer(lm_config(corpus, tmp_path)).train()["kind"] == "val"


# --- torchrun: two CPU processes (gloo) train and resume every task -------------------------------------------------


def _newest_model(directory) -> dict:
    return model_of(sharded.list_checkpoints(str(directory))[-1][1])


def _same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_an_error_every_rank_raised_is_printed_by_rank_0_alone(monkeypatch, capsys):
    monkeypatch.setenv("RANK", "1")
    guard.print_error("hgrn2 lra", guard.Diverged("shared", every_rank=True))
    guard.print_error("hgrn2 lra", guard.Diverged("this rank's own"))  # a rank's own error is always printed
    monkeypatch.setenv("RANK", "0")
    guard.print_error("hgrn2 lra", guard.Diverged("shared", every_rank=True))
    assert capsys.readouterr().err.splitlines() == ["hgrn2 lra: error: this rank's own", "hgrn2 lra: error: shared"]


@pytest.mark.slow
def test_torchrun_divergence_is_one_line_from_rank_0(corpus, tmp_path):
    """Every rank stops at the same step; rank 0 alone says so, and no rank ends in a traceback of its own."""
    from tests.train.helpers import run_command, train_cmd

    p = run_command(train_cmd(base_overrides(corpus, str(tmp_path), max_steps=12, save_every=4, lr=1e4), nproc=2),
                    timeout=600, returncode=1)
    errors = [line for line in (p.stdout + p.stderr).splitlines() if "error:" in line and "hgrn2" in line]
    assert len(errors) == 1 and errors[0].startswith("hgrn2 train: error: the loss or gradient norm is not finite")
    assert "hgrn2/train/" not in p.stderr and "raise Diverged" not in p.stderr  # torchrun's own traceback only
    assert not (tmp_path / "final").exists() and all_finite(tmp_path / "checkpoints")


@pytest.mark.slow
def test_torchrun_lra_trains_and_resumes(tmp_path):
    from tests.train.helpers import run_command, torchrun

    def lra(out, *extra):
        run_command([*torchrun(2), "-m", "hgrn2.cli", *lra_args(out, "--ckpt-every", "0", *extra)], timeout=600)

    lra(tmp_path / "whole")
    lra(tmp_path / "parts", "--max-steps", "3")
    lra(tmp_path / "parts")
    whole, parts = (json.loads((lra_run_dir(tmp_path / n) / "result.json").read_text()) for n in ("whole", "parts"))
    assert whole["world_size"] == parts["world_size"] == 2 and whole["steps"] == parts["steps"] == 10
    _same_weights(_newest_model(lra_run_dir(tmp_path / "whole") / "ckpt"),
                  _newest_model(lra_run_dir(tmp_path / "parts") / "ckpt"))


@pytest.mark.slow
def test_torchrun_vision_trains_and_resumes(images, tmp_path):
    from tests.train.helpers import run_command, torchrun

    def vision(out, epochs):
        run_command([*torchrun(2), "-m", "hgrn2.cli", "vision", "train", "--config", "fashion_mnist", "--set",
                     f"data={images}", f"out_dir={out}", "model_args={patch_size: 4, hidden_size: 16, num_layers: 2, "
                     "expand_ratio: 8, glu_size: 24}", "batch_size=32", f"epochs={epochs}", "progress=false",
                     "device=cpu"], timeout=600)

    vision(tmp_path / "whole", 2)
    vision(tmp_path / "parts", 1)
    vision(tmp_path / "parts", 2)
    assert steps_of(tmp_path / "parts" / "checkpoints") == [1, 2]
    _same_weights(_newest_model(tmp_path / "whole" / "checkpoints"), _newest_model(tmp_path / "parts" / "checkpoints"))


@pytest.mark.slow
def test_torchrun_mqar_sweep_shares_its_runs_and_resumes(tmp_path):
    from tests.train.helpers import run_command, torchrun
    from tests.train.test_mqar import STAND_IN

    out = tmp_path / "out"
    cmd = [*torchrun(2), "-m", "hgrn2.cli", "mqar", "--mixers", STAND_IN, "--dims", "16,32", "--lrs", "3e-3",
           "--seq-lens", "16:2", "--epochs", "2", "--train-examples", "64", "--test-examples", "32", "--vocab-size",
           "64", "--batch-size", "32", "--device", "cpu", "--out", str(out), "--data-dir", str(tmp_path / "data")]
    p = run_command(cmd, timeout=600)
    assert "(rank 0)" in p.stdout and "(rank 1)" in p.stdout
    results = json.loads((out / "results.json").read_text())
    assert len(results) == 2 and all(r["complete"] for r in results)
    os.remove(out / "runs" / f"{results[1]['run_id']}.json")  # as a sweep killed before this run finished
    p = run_command(cmd, timeout=600)
    assert "1 already done, 1 to train" in p.stdout
    assert len(json.loads((out / "results.json").read_text())) == 2


@pytest.mark.slow
def test_torchrun_ablate_shares_its_runs(corpus, tmp_path):
    from tests.train.helpers import run_command, torchrun

    out = tmp_path / "out"
    run_command([*torchrun(2), "-m", "hgrn2.cli", "ablate", "lower-bound", "--scale", "smoke", "--data", corpus,
                 "--device", "cpu", "--out", str(out)], timeout=600)
    rows = json.loads((out / "results.json").read_text())["recipes"]["lower-bound"]
    assert len(rows) == 2 and all(r["complete"] for r in rows)


def test_single_file_checkpoints_of_earlier_versions_still_resume(corpus, tmp_path):
    """A run checkpointed the old way (one `step_*.pt` of full state dicts, numpy's RNG state as an array) resumes
    and logs the same losses as the run that never stopped."""
    import random

    import numpy as np
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    Trainer(lm_config(corpus, tmp_path / "ref", max_steps=5, eval_every=0)).train()
    trainer = Trainer(lm_config(corpus, tmp_path / "old", max_steps=5, eval_every=0))
    trainer.train(after_step=lambda: trainer.step == 2)
    model_sd, optim_sd = get_state_dict(trainer.model, trainer.optimizer,
                                        options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    rng = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    old = {"step": 2, "model": model_sd, "optimizer": optim_sd, "rng": [rng], "config": dataclasses.asdict(trainer.cfg),
           "loss_sum": trainer.engine.loss_sum.item(), "loss_count": trainer.engine.loss_count, "world": 1}
    for _, path in sharded.list_checkpoints(str(tmp_path / "old" / "checkpoints")):
        sharded._remove(path)
    ckpt.save(str(tmp_path / "old" / "checkpoints"), 2, old, keep_last=1)
    Trainer(lm_config(corpus, tmp_path / "old", max_steps=5, eval_every=0)).train()
    ref, got = (read_log(str(tmp_path / n / "log.jsonl")) for n in ("ref", "old"))
    assert [(r["kind"], r["step"], r.get("loss")) for r in got] == [(r["kind"], r["step"], r.get("loss")) for r in ref]


def test_a_failure_reason_keeps_the_first_item_after_its_heading():
    e = RuntimeError('Error(s) in loading state_dict for HGRN2ForCausalLM:\n\tMissing key(s) in state_dict: "w".')
    assert ckpt.reason(e) == 'Error(s) in loading state_dict for HGRN2ForCausalLM: Missing key(s) in state_dict: "w".'
    assert ckpt.reason(RuntimeError("one line\nmore")) == "one line" and ckpt.reason(ValueError()) == "ValueError"
