"""Pathfinder (Linsley et al. 2018) and Path-X, as Long Range Arena uses them: is there a path between the two
markers? Seeded contour images generated in parallel over CPU cores.

LRA's images come from the `snakes` generator: curved contours made of short segments whose direction turns by a
bounded angle at each joint, plus distractor contours of the same length; two circular markers sit on contour ends,
both on one contour (positive) or on two different contours (negative). Difficulty is the contour length in
segments (LRA: 6 / 9 / 14, the benchmark uses 14). Pathfinder is 32×32 (1024 pixels), Path-X 128×128 (16384).

Here contours are drawn solid (one pixel wide) and kept at least one pixel apart from every other contour and
marker, so connectivity is exact on the pixel grid: a flood fill from one marker reaches the other exactly on
positives. (The snakes generator draws dashed contours; `gap` leaves that many pixels blank between segments.)
"""

from __future__ import annotations

import functools
import math
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

LEVELS = {"easy": 6, "intermediate": 9, "hard": 14}
CHUNK = 1000


@dataclass(frozen=True)
class Spec:
    """Geometry of one image family; `for_resolution` scales it from the 32×32 setting."""

    resolution: int = 32
    segments: int = 14
    segment_length: float = 1.5
    max_turn: float = math.pi / 4
    distractors: int = 1
    marker_radius: float = 1.5
    gap: int = 0

    @classmethod
    def for_resolution(cls, resolution: int, level: str = "hard", **kw) -> Spec:
        if level not in LEVELS:
            raise ValueError(f"`level`: expected one of {sorted(LEVELS)}, got {level!r}")
        s = resolution / 32
        base = dict(resolution=resolution, segments=LEVELS[level], segment_length=1.5 * s,
                    distractors=max(1, round(1.5 * s) - 1), marker_radius=1.5 * s)
        return cls(**{**base, **kw})


def _disc(center: np.ndarray, radius: float) -> np.ndarray:
    """Pixels [n, 2] within `radius` of the pixel nearest to `center`."""
    return np.rint(center).astype(np.int64) + _disc_offsets(radius)


@functools.lru_cache(maxsize=8)
def _disc_offsets(radius: float) -> np.ndarray:
    """The offsets [n, 2] within `radius` of a pixel (one array per radius: every image draws the same discs)."""
    r = int(math.ceil(radius))
    d = np.stack(np.meshgrid(np.arange(-r, r + 1), np.arange(-r, r + 1), indexing="ij"), -1).reshape(-1, 2)
    d = d[(d ** 2).sum(1) <= radius ** 2]
    d.flags.writeable = False
    return d


@functools.lru_cache(maxsize=8)
def _fractions(per: int) -> np.ndarray:
    """[per] points of a segment, 0 to 1 (excluded): `np.linspace(0, 1, per, endpoint=False)`, made once."""
    t = np.linspace(0, 1, per, endpoint=False)
    t.flags.writeable = False
    return t


def _contour(rng: np.random.Generator, spec: Spec) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Pixels [n, 2] of one random contour (8-connected: sampled every half pixel or finer) and its ends, or None."""
    S, n = spec.resolution, spec.segments
    margin = spec.marker_radius + 1
    turns = np.concatenate([[rng.uniform(0, 2 * math.pi)], rng.uniform(-spec.max_turn, spec.max_turn, n - 1)])
    theta = np.cumsum(turns)
    steps = spec.segment_length * np.stack([np.sin(theta), np.cos(theta)], 1)
    joints = np.zeros((n + 1, 2))
    np.cumsum(steps, 0, out=joints[1:])
    joints -= joints.min(0)
    room = S - 1 - 2 * margin - joints.max(0)
    if (room < 0).any():
        return None
    # a uniformly random placement among those that keep the contour inside the margins
    joints += margin + rng.uniform(0, 1, size=2) * room
    per = max(2, int(math.ceil(spec.segment_length * 2)))
    t = _fractions(per)
    pts = joints[:-1, None, :] + t[None, :, None] * steps[:, None, :]
    if spec.gap:
        pts[1:, : spec.gap * 2] = np.nan
    pts = np.concatenate([pts.reshape(-1, 2), joints[-1:]])
    if spec.gap:
        pts = pts[~np.isnan(pts[:, 0])]
    # repeated pixels are harmless (drawing and the collision test are idempotent), so they are not removed
    return np.rint(pts).astype(np.int64), joints[0], joints[-1]


def _fits(pixels: np.ndarray, occupied: np.ndarray) -> bool:
    """No pixel on or 8-adjacent to an occupied pixel (occupied is the dilated ink of the other contours)."""
    return not occupied[pixels[:, 0] + 1, pixels[:, 1] + 1].any()


def _occupy(occupied: np.ndarray, pixels: np.ndarray) -> None:
    ys, xs = pixels.T
    for dy in (0, 1, 2):
        for dx in (0, 1, 2):
            occupied[ys + dy, xs + dx] = True


def draw(rng: np.random.Generator, spec: Spec, positive: bool, tries: int = 200) -> tuple[np.ndarray, np.ndarray]:
    """One uint8 image [S, S] (0 background, 255 ink) and its two marker centres [2, 2] (row, column)."""
    S = spec.resolution
    for _ in range(tries):
        img = np.zeros((S, S), np.uint8)
        occupied = np.zeros((S + 2, S + 2), bool)
        ends = []
        for c in range(2 + spec.distractors):
            for _ in range(tries):
                got = _contour(rng, spec)
                if got is None:
                    continue
                pixels, a, b = got
                # the contours that carry markers need room for their discs too
                room = pixels
                if c < 2:
                    room = np.concatenate([pixels, _disc(a, spec.marker_radius), _disc(b, spec.marker_radius)])
                if _fits(room, occupied):
                    break
            else:
                break
            _occupy(occupied, room)
            img[pixels[:, 0], pixels[:, 1]] = 255
            ends.append((a, b))
        else:
            markers = (ends[0][0], ends[0][1]) if positive else (ends[0][0], ends[1][0])
            for m in markers:
                disc = _disc(m, spec.marker_radius)
                img[disc[:, 0], disc[:, 1]] = 255
            return img, np.rint(np.array(markers)).astype(np.int64)
    raise RuntimeError(f"pathfinder: could not place {2 + spec.distractors} contours in {S}x{S} after {tries} tries")


def _chunk(args) -> tuple[np.ndarray, np.ndarray]:
    spec, seed, index, count = args
    rng = np.random.default_rng([seed, index])
    labels = rng.integers(0, 2, size=count)
    return np.stack([draw(rng, spec, bool(y))[0] for y in labels]), labels.astype(np.int64)


def generate(n: int, spec: Spec, seed: int = 0, workers: int | None = None, progress: bool = True
             ) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 [n, S, S], labels int64 [n]); chunk k draws from default_rng([seed, k]) whatever `workers`."""
    jobs = [(spec, seed, k, min(CHUNK, n - k * CHUNK)) for k in range((n + CHUNK - 1) // CHUNK)]
    with ProcessPoolExecutor(workers or os.cpu_count() or 1) as pool:
        parts = list(tqdm(pool.map(_chunk, jobs), total=len(jobs), desc=f"Pathfinder {spec.resolution}",
                          disable=not progress, leave=False))
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def write_splits(directory: str | Path, spec: Spec, n: int, seed: int = 0, workers: int | None = None,
                 fractions: tuple[float, float] = (0.1, 0.1)) -> Path:
    """Generate n images and write `{train,val,test}.npz` (images, labels) under `directory`, atomically.
    Validation and test take `fractions` of n (the LRA code's 80/10/10 split)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    images, labels = generate(n, spec, seed, workers)
    n_val, n_test = (int(n * f) for f in fractions)
    bounds = {"train": (0, n - n_val - n_test), "val": (n - n_val - n_test, n - n_test), "test": (n - n_test, n)}
    for split, (a, b) in bounds.items():
        path = directory / f"{split}.npz"
        with open(str(path) + ".tmp", "wb") as f:
            np.savez(f, images=images[a:b], labels=labels[a:b])
        os.replace(str(path) + ".tmp", path)
    return directory


def connected(img: np.ndarray, a, b) -> bool:
    """Whether pixels a and b (row, column) lie in one 8-connected component of the ink (a flood fill)."""
    from collections import deque

    ink = img > 0
    S = ink.shape[0]
    a, b = tuple(int(v) for v in a), tuple(int(v) for v in b)
    if not (ink[a] and ink[b]):
        raise ValueError(f"`a`, `b`: both must be ink pixels, got {a} and {b}")
    seen = np.zeros_like(ink)
    queue = deque([a])
    seen[a] = True
    while queue:
        y, x = queue.popleft()
        for dy in (-1, 0, 1):
            for dx in (-1, 0, 1):
                v, u = y + dy, x + dx
                if 0 <= v < S and 0 <= u < S and ink[v, u] and not seen[v, u]:
                    seen[v, u] = True
                    queue.append((v, u))
    return bool(seen[b])
