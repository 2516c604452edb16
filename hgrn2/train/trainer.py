"""The language-model trainer: packed data -> causal LM -> AdamW with a warmup schedule, as a task of the training
engine (`engine.py`: accumulation, bf16 autocast, clipping, each step as one CUDA graph, DDP/FSDP2, validation every
eval_every steps, sharded atomic checkpoints every save_every steps, exact resume), then the model exported as a
`save_pretrained` directory (`final/`).

Exact resume: the data order is a function of the step (hgrn2.data.packed), the schedule a function of the step,
and a checkpoint holds model, optimiser, every rank's RNG state and the running loss sums; so a run killed at any
point and restarted from its newest checkpoint logs the same losses as one that never stopped. Checkpoints are
sharded (`sharded.py`: each rank writes its own part, and a run resumes on another number of ranks). A resume with
other settings is refused, except a new max_steps (fewer than the run has done: nothing is trained). A step whose
loss or gradient norm is not finite stops the run before its next log line or checkpoint (`guard.FiniteWatch`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil

import torch
import yaml

from ..data.packed import PackedDataset, StepSampler, eval_batches, read_meta, train_loader
from ..data.tokenizer import pretrained_tokenizer, special_token_ids
from . import checkpoint as ckpt
from . import distributed as D
from . import sharded
from .config import TrainConfig
from .engine import Engine, EpochEnd, Task
from .guard import absolute, check_resume
from .model_factory import build_model
from .optim import build_optimizer, lr_at

# settings a run resumes with unchanged (the data compared as resolved paths); max_steps may change
RESUME_FIXED = ("arch", "model", "seq_len", "batch_size", "seed", "optimizer", "lr", "min_lr", "betas", "eps",
                "weight_decay", "grad_clip", "schedule", "warmup_steps", "precision")
RESUME_PATHS = ("data", "init_from")


def auto_cuda_graph(cfg: TrainConfig, one_gpu: bool, model_config) -> bool:
    """cuda_graph=null: graph the step whose capture the GPU tests check (HGRN2's mixer) where nothing rules it out
    (one CUDA process, no compile, no activation checkpointing)."""
    return (one_gpu and not cfg.compile and not cfg.activation_checkpointing
            and getattr(model_config, "token_mixer", None) == "hgrn2")


class LMTask(Task):
    """Causal language modelling as a task of the engine: one epoch of max_steps steps, each step's micro-batches
    drawn by the step (`StepSampler`), validation loss and perplexity over `eval_sequences` of the val split."""

    by_steps = True

    def __init__(self, cfg: TrainConfig, d: D.Dist, model, train_set, val_set, accum: int):
        self.cfg, self.d, self.model, self.train_set, self.val_set = cfg, d, model, train_set, val_set
        self.accum, self.steps_per_epoch = accum, cfg.max_steps
        self.tokens_per_step = cfg.batch_size * cfg.seq_len

    def batches(self, epoch: int, start: int):
        cfg, d = self.cfg, self.d
        sampler = StepSampler(len(self.train_set), cfg.micro_batch_size, self.accum, d.rank, d.world, cfg.seed,
                              start, cfg.max_steps)
        micro = iter(train_loader(self.train_set, sampler, cfg.num_workers))
        for _ in range(start, cfg.max_steps):
            yield (torch.cat([next(micro).to(d.device, non_blocking=True) for _ in range(self.accum)]),)

    def loss(self, model, x):
        return model(input_ids=x, labels=x).loss

    @torch.no_grad()
    def evaluate(self, model) -> dict:
        """Validation loss/perplexity over the first eval_sequences sequences (0: the whole split)."""
        if self.val_set is None:
            return {}
        max_sequences, device = self.cfg.eval_sequences or None, self.d.device
        model.eval()
        nll = torch.zeros((), dtype=torch.float64, device=device)
        count = torch.zeros((), dtype=torch.float64, device=device)
        autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=self.cfg.precision == "bf16")
        for x, y in eval_batches(self.val_set, self.cfg.micro_batch_size, self.d.rank, self.d.world, max_sequences):
            x, y = x.to(device), y.to(device)
            n = (y[:, 1:] != -100).sum()  # HF causal LMs predict y[:, 1:] from x[:, :-1]
            with autocast:
                loss = model(input_ids=x, labels=y).loss
            if n > 0:
                nll += loss.double() * n
                count += n
        model.train()
        val = (D.total(nll, self.d) / D.total(count, self.d)).item()
        return {"val_loss": val, "val_ppl": math.exp(min(val, 700)),
                "sequences": len(self.val_set) if max_sequences is None else min(max_sequences, len(self.val_set))}

    def entry(self, end: EpochEnd) -> dict:
        return end.metrics

    def running(self, sums: list[float], step: int, steps_per_s: float) -> dict:
        return {"tokens": step * self.tokens_per_step, "tok_per_s": steps_per_s * self.tokens_per_step}

    def line(self, record: dict) -> str | None:
        if "val_loss" not in record:
            return None
        return f"step {record['step']}: val loss {record['val_loss']:.4f}, ppl {record['val_ppl']:.2f}"

    def state(self) -> dict:
        return {"config": absolute(dataclasses.asdict(self.cfg), RESUME_PATHS)}

    def load_state(self, state: dict) -> None:
        cfg = self.cfg
        notes = check_resume(cfg.out_dir, state["config"], dataclasses.asdict(cfg), fixed=RESUME_FIXED,
                             paths=RESUME_PATHS, extendable=("max_steps",))
        if self.d.main:
            print(f"resumed from step {state['step']} ({os.path.join(cfg.out_dir, 'checkpoints')})")
            if cfg.max_steps > state["step"]:  # else `train` says there is nothing to train
                for note in notes:
                    print(note + (" (the cosine schedule now ends there)" if cfg.schedule == "cosine" else ""))


class Trainer:
    def __init__(self, cfg: TrainConfig, d: D.Dist | None = None):
        """Everything that can be wrong with the input is checked here, before the first step; the run folder is
        locked and the newest checkpoint loaded."""
        if not cfg.data:
            raise ValueError("data is not set: --set data=DIR (a directory written by `hgrn2 data prepare`)")
        self.cfg, self.d = cfg, d or D.init(cfg.device)
        self.accum = cfg.grad_accum(self.d.world)
        one_gpu = self.d.device.type == "cuda" and self.d.world == 1
        if cfg.cuda_graph and not one_gpu:
            raise ValueError(f"cuda_graph needs one CUDA device and no DDP/FSDP2, got {self.d.world} rank(s) on "
                             f"{self.d.device.type}")
        meta = read_meta(cfg.data)
        self.train_set = PackedDataset(cfg.data, "train", cfg.seq_len)
        has_val = meta["splits"].get("val", {}).get("tokens", 0) > 0
        self.val_set = PackedDataset(cfg.data, "val", cfg.seq_len) if has_val else None
        for dataset in (self.train_set, self.val_set):
            if dataset is not None:
                dataset.check_token_range()
        torch.manual_seed(cfg.seed)  # identical initial weights on every rank
        model = build_model(cfg.arch, cfg.model, meta["vocab_size"], cfg.init_from)
        self.graphed = cfg.cuda_graph if cfg.cuda_graph is not None else auto_cuda_graph(cfg, one_gpu, model.config)
        self.tokenizer = _corpus_tokenizer(cfg.data, meta)
        _set_special_tokens(model, self.tokenizer, meta)
        self.n_params = sum(p.numel() for p in model.parameters())
        if cfg.activation_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.to(self.d.device)
        if cfg.compile:
            for block in D.blocks(model):
                block.compile()
        ckpt_dir = os.path.join(cfg.out_dir, "checkpoints")
        if not cfg.resume and sharded.list_checkpoints(ckpt_dir):
            raise ValueError(f"resume=false but {ckpt_dir} holds checkpoints of an earlier run; use another "
                             f"out_dir (they would be mixed with this run's)")
        self.task = LMTask(cfg, self.d, model, self.train_set, self.val_set, self.accum)
        self.engine = Engine(
            self.task, lambda m: build_optimizer(m, cfg.optimizer, cfg.lr, cfg.betas, cfg.eps, cfg.weight_decay,
                                                 cfg.fused_optimizer),
            lambda step, epoch: lr_at(step, schedule=cfg.schedule, lr=cfg.lr, warmup_steps=cfg.warmup_steps,
                                      max_steps=cfg.max_steps, min_lr=cfg.min_lr),
            d=self.d, bf16=cfg.precision == "bf16", clip=cfg.grad_clip, accum=self.accum, parallel=cfg.parallel,
            fsdp=dict(reshard=cfg.fsdp_reshard, param_dtype=cfg.fsdp_param_dtype, prefetch=cfg.fsdp_prefetch,
                      unit=cfg.fsdp_unit),
            cuda_graph=self.graphed, checkpoint_dir=ckpt_dir, run_dir=cfg.out_dir,
            keep_last=cfg.keep_last, ckpt_every=cfg.save_every, eval_every=cfg.eval_every, mid_epoch=True,
            log_every=cfg.log_every, tensorboard=cfg.tensorboard, progress=cfg.progress, name=cfg.out_dir)
        self.model, self.optimizer = self.engine.wrapped, self.engine.optimizer
        if not self.engine.start():
            torch.manual_seed(cfg.seed + 1 + self.d.rank)  # per-rank dropout streams (restored when resuming)
        if self.d.main:
            _restore_export(cfg.out_dir)

    @property
    def step(self) -> int:
        return self.engine.step

    def train(self, after_step=None) -> dict:
        """Train to max_steps, then validate on eval_sequences and export `final/`; returns the final validation
        record. `after_step()` is called after every optimiser step: when it returns True the run stops there,
        checkpointed (a later run resumes it), and `train` returns {"stopped_at": step}. A run already past
        max_steps trains nothing and returns {"stopped_at": step}; one at max_steps validates and exports again.
        The run directory is unlocked when `train` returns or raises."""
        cfg, d = self.cfg, self.d
        try:
            if self.step > cfg.max_steps:
                if d.main:
                    print(f"the run in {cfg.out_dir} is at step {self.step}, past max_steps={cfg.max_steps}: "
                          "nothing to train")
                return {"stopped_at": self.step}
            if self.step == cfg.max_steps:
                record = self.engine.validate()
                self.save_final()
            else:
                if d.main:
                    print(f"{cfg.arch}: {self.n_params / 1e6:.1f}M parameters; {d.world} rank(s) × micro batch "
                          f"{cfg.micro_batch_size} × accumulation {self.accum} = {cfg.batch_size} sequences × "
                          f"{cfg.seq_len} tokens per step; steps {self.step} -> {cfg.max_steps}")
                fit = self.engine.fit(1, on_step=after_step, on_epoch=lambda entry: self.save_final())
                if fit.stopped is not None:
                    return {"stopped_at": self.step}
                record = {"step": self.step, **fit.history[-1]}
            return {"kind": "val", **record} if len(record) > 1 else {}
        finally:
            self.engine.close()

    def save_final(self) -> None:
        """The exported model in `final/`, written whole into `final.tmp/` and swapped in by renames."""
        sd = D.full_model_state(self.model)
        if self.d.main:
            out = os.path.join(self.cfg.out_dir, "final")
            try:
                self._export(out + ".tmp", sd)
                if os.path.isdir(out):
                    os.replace(out, out + ".old")
                os.replace(out + ".tmp", out)
            except Exception as e:  # safetensors reports a full disk as its own SafetensorError
                shutil.rmtree(out + ".tmp", ignore_errors=True)
                raise ckpt.SaveError(f"could not write {out} ({ckpt.reason(e)}); the checkpoints are intact: free "
                                     f"space and rerun with resume=true to export again") from e
            shutil.rmtree(out + ".old", ignore_errors=True)
            print(f"saved {out}")
        D.barrier(self.d)

    def _export(self, out: str, sd: dict) -> None:
        shutil.rmtree(out, ignore_errors=True)
        D.unwrap(self.model).save_pretrained(out, state_dict=sd)
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(out)  # `AutoTokenizer.from_pretrained(out)` and `hgrn2 generate`
        with open(os.path.join(out, "train_config.yaml"), "w") as f:
            yaml.safe_dump(dataclasses.asdict(self.cfg), f, sort_keys=False)
        for name in os.listdir(out):  # on disk before the rename makes them the export
            with open(os.path.join(out, name), "rb") as f:
                os.fsync(f.fileno())


def _restore_export(out: str) -> None:
    """An interrupted export's `final.tmp/` is removed; a `final.old/` whose swap was cut short is the export."""
    final = os.path.join(out, "final")
    shutil.rmtree(final + ".tmp", ignore_errors=True)
    if os.path.isdir(final + ".old"):
        if os.path.isdir(final):
            shutil.rmtree(final + ".old")
        else:
            os.replace(final + ".old", final)


def _corpus_tokenizer(data: str, meta: dict):
    """The prepared corpus's tokenizer as a transformers tokenizer with its special tokens (None if it has none)."""
    if not meta.get("tokenizer"):
        return None
    has_config = os.path.isfile(os.path.join(data, "tokenizer_config.json"))
    return pretrained_tokenizer(data if has_config else os.path.join(data, meta["tokenizer"]), meta.get("eos_id"))


def _set_special_tokens(model, tokenizer, meta: dict) -> None:
    """The model's config and generation config get the corpus's bos/eos/pad ids (not the config class defaults),
    so generation stops at the corpus's end of text."""
    eos = meta.get("eos_id")
    ids = special_token_ids(tokenizer) if tokenizer is not None else dict.fromkeys(
        ("bos_token_id", "eos_token_id", "pad_token_id"), eos)
    for key, value in ids.items():
        setattr(model.config, key, value)
        if getattr(model, "generation_config", None) is not None:
            setattr(model.generation_config, key, value)
