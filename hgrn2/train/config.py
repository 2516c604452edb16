"""Training configuration: one flat dataclass, YAML presets (`hgrn2/configs/lm/*.yaml`) and `--set key=value`.

Keys are validated: an unknown key or a typo is a ValueError naming the closest valid key and listing them all.
Model keys are written `model.<name>` and are checked against the architecture's config class.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from dataclasses import dataclass, field
from typing import Any

import yaml

from hgrn2.data.files import folder_problem

PRESET_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "configs", "lm")


@dataclass
class TrainConfig:
    # model
    arch: str = "hgrn2"  # "hgrn2" (hgrn2.models) or "llama" (transformers LlamaForCausalLM with SDPA)
    model: dict = field(default_factory=dict)  # config kwargs; vocab_size "auto" (default) = the corpus' vocabulary
    init_from: str | None = None  # a save_pretrained directory to start from instead of random weights
    # data
    data: str = ""  # directory written by `hgrn2 data prepare`
    seq_len: int = 512
    num_workers: int = 2
    # batch: batch_size sequences per optimiser step in total; accumulation = batch / (micro_batch × world)
    batch_size: int = 128
    micro_batch_size: int = 8
    # optimiser and schedule
    optimizer: str = "adamw"  # "adamw" (decoupled decay, as fairseq's Adam) or "adam" (L2 added to the gradient)
    lr: float = 5e-4
    min_lr: float = 0.0  # cosine floor
    betas: list = field(default_factory=lambda: [0.9, 0.98])
    eps: float = 1e-8
    weight_decay: float = 0.1  # on matrices only (dim >= 2); norms, biases, lower bounds are not decayed
    grad_clip: float = 0.0  # max global grad norm; 0 = off (the norm is measured either way)
    schedule: str = "inverse_sqrt"  # "inverse_sqrt", "cosine" or "constant", all with linear warmup
    warmup_steps: int = 4000
    max_steps: int = 50000
    # precision, memory, speed
    precision: str = "bf16"  # "bf16" (autocast; fp32 master weights) or "fp32"
    activation_checkpointing: bool = False
    # torch.compile per block; off by default because HGRN2's glue already runs in custom kernels, so compiling
    # its blocks does not speed up a step (other mixers may gain)
    compile: bool = False
    # replay each optimiser step (its micro-batches, clipping, AdamW) as one CUDA graph, so a slow host does not
    # bound it: one GPU, no compile or activation checkpointing; the first 3 steps (and 3 after a resume) run
    # eagerly before the capture. None (the default):
    # on for HGRN2 models on one CUDA process with compile and activation checkpointing off, where it trains
    # faster (BENCHMARKS.md, "Training throughput"); other token mixers and Llama stay eager unless set true.
    cuda_graph: bool | None = None
    parallel: str = "ddp"  # "ddp" or "fsdp" (FSDP2 fully_shard per block) when launched with torchrun
    # FSDP2 (`distributed.wrap`): reshard after each block's forward ("auto": all but the last block; "always";
    # "never": gathered until the backward), the dtype its parameters are gathered and computed in ("bf16":
    # MixedPrecisionPolicy, fp32 gradient reduction), how many units' all-gathers are issued ahead, and how many
    # consecutive blocks make one unit (one all-gather and one reduce-scatter each: fewer units, less host work
    # per step, more memory at once)
    fsdp_reshard: str = "auto"
    fsdp_param_dtype: str = "fp32"
    fsdp_prefetch: int = 1
    fsdp_unit: int = 1
    # the optimiser as one fused kernel per parameter group (torch's `fused=True`) rather than torch's default
    # (foreach kernels on CUDA): fewer launches, which matters most over FSDP2's sharded parameters
    fused_optimizer: bool = False
    device: str = "auto"  # "auto" (CUDA when available), "cuda" or "cpu" (gloo when distributed)
    # run
    out_dir: str = "runs/lm"
    seed: int = 1234
    log_every: int = 10
    eval_every: int = 1000  # 0 = only at the end
    eval_sequences: int = 256  # validation sequences per evaluation, periodic and final alike; 0 = the whole split
    save_every: int = 1000  # 0 = only at the end
    keep_last: int = 3
    resume: bool = True  # continue from the newest valid checkpoint in out_dir/checkpoints
    tensorboard: bool = True
    progress: bool = True

    def validate(self) -> None:
        choices = {"arch": ("hgrn2", "llama"), "optimizer": ("adamw", "adam"), "precision": ("bf16", "fp32"),
                   "schedule": ("inverse_sqrt", "cosine", "constant"), "parallel": ("ddp", "fsdp"),
                   "device": ("auto", "cuda", "cpu"), "fsdp_reshard": ("auto", "always", "never"),
                   "fsdp_param_dtype": ("fp32", "bf16")}
        for key, allowed in choices.items():
            if getattr(self, key) not in allowed:
                raise ValueError(f"{key} must be one of {allowed}, got {getattr(self, key)!r}")
        positive = ("seq_len", "batch_size", "micro_batch_size", "max_steps", "log_every", "keep_last", "fsdp_unit")
        for key in positive:
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)}")
        for key in ("warmup_steps", "eval_every", "save_every", "num_workers", "eval_sequences", "grad_clip",
                    "fsdp_prefetch"):
            if getattr(self, key) < 0:
                raise ValueError(f"{key} must be >= 0, got {getattr(self, key)}")
        problem = folder_problem(self.out_dir)
        if problem:
            raise ValueError(f"out_dir: {problem}")
        # the optimiser's fp32 arithmetic (lr times the weight decay, the moments) overflows far below fp32's range
        if not (0 < self.lr < 1e30 and 0 <= self.min_lr <= self.lr):
            raise ValueError(f"need 0 < lr < 1e30 and 0 <= min_lr <= lr, got lr={self.lr}, min_lr={self.min_lr}")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"betas must be two numbers in [0, 1), got {self.betas}")
        if self.fused_optimizer not in (True, False):
            raise ValueError(f"fused_optimizer must be true or false, got {self.fused_optimizer!r}")
        if self.cuda_graph not in (None, True, False):
            raise ValueError(f"cuda_graph must be true, false or null (automatic), got {self.cuda_graph!r}")
        if self.cuda_graph and self.device == "cpu":
            raise ValueError("cuda_graph needs a CUDA device, got device=cpu")
        for key in ("compile", "activation_checkpointing"):
            if self.cuda_graph and getattr(self, key):
                raise ValueError(f"cuda_graph cannot be combined with {key}=true (choose one)")

    def grad_accum(self, world: int) -> int:
        per_step = self.micro_batch_size * world
        if self.batch_size % per_step:
            raise ValueError(f"batch_size={self.batch_size} is not a multiple of micro_batch_size × world size = "
                             f"{self.micro_batch_size} × {world}")
        return self.batch_size // per_step


def preset_names(directory: str = PRESET_DIR) -> list[str]:
    return sorted(f[:-5] for f in os.listdir(directory) if f.endswith(".yaml"))


def load_preset(name_or_path: str, directory: str = PRESET_DIR) -> dict:
    """Raw dict of a preset given by name (`<directory>/<name>.yaml`; for the language model also the model preset's
    name of a paper size, `paper-150m`, ...) or by a YAML file path."""
    from hgrn2.models.presets import TRAINING_PRESETS

    name = TRAINING_PRESETS.get(name_or_path, name_or_path) if directory == PRESET_DIR else name_or_path
    path = name_or_path if os.path.isfile(name_or_path) else os.path.join(directory, f"{name}.yaml")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"config {name_or_path!r} is neither a file nor a preset; presets: "
                                f"{preset_names(directory)}")
    with open(path) as f:
        try:
            raw = yaml.safe_load(f) or {}
        except yaml.YAMLError as e:
            raise ValueError(f"config {path}: invalid YAML{_where(e)}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"config {path}: expected a mapping of key: value, got {type(raw).__name__}")
    return raw


def parse_overrides(items: list[str]) -> list[tuple[str, Any]]:
    """`["lr=3e-4", "model.hidden_size=512"]` -> [(key, value)]; values parsed as YAML (numbers, lists, maps)."""
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set expects key=value, got {item!r}")
        try:
            out.append((key, yaml.safe_load(value) if value else ""))
        except yaml.YAMLError as e:
            raise ValueError(f"--set {key}: {value!r} is not a YAML value{_where(e)}") from None
    return out


def _where(e: Exception) -> str:
    """" (line L, column C)" of a YAML error, where it says."""
    mark = getattr(e, "problem_mark", None)
    return f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""


def make_config(preset: str | None = None, overrides: list[str] | None = None, cls=TrainConfig,
                directory: str = PRESET_DIR, nested: str = "model"):
    """A `cls` from a preset of `directory` (optional), then overrides in order; `model={...}` replaces the nested
    dict field `nested`, `model.k=v` edits it. Every key is checked and every value coerced to the field's type."""
    raw = load_preset(preset, directory) if preset else {}
    inner = dict(raw.pop(nested, None) or {})
    for key, value in parse_overrides(overrides or []):
        if key == nested:
            if not isinstance(value, dict):
                raise ValueError(f"{nested}= expects a mapping like {{hidden_size: 512}}, got {value!r}")
            inner = dict(value)
        elif key.startswith(nested + "."):
            inner[key[len(nested) + 1:]] = value
        else:
            raw[key] = value
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name != nested}
    cfg = cls(**{key: _coerce(key, value, fields, nested) for key, value in raw.items()}, **{nested: inner})
    cfg.validate()
    return cfg


def unknown_key_error(key: str, valid: list[str], what: str = "config") -> ValueError:
    close = difflib.get_close_matches(key, valid, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ValueError(f"unknown {what} key {key!r}{hint}; valid keys: {', '.join(sorted(valid))}")


AUTO_BOOLS = ("cuda_graph",)  # bool settings whose default None means "decided at run time"


def _coerce(key: str, value, fields: dict, nested: str):
    if key not in fields:
        raise unknown_key_error(key, [*fields, f"{nested}.<name>"])
    default = fields[key].default
    kind = type(default) if default is not dataclasses.MISSING and default is not None else None
    if key in AUTO_BOOLS:  # true, false or null (automatic)
        kind = bool
        if value in (None, "null", "none", "None"):
            return None
    if fields[key].default_factory is not dataclasses.MISSING:
        kind = list
    try:
        if kind is bool:
            if not isinstance(value, bool):
                raise ValueError
            return value
        if kind is float:
            return float(value)  # YAML reads "5e-4" as a string
        if kind is int:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            return int(value)
        if kind is list:
            return [float(v) for v in value]
        return None if value in (None, "null", "none", "None") else str(value)
    except (TypeError, ValueError):
        want = kind.__name__ if kind else "str"
        raise ValueError(f"config key {key!r} expects {want}, got {value!r}") from None
