"""Long Range Arena runs on the training engine: a task's preset (the authors' per-task settings, per-model and
ablation variants, command-line overrides), its data on the device, the task (`LRATask`) and `train_run`, which
trains one (task, model, variant, seed) run in its folder and resumes it exactly. The command that trains several,
side by side or under torchrun, and reports them is `hgrn2 lra` (`hgrn2.experiments.lra`); the options of one run
are `add_run_arguments` here, which the LRA benchmarks parse too."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import yaml

from ..bench.common import (
    LRA_SEED,
    environment,
)
from ..data.files import write_json
from ..data.lra import images
from ..data.lra import tasks as lra_tasks
from ..data.lra.readers import Split
from ..models.lra import MIXERS, LRAClassifier, LRAModelConfig, num_parameters
from . import distributed, guard
from .engine import Engine, EpochEnd, Task
from .optim import lr_at

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs" / "lra"
PAPER_ORDER = ("listops", "text", "retrieval", "image", "pathfinder", "pathx")
# HGRN2 paper, Table "Results on LRA" (test accuracy, %)
PAPER = {"HGRN1 (paper)": (59.95, 88.14, 94.23, 88.69, 92.92, 97.50),
         "HGRN2 (paper)": (60.52, 88.97, 95.07, 89.33, 93.95, 98.12)}
PRECISIONS = ("fp32", "bf16")
TRAIN_KEYS = ("epochs", "batch_size", "lr", "warmup_steps", "schedule_steps", "weight_decay", "precision",
              "grad_clip")
# the seeds a run resumes with (initialisation and data order; generated data), at their command-line defaults
SEED_DEFAULTS = {"seed": LRA_SEED, "data_seed": 0}
# the name `--variants` gives the preset itself, with none of its `variants` applied
PRESET = "preset"
# a preset's `data` section and its defaults (LRA's image task: grey, unaugmented); only the image task changes them
DATA_DEFAULTS = {"grayscale": True, "augment": False}

def load_preset(task: str, config_dir: str | Path = CONFIG_DIR) -> dict:
    path = Path(config_dir) / f"{task}.yaml"
    if not path.is_file():
        raise ValueError(f"`--config`: no preset {path} for task {task!r}")
    with open(path) as f:
        return yaml.safe_load(f)


@dataclasses.dataclass
class DeviceSplit:
    """A split held on the training device, loaded once, so that each batch is gathered there: a step costs no host
    copy, pinning or synchronisation. Tokens in the narrowest integer type that holds them (the model reads them as
    int64), pixels uint8; `host_lengths`: the lengths on the host as well, where a batch trimmed to its longest
    sequence takes its shape."""

    inputs: torch.Tensor
    lengths: torch.Tensor
    labels: torch.Tensor
    host_lengths: np.ndarray

    @classmethod
    def of(cls, split: Split, device: torch.device) -> DeviceSplit:
        x = split.inputs.astype(_held_dtype(split.inputs), copy=False)
        # a copy (memory-mapped splits are read-only, which torch.from_numpy warns about)
        return cls(*(torch.tensor(a, device=device) for a in (x, split.lengths, split.labels)),
                   host_lengths=split.lengths)

    @staticmethod
    def nbytes(split: Split) -> int:
        """What `of` holds on the device for `split`."""
        x = split.inputs
        return x.size * np.dtype(_held_dtype(x)).itemsize + split.lengths.nbytes + split.labels.nbytes

    def __len__(self) -> int:
        return len(self.host_lengths)


def _held_dtype(x: np.ndarray) -> type:
    """The dtype a split's inputs take on the device: pixels stay uint8, tokens the narrowest of int16, int32 and
    int64 that holds every value."""
    if x.dtype == np.uint8:
        return np.uint8
    lo, hi = (x.min(), x.max()) if x.size else (0, 0)
    return next(t for t in (np.int16, np.int32, np.int64) if np.iinfo(t).min <= lo and hi <= np.iinfo(t).max)


@dataclasses.dataclass
class Indices:
    """Example indices on the host (a trimmed batch's length is read from them) and on the device (the gather),
    copied there once per epoch or evaluation rather than once per batch."""

    host: np.ndarray
    device: torch.Tensor

    @classmethod
    def of(cls, idx: np.ndarray, device: torch.device) -> Indices:
        return cls(idx, torch.from_numpy(idx).to(device))

    def __getitem__(self, part: slice) -> Indices:
        return Indices(self.host[part], self.device[part])


def batch_tensors(split: DeviceSplit, idx: Indices, pixels: tuple[float, float] | None,
                  crop_flip: torch.Tensor | None = None, full_length: bool = False):
    """(inputs, mask or None, valid or None, labels) for the examples `idx`, trimmed to the batch's longest sequence,
    gathered on the split's device.

    `pixels`: a pixel task's grey (mean, std) (`TaskInfo.grey_norm`), None for tokens. Pixels become floats
    [B, T, C] (`images.to_float`), first cropped and flipped by crop_flip[idx] where given (`images.crop_flip_params`
    of the split, on the device); token pairs (retrieval) become [2, B, T]. `full_length`: tokens keep the split's
    whole length (one shape for every batch, for a CUDA graph) and `valid` marks the positions before the batch's
    longest sequence (`LRAClassifier.forward`)."""
    at = idx.device
    labels = split.labels[at]
    if pixels is not None:
        x = split.inputs[at]
        if crop_flip is not None:
            x = images.random_crop_flip(x, crop_flip[at])
        return images.to_float(x, pixels), None, None, labels
    lengths = split.lengths[at]
    T = split.inputs.shape[-1] if full_length else int(split.host_lengths[idx.host].max())
    x = split.inputs[..., :T][at].long()
    positions = torch.arange(T, device=x.device)
    mask = positions < lengths[..., None]
    valid = (positions < lengths.max()).expand(mask.shape) if full_length else None
    if x.ndim == 3:  # pairs [B, 2, T] -> [2, B, T]
        x, mask = x.transpose(0, 1), mask.transpose(0, 1)
        valid = None if valid is None else valid.transpose(0, 1)
    return x, mask, valid, labels


def _sums(loss_sum: torch.Tensor, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """[loss sum, correct, examples] in float64 on the device, made without a host-to-device copy."""
    return torch.stack([loss_sum.double(), (logits.argmax(-1) == y).sum().double(),
                        loss_sum.new_full((), len(y), dtype=torch.float64)])


@torch.no_grad()
def evaluate(model, split: DeviceSplit, pixels: tuple[float, float] | None, batch_size: int, d: distributed.Dist,
             amp: bool) -> dict:
    """Accuracy and mean loss over a split, sharded over ranks."""
    model.eval()
    idx = Indices.of(np.arange(d.rank, len(split), d.world), d.device)
    stats = torch.zeros(3, dtype=torch.float64, device=d.device)
    for k in range(0, len(idx.host), batch_size):
        x, mask, _, y = batch_tensors(split, idx[k:k + batch_size], pixels)
        with torch.autocast(d.device.type, torch.bfloat16, enabled=amp):
            logits = model(x, mask).float()
        stats += _sums(F.cross_entropy(logits, y, reduction="sum"), logits, y)
    model.train()
    loss, correct, n = distributed.total(stats, d).tolist()
    return {"acc": correct / max(n, 1), "loss": loss / max(n, 1)}


def build(task: str, mixer: str, args: argparse.Namespace, variant: str | None = None
          ) -> tuple[LRAModelConfig, dict, dict]:
    """The model config, training settings and data options of (task, mixer): the preset, its mixer's `per_model`
    section, the `variant` (an entry of the preset's `variants`; None: none), then command-line overrides."""
    info = lra_tasks.check_task(task)
    preset = load_preset(task, args.config)
    own = _per_model(preset, task).get(settings_of(mixer, args), {})
    var = _variant(preset, task, variant)
    model_opts = {**preset["model"], **own.get("model", {}), **var.get("model", {})}
    if mixer == "attention":
        model_opts["positional"] = True  # attention alone is blind to order (the HGRN presets' "id" encoder)
    model_opts.update(args.model_options or {})
    data = _data_options(task, preset, own, args)
    if task == "image":
        channels = 1 if data["grayscale"] else 3
        if model_opts.get("in_channels", channels) != channels:
            raise ValueError(f"`--model-options`: in_channels {model_opts['in_channels']}, but the image task has "
                             f"{channels} (`--grayscale` / `--no-grayscale`)")
        model_opts["in_channels"] = channels
    train = {"grad_clip": 0.0, **preset["train"], **own.get("train", {}), **var.get("train", {})}
    for key in TRAIN_KEYS:
        if getattr(args, key, None) is not None:
            train[key] = getattr(args, key)
    for key, low in (("epochs", 1), ("batch_size", 1), ("lr", None), ("warmup_steps", 0), ("schedule_steps", 1),
                     ("weight_decay", 0), ("grad_clip", 0)):
        check_at_least(key, train.get(key), low)
    if train.get("precision") not in PRECISIONS:
        raise ValueError(f"`--precision`: expected one of {PRECISIONS}, got {train.get('precision')!r}")
    unknown = sorted(set(model_opts) - set(LRAModelConfig.__dataclass_fields__))
    if unknown:
        raise ValueError(f"`--model-options`: unknown keys {unknown}; see hgrn2.models.lra.LRAModelConfig")
    try:
        cfg = LRAModelConfig(mixer=mixer, num_classes=info.num_classes, vocab_size=info.vocab_size,
                             max_len=info.max_len, dual=info.dual, **model_opts)
    except ValueError as e:
        settings = settings_of(mixer, args)
        if settings == mixer:
            raise
        raise ValueError(f"`--settings-of`: {mixer} with {settings}'s {task} settings: {e} (--model-options "
                         f"overrides a setting)") from None
    return cfg, train, data


def _data_options(task: str, preset: dict, own: dict, args: argparse.Namespace) -> dict:
    """{grayscale, augment}: the defaults, the preset's `data`, its mixer's, then --[no-]grayscale / --[no-]augment."""
    data = {**DATA_DEFAULTS, **(preset.get("data") or {}), **own.get("data", {})}
    bad = {k: v for k, v in data.items() if k not in DATA_DEFAULTS or not isinstance(v, bool)}
    if bad:
        raise ValueError(f"`--config`: {task}.yaml data: expected true/false for {sorted(DATA_DEFAULTS)}, got {bad}")
    for key in DATA_DEFAULTS:
        if getattr(args, key, None) is not None:
            data[key] = getattr(args, key)
    if task != "image" and data != DATA_DEFAULTS:
        key = "grayscale" if not data["grayscale"] else "augment"
        flag = {"grayscale": "--no-grayscale", "augment": "--augment"}[key]
        where = f"`{flag}`" if getattr(args, key, None) is not None else f"`--config`: {task}.yaml data.{key}"
        raise ValueError(f"{where}: only the image task (CIFAR-10) has colour and augmentation, not {task!r}")
    return data


def settings_of(mixer: str, args: argparse.Namespace) -> str:
    """Whose preset settings `mixer` trains with: its own, or --settings-of's for every model."""
    return getattr(args, "settings_of", None) or mixer


def run_name(task: str, mixer: str, settings: str, variant: str | None = None, seed: int = SEED_DEFAULTS["seed"]
             ) -> str:
    """TASK-MODEL[-as-SETTINGS][+VARIANT][-seedN]: the seed only where it is not the authors' (older runs keep
    their folders)."""
    name = f"{task}-{mixer}" if settings == mixer else f"{task}-{mixer}-as-{settings}"
    name = name if variant is None else f"{name}+{variant}"
    return name if seed == SEED_DEFAULTS["seed"] else f"{name}-seed{seed}"


def _variant(preset: dict, task: str, variant: str | None) -> dict:
    """The preset's `variants` entry `variant` ({} for None): {"note": str, "model": {...}, "train": {...}}, and
    `prefix: true` where the variant only stops earlier (a run of it is the preset's run up to its epochs)."""
    variants = preset.get("variants") or {}
    for name, entry in variants.items():
        if name == PRESET or not isinstance(entry, dict) or set(entry) - {"note", "model", "train", "prefix"}:
            raise ValueError(f"`--config`: {task}.yaml variants.{name}: expected a name other than {PRESET!r} "
                             f"holding 'note', 'model', 'train' and/or 'prefix', got {entry!r}")
        if entry.get("prefix") and (entry.get("model") or set(entry.get("train") or {}) != {"epochs"}):
            raise ValueError(f"`--config`: {task}.yaml variants.{name}: a prefix variant changes the epochs only, "
                             f"got {entry!r}")
    if variant is None:
        return {}
    if variant not in variants:
        raise ValueError(f"`--variants`: {task}.yaml has no variant {variant!r}; its variants: "
                         f"{', '.join([PRESET, *variants])}")
    return variants[variant]


def _per_model(preset: dict, task: str) -> dict:
    """The preset's `per_model` section: {mixer: {"model": {...}, "train": {...}}} overriding the shared settings."""
    per_model = preset.get("per_model") or {}
    for mixer, own in per_model.items():
        if mixer not in MIXERS or not isinstance(own, dict) or set(own) - {"model", "train", "data"}:
            raise ValueError(f"`--config`: {task}.yaml per_model.{mixer}: expected a mixer of {MIXERS} holding "
                             f"'model', 'train' and/or 'data', got {own!r}")
    return per_model


def _started_with(run_dir: Path, state: dict) -> dict | None:
    """The settings the run in `run_dir` started with: its checkpoint's or, where checkpoints did not keep them yet,
    its result.json's; keys written before they existed read as what their absence meant (no clipping, grey
    unaugmented images, the config's defaults). None where neither holds them."""
    saved = state.get("settings")
    if saved is None:
        path = run_dir / "result.json"
        if not path.is_file():
            return None
        saved = json.loads(path.read_text())
    return _resume_settings(saved["config"], saved["train"], saved.get("data", {}), saved.get("run"),
                            saved.get("fingerprint"))


def _resume_settings(config: dict, train: dict, data: dict, run: dict | None = None,
                     fingerprint: dict | None = None) -> dict:
    """What a resumed run must share with its start: every setting but the epochs, absent keys at their defaults;
    `run`: the seeds and the data set drawn, `fingerprint`: {"data": `lra_tasks.fingerprint` of the data loaded}
    (each None where a checkpoint from before they were kept says nothing)."""
    defaults = {f.name: f.default for f in dataclasses.fields(LRAModelConfig) if f.default is not dataclasses.MISSING}
    out = {"config": {**defaults, **config},
           "train": {"grad_clip": 0.0, **{k: v for k, v in train.items() if k != "epochs"}},
           "data": {**DATA_DEFAULTS, **data}}
    if run is not None:
        out["run"] = run
    if fingerprint is not None:
        out["fingerprint"] = fingerprint
    return out


def _run_settings(args: argparse.Namespace, task: str) -> dict:
    """The seeds and the data set a run trains on; `--data` as its resolved path (a trailing slash or a symlink
    names the same folder)."""
    return {"seed": args.seed, "data_seed": args.data_seed, "level": args.level if task in ("pathfinder", "pathx")
            else None, "examples": args.images if task in ("pathfinder", "pathx") else args.examples,
            "data": os.path.realpath(args.data) if args.data else None}


def _check_same_settings(run_dir: Path, saved: dict | None, now: dict) -> None:
    """A run resumes only with the settings it started with (more epochs allowed): else its curve mixes two runs."""
    if saved is None:  # neither its checkpoint nor a result.json says
        return
    changed = {f"{part}.{k}": (saved[part].get(k), v) for part in now if part in saved for k, v in now[part].items()
               if saved[part].get(k) != v}
    if list(changed) == ["fingerprint.data"]:
        raise ValueError(f"`--data-dir` / `--data`: the data loaded now (fingerprint {changed['fingerprint.data'][1]}) "
                         f"are not those {run_dir} started on ({changed['fingerprint.data'][0]}): give it those files "
                         "(generated data: copy the data folder of the first machine), or start over")
    if changed:
        raise ValueError(f"`--out`: {run_dir} holds a run with other settings {changed} (saved, now); pass its "
                         f"settings to continue it, give another --out, or delete {run_dir} to start over")


def build_lra_optimizer(model: torch.nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW (torch's defaults) decaying every parameter, norms and biases included: the LRA code passes all of
    them in one group (its `_optim` overrides are set only by S4 layers)."""
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)


def train_run(task: str, mixer: str, args: argparse.Namespace, d: distributed.Dist, variant: str | None = None
              ) -> dict:
    """Train one (task, mixer[, variant]) run to its epochs (or a time / step limit) and return its result record;
    its folder is locked meanwhile (`guard.RunLock`)."""
    run_dir = Path(args.out) / run_name(task, mixer, settings_of(mixer, args), variant, args.seed)
    lock = guard.RunLock(str(run_dir), d)
    try:
        return _train_run(task, mixer, args, d, run_dir, variant)
    finally:
        lock.release()


class LRATask(Task):
    """An LRA task on the training engine: batches of a per-epoch permutation (seeded by the seed and the epoch,
    so that any iteration can be the first), cross entropy, accuracy on the validation and test splits; the
    checkpoints also keep the run's settings. `full_length`: token batches keep the split's whole length
    (`batch_tensors`), so that every training step has one shape (a CUDA graph)."""

    def __init__(self, model, data: dict, pixels, batch: int, d: distributed.Dist, seed: int, augment: bool,
                 settings: dict, epochs: int, amp: bool, run_dir: Path, full_length: bool = False):
        self.model, self.data, self.pixels, self.batch, self.d = model, data, pixels, batch, d
        self.seed, self.augment, self.settings, self.epochs, self.amp = seed, augment, settings, epochs, amp
        self.run_dir, self.full_length = run_dir, full_length
        self.per_rank = batch // d.world
        self.steps_per_epoch = len(data["train"]) // batch

    def batches(self, epoch: int, start: int):
        split, b, r = self.data["train"], self.batch, self.d.rank
        order = Indices.of(np.random.default_rng([self.seed, epoch]).permutation(len(split)), self.d.device)
        crop_flip = (torch.from_numpy(images.crop_flip_params(len(split), self.seed, epoch)).to(self.d.device)
                     if self.augment else None)
        for it in range(start, self.steps_per_epoch):
            idx = order[it * b + r * self.per_rank: it * b + (r + 1) * self.per_rank]
            yield batch_tensors(split, idx, self.pixels, crop_flip, self.full_length)

    def loss(self, model, x, mask, valid, y):
        logits = model(x, mask, valid).float()
        loss = F.cross_entropy(logits, y)
        return loss, _sums(loss.detach().double() * len(y), logits, y)

    def evaluate(self, model) -> dict:
        # the training batch, as the LRA code's loaders: where the scans read padding, it sets how much
        val = evaluate(model, self.data["val"], self.pixels, self.per_rank, self.d, self.amp)
        test = evaluate(model, self.data["test"], self.pixels, self.per_rank, self.d, self.amp)
        return {"val_acc": val["acc"], "val_loss": val["loss"], "test_acc": test["acc"], "test_loss": test["loss"]}

    def entry(self, end: EpochEnd) -> dict:
        loss, correct, n = end.sums
        return {"epoch": end.epoch + 1, "step": end.step, "train_loss": loss / n, "train_acc": correct / n,
                **end.metrics, "epoch_time": end.epoch_time, "complete": end.whole}

    def score(self, entry: dict) -> float:
        return entry["val_acc"]  # LRA reports the test accuracy at the best validation epoch

    def running(self, sums: list[float], step: int, steps_per_s: float) -> dict:
        return {"epoch_loss": sums[0] / sums[2], "epoch_acc": sums[1] / sums[2]}

    def state(self) -> dict:
        return {"settings": self.settings, "epochs": self.epochs}

    def line(self, entry: dict) -> str:
        return (f"{self.run_dir.name} epoch {entry['epoch']}: train loss {entry['train_loss']:.4f} acc "
                f"{entry['train_acc']:.4f}, val {entry['val_acc']:.4f} test {entry['test_acc']:.4f} "
                f"({entry['epoch_time']:.1f}s)")

    def load_state(self, state: dict) -> None:
        _check_same_settings(self.run_dir, _started_with(self.run_dir, state), self.settings)
        # a run already past the new epochs says in one line that it has nothing to train
        if self.d.main and state.get("epochs", self.epochs) != self.epochs and state["epoch"] < self.epochs:
            print(f"{self.run_dir.name}: --epochs {state['epochs']} -> {self.epochs}: the run continues with the new "
                  "value")


def load_options(task: str, args: argparse.Namespace, data_opts: dict) -> dict:
    """The keyword arguments of `lra_tasks.load` for a run of `task`."""
    examples = args.images if task in ("pathfinder", "pathx") else args.examples
    return dict(data_root=args.data, data_dir=args.data_dir, seed=args.data_seed, examples=examples,
                level=args.level, workers=args.workers, grayscale=data_opts["grayscale"])


def _train_run(task: str, mixer: str, args: argparse.Namespace, d: distributed.Dist, run_dir: Path,
               variant: str | None) -> dict:
    cfg, tr, data_opts = build(task, mixer, args, variant)
    settings = settings_of(mixer, args)
    name = run_dir.name
    pixels = lra_tasks.TASKS[task].grey_norm if cfg.vocab_size is None else None  # a pixel task's grey (mean, std)
    load = load_options(task, args, data_opts)
    if d.main:  # generated data sets are written once, by rank 0
        data = lra_tasks.load(task, **load)
    distributed.barrier(d)
    if not d.main:
        data = lra_tasks.load(task, **load)
    empty = [s for s in ("train", "val", "test") if len(data[s].labels) == 0]
    if empty:
        raise ValueError(f"`--data` / `--examples` / `--images`: task {task!r} has no {' or '.join(empty)} examples")
    batch = tr["batch_size"]
    if len(data["train"].labels) < batch:
        raise ValueError(f"`--batch-size`: {batch} exceeds the {len(data['train'].labels)} training examples")

    torch.manual_seed(args.seed)
    model = LRAClassifier(cfg).to(d.device)
    params = num_parameters(model)
    if d.world > 1 and cfg.norm == "batch" and cfg.bn_group is None and d.device.type == "cuda":
        # the authors' "synbatch" (SyncBatchNorm runs on CUDA only; CPU ranks keep their own statistics); with
        # bn_group, their plain "batch", each rank normalises its own share
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    opt = build_lra_optimizer(model, tr["lr"], tr["weight_decay"])
    amp = d.device.type == "cuda" and tr["precision"] == "bf16"
    settings_now = _resume_settings(cfg.to_dict(), tr, data_opts, _run_settings(args, task),
                                    {"data": lra_tasks.fingerprint(data)})
    try:
        on_device = {name: DeviceSplit.of(split, d.device) for name, split in data.items()}
    except torch.OutOfMemoryError:
        gib = sum(DeviceSplit.nbytes(split) for split in data.values()) / 2**30
        raise ValueError(f"`--device`: {task}'s splits take {gib:.2f} GiB on {d.device}, more than it has free "
                         "(train fewer runs at once on it, or on a device with more memory)") from None
    del data  # the host's copy: the device holds the splits now
    lra = LRATask(model, on_device, pixels, batch, d, args.seed, data_opts["augment"], settings_now, tr["epochs"],
                  amp, run_dir, full_length=args.cuda_graph and pixels is None)

    def schedule(step: int, epoch: int) -> float:
        return lr_at(step, schedule="cosine", lr=tr["lr"], warmup_steps=tr["warmup_steps"],
                     max_steps=tr["schedule_steps"])

    # the run folder is locked by train_run (before any data is generated)
    engine = Engine(lra, opt, schedule, d=d, bf16=amp, clip=tr["grad_clip"], cuda_graph=args.cuda_graph,
                    checkpoint_dir=run_dir / "ckpt",
                    run_dir=run_dir, lock=False, keep_last=2, ckpt_every=args.ckpt_every, mid_epoch=True,
                    log_every=args.log_every, progress=getattr(args, "progress", True), name=name)
    engine.start()
    t_start, first_step, env = time.time(), engine.step, environment(d.device, d.world)

    note = _variant(load_preset(task, args.config), task, variant).get("note")  # what the variant changes

    def record(stopped: str | None, write: bool = True) -> dict:
        history, best = engine.history, engine.best()
        times = [h["epoch_time"] for h in history if h.get("complete")]
        result = {"task": task, "model": mixer, "settings_of": settings, "variant": variant, "variant_note": note,
                  "seed": args.seed, "data_seed": args.data_seed, "parameters": params, "config": cfg.to_dict(),
                  "train": tr, "data": data_opts, "environment": env, "world_size": d.world, "steps": engine.step,
                  "steps_per_epoch": lra.steps_per_epoch, "epochs_done": engine.epoch, "history": history,
                  "time_per_epoch_s": float(np.mean(times)) if times else None,
                  "best_val_acc": best and best["val_acc"], "test_acc_at_best_val": best and best["test_acc"],
                  # the LRA code also scores the test split every epoch and on the last weights; the paper does
                  # not say which number it reports, so both other readings are kept
                  "test_acc_last": history[-1]["test_acc"] if history else None,
                  "test_acc_max": max((h["test_acc"] for h in history), default=None),
                  "wall_s_this_call": time.time() - t_start, "steps_this_call": engine.step - first_step,
                  "stopped": stopped}
        if d.main and write:
            write_json(run_dir / "result.json", result)
        return result

    done = engine.nothing_to_train(tr["epochs"], args.max_steps)
    if done is not None:
        engine.close()
        if d.main:
            print(f"{name}: {done}: nothing to train")
        saved = run_dir / "result.json"
        return json.loads(saved.read_text()) if saved.is_file() else record(None, write=False)
    deadline = t_start + 60 * args.max_minutes if args.max_minutes else None
    fit = engine.fit(tr["epochs"], max_steps=args.max_steps, deadline=deadline, on_epoch=lambda _: record(None))
    return record(fit.stopped)


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """The options of one run (its preset's overrides, data, limits, seeds, device), which `hgrn2 lra` adds to its
    own and the LRA benchmarks parse."""
    p.add_argument("--settings-of", choices=MIXERS,
                   help="train every model with this model's preset settings, e.g. hgrn1: HGRN2 as the paper "
                        "describes it (\"HGRN1's configuration\") rather than as the authors' launch scripts train it; "
                        "runs go to TASK-MODEL-as-SETTINGS (default: each model its own)")
    p.add_argument("--out", default="runs/lra", help="output folder (one subfolder per task and model)")
    p.add_argument("--data", help="folder holding the public data (text, retrieval, image; for listops, pathfinder "
                   "and pathx: LRA's released files instead of generated ones). CIFAR-10's python release "
                   "(image) is read with Python's pickle, which can run code: give only files you trust, or its "
                   "binary release (cifar-10-batches-bin), which is read as plain bytes")
    p.add_argument("--data-dir", help="cache for generated data (default ~/.cache/hgrn2/lra or $HGRN2_CACHE/lra)")
    p.add_argument("--config", default=str(CONFIG_DIR), help="folder of per-task preset YAML files")
    p.add_argument("--examples", type=int, help="ListOps: expressions in all splits (default LRA's 96K/2K/2K)")
    p.add_argument("--images", type=int, help="Pathfinder / Path-X: images in all splits (default LRA's 200K of "
                   "one level, split 160K/20K/20K)")
    p.add_argument("--level", default="hard", choices=["easy", "intermediate", "hard"], help="Pathfinder difficulty")
    p.add_argument("--workers", type=int, help="processes for data generation (default: all cores)")
    p.add_argument("--epochs", type=int, help="override the preset's epochs")
    p.add_argument("--batch-size", type=int, help="override the preset's (global) batch size")
    p.add_argument("--lr", type=float, help="override the preset's learning rate")
    p.add_argument("--warmup-steps", type=int, help="override the preset's warmup steps")
    p.add_argument("--schedule-steps", type=int, help="override the preset's cosine length in steps")
    p.add_argument("--weight-decay", type=float, help="override the preset's weight decay")
    p.add_argument("--grad-clip", type=float, help="override the preset's gradient clipping (global norm; 0: none)")
    p.add_argument("--precision", choices=PRECISIONS, help="override the preset's precision (bf16: autocast on CUDA; "
                   "CPU runs stay fp32)")
    p.add_argument("--grayscale", action=argparse.BooleanOptionalAction, help="image: CIFAR-10 in grey, LRA's task "
                   "(--no-grayscale: colour, 3 channels per pixel); default: the preset's")
    p.add_argument("--augment", action=argparse.BooleanOptionalAction, help="image: random crops of the "
                   "4-pixel symmetric padding and horizontal flips of the training images, seeded per epoch and "
                   "example; default: the preset's")
    p.add_argument("--model-options", type=json.loads, help='JSON overrides of the model preset, e.g. '
                   '\'{"hidden_size": 16, "num_layers": 1}\'')
    p.add_argument("--max-minutes", type=float, help="stop each run after this many minutes from its first step "
                   "(checkpointed; loading the data and the checkpoint come on top)")
    p.add_argument("--max-steps", type=int, help="stop each run at this optimiser step (checkpointed)")
    p.add_argument("--ckpt-every", type=int, default=1000, help="checkpoint every N steps as well (0: epochs only)")
    p.add_argument("--log-every", type=int, default=50, help="log the training loss every N steps")
    p.add_argument("--seed", type=int, nargs="+", default=[SEED_DEFAULTS["seed"]],
                   help="initialisation and data-order seeds, one run each (default the authors' 2222, whose runs "
                        "go to TASK-MODEL.../, another seed's to TASK-MODEL...-seedN/); --report gives the mean ± "
                        "std over seeds")
    p.add_argument("--data-seed", type=int, default=SEED_DEFAULTS["data_seed"], help="seed of the generated data sets")
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    p.add_argument("--cuda-graph", action="store_true",
                   help="replay each training step as one CUDA graph (one GPU). Token tasks then pad every training "
                        "batch to the task's whole length and mask the positions past its longest sequence, so the "
                        "model computes what it would on the shorter batch")


def check_at_least(flag: str, value, low: float | None) -> None:
    """value ≥ low (low None: value > 0), else an error naming --flag."""
    if value is not None and not (value > 0 if low is None else value >= low):
        want = "a positive number" if low is None else f"at least {low}"
        raise ValueError(f"`--{flag.replace('_', '-')}`: expected {want}, got {value}")


__all__ = ["train_run", "evaluate", "build", "build_lra_optimizer", "load_preset", "add_run_arguments"]
