"""Pathfinder (Linsley et al. 2018) and Path-X, as Long Range Arena uses them: are the two markers on one contour?
Seeded images generated in parallel over CPU cores.

LRA's images come from the `snakes2` generator (github.com/drewlinsley/pathfinder, Kim et al. 2020), run by
`snakes2_wrapper.py` for its `curv_contour_length_{6,9,14}` sets, directly at each output resolution with the
parameters LRA lists per resolution (google-research/long-range-arena `lra_benchmarks/data/pathfinder.py`; the
`Spec.for_resolution` table). This module follows that construction:

- a contour ("snake") is a chain of paddles, straight bars `paddle_length` × `paddle_thickness`. Consecutive
  paddles are joined through a pivot that lies `margin` beyond the end of one paddle and `margin` before the start
  of the next, so they are 2·margin apart. The next paddle's direction is drawn from candidates spaced one pixel of
  arc apart (at radius paddle_length + margin) with weight cos²(min(continuity·|turn|, π/2)): with continuity 1.8
  a joint turns by less than π / 3.6 = 50°, and small turns are favoured;
- the candidate's far end must lie about 2·margin from the ink of the other paddles (snakes2 weights its
  candidates by a mask dilated twice by `margin`). Up to `paddle_tries` candidates are then drawn, and the first
  whose ink keeps about 2·margin from every paddle but the snake's previous one, and `margin` from the `padding`
  frame, is taken (snakes2: the paddle's mask dilated by `margin` must not overlap the accumulated dilated masks);
- two target snakes of `contour_length` paddles start `seed_distance` apart (the first paddle inside the window
  less 2·seed_distance at each edge) and grow in turns; if either cannot grow, both are drawn again;
- then `num_distractor_snakes` snakes of `distractor_length` paddles, each started at a uniformly random place
  where its first paddle fits and retried up to `distractor_tries` times, else left out;
- markers are discs of `marker_radius` drawn over everything: one at the start of a random target snake and one at
  the end of the same snake (label 1) or of the other target snake (label 0). Labels are exact by construction;
- paddles are drawn at intensity `paddle_contrast` (snakes2's snake contrast × paddle contrast), markers at 1; the
  image is their pixel-wise maximum scaled so that its maximum is 255 (what scipy's `imsave` did to snakes2's
  floats).

snakes2_wrapper computes the distractor count once, with the contour length its settings start from (14 in LRA's
lists), and does not update it in its loop over lengths, so every level has the same count; in Python 2, as it
ran, 20 // (14 / 3) = 5 at 32 px and 35 / (14 / 3) = 8 at 128 px.

Our choices, not snakes2's: geometry is computed exactly on continuous coordinates instead of on dilated raster
masks at integer pixels, at the distances where snakes2's raster test passes (`SLACK`); paddle ink clearance is
checked against every other paddle, including the other target snake's newest one, which snakes2's masks miss; and
paddles and markers are drawn with box-filtered coverage on a canvas `supersample` (snakes2's antialias scale)
times finer than the output and area-averaged down, where snakes2 resizes with a Lanczos filter.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

LEVELS = {"easy": 6, "intermediate": 9, "hard": 14}
VERSION = 3  # in the cache folder's name: raised whenever the same seed would draw different images
CHUNK = 1000
SEED_BATCH = 16  # distractor starts tried at once (rejection sampling of snakes2's uniform draw over free places)
# snakes2 keeps paddles apart on raster masks: each paddle dilated by `margin`, Lanczos-resized to the output, and a
# placement refused where two masks sum to 1.8. Drawn as it draws them (at 32 and 128 px, parallel and diagonal
# pairs, and against the padding frame), that test refuses centre lines 2·margin + thickness − 1.5 px apart or
# closer and passes them from 2·margin + thickness − 0.5 px: the exact distances here are snakes2's less SLACK
SLACK = 1.0


# LRA's parameters for Pathfinder (32 px) and Path-X (128 px), from its TFDS builders' docstrings; the rest are
# snakes2_wrapper's defaults
LRA = {
    32: dict(padding=1.0, paddle_length=2.0, paddle_thickness=0.5, margins=(1.0,), marker_radius=1.5,
             seed_distance=7.0, continuity=1.0, supersample=2, num_distractor_snakes=5, paddle_contrast=1.5),
    128: dict(padding=1.0, paddle_length=5.0, paddle_thickness=1.5, margins=(2.0, 3.0),
              marker_radius=3.0, seed_distance=20.0, continuity=1.8, supersample=2, num_distractor_snakes=8,
              paddle_contrast=0.9),
}


@dataclasses.dataclass(frozen=True)
class Spec:
    """One image family. Lengths are in pixels of the output image."""

    resolution: int = 32
    supersample: int = 2
    contour_length: int = 14
    distractor_length: int = 4
    num_distractor_snakes: int = 5
    paddle_length: float = 2.0
    paddle_thickness: float = 0.5
    margin: float = 1.0
    margins: tuple[float, ...] = ()  # snakes2's paddle_margin_list: when given, each image draws `margin` from it
    continuity: float = 1.0
    seed_distance: float = 7.0
    marker_radius: float = 1.5
    padding: float = 1.0
    paddle_contrast: float = 1.5
    paddle_tries: int = 3  # snakes2 max_paddle_retrial = 2 retries
    distractor_tries: int = 5  # snakes2 max_distractor_contour_retrial = 4 retries

    def __post_init__(self):
        # a crossing of two paddles leaves an end within paddle_length / 2 of the other, which the clearance test
        # then catches: this is what lets it compare end-to-segment distances only
        for m in self.margins or (self.margin,):
            if self.paddle_length / 2 >= 2 * m + self.paddle_thickness - SLACK:
                raise ValueError(f"`paddle_length`: expected < 2 * (2 * margin + paddle_thickness - {SLACK}), got "
                                 f"{self.paddle_length} with margin {m}")
        if self.continuity <= 0:
            raise ValueError(f"`continuity`: expected > 0, got {self.continuity}")

    @classmethod
    def for_resolution(cls, resolution: int, level: str = "hard", **kw) -> Spec:
        if level not in LEVELS:
            raise ValueError(f"`level`: expected one of {sorted(LEVELS)}, got {level!r}")
        if resolution not in LRA:
            raise ValueError(f"`resolution`: expected one of {sorted(LRA)} (LRA's sets), got {resolution}")
        n = LEVELS[level]
        lra = LRA[resolution]
        base = dict(lra, resolution=resolution, margin=lra["margins"][0], contour_length=n, distractor_length=n // 3)
        if len(lra["margins"]) == 1:
            base["margins"] = ()
        return cls(**{**base, **kw})


@dataclasses.dataclass(frozen=True)
class Drawing:
    """How one image was built. `snakes[s]` holds snake s's paddles as [n, 2 (start, end), 2 (row, column)] in
    output pixels (continuous: pixel (i, j) spans [i, i+1) × [j, j+1)), the two targets first; `markers` are the
    marker centres [2, 2] (row, column); `tips[k] = (snake, end)` says which tip marker k sits on, end 0 being the
    start of the snake's first paddle and 1 the end of its last; `margin` is the paddle margin the image drew."""

    label: int
    markers: np.ndarray
    tips: tuple[tuple[int, int], tuple[int, int]]
    snakes: tuple[np.ndarray, ...]
    margin: float


@dataclasses.dataclass(frozen=True)
class _Geometry:
    L: float
    clear2: float  # squared centre-line distance that snakes2's raster test asks of two paddles' (SLACK)
    head_clear2: float  # squared distance from a candidate's far end to other centre lines that snakes2 weights out
    box: tuple[float, float]  # where paddle centre lines may lie (ink `margin` clear of the padding frame)
    head_box: tuple[float, float]
    near: float  # pivot-to-midpoint distance beyond which a placed paddle cannot touch a candidate
    rotations: np.ndarray  # e^{i·turn} of the candidate turns
    weights: np.ndarray
    back: int  # how many of a snake's newest paddles a candidate cannot touch whatever the turns: not checked


@functools.lru_cache(maxsize=16)
def _geometry(spec: Spec) -> _Geometry:
    L, t, m = spec.paddle_length, spec.paddle_thickness, spec.margin
    lo, hlo = spec.padding + m + t / 2 - SLACK, spec.padding + m - SLACK
    clear = 2 * m + t - SLACK
    # candidate turns one pixel of arc apart at the pivot-to-far-end radius, as snakes2 samples its circle
    step = 1 / (L + m)
    k = math.ceil(min(math.pi / (2 * spec.continuity), math.pi) / step)  # snakes2's turns are at most π
    turns = step * np.arange(-k, k + 1)
    weights = np.cos(np.minimum(spec.continuity * np.abs(turns), math.pi / 2)) ** 2
    turns, weights = turns[weights > 1e-12], weights[weights > 1e-12]
    # the paddle two back is skipped too when no pair of allowed turns brings it within the clearance
    u1 = np.exp(1j * turns)[:, None]
    u2 = u1 * np.exp(1j * turns)[None, :]
    p2 = (L + 2 * m) * u1
    two_back = _segment2(np.complex128(-(m + L)), np.complex128(-m), p2 + m * u2, p2 + (m + L) * u2, L * L)
    back = 2 if two_back.min() >= clear ** 2 else 1
    S = spec.resolution
    return _Geometry(L, clear ** 2, (2 * m + t / 2 - SLACK) ** 2, (lo, S - lo), (hlo, S - hlo), m + L / 2 + L + clear,
                     np.exp(1j * turns), weights, back)


def _inside(z: np.ndarray, box: tuple[float, float]) -> np.ndarray:
    lo, hi = box
    return (z.real >= lo) & (z.real <= hi) & (z.imag >= lo) & (z.imag <= hi)


def _point_segment2(p: np.ndarray, a: np.ndarray, d: np.ndarray, L2: float) -> np.ndarray:
    """Squared distance from points p to segments a → a + d (|d|² = L2), broadcast; points are complex x + iy."""
    q = p - a
    r = q - np.minimum(np.maximum((q * d.conj()).real * (1 / L2), 0.0), 1.0) * d
    return r.real ** 2 + r.imag ** 2


def _segment2(a1, b1, a2, b2, L2: float) -> np.ndarray:
    """Squared distance between segments a1b1 and a2b2 (broadcast), from their ends: exact unless they cross."""
    d1, d2 = b1 - a1, b2 - a2
    return np.minimum(np.minimum(_point_segment2(a1, a2, d2, L2), _point_segment2(b1, a2, d2, L2)),
                      np.minimum(_point_segment2(a2, a1, d1, L2), _point_segment2(b2, a1, d1, L2)))


class _Scene:
    """Paddles placed so far (complex x + iy centre-line ends, output pixels) and the snake of each."""

    def __init__(self, spec: Spec):
        cap = 2 * spec.contour_length + spec.num_distractor_snakes * spec.distractor_length
        self.start = np.zeros(cap, complex)
        self.end = np.zeros(cap, complex)
        self.mid = np.zeros(cap, complex)
        self.snake = np.zeros(cap, np.int64)
        self.n = 0

    def add(self, a: complex, b: complex, snake: int) -> int:
        i = self.n
        self.start[i], self.end[i], self.mid[i], self.snake[i] = a, b, (a + b) / 2, snake
        self.n += 1
        return i


def _blocked(g: _Geometry, scene: _Scene, starts: np.ndarray, ends: np.ndarray, near: np.ndarray) -> np.ndarray:
    """Which candidate paddles [k] come closer than the clearance to the placed paddles `near` (indices)."""
    if near.size == 0:
        return np.zeros(len(starts), bool)
    d2 = _segment2(starts[:, None], ends[:, None], scene.start[near][None], scene.end[near][None], g.L ** 2)
    return (d2 < g.clear2).any(1)


def _extend(rng: np.random.Generator, g: _Geometry, spec: Spec, scene: _Scene, own: list[int]):
    """The next paddle (start, end) of the snake whose paddles are `own` (indices), or None when no drawn
    candidate fits."""
    last = own[-1]
    d = scene.end[last] - scene.start[last]
    pivot = scene.end[last] + d * (spec.margin / g.L)
    u = g.rotations * (d / g.L)
    starts = pivot + spec.margin * u
    ends = starts + g.L * u
    reach = g.L + spec.margin
    lo, hi = g.box
    if lo + reach <= pivot.real <= hi - reach and lo + reach <= pivot.imag <= hi - reach:
        w, ok = g.weights, np.ones(len(u), bool)  # every candidate lies inside the box
    else:
        w = g.weights * _inside(ends, g.head_box)
        ok = _inside(starts, g.box) & _inside(ends, g.box)
    n = scene.n
    close = np.abs(scene.mid[:n] - pivot) < g.near
    close[own[-g.back:]] = False  # the newest paddles of this snake cannot be touched (`back`)
    near = np.flatnonzero(close)
    if near.size:
        a, b = scene.start[near], scene.end[near]
        k = len(u)
        # the candidates' ends against the placed centre lines, and the placed ends against the candidates
        e2 = _point_segment2(np.concatenate([starts, ends])[:, None], a[None], (b - a)[None], g.L ** 2)
        p2 = _point_segment2(np.concatenate([a, b])[None], starts[:, None], (g.L * u)[:, None], g.L ** 2)
        w = w * (e2[k:] > g.head_clear2).all(1)
        ok = ok & (e2 >= g.clear2).reshape(2, k, -1).all((0, 2)) & (p2 >= g.clear2).all(1)
    cum = np.cumsum(w)
    if cum[-1] <= 0:
        return None
    picks = np.minimum(np.searchsorted(cum, rng.random(spec.paddle_tries) * cum[-1], side="right"), len(w) - 1)
    good = ok[picks]
    if not good.any():
        return None
    j = picks[np.argmax(good)]
    return starts[j], ends[j]


def _seed(rng: np.random.Generator, g: _Geometry, spec: Spec, scene: _Scene):
    """A distractor's first paddle (start, end) at a uniformly random free place, or None."""
    lo, hi = g.box
    for _ in range(spec.paddle_tries):
        heading = rng.uniform(-math.pi, math.pi)
        d = g.L * complex(math.cos(heading), math.sin(heading))
        # starts whose paddle lies inside the box, uniformly; the ones that touch other paddles are rejected
        x0, x1 = lo - min(0.0, d.real), hi - max(0.0, d.real)
        y0, y1 = lo - min(0.0, d.imag), hi - max(0.0, d.imag)
        r = rng.random((2, SEED_BATCH))
        starts = x0 + r[0] * (x1 - x0) + 1j * (y0 + r[1] * (y1 - y0))
        ends = starts + d
        mids = starts + d / 2
        n = scene.n
        # two paddles within the clearance have midpoints within a paddle length plus the clearance
        close = np.abs(mids[:, None] - scene.mid[None, :n]) ** 2 < (g.L + 2 * spec.margin + spec.paddle_thickness) ** 2
        ci, pj = np.nonzero(close)
        ok = np.ones(SEED_BATCH, bool)
        if ci.size:
            d2 = _segment2(starts[ci], ends[ci], scene.start[pj], scene.end[pj], g.L ** 2)
            ok[ci[d2 < g.clear2]] = False
        if ok.any():
            j = int(np.argmax(ok))
            return starts[j], ends[j]
    return None


def _targets(rng: np.random.Generator, g: _Geometry, spec: Spec, scene: _Scene) -> bool:
    """Place the two target snakes (snakes 0 and 1); False when they must be drawn again."""
    sd = spec.seed_distance
    heading = rng.uniform(-math.pi, math.pi)
    d = g.L * complex(math.cos(heading), math.sin(heading))
    # the first paddle lies at least 2·seed_distance from each edge (snakes2 masks that frame before seeding)
    x0, x1 = 2 * sd - min(0.0, d.real), spec.resolution - 2 * sd - max(0.0, d.real)
    y0, y1 = 2 * sd - min(0.0, d.imag), spec.resolution - 2 * sd - max(0.0, d.imag)
    if x1 < x0 or y1 < y0:
        return False
    r = rng.random(2)
    start = x0 + r[0] * (x1 - x0) + 1j * (y0 + r[1] * (y1 - y0))
    own = [[scene.add(start, start + d, 0)], []]
    for _ in range(spec.paddle_tries):
        a, heading2 = rng.uniform(-math.pi, math.pi, 2)
        s2 = start + sd * complex(math.cos(a), math.sin(a))
        e2 = s2 + g.L * complex(math.cos(heading2), math.sin(heading2))
        if _inside(np.array([s2, e2]), g.box).all() and not _blocked(g, scene, np.array([s2]), np.array([e2]),
                                                                     np.arange(scene.n))[0]:
            own[1].append(scene.add(s2, e2, 1))
            break
    else:
        return False
    for _ in range(spec.contour_length - 1):
        for s in (0, 1):  # the two snakes grow in turns, as snakes2's two_snakes
            got = _extend(rng, g, spec, scene, own[s])
            if got is None:
                return False
            own[s].append(scene.add(got[0], got[1], s))
    return True


def _distractors(rng: np.random.Generator, g: _Geometry, spec: Spec, scene: _Scene) -> None:
    snake = 2
    for _ in range(spec.num_distractor_snakes):
        for _ in range(spec.distractor_tries):
            mark = scene.n
            got = _seed(rng, g, spec, scene)
            own = []
            for _ in range(spec.distractor_length - 1):
                if got is None:
                    break
                own.append(scene.add(got[0], got[1], snake))
                got = _extend(rng, g, spec, scene, own)
            if got is not None:
                scene.add(got[0], got[1], snake)
                snake += 1
                break
            scene.n = mark  # snakes2 drops a snake that cannot be completed


def _coverage(spec: Spec, starts: np.ndarray, ends: np.ndarray):
    """Canvas pixels (rows, columns) [n, B, B] around each paddle and the fraction of each the paddle covers."""
    k = spec.supersample
    L, h = spec.paddle_length * k, spec.paddle_thickness * k / 2
    r = math.ceil(L / 2 + h + 1)
    a, b = starts * k, ends * k
    u = (b - a) / L
    mid = (a + b) / 2
    off = np.arange(-r, r + 1)
    cols = np.floor(mid.real).astype(np.int64)[:, None, None] + off[None, None, :]
    rows = np.floor(mid.imag).astype(np.int64)[:, None, None] + off[None, :, None]
    # pixel centres in the paddle's frame: along its length and across it
    w = ((cols + 0.5) + 1j * (rows + 0.5) - a[:, None, None]) * np.conj(u)[:, None, None]
    along = np.clip(np.minimum(L, w.real + 0.5) - np.maximum(0.0, w.real - 0.5), 0, 1)
    across = np.clip(np.minimum(h, w.imag + 0.5) - np.maximum(-h, w.imag - 0.5), 0, 1)
    # a box filter's coverage in the paddle's frame: exact for axis-aligned paddles, close otherwise
    return rows, cols, along * across


def _disc_coverage(spec: Spec, centres: np.ndarray):
    k = spec.supersample
    R = spec.marker_radius * k
    r = math.ceil(R + 1)
    off = np.arange(-r, r + 1)
    c = centres * k
    cols = np.floor(c.real).astype(np.int64)[:, None, None] + off[None, None, :]
    rows = np.floor(c.imag).astype(np.int64)[:, None, None] + off[None, :, None]
    dist = np.abs((cols + 0.5) + 1j * (rows + 0.5) - c[:, None, None])
    return rows, cols, np.clip(R + 0.5 - dist, 0, 1)


def _canvas(spec: Spec, parts, layers: np.ndarray | None = None, n_layers: int = 1) -> np.ndarray:
    """Pixel-wise maximum of coverages on the supersampled canvas [n_layers, C, C] (layer per shape: `layers`)."""
    C = spec.resolution * spec.supersample
    pad = 2 + math.ceil((spec.paddle_length + spec.paddle_thickness + 2 * spec.marker_radius)
                        * spec.supersample)
    out = np.zeros((n_layers, C + 2 * pad, C + 2 * pad))
    for i, (rows, cols, cov) in enumerate(parts):
        lay = 0 if layers is None else np.broadcast_to(layers[i][:, None, None], cov.shape)
        np.maximum.at(out, (lay, rows + pad, cols + pad), cov)
    return out[:, pad:pad + C, pad:pad + C]


def _render(spec: Spec, scene: _Scene, markers: np.ndarray) -> np.ndarray:
    n = scene.n
    rows, cols, cov = _coverage(spec, scene.start[:n], scene.end[:n])
    canvas = _canvas(spec, [(rows, cols, cov * spec.paddle_contrast), _disc_coverage(spec, markers)])[0]
    S, f = spec.resolution, spec.supersample
    img = canvas.reshape(S, f, S, f).mean((1, 3))
    return np.rint(img * (255 / img.max())).astype(np.uint8)


def ink_masks(spec: Spec, drawing: Drawing) -> np.ndarray:
    """Each snake's ink on the supersampled canvas, bool [snakes, C, C] (C = resolution × supersample; a pixel is
    ink where the paddle covers any of it; markers left out): what the margin between snakes is checked on."""
    starts, ends, layers = [], [], []
    for s, p in enumerate(drawing.snakes):
        z = p[..., 1] + 1j * p[..., 0]
        starts.append(z[:, 0])
        ends.append(z[:, 1])
        layers.append(np.full(len(p), s))
    part = _coverage(spec, np.concatenate(starts), np.concatenate(ends))
    return _canvas(spec, [part], [np.concatenate(layers)], len(drawing.snakes)) > 0


def draw(rng: np.random.Generator, spec: Spec, positive: bool, tries: int = 100_000) -> tuple[np.ndarray, Drawing]:
    """One uint8 image [S, S] (0 background, maximum 255) and how it was built."""
    if spec.margins:
        spec = dataclasses.replace(spec, margin=spec.margins[int(rng.integers(len(spec.margins)))], margins=())
    g = _geometry(spec)
    for _ in range(tries):
        scene = _Scene(spec)
        if _targets(rng, g, spec, scene):
            break
    else:
        raise RuntimeError(f"pathfinder: no two target snakes of {spec.contour_length} paddles after {tries} tries")
    _distractors(rng, g, spec, scene)
    n = scene.n
    snakes = []
    for s in range(int(scene.snake[:n].max()) + 1):
        idx = np.flatnonzero(scene.snake[:n] == s)
        z = np.stack([scene.start[idx], scene.end[idx]], 1)
        snakes.append(np.stack([z.imag, z.real], -1))
    first = int(rng.integers(0, 2))
    tips = ((first, 0), (first if positive else 1 - first, 1))
    centres = np.array([snakes[s][0, 0] if end == 0 else snakes[s][-1, 1] for s, end in tips])
    zc = centres[:, 1] + 1j * centres[:, 0]
    img = _render(spec, scene, zc)
    return img, Drawing(int(positive), centres, tips, tuple(snakes), spec.margin)


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
