"""Shared helpers for the training tests (no tests here): a synthetic corpus and a tiny model spec.

The tiny model is the real HGRN2 when `hgrn2.models` is importable, else transformers' Llama (same trainer path).
"""

import errno
import io
import json
import os
import signal
import subprocess
import sys

import numpy as np

from hgrn2.data.prepare import write_corpus

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tiny_model_overrides(dropout: float = 0.1) -> list[str]:
    try:
        from hgrn2.models import HGRN2Config, HGRN2ForCausalLM  # noqa: F401

        return ["arch=hgrn2", "model={hidden_size: 32, num_hidden_layers: 2, expand_ratio: 16}"]
    except ImportError:
        return ["arch=llama", "model={hidden_size: 32, num_hidden_layers: 2, num_attention_heads: 4, "
                f"intermediate_size: 64, attention_dropout: {dropout}}}"]


def make_corpus(path, vocab=96, n_train=6000, n_val=700, seed=0) -> str:
    """Tokens from a noisy periodic source (learnable, so losses move): 1-D ids in [0, vocab)."""
    rng = np.random.default_rng(seed)

    def ids(n):
        base = (np.arange(n) * 7 + rng.integers(0, 3, n)) % vocab
        noise = rng.random(n) < 0.2
        return np.where(noise, rng.integers(0, vocab, n), base)

    write_corpus(str(path), {"train": ids(n_train), "val": ids(n_val)}, vocab_size=vocab)
    return str(path)


def base_overrides(data, out_dir, dropout=0.1, **kw) -> list[str]:
    settings = {"data": data, "out_dir": out_dir, "seq_len": 32, "batch_size": 8, "micro_batch_size": 4,
                "max_steps": 24, "warmup_steps": 4, "lr": 3e-3, "schedule": "cosine", "precision": "fp32",
                "log_every": 1, "eval_every": 8, "eval_sequences": 8, "save_every": 4, "keep_last": 3,
                "num_workers": 0, "progress": False, "tensorboard": False, "grad_clip": 1.0, "device": "cpu"}
    settings.update(kw)
    return [f"{k}={v}" for k, v in settings.items()] + tiny_model_overrides(dropout)


def train_cmd(overrides, nproc: int = 1) -> list[str]:
    launcher = [*(torchrun(nproc) if nproc > 1 else [sys.executable]), "-m", "hgrn2.cli"]
    return launcher + ["train", "--set", *overrides]


def env() -> dict:
    # one thread per process: identical reduction order in every run, and 2 ranks fit the 2-core CI machine
    return dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")


def run_train(overrides, nproc: int = 1, timeout: int = 300) -> subprocess.CompletedProcess:
    return run_command(train_cmd(overrides, nproc), timeout)


def run_command(cmd: list[str], timeout: int, returncode: int = 0) -> subprocess.CompletedProcess:
    """Run `cmd` and assert it exits with `returncode` (else fail with the end of its output). It runs in its own
    process group, which a timeout kills whole, torchrun's ranks included."""
    with subprocess.Popen(cmd, cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            raise AssertionError(f"timed out after {timeout} s\n{out[-3000:]}{err[-3000:]}") from None
    assert proc.returncode == returncode, out[-3000:] + err[-3000:]
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def torchrun(nproc: int) -> list[str]:
    """The launcher as users call it; --standalone picks a free port."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc)]


def losses(out_dir, kind="train", key="loss") -> dict:
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return {r["step"]: r[key] for r in rows if r["kind"] == kind}


class FullDisk(io.FileIO):
    """A file on a disk that fills up after `room` bytes: the write that crosses it fails with ENOSPC."""

    room = 0

    def write(self, b):
        n = len(memoryview(b).cast("B"))
        if n > FullDisk.room:
            super().write(bytes(memoryview(b).cast("B")[: FullDisk.room]))
            FullDisk.room = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        FullDisk.room -= n
        return super().write(b)
