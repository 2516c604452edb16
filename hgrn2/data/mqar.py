"""Multi-query associative recall (MQAR), bit-for-bit the data of zoology's `multiquery_ar`.

zoology (HazyResearch/zoology, `zoology/data/multiquery_ar.py`) seeds numpy's global legacy generator and draws,
in this order: for every example the keys (`choice(1..V/2-1, kv, replace=False)`), then for every example the
values (`choice(V/2..V-1, kv, replace=False)`), then for every example the query slots (`choice(space, kv,
replace=False, p ∝ a·i^(a-1))`), each through `np.apply_along_axis` over a tiled `[N, V/2]` array. We make the
same draws from a private `RandomState` in the same order, one C call per example and without the tiled arrays
(so the stream, hence the data, is identical), and place tokens with vectorised numpy. What is cached is only
the draws (`keys`, `values`, `slots`, a few KiB per thousand examples); inputs and labels are rebuilt on load.

Layout of one example (L = seq_len, kv pairs, filler 0, `random_non_queries=False` as in the paper's runs):

    inputs  k1 v1 k2 v2 … k_kv v_kv | 0 … 0 k_j 0 … 0 k_i 0 …      (query keys on even offsets 2·slot)
    labels  -100 …                  | -100 … v_j -100 …             (the value at each query position)

Train and test seeds come from one data seed as in zoology's `prepare_data`:
`np.random.seed(123)`; train = `randint(0, 2**31, size=1)`, test = `randint(2**31, 2**32, size=1)`.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

VOCAB_SIZE = 8192
POWER_A = 0.01
DATA_SEED = 123
IGNORE_INDEX = -100
# (seq_len, num_kv_pairs) of the paper's figure (zoology's figure 2 settings).
SETTINGS = ((64, 4), (128, 8), (256, 16), (512, 64))
NUM_TRAIN, NUM_TEST = 100_000, 3_000


@dataclass
class MQARDraws:
    """The random part of N examples: keys, values `[N, kv]` (int64) and query slots `[N, kv]` (query i of an
    example sits at position 2·kv + 2·slots[:, i] and asks for keys[:, i])."""

    keys: np.ndarray
    values: np.ndarray
    slots: np.ndarray
    seq_len: int

    @property
    def positions(self) -> np.ndarray:
        """Input positions of the queries `[N, kv]`, where the label is the value."""
        return 2 * self.keys.shape[1] + 2 * self.slots

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(inputs, labels), both int64 `[N, seq_len]`, exactly as zoology returns them (as numpy)."""
        n, kv = self.keys.shape
        inputs = np.zeros((n, self.seq_len), dtype=np.int64)
        inputs[:, 0 : 2 * kv : 2] = self.keys
        inputs[:, 1 : 2 * kv : 2] = self.values
        np.put_along_axis(inputs, self.positions, self.keys, axis=1)
        labels = np.full((n, self.seq_len), IGNORE_INDEX, dtype=np.int64)
        np.put_along_axis(labels, self.positions, self.values, axis=1)
        return inputs, labels


def split_seeds(data_seed: int = DATA_SEED) -> tuple[int, int]:
    """(train seed, test seed) derived from the data seed as zoology's `prepare_data` does (one segment each)."""
    rs = np.random.RandomState(data_seed)
    train = rs.randint(0, 2**32 // 2, size=1)
    test = rs.randint(2**32 // 2, 2**32, size=1)
    return int(train[0]), int(test[0])


def _check(num_examples: int, seq_len: int, num_kv_pairs: int, vocab_size: int) -> None:
    if num_examples < 1:
        raise ValueError(f"num_examples must be >= 1, got {num_examples}")
    check_lengths(seq_len, num_kv_pairs)
    if vocab_size <= seq_len:
        raise ValueError(f"vocab_size ({vocab_size}) must exceed seq_len ({seq_len})")
    if num_kv_pairs > vocab_size // 2 - 1:
        raise ValueError(f"num_kv_pairs ({num_kv_pairs}) exceeds the key vocabulary ({vocab_size // 2 - 1})")


def check_lengths(seq_len: int, num_kv_pairs: int) -> None:
    """An even sequence length holding the key-value pairs and their queries."""
    if seq_len % 2:
        raise ValueError(f"seq_len must be even, got {seq_len}")
    if num_kv_pairs < 1 or 4 * num_kv_pairs > seq_len:
        raise ValueError(f"num_kv_pairs must be in [1, seq_len/4] = [1, {seq_len // 4}], got {num_kv_pairs}")


def draw(
    num_examples: int,
    seq_len: int,
    num_kv_pairs: int,
    seed: int,
    vocab_size: int = VOCAB_SIZE,
    power_a: float = POWER_A,
) -> MQARDraws:
    """Draw N examples from `seed` with zoology's random stream (see the module docstring)."""
    _check(num_examples, seq_len, num_kv_pairs, vocab_size)
    rs = np.random.RandomState(seed)
    half, kv = vocab_size // 2, num_kv_pairs
    # choice(a, kv, replace=False) without p is permutation(len(a))[:kv]: the same draws, without the [N, V/2] tile.
    keys = np.stack([rs.permutation(half - 1)[:kv] for _ in range(num_examples)]) + 1
    values = np.stack([rs.permutation(vocab_size - half)[:kv] for _ in range(num_examples)]) + half
    space = (seq_len - 2 * kv) // 2
    p = power_a * np.arange(1, space + 1) ** (power_a - 1)
    p = p / p.sum()
    slots = np.stack([rs.choice(space, size=kv, replace=False, p=p) for _ in range(num_examples)])
    return MQARDraws(keys.astype(np.int64), values.astype(np.int64), slots.astype(np.int64), seq_len)


def multiquery_ar(
    num_examples: int,
    seq_len: int,
    num_kv_pairs: int,
    seed: int,
    vocab_size: int = VOCAB_SIZE,
    power_a: float = POWER_A,
) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, labels) int64 `[N, seq_len]`, equal to zoology's `multiquery_ar(..., random_non_queries=False)`."""
    return draw(num_examples, seq_len, num_kv_pairs, seed, vocab_size, power_a).arrays()


def default_cache_dir() -> Path:
    return Path(os.environ.get("HGRN2_CACHE", Path.home() / ".cache" / "hgrn2")) / "mqar"


def load(
    split: str,
    seq_len: int,
    num_kv_pairs: int,
    num_examples: int | None = None,
    data_seed: int = DATA_SEED,
    vocab_size: int = VOCAB_SIZE,
    power_a: float = POWER_A,
    cache_dir: str | Path | None = None,
) -> MQARDraws:
    """The train or test split of one (seq_len, kv) setting, drawn once and cached as `.npz` (atomic write)."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    n = num_examples or (NUM_TRAIN if split == "train" else NUM_TEST)
    seed = split_seeds(data_seed)[split == "test"]
    tag = f"L{seq_len}-kv{num_kv_pairs}-n{n}-seed{seed}-V{vocab_size}-a{power_a}"
    path = Path(cache_dir or default_cache_dir()) / f"{split}-{hashlib.md5(tag.encode()).hexdigest()[:10]}.npz"
    if path.exists():
        with np.load(path) as f:
            return MQARDraws(f["keys"], f["values"], f["slots"], int(f["seq_len"]))
    d = draw(n, seq_len, num_kv_pairs, seed, vocab_size, power_a)
    path.parent.mkdir(parents=True, exist_ok=True)
    # write to a temporary file in the same folder, then rename: readers never see half a file
    with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".npz", delete=False) as tmp:
        np.savez(tmp, keys=d.keys, values=d.values, slots=d.slots, seq_len=seq_len, tag=tag)
    os.replace(tmp.name, path)
    return d
