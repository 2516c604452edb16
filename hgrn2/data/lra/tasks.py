"""The LRA tasks as arrays: `load(task, ...)` → {"train", "val", "test": Split} plus what the model needs to know.

Generated tasks (ListOps, Pathfinder, Path-X) are written once under `data_dir` and read back, unless `data_root`
holds LRA's released files for them; the others are read from `data_root` (see `readers`). Token tasks pad with 0;
pixel tasks are uint8 sequences.
"""

from __future__ import annotations

import os
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import listops, pathfinder, readers
from .readers import Split


@dataclass(frozen=True)
class TaskInfo:
    num_classes: int
    vocab_size: int | None  # None: pixels
    max_len: int
    dual: bool = False
    generated: bool = False
    # grey pixels' (mean, std) of pixels / 255 in the LRA code's Normalize: CIFAR-10's own statistics, else 0.5
    grey_norm: tuple[float, float] = (0.5, 0.5)


TASKS: dict[str, TaskInfo] = {
    "listops": TaskInfo(10, len(listops.VOCAB), 2048, generated=True),
    "text": TaskInfo(2, readers.BYTE_VOCAB, 4096),
    "retrieval": TaskInfo(2, readers.BYTE_VOCAB, 4000, dual=True),
    "image": TaskInfo(10, None, 1024, grey_norm=(122.6 / 255, 61.0 / 255)),
    "pathfinder": TaskInfo(2, None, 1024, generated=True),
    "pathx": TaskInfo(2, None, 16384, generated=True),
    "fashion_mnist": TaskInfo(10, None, 784),
}
# images of one difficulty level in LRA's pathfinder32 / pathfinder128 sets, which the LRA code splits 80/10/10 into
# 160K/20K/20K (google-research/long-range-arena image/configs/pathfinder32: TRAIN_EXAMPLES 160000; OpenNLPLab/lra
# reads curv_contour_length_14 alone); `--images` changes it
PATHFINDER_IMAGES = 200_000


def default_data_dir() -> Path:
    return Path(os.environ.get("HGRN2_CACHE", Path.home() / ".cache" / "hgrn2")) / "lra"


def check_task(task: str) -> TaskInfo:
    if task not in TASKS:
        raise ValueError(f"`task`: expected one of {sorted(TASKS)}, got {task!r}")
    return TASKS[task]


def load(task: str, *, data_root: str | None = None, data_dir: str | Path | None = None, seed: int = 0,
         examples: int | None = None, level: str = "hard", workers: int | None = None,
         grayscale: bool = True) -> dict[str, Split]:
    """Splits of `task`. Generated tasks: `examples` in total (ListOps: 96K/2K/2K when None), `seed`, `level`;
    image: in grey (LRA's task) or colour."""
    check_task(task)
    if not grayscale and task != "image":
        raise ValueError(f"`--no-grayscale`: only the image task (CIFAR-10) has colour, not {task!r}")
    data_dir = Path(data_dir) if data_dir else default_data_dir()
    if task == "listops":
        return _listops(data_root, data_dir, seed, examples, workers)
    if task in ("pathfinder", "pathx"):
        if data_root is not None:
            return readers.read_pathfinder(data_root, 32 if task == "pathfinder" else 128, level, workers=workers)
        return _pathfinder(task, data_dir, seed, examples, level, workers)
    if task == "fashion_mnist":
        return readers.read_fashion_mnist(data_root or readers.FASHION_MNIST_DIR)
    if data_root is None:
        raise ValueError(f"`--data`: task {task!r} reads public files from a local folder; pass its path")
    if task == "image":
        return readers.read_image(data_root, grayscale=grayscale)
    return {"text": readers.read_text, "retrieval": readers.read_retrieval}[task](data_root)


def fingerprint(splits: dict[str, Split]) -> str:
    """A CRC-32 of every split's inputs, lengths and labels (hex): a run resumed on data generated again elsewhere
    checks that they are the data it started on."""
    crc = 0
    for name in sorted(splits):
        for array in (splits[name].inputs, splits[name].lengths, splits[name].labels):
            crc = zlib.crc32(memoryview(np.ascontiguousarray(array)).cast("B"), crc)
    return f"{crc:08x}"


def _listops(root, data_dir: Path, seed: int, examples: int | None, workers) -> dict[str, Split]:
    if root is not None:
        base = Path(root)
        base = next((b for b in (base / "lra_release" / "listops-1000", base / "listops-1000", base)
                     if (b / "basic_train.tsv").is_file()), None)
        if base is None:
            raise readers.MissingData(f"listops: no data under {root}; expected "
                                      "ROOT/[lra_release/]listops-1000/basic_{train,val,test}.tsv")
    else:
        sizes = dict(listops.SPLITS)
        if examples is not None:
            sizes = {"train": examples - 2 * max(1, examples // 50), "val": max(1, examples // 50),
                     "test": max(1, examples // 50)}
        base = data_dir / f"listops-seed{seed}-{'-'.join(str(v) for v in sizes.values())}"
        if not (base / "basic_test.tsv").is_file():
            listops.write_splits(base, seed, sizes, workers)
    return {split: _listops_split(base / f"basic_{split}.tsv", cache=root is None)
            for split in ("train", "val", "test")}


def _listops_split(tsv: Path, cache: bool) -> Split:
    """One split's tokens. With `cache`, kept beside the TSV in `basic_{split}.tokens.npz` (uint8, stamped with the
    TSV's size and modification time), which later loads read instead of tokenizing every expression again."""
    info = tsv.stat()
    stamp = np.array([info.st_size, info.st_mtime_ns], np.int64)
    npz = tsv.with_suffix(".tokens.npz")
    if cache and npz.is_file():
        with np.load(npz) as z:
            if np.array_equal(z["stamp"], stamp):
                return Split(z["inputs"].astype(np.int64), z["lengths"], z["labels"])
    sources, labels = listops.read_split(tsv)
    tokens = [listops.tokenize(s) for s in sources]
    lengths = np.array([len(t) for t in tokens], np.int64)
    if lengths.max(initial=0) > TASKS["listops"].max_len:
        raise ValueError(f"{tsv}: an expression has {lengths.max()} tokens, more than 2048")
    x = np.zeros((len(tokens), max(lengths.max(initial=1), 1)), np.uint8)
    for k, t in enumerate(tokens):
        x[k, : len(t)] = t
    if cache:
        tmp = npz.with_name(npz.name + ".tmp")
        try:
            with open(tmp, "wb") as f:
                np.savez(f, inputs=x, lengths=lengths, labels=labels, stamp=stamp)
            os.replace(tmp, npz)
        except OSError as e:  # a full disk: the tokens serve this run all the same
            tmp.unlink(missing_ok=True)
            warnings.warn(f"{npz}: not written ({e}); the next run tokenizes {tsv.name} again", stacklevel=2)
    return Split(x.astype(np.int64), lengths, labels)


def _pathfinder(task: str, data_dir: Path, seed: int, examples: int | None, level: str, workers) -> dict[str, Split]:
    res = 32 if task == "pathfinder" else 128
    n = examples or PATHFINDER_IMAGES
    spec = pathfinder.Spec.for_resolution(res, level)
    base = data_dir / f"pathfinder{res}-{level}-v{pathfinder.VERSION}-seed{seed}-n{n}"
    if not (base / "test.npz").is_file():
        pathfinder.write_splits(base, spec, n, seed, workers)
    out = {}
    for split in ("train", "val", "test"):
        with np.load(base / f"{split}.npz") as z:
            images, labels = z["images"], z["labels"]
        out[split] = Split(images.reshape(len(images), -1), np.full(len(images), res * res, np.int64), labels)
    return out
