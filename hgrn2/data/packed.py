"""Packed fixed-length sequences from a prepared token memmap, in a deterministic, resumable order.

Sequence i of a split is tokens[i·T : (i+1)·T] (non-overlapping windows across document boundaries; the tail that
does not fill a window is dropped). Training order is a stream of global sample numbers k = 0, 1, 2, ...; sample k
is sequence perm_e[k mod n] with e = k div n and perm_e a permutation seeded by (seed, e). Optimiser step s, micro
step a, rank r read samples s·G + (a·W + r)·b + j for j < b (G = b·A·W: micro batch b, accumulation A, world W),
so the set of sequences per step depends only on G: 2 ranks × accumulation 1 see the same data as 1 rank ×
accumulation 2, and resuming at step s needs nothing but s.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler


class DataFileError(OSError):
    """A data file changed under a running job (shorter than at start)."""


def read_meta(path: str) -> dict:
    """meta.json of a prepared corpus directory (written by `hgrn2 data prepare`), checked."""
    file = os.path.join(path, "meta.json")
    if not os.path.isfile(file):
        raise FileNotFoundError(f"data: {path!r} is not a prepared corpus (no meta.json); run `hgrn2 data prepare`")
    with open(file, encoding="utf-8") as f:
        try:
            meta = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"data: {file} is not valid JSON ({e}); run `hgrn2 data prepare` again") from None
    if not isinstance(meta, dict) or meta.get("format") != "hgrn2-tokens-v1":
        found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise ValueError(f"data: {file} has format {found!r}, expected 'hgrn2-tokens-v1'")
    return meta


class PackedDataset(Dataset):
    """Item i: LongTensor [seq_len], the i-th window of a split. The memmap opens lazily (cheap to send to workers)."""

    def __init__(self, path: str, split: str, seq_len: int):
        meta = read_meta(path)
        if split not in meta["splits"]:
            raise ValueError(f"data: split {split!r} not in {sorted(meta['splits'])}")
        if seq_len < 2:
            raise ValueError(f"seq_len must be >= 2, got {seq_len}")
        info = meta["splits"][split]
        self.file, self.dtype, self.seq_len = os.path.join(path, info["file"]), np.dtype(meta["dtype"]), seq_len
        self.vocab_size = meta["vocab_size"]
        size = os.path.getsize(self.file) // self.dtype.itemsize
        if size != info["tokens"]:
            raise ValueError(f"data: {self.file} holds {size} tokens but meta.json says {info['tokens']} (truncated?)")
        self.n = size // seq_len
        if self.n == 0:
            raise ValueError(f"data: the {split} split has {size} tokens, fewer than seq_len={seq_len}")
        self._fd = None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        # Read with pread rather than a memmap: a file truncated while training then gives a short read and a
        # clear error, where a memmap would kill the process with SIGBUS.
        if self._fd is None:
            self._fd = os.open(self.file, os.O_RDONLY)
        want = self.seq_len * self.dtype.itemsize
        buf = os.pread(self._fd, want, i * want)
        if len(buf) != want:
            raise DataFileError(f"data: {self.file} ended after {i * want + len(buf)} bytes while reading sequence "
                                f"{i} (it was {self.n * want} bytes or more at start; truncated while training?)")
        return torch.from_numpy(np.frombuffer(buf, dtype=self.dtype).astype(np.int64))

    def __getstate__(self) -> dict:  # workers open their own descriptor
        return {**self.__dict__, "_fd": None}

    def __del__(self):
        if getattr(self, "_fd", None) is not None:
            os.close(self._fd)

    def check_token_range(self, block: int = 1 << 24) -> None:
        """Every token id in [0, vocab_size), checked over the whole file before training (a bad id would
        otherwise stop the run mid-way with an index error)."""
        tokens = np.memmap(self.file, dtype=self.dtype, mode="r")
        for start in range(0, len(tokens), block):
            part = tokens[start : start + block]
            lo, hi = int(part.min()), int(part.max())
            if lo < 0 or hi >= self.vocab_size:
                bad = start + int(np.argmax((part < 0) | (part >= self.vocab_size)))
                raise ValueError(f"data: {self.file} holds token id {int(tokens[bad])} at position {bad}, outside "
                                 f"[0, vocab_size={self.vocab_size}) of meta.json")


@lru_cache(maxsize=4)
def _permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    perm = np.random.default_rng([seed, epoch]).permutation(n)
    return perm.astype(np.int32) if n < 2**31 else perm  # half the memory for corpora of < 2^31 sequences


class StepSampler(Sampler):
    """Yields, for steps start..max_steps-1 and each micro step, this rank's list of `micro_batch` sequence indices."""

    def __init__(self, n: int, micro_batch: int, grad_accum: int, rank: int, world: int, seed: int,
                 start_step: int, max_steps: int, shuffle: bool = True):
        self.n, self.b, self.A, self.r, self.W = n, micro_batch, grad_accum, rank, world
        self.seed, self.start, self.stop, self.shuffle = seed, start_step, max_steps, shuffle

    def index(self, k: int) -> int:
        """Sequence index of global sample number k."""
        epoch, i = divmod(k, self.n)
        return int(_permutation(self.n, self.seed, epoch)[i]) if self.shuffle else i

    def __iter__(self):
        G = self.b * self.A * self.W
        for s in range(self.start, self.stop):
            for a in range(self.A):
                base = s * G + (a * self.W + self.r) * self.b
                yield [self.index(base + j) for j in range(self.b)]

    def __len__(self) -> int:
        return max(0, self.stop - self.start) * self.A


def train_loader(dataset: PackedDataset, sampler: StepSampler, num_workers: int = 0) -> DataLoader:
    """Batches of input ids [b, T] in the sampler's order (DataLoader keeps batch order with any worker count).

    The loader gets its own generator: creating an iterator then leaves the global RNG (dropout, resume) untouched.
    """
    return DataLoader(dataset, batch_sampler=sampler, num_workers=num_workers, pin_memory=torch.cuda.is_available(),
                      generator=torch.Generator().manual_seed(0))


def eval_batches(dataset: PackedDataset, micro_batch: int, rank: int, world: int, max_sequences: int | None = None):
    """This rank's validation batches (input_ids, labels) over the first `max_sequences` sequences (all if None).

    Every rank yields the same number of batches (FSDP needs matching collectives); slots past the end are filled
    with sequence 0 and labelled -100 so they add nothing to the loss.
    """
    n = len(dataset) if max_sequences is None else min(max_sequences, len(dataset))
    per_step = micro_batch * world
    for start in range(0, n, per_step):
        idx = [start + rank * micro_batch + j for j in range(micro_batch)]
        x = torch.stack([dataset[i if i < n else 0] for i in idx])
        labels = x.clone()
        labels[torch.tensor([i >= n for i in idx])] = -100
        yield x, labels
