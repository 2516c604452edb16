"""The idx format of MNIST-style data sets, and Fashion-MNIST's four idx files at a local path.

Debian's `dataset-fashion-mnist` installs the files, gzipped, in `FASHION_MNIST_DIR`; unpacked copies are read too.
"""

from __future__ import annotations

import gzip
import math
from pathlib import Path

import numpy as np

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
                       "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
FASHION_MNIST_LAYOUT = (", ".join(f"{a}[.gz], {b}[.gz]" for a, b in FASHION_MNIST_FILES.values())
                        + f" (Debian's dataset-fashion-mnist installs them in {FASHION_MNIST_DIR})")


def read_idx(path: str | Path) -> np.ndarray:
    """An idx file (magic 0x0000 08 NDIM, big-endian sizes, uint8 data), gzipped (`.gz`) or not."""
    path = str(path)
    with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[:2] != b"\0\0" or raw[2] != 8:
        raise ValueError(f"`data`: {path} is not an idx file of unsigned bytes")
    ndim = raw[3]
    if len(raw) < 4 + 4 * ndim:
        raise ValueError(f"`data`: {path} ends inside its header (truncated?)")
    shape = tuple(int(x) for x in np.frombuffer(raw, ">u4", ndim, 4))
    data = np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim)
    if data.size != math.prod(shape):
        raise ValueError(f"`data`: {path} holds {data.size} bytes for shape {shape} (truncated?)")
    return data.reshape(shape)


def find_fashion_mnist(directory: str | Path) -> dict[str, tuple[Path, Path]] | None:
    """{split: (images, labels)} paths of the four files in `directory` (each gzipped or not), None if any is
    missing."""
    found = {}
    for split, stems in FASHION_MNIST_FILES.items():
        paths = []
        for stem in stems:
            path = next((p for p in (Path(directory) / f"{stem}.gz", Path(directory) / stem) if p.is_file()), None)
            if path is None:
                return None
            paths.append(path)
        found[split] = tuple(paths)
    return found


def read_fashion_mnist_split(directory: str | Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Images uint8 [N, S, S] (S = 28 in the real files) and labels uint8 [N] of split "train" or "test"."""
    files = find_fashion_mnist(directory)
    if files is None:
        raise FileNotFoundError(f"`data`: the Fashion-MNIST files are not all in {directory}; expected "
                                f"{FASHION_MNIST_LAYOUT}")
    images, labels = (read_idx(p) for p in files[split])
    square = images.ndim == 3 and images.shape[1] == images.shape[2]
    if not square or labels.ndim != 1 or len(images) != len(labels):
        raise ValueError(f"`data`: {split} images {images.shape} (expected [N, S, S]) and labels {labels.shape} "
                         "do not match")
    if labels.max(initial=0) > 9:
        raise ValueError(f"`data`: {split} labels go up to {labels.max()}; Fashion-MNIST has classes 0-9")
    return images, labels
