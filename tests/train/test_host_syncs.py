"""A training step queues its work without waiting for it: no host read of a tensor (a sync on a GPU) in the
forward, the loss, the backward or the loss bookkeeping of the LRA classifiers and the language model.

On the CPU every value check reads its tensor on the host, as it should for CPU tensors: `reads_on_host` is patched
so that the checks take their GPU path (asynchronous device assertions, recorded here), and every host read left is
counted: `_local_scalar_dense` at dispatch (item, bool, int, float) and Tensor.tolist / numpy / cpu. The optimiser
step is outside the count: its step counters live on the CPU for GPU parameters too (torch's default).
"""

import traceback

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from hgrn2.models import modeling_hgrn2
from hgrn2.models.configuration_hgrn2 import HGRN2Config
from hgrn2.models.lra import LRAClassifier, LRAModelConfig
from hgrn2.ops import checks
from hgrn2.train.lra import _sums


class HostReads(TorchDispatchMode):
    """Records where each host read of a tensor's value happens."""

    def __init__(self):
        super().__init__()
        self.reads = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.record("item")
        return func(*args, **(kwargs or {}))

    def record(self, what: str) -> None:
        frames = [f for f in traceback.extract_stack() if "hgrn2/" in f.filename and "tests/" not in f.filename]
        self.reads.append(f"{what} at {frames[-1].filename}:{frames[-1].lineno}" if frames else what)


@pytest.fixture
def device_checks(monkeypatch):
    """(HostReads mode, device assertions made): checks routed to their GPU path, host reads recorded."""
    mode, assertions = HostReads(), []
    for module in (checks, modeling_hgrn2):
        monkeypatch.setattr(module, "reads_on_host", lambda x: False)
    monkeypatch.setattr(torch, "_assert_async", lambda ok, msg=None: assertions.append(msg))
    for name in ("tolist", "numpy", "cpu"):
        method = getattr(torch.Tensor, name)

        def counted(self, *a, _method=method, _name=name, **kw):
            if mode.active:
                mode.record(_name)
            return _method(self, *a, **kw)

        monkeypatch.setattr(torch.Tensor, name, counted)
    mode.active = False
    return mode, assertions


def count_step(mode, step, warmup=1) -> list[str]:
    for _ in range(warmup):
        step()
    mode.active = True
    with mode:
        step()
    mode.active = False
    return mode.reads


def lra_step(cfg: LRAModelConfig, x, mask):
    model = LRAClassifier(cfg)
    opt = torch.optim.AdamW(model.parameters(), 1e-3)
    y = torch.randint(0, cfg.num_classes, (x.shape[0],))
    sums = torch.zeros(3, dtype=torch.float64)

    def step():
        logits = model(x, mask).float()
        loss = F.cross_entropy(logits, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        sums.add_(_sums(loss.detach().double() * len(y), logits, y))
        return loss

    def train_step():
        step()
        opt.step()

    return step, train_step


@pytest.mark.parametrize("task", ["pathfinder", "listops", "listops-pad-group"])
def test_lra_training_step_reads_nothing_on_the_host(device_checks, task):
    mode, assertions = device_checks
    common = dict(hidden_size=16, num_layers=2, expand_ratio=2, norm="batch", glu_expand=1)
    if task == "pathfinder":  # the preset's 2d scan over an 8 × 8 image
        cfg = LRAModelConfig(num_classes=2, vocab_size=None, directions="2d", pooling="last", positional=False,
                             max_len=64, **common)
        x, mask = torch.rand(3, 64, 1), None
    else:  # the preset's bidirectional scan over padded token sequences
        cfg = LRAModelConfig(num_classes=10, vocab_size=20, directions="bi", max_len=40, embed_dropout=0.1,
                             pad_group=1 if task == "listops-pad-group" else None, **common)
        x, mask = torch.randint(0, 20, (3, 40)), torch.ones(3, 40, dtype=torch.bool)
        mask[1, 25:] = False
    step, train_step = lra_step(cfg, x, mask)
    train_step()
    assert count_step(mode, step) == []
    assert any("lower_bound" in a for a in assertions)  # the range checks still ran, on the device


@pytest.mark.parametrize("full_length", [False, True])
@pytest.mark.parametrize("task", ["tokens", "pairs", "pixels"])
def test_lra_batches_read_nothing_on_the_host(device_checks, task, full_length):
    """A training batch is gathered from the split on the device: its length (where trimmed) comes from the host's
    copy of the lengths, never from a tensor, so that making it leaves the queued steps running."""
    import numpy as np

    from hgrn2.data.lra import images
    from hgrn2.data.lra.readers import Split
    from hgrn2.train.lra import DeviceSplit, Indices, batch_tensors

    mode, _ = device_checks
    rng = np.random.default_rng(0)
    shape = {"tokens": (6, 12), "pairs": (6, 2, 12), "pixels": (6, 64)}[task]
    lengths = rng.integers(3, 13, shape[:-1])
    inputs = rng.integers(0, 200, shape).astype(np.uint8 if task == "pixels" else np.int64)
    split = DeviceSplit.of(Split(inputs, lengths, np.arange(6)), torch.device("cpu"))
    idx = Indices.of(rng.permutation(6), torch.device("cpu"))
    pixels = (0.5, 0.5) if task == "pixels" else None
    crop_flip = torch.from_numpy(images.crop_flip_params(6, seed=0, epoch=0)) if task == "pixels" else None
    mode.active = True
    with mode:
        batch_tensors(split, idx[1:4], pixels, crop_flip, full_length)
    mode.active = False
    assert mode.reads == []


def test_language_model_training_step_reads_nothing_on_the_host(device_checks):
    mode, assertions = device_checks
    cfg = HGRN2Config.from_preset("tiny")
    model = modeling_hgrn2.HGRN2ForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), 1e-3)
    ids = torch.randint(0, cfg.vocab_size, (2, 48))

    def step():
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()

    step()
    opt.step()
    assert count_step(mode, step) == []
    assert any("labels" in a for a in assertions) and any("lower_bound" in a for a in assertions)


class _ReadsInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, d):
        return d if bool(d.isfinite().all()) else d.nan_to_num()


def test_the_count_sees_reads_in_the_backward_and_tolist(device_checks):
    mode, _ = device_checks
    x = torch.randn(4, requires_grad=True)

    def step():
        _ReadsInBackward.apply(x).sum().backward()
        x.detach().tolist()

    reads = count_step(mode, step)
    assert [r.split(" ")[0] for r in reads] == ["item", "tolist"]
