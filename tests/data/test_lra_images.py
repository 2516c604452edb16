from pathlib import Path

import numpy as np
import pytest
import torch

from hgrn2.data.lra import images, readers, tasks

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "lra"


def _authors_transform(image: np.ndarray, top: int, left: int, flip: bool, pad: int = 4) -> np.ndarray:
    """torchvision's RandomCrop(size, padding=pad, padding_mode="symmetric") at offsets (top, left) — its PIL path
    pads with np.pad(mode="symmetric") — then RandomHorizontalFlip when `flip`; image [H, W, ...]."""
    widths = [(pad, pad), (pad, pad)] + [(0, 0)] * (image.ndim - 2)
    h, w = image.shape[:2]
    out = np.pad(image, widths, mode="symmetric")[top:top + h, left:left + w]
    return out[:, ::-1] if flip else out


def _crop_flip(x: np.ndarray, params: np.ndarray) -> np.ndarray:
    return images.random_crop_flip(torch.from_numpy(x), torch.from_numpy(params)).numpy()


def test_crop_and_flip_match_the_authors_transform():
    rng = np.random.default_rng(0)
    side = 6
    batch = rng.integers(0, 256, (5, side * side, 3), dtype=np.uint8)
    params = np.array([[0, 0, 0], [8, 8, 1], [4, 4, 0], [1, 7, 1], [8, 0, 1]])  # corners, identity, mixed
    got = _crop_flip(batch, params)
    assert got.shape == batch.shape and got.dtype == np.uint8
    for k, (top, left, flip) in enumerate(params):
        want = _authors_transform(batch[k].reshape(side, side, 3), top, left, bool(flip))
        assert np.array_equal(got[k].reshape(side, side, 3), want), k
    assert np.array_equal(got[2], batch[2])  # offset = padding, no flip: the image itself
    # the padding repeats the edge: shifting a 1-D ramp by 4 reads 3, 2, 1, 0, 0, 1, ...
    ramp = np.tile(np.arange(8, dtype=np.uint8), 8)[None]
    assert _crop_flip(ramp, np.array([[4, 0, 0]]))[0, :8].tolist() == [3, 2, 1, 0, 0, 1, 2, 3]
    grey = rng.integers(0, 256, (2, 64), dtype=np.uint8)
    for k, p in enumerate(images.crop_flip_params(2, seed=3, epoch=0)):
        want = _authors_transform(grey[k].reshape(8, 8), p[0], p[1], bool(p[2]))
        assert np.array_equal(_crop_flip(grey[k:k + 1], p[None])[0].reshape(8, 8), want)
    with pytest.raises(ValueError, match="square"):
        _crop_flip(grey[:, :63], params[:2])


def test_crop_flip_draws_are_seeded_per_epoch():
    a = images.crop_flip_params(4000, seed=7, epoch=2)
    assert np.array_equal(a, images.crop_flip_params(4000, seed=7, epoch=2))
    assert not np.array_equal(a, images.crop_flip_params(4000, seed=7, epoch=3))
    assert not np.array_equal(a, images.crop_flip_params(4000, seed=8, epoch=2))
    # RandomCrop's offsets are uniform on 0..8, RandomHorizontalFlip's coin fair
    assert set(np.unique(a[:, :2])) == set(range(9)) and set(np.unique(a[:, 2])) == {0, 1}
    assert abs(a[:, 2].mean() - 0.5) < 0.05 and abs(a[:, :2].mean() - 4) < 0.2


def test_colour_cifar_keeps_the_three_channels():
    colour = readers.read_image(FIX, val_fraction=0.2, grayscale=False)
    grey = readers.read_image(FIX, val_fraction=0.2)
    assert colour["train"].inputs.shape == (8, 1024, 3) and colour["test"].inputs.dtype == np.uint8
    for split in ("train", "val", "test"):
        assert np.array_equal(readers.grey(colour[split].inputs), grey[split].inputs)
        assert np.array_equal(colour[split].labels, grey[split].labels)
    # the python release's rows are 1024 red, 1024 green, 1024 blue values
    import pickle

    with open(FIX / "cifar-10-batches-py" / "test_batch", "rb") as f:
        raw = pickle.load(f, encoding="bytes")[b"data"]
    assert np.array_equal(colour["test"].inputs[1], raw[1].reshape(3, 1024).T)
    assert np.array_equal(tasks.load("image", data_root=str(FIX), grayscale=False)["test"].inputs,
                          colour["test"].inputs)
    with pytest.raises(ValueError, match="--no-grayscale"):
        tasks.load("fashion_mnist", grayscale=False)


def test_pixels_to_model_inputs():
    grey = np.array([[0, 255, 51]], np.uint8)
    assert np.allclose(images.to_float(torch.from_numpy(grey)), [[[-1.0], [1.0], [-0.6]]])
    # grey CIFAR-10: the LRA code's Normalize(mean=122.6 / 255, std=61 / 255)
    from hgrn2.data.lra.tasks import TASKS

    assert np.allclose(images.to_float(torch.from_numpy(grey), TASKS["image"].grey_norm)[0, :, 0],
                       (grey[0] - 122.6) / 61.0)
    assert TASKS["pathfinder"].grey_norm == TASKS["pathx"].grey_norm == (0.5, 0.5)
    colour = np.array([[[0, 128, 255]]], np.uint8)
    want = (np.array([0, 128, 255]) / 255 - [0.4914, 0.4822, 0.4465]) / [0.247, 0.243, 0.261]
    got = images.to_float(torch.from_numpy(colour))
    assert got.shape == (1, 1, 3) and got.dtype == torch.float32 and np.allclose(got[0, 0], want, atol=1e-6)
