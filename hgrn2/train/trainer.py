"""The training loop: packed data -> causal LM -> AdamW with warmup schedule, with accumulation, bf16 autocast,
clipping, DDP/FSDP2 or each step as one CUDA graph (cuda_graph), periodic validation, atomic checkpoints and exact
resume.

Exact resume: the data order is a function of the step (hgrn2.data.packed), the schedule a function of the step,
and a checkpoint holds model, optimiser, every rank's RNG state and the running loss sums; so a run killed at any
point and restarted from its newest checkpoint logs the same losses as one that never stopped. Checkpoints are
sharded (`sharded.py`: each rank writes its own part, and a run resumes on another number of ranks). A resume with
other settings is refused, except a new max_steps (fewer than the run has done: nothing is trained). A step whose
loss or gradient norm is not finite stops the run before its next log line or checkpoint (`guard.FiniteWatch`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import shutil
import time

import torch
import yaml

from ..data.packed import PackedDataset, StepSampler, eval_batches, read_meta, train_loader
from ..data.tokenizer import pretrained_tokenizer, special_token_ids
from . import checkpoint as ckpt
from . import distributed as D
from . import sharded
from .config import TrainConfig
from .graphed import GraphedStep, train_step
from .guard import FiniteWatch, RunLock, check_resume, step_values
from .logger import RunLogger
from .model_factory import build_model
from .optim import build_optimizer, lr_at, set_capturable, set_lr

# settings a run resumes with unchanged (the data compared as resolved paths); max_steps may change
RESUME_FIXED = ("arch", "model", "seq_len", "batch_size", "seed", "optimizer", "lr", "min_lr", "betas", "eps",
                "weight_decay", "grad_clip", "schedule", "warmup_steps", "precision")
RESUME_PATHS = ("data", "init_from")


def auto_cuda_graph(cfg: TrainConfig, one_gpu: bool, model_config) -> bool:
    """cuda_graph=null: graph the step whose capture the GPU tests check (HGRN2's mixer) where nothing rules it out
    (one CUDA process, no compile, no activation checkpointing)."""
    return (one_gpu and not cfg.compile and not cfg.activation_checkpointing
            and getattr(model_config, "token_mixer", None) == "hgrn2")


class Trainer:
    def __init__(self, cfg: TrainConfig, d: D.Dist | None = None):
        """Everything that can be wrong with the input is checked here, before the first step."""
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
        self.model = D.wrap(model, cfg.parallel, self.d, reshard=cfg.fsdp_reshard, param_dtype=cfg.fsdp_param_dtype,
                            prefetch=cfg.fsdp_prefetch)
        self.optimizer = build_optimizer(self.model, cfg.optimizer, cfg.lr, cfg.betas, cfg.eps, cfg.weight_decay,
                                         capturable=self.graphed)
        self.ckpt_dir = os.path.join(cfg.out_dir, "checkpoints")
        self.step, self.loss_sum, self.loss_count, self.pending = 0, 0.0, 0, []
        self.watch = FiniteWatch(self.d.device)
        self.lock = RunLock(cfg.out_dir, self.d)
        try:
            self._start()
        except BaseException:
            self.lock.release()
            raise

    def _start(self) -> None:
        cfg = self.cfg
        if cfg.resume:
            self._resume()
        elif sharded.list_checkpoints(self.ckpt_dir):
            raise ValueError(f"resume=false but {self.ckpt_dir} holds checkpoints of an earlier run; use another "
                             f"out_dir (they would be mixed with this run's)")
        if self.step == 0:
            torch.manual_seed(cfg.seed + 1 + self.d.rank)  # per-rank dropout streams (restored when resuming)
        if self.d.main:
            self._remove_stale()
        self.log = RunLogger(cfg.out_dir, enabled=self.d.main, start_step=self.step, tensorboard=cfg.tensorboard)

    # ------------------------------------------------------------------------------------------------------------

    def autocast(self):
        if self.cfg.precision == "bf16":  # autocast's weight cache must be off while a CUDA graph is captured
            return torch.autocast(self.d.device.type, dtype=torch.bfloat16, cache_enabled=not self.graphed)
        return contextlib.nullcontext()

    def _micro_loss(self, x: torch.Tensor) -> torch.Tensor:
        with self.autocast():
            return self.model(input_ids=x, labels=x).loss

    def _graphed(self) -> GraphedStep | None:
        """The step as a CUDA graph (cuda_graph), warmed up and captured anew by every `train` call: its warm-up
        steps are real steps on the run's batches, so a resumed run continues the same trajectory."""
        if not self.graphed:
            return None
        return GraphedStep(self._micro_loss, self.optimizer, accum=self.accum, max_norm=self.cfg.grad_clip or math.inf)

    def train(self, after_step=None) -> dict:
        """Train to max_steps, then validate on the whole split; returns the final validation record.
        `after_step()` is called after every optimiser step: when it returns True the run stops there, checkpointed
        (a later run resumes it), and `train` returns {"stopped_at": step}. A run already past max_steps trains
        nothing and returns {"stopped_at": step}. The run directory is unlocked when `train` returns or raises."""
        try:
            if self.step > self.cfg.max_steps:
                if self.d.main:
                    print(f"the run in {self.cfg.out_dir} is at step {self.step}, past max_steps={self.cfg.max_steps}:"
                          " nothing to train")
                self.log.close()
                return {"stopped_at": self.step}
            return self._train(after_step)
        finally:
            self.lock.release()

    def _train(self, after_step) -> dict:
        cfg, d = self.cfg, self.d
        sampler = StepSampler(len(self.train_set), cfg.micro_batch_size, self.accum, d.rank, d.world, cfg.seed,
                              self.step, cfg.max_steps)
        batches = iter(train_loader(self.train_set, sampler, cfg.num_workers))
        tokens_per_step = cfg.batch_size * cfg.seq_len
        if d.main:
            print(f"{cfg.arch}: {self.n_params / 1e6:.1f}M parameters; {d.world} rank(s) × micro batch "
                  f"{cfg.micro_batch_size} × accumulation {self.accum} = {cfg.batch_size} sequences × {cfg.seq_len} "
                  f"tokens per step; steps {self.step} -> {cfg.max_steps}")
        bar = self.bar = self._progress()
        t_last, steps_since = time.time(), 0
        self.model.train()
        graphed = self._graphed()
        while self.step < cfg.max_steps:
            lr = lr_at(self.step, schedule=cfg.schedule, lr=cfg.lr, warmup_steps=cfg.warmup_steps,
                       max_steps=cfg.max_steps, min_lr=cfg.min_lr)
            set_lr(self.optimizer, lr)
            x = torch.cat([next(batches).to(d.device, non_blocking=True) for _ in range(self.accum)])
            with step_values(self.step + 1):
                if graphed is not None:
                    loss, grad_norm = graphed(x)
                    loss = loss.clone()  # the next replay overwrites the graph's output
                else:
                    loss, grad_norm = self._eager_step(x)
            self.step += 1
            steps_since += 1
            self.pending.append(D.mean(loss, d))  # stays on the device: no host sync until the log step
            self.watch.update(self.step, self.pending[-1], grad_norm)
            if bar is not None:
                bar.update(1)
            if self._log_now():
                self._flush_pending()
                dt = time.time() - t_last
                rec = {"kind": "train", "step": self.step, "loss": self.loss_sum / self.loss_count, "lr": lr,
                       "grad_norm": float(grad_norm), "tokens": self.step * tokens_per_step,
                       "tok_per_s": steps_since * tokens_per_step / max(dt, 1e-9)}
                self.log.log(rec)
                if bar is not None:
                    bar.set_postfix(loss=f"{rec['loss']:.4f}", lr=f"{lr:.2e}", tok_s=f"{rec['tok_per_s']:.0f}")
                self.loss_sum, self.loss_count, t_last, steps_since = 0.0, 0, time.time(), 0
            if cfg.eval_every and self.step % cfg.eval_every == 0 and self.step < cfg.max_steps:
                self.evaluate(cfg.eval_sequences or None)
            if cfg.save_every and self.step % cfg.save_every == 0:
                self.save_checkpoint()
            if after_step is not None and after_step() and self.step < cfg.max_steps:
                return self._stop(bar)
        if bar is not None:
            bar.close()
        self.bar = None
        result = self.evaluate(cfg.eval_sequences or None)
        if not (cfg.save_every and self.step % cfg.save_every == 0):
            self.save_checkpoint()
        self.save_final()
        self.log.close()
        return result

    def _eager_step(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One optimiser step on x, the step's micro-batches stacked: `train_step`, what the graph captures."""
        out = train_step(self._micro_loss, self.optimizer, [x], self.accum, self.cfg.grad_clip or math.inf,
                         sync=lambda last: D.no_sync(self.model, last))
        self.optimizer.zero_grad(set_to_none=True)  # no gradients held through evaluation and checkpoints
        return out

    def _stop(self, bar) -> dict:
        if bar is not None:
            bar.close()
        if not (self.cfg.save_every and self.step % self.cfg.save_every == 0):
            self.save_checkpoint()
        self.log.close()
        return {"stopped_at": self.step}

    def _log_now(self) -> bool:
        return self.step % self.cfg.log_every == 0 or self.step == self.cfg.max_steps

    def _progress(self):
        if not (self.d.main and self.cfg.progress):
            return None
        from tqdm.auto import tqdm

        return tqdm(total=self.cfg.max_steps, initial=self.step, unit="step", dynamic_ncols=True)

    # ------------------------------------------------------------------------------------------------------------

    @torch.no_grad()
    def evaluate(self, max_sequences: int | None) -> dict:
        """Validation loss/perplexity over the first `max_sequences` sequences (None: the whole split)."""
        if self.val_set is None:
            return {}
        self.model.eval()
        nll = torch.zeros((), dtype=torch.float64, device=self.d.device)
        count = torch.zeros((), dtype=torch.float64, device=self.d.device)
        for x, y in eval_batches(self.val_set, self.cfg.micro_batch_size, self.d.rank, self.d.world, max_sequences):
            x, y = x.to(self.d.device), y.to(self.d.device)
            n = (y[:, 1:] != -100).sum()  # HF causal LMs predict y[:, 1:] from x[:, :-1]
            with self.autocast():
                loss = self.model(input_ids=x, labels=y).loss
            if n > 0:
                nll += loss.double() * n
                count += n
        self.model.train()
        nll, count = D.total(nll, self.d), D.total(count, self.d)
        val = (nll / count).item()
        rec = {"kind": "val", "step": self.step, "val_loss": val, "val_ppl": math.exp(min(val, 700)),
               "sequences": len(self.val_set) if max_sequences is None else min(max_sequences, len(self.val_set))}
        self.log.log(rec)
        if self.d.main:
            from tqdm.auto import tqdm

            tqdm.write(f"step {self.step}: val loss {val:.4f}, ppl {rec['val_ppl']:.2f}")  # above the progress bar
        return rec

    # ------------------------------------------------------------------------------------------------------------

    def save_checkpoint(self) -> None:
        self._flush_pending()  # stops a diverged run here, before its state is saved
        state = {"step": self.step, "rng": D.gather_objects(ckpt.rng_state(), self.d), "loss_sum": self.loss_sum,
                 "loss_count": self.loss_count, "config": dataclasses.asdict(self.cfg), "world": self.d.world}
        sharded.save(self.ckpt_dir, self.step, self.model, self.optimizer, state, self.d, self.cfg.keep_last)

    def _flush_pending(self) -> None:
        """Move the per-step losses since the last log into the running sum (kept in checkpoints); raises
        `guard.Diverged` if a step since the start was not finite."""
        self.watch.check(f" (run {self.cfg.out_dir})")
        self.loss_sum += sum(t.item() for t in self.pending)
        self.loss_count += len(self.pending)
        self.pending = []

    def _resume(self) -> None:
        """Every rank reads its part of the newest intact checkpoint (the file system must be shared across nodes)."""
        set_capturable(self.optimizer, None)  # DCP's state initialisation steps once, with a CPU rate for a tensor one
        state = sharded.load_latest(self.ckpt_dir, self.model, self.optimizer, self.d)
        set_capturable(self.optimizer, self.d.device if self.graphed else None)
        if state is None:
            return
        notes = check_resume(self.cfg.out_dir, state["config"], dataclasses.asdict(self.cfg), fixed=RESUME_FIXED,
                             paths=RESUME_PATHS, extendable=("max_steps",))
        self.step, self.loss_sum, self.loss_count = state["step"], state["loss_sum"], state["loss_count"]
        if state["world"] == self.d.world:
            ckpt.set_rng_state(state["rng"][self.d.rank])
        elif self.d.main:
            print(f"note: checkpoint written by {state['world']} ranks, resuming on {self.d.world}: RNG not restored")
        if self.d.main:
            print(f"resumed from step {self.step} ({self.ckpt_dir})")
            for note in notes:
                print(note + (" (the cosine schedule now ends there)" if self.cfg.schedule == "cosine" else ""))

    def save_final(self) -> None:
        """The exported model in `final/`, written whole into `final.tmp/` and swapped in by renames."""
        self.watch.check(f" (run {self.cfg.out_dir})")
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

    def _remove_stale(self) -> None:
        """Temporary files of an interrupted save or export; a `final.old/` whose swap was cut short is the export."""
        out = self.cfg.out_dir
        sharded.remove_stale(self.ckpt_dir)
        log_tmp = os.path.join(out, "log.jsonl.tmp")
        if os.path.exists(log_tmp):
            os.remove(log_tmp)
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
