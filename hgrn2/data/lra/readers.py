"""Readers for the LRA data sets that come from public files at a local path (nothing is downloaded).

Text (IMDB reviews as bytes, 4,096 per review), Retrieval (AAN citation pairs as bytes, 4,000 per document) and
Image (CIFAR-10 in grey or colour, 1,024 pixels), plus Fashion-MNIST (Debian `dataset-fashion-mnist`) as an offline
pixel-sequence stand-in. Each reader returns {split: Split}; truncation to the task's length is LRA's definition of
the task (`max_len`), and the number of truncated examples is recorded in `Split.truncated`.
"""

from __future__ import annotations

import csv
import pickle
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..idx import FASHION_MNIST_DIR, find_fashion_mnist, read_fashion_mnist_split

BYTE_OFFSET = 2  # token = byte + 2: 0 is padding, 1 end of sequence
BYTE_VOCAB = 256 + BYTE_OFFSET


@dataclass
class Split:
    """inputs int64 [N, T] (or [N, 2, T] for pairs), lengths [N] (or [N, 2]), labels [N]; pixels are uint8 [N, T]
    (or [N, T, 3] in colour)."""

    inputs: np.ndarray
    lengths: np.ndarray
    labels: np.ndarray
    truncated: int = 0


class MissingData(FileNotFoundError):
    pass


def _missing(task: str, root: Path, layouts: str) -> MissingData:
    return MissingData(f"{task}: no data under {root}; expected one of these layouts:\n{layouts}")


def encode_bytes(texts: list[bytes], max_len: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Byte tokens [N, max_len] (+ end of sequence, padded with 0), lengths, and how many were cut to max_len − 1."""
    out = np.zeros((len(texts), max_len), np.int64)
    lengths = np.zeros(len(texts), np.int64)
    cut = 0
    for k, t in enumerate(texts):
        if len(t) > max_len - 1:
            cut += 1
            t = t[: max_len - 1]
        out[k, : len(t)] = np.frombuffer(t, np.uint8).astype(np.int64) + BYTE_OFFSET
        out[k, len(t)] = 1
        lengths[k] = len(t) + 1
    return out, lengths, cut


IMDB_LAYOUTS = """  ROOT/aclImdb/{train,test}/{pos,neg}/*.txt      (the original aclImdb_v1 release)
  ROOT/{train,test}/{pos,neg}/*.txt              (the same, unpacked into ROOT)"""


def read_text(root: str | Path, max_len: int = 4096, val_fraction: float = 0.0, seed: int = 42) -> dict[str, Split]:
    """IMDB sentiment: label 1 = pos. LRA has no validation split (the test set is used); `val_fraction` > 0 takes
    one from train."""
    root = Path(root)
    base = root / "aclImdb" if (root / "aclImdb").is_dir() else root
    if not all((base / s / c).is_dir() for s in ("train", "test") for c in ("pos", "neg")):
        raise _missing("text", root, IMDB_LAYOUTS)
    out = {}
    for split in ("train", "test"):
        texts, labels = [], []
        for label, cls in ((0, "neg"), (1, "pos")):
            for path in sorted((base / split / cls).glob("*.txt")):
                texts.append(path.read_bytes())
                labels.append(label)
        x, n, cut = encode_bytes(texts, max_len)
        out[split] = Split(x, n, np.array(labels, np.int64), cut)
    return _with_val(out, val_fraction, seed)


AAN_LAYOUTS = """  ROOT/lra_release/tsv_data/new_aan_pairs.{train,eval,test}.tsv   (the LRA release)
  ROOT/tsv_data/new_aan_pairs.{train,eval,test}.tsv
  ROOT/new_aan_pairs.{train,eval,test}.tsv
  rows: label <TAB> id1 <TAB> id2 <TAB> text1 <TAB> text2"""


def read_retrieval(root: str | Path, max_len: int = 4000) -> dict[str, Split]:
    """AAN document matching (two documents, label 1 if one cites the other), from LRA's TSV files."""
    root = Path(root)
    for base in (root / "lra_release" / "tsv_data", root / "tsv_data", root):
        if all((base / f"new_aan_pairs.{s}.tsv").is_file() for s in ("train", "eval", "test")):
            break
    else:
        raise _missing("retrieval", root, AAN_LAYOUTS)
    csv.field_size_limit(sys.maxsize)
    out = {}
    for split, name in (("train", "train"), ("val", "eval"), ("test", "test")):
        with open(base / f"new_aan_pairs.{name}.tsv", newline="", encoding="utf-8") as f:
            rows = [r for r in csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE) if r]
        bad = [k for k, r in enumerate(rows) if len(r) != 5]
        if bad:
            raise ValueError(f"{base}/new_aan_pairs.{name}.tsv: row {bad[0] + 1} has {len(rows[bad[0]])} fields, "
                             "expected 5 (label, id1, id2, text1, text2)")
        a, na, ca = encode_bytes([r[3].encode() for r in rows], max_len)
        b, nb, cb = encode_bytes([r[4].encode() for r in rows], max_len)
        labels = np.array([int(float(r[0])) for r in rows], np.int64)
        out[split] = Split(np.stack([a, b], 1), np.stack([na, nb], 1), labels, ca + cb)
    return out


CIFAR_LAYOUTS = """  ROOT/cifar-10-batches-py/{data_batch_1..5,test_batch}           (the original python release)
  ROOT/cifar-10-batches-bin/{data_batch_1..5,test_batch}.bin     (the original binary release)
  ROOT/{data_batch_1..5,test_batch}[.bin]"""
CIFAR_FILES = {"train": [f"data_batch_{k}" for k in range(1, 6)], "test": ["test_batch"]}


def _cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(rgb uint8 [N, 32, 32, 3], labels) of one python-pickle or binary (.bin) CIFAR-10 batch file. A pickle is
    read only from the folder the user gave (`hgrn2 lra --data`, whose help says it runs code), never downloaded."""
    if path.suffix == ".bin":
        rows = np.fromfile(path, np.uint8).reshape(-1, 3073)
        data, labels = rows[:, 1:], rows[:, 0].astype(np.int64)
    else:
        with open(path, "rb") as f:
            batch = pickle.load(f, encoding="bytes")
        data, labels = np.asarray(batch[b"data"], np.uint8), np.asarray(batch[b"labels"], np.int64)
    return data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), labels


def grey(rgb: np.ndarray) -> np.ndarray:
    """uint8 luma (ITU-R 601: 0.299 R + 0.587 G + 0.114 B) in PIL's integer arithmetic, as torchvision's Grayscale
    computes it on the LRA code's PIL images (Pillow's convert("L")); rgb [..., 3] uint8."""
    weights = np.array([19595, 38470, 7471], np.uint32)  # the weights × 2^16
    return ((rgb.astype(np.uint32) @ weights + (1 << 15)) >> 16).astype(np.uint8)


def read_image(root: str | Path, val_fraction: float = 0.1, seed: int = 42, grayscale: bool = True) -> dict[str, Split]:
    """CIFAR-10 as 1,024-pixel sequences (row-major), uint8: grey [N, 1024], or colour [N, 1024, 3] (RGB, the LRA
    code's `grayscale=False`); validation: 10% of train (the LRA code's `val_split`)."""
    root = Path(root)
    found = None
    for base, ext in ((root / "cifar-10-batches-py", ""), (root / "cifar-10-batches-bin", ".bin"), (root, ""),
                      (root, ".bin")):
        if all((base / (n + ext)).is_file() for ns in CIFAR_FILES.values() for n in ns):
            found = base, ext
            break
    if found is None:
        raise _missing("image", root, CIFAR_LAYOUTS)
    base, ext = found
    out = {}
    for split, files in CIFAR_FILES.items():
        parts = [_cifar_batch(base / (name + ext)) for name in files]
        rgb = np.concatenate([p[0] for p in parts])
        x = grey(rgb).reshape(-1, 1024) if grayscale else rgb.reshape(-1, 1024, 3)
        out[split] = Split(x, np.full(len(x), 1024, np.int64), np.concatenate([p[1] for p in parts]))
    return _with_val(out, val_fraction, seed)


FASHION_LAYOUTS = (f"  ROOT/{{train,t10k}}-{{images-idx3,labels-idx1}}-ubyte[.gz]   (Debian dataset-fashion-mnist: "
                   f"{FASHION_MNIST_DIR})")


def read_fashion_mnist(root: str | Path = FASHION_MNIST_DIR, val_fraction: float = 1 / 12,
                       seed: int = 42) -> dict[str, Split]:
    """Fashion-MNIST as 784-pixel sequences (28×28, row-major), uint8; validation: 5,000 of the 60,000."""
    root = Path(root)
    if find_fashion_mnist(root) is None:
        raise _missing("fashion_mnist", root, FASHION_LAYOUTS)
    out = {}
    for split in ("train", "test"):
        images, labels = read_fashion_mnist_split(root, split)
        x = images.reshape(len(images), -1)
        out[split] = Split(x, np.full(len(x), x.shape[1], np.int64), labels.astype(np.int64))
    return _with_val(out, val_fraction, seed)


def _with_val(out: dict[str, Split], fraction: float, seed: int) -> dict[str, Split]:
    """Split a seeded `fraction` of train off as val (none when fraction is 0: val is then the test split)."""
    if fraction <= 0:
        out["val"] = out["test"]
        return out
    train = out["train"]
    order = np.random.default_rng(seed).permutation(len(train.labels))
    n_val = int(round(len(order) * fraction))
    pick = lambda idx: Split(train.inputs[idx], train.lengths[idx], train.labels[idx])  # noqa: E731
    out["train"], out["val"] = pick(np.sort(order[n_val:])), pick(np.sort(order[:n_val]))
    return out


LEVEL_DIRS = {"easy": "curv_baseline", "intermediate": "curv_contour_length_9", "hard": "curv_contour_length_14"}
PATHFINDER_LAYOUTS = """  ROOT/lra_release/pathfinderR/LEVEL/{metadata/*.npy,imgs/*/*.png}   (the LRA release)
  ROOT/pathfinderR/LEVEL/...    or    ROOT/LEVEL/...
  (R = 32 or 128; LEVEL = curv_baseline, curv_contour_length_9 or curv_contour_length_14; metadata rows are
   `imgs/<dir> <file> <index> <label> ...` text lines, as in the LRA release)"""


def _read_pngs(paths: list[str]) -> np.ndarray:
    from PIL import Image  # checked by read_pathfinder

    out = []
    for p in paths:
        with Image.open(p) as im:
            out.append(np.asarray(im.convert("L"), np.uint8).reshape(-1))
    return np.stack(out)


def read_pathfinder(root: str | Path, resolution: int = 32, level: str = "hard", fractions=(0.1, 0.1),
                    seed: int = 42, workers: int | None = None) -> dict[str, Split]:
    """The LRA release's Pathfinder / Path-X PNGs (Pillow). Splits as the LRA code makes them: a
    `torch.utils.data.random_split` of all images into 80/10/10 with generator seed 42. Empty image files (one
    exists in pathfinder32/curv_baseline) are left out, with a warning giving their number."""
    import os
    import warnings
    from concurrent.futures import ProcessPoolExecutor

    import torch

    if level not in LEVEL_DIRS:
        raise ValueError(f"`level`: expected one of {sorted(LEVEL_DIRS)}, got {level!r}")
    try:
        import PIL  # noqa: F401
    except ImportError as e:
        raise ImportError("reading the Pathfinder PNGs needs Pillow: pip install 'hgrn2[lra]'") from e
    root = Path(root)
    name = f"pathfinder{resolution}"
    for base in (root / "lra_release" / name / LEVEL_DIRS[level], root / name / LEVEL_DIRS[level],
                 root / LEVEL_DIRS[level]):
        metas = sorted((base / "metadata").glob("*.npy"), key=lambda p: int(p.stem) if p.stem.isdigit() else -1)
        if metas:
            break
    else:
        raise _missing(name, root, PATHFINDER_LAYOUTS)
    paths, labels = [], []
    for meta in metas:
        for line in meta.read_text().splitlines():
            fields = line.split()
            if fields:
                paths.append(str(base / fields[0] / fields[1]))
                labels.append(int(fields[3]))
    keep = [k for k, p in enumerate(paths) if os.path.getsize(p) > 0]
    if len(keep) < len(paths):
        warnings.warn(f"{name}: {len(paths) - len(keep)} empty image file(s) left out", stacklevel=2)
    paths, labels = [paths[k] for k in keep], np.array([labels[k] for k in keep], np.int64)
    chunks = [paths[k:k + 2000] for k in range(0, len(paths), 2000)]
    with ProcessPoolExecutor(workers or os.cpu_count() or 1) as pool:
        images = np.concatenate(list(pool.map(_read_pngs, chunks)))
    if images.shape[1] != resolution * resolution:
        raise ValueError(f"{base}: images have {images.shape[1]} pixels, expected {resolution}x{resolution}")
    n = len(labels)
    n_val, n_test = int(fractions[0] * n), int(fractions[1] * n)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).numpy()
    parts = {"train": order[: n - n_val - n_test], "val": order[n - n_val - n_test: n - n_test],
             "test": order[n - n_test:]}
    full = np.full(n, resolution * resolution, np.int64)
    return {s: Split(images[idx], full[idx], labels[idx]) for s, idx in parts.items()}
