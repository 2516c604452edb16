"""`hgrn2 vision train|eval|report`: image classification with the HGRN2 vision models, the authors' DeiT-style recipe.

    hgrn2 vision train --config deit_tiny --set data=/data/imagenet out_dir=runs/deit_tiny
    torchrun --nproc_per_node=8 -m hgrn2.cli vision train --config deit_tiny --set data=/data/imagenet
    hgrn2 vision train --config fashion_mnist            # offline demo on the Debian `dataset-fashion-mnist` files
    hgrn2 vision eval --run runs/deit_tiny [--ema]
    hgrn2 vision report --run runs/deit_tiny --record    # the learning curve as a table, a plot and a record

The recipe is the authors' `main.py` (OpenNLPLab/im, DeiT's) as their HGRN2 launch script calls it: AdamW with
timm's defaults, lr scaled by global batch / 512, cosine per epoch with linear warmup from 1e-6 to a floor of
1e-5, RandAugment, random erasing, Mixup/CutMix with label smoothing, repeated augmentation, gradient clipping.
Model EMA (torch's `AveragedModel`) is available but off in the presets, as in the authors' code.

Data: `dataset: imagefolder` reads `<data>/train/<class>/*` and `<data>/val/<class>/*` (ImageNet-1k layout) with
torchvision and timm's transforms (the `vision` extra); `dataset: fashion_mnist` reads the four idx files of
Fashion-MNIST (gzipped or not) with plain torch, no augmentation, and runs without timm unless Mixup/CutMix is on.

`--record` (on `train`, or on `report` for a run folder copied from the machine that trained it) writes the learning
curve as a benchmark record, `benchmarks/results/<device>/vision_fashion_mnist.json` (`vision_<model>.json` for an
ImageFolder run) with the plot beside it, in the environment the run recorded where it trained.

Every epoch ends with an evaluation on the validation split: its first `eval_examples` images where that is set, the
whole split after the last epoch (the accuracy `results.json` reports; `best_acc1` is the best evaluation of the whole
split). A checkpoint is written at the end of every epoch (model, optimiser, EMA, RNG states); a restarted run
continues from the newest intact one and trains the same weights as one that never stopped. It resumes only with the
settings it started with (`RESUME_FREE` may change, and `epochs`, which reshapes the cosine, and `eval_examples`,
each said in one line); a step whose loss or gradient norm is not finite stops the run before anything of it is saved.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
import yaml

from ..bench.common import (
    VISION_CURVE_COLUMNS,
    add_record_argument,
    command_of,
    environment,
    format_table,
    runs_environment,
    write_result,
)
from ..data.files import write_json
from ..data.idx import read_fashion_mnist_split
from ..models.vision import HGRN2ForImageClassification, VisionConfig, num_parameters, preset
from . import config, guard, sharded
from . import distributed as D
from .engine import Engine, EpochEnd, Task
from .logger import read_log
from .optim import build_optimizer
from .plot import pyplot

PRESET_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "configs", "vision")
FASHION_MNIST_MEAN_STD = (0.2860, 0.3530)


@dataclass
class VisionTrainConfig:
    # model: a preset of hgrn2.models.vision plus field overrides; image size and channels come from the data set
    model: str = "deit_tiny"
    model_args: dict = field(default_factory=dict)
    # data
    dataset: str = "imagefolder"  # "imagefolder" (<data>/train, <data>/val) or "fashion_mnist"
    data: str = ""
    image_size: int = 224
    num_workers: int = 8
    # optimisation (lr is scaled by batch_size / lr_batch, as the authors' main.py does)
    epochs: int = 300
    batch_size: int = 1024  # global: divided over the ranks
    lr: float = 7.5e-4
    lr_batch: int = 512
    min_lr: float = 1e-5
    warmup_lr: float = 1e-6
    warmup_epochs: int = 20
    weight_decay: float = 0.05
    betas: list = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    clip_grad: float = 5.0  # 0 = off
    # augmentation and regularisation
    smoothing: float = 0.1
    mixup: float = 0.8
    cutmix: float = 1.0
    auto_augment: str = "rand-m9-mstd0.5-inc1"  # timm's RandAugment spec; "" = off
    color_jitter: float = 0.4
    reprob: float = 0.25  # random erasing
    interpolation: str = "bicubic"
    repeated_aug: bool = True
    ema_decay: float = 0.0  # 0 = no EMA model; DeiT's value is 0.99996
    # run
    precision: str = "bf16"  # bf16 autocast on CUDA; CPU always computes in fp32
    device: str = "auto"
    seed: int = 3407
    out_dir: str = "runs/vision"
    max_steps_per_epoch: int = 0  # 0 = whole epochs; > 0 cuts each epoch short (smoke runs)
    # validation images of each epoch's evaluation (the split's first N); 0 = the whole split. The last epoch's
    # evaluation reads the whole split (the accuracy results.json reports), and best_acc1 is the best of those
    eval_examples: int = 0
    log_every: int = 50
    keep_last: int = 2
    progress: bool = True
    cuda_graph: bool = False  # each step replayed as one CUDA graph (one GPU; the batches' shapes are fixed)

    def validate(self) -> None:
        choices = {"dataset": ("imagefolder", "fashion_mnist"), "precision": ("bf16", "fp32"),
                   "device": ("auto", "cuda", "cpu")}
        for key, allowed in choices.items():
            if getattr(self, key) not in allowed:
                raise ValueError(f"`{key}`: expected one of {allowed}, got {getattr(self, key)!r}")
        for key in ("epochs", "batch_size", "lr_batch", "image_size", "log_every", "keep_last"):
            if getattr(self, key) < 1:
                raise ValueError(f"`{key}`: expected >= 1, got {getattr(self, key)}")
        for key in ("warmup_epochs", "num_workers", "max_steps_per_epoch", "eval_examples", "clip_grad",
                    "weight_decay", "mixup", "cutmix", "reprob", "color_jitter", "warmup_lr", "min_lr"):
            if getattr(self, key) < 0:
                raise ValueError(f"`{key}`: expected >= 0, got {getattr(self, key)}")
        if not self.lr > 0:
            raise ValueError(f"`lr`: expected > 0, got {self.lr}")
        if not 0 <= self.smoothing < 1 or not 0 <= self.ema_decay < 1:
            raise ValueError(f"`smoothing` and `ema_decay`: expected values in [0, 1), got {self.smoothing}, "
                             f"{self.ema_decay}")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"`betas`: expected two numbers in [0, 1), got {self.betas}")
        if not self.data:
            raise ValueError("`data`: not set; --set data=DIR")
        if not isinstance(self.cuda_graph, bool):
            raise ValueError(f"`cuda_graph`: expected true or false, got {self.cuda_graph!r}")
        if self.cuda_graph and self.device == "cpu":
            raise ValueError("`cuda_graph`: needs a CUDA device, got device=cpu")

    def uses_timm(self) -> bool:
        return self.dataset == "imagefolder" or self.mixup > 0 or self.cutmix > 0 or self.repeated_aug

    def peak_lr(self) -> float:
        return self.lr * self.batch_size / self.lr_batch

    def bf16(self, device: torch.device) -> bool:
        return self.precision == "bf16" and device.type == "cuda"  # a CPU computes in fp32


# settings a resumed run may change; `epochs` and `eval_examples` may (said in one line), `data` is compared resolved
RESUME_FREE = ("num_workers", "device", "out_dir", "log_every", "keep_last", "progress", "epochs", "eval_examples",
               "data")


def make_config(name_or_path: str | None = None, overrides: list[str] | None = None) -> VisionTrainConfig:
    """A preset (`hgrn2/configs/vision/<name>.yaml`) or YAML file, then `key=value` overrides (`model_args.k=v`
    edits the model's fields); keys are checked (`config.make_config`)."""
    return config.make_config(name_or_path, overrides, VisionTrainConfig, PRESET_DIR, nested="model_args")


def epoch_lr(cfg: VisionTrainConfig, epoch: int) -> float:
    """The lr of training epoch `epoch` (0-based): timm's per-epoch cosine with linear warmup, t_initial = epochs.
    The authors' loop steps the scheduler after each epoch with that epoch's index, so epoch e trains with the
    schedule's value at e − 1 (epochs 0 and 1 both at the warmup start)."""
    t, peak = max(epoch - 1, 0), cfg.peak_lr()
    if t < cfg.warmup_epochs:
        return cfg.warmup_lr + t * (peak - cfg.warmup_lr) / cfg.warmup_epochs
    return cfg.min_lr + 0.5 * (peak - cfg.min_lr) * (1 + math.cos(math.pi * t / cfg.epochs))


# --- data ---------------------------------------------------------------------------------------------------------


def fashion_mnist(directory: str, split: str) -> torch.utils.data.TensorDataset:
    """Images [N, 1, S, S] float32 (S = 28 in the real files), normalised, and labels [N] int64 of one split
    ("train" or "val", the latter Fashion-MNIST's test files)."""
    images, labels = read_fashion_mnist_split(directory, "test" if split == "val" else split)
    mean, std = FASHION_MNIST_MEAN_STD
    x = (torch.from_numpy(images.astype(np.float32)) / 255 - mean) / std
    return torch.utils.data.TensorDataset(x.unsqueeze(1), torch.from_numpy(labels.astype(np.int64)))


def image_folder(cfg: VisionTrainConfig, split: str):
    """torchvision's ImageFolder of `<data>/<split>` with timm's train (RandAugment, erasing) or eval transform."""
    from timm.data import create_transform
    from torchvision.datasets import ImageFolder

    root = os.path.join(cfg.data, split)
    if not os.path.isdir(root):
        raise FileNotFoundError(f"`data`: no directory {root}; expected the ImageNet layout "
                                f"<data>/train/<class>/<image> and <data>/val/<class>/<image>")
    if split == "train":
        tf = create_transform(cfg.image_size, is_training=True, color_jitter=cfg.color_jitter,
                              auto_augment=cfg.auto_augment or None, interpolation=cfg.interpolation,
                              re_prob=cfg.reprob, re_mode="pixel", re_count=1)
    else:
        tf = create_transform(cfg.image_size, is_training=False, interpolation=cfg.interpolation, crop_pct=224 / 256)
    return ImageFolder(root, transform=tf)


def datasets(cfg: VisionTrainConfig):
    """(train, val, num_classes, in_channels, image_size)."""
    if cfg.dataset == "fashion_mnist":
        train, val = fashion_mnist(cfg.data, "train"), fashion_mnist(cfg.data, "val")
        if train.tensors[0].shape[1:] != val.tensors[0].shape[1:]:
            raise ValueError(f"`data`: train images {tuple(train.tensors[0].shape[1:])} and val images "
                             f"{tuple(val.tensors[0].shape[1:])} differ in size")
        return train, val, 10, 1, train.tensors[0].shape[-1]
    train, val = image_folder(cfg, "train"), image_folder(cfg, "val")
    if train.classes != val.classes:
        raise ValueError(f"`data`: train has {len(train.classes)} classes and val {len(val.classes)}; they must match")
    return train, val, len(train.classes), 3, cfg.image_size


def require_timm(cfg: VisionTrainConfig) -> None:
    if not cfg.uses_timm():
        return
    try:
        import timm  # noqa: F401
    except Exception as e:  # noqa: BLE001 - a torchvision that does not match torch fails with RuntimeError
        raise ValueError("this config needs timm and torchvision (dataset=imagefolder, mixup/cutmix or repeated_aug):"
                         f" pip install 'hgrn2[vision]' ({type(e).__name__}: {e})") from None


def train_sampler(cfg: VisionTrainConfig, dataset, d: D.Dist):
    if cfg.repeated_aug:
        from timm.data.distributed_sampler import RepeatAugSampler

        return RepeatAugSampler(dataset, num_replicas=d.world, rank=d.rank, shuffle=True)
    return torch.utils.data.DistributedSampler(dataset, d.world, d.rank, shuffle=True, seed=cfg.seed, drop_last=True)


# --- training -----------------------------------------------------------------------------------------------------


def build_model(cfg: VisionTrainConfig, num_classes: int, in_channels: int, image_size: int):
    return HGRN2ForImageClassification(preset(cfg.model, num_classes=num_classes, in_channels=in_channels,
                                              image_size=image_size, **cfg.model_args))


def soft_target_cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross entropy against class probabilities [B, classes] (mixed and smoothed labels)."""
    return torch.sum(-target * F.log_softmax(logits.float(), dim=-1), dim=-1).mean()


class VisionTask(Task):
    """Image classification as a task of the training engine: the sampler's batches (Mixup/CutMix on the
    device), soft-target or label-smoothed cross entropy, top-1/top-5 on the validation split (and the EMA's)."""

    def __init__(self, cfg: VisionTrainConfig, d: D.Dist, model, train_set, val_set, classes: int):
        self.cfg, self.d, self.model, self.val_set = cfg, d, model, val_set
        self.local_batch = cfg.batch_size // d.world
        self.ema = None
        if cfg.ema_decay:
            from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

            self.ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(cfg.ema_decay))
        self.mixup = None
        if cfg.mixup > 0 or cfg.cutmix > 0:
            from timm.data import Mixup

            self.mixup = Mixup(mixup_alpha=cfg.mixup, cutmix_alpha=cfg.cutmix, label_smoothing=cfg.smoothing,
                               num_classes=classes)
        self.sampler = train_sampler(cfg, train_set, d)
        self.loader = torch.utils.data.DataLoader(train_set, batch_size=self.local_batch, sampler=self.sampler,
                                                  num_workers=cfg.num_workers, pin_memory=d.device.type == "cuda",
                                                  drop_last=True, persistent_workers=cfg.num_workers > 0)
        n = len(self.loader)
        self.steps_per_epoch = min(n, cfg.max_steps_per_epoch) if cfg.max_steps_per_epoch else n
        self.best = 0.0  # the best top-1 of the evaluations over the whole split
        self.epoch = 0  # the epoch in training, whose evaluation follows

    def batches(self, epoch: int, start: int):
        self.epoch = epoch
        self.sampler.set_epoch(epoch)
        dev = self.d.device
        for k, (x, y) in enumerate(self.loader):
            if k == self.steps_per_epoch:
                break
            x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
            yield self.mixup(x, y) if self.mixup is not None else (x, y)  # soft targets, label smoothing included

    def loss(self, model, x, target) -> torch.Tensor:
        logits = model(x).float()
        if self.mixup is not None:
            return soft_target_cross_entropy(logits, target)
        return F.cross_entropy(logits, target, label_smoothing=self.cfg.smoothing)

    def after_step(self) -> None:
        if self.ema is not None:
            self.ema.update_parameters(self.model)

    def evaluate(self, model) -> dict:
        bf16 = self.cfg.bf16(self.d.device)
        limit = 0 if self.epoch + 1 >= self.cfg.epochs else self.cfg.eval_examples  # the last epoch: every image
        metrics = evaluate(self.model, self.val_set, self.local_batch, self.d, bf16, limit)
        if self.ema is not None:
            ema = evaluate(self.ema.module, self.val_set, self.local_batch, self.d, bf16, limit)
            metrics |= {f"ema_{k}": v for k, v in ema.items()}
        return metrics

    def entry(self, end: EpochEnd) -> dict:
        m = end.metrics
        if m["val_images"] == len(self.val_set):  # a part of the split is not compared with the whole
            self.best = max(self.best, m["acc1"], m.get("ema_acc1", 0.0))
        return {"step": end.step, "epoch": end.epoch + 1, "train_loss": end.sums[0] / end.sums[1], "lr": end.lr,
                "train_images_per_s": end.steps * self.cfg.batch_size / end.train_time, **m}

    def line(self, entry: dict) -> str:
        ema = f", EMA top-1 {entry['ema_acc1']:.2f}%" if "ema_acc1" in entry else ""
        return (f"epoch {entry['epoch']}/{self.cfg.epochs}: train loss {entry['train_loss']:.4f}, val top-1 "
                f"{entry['acc1']:.2f}% top-5 {entry['acc5']:.2f}%{ema}, {entry['train_images_per_s']:.0f} images/s")

    def state(self) -> dict:
        return {"ema": self.ema.state_dict() if self.ema else None, "best_acc1": self.best,
                "config": guard.absolute(dataclasses.asdict(self.cfg), ("data",)),
                "model_config": self.model.config.to_dict()}

    def load_state(self, state: dict) -> None:
        now = dataclasses.asdict(self.cfg)
        notes = guard.check_resume(f"`out_dir`: {self.cfg.out_dir}", state["config"], now, paths=("data",),
                                   fixed=[k for k in now if k not in RESUME_FREE],
                                   extendable=("epochs", "eval_examples"))
        if self.d.main and self.cfg.epochs > state["epoch"]:  # else `train` says there is nothing to train
            for note in notes:
                print(note + (" (the cosine schedule is over the new number of epochs)" if note.startswith("epochs ")
                              else ""))
        if self.ema is not None:
            if state.get("ema") is None:
                raise ValueError("`ema_decay`: the checkpoint has no EMA weights; resume with ema_decay=0")
            self.ema.load_state_dict(state["ema"])
        self.best = state["best_acc1"]


class VisionTrainer:
    def __init__(self, cfg: VisionTrainConfig, d: D.Dist | None = None):
        """Everything that can be wrong with the input is checked here, before the first step; the run folder is
        locked and the newest checkpoint loaded."""
        self.cfg, self.d = cfg, d or D.init(cfg.device)
        require_timm(cfg)
        if cfg.batch_size % self.d.world:
            raise ValueError(f"`batch_size`: {cfg.batch_size} is not a multiple of the world size {self.d.world}")
        train_set, self.val_set, classes, channels, size = datasets(cfg)
        if len(train_set) < cfg.batch_size:
            raise ValueError(f"`batch_size`: {cfg.batch_size} exceeds the {len(train_set)} training images")
        torch.manual_seed(cfg.seed)  # identical initial weights on every rank
        model = build_model(cfg, classes, channels, size).to(self.d.device)
        self.n_params = num_parameters(model)
        self.task = VisionTask(cfg, self.d, model, train_set, self.val_set, classes)
        self.ema = self.task.ema
        optimizer = build_optimizer(model, "adamw", cfg.peak_lr(), cfg.betas, cfg.eps, cfg.weight_decay)
        self.engine = Engine(self.task, optimizer, lambda step, epoch: epoch_lr(cfg, epoch), d=self.d,
                             bf16=cfg.bf16(self.d.device), clip=cfg.clip_grad, cuda_graph=cfg.cuda_graph,
                             checkpoint_dir=os.path.join(cfg.out_dir, "checkpoints"), run_dir=cfg.out_dir,
                             keep_last=cfg.keep_last, name_by="epoch", log_every=cfg.log_every,
                             progress=cfg.progress, name=cfg.out_dir)
        self.model = self.engine.wrapped
        if not self.engine.start():
            torch.manual_seed(cfg.seed + 1 + self.d.rank)  # per-rank augmentation streams
            np.random.seed(cfg.seed + 1 + self.d.rank)
        if self.d.main:
            os.makedirs(cfg.out_dir, exist_ok=True)
            write_json(os.path.join(cfg.out_dir, "config.json"), dataclasses.asdict(cfg))
        self.env = environment(self.d.device, self.d.world)

    def train(self) -> dict:
        """Train to `epochs`; returns the last epoch's result ({} when the run has nothing left to train). The run
        directory is unlocked when it returns or raises."""
        cfg, d = self.cfg, self.d
        if self.engine.epoch >= cfg.epochs:
            self.engine.close()
            if d.main:
                print(f"the run in {cfg.out_dir} has trained {self.engine.epoch} epoch(s), epochs={cfg.epochs}: "
                      "nothing to train")
            return {}
        if d.main:
            print(f"hgrn2 vision: {cfg.model}, {self.n_params / 1e6:.2f}M parameters; {len(self.task.loader.dataset)}"
                  f" training images, {d.world} rank(s) × {self.task.local_batch} = {cfg.batch_size} per step, "
                  f"{self.task.steps_per_epoch} steps per epoch; epochs {self.engine.epoch} -> {cfg.epochs}",
                  flush=True)
        result = {}

        def write(entry: dict) -> None:
            nonlocal result
            result = {"model": cfg.model, "parameters": self.n_params, "epochs_done": self.engine.epoch,
                      "epochs": cfg.epochs, "steps": self.engine.step, "best_acc1": self.task.best, **entry,
                      "environment": self.env}
            if d.main:
                write_json(os.path.join(cfg.out_dir, "results.json"), result)

        self.engine.fit(cfg.epochs, on_epoch=write)
        return result


@torch.no_grad()
def evaluate(model, dataset, batch_size: int, d: D.Dist, bf16: bool = False, limit: int = 0) -> dict:
    """Top-1 / top-5 accuracy (%) and mean loss over the split's first `limit` images (0: the whole split); rank r
    takes images r, r + world, ..."""
    n = min(limit, len(dataset)) if limit else len(dataset)
    part = torch.utils.data.Subset(dataset, range(d.rank, n, d.world))
    loader = torch.utils.data.DataLoader(part, batch_size=batch_size, shuffle=False)
    was_training = model.training
    model.eval()
    sums = torch.zeros(4, dtype=torch.float64, device=d.device)  # loss, top-1, top-5, count
    for x, y in loader:
        x, y = x.to(d.device), y.to(d.device)
        with torch.autocast(d.device.type, torch.bfloat16, enabled=bf16):
            logits = model(x).float()
        top = logits.topk(min(5, logits.shape[-1]), -1).indices
        sums += torch.stack([F.cross_entropy(logits, y, reduction="sum"), (top[:, 0] == y).sum(),
                             (top == y[:, None]).any(-1).sum(), torch.tensor(len(y), device=d.device)]).double()
    model.train(was_training)
    loss, top1, top5, n = D.total(sums, d).tolist()
    return {"val_loss": loss / n, "acc1": 100 * top1 / n, "acc5": 100 * top5 / n, "val_images": int(n)}


# --- command line -------------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    train = sub.add_parser("train", help="train (works under torchrun)")
    train.add_argument("--config", default=None,
                       help=f"preset ({', '.join(config.preset_names(PRESET_DIR))}) or YAML file")
    train.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE", action="extend",
                       help="override config keys, e.g. data=/data/imagenet batch_size=256 model_args.num_layers=6")
    train.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    add_record_argument(train)
    ev = sub.add_parser("eval", help="evaluate a run's newest checkpoint on the validation split")
    ev.add_argument("--run", required=True, help="the out_dir of a `hgrn2 vision train` run")
    ev.add_argument("--data", default=None, help="data directory (default: the run's)")
    ev.add_argument("--ema", action="store_true", help="evaluate the EMA weights")
    ev.add_argument("--batch-size", type=int, default=256)
    rep = sub.add_parser("report", help="a run's learning curve as a table and a plot; --record for BENCHMARKS.md")
    rep.add_argument("--run", required=True, help="the out_dir of a `hgrn2 vision train` run")
    add_record_argument(rep)


def run(args: argparse.Namespace) -> int:
    return {"train": run_train, "eval": run_eval, "report": run_report}[args.action](args)


def run_train(args: argparse.Namespace) -> int:
    try:  # bad input is reported in one line, before any training starts
        cfg = make_config(args.config, args.set)
    except (ValueError, FileNotFoundError) as e:
        print(f"hgrn2 vision train: error: {e}", file=sys.stderr)
        return 2
    if args.print_config:
        print(yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False), end="")
        return 0
    status = guard.train_command("hgrn2 vision train", lambda: VisionTrainer(cfg, D.init(cfg.device)))
    if status == 0 and D.main_process() and args.record is not None:
        return run_report(argparse.Namespace(**{**vars(args), "run": cfg.out_dir}))
    return status


def run_report(args: argparse.Namespace) -> int:
    """Print the run's epochs, plot them (`<run>/curves.png`) and, with --record, write them as a benchmark record
    in the environment the run recorded where it trained."""
    try:
        result, curve = read_run(args.run)
    except (ValueError, FileNotFoundError) as e:
        print(f"hgrn2 vision report: error: {e}", file=sys.stderr)
        return 2
    print(format_table(curve, [c for c in VISION_CURVE_COLUMNS if any(c[1] in r for r in curve)]))
    print(f"{result['model']}, {result['parameters'] / 1e6:.2f}M parameters: top-1 {result['acc1']:.2f}% after "
          f"{result['epochs_done']} of {result['epochs']} epochs (best {result['best_acc1']:.2f}%)")
    figure = plot_curve(curve, os.path.join(args.run, "curves.png"), result["model"])
    if args.record is not None:
        try:
            env = runs_environment([result.get("environment")], args.run)
        except ValueError as e:
            print(f"hgrn2 vision report: error: {e}", file=sys.stderr)
            return 2
        with open(os.path.join(args.run, "config.json")) as f:
            cfg = json.load(f)
        name = "vision_fashion_mnist" if cfg["dataset"] == "fashion_mnist" else f"vision_{cfg['model']}"
        settings = {k: v for k, v in cfg.items() if k not in ("data", "out_dir", "progress", "device", "log_every")}
        path = write_result(args.record or None, name, env, curve, command_of(args), figure=figure,
                            **{k: result[k] for k in ("model", "parameters", "epochs_done", "epochs", "steps",
                                                      "best_acc1", "acc1", "acc5", "val_images")}, config=settings)
        print(f"wrote record {path}")
    return 0


def read_run(run: str) -> tuple[dict, list[dict]]:
    """The run's results.json and its learning curve: one row per epoch (the validation records of its log)."""
    path = os.path.join(run, "results.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"`--run`: no finished epoch in {run} (no results.json)")
    with open(path) as f:
        result = json.load(f)
    curve = [{k: v for k, v in r.items() if k not in ("kind", "time")}
             for r in read_log(os.path.join(run, "log.jsonl")) if r["kind"] == "val"]
    return result, curve


def plot_curve(curve: list[dict], path: str, title: str) -> str | None:
    """Validation top-1 and the training and validation loss per epoch; None without matplotlib."""
    plt = pyplot()
    if plt is None:
        return None
    epochs = [r["epoch"] for r in curve]
    fig, (acc, loss) = plt.subplots(1, 2, figsize=(8, 3.2))
    acc.plot(epochs, [r["acc1"] for r in curve], marker="o", label="top-1")
    if all("ema_acc1" in r for r in curve):
        acc.plot(epochs, [r["ema_acc1"] for r in curve], marker=".", label="EMA top-1")
    acc.set(xlabel="epoch", ylabel="validation accuracy (%)", title=title)
    loss.plot(epochs, [r["train_loss"] for r in curve], marker="o", label="train")
    loss.plot(epochs, [r["val_loss"] for r in curve], marker="o", label="validation")
    loss.set(xlabel="epoch", ylabel="loss")
    for ax in (acc, loss):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    tmp = path + ".tmp.png"
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    os.replace(tmp, path)
    return path


def run_eval(args: argparse.Namespace) -> int:
    try:
        state = sharded.read_latest(os.path.join(args.run, "checkpoints"))
        if state is None:
            raise FileNotFoundError(f"`--run`: no checkpoint in {args.run}/checkpoints")
        if not isinstance(state, dict) or not {"config", "model_config", "model", "ema", "epoch"} <= set(state):
            raise ValueError(f"`--run`: {args.run} is not a `hgrn2 vision train` run (its checkpoints were written "
                             f"by another command)")
        if args.ema and state["ema"] is None:
            raise ValueError("`--ema`: the run kept no EMA weights (ema_decay=0)")
        cfg = VisionTrainConfig(**{**state["config"], **({"data": args.data} if args.data else {})})
        if cfg.dataset == "imagefolder":
            require_timm(cfg)
        val = fashion_mnist(cfg.data, "val") if cfg.dataset == "fashion_mnist" else image_folder(cfg, "val")
        d = D.init(cfg.device)
    except (ValueError, FileNotFoundError, guard.RunError) as e:
        print(f"hgrn2 vision eval: error: {e}", file=sys.stderr)
        return 2
    model = HGRN2ForImageClassification(VisionConfig(**state["model_config"]))
    weights = state["model"]
    if args.ema:
        weights = {k[len("module."):]: v for k, v in state["ema"].items() if k.startswith("module.")}
    model.load_state_dict(weights)
    model.to(d.device)
    metrics = evaluate(model, val, args.batch_size, d, cfg.bf16(d.device))
    result = {"run": args.run, "epoch": state["epoch"], "ema": args.ema, **metrics}
    if d.main:
        write_json(os.path.join(args.run, "eval_ema.json" if args.ema else "eval.json"), result)
        print(f"{args.run} (epoch {state['epoch']}{', EMA' if args.ema else ''}): top-1 {metrics['acc1']:.2f}%, "
              f"top-5 {metrics['acc5']:.2f}%, loss {metrics['val_loss']:.4f} on {metrics['val_images']} images")
    del model  # before the process group goes (D.shutdown)
    D.shutdown()
    return 0
