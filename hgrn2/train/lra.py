"""`hgrn2 lra TASK...`: train and evaluate Long Range Arena classifiers with the authors' per-task presets.

    hgrn2 lra listops pathfinder --models hgrn2 hgrn1 --out runs/lra --max-minutes 60
    torchrun --nproc-per-node 4 -m hgrn2.cli lra pathx --out runs/lra
    hgrn2 lra listops --variants preset mask-padding layernorm --out runs/abl   # the preset's ablation variants
    hgrn2 lra listops --seed 2222 1 2 --concurrent 3 --mps --out runs/lra # three runs side by side on one GPU
    hgrn2 lra --report --out runs/lra            # the paper-style table and the curves
    hgrn2 lra --report --out runs/lra --record   # also benchmarks/results/<device>/lra.json with the curves

Each (task, model) run lives in `<out>/<task>-<model>/`: `result.json` (settings, learning curve per epoch: train
loss and accuracy, validation and test accuracy; time per epoch; the best validation accuracy and the test accuracy
at that epoch, as LRA reports), `log.jsonl` (the running epoch loss every `--log-every` steps), and
checkpoints under `ckpt/` (every `--ckpt-every` steps, at each epoch end and when a time or step limit stops the
run). Running the same command again resumes exactly: model, optimiser, step, data order and random state; with
other settings it is refused (more `--epochs` excepted), and a run already past `--epochs` or `--max-steps` trains
nothing. A step whose loss or gradient norm is not finite stops the run before anything of it is saved.
`result.json` holds the environment of the machine that trained the run (device, versions, commit), which
`--record` writes into the record wherever it runs.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import json
import multiprocessing
import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import yaml

from ..bench.common import (
    LRA_SEED,
    SEEDS_NOTE,
    add_record_argument,
    best_val_reading,
    command_of,
    environment,
    lra_run_label,
    runs_environment,
    seeds_cell,
    write_result,
)
from ..data.files import write_json
from ..data.lra import images
from ..data.lra import tasks as lra_tasks
from ..data.lra.readers import Split
from ..models.lra import MIXERS, LRAClassifier, LRAModelConfig, num_parameters
from . import distributed, guard
from .engine import Engine, EpochEnd, Task
from .mps import mps_daemon
from .optim import lr_at
from .plot import pyplot

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


def batch_tensors(split: Split, idx: np.ndarray, pixels: tuple[float, float] | None, device: torch.device,
                  crop_flip: np.ndarray | None = None):
    """(inputs, mask or None, labels) for the examples `idx`, trimmed to the batch's longest sequence.

    `pixels`: a pixel task's grey (mean, std) (`TaskInfo.grey_norm`), None for tokens. Pixels become floats
    [B, T, C] (`images.to_float`), first cropped and flipped by crop_flip[idx] where given
    (`images.crop_flip_params` of the split); token pairs (retrieval) become [2, B, T]."""
    labels = _to_device(torch.from_numpy(split.labels[idx]), device)
    if pixels is not None:
        x = split.inputs[idx]
        if crop_flip is not None:
            x = images.random_crop_flip(x, crop_flip[idx])
        return _to_device(torch.from_numpy(images.to_float(x, pixels)), device), None, labels
    lengths = split.lengths[idx]
    T = int(lengths.max())
    x = torch.from_numpy(split.inputs[idx][..., :T])
    mask = torch.arange(T)[None] < torch.from_numpy(lengths)[..., None]
    if x.ndim == 3:  # pairs [B, 2, T] -> [2, B, T]
        x, mask = x.transpose(0, 1), mask.transpose(0, 1)
    return _to_device(x, device), _to_device(mask, device), labels


def _to_device(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`x` on `device`; to a GPU through pinned memory and without waiting (a blocking copy syncs the stream)."""
    if device.type != "cuda":
        return x.to(device)
    return x.contiguous().pin_memory().to(device, non_blocking=True)


def _sums(loss_sum: torch.Tensor, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """[loss sum, correct, examples] in float64 on the device, made without a host-to-device copy."""
    return torch.stack([loss_sum.double(), (logits.argmax(-1) == y).sum().double(),
                        loss_sum.new_full((), len(y), dtype=torch.float64)])


@torch.no_grad()
def evaluate(model, split: Split, pixels: tuple[float, float] | None, batch_size: int, d: distributed.Dist,
             amp: bool) -> dict:
    """Accuracy and mean loss over a split, sharded over ranks."""
    model.eval()
    idx = np.arange(d.rank, len(split.labels), d.world)
    stats = torch.zeros(3, dtype=torch.float64, device=d.device)
    for k in range(0, len(idx), batch_size):
        x, mask, y = batch_tensors(split, idx[k:k + batch_size], pixels, d.device)
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
        _check_at_least(key, train.get(key), low)
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
    checkpoints also keep the run's settings."""

    def __init__(self, model, data: dict, pixels, batch: int, d: distributed.Dist, seed: int, augment: bool,
                 settings: dict, epochs: int, amp: bool, run_dir: Path):
        self.model, self.data, self.pixels, self.batch, self.d = model, data, pixels, batch, d
        self.seed, self.augment, self.settings, self.epochs, self.amp = seed, augment, settings, epochs, amp
        self.run_dir = run_dir
        self.per_rank = batch // d.world
        self.steps_per_epoch = len(data["train"].labels) // batch

    def batches(self, epoch: int, start: int):
        split, b, r = self.data["train"], self.batch, self.d.rank
        order = np.random.default_rng([self.seed, epoch]).permutation(len(split.labels))
        crop_flip = images.crop_flip_params(len(split.labels), self.seed, epoch) if self.augment else None
        for it in range(start, self.steps_per_epoch):
            idx = order[it * b + r * self.per_rank: it * b + (r + 1) * self.per_rank]
            yield batch_tensors(split, idx, self.pixels, self.d.device, crop_flip)

    def loss(self, model, x, mask, y):
        logits = model(x, mask).float()
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
        return (f"{self.run_dir.name} epoch {entry['epoch']}: val {entry['val_acc']:.4f} test {entry['test_acc']:.4f} "
                f"({entry['epoch_time']:.1f}s)")

    def load_state(self, state: dict) -> None:
        _check_same_settings(self.run_dir, _started_with(self.run_dir, state), self.settings)
        # a run already past the new epochs says in one line that it has nothing to train
        if self.d.main and state.get("epochs", self.epochs) != self.epochs and state["epoch"] < self.epochs:
            print(f"{self.run_dir.name}: --epochs {state['epochs']} -> {self.epochs}: the run continues with the new "
                  "value")


def _load_options(task: str, args: argparse.Namespace, data_opts: dict) -> dict:
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
    load = _load_options(task, args, data_opts)
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
    lra = LRATask(model, data, pixels, batch, d, args.seed, data_opts["augment"], settings_now, tr["epochs"], amp,
                  run_dir)

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


def results_in(out: str | Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(Path(out).glob("*/result.json"))]


def _run_key(result: dict) -> tuple[str, str, str | None]:
    """(model, whose settings, variant) of a result.json; one written before `--settings-of` used its model's own,
    one written before `--variants` none."""
    return result["model"], result.get("settings_of", result["model"]), result.get("variant")


def report(out: str | Path) -> str:
    """The paper-style table (test accuracy at the best validation epoch, %) over the runs under `out`."""
    results = results_in(out)
    names = ("ListOps", "Text", "Retrieval", "Image", "Pathfinder", "Path-X")
    rows = [f"| model | {' | '.join(names)} | Avg |", "|---" * (len(names) + 2) + "|"]
    for label, values in PAPER.items():
        rows.append(f"| {label} | " + " | ".join(f"{v:.2f}" for v in values) + f" | {np.mean(values):.2f} |")
    for key in dict.fromkeys(map(_run_key, results)):
        cells = []
        for task in PAPER_ORDER:
            runs = [r for r in results if _run_key(r) == key and r["task"] == task]
            cells.append(seeds_cell([(r["test_acc_at_best_val"], r["epochs_done"], r["train"]["epochs"])
                                     for r in runs]) or "–")
        rows.append(f"| {lra_run_label(*key)} (here) | " + " | ".join(cells) + " | |")
    rows.append(f"\n({SEEDS_NOTE})")
    return "\n".join(rows)


def gpu_minutes(result: dict) -> np.ndarray:
    """GPU-minutes spent by the end of each epoch of a run's history: each epoch's wall time (training and
    evaluation) times the run's GPUs, summed."""
    return np.cumsum([h["epoch_time"] for h in result["history"]]) * result.get("world_size", 1) / 60


def plot(out: str | Path) -> Path | None:
    """Validation accuracy per epoch (top) and against GPU-minutes (bottom: each epoch's wall time, training and
    evaluation, times the run's GPUs), one column per task, one line per run; None without matplotlib or runs."""
    results = results_in(out)
    plt = pyplot() if results else None
    if plt is None:
        return None
    task_list = [t for t in (*PAPER_ORDER, "fashion_mnist") if any(r["task"] == t for r in results)]
    fig, axes = plt.subplots(2, len(task_list), figsize=(5.5 * len(task_list), 7), squeeze=False)
    colors = plt.get_cmap("tab20").colors  # more runs than tab10's ten colours
    for col, task in enumerate(task_list):
        by_epoch, by_minutes = axes[0][col], axes[1][col]
        runs = [r for r in results if r["task"] == task and r["history"]]
        for k, r in enumerate(runs):
            style = dict(label=lra_run_label(*_run_key(r), r.get("seed")), color=colors[k % len(colors)])
            val = [h["val_acc"] for h in r["history"]]
            minutes = gpu_minutes(r)
            by_epoch.plot([h["epoch"] for h in r["history"]], val, **style)
            by_minutes.plot(minutes, val, **style)
        by_epoch.set(title=task, xlabel="epoch", ylabel="val accuracy")
        by_minutes.set(xlabel="GPU-minutes (a shared GPU counts whole)", ylabel="val accuracy")
        if runs:  # no finished epoch yet: empty panels
            by_minutes.legend(fontsize="x-small", loc="lower right")
    path = Path(out) / "curves.png"
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("tasks", nargs="*", help=f"tasks: {', '.join(lra_tasks.TASKS)}")
    p.add_argument("--models", nargs="+", default=["hgrn2"], choices=MIXERS, help="encoders to train (default hgrn2)")
    p.add_argument("--settings-of", choices=MIXERS,
                   help="train every model with this model's preset settings, e.g. hgrn1: HGRN2 as the paper "
                        "describes it (\"HGRN1's configuration\") rather than as the authors' launch scripts train it; "
                        "runs go to TASK-MODEL-as-SETTINGS (default: each model its own)")
    p.add_argument("--variants", nargs="+", metavar="NAME",
                   help=f"ablation variants from the preset's `variants` section, one run each into "
                        f"TASK-MODEL+NAME/ ({PRESET!r}: the preset itself, into TASK-MODEL/); default: {PRESET}")
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
    p.add_argument("--concurrent", type=int, default=1, metavar="N",
                   help="train N of the runs (models, variants, seeds) at once in worker processes sharing the "
                        "device, spread over the GPUs when there are several (default 1: one after the other)")
    p.add_argument("--mps", action="store_true",
                   help="with --concurrent on a GPU: run the workers under an NVIDIA MPS daemon that the command "
                        "starts and stops, so that their kernels share the GPU instead of taking turns on it")
    p.add_argument("--cuda-graph", action="store_true",
                   help="replay each training step as one CUDA graph (one GPU; the pixel tasks image, pathfinder, "
                        "pathx and fashion_mnist, whose batches all have one shape)")
    p.add_argument("--prepare-data", action="store_true",
                   help="generate (or check) the tasks' data sets, ListOps' token caches included, and stop: to "
                        "prepare them on a CPU machine, or once before runs start")
    p.add_argument("--report", action="store_true", help="print the table over the runs in --out and plot curves")
    add_record_argument(p)


def _check_at_least(flag: str, value, low: float | None) -> None:
    """value ≥ low (low None: value > 0), else an error naming --flag."""
    if value is not None and not (value > 0 if low is None else value >= low):
        want = "a positive number" if low is None else f"at least {low}"
        raise ValueError(f"`--{flag.replace('_', '-')}`: expected {want}, got {value}")


def _check_limits(args: argparse.Namespace) -> None:
    # the fewest examples (images) that leave each split one: ListOps holds out 2 %, Pathfinder 10 % twice
    for flag, low in (("examples", 3), ("images", 10), ("workers", 1), ("concurrent", 1), ("max_minutes", None),
                      ("max_steps", 1), ("ckpt_every", 0), ("log_every", 1), ("data_seed", 0)):
        _check_at_least(flag, getattr(args, flag), low)
    for seed in _seeds(args):
        _check_at_least("seed", seed, 0)


def _seeds(args: argparse.Namespace) -> list[int]:
    """--seed's values, each once, in order (an int where a caller built the namespace with one)."""
    return list(dict.fromkeys(args.seed if isinstance(args.seed, list | tuple) else [args.seed]))


def _check_graphable(built: dict) -> None:
    """A CUDA graph replays one shape: the token tasks pad each batch to its longest sequence."""
    for (task, _, _), (cfg, _, _) in built.items():
        if cfg.vocab_size is not None:
            raise ValueError(f"`--cuda-graph`: task {task!r} pads each batch to its longest sequence (the shapes "
                             "vary); graphs need the pixel tasks image, pathfinder, pathx or fashion_mnist")


def run(args: argparse.Namespace) -> int:
    if args.report:
        print(report(args.out))
        path = plot(args.out)
        if path:
            print(f"wrote {path}")
        if args.record is not None:
            print(f"wrote record {record_results(args, path)}")
        return 0
    if not args.tasks:
        raise ValueError("`tasks`: give at least one task (or --report)")
    _check_limits(args)
    # every setting is checked before any data is generated
    variants = [None if v == PRESET else v for v in dict.fromkeys(args.variants or [PRESET])]
    runs = [(task, variant, mixer) for task in args.tasks for variant in variants for mixer in args.models]
    built = {(task, variant, mixer): build(task, mixer, args, variant) for task, variant, mixer in runs}
    batches = sorted({tr["batch_size"] for _, tr, _ in built.values()})
    if args.cuda_graph:
        _check_graphable(built)
    jobs = [(task, mixer, variant, seed) for task, variant, mixer in runs for seed in _seeds(args)]
    if getattr(args, "prepare_data", False):
        for task, load in _data_sets(jobs, built, args):
            data = lra_tasks.load(task, **load)
            sizes = " / ".join(f"{len(data[s].labels):,}" for s in ("train", "val", "test"))
            print(f"{task}: {sizes} examples (train / val / test), fingerprint {lra_tasks.fingerprint(data)}")
        return 0
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if getattr(args, "mps", False) and not (args.concurrent > 1 and len(jobs) > 1 and cuda):
        raise ValueError("`--mps`: shares a GPU between the worker processes of --concurrent N (N > 1, several runs, "
                         "a CUDA device)")
    if args.concurrent > 1 and len(jobs) > 1:
        summary = _train_side_by_side(jobs, built, args, cuda)
        _print_summary(summary)
        if args.record is not None:
            print(f"wrote record {record_results(args, plot(args.out))}")
        return 1 if len(summary) < len(jobs) else 0
    d = distributed.init(args.device)
    if args.cuda_graph and (d.device.type != "cuda" or d.world > 1):
        raise ValueError(f"`--cuda-graph`: needs one CUDA device, got {d.world} process(es) on {d.device}")
    summary = []
    try:
        for batch in batches:
            if batch % d.world:
                raise ValueError(f"`--batch-size`: {batch} is not divisible by the {d.world} processes")
        for task, mixer, variant, seed in jobs:
            summary.append(train_run(task, mixer, argparse.Namespace(**{**vars(args), "seed": seed}), d, variant))
    finally:
        distributed.shutdown()
    if d.main:
        _print_summary(summary)
        if args.record is not None:
            print(f"wrote record {record_results(args, plot(args.out))}")
    return 0


def _print_summary(summary: list[dict]) -> None:
    print("| task | model | params | epochs | best val | test at best val | s/epoch | stopped |")
    print("|---|---|---|---|---|---|---|---|")
    def fmt(v):
        return "–" if v is None else f"{v:.4f}"

    for r in summary:
        best = r["best_val_acc"]
        sec = r["time_per_epoch_s"]
        label = lra_run_label(*_run_key(r), r.get("seed"))
        print(f"| {r['task']} | {label} | {r['parameters']} | {r['epochs_done']} | {fmt(best)} | "
              f"{fmt(r['test_acc_at_best_val'])} | {'–' if sec is None else f'{sec:.1f}'} | {r['stopped']} |")


def _data_sets(jobs: list[tuple], built: dict, args: argparse.Namespace) -> list[tuple[str, dict]]:
    """(task, `lra_tasks.load` options) of each data set the runs read, once each."""
    found = {(t, tuple(_load_options(t, args, built[(t, v, m)][2]).items())) for t, m, v, _ in jobs}
    return [(task, dict(load)) for task, load in sorted(found, key=str)]


def _train_side_by_side(jobs: list[tuple], built: dict, args: argparse.Namespace, cuda: bool) -> list[dict]:
    """Each (task, mixer, variant, seed) run in one of `--concurrent` worker processes sharing the device (over
    all GPUs when there are several): one small LRA model's step leaves a GPU mostly idle while the host launches
    its kernels. The data sets are prepared here first, once; a failing run is named in one line and the others go
    on. The results of the runs that returned, in the order of `jobs`."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ValueError("`--concurrent`: trains runs side by side in worker processes of one launch; under torchrun "
                         "every process takes part in each run (use one or the other)")
    for task, load in _data_sets(jobs, built, args):
        lra_tasks.load(task, **load)  # generated (or checked) once, before the workers read it
    gpus = torch.cuda.device_count() if cuda else 0
    workers = min(args.concurrent, len(jobs))
    threads = max(1, (os.cpu_count() or 1) // workers)
    names = {job: run_name(job[0], job[1], settings_of(job[1], args), job[2], job[3]) for job in jobs}
    print(f"{len(jobs)} runs, {workers} at a time on {f'{gpus} GPU(s)' if cuda else 'the CPU'}; results in {args.out}")
    results = {}
    ctx = multiprocessing.get_context("spawn")
    with mps_daemon() if getattr(args, "mps", False) else contextlib.nullcontext(), \
            concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        futures = {pool.submit(_train_in_worker, task, mixer, variant,
                               argparse.Namespace(**{**vars(args), "seed": seed, "progress": False}),
                               k % gpus if gpus else None, threads): (task, mixer, variant, seed)
                   for k, (task, mixer, variant, seed) in enumerate(jobs)}
        for future in concurrent.futures.as_completed(futures):
            job = futures[future]
            try:
                results[job] = r = future.result()
            except Exception as e:  # noqa: BLE001 - one run's failure is reported, the others train on
                print(f"{names[job]}: failed: {type(e).__name__}: {str(e).strip().splitlines()[-1]}")
            else:
                print(f"{names[job]}: {r['epochs_done']} of {r['train']['epochs']} epochs ({r['stopped'] or 'done'})")
    return [results[job] for job in jobs if job in results]


def _train_in_worker(task: str, mixer: str, variant: str | None, args: argparse.Namespace, gpu: int | None,
                     threads: int) -> dict:
    torch.set_num_threads(threads)
    if gpu is not None:
        torch.cuda.set_device(gpu)
        d = distributed.Dist(0, 1, gpu, torch.device("cuda", gpu))
    else:
        d = distributed.init(args.device)
    return train_run(task, mixer, args, d, variant)


def record_results(args: argparse.Namespace, figure: Path | None) -> Path:
    """`lra.json`: one row per run under --out (test accuracy at the best validation epoch, and at the last epoch and
    the best over epochs, the LRA code's other readings; epochs done, time per epoch; the curve [epoch, val, test]
    per epoch), the paper's numbers beside, the curves as its figure; in the environment the runs recorded where they
    trained."""
    results = results_in(args.out)
    if not results:
        raise ValueError(f"--record: no finished epoch under {args.out} (no */result.json)")
    order = {t: k for k, t in enumerate((*PAPER_ORDER, *lra_tasks.TASKS))}
    rows = [{"task": r["task"], "model": r["model"], "settings": _run_key(r)[1], "variant": _run_key(r)[2],
             "variant_note": r.get("variant_note"), "seed": r.get("seed", SEED_DEFAULTS["seed"]),
             "parameters": r["parameters"],
             "test_acc": r["test_acc_at_best_val"], "best_val_acc": r["best_val_acc"],
             "test_acc_last": r.get("test_acc_last"), "test_acc_max": r.get("test_acc_max"),
             "epochs_done": r["epochs_done"], "epochs": r["train"]["epochs"], "steps": r["steps"],
             "time_per_epoch_s": r["time_per_epoch_s"], "stopped": r["stopped"], "world_size": r["world_size"],
             "curve": [[h["epoch"], round(h["val_acc"], 6), round(h["test_acc"], 6)] for h in r["history"]]}
            for r in results]
    rows = sorted(rows + _prefix_rows(rows, args.config),
                  key=lambda r: (order.get(r["task"], len(order)), r["model"], r["seed"]))
    paper = {label: dict(zip(PAPER_ORDER, values)) for label, values in PAPER.items()}
    env = runs_environment([r.get("environment") for r in results], args.out)
    return write_result(args.record or None, "lra", env, rows, command_of(args), figure=figure, paper=paper)


def _prefix_rows(rows: list[dict], config_dir: str | Path) -> list[dict]:
    """A row for each prefix variant (`_variant`) without a run of its own, read from the preset's run of the same
    model and seed where that has trained past the variant's epochs: its curve up to them, the test accuracy at the
    first best validation epoch there (`read_from_preset`: the epochs the preset's run had)."""
    out = []
    for r in rows:
        if r["variant"] or r["settings"] != r["model"]:
            continue
        for name, entry in (load_preset(r["task"], config_dir).get("variants") or {}).items():
            n = entry["train"]["epochs"] if entry.get("prefix") else 0
            curve = [c for c in r["curve"] if c[0] <= n]
            own = any((o["task"], o["model"], o["settings"], o["variant"], o["seed"]) ==
                      (r["task"], r["model"], r["model"], name, r["seed"]) for o in rows)
            if not n or len(curve) < n or own:
                continue
            val, test = best_val_reading(curve, n)
            out.append({**r, "variant": name, "variant_note": entry.get("note"), "test_acc": test,
                        "best_val_acc": val, "test_acc_last": curve[-1][2], "test_acc_max": max(c[2] for c in curve),
                        "epochs_done": n, "epochs": n, "steps": r["steps"] * n // r["epochs_done"],
                        "stopped": None, "curve": curve, "read_from_preset": r["epochs_done"]})
    return out


__all__ = ["train_run", "evaluate", "report", "plot", "gpu_minutes", "record_results", "build", "build_lra_optimizer",
           "load_preset", "add_arguments", "run"]
