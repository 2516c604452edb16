"""The trainer under faults: bad token ids, a data file truncated under the run, a full disk (simulated by a
writer that fails with ENOSPC part-way, as the OS does), an interrupted export, and resuming a finished run."""

import errno
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from hgrn2.data.packed import DataFileError, PackedDataset
from hgrn2.train import checkpoint as ckpt
from hgrn2.train import sharded
from hgrn2.train.config import make_config
from hgrn2.train.trainer import Trainer
from tests.train.helpers import ROOT, FullDisk, base_overrides, env, make_corpus


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("corpus"), n_train=3000, n_val=300)


def config(data, out_dir, **kw):
    kw = {"max_steps": 12, "save_every": 4, "eval_every": 4, "dropout": 0.0, **kw}
    return make_config(None, base_overrides(data, str(out_dir), **kw))


def records(out_dir) -> list[dict]:
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_token_ids_outside_vocab_stop_before_training(tmp_path):
    data = make_corpus(tmp_path / "d", n_train=3000, n_val=300)
    meta_file = os.path.join(data, "meta.json")
    with open(meta_file) as f:
        meta = json.load(f)
    with open(meta_file, "w") as f:  # ids go up to 95: claim a smaller vocabulary
        json.dump({**meta, "vocab_size": 90}, f)
    with pytest.raises(ValueError, match=r"token id 9\d at position \d+, outside \[0, vocab_size=90\)"):
        Trainer(config(data, tmp_path / "run"))


@pytest.mark.slow
def test_data_file_truncated_under_a_reader_is_an_error_not_sigbus(tmp_path):
    data = make_corpus(tmp_path / "d", n_train=3000, n_val=300)
    script = textwrap.dedent(f"""
        import os
        from hgrn2.data.packed import PackedDataset
        ds = PackedDataset({data!r}, "train", 32)
        ds[0]
        os.truncate(ds.file, 100)
        ds[len(ds) - 1]
    """)
    p = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env(), capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 1, (p.returncode, p.stderr[-2000:])  # SIGBUS would be -7
    assert "DataFileError" in p.stderr and "truncated while training?" in p.stderr


def test_truncated_read_in_process(tmp_path):
    data = make_corpus(tmp_path / "d", n_train=3000, n_val=300)
    ds = PackedDataset(data, "train", 32)
    assert ds[len(ds) - 1].shape == (32,)
    os.truncate(ds.file, 100)
    with pytest.raises(DataFileError, match=r"ended after \d+ bytes while reading sequence"):
        ds[len(ds) - 1]


def _fill_disk_at(monkeypatch, name_part: str, room: int = 4096):
    """Writes of the checkpoint's train state to paths that hold `name_part` hit a full disk after `room` bytes."""
    real_open = open

    def fake_open(path, mode="r", *args, **kwargs):
        if "w" in mode and "b" in mode and name_part in str(path):
            FullDisk.room = room
            return FullDisk(path, "w")
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr(sharded, "open", fake_open, raising=False)


def test_full_disk_keeps_the_last_checkpoint_and_resumes_exactly(data, tmp_path, monkeypatch):
    ref_dir, cut_dir = tmp_path / "ref", tmp_path / "cut"
    Trainer(config(data, ref_dir)).train()

    _fill_disk_at(monkeypatch, "step_00000008.tmp/train_state.pt")
    with pytest.raises(ckpt.SaveError, match="No space left on device.*previous checkpoint is intact") as e:
        Trainer(config(data, cut_dir)).train()
    assert "\n" not in str(e.value)
    ckpt_dir = cut_dir / "checkpoints"
    assert sorted(os.listdir(ckpt_dir)) == ["step_00000004"]  # nothing partial
    assert [s for s, _ in sharded.list_checkpoints(str(ckpt_dir))] == [4]

    monkeypatch.undo()  # space freed; an interrupted earlier save may also have left temporary files
    (ckpt_dir / "step_00000008.tmp").mkdir()
    for stale in (ckpt_dir / "step_00000008.pt.tmp", ckpt_dir / "step_00000008.tmp" / "x", cut_dir / "log.jsonl.tmp"):
        stale.write_bytes(b"")
    Trainer(config(data, cut_dir)).train()
    assert not list(ckpt_dir.glob("*.tmp")) and not (cut_dir / "log.jsonl.tmp").exists()
    got, ref = records(cut_dir), records(ref_dir)
    assert [(r["kind"], r["step"]) for r in got] == [(r["kind"], r["step"]) for r in ref]
    for a, b in zip(got, ref):
        assert a.get("loss") == b.get("loss") and a.get("val_loss") == b.get("val_loss")


def test_full_disk_in_the_run_log_is_named(data, tmp_path, monkeypatch):
    from hgrn2.train import logger

    Trainer(config(data, tmp_path, max_steps=4)).train()
    real_open = open

    def full_disk(path, mode="r", *args, **kwargs):
        if "w" in mode or "a" in mode:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr(logger, "open", full_disk, raising=False)
    with pytest.raises(OSError, match="could not write the run log .*log.jsonl"):
        Trainer(config(data, tmp_path, max_steps=8))
    assert not (tmp_path / "log.jsonl.tmp").exists()


def test_resuming_a_finished_run_logs_each_step_once(data, tmp_path):
    Trainer(config(data, tmp_path, max_steps=8)).train()
    Trainer(config(data, tmp_path, max_steps=8)).train()  # resumes at step 8: evaluates and exports again
    keys = [(r["kind"], r["step"]) for r in records(tmp_path)]
    assert len(keys) == len(set(keys)) and ("val", 8) in keys


def test_failed_export_leaves_the_previous_one(data, tmp_path, monkeypatch):
    from transformers import PreTrainedModel

    Trainer(config(data, tmp_path, max_steps=4)).train()
    final = tmp_path / "final"
    before = {p.name: p.read_bytes() for p in final.iterdir()}

    def full_disk(self, out, **kw):
        os.makedirs(out, exist_ok=True)
        open(os.path.join(out, "config.json"), "w").close()  # 0 bytes, as a kill or full disk leaves it
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", full_disk)
    with pytest.raises(ckpt.SaveError, match="could not write .*final"):
        Trainer(config(data, tmp_path, max_steps=4)).train()
    assert {p.name: p.read_bytes() for p in final.iterdir()} == before
    assert not (tmp_path / "final.tmp").exists()


def test_export_cut_between_its_renames_is_restored(data, tmp_path):
    Trainer(config(data, tmp_path, max_steps=4)).train()
    final = tmp_path / "final"
    os.replace(final, tmp_path / "final.old")  # killed after moving the old export aside
    (tmp_path / "final.tmp").mkdir()  # ... with the new one unfinished
    Trainer(config(data, tmp_path, max_steps=4))
    assert (final / "config.json").stat().st_size > 0
    assert not (tmp_path / "final.old").exists() and not (tmp_path / "final.tmp").exists()


@pytest.mark.slow
def test_cli_reports_a_full_disk_in_one_line(data, tmp_path):
    """The CLI prints the save error as one line (exit 1), not a traceback."""
    script = textwrap.dedent(f"""
        import errno, os, sys
        from hgrn2.train import sharded
        def full_disk(path, mode="r", *args, **kwargs):
            if "w" in mode:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return open(path, mode, *args, **kwargs)
        sharded.open = full_disk
        from hgrn2.cli import main
        sys.exit(main(["train", "--set", *{base_overrides(data, str(tmp_path), max_steps=4, save_every=4)!r}]))
    """)
    p = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env(), capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 1, p.stderr[-2000:]
    err = [line for line in p.stderr.splitlines() if line.strip() and "Warning" not in line]
    assert err[-1].startswith("hgrn2 train: error: could not write") and "Traceback" not in p.stderr
    assert not list((tmp_path / "checkpoints").glob("*.tmp"))
    assert np.isfinite(records(tmp_path)[-1]["loss"])
