"""`hgrn2 vision`: training on generated Fashion-MNIST-format fixtures (plain torch), exact resume,
eval, the schedule, and (with timm installed) the ImageFolder pipeline with RandAugment / Mixup / CutMix."""

import gzip
import json
import os
import struct

import numpy as np
import pytest
import torch

from hgrn2.cli import main
from hgrn2.train import distributed as D
from hgrn2.train.vision import VisionTrainer, epoch_lr, evaluate, make_config
from tests.train.helpers import run_command, torchrun

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY_MODEL = "model_args={patch_size: 4, hidden_size: 16, num_layers: 2, expand_ratio: 8, glu_size: 24}"


def write_idx(path, array: np.ndarray) -> None:
    header = bytes([0, 0, 8, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def make_fashion_fixture(directory, n_train=96, n_val=32, size=8, seed=0) -> str:
    """Fashion-MNIST's four gzipped idx files; class k is a bright k-th cell of a 2×5 grid over noise (learnable)."""
    rng = np.random.default_rng(seed)
    os.makedirs(directory, exist_ok=True)
    for prefix, n in (("train", n_train), ("t10k", n_val)):
        labels = rng.integers(0, 10, n)
        images = rng.integers(0, 60, (n, size, size))
        for img, k in zip(images, labels):
            r, c = divmod(int(k), 5)
            img[r * size // 2:(r + 1) * size // 2, c * size // 5:(c + 1) * size // 5 + 1] = 250
        write_idx(os.path.join(directory, f"{prefix}-images-idx3-ubyte.gz"), images)
        write_idx(os.path.join(directory, f"{prefix}-labels-idx1-ubyte.gz"), labels)
    return str(directory)


def fashion_config(data, out_dir, *extra):
    return make_config("fashion_mnist", [f"data={data}", f"out_dir={out_dir}", TINY_MODEL, "batch_size=32",
                                         "max_steps_per_epoch=0", "progress=false", "log_every=1", *extra])


@pytest.fixture(scope="module")
def fixture_dir(tmp_path_factory):
    return make_fashion_fixture(tmp_path_factory.mktemp("fmnist"))


def test_missing_files_name_the_layout(tmp_path):
    cfg = fashion_config(tmp_path, tmp_path / "run")
    with pytest.raises(FileNotFoundError, match="train-images-idx3-ubyte"):
        VisionTrainer(cfg, D.init("cpu"))


def test_bad_keys_and_values_are_named():
    with pytest.raises(ValueError, match="lerning_rate"):
        make_config("fashion_mnist", ["lerning_rate=1"])
    with pytest.raises(ValueError, match="epochs"):
        make_config("fashion_mnist", ["epochs=0"])
    with pytest.raises(ValueError, match="dataset"):
        make_config("fashion_mnist", ["dataset=cifar"])
    with pytest.raises(ValueError, match="`cuda_graph`: needs a CUDA device"):
        make_config("fashion_mnist", ["data=d", "device=cpu", "cuda_graph=true"])


def test_training_reduces_the_validation_loss(fixture_dir, tmp_path):
    cfg = fashion_config(fixture_dir, tmp_path / "run", "epochs=4", "lr=1e-2", "lr_batch=32")
    trainer = VisionTrainer(cfg, D.init("cpu"))
    before = evaluate(D.unwrap(trainer.model), trainer.val_set, 64, trainer.d)
    result = trainer.train()
    assert result["epochs_done"] == 4 and result["steps"] == 4 * (96 // 32)
    assert result["val_loss"] < 0.8 * before["val_loss"]
    assert result["acc1"] > before["acc1"]
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["acc1"] == result["acc1"] and saved["parameters"] == trainer.n_params
    kinds = [json.loads(line)["kind"] for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert kinds.count("val") == 4 and kinds.count("train") == 12


def test_eval_examples_limits_each_epochs_evaluation_but_the_last(fixture_dir, tmp_path, capsys):
    """The first N validation images (every rank its share) after each epoch, the whole split after the last;
    best_acc1 is the best evaluation of the whole split."""
    run = tmp_path / "run"
    trainer = VisionTrainer(fashion_config(fixture_dir, run, "epochs=3", "eval_examples=8", "ema_decay=0.9"),
                            D.init("cpu"))
    model, first = D.unwrap(trainer.model), torch.utils.data.Subset(trainer.val_set, range(8))
    assert evaluate(model, trainer.val_set, 5, trainer.d, limit=8) == evaluate(model, first, 5, trainer.d)
    result = trainer.train()
    vals = [r for r in map(json.loads, (run / "log.jsonl").read_text().splitlines()) if r["kind"] == "val"]
    assert [r["val_images"] for r in vals] == [8, 8, 32] and [r["ema_val_images"] for r in vals] == [8, 8, 32]
    assert result["val_images"] == 32 and result["best_acc1"] == max(result["acc1"], result["ema_acc1"])
    # a resume may change it, said in one line
    capsys.readouterr()
    VisionTrainer(fashion_config(fixture_dir, run, "epochs=4", "ema_decay=0.9"), D.init("cpu"))
    assert "eval_examples 8 -> 0: the run continues with the new value\n" in capsys.readouterr().out
    with pytest.raises(ValueError, match="`eval_examples`: expected >= 0"):
        fashion_config(fixture_dir, run, "eval_examples=-1")


def check_resume_trains_the_same_weights(images, tmp_path, between=None):
    """Two epochs straight against one epoch, `between(checkpoint_dir)`, then the second (EMA included)."""
    straight = VisionTrainer(fashion_config(images, tmp_path / "a", "epochs=2", "ema_decay=0.9"), D.init("cpu"))
    straight.train()
    VisionTrainer(fashion_config(images, tmp_path / "b", "epochs=1", "ema_decay=0.9"), D.init("cpu")).train()
    if between is not None:
        between(tmp_path / "b" / "checkpoints")
    resumed = VisionTrainer(fashion_config(images, tmp_path / "b", "epochs=2", "ema_decay=0.9"), D.init("cpu"))
    assert resumed.engine.epoch == 1
    resumed.train()
    for a, b in zip(straight.model.state_dict().values(), resumed.model.state_dict().values()):
        assert torch.equal(a, b)
    for a, b in zip(straight.ema.state_dict().values(), resumed.ema.state_dict().values()):
        assert torch.equal(a, b)


def test_resume_trains_the_same_weights(fixture_dir, tmp_path):
    check_resume_trains_the_same_weights(fixture_dir, tmp_path)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_graphed_steps_train_as_the_eager_ones(fixture_dir, tmp_path):
    """cuda_graph: the same losses and weights as eager steps (fp32, no dropout), with a resume in between."""
    def run(name, graph, epochs):
        extra = ("device=cuda", "precision=fp32", f"cuda_graph={str(graph).lower()}", f"epochs={epochs}",
                 "num_workers=0", "ema_decay=0.9")
        trainer = VisionTrainer(fashion_config(fixture_dir, tmp_path / name, *extra), D.init("cuda"))
        trainer.train()
        return trainer

    eager = run("eager", False, 3)
    run("graph", True, 2)
    graphed = run("graph", True, 3)
    assert graphed.engine.epoch == 3
    for a, b in zip(eager.model.state_dict().values(), graphed.model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    losses = [[json.loads(line)["loss"] for line in (tmp_path / name / "log.jsonl").read_text().splitlines()
               if json.loads(line)["kind"] == "train"] for name in ("eager", "graph")]
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-4)


def test_cli_train_then_eval(fixture_dir, tmp_path, capsys):
    run = tmp_path / "run"
    rc = main(["vision", "train", "--config", "fashion_mnist", "--set", f"data={fixture_dir}", f"out_dir={run}",
               TINY_MODEL, "batch_size=32", "max_steps_per_epoch=2", "ema_decay=0.5", "progress=false"])
    assert rc == 0
    trained = json.loads((run / "results.json").read_text())
    assert main(["vision", "eval", "--run", str(run)]) == 0
    evaluated = json.loads((run / "eval.json").read_text())
    assert evaluated["acc1"] == pytest.approx(trained["acc1"]) and evaluated["val_images"] == 32
    assert main(["vision", "eval", "--run", str(run), "--ema"]) == 0
    assert json.loads((run / "eval_ema.json").read_text())["acc1"] == pytest.approx(trained["ema_acc1"])
    assert main(["vision", "train", "--config", "fashion_mnist", "--set", "data=/nonexistent"]) == 2
    assert "train-images-idx3-ubyte" in capsys.readouterr().err


def test_schedule_warms_up_then_follows_the_cosine():
    cfg = make_config("deit_tiny", ["data=x"])
    assert cfg.peak_lr() == pytest.approx(7.5e-4 * 1024 / 512)
    assert epoch_lr(cfg, 0) == epoch_lr(cfg, 1) == pytest.approx(1e-6)
    assert epoch_lr(cfg, 21) == pytest.approx(1e-5 + 0.5 * (1.5e-3 - 1e-5) * (1 + np.cos(np.pi * 20 / 300)))
    assert epoch_lr(cfg, 299) < epoch_lr(cfg, 150) < epoch_lr(cfg, 21)


def _timm():
    try:
        import timm

        return timm
    except Exception as e:  # noqa: BLE001 - torchvision built for another torch fails with RuntimeError
        pytest.skip(f"timm/torchvision not importable: {type(e).__name__}")


def test_schedule_equals_timms_scheduler():
    _timm()
    from timm.scheduler.cosine_lr import CosineLRScheduler

    cfg = make_config("deit_small", ["data=x"])
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=cfg.peak_lr())
    sched = CosineLRScheduler(opt, t_initial=cfg.epochs, lr_min=cfg.min_lr, warmup_lr_init=cfg.warmup_lr,
                              warmup_t=cfg.warmup_epochs, cycle_limit=1, t_in_epochs=True)
    for epoch in range(cfg.epochs):
        assert opt.param_groups[0]["lr"] == pytest.approx(epoch_lr(cfg, epoch)), epoch
        sched.step(epoch)  # as the authors' loop: after training epoch e, with e


def test_image_folder_pipeline_with_timm_augmentation(tmp_path):
    _timm()
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, n in (("train", 8), ("val", 4)):
        for cls in ("cat", "dog"):
            os.makedirs(tmp_path / "data" / split / cls)
            for k in range(n):
                pixels = rng.integers(0, 255, (20, 24, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(tmp_path / "data" / split / cls / f"{k}.png")
    cfg = make_config("deit_tiny", [f"data={tmp_path / 'data'}", f"out_dir={tmp_path / 'run'}", "image_size=16",
                                    TINY_MODEL, "batch_size=8", "epochs=1", "num_workers=0", "progress=false",
                                    "ema_decay=0.9"])
    trainer = VisionTrainer(cfg, D.init("cpu"))
    assert trainer.mixup is not None and D.unwrap(trainer.model).config.num_classes == 2
    result = trainer.train()
    assert result["val_images"] == 8 and np.isfinite(result["train_loss"])


@pytest.mark.slow
def test_torchrun_two_ranks(fixture_dir, tmp_path):
    out = tmp_path / "ddp"
    run_command([*torchrun(2), "-m", "hgrn2.cli", "vision", "train", "--config", "fashion_mnist", "--set",
                 f"data={fixture_dir}", f"out_dir={out}", TINY_MODEL, "batch_size=32", "epochs=1", "progress=false",
                 "device=cpu"], timeout=600)
    result = json.loads((out / "results.json").read_text())
    assert result["val_images"] == 32 and result["steps"] == 96 // 32


def test_bench_vision_quick_writes_json(tmp_path):
    assert main(["bench", "vision", "--quick", "--models", "hgrn2", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "vision.json").read_text())
    (row,) = result["rows"]
    assert row["model"] == "hgrn2" and row["parameters"] > 6e6 and row["images_per_s"] > 0
    assert row["peak_gib"] is None  # CUDA only
    assert len(row["seconds"]) == result["args"]["rounds"] == 2 and result["benchmark"] == "vision"
    if not torch.cuda.is_available():
        assert main(["bench", "vision", "--quick", "--models", "hgrn2-graph", "--out", str(tmp_path)]) == 0
        (row,) = json.loads((tmp_path / "vision.json").read_text())["rows"]
        assert row == {"model": "hgrn2-graph", "skipped": "CUDA graphs need a GPU"}


def test_record_from_training_and_from_a_copied_run(fixture_dir, tmp_path, capsys):
    run, rec_dir = tmp_path / "run", tmp_path / "rec"
    assert main(["vision", "train", "--config", "fashion_mnist", "--set", f"data={fixture_dir}", f"out_dir={run}",
                 TINY_MODEL, "batch_size=32", "epochs=2", "max_steps_per_epoch=1", "progress=false",
                 "--record", str(rec_dir)]) == 0
    rec = json.loads((rec_dir / "vision_fashion_mnist.json").read_text())
    result = json.loads((run / "results.json").read_text())
    assert [r["epoch"] for r in rec["rows"]] == [1, 2] and rec["rows"][-1]["acc1"] == result["acc1"] == rec["acc1"]
    assert rec["device_slug"] == "cpu" and rec["config"]["batch_size"] == 32 and "data" not in rec["config"]
    assert (rec_dir / rec["figure"]).read_bytes() == (run / "curves.png").read_bytes()
    assert "| 2 |" in capsys.readouterr().out  # the per-epoch table

    h100 = {"device": "NVIDIA H100 80GB HBM3", "device_slug": "h100", "versions": {"torch": "2.11.0"},
            "commit": "abc1234", "date": "2026-11-20"}
    (run / "results.json").write_text(json.dumps(dict(result, environment=h100)))
    assert main(["vision", "report", "--run", str(run), "--record", str(rec_dir)]) == 0
    rec = json.loads((rec_dir / "vision_fashion_mnist.json").read_text())
    assert {k: rec[k] for k in h100} == h100 and rec["command"].startswith("hgrn2 vision report")
    assert main(["vision", "report", "--run", str(tmp_path / "nothing")]) == 2
    assert "no finished epoch" in capsys.readouterr().err
