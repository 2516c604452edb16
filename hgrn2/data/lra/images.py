"""Pixel tasks' inputs: uint8 pixels to model floats, and the image task's training augmentation.

The augmentation is the LRA code's for CIFAR-10 (OpenNLPLab/lra `src/dataloaders/datasets.py`, `augment=True`):
torchvision's `RandomCrop(32, padding=4, padding_mode="symmetric")` then `RandomHorizontalFlip()`, here as index
arithmetic on a batch of tensors (on the training device: batches are gathered there). Its draws come from (seed,
epoch) per training example, so a resumed epoch sees the same crops and flips.
"""

from __future__ import annotations

import math

import numpy as np
import torch

PAD = 4  # RandomCrop's padding
# torchvision's Normalize constants in the LRA code's colour CIFAR-10 (per channel, on pixels / 255)
CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.247, 0.243, 0.261)


def to_float(x: torch.Tensor, grey_norm: tuple[float, float] = (0.5, 0.5)) -> torch.Tensor:
    """float32 [B, T, C] model inputs of uint8 pixels, as the LRA code's ToTensor then Normalize: grey [B, T] with
    `grey_norm`'s (mean, std) of pixels / 255 (C = 1; the default maps to [−1, 1]); colour [B, T, 3] per channel
    with CIFAR_MEAN and CIFAR_STD."""
    if x.ndim == 2:
        mean, std = grey_norm
        return ((x.float() / 255.0 - mean) / std)[..., None]
    # per channel with Python scalars: a constant tensor would be a host-to-device copy on every batch
    return torch.stack([(x[..., c].float() / 255.0 - m) / s for c, (m, s) in enumerate(zip(CIFAR_MEAN, CIFAR_STD))],
                       -1)


def crop_flip_params(n: int, seed: int, epoch: int, pad: int = PAD) -> np.ndarray:
    """int64 [n, 3] per training example: the crop's row and column offsets into the padded image (each uniform in
    0..2·pad, as RandomCrop's) and the flip (1 with probability 1/2); a function of (seed, epoch) alone."""
    rng = np.random.default_rng([seed, epoch, 1])  # 1: a stream apart from the data order's ([seed, epoch])
    return np.concatenate([rng.integers(0, 2 * pad + 1, (n, 2)), rng.integers(0, 2, (n, 1))], 1)


def _symmetric(p: torch.Tensor, n: int) -> torch.Tensor:
    """Source index of position p (−n ≤ p < 2n) along an axis of n padded symmetrically (edge repeated: np.pad's
    and torchvision's "symmetric")."""
    return torch.where(p < 0, -p - 1, torch.where(p >= n, 2 * n - 1 - p, p))


def random_crop_flip(images: torch.Tensor, params: torch.Tensor, pad: int = PAD) -> torch.Tensor:
    """`images` [B, S², ...] (row-major S × S grids, any trailing channels), each cropped back to S × S from its
    symmetric `pad`-pixel padding at offsets params[:, :2], then mirrored left–right where params[:, 2] is 1
    (`params` int64 [B, 3] on the images' device)."""
    B, T = images.shape[:2]
    side = math.isqrt(T)
    if side * side != T or pad > side:
        raise ValueError(f"`images`: expected square images of at least {pad}×{pad} pixels, got {T} pixels")
    offsets = torch.arange(side, device=images.device)[None]
    rows = _symmetric(offsets + params[:, :1] - pad, side)
    cols = _symmetric(offsets + params[:, 1:2] - pad, side)
    cols = torch.where(params[:, 2:3] == 1, cols.flip(1), cols)
    grid = images.reshape(B, side, side, *images.shape[2:])
    batch = torch.arange(B, device=images.device)[:, None, None]
    return grid[batch, rows[:, :, None], cols[:, None, :]].reshape(images.shape)
