"""Packed fixed-length sequences from a prepared token stream, in a deterministic, resumable order.

A split is one token stream: the single file of the `hgrn2-tokens-v1` format, or the shards of the sharded format
(`shards.py`) back to back in index order, read in place (no copy). Sequence i of a split is tokens[i·T : (i+1)·T]
of that stream (non-overlapping windows across document and shard boundaries; the tail that does not fill a window
is dropped). Training order is a stream of global sample numbers k = 0, 1, 2, ...; sample k is sequence
perm_e[k mod n] with e = k div n and perm_e a permutation seeded by (seed, e). Optimiser step s, micro step a, rank
r read samples s·G + (a·W + r)·b + j for j < b (G = b·A·W: micro batch b, accumulation A, world W), so the set of
sequences per step depends only on G: 2 ranks × accumulation 1 see the same data as 1 rank × accumulation 2, and
resuming at step s needs nothing but s.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from functools import lru_cache

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

FORMATS = ("hgrn2-tokens-v1", "hgrn2-tokens-v2")
MAX_OPEN = 64  # descriptors a dataset keeps open at once (a corpus may have thousands of shards)


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
    if not isinstance(meta, dict) or meta.get("format") not in FORMATS:
        found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise ValueError(f"data: {file} has format {found!r}, expected one of {list(FORMATS)}")
    return meta


def split_files(path: str, meta: dict, split: str) -> list[tuple[str, int]]:
    """[(file, tokens)] of a split's stream in order, each file's size checked against the index."""
    if split not in meta["splits"]:
        raise ValueError(f"data: split {split!r} not in {sorted(meta['splits'])}")
    info = meta["splits"][split]
    parts = info["shards"] if "shards" in info else [info]
    itemsize = np.dtype(meta["dtype"]).itemsize
    out = []
    for p in parts:
        file = os.path.join(path, p["file"])
        if not os.path.isfile(file):
            raise FileNotFoundError(f"data: {file} is missing (listed in {os.path.join(path, 'meta.json')})")
        size = os.path.getsize(file) // itemsize
        if size != p["tokens"]:
            raise ValueError(f"data: {file} holds {size} tokens but meta.json says {p['tokens']} (truncated?)")
        out.append((file, size))
    return out


def read_split(path: str, split: str) -> np.ndarray:
    """A whole split's tokens (memory-mapped for one file, else the shards concatenated: meant for validation)."""
    meta = read_meta(path)
    files = [(f, n) for f, n in split_files(path, meta, split) if n]
    if not files:
        return np.zeros(0, dtype=meta["dtype"])
    maps = [np.memmap(f, dtype=meta["dtype"], mode="r") for f, _ in files]
    return maps[0] if len(maps) == 1 else np.concatenate(maps)


class PackedDataset(Dataset):
    """Item i: LongTensor [seq_len], the i-th window of a split's stream. Files open lazily (cheap to send to
    workers)."""

    def __init__(self, path: str, split: str, seq_len: int):
        meta = read_meta(path)
        if seq_len < 2:
            raise ValueError(f"seq_len must be >= 2, got {seq_len}")
        segments = [(f, n) for f, n in split_files(path, meta, split) if n]
        self.files = [f for f, _ in segments]
        self.starts = np.cumsum([0] + [n for _, n in segments])  # token offset of each file in the stream
        self.dtype, self.seq_len, self.vocab_size = np.dtype(meta["dtype"]), seq_len, meta["vocab_size"]
        size = int(self.starts[-1])
        self.n = size // seq_len
        if self.n == 0:
            raise ValueError(f"data: the {split} split has {size} tokens, fewer than seq_len={seq_len}")
        self._fds: OrderedDict[int, int] = OrderedDict()

    @property
    def file(self) -> str:
        """The split's file (single-file datasets)."""
        if len(self.files) != 1:
            raise AttributeError(f"the split is {len(self.files)} shards; see .files")
        return self.files[0]

    def __len__(self) -> int:
        return self.n

    def _fd(self, k: int) -> int:
        if k in self._fds:
            self._fds.move_to_end(k)
        else:
            if len(self._fds) >= MAX_OPEN:
                os.close(self._fds.popitem(last=False)[1])
            self._fds[k] = os.open(self.files[k], os.O_RDONLY)
        return self._fds[k]

    def __getitem__(self, i: int) -> torch.Tensor:
        # Read with pread rather than a memmap: a file truncated while training then gives a short read and a
        # clear error, where a memmap would kill the process with SIGBUS.
        pos, end, item = i * self.seq_len, (i + 1) * self.seq_len, self.dtype.itemsize
        k = int(np.searchsorted(self.starts, pos, side="right")) - 1
        chunks = []
        while pos < end:
            stop = min(end, int(self.starts[k + 1]))
            want = (stop - pos) * item
            offset = (pos - int(self.starts[k])) * item
            buf = os.pread(self._fd(k), want, offset)
            if len(buf) != want:
                raise DataFileError(f"data: {self.files[k]} ended after {offset + len(buf)} bytes while reading "
                                    f"sequence {i} (it was {int(self.starts[k + 1] - self.starts[k]) * item} bytes "
                                    f"at start; truncated while training?)")
            chunks.append(buf)
            pos, k = stop, k + 1
        return torch.from_numpy(np.frombuffer(b"".join(chunks), dtype=self.dtype).astype(np.int64))

    def __getstate__(self) -> dict:  # workers open their own descriptors
        return {**self.__dict__, "_fds": OrderedDict()}

    def __del__(self):
        for fd in getattr(self, "_fds", {}).values():
            os.close(fd)

    def check_token_range(self, block: int = 1 << 24) -> None:
        """Every token id in [0, vocab_size), checked over every file before training (a bad id would otherwise
        stop the run mid-way with an index error)."""
        for file in self.files:
            tokens = np.memmap(file, dtype=self.dtype, mode="r")
            for start in range(0, len(tokens), block):
                part = tokens[start : start + block]
                lo, hi = int(part.min()), int(part.max())
                if lo < 0 or hi >= self.vocab_size:
                    bad = start + int(np.argmax((part < 0) | (part >= self.vocab_size)))
                    raise ValueError(f"data: {file} holds token id {int(tokens[bad])} at position {bad}, outside "
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
