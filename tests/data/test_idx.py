"""The idx reader (gzipped and plain files, bad and truncated ones) and the Fashion-MNIST files it finds."""

import gzip
import struct

import numpy as np
import pytest

from hgrn2.data.idx import find_fashion_mnist, read_fashion_mnist_split, read_idx


def write_idx(path, array: np.ndarray) -> None:
    raw = bytes([0, 0, 8, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape) + array.astype(np.uint8).tobytes()
    if str(path).endswith(".gz"):
        with gzip.open(path, "wb") as f:
            f.write(raw)
    else:
        path.write_bytes(raw)


def test_round_trip_gzipped_and_plain(tmp_path):
    a = np.arange(2 * 3 * 4).reshape(2, 3, 4) % 256
    for name in ("x.gz", "x"):
        write_idx(tmp_path / name, a)
        np.testing.assert_array_equal(read_idx(tmp_path / name), a)


def test_bad_and_truncated_files_are_named(tmp_path):
    (tmp_path / "bad").write_bytes(b"\x00\x00\x0d\x01\x00\x00\x00\x01\x00")
    with pytest.raises(ValueError, match="bad is not an idx file"):
        read_idx(tmp_path / "bad")
    (tmp_path / "short").write_bytes(bytes([0, 0, 8, 1]) + struct.pack(">I", 5) + b"abc")
    with pytest.raises(ValueError, match="truncated"):
        read_idx(tmp_path / "short")
    (tmp_path / "header").write_bytes(bytes([0, 0, 8, 3, 0, 0]))
    with pytest.raises(ValueError, match="header"):
        read_idx(tmp_path / "header")


def test_fashion_mnist_files_mixed_gzipped_and_plain(tmp_path):
    rng = np.random.default_rng(0)
    for prefix, n in (("train", 6), ("t10k", 4)):
        write_idx(tmp_path / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 5, 5)))
        write_idx(tmp_path / f"{prefix}-labels-idx1-ubyte", np.arange(n) % 10)
    images, labels = read_fashion_mnist_split(tmp_path, "test")
    assert images.shape == (4, 5, 5) and labels.tolist() == [0, 1, 2, 3]
    (tmp_path / "t10k-labels-idx1-ubyte").unlink()
    assert find_fashion_mnist(tmp_path) is None
    with pytest.raises(FileNotFoundError, match="t10k-labels-idx1-ubyte"):
        read_fashion_mnist_split(tmp_path, "train")
