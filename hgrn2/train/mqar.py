"""MQAR training runs (the paper's multi-query associative recall) on the training engine: one run's spec, its
data on the device, the task and `train_run`. The sweep over mixers, widths, lengths and learning rates, its table,
plot and record are `hgrn2 mqar` (`hgrn2.experiments.mqar`)."""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from hgrn2.data import mqar
from hgrn2.models.zoology import ZoologyLM
from hgrn2.train.engine import Engine, Task, cosine


@dataclass
class RunSpec:
    """One training run of the sweep. `mixer` is a name in `hgrn2.layers.TOKEN_MIXERS` or "module:Class"."""

    mixer: str
    d_model: int
    seq_len: int
    kv_pairs: int
    lr: float
    batch_size: int
    epochs: int = 64
    train_examples: int = mqar.NUM_TRAIN
    test_examples: int = mqar.NUM_TEST
    vocab_size: int = mqar.VOCAB_SIZE
    data_seed: int = mqar.DATA_SEED
    seed: int = 0
    weight_decay: float = 0.1
    early_stop_accuracy: float = 0.99
    mixer_options: dict = field(default_factory=dict)

    @property
    def run_id(self) -> str:
        digest = hashlib.md5(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:8]
        name = re.sub(r"[^A-Za-z0-9_]+", "_", self.mixer)
        return f"{name}-L{self.seq_len}-d{self.d_model}-lr{self.lr:g}-{digest}"

    @property
    def total_steps(self) -> int:
        return self.epochs * math.ceil(self.train_examples / self.batch_size)


# ---------------------------------------------------------------------------------------------------------------
# one run


def _tensors(draws: mqar.MQARDraws, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """inputs [N, L] int32, query positions [N, kv] int64, target values [N, kv] int64, on `device`."""
    keys, values = torch.from_numpy(draws.keys).to(device), torch.from_numpy(draws.values).to(device)
    positions = torch.from_numpy(draws.positions).to(device)
    n, kv = keys.shape
    inputs = torch.zeros(n, draws.seq_len, dtype=torch.int32, device=device)
    inputs[:, 0 : 2 * kv : 2] = keys.int()
    inputs[:, 1 : 2 * kv : 2] = values.int()
    inputs.scatter_(1, positions, keys.int())
    return inputs, positions, values


@torch.no_grad()
def evaluate(model: ZoologyLM, inputs, positions, targets, batch_size: int) -> tuple[float, float]:
    """(accuracy, loss) over the query tokens. fp32, no dropout, like zoology's `Trainer.test`."""
    model.eval()
    correct, loss_sum = 0, 0.0
    for s in range(0, len(inputs), batch_size):
        logits = model(inputs[s : s + batch_size], positions[s : s + batch_size]).float()
        y = targets[s : s + batch_size]
        correct += (logits.argmax(-1) == y).sum().item()
        loss_sum += F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum").item()
    return correct / targets.numel(), loss_sum / targets.numel()


class MQARTask(Task):
    """MQAR as a task of the training engine: batches in a fixed order, the loss over the query tokens (fp32
    cross entropy; padded targets −100 are ignored), test accuracy, early stop above a threshold."""

    pad_values = (0, 0, -100)

    def __init__(self, model: ZoologyLM, train, test, batch_size: int, early_stop_accuracy: float):
        self.model, self.train, self.test = model, train, test
        self.batch_size, self.early_stop_accuracy = batch_size, early_stop_accuracy

    def batches(self, epoch: int, start: int):
        inputs, positions, targets = self.train
        bs = self.batch_size
        for s in range(start * bs, len(inputs), bs):
            yield inputs[s : s + bs], positions[s : s + bs], targets[s : s + bs]

    def loss(self, model, ids, pos, tgt) -> torch.Tensor:
        logits = model(ids, pos)
        return F.cross_entropy(logits.flatten(0, 1).float(), tgt.flatten())

    def evaluate(self, model) -> dict:
        acc, test_loss = evaluate(model, *self.test, self.batch_size)
        return {"test_loss": test_loss, "accuracy": acc}

    def done(self, entry: dict) -> bool:
        return entry["accuracy"] > self.early_stop_accuracy

    def score(self, entry: dict) -> float:
        return entry["accuracy"]


def train_run(spec: RunSpec, device: str | torch.device = "cpu", data_dir: str | Path | None = None,
              deadline: float | None = None, on_epoch=None, checkpoint_dir: str | Path | None = None,
              cuda_graph: bool = False, on_step=None) -> dict:
    """Train and test one run on the training engine (`hgrn2.train.engine`); returns its result (spec,
    final/best accuracy, per-epoch history, timing).

    `deadline` (a `time.time()` value) cuts the run after the step that passes it: the result then has
    complete=False. A run whose training loss turns non-finite stops (diverged=True, complete=True).
    `on_epoch(record)` is called after every epoch with that epoch's record (and the run's id and epochs),
    `on_step()` after every step.
    `checkpoint_dir`: save the state after every epoch there, and start from the newest one found (exactly:
    the batches come in a fixed order and the RNG is restored); it is locked while the run trains.
    `cuda_graph`: replay each training step as one CUDA graph (`hgrn2.train.graphed`; the same updates, the
    epoch's last, smaller batch padded with ignored targets), for these small, launch-bound models.
    """
    dev = torch.device(device)
    torch.manual_seed(spec.seed)
    load = dict(vocab_size=spec.vocab_size, data_seed=spec.data_seed, cache_dir=data_dir)
    train = _tensors(mqar.load("train", spec.seq_len, spec.kv_pairs, spec.train_examples, **load), dev)
    test = _tensors(mqar.load("test", spec.seq_len, spec.kv_pairs, spec.test_examples, **load), dev)
    is_attention = spec.mixer == "attention"
    model = ZoologyLM(spec.mixer, spec.d_model, vocab_size=spec.vocab_size,
                      max_position_embeddings=spec.seq_len if is_attention else 0,
                      mixer_options=spec.mixer_options).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=spec.weight_decay, fused=dev.type == "cuda")
    task = MQARTask(model, train, test, spec.batch_size, spec.early_stop_accuracy)
    def epoch_done(record):  # the run's id and epochs beside the epoch's record, for the sweep's progress line
        if on_epoch is not None:
            on_epoch({"run_id": spec.run_id, "epochs": spec.epochs, **record})

    engine = Engine(task, opt, lambda step, epoch: cosine(spec.lr, epoch, spec.epochs), device=dev,
                    bf16=dev.type == "cuda", cuda_graph=cuda_graph, checkpoint_dir=checkpoint_dir, run_id=spec.run_id,
                    name_by="epoch", raise_on_divergence=False)
    fit = engine.fit(spec.epochs, deadline=deadline, on_step=on_step, on_epoch=epoch_done)
    history = fit.history
    return dict(
        run_id=spec.run_id, spec=asdict(spec), final_accuracy=history[-1]["accuracy"],
        best_accuracy=engine.best()["accuracy"], epochs_run=len(history), early_stopped=fit.early,
        diverged=fit.diverged, complete=fit.stopped is None, steps=fit.step, seconds=round(fit.seconds, 2),
        steps_per_second=round(fit.step / max(fit.seconds, 1e-9), 2), device=str(dev),
        gpu=torch.cuda.get_device_name(dev) if dev.type == "cuda" else None, torch=torch.__version__,
        parameters=sum(p.numel() for p in model.parameters()), history=history,
    )
