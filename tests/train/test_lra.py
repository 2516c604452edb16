import dataclasses
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml

from hgrn2.bench.common import seeds_cell
from hgrn2.bench.report import lra_table as report_lra_table
from hgrn2.cli import main
from hgrn2.experiments.lra import report
from hgrn2.models.lra import MIXERS, LRAClassifier, LRAModelConfig
from hgrn2.train import checkpoint, sharded
from hgrn2.train.lra import LRATask, build, build_lra_optimizer, load_preset
from tests.train.helpers import losses

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "lra"
FASHION = FIX / "fashion-mnist"


@pytest.mark.parametrize("mixer", MIXERS)
def test_a_few_steps_reduce_the_loss(mixer):
    torch.manual_seed(0)
    model = LRAClassifier(LRAModelConfig(mixer=mixer, num_classes=4, vocab_size=12, hidden_size=16, num_layers=2,
                                         num_heads=2))
    ids = torch.randint(0, 12, (8, 24))
    labels = torch.arange(8) % 4
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(15):
        loss = F.cross_entropy(model(ids), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def _preset_args(**overrides):
    import argparse

    from hgrn2.train.lra import CONFIG_DIR, TRAIN_KEYS
    return argparse.Namespace(**{"config": str(CONFIG_DIR), "model_options": None, **dict.fromkeys(TRAIN_KEYS),
                                 **overrides})


def test_presets_follow_the_authors_launch_script():
    # ListOps: HGRN2 from its own launch script (OpenNLPLab/HGRN2 run_lra.py), HGRN1 from HGRN1's (script_lra.py);
    # the one departure, 67 epochs (the launch's cosine to its end), is the variant launch-epochs' 50 away
    cfg, train, _ = build("listops", "hgrn2", _preset_args())
    assert (cfg.hidden_size, cfg.num_layers, cfg.expand_ratio) == (64, 5, 4)
    assert train == {"batch_size": 128, "lr": 5e-4, "weight_decay": 0.0, "warmup_steps": 5000,
                     "schedule_steps": 50000, "epochs": 67, "precision": "bf16", "grad_clip": 0.0}
    assert build("listops", "hgrn2", _preset_args(), "launch-epochs")[1] == {**train, "epochs": 50}
    for mixer in ("hgrn1", "attention"):
        cfg, train, _ = build("listops", mixer, _preset_args())
        assert (cfg.hidden_size, cfg.num_layers) == (32, 6)
        assert train == {"batch_size": 128, "lr": 5e-4, "weight_decay": 0.01, "warmup_steps": 5000,
                         "schedule_steps": 50000, "epochs": 67, "precision": "fp32", "grad_clip": 0.0}
    assert build("listops", "hgrn2", _preset_args(weight_decay=0.1))[1]["weight_decay"] == 0.1
    # the LRA code's mixers never see the lengths; HGRN1's Lightning trainer ran in 32-bit
    for task in ("listops", "text", "retrieval"):
        assert load_preset(task)["model"]["mask_padding"] is False
    # the other tasks: HGRN2 from run_lra.py (bf16, mean pooling), HGRN1 as its own launch script had them
    want = {"text": ((128, 4, 8, "layer", "mean", False), (64, 40, 0.0)),
            "retrieval": ((256, 2, 2, "batch", "mean", True), (128, 20, 1.0)),
            "image": ((512, 6, 2, "batch", "mean", True), (64, 75, 0.0)),
            "pathfinder": ((128, 6, 2, "batch", "mean", False), (128, 100, 0.0)),
            "pathx": ((32, 6, 1, "batch", "mean", True), (256, 200, 1.0))}
    hgrn1 = {"text": ((128, 4, 2, "batch", "mean", True), (32, 32)), "retrieval": ((64, 2, 2, "batch", "mean", True),
             (64, 20)), "image": ((512, 6, 2, "batch", "mean", True), (50, 100)),
             "pathfinder": ((128, 6, 2, "batch", "mean", False), (128, 200)),
             "pathx": ((64, 6, 2, "batch", "mean", False), (16, 100))}
    for task, (model, train) in want.items():
        cfg, tr, _ = build(task, "hgrn2", _preset_args())
        assert (cfg.hidden_size, cfg.num_layers, cfg.expand_ratio, cfg.norm, cfg.pooling, cfg.positional) == model
        assert (tr["batch_size"], tr["epochs"], tr["grad_clip"], tr["precision"]) == (*train, "bf16")
        cfg, tr, _ = build(task, "hgrn1", _preset_args())
        assert (cfg.hidden_size, cfg.num_layers, cfg.expand_ratio, cfg.norm, cfg.pooling, cfg.positional) == \
            hgrn1[task][0]
        assert (tr["batch_size"], tr["epochs"], tr["precision"], tr.get("grad_clip") or 0.0) == (*hgrn1[task][1],
                                                                                               "fp32", 0.0)
    assert load_preset("fashion_mnist")["train"]["precision"] == "fp32"
    # BatchNorm per GPU where HGRN2's launch says "batch" on 8 GPUs (Pathfinder 16 images each, Path-X 32); "synbatch"
    # and HGRN1's 1-GPU Pathfinder normalise over the whole batch
    groups = {("pathfinder", "hgrn2"): 16, ("pathx", "hgrn2"): 32}
    for task in ("listops", "text", "retrieval", "image", "pathfinder", "pathx"):
        for mixer in ("hgrn2", "hgrn1", "attention"):
            assert build(task, mixer, _preset_args())[0].bn_group == groups.get((task, mixer)), (task, mixer)


def test_grad_clip_clips_every_step(tmp_path, monkeypatch):
    seen = []
    clip = torch.nn.utils.clip_grad_norm_
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_",
                        lambda params, c, **kw: seen.append(c) or clip(params, c, **kw))
    _cli(tmp_path / "clip", "--max-steps", "3", "--grad-clip", "0.25")
    assert seen == [0.25] * 3
    seen.clear()
    _cli(tmp_path / "none", "--max-steps", "2")  # the fashion_mnist preset clips nothing
    assert seen == []
    with pytest.raises(ValueError, match="`--grad-clip`: expected at least 0, got -1"):
        _cli(tmp_path / "bad", "--grad-clip", "-1")


def test_image_preset_reads_colour_cifar_with_augmentation():
    # both launch scripts (HGRN2's srcipt_lra_image.sh, HGRN1's train_lra_image.sh) set grayscale=false augment=true
    for mixer in MIXERS:
        cfg, _, data = build("image", mixer, _preset_args())
        assert data == {"grayscale": False, "augment": True} and cfg.in_channels == 3
    cfg, _, data = build("image", "hgrn2", _preset_args(grayscale=True, augment=False))  # LRA's own Image task
    assert data == {"grayscale": True, "augment": False} and cfg.in_channels == 1
    assert build("pathx", "hgrn2", _preset_args())[0].directions == "2d_series"  # run_lra.py use_series
    assert build("pathx", "hgrn1", _preset_args())[0].directions == "2d"
    for flag, overrides in (("--augment", {"augment": True}), ("--no-grayscale", {"grayscale": False})):
        with pytest.raises(ValueError, match=f"`{flag}`: only the image task"):
            build("fashion_mnist", "hgrn2", _preset_args(**overrides))
    with pytest.raises(ValueError, match="in_channels 1, but the image task has 3"):
        build("image", "hgrn2", _preset_args(model_options={"in_channels": 1}))


def test_a_preset_data_section_per_model_and_its_errors(tmp_path):
    (tmp_path / "image.yaml").write_text("model: {}\ntrain: {precision: fp32}\ndata: {augment: true}\n"
                                         "per_model: {hgrn1: {data: {grayscale: false}}}\n")
    assert build("image", "hgrn2", _preset_args(config=str(tmp_path)))[2] == {"grayscale": True, "augment": True}
    assert build("image", "hgrn1", _preset_args(config=str(tmp_path)))[2] == {"grayscale": False, "augment": True}
    (tmp_path / "image.yaml").write_text("model: {}\ntrain: {}\ndata: {augment: 1, colour: true}\n")
    with pytest.raises(ValueError, match="image.yaml data: expected true/false"):
        build("image", "hgrn2", _preset_args(config=str(tmp_path)))
    (tmp_path / "fashion_mnist.yaml").write_text("model: {}\ntrain: {precision: fp32}\ndata: {augment: true}\n")
    with pytest.raises(ValueError, match="`--config`: fashion_mnist.yaml data.augment: only the image task"):
        build("fashion_mnist", "hgrn2", _preset_args(config=str(tmp_path)))


def test_training_batches_alone_are_cropped_and_flipped():
    from hgrn2.data.lra import images, readers
    from hgrn2.train.lra import DeviceSplit, Indices, batch_tensors

    split = readers.read_image(FIX, grayscale=False)["train"]
    on_device = DeviceSplit.of(split, torch.device("cpu"))
    idx = np.array([4, 1, 7])
    params = torch.from_numpy(images.crop_flip_params(len(split.labels), seed=1, epoch=0))
    x, mask, valid, y = batch_tensors(on_device, Indices.of(idx, torch.device("cpu")), (0.5, 0.5), params)
    pixels = torch.from_numpy(split.inputs[idx])
    want = images.to_float(images.random_crop_flip(pixels, params[idx]))
    assert mask is None and valid is None and torch.equal(x, want) and x.shape == (3, 1024, 3)
    assert torch.equal(y, torch.from_numpy(split.labels[idx]))
    plain, _, _, y_plain = batch_tensors(on_device, Indices.of(idx, torch.device("cpu")), (0.5, 0.5))
    assert torch.equal(plain, images.to_float(pixels)) and torch.equal(y_plain, y)
    assert not torch.equal(plain, x)


@pytest.mark.parametrize("pairs", [False, True])
def test_token_batches_trimmed_or_whole_length_with_the_positions_they_would_hold(pairs):
    from hgrn2.data.lra.readers import Split
    from hgrn2.train.lra import DeviceSplit, Indices, batch_tensors

    rng = np.random.default_rng(0)
    lengths = np.array([[3, 7], [5, 2], [6, 6]]) if pairs else np.array([3, 7, 5, 2])
    inputs = rng.integers(1, 9, (*lengths.shape, 10))
    inputs[np.arange(10) >= lengths[..., None]] = 0
    split = DeviceSplit.of(Split(inputs=inputs, lengths=lengths, labels=np.arange(len(lengths))), torch.device("cpu"))
    assert split.inputs.dtype == torch.int16  # tokens held narrow, read as int64
    idx = Indices.of(np.array([2, 0]), torch.device("cpu"))
    x, mask, valid, y = batch_tensors(split, idx, None)
    T = int(lengths[idx.host].max())
    assert valid is None and x.shape[-1] == mask.shape[-1] == T and torch.equal(y, torch.tensor([2, 0]))
    assert x.dtype == torch.int64
    fx, fmask, fvalid, fy = batch_tensors(split, idx, None, full_length=True)
    assert fx.shape[-1] == fmask.shape[-1] == fvalid.shape[-1] == 10 and torch.equal(fy, y)
    assert torch.equal(fx[..., :T], x) and torch.equal(fmask[..., :T], mask) and not fmask[..., T:].any()
    assert fvalid.shape == fmask.shape and torch.equal(fvalid, (torch.arange(10) < T).expand(fmask.shape))
    if pairs:
        assert x.shape[:2] == (2, 2) and torch.equal(x[1, 0], torch.from_numpy(inputs[2, 1, :T]))


def test_device_splits_hold_tokens_in_the_narrowest_type():
    from hgrn2.data.lra.readers import Split
    from hgrn2.train.lra import DeviceSplit

    def held(inputs):
        return DeviceSplit.of(Split(inputs, np.ones(len(inputs), np.int64), np.zeros(len(inputs), np.int64)),
                              torch.device("cpu")).inputs

    assert held(np.array([[1, 32767]])).dtype == torch.int16
    assert held(np.array([[1, 32768]])).dtype == torch.int32
    assert held(np.array([[1, 2**31]])).dtype == torch.int64
    assert held(np.zeros((2, 3), np.uint8)).dtype == torch.uint8  # pixels stay bytes
    assert torch.equal(held(np.array([[5, 70000]])), torch.tensor([[5, 70000]], dtype=torch.int32))
    split = Split(np.zeros((4, 100), np.int64), np.ones(4, np.int64), np.zeros(4, np.int64))
    assert DeviceSplit.nbytes(split) == 4 * 100 * 2 + 2 * 4 * 8


def test_splits_that_do_not_fit_the_device_are_a_clear_error(tmp_path, monkeypatch):
    """A device without room for the splits: a one-line error naming --device and the size, not CUDA's."""
    from hgrn2.train.lra import DeviceSplit

    def full(split, device):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate ...")

    monkeypatch.setattr(DeviceSplit, "of", full)
    with pytest.raises(ValueError, match=r"`--device`: listops's splits take 0\.00 GiB on cpu, more than it has"):
        _listops_losses(tmp_path / "runs", tmp_path / "data", "cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("task", ["tokens", "pairs", "pixels"])
def test_gpu_batches_are_gathered_without_a_host_sync(task):
    """On a GPU the batches of a split held there (trimmed, whole length, cropped and flipped) queue their gathers
    without waiting for the device: torch's sync debug mode raises on any synchronising call."""
    from hgrn2.data.lra import images
    from hgrn2.data.lra.readers import Split
    from hgrn2.train.lra import DeviceSplit, Indices, batch_tensors

    rng, cuda = np.random.default_rng(0), torch.device("cuda")
    shape = {"tokens": (64, 300), "pairs": (64, 2, 300), "pixels": (64, 1024, 3)}[task]  # colour pixels
    lengths = rng.integers(20, shape[-1] + 1, shape[:-1]) if task != "pixels" else np.full(64, 1024)
    inputs = rng.integers(0, 200, shape).astype(np.uint8 if task == "pixels" else np.int64)
    split = DeviceSplit.of(Split(inputs, lengths, rng.integers(0, 10, 64)), cuda)
    order = Indices.of(rng.permutation(64), cuda)
    pixels = (0.5, 0.5) if task == "pixels" else None
    crop_flip = torch.from_numpy(images.crop_flip_params(64, seed=0, epoch=0)).to(cuda) if pixels else None
    want = batch_tensors(split, order[8:24], pixels, crop_flip)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for full_length in (False, True):
            got = batch_tensors(split, order[8:24], pixels, crop_flip, full_length)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    T = want[0].shape[-1]
    assert torch.equal(got[0][..., :T], want[0]) and torch.equal(got[3], want[3])
    rows = torch.from_numpy(order.host[8:24])
    if pixels is None:
        x = torch.from_numpy(inputs)[rows][..., :T]
        assert torch.equal(want[0].cpu(), x.transpose(0, 1) if task == "pairs" else x)


def _image_cli(out: Path, *extra: str) -> None:
    args = ["lra", "image", "--data", str(FIX), "--out", str(out), "--epochs", "2", "--batch-size", "2",
            "--warmup-steps", "2", "--schedule-steps", "8", "--device", "cpu", "--log-every", "2", "--ckpt-every",
            "0", "--model-options", json.dumps({"hidden_size": 8, "num_layers": 1}), *extra]
    assert main(args) == 0


def test_augmented_image_runs_resume_exactly(tmp_path, monkeypatch):
    from hgrn2.data.lra import images

    seen = []
    crop_flip = images.random_crop_flip
    monkeypatch.setattr(images, "random_crop_flip", lambda x, p: seen.append(len(x)) or crop_flip(x, p))
    _image_cli(tmp_path / "whole")
    # the 8 training images, 2 epochs of 4 steps; validation (2) and test (2) are read as they are
    assert seen == [2] * 8
    _image_cli(tmp_path / "parts", "--max-steps", "3")
    _image_cli(tmp_path / "parts", "--max-steps", "6")
    _image_cli(tmp_path / "parts")
    _image_cli(tmp_path / "plain", "--no-augment")
    states = {}
    for name in ("whole", "parts", "plain"):
        run = tmp_path / name / "image-hgrn2"
        states[name] = sharded.read_latest(str(run / "ckpt"))["model"]
        result = json.loads((run / "result.json").read_text())
        assert result["config"]["in_channels"] == 3 and result["steps"] == 8
    assert result["data"] == {"grayscale": False, "augment": False}
    for name, value in states["whole"].items():
        assert torch.equal(value, states["parts"][name]), name
    assert any(not torch.equal(v, states["plain"][k]) for k, v in states["whole"].items())
    with pytest.raises(ValueError, match="data.augment"):  # a run resumes only with the data it started with
        _image_cli(tmp_path / "whole", "--no-augment", "--epochs", "3")


def test_a_malformed_per_model_section_is_refused(tmp_path):
    (tmp_path / "listops.yaml").write_text("model: {}\ntrain: {}\nper_model: {hgrn3: {model: {}}}\n")
    with pytest.raises(ValueError, match="per_model.hgrn3"):
        build("listops", "hgrn2", _preset_args(config=str(tmp_path)))
    assert load_preset("pathfinder")["model"]["directions"] == "2d"
    assert load_preset("retrieval")["model"]["glu_expand"] == 2


def test_weight_decay_reaches_every_parameter():
    model = LRAClassifier(LRAModelConfig(num_classes=3, vocab_size=5, hidden_size=8, num_layers=2))
    (group,) = build_lra_optimizer(model, 1e-3, 0.01).param_groups
    assert group["weight_decay"] == 0.01 and len(group["params"]) == len(list(model.parameters()))
    # a BatchNorm bias with zero gradient still shrinks, as under the authors' single AdamW group
    bias = model.encoder.norm.norm.bias
    with torch.no_grad():
        bias.fill_(1.0)
    opt = build_lra_optimizer(model, 1e-1, 0.5)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    assert torch.allclose(bias, torch.full_like(bias, 0.95))


def _cli(out: Path, *extra: str) -> None:
    args = ["lra", "fashion_mnist", "--data", str(FASHION), "--out", str(out), "--epochs", "2", "--batch-size", "8",
            "--warmup-steps", "2", "--schedule-steps", "10", "--lr", "3e-3", "--device", "cpu", "--log-every", "2",
            "--ckpt-every", "0", "--model-options", json.dumps({"hidden_size": 8, "num_layers": 1, "dropout": 0.1}),
            *extra]
    assert main(args) == 0


def _final(out: Path) -> tuple[dict, dict]:
    run = out / "fashion_mnist-hgrn2"
    state = sharded.read_latest(str(run / "ckpt"))
    result = json.loads((run / "result.json").read_text())
    return state, result


def test_interrupted_runs_resume_exactly(tmp_path, capsys):
    _cli(tmp_path / "whole")
    _cli(tmp_path / "parts", "--max-steps", "3")   # stops inside epoch 1
    first = json.loads((tmp_path / "parts" / "fashion_mnist-hgrn2" / "result.json").read_text())
    assert first["stopped"] == "max_steps" and first["steps"] == 3 and first["history"] == []
    _cli(tmp_path / "parts", "--max-steps", "7")   # through epoch 1's end, into epoch 2
    _cli(tmp_path / "parts")
    whole, whole_result = _final(tmp_path / "whole")
    parts, parts_result = _final(tmp_path / "parts")
    assert whole["step"] == parts["step"] == 10
    for name, value in whole["model"].items():
        assert torch.equal(value, parts["model"][name]), name
    strip = lambda r: [{k: v for k, v in h.items() if k not in ("epoch_time", "complete")}  # noqa: E731
                       for h in r["history"]]
    assert strip(whole_result) == strip(parts_result) and len(whole_result["history"]) == 2
    assert whole_result["test_acc_at_best_val"] is not None and whole_result["time_per_epoch_s"] > 0
    tests = [h["test_acc"] for h in whole_result["history"]]
    assert (whole_result["test_acc_last"], whole_result["test_acc_max"]) == (tests[-1], max(tests))

    capsys.readouterr()
    assert main(["lra", "--report", "--out", str(tmp_path / "whole")]) == 0
    printed = capsys.readouterr().out
    assert "HGRN2 (paper) | 60.52" in printed and "| hgrn2 (here) |" in printed
    assert (tmp_path / "whole" / "curves.png").is_file()


def test_a_divergence_error_starts_its_own_line_below_the_progress_bar(tmp_path, capsys):
    from hgrn2.cli import console

    args = ["lra", "fashion_mnist", "--data", str(FASHION), "--out", str(tmp_path), "--epochs", "2", "--batch-size",
            "8", "--warmup-steps", "0", "--lr", "1e6", "--device", "cpu", "--log-every", "2", "--ckpt-every", "0",
            "--model-options", json.dumps({"hidden_size": 8, "num_layers": 1})]
    assert console(args) == 1
    err = capsys.readouterr().err
    assert "fashion_mnist-hgrn2:" in err  # the bar was drawn
    assert re.search(r"(^|\n)hgrn2: error: the loss or gradient norm is not finite from step \d+", err), err[-600:]


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="`tasks`: give at least one task"):
        main(["lra", "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="task"):
        main(["lra", "cifar100", "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="batch-size"):
        main(["lra", "fashion_mnist", "--data", str(FASHION), "--out", str(tmp_path), "--batch-size", "1000",
              "--device", "cpu"])
    assert "hgrn2 (here)" not in report(tmp_path / "nothing")
    with pytest.raises(ValueError, match="`--cuda-graph`: task 'listops' with bn_group 16"):
        main(["lra", "listops", "--cuda-graph", "--out", str(tmp_path), "--model-options", '{"bn_group": 16}'])
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="`--cuda-graph`: needs one CUDA device"):
            main(["lra", "fashion_mnist", "--data", str(FASHION), "--out", str(tmp_path), "--cuda-graph"])


def _shift_only_parameters(config: dict, state: dict) -> set[str]:
    """The parameters whose gradient is zero in exact arithmetic: biases that shift every position of the batch
    alike before a training-mode BatchNorm, which subtracts the shift (found by an fp64 backward on the CPU)."""
    from hgrn2.models.lra import LRAClassifier, LRAModelConfig

    torch.manual_seed(0)
    model = LRAClassifier(LRAModelConfig(**{**config, "dropout": 0.0, "embed_dropout": 0.0})).double().train()
    model.load_state_dict({k: v.cpu() for k, v in state.items()})
    x = torch.randn(4, config["max_len"], config["in_channels"], dtype=torch.float64)
    F.cross_entropy(model(x), torch.arange(4)).backward()
    scale = max(p.grad.norm() for p in model.parameters())
    return {n for n, p in model.named_parameters() if p.grad.norm() <= 1e-6 * scale}


def test_shift_only_parameters_are_the_biases_before_a_batchnorm():
    """The biases whose shift the next BatchNorm removes: the embedding's, each mixer's output norm and projection,
    each GLU's output projection; a LayerNorm model has none of them zero (its norms remove no constant vector)."""
    cfg = dataclasses.asdict(LRAModelConfig(hidden_size=8, num_layers=2, max_len=64))
    state = LRAClassifier(LRAModelConfig(**cfg)).state_dict()
    assert _shift_only_parameters(cfg, state) == {"encoder.embed.bias"} | {
        f"encoder.layers.{k}.{n}.bias" for k in (0, 1) for n in ("mixer.g_norm", "mixer.o_proj", "mlp.down_proj")}
    cfg["norm"] = "layer"
    assert not _shift_only_parameters(cfg, LRAClassifier(LRAModelConfig(**cfg)).state_dict())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_graphed_steps_train_as_the_eager_ones(tmp_path):
    """--cuda-graph on a pixel task: the eager run's training losses, accuracies and weights (fp32), resumed
    half-way. Not the evaluation losses: at 8 channels they amplify last-bit differences of the weights (seen on an
    H200: training losses equal to 2e-7, validation losses 1e-3 apart)."""
    def run(out, *extra):
        assert main(["lra", "fashion_mnist", "--data", str(FASHION), "--out", str(out), "--batch-size", "8",
                     "--warmup-steps", "2", "--schedule-steps", "10", "--lr", "3e-3", "--device", "cuda",
                     "--log-every", "1", "--ckpt-every", "0", "--precision", "fp32",
                     "--model-options", json.dumps({"hidden_size": 8, "num_layers": 1}), *extra]) == 0
        return json.loads((out / "fashion_mnist-hgrn2" / "result.json").read_text())

    eager = run(tmp_path / "eager", "--epochs", "2")
    run(tmp_path / "graph", "--epochs", "1", "--cuda-graph")
    graphed = run(tmp_path / "graph", "--epochs", "2", "--cuda-graph")
    for a, b in zip(eager["history"], graphed["history"]):
        for key in ("train_loss", "train_acc", "val_acc", "test_acc"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key
    weights = [sharded.read_latest(str(tmp_path / name / "fashion_mnist-hgrn2" / "ckpt"))["model"]
               for name in ("eager", "graph")]
    assert weights[0].keys() == weights[1].keys()
    shift_only = _shift_only_parameters(eager["config"], weights[0])
    assert "encoder.layers.0.mixer.o_proj.bias" in shift_only
    # a missed, repeated or stale step moves the weights by about lr (3e-3) per step; the graphed step's capturable
    # AdamW (bias corrections on the device) leaves last-bit differences that stay far below lr / 10
    for name, w in weights[0].items():
        if name.endswith(("running_var", "running_mean")) or not torch.is_floating_point(w):
            continue  # the statistics follow the weights; running_var is the ill-conditioned one (above)
        if name in shift_only:
            continue  # its gradient is rounding noise, which AdamW scales up to steps of lr in either direction
        torch.testing.assert_close(weights[1][name], w, rtol=1e-4, atol=3e-4,
                                   msg=lambda m, name=name: f"{name}: {m}")


def _listops_losses(out: Path, data: Path, device: str, *extra: str) -> dict:
    assert main(["lra", "listops", "--examples", "60", "--workers", "1", "--data-dir", str(data), "--out", str(out),
                 "--batch-size", "4", "--epochs", "1", "--warmup-steps", "2", "--schedule-steps", "20", "--lr", "3e-3",
                 "--device", device, "--log-every", "1", "--ckpt-every", "0", "--precision", "fp32", "--model-options",
                 json.dumps({"hidden_size": 16, "num_layers": 2, "embed_dropout": 0.0}), *extra]) == 0
    return losses(out / "listops-hgrn2")


def test_whole_length_token_batches_train_as_the_trimmed_ones(tmp_path, monkeypatch):
    """The batches a CUDA graph takes, on the CPU without one: every ListOps batch padded to the whole length (the
    positions past its longest masked) trains as the trimmed batches do, step by step."""
    trimmed = _listops_losses(tmp_path / "trimmed", tmp_path / "data", "cpu")
    init = LRATask.__init__
    monkeypatch.setattr(LRATask, "__init__", lambda self, *a, full_length=False, **k: init(self, *a, **k,
                                                                                           full_length=True))
    whole = _listops_losses(tmp_path / "whole", tmp_path / "data", "cpu")
    assert len(trimmed) > 10 and trimmed.keys() == whole.keys()
    for step, loss in trimmed.items():
        assert whole[step] == pytest.approx(loss, rel=1e-4), step


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_graphed_token_steps_train_as_the_eager_ones(tmp_path):
    """--cuda-graph on ListOps (whose preset scans read the padding): batches padded to the whole length, the
    positions past each batch's longest masked, train as the eager run's trimmed batches (fp32, no dropout), step by
    step. Reading those positions would move the losses by far more than the rounding of another chunking."""
    eager = _listops_losses(tmp_path / "eager", tmp_path / "data", "cuda")
    graphed = _listops_losses(tmp_path / "graph", tmp_path / "data", "cuda", "--cuda-graph")
    assert len(eager) > 10 and eager.keys() == graphed.keys()
    for step, loss in eager.items():
        assert graphed[step] == pytest.approx(loss, rel=1e-3), step


@pytest.mark.parametrize("flag, value", [("--epochs", "0"), ("--lr", "0"), ("--batch-size", "-2"),
                                         ("--examples", "2"), ("--max-minutes", "0"), ("--log-every", "0"),
                                         ("--seed", "-1"), ("--data-seed", "-1")])
def test_settings_are_checked_before_any_data_is_generated(tmp_path, flag, value):
    with pytest.raises(ValueError, match=f"`{flag}`: expected"):  # a few examples: a missed check fails quickly
        main(["lra", "listops", "--examples", "30", flag, value, "--data-dir", str(tmp_path / "cache"), "--out",
              str(tmp_path)])
    assert not (tmp_path / "cache").exists()


def test_too_few_images_for_a_validation_split_are_refused_before_generating_them(tmp_path):
    with pytest.raises(ValueError, match="`--images`: expected at least 10, got 9"):
        main(["lra", "pathfinder", "--images", "9", "--workers", "1", "--data-dir", str(tmp_path / "cache"),
              "--out", str(tmp_path)])
    assert not (tmp_path / "cache").exists()


def test_overrides_reach_the_config():
    import argparse

    from hgrn2.train.lra import CONFIG_DIR
    args = argparse.Namespace(config=str(CONFIG_DIR), model_options={"hidden_size": 8}, epochs=3, batch_size=None,
                              lr=None, warmup_steps=None, schedule_steps=None, weight_decay=None, precision="bf16")
    cfg, train, _ = build("pathx", "hgrn1", args)
    assert cfg.hidden_size == 8 and cfg.max_len == 16384 and cfg.vocab_size is None and cfg.mixer == "hgrn1"
    assert train["epochs"] == 3 and train["lr"] == 7.5e-4 and train["precision"] == "bf16"
    args.precision = "fp16"
    with pytest.raises(ValueError, match="precision"):
        build("pathx", "hgrn1", args)
    args.precision = None
    args.model_options = {"width": 8}
    with pytest.raises(ValueError, match="model-options"):
        build("listops", "hgrn2", args)


@pytest.mark.slow
def test_torchrun_two_ranks(tmp_path):
    from tests.train.helpers import run_command, torchrun

    run_command([*torchrun(2), "-m", "hgrn2.cli", "lra", "fashion_mnist", "--data", str(FASHION), "--out",
                 str(tmp_path), "--epochs", "1", "--batch-size", "8", "--device", "cpu", "--ckpt-every", "0",
                 "--model-options", json.dumps({"hidden_size": 8, "num_layers": 1})], timeout=600)
    result = json.loads((tmp_path / "fashion_mnist-hgrn2" / "result.json").read_text())
    assert result["world_size"] == 2 and result["steps"] == 5 and len(result["history"]) == 1
    # both ranks' evaluation shards are counted: accuracies are multiples of 1/12 (the fixture's test split)
    assert abs(result["history"][0]["test_acc"] * 12 - round(result["history"][0]["test_acc"] * 12)) < 1e-9


def test_record_in_the_environment_of_the_runs(tmp_path):
    out, rec_dir = tmp_path / "run", tmp_path / "rec"
    _cli(out, "--max-steps", "3", "--record", str(rec_dir))  # stopped inside its first epoch: no accuracy yet
    (row,) = json.loads((rec_dir / "lra.json").read_text())["rows"]
    assert row["test_acc"] is None and row["epochs_done"] == 0 and row["steps"] == 3
    _cli(out)
    result = json.loads((out / "fashion_mnist-hgrn2" / "result.json").read_text())
    h100 = {"device": "NVIDIA H100 80GB HBM3", "device_slug": "h100", "versions": {"torch": "2.11.0"},
            "commit": "abc1234", "date": "2026-11-20"}
    (out / "fashion_mnist-hgrn2" / "result.json").write_text(json.dumps(dict(result, environment=h100)))
    assert main(["lra", "--report", "--out", str(out), "--record", str(rec_dir)]) == 0
    rec = json.loads((rec_dir / "lra.json").read_text())
    assert {k: rec[k] for k in h100} == h100 and rec["command"].startswith("hgrn2 lra --report")
    (row,) = rec["rows"]
    assert (row["task"], row["model"], row["epochs_done"], row["epochs"]) == ("fashion_mnist", "hgrn2", 2, 2)
    assert row["test_acc"] == result["test_acc_at_best_val"] and row["time_per_epoch_s"] == result["time_per_epoch_s"]
    assert (row["test_acc_last"], row["test_acc_max"]) == (result["test_acc_last"], result["test_acc_max"])
    assert rec["paper"]["HGRN2 (paper)"]["listops"] == 60.52 and len(rec["paper"]["HGRN1 (paper)"]) == 6
    assert (rec_dir / rec["figure"]).read_bytes() == (out / "curves.png").read_bytes()
    with pytest.raises(ValueError, match="no finished epoch"):
        main(["lra", "--report", "--out", str(tmp_path / "empty"), "--record", str(rec_dir)])


def test_keep_recorded_keeps_the_rows_of_runs_not_under_out(tmp_path):
    """--keep-recorded: a record's rows of runs that are not under --out stay, with the commit they trained at and
    their curves in the figure; a run under --out replaces its old row; a record of another device is refused."""
    out, rec_dir = tmp_path / "run", tmp_path / "rec"
    _cli(out, "--seed", "2222", "1", "--epochs", "1")
    h100 = {"device": "NVIDIA H100 80GB HBM3", "device_slug": "h100", "versions": {"torch": "2.11.0"},
            "commit": "abc1234", "date": "2026-11-20"}
    for run in out.iterdir():
        result = json.loads((run / "result.json").read_text())
        (run / "result.json").write_text(json.dumps(dict(result, environment=h100)))
    assert main(["lra", "--report", "--out", str(out), "--record", str(rec_dir)]) == 0
    old = json.loads((rec_dir / "lra.json").read_text())
    assert [(r["seed"], r["commit"]) for r in old["rows"]] == [(1, "abc1234"), (2222, "abc1234")]
    # an older record: one row without a commit of its own (the record's), the seed-1 run's folder gone
    old["rows"] = [{k: v for k, v in r.items() if k != "commit"} if r["seed"] == 1 else r for r in old["rows"]]
    old["rows"][0]["test_acc"], old["commit"] = 0.125, "old5678"
    (rec_dir / "lra.json").write_text(json.dumps(old))
    shutil.rmtree(out / "fashion_mnist-hgrn2-seed1")
    run = out / "fashion_mnist-hgrn2"
    result = json.loads((run / "result.json").read_text())
    (run / "result.json").write_text(json.dumps(dict(result, environment=dict(h100, commit="def9012"))))
    with pytest.raises(ValueError, match="`--keep-recorded`: .* give --record too"):
        main(["lra", "--report", "--out", str(out), "--keep-recorded"])
    assert main(["lra", "--report", "--out", str(out), "--record", str(rec_dir), "--keep-recorded"]) == 0
    rec = json.loads((rec_dir / "lra.json").read_text())
    assert [(r["seed"], r["commit"], r["test_acc"]) for r in rec["rows"]] == [
        (1, "old5678", 0.125), (2222, "def9012", result["test_acc_at_best_val"])]
    assert rec["commit"] == "def9012, old5678 (per row)"
    assert (rec_dir / rec["figure"]).read_bytes() == (out / "curves+recorded.png").read_bytes()
    # without the flag the record holds the runs under --out alone
    assert main(["lra", "--report", "--out", str(out), "--record", str(rec_dir)]) == 0
    assert [r["seed"] for r in json.loads((rec_dir / "lra.json").read_text())["rows"]] == [2222]
    (rec_dir / "lra.json").write_text(json.dumps(dict(old, device="NVIDIA H200")))
    with pytest.raises(ValueError, match="`--keep-recorded`: .* holds runs on NVIDIA H200"):
        main(["lra", "--report", "--out", str(out), "--record", str(rec_dir), "--keep-recorded"])
    with pytest.raises(ValueError, match="`--keep-recorded`: no record at"):
        main(["lra", "--report", "--out", str(out), "--record", str(tmp_path / "none"), "--keep-recorded"])


def test_settings_of_reproduces_hgrn2_as_the_paper_describes_it():
    # "using HGRN1's configuration": HGRN2's mixer with HGRN1's preset settings; these are the settings the recorded
    # ListOps and Pathfinder runs wrote into their result.json (ListOps' without grad_clip, which then meant none,
    # and with 50 epochs, which its resume raises to the preset's 67), but for Pathfinder's pooling: the recorded run
    # pooled the last position, before HGRN1's launch script was read to override its yaml file's decoder with mean
    # pooling
    common = {"mixer": "hgrn2", "in_channels": 1, "glu_expand": 1, "norm": "batch", "dropout": 0.0, "dual": False,
              "use_lower_bound": True, "num_heads": 8, "bn_group": None, "pad_group": None}
    recorded = {
        "listops": ({**common, "num_classes": 10, "vocab_size": 17, "hidden_size": 32, "num_layers": 6,
                     "expand_ratio": 2, "directions": "bi", "embed_dropout": 0.1, "pooling": "mean",
                     "positional": True, "max_len": 2048, "mask_padding": False},
                    {"batch_size": 128, "lr": 5e-4, "weight_decay": 0.01, "warmup_steps": 5000,
                     "schedule_steps": 50000, "epochs": 67, "precision": "fp32", "grad_clip": 0.0}),
        "pathfinder": ({**common, "num_classes": 2, "vocab_size": None, "hidden_size": 128, "num_layers": 6,
                        "expand_ratio": 2, "directions": "2d", "embed_dropout": 0.0, "pooling": "mean",
                        "positional": False, "max_len": 1024, "mask_padding": True},
                       {"batch_size": 128, "lr": 2e-3, "weight_decay": 0.0, "warmup_steps": 50000,
                        "schedule_steps": 500000, "epochs": 200, "precision": "fp32", "grad_clip": 0.0})}
    for task, (config, train) in recorded.items():
        cfg, got, _ = build(task, "hgrn2", _preset_args(settings_of="hgrn1"))
        assert (cfg.to_dict(), got) == (config, train), task
    # attention keeps its position table whoever's settings it takes
    assert build("pathfinder", "attention", _preset_args(settings_of="hgrn2"))[0].positional is True


def test_settings_of_names_its_runs_apart(tmp_path, capsys):
    _cli(tmp_path, "--max-steps", "5")
    capsys.readouterr()
    _cli(tmp_path, "--max-steps", "5", "--settings-of", "hgrn1")
    assert "| fashion_mnist | hgrn2, hgrn1's settings |" in capsys.readouterr().out  # the run's summary line
    own = json.loads((tmp_path / "fashion_mnist-hgrn2" / "result.json").read_text())
    other = json.loads((tmp_path / "fashion_mnist-hgrn2-as-hgrn1" / "result.json").read_text())
    assert (own["settings_of"], other["settings_of"]) == ("hgrn2", "hgrn1") and other["model"] == "hgrn2"
    # a result.json written before settings_of and data existed: the model's own settings
    old = {k: v for k, v in own.items() if k not in ("settings_of", "data")}
    (tmp_path / "fashion_mnist-hgrn2" / "result.json").write_text(json.dumps(old))
    capsys.readouterr()
    assert main(["lra", "--report", "--out", str(tmp_path), "--record", str(tmp_path / "rec")]) == 0
    printed = capsys.readouterr().out
    assert "| hgrn2 (here) |" in printed and "| hgrn2, hgrn1's settings (here) |" in printed
    rows = json.loads((tmp_path / "rec" / "lra.json").read_text())["rows"]
    assert sorted(r["settings"] for r in rows) == ["hgrn1", "hgrn2"]


def test_a_run_resumes_only_with_its_own_settings(tmp_path):
    _cli(tmp_path, "--max-steps", "3")
    with pytest.raises(ValueError, match=r"`--out`: .* other settings \{'train.lr': \(0.003, 0.001\)\}"):
        _cli(tmp_path, "--lr", "1e-3")
    _cli(tmp_path, "--epochs", "3")  # more epochs continue the same run
    assert json.loads((tmp_path / "fashion_mnist-hgrn2" / "result.json").read_text())["epochs_done"] == 3


def test_seeds_train_apart_and_report_their_mean_and_spread(tmp_path, capsys):
    """--seed A B: one run per seed, the authors' seed in the usual folder and any other in FOLDER-seedN (a seed never
    continues another's run); --report and the record give the mean ± sample standard deviation over the seeds."""
    _cli(tmp_path, "--seed", "2222", "1", "1", "--max-steps", "3")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fashion_mnist-hgrn2", "fashion_mnist-hgrn2-seed1"]
    results = {p.name: json.loads((p / "result.json").read_text()) for p in tmp_path.iterdir()}
    assert results["fashion_mnist-hgrn2-seed1"]["seed"] == 1 and results["fashion_mnist-hgrn2"]["seed"] == 2222
    # a folder resumes only with its own seed (here one renamed to another seed's name)
    (tmp_path / "fashion_mnist-hgrn2-seed1").rename(tmp_path / "fashion_mnist-hgrn2-seed2")
    with pytest.raises(ValueError, match=r"other settings \{'run.seed': \(1, 2\)\}"):
        _cli(tmp_path, "--seed", "2", "--max-steps", "3")
    (tmp_path / "fashion_mnist-hgrn2-seed2").rename(tmp_path / "fashion_mnist-hgrn2-seed1")
    for name, acc in (("fashion_mnist-hgrn2", 0.5), ("fashion_mnist-hgrn2-seed1", 0.6)):  # as if both had finished
        path = tmp_path / name / "result.json"
        saved = json.loads(path.read_text())
        path.write_text(json.dumps({**saved, "test_acc_at_best_val": acc, "stopped": None, "task": "listops",
                                    "epochs_done": saved["train"]["epochs"]}))
    capsys.readouterr()
    assert main(["lra", "--report", "--out", str(tmp_path), "--record", str(tmp_path / "rec")]) == 0
    assert "| hgrn2 (here) | 55.00 ± 7.07 (2) |" in capsys.readouterr().out
    rec = json.loads((tmp_path / "rec" / "lra.json").read_text())
    assert [r["seed"] for r in rec["rows"]] == [1, 2222]
    assert "| hgrn2 (here) | 55.00 ± 7.07 (2) |" in report_lra_table(rec)


def test_seeds_cell_averages_only_runs_equally_far_along():
    assert seeds_cell([(None, 3, 50)]) is None
    assert seeds_cell([(0.5812, 48, 50)]) == "58.12*"
    assert seeds_cell([(0.58, 50, 50), (0.60, 50, 50), (None, 50, 50), (0.59, 60, 50)]) == "59.00 ± 1.00 (3)"
    # a seed that has just started is not averaged with finished ones, nor unfinished runs with less progress
    assert seeds_cell([(0.58, 50, 50), (0.38, 6, 50)]) == "58.00 [1 of 2 seeds]"
    assert seeds_cell([(0.58, 48, 50), (0.56, 48, 50), (0.38, 6, 50)]) == "57.00 ± 1.41 (2)* [2 of 3 seeds]"


def test_settings_of_names_the_flag_when_another_models_settings_do_not_fit():
    # Path-X: HGRN2's preset scans 2d_series, which HGRN1's mixer has not
    with pytest.raises(ValueError, match=r"`--settings-of`: hgrn1 with hgrn2's pathx settings: `directions`"):
        build("pathx", "hgrn1", _preset_args(settings_of="hgrn2"))


def _rewrite_latest(run: Path, change) -> None:
    """Change the train state of the newest checkpoint (and its manifest entry)."""
    path = Path(sharded.list_checkpoints(str(run / "ckpt"))[-1][1])
    state = torch.load(path / sharded.TRAIN_STATE, weights_only=False)
    change(state)
    torch.save(state, path / sharded.TRAIN_STATE)
    manifest = json.loads((path / sharded.MANIFEST).read_text())
    manifest[sharded.TRAIN_STATE] = {"bytes": os.path.getsize(path / sharded.TRAIN_STATE),
                                     "sha256": checkpoint.sha256(str(path / sharded.TRAIN_STATE))}
    (path / sharded.MANIFEST).write_text(json.dumps(manifest))


def test_runs_saved_before_their_settings_resume_and_are_still_checked(tmp_path):
    run = tmp_path / "fashion_mnist-hgrn2"
    _cli(tmp_path, "--max-steps", "3")
    # settings as the first versions kept them: no grad_clip where the preset had none, no data options
    _rewrite_latest(run, lambda s: (s["settings"]["train"].pop("grad_clip"), s["settings"].pop("data")))
    _cli(tmp_path, "--max-steps", "5")
    # no settings in the checkpoint: its run's result.json says what it started with
    _rewrite_latest(run, lambda s: s.pop("settings"))
    with pytest.raises(ValueError, match=r"other settings \{'train.lr': \(0.003, 0.001\)\}"):
        _cli(tmp_path, "--lr", "1e-3")
    _cli(tmp_path)
    assert json.loads((run / "result.json").read_text())["epochs_done"] == 2
    # an image run from before the data options was grey and unaugmented
    from hgrn2.train.lra import _check_same_settings, _started_with
    state = {"settings": {"config": {"in_channels": 1}, "train": {"lr": 1.0}}}
    now = {"config": {"in_channels": 1}, "train": {"lr": 1.0, "grad_clip": 0.0},
           "data": {"grayscale": True, "augment": True}}
    with pytest.raises(ValueError, match=r"\{'data.augment': \(False, True\)\}"):
        _check_same_settings(run, _started_with(run, state), now)
    _check_same_settings(run, _started_with(run, state), {**now, "data": {"grayscale": True, "augment": False}})
    assert _started_with(tmp_path / "none", {}) is None  # neither a checkpoint's settings nor a result.json


def test_variants_change_one_setting_on_top_of_each_models_own():
    for mixer, width in (("hgrn2", 64), ("hgrn1", 32)):
        base, base_train, _ = build("listops", mixer, _preset_args())
        cfg, train, _ = build("listops", mixer, _preset_args(), "mask-padding")
        assert cfg.to_dict() == {**base.to_dict(), "mask_padding": True} and train == base_train
        assert cfg.hidden_size == width
        cfg, train, _ = build("listops", mixer, _preset_args(), "cosine-to-zero")
        assert cfg == base and train == {**base_train, "schedule_steps": 37500, "epochs": 50}
    # the ones from the authors' launches and their LRA code, each one setting (or two) on HGRN2's preset
    base, base_train, _ = build("listops", "hgrn2", _preset_args())
    for variant, model, train in (("per-gpu-padding", {"pad_group": 16}, {}), ("causal", {"directions": "causal"}, {}),
                                  ("wd-0.01", {}, {"weight_decay": 0.01}),
                                  ("hgrn1-training", {}, {"weight_decay": 0.01, "precision": "fp32"})):
        cfg, got, _ = build("listops", "hgrn2", _preset_args(), variant)
        assert (cfg.to_dict(), got) == ({**base.to_dict(), **model}, {**base_train, **train}), variant
    # the command line still overrides a variant
    assert build("listops", "hgrn2", _preset_args(lr=3e-3), "lr-1e-3")[1]["lr"] == 3e-3
    assert build("pathfinder", "hgrn2", _preset_args(), "bn-global")[0].bn_group is None
    with pytest.raises(ValueError, match="`--variants`: listops.yaml has no variant 'nope'; its variants: preset, "):
        build("listops", "hgrn2", _preset_args(), "nope")


def _every_variant():
    return [(task, name) for task in ("listops", "pathfinder", "pathx")
            for name in load_preset(task).get("variants") or {}]


@pytest.mark.parametrize("task, variant", _every_variant())
def test_every_variant_builds_and_trains(task, variant):
    """Each ablation variant of the presets, on each HGRU, shrunk: two optimiser steps on the preset's optimiser, at
    its schedule's first steps after warmup (warmup's first steps move no fp32 weight of Path-X), change the weights
    and keep the loss finite."""
    from hgrn2.data.lra.tasks import TASKS
    from hgrn2.train.optim import lr_at

    for mixer in ("hgrn2", "hgrn1"):
        if mixer == "hgrn1" and build(task, mixer, _preset_args(), variant)[0].directions == "2d_series":
            continue  # HGRN2's mixer alone composes the grid scans (hgru2-pytorch Hgru2_2d_series)
        torch.manual_seed(0)
        cfg, train, _ = build(task, mixer, _preset_args(model_options={"hidden_size": 8, "num_layers": 2}), variant)
        model = LRAClassifier(cfg)
        opt = build_lra_optimizer(model, train["lr"], train["weight_decay"])
        before = [p.detach().clone() for p in model.parameters()]
        labels = torch.arange(4) % TASKS[task].num_classes
        if cfg.vocab_size:
            mask = torch.arange(20)[None] < torch.tensor([20, 13, 7, 16])[:, None]
            x = torch.randint(0, cfg.vocab_size, (4, 20)).masked_fill(~mask, 0)
        else:
            x, mask = torch.randn(4, 16, 1), None
        for step in range(2):
            for group in opt.param_groups:
                group["lr"] = lr_at(train["warmup_steps"] + step, schedule="cosine", lr=train["lr"],
                                    warmup_steps=train["warmup_steps"], max_steps=train["schedule_steps"])
            loss = F.cross_entropy(model(x, mask), labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            assert torch.isfinite(loss)
        assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters()) if b.grad is not None)


def test_a_malformed_variants_section_is_refused(tmp_path):
    for entry in ("{preset: {model: {}}}", "{x: {data: {augment: true}}}", "{x: 3}"):
        (tmp_path / "fashion_mnist.yaml").write_text(f"model: {{}}\ntrain: {{}}\nvariants: {entry}\n")
        with pytest.raises(ValueError, match="`--config`: fashion_mnist.yaml variants"):
            build("fashion_mnist", "hgrn2", _preset_args(config=str(tmp_path)))


def test_variants_train_apart_and_report_apart(tmp_path, capsys):
    config = tmp_path / "config"
    config.mkdir()
    preset = load_preset("fashion_mnist")
    preset["variants"] = {"wide": {"note": "a wider model", "model": {"hidden_size": 12}}}
    (config / "fashion_mnist.yaml").write_text(yaml.safe_dump(preset))
    out = tmp_path / "out"
    capsys.readouterr()
    _cli(out, "--max-steps", "3", "--config", str(config), "--variants", "preset", "wide")
    assert "| fashion_mnist | hgrn2 [wide] |" in capsys.readouterr().out
    own = json.loads((out / "fashion_mnist-hgrn2" / "result.json").read_text())
    wide = json.loads((out / "fashion_mnist-hgrn2+wide" / "result.json").read_text())
    assert (own["variant"], wide["variant"]) == (None, "wide")
    assert (own["variant_note"], wide["variant_note"]) == (None, "a wider model")
    # the command line's model options (hidden 8) override the variant's width, as they do the preset's
    assert own["config"]["hidden_size"] == wide["config"]["hidden_size"] == 8
    assert "| hgrn2 [wide] (here) |" in report(out) and "| hgrn2 (here) |" in report(out)
    with pytest.raises(ValueError, match="`--variants`: fashion_mnist.yaml has no variant 'narrow'"):
        _cli(tmp_path / "none", "--config", str(config), "--variants", "narrow")
    assert not (tmp_path / "none").exists()


def _losses(run: Path) -> list[float]:
    return [r["loss"] for r in map(json.loads, (run / "log.jsonl").read_text().splitlines()) if "loss" in r]


def test_concurrent_runs_train_as_they_do_one_after_the_other(tmp_path, capsys):
    """--concurrent 2: the seeds' runs train side by side in worker processes, each as it trains alone (up to the
    order of the CPU's float sums, which the workers' thread counts set), and the summary lists both."""
    _cli(tmp_path / "apart", "--seed", "2222", "1", "--max-steps", "3")
    capsys.readouterr()
    _cli(tmp_path / "side", "--seed", "2222", "1", "--max-steps", "3", "--concurrent", "2")
    out = capsys.readouterr().out
    assert "2 runs, 2 at a time on the CPU" in out
    assert "| fashion_mnist | hgrn2 seed 1 |" in out and "| fashion_mnist | hgrn2 |" in out
    for name in ("fashion_mnist-hgrn2", "fashion_mnist-hgrn2-seed1"):
        side, apart = _losses(tmp_path / "side" / name), _losses(tmp_path / "apart" / name)
        assert len(side) == len(apart) > 0
        np.testing.assert_allclose(side, apart, rtol=1e-5)
        assert json.loads((tmp_path / "side" / name / "result.json").read_text())["steps"] == 3


def test_concurrent_names_a_failing_run_and_trains_the_others(tmp_path, capsys):
    _cli(tmp_path, "--seed", "1", "--max-steps", "2", "--lr", "1e-3")  # seed 1's folder holds other settings
    capsys.readouterr()
    args = ["lra", "fashion_mnist", "--data", str(FASHION), "--out", str(tmp_path), "--epochs", "2", "--batch-size",
            "8", "--device", "cpu", "--ckpt-every", "0", "--max-steps", "2", "--seed", "2222", "1", "--concurrent", "2",
            "--model-options", json.dumps({"hidden_size": 8, "num_layers": 1, "dropout": 0.1}), "--lr", "3e-3"]
    assert main(args) == 1
    out = capsys.readouterr().out
    assert "fashion_mnist-hgrn2-seed1: failed: ValueError: `--out`:" in out
    assert "| fashion_mnist | hgrn2 |" in out and "| fashion_mnist | hgrn2 seed 1 |" not in out
    assert json.loads((tmp_path / "fashion_mnist-hgrn2" / "result.json").read_text())["steps"] == 2
    with pytest.raises(ValueError, match="`--concurrent`: expected at least 1, got 0"):
        main([*args[:-2], "--concurrent", "0"])


def test_gpu_minutes_sum_each_epochs_wall_time_over_the_runs_gpus():
    from hgrn2.experiments.lra import gpu_minutes

    history = [{"epoch": 1, "epoch_time": 30.0}, {"epoch": 2, "epoch_time": 90.0}]
    np.testing.assert_allclose(gpu_minutes({"history": history, "world_size": 4}), [2.0, 8.0])
    np.testing.assert_allclose(gpu_minutes({"history": history}), [0.5, 2.0])  # records before world_size: one


def test_a_variant_that_adds_epochs_continues_a_copy_of_the_presets_run(tmp_path, capsys):
    """A variant whose only change is more epochs (as ListOps' preset is to its launch-epochs variant) is the
    preset's run up to the preset's last epoch: a copy of the preset's folder under the variant's name resumes from
    its checkpoint and ends where a run of the variant from scratch ends, to the bit."""
    config = tmp_path / "config"
    config.mkdir()
    preset = load_preset("fashion_mnist")
    preset["train"]["epochs"] = 1
    preset["variants"] = {"longer": {"note": "two epochs", "train": {"epochs": 2}}}
    (config / "fashion_mnist.yaml").write_text(yaml.safe_dump(preset))

    def cli(out: Path, *extra: str) -> None:
        args = ["lra", "fashion_mnist", "--data", str(FASHION), "--out", str(out), "--batch-size", "8",
                "--warmup-steps", "2", "--schedule-steps", "10", "--lr", "3e-3", "--device", "cpu", "--ckpt-every",
                "0", "--config", str(config), "--model-options", json.dumps({"hidden_size": 8, "num_layers": 1}),
                *extra]
        assert main(args) == 0

    cli(tmp_path / "scratch", "--variants", "longer")
    cli(tmp_path / "cont")  # the preset: one epoch
    run = tmp_path / "cont" / "fashion_mnist-hgrn2+longer"
    shutil.copytree(tmp_path / "cont" / "fashion_mnist-hgrn2", run)
    capsys.readouterr()
    cli(tmp_path / "cont", "--variants", "longer")
    assert "--epochs 1 -> 2: the run continues" in capsys.readouterr().out  # resumed, not started over
    a, b = (sharded.read_latest(str(d / "fashion_mnist-hgrn2+longer" / "ckpt")) for d in (tmp_path / "scratch",
                                                                                         tmp_path / "cont"))
    assert a["step"] == b["step"] and a["epoch"] == b["epoch"] == 2
    for name, value in a["model"].items():
        assert torch.equal(value, b["model"][name]), name
    result = json.loads((run / "result.json").read_text())
    assert (result["variant"], result["epochs_done"], len(result["history"])) == ("longer", 2, 2)


def test_a_prefix_variant_is_read_from_the_presets_run(tmp_path):
    """A variant that only stops earlier (`prefix: true`) gets its record row from the preset's run of the same model
    and seed once that has trained past its epochs, unless it has a run of its own; one that changes more than the
    epochs cannot be a prefix."""
    config = tmp_path / "config"
    config.mkdir()
    preset = load_preset("fashion_mnist")
    preset["train"]["epochs"] = 3
    preset["variants"] = {"shorter": {"note": "two epochs", "train": {"epochs": 2}, "prefix": True}}
    (config / "fashion_mnist.yaml").write_text(yaml.safe_dump(preset))
    out, rec = tmp_path / "out", tmp_path / "rec"

    def cli(*extra: str) -> None:
        args = ["lra", "fashion_mnist", "--data", str(FASHION), "--out", str(out), "--batch-size", "8",
                "--warmup-steps", "2", "--schedule-steps", "10", "--lr", "3e-3", "--device", "cpu", "--ckpt-every",
                "0", "--config", str(config), "--model-options", json.dumps({"hidden_size": 8, "num_layers": 1}),
                *extra]
        assert main(args) == 0

    def rows() -> list[dict]:
        assert main(["lra", "--report", "--out", str(out), "--record", str(rec), "--config", str(config)]) == 0
        return json.loads((rec / "lra.json").read_text())["rows"]

    cli("--epochs", "1")
    assert [r["variant"] for r in rows()] == [None]  # the preset's run has not reached epoch 2
    cli()
    own, short = rows()
    assert (short["variant"], short["read_from_preset"], short["epochs_done"]) == ("shorter", 3, 2)
    assert short["curve"] == own["curve"][:2] and short["steps"] * 3 == own["steps"] * 2
    best = max(own["curve"][:2], key=lambda c: c[1])
    assert (short["test_acc"], short["best_val_acc"]) == (best[2], best[1])
    cli("--variants", "shorter")  # a run of its own replaces the reading
    assert [(r["variant"], r.get("read_from_preset")) for r in rows()] == [(None, None), ("shorter", None)]
    preset["variants"]["shorter"]["model"] = {"hidden_size": 12}
    (config / "fashion_mnist.yaml").write_text(yaml.safe_dump(preset))
    with pytest.raises(ValueError, match="variants.shorter: a prefix variant changes the epochs only"):
        cli("--variants", "shorter")


def test_a_run_resumes_only_on_the_data_it_started_on(tmp_path):
    """Generated data are made again on each machine: a run checks their fingerprint when it resumes, and refuses
    other data in one line (here a label of the saved split changed by hand)."""
    def cli(*extra):
        return main(["lra", "listops", "--examples", "60", "--workers", "1", "--data-dir", str(tmp_path / "data"),
                     "--out", str(tmp_path / "out"), "--batch-size", "4", "--device", "cpu", "--ckpt-every", "1",
                     "--model-options", json.dumps({"hidden_size": 8, "num_layers": 1}), *extra])

    assert cli("--max-steps", "2") == 0
    assert cli("--max-steps", "3") == 0  # the same data: it continues
    tsv = next((tmp_path / "data").glob("listops-*/basic_train.tsv"))
    header, first, *rest = tsv.read_text().splitlines()
    source, label = first.split("\t")
    tsv.write_text("\n".join([header, f"{source}\t{(int(label) + 1) % 10}", *rest]) + "\n")
    with pytest.raises(ValueError, match=r"^`--data-dir` / `--data`: the data loaded now \(fingerprint [0-9a-f]{8}\) "
                                         r"are not those .* started on \([0-9a-f]{8}\)"):
        cli("--max-steps", "4")


def test_prepare_data_makes_the_data_sets_and_trains_nothing(tmp_path, capsys):
    assert main(["lra", "listops", "--examples", "60", "--workers", "1", "--data-dir", str(tmp_path / "data"),
                 "--out", str(tmp_path / "out"), "--prepare-data"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert re.fullmatch(r"listops: 58 / 1 / 1 examples \(train / val / test\), fingerprint [0-9a-f]{8}", line)
    assert sorted(p.name for p in next((tmp_path / "data").glob("listops-*")).iterdir()) == [
        f"basic_{s}.{e}" for s in ("test", "train", "val") for e in ("tokens.npz", "tsv")]
    assert not (tmp_path / "out").exists()
