import math

import numpy as np
import pytest

from hgrn2.data.lra import pathfinder as pf


def _drawings(resolution, level, count, seed):
    spec = pf.Spec.for_resolution(resolution, level)
    rng = np.random.default_rng(seed)
    return spec, [pf.draw(rng, spec, bool(k % 2)) for k in range(count)]


def _segment_distances(seg):
    """[n, n] distances between segments seg [n, 2 (ends), 2]: ends to segments, 0 where two cross (written apart
    from the module, which leaves out the crossing test)."""
    def to_segment(p, a, b):  # p [n, 1, 2] to segments a → b [1, n, 2]
        d = b - a
        s = np.clip(((p - a) * d).sum(-1) / (d * d).sum(-1), 0, 1)[..., None]
        return np.linalg.norm(p - a - s * d, axis=-1)

    a, b = seg[:, 0], seg[:, 1]
    dist = np.minimum.reduce([to_segment(a[:, None], a[None], b[None]), to_segment(b[:, None], a[None], b[None]),
                              to_segment(a[None], a[:, None], b[:, None]), to_segment(b[None], a[:, None], b[:, None])])

    def side(p, q, r):  # sign of the turn p → q → r
        (u, v), (w, z) = np.moveaxis(q - p, -1, 0), np.moveaxis(r - p, -1, 0)
        return np.sign(u * z - v * w)

    A, B, C, D = a[:, None], b[:, None], a[None], b[None]
    cross = (side(A, B, C) * side(A, B, D) < 0) & (side(C, D, A) * side(C, D, B) < 0)
    return np.where(cross, 0.0, dist)


@pytest.mark.parametrize("resolution,count", [(32, 24), (128, 6)])
def test_images_are_grey_uint8_with_maximum_255(resolution, count):
    _, drawn = _drawings(resolution, "hard", count, resolution)
    for img, _ in drawn:
        assert img.shape == (resolution, resolution) and img.dtype == np.uint8
        assert img.min() == 0 and img.max() == 255
        assert len(np.unique(img)) > 8  # antialiased grey levels, not a binary drawing


@pytest.mark.parametrize("resolution,count", [(32, 40), (128, 8)])
def test_markers_sit_on_target_tips_by_label(resolution, count):
    spec, drawn = _drawings(resolution, "hard", count, 7 + resolution)
    for img, d in drawn:
        # every snake's two tips: the start of its first paddle and the end of its last
        tips = {(s, end): p[0, 0] if end == 0 else p[-1, 1] for s, p in enumerate(d.snakes) for end in (0, 1)}
        found = []
        for m in d.markers:
            key, where = min(tips.items(), key=lambda kv: np.abs(kv[1] - m).sum())
            assert np.allclose(where, m, atol=1e-9)
            found.append(key)
        assert tuple(found) == d.tips
        (s0, e0), (s1, e1) = found
        assert s0 in (0, 1) and s1 in (0, 1) and e0 != e1
        assert (s0 == s1) == bool(d.label)
        for r, c in d.markers:  # each marker is drawn: bright at 128 px, where it spans several pixels
            assert img[int(r), int(c)] >= (200 if resolution == 128 else 100)


@pytest.mark.parametrize("resolution", [32, 128])
def test_snakes_keep_their_margin(resolution):
    spec, drawn = _drawings(resolution, "hard", 4 if resolution == 32 else 2, 3)
    k = spec.supersample
    margins = set()
    for _, d in drawn:
        margins.add(d.margin)
        masks = pf.ink_masks(spec, d)
        assert masks.shape == (len(d.snakes), resolution * spec.supersample, resolution * spec.supersample)
        assert all(m.any() for m in masks)
        owner = np.concatenate([np.full(m.sum(), s) for s, m in enumerate(masks)])
        pts = np.concatenate([np.argwhere(m) for m in masks]).astype(float)
        d2 = ((pts[:, None] - pts[None]) ** 2).sum(-1)
        d2[owner[:, None] == owner[None]] = np.inf
        # an ink pixel's centre lies within half a diagonal of the ink, and the inks of different snakes are
        # 2·margin − SLACK apart: no ink of one snake touches another's
        assert math.sqrt(d2.min()) > (2 * d.margin - pf.SLACK) * k - math.sqrt(2) > 0
    assert margins <= set(spec.margins or (spec.margin,))


@pytest.mark.parametrize("continuity", [1.0, 0.8])  # LRA 32 px's, and one that turns enough to self-cross
def test_paddles_follow_the_snakes2_construction(continuity):
    spec = pf.Spec.for_resolution(32, "hard", continuity=continuity)
    rng = np.random.default_rng(11)
    drawn = [pf.draw(rng, spec, bool(k % 2)) for k in range(12)]
    L, m, t = spec.paddle_length, spec.margin, spec.paddle_thickness
    lo, hi = spec.padding + m + t / 2 - pf.SLACK, spec.resolution - spec.padding - m - t / 2 + pf.SLACK
    max_turn = math.pi / (2 * spec.continuity)
    for _, d in drawn:
        paddles = [(s, i, p) for s, snake in enumerate(d.snakes) for i, p in enumerate(snake)]
        for _, _, p in paddles:
            assert np.linalg.norm(p[1] - p[0]) == pytest.approx(L)
            assert (p >= lo).all() and (p <= hi).all()  # ink stays `margin` − SLACK clear of the padding frame
        for snake in d.snakes:
            u = (snake[:, 1] - snake[:, 0]) / L
            turn = np.arccos(np.clip((u[1:] * u[:-1]).sum(1), -1, 1))
            assert (turn < max_turn).all()
            gaps = np.linalg.norm(snake[1:, 0] - snake[:-1, 1], axis=1)
            assert np.allclose(gaps, 2 * m * np.cos(turn / 2))  # a pivot `margin` after one paddle and before the next
        seg = np.stack([p for _, _, p in paddles])
        snake = np.array([s for s, _, _ in paddles])
        index = np.array([i for _, i, _ in paddles])
        # consecutive paddles of a snake are the only ones allowed closer than the clearance
        exempt = (snake[:, None] == snake[None]) & (np.abs(index[:, None] - index[None]) <= 1)
        assert _segment_distances(seg)[~exempt].min() >= 2 * m + t - pf.SLACK - 1e-9


@pytest.mark.parametrize("level,length,distractor", [("easy", 6, 2), ("intermediate", 9, 3), ("hard", 14, 4)])
def test_levels_set_the_contour_and_distractor_lengths(level, length, distractor):
    spec, drawn = _drawings(32, level, 6, 5)
    assert (spec.contour_length, spec.distractor_length, spec.num_distractor_snakes) == (length, distractor, 5)
    counts = []
    for _, d in drawn:
        assert [len(s) for s in d.snakes[:2]] == [length, length]
        assert all(len(s) == distractor for s in d.snakes[2:])
        counts.append(len(d.snakes) - 2)
    assert max(counts) <= 5 and np.mean(counts) >= 3  # a distractor that finds no room is left out


def test_spec_levels_and_resolutions():
    assert [pf.Spec.for_resolution(32, lv).contour_length for lv in ("easy", "intermediate", "hard")] == [6, 9, 14]
    # LRA's lists: 32 px drawn with 2-px paddles 1 px apart, Path-X's margin drawn per image from 2 and 3
    s32, s128 = pf.Spec.for_resolution(32), pf.Spec.for_resolution(128)
    assert (s32.paddle_length, s32.margin, s32.margins, s32.num_distractor_snakes) == (2, 1, (), 5)
    assert (s128.paddle_length, s128.margins, s128.num_distractor_snakes) == (5, (2, 3), 8)
    with pytest.raises(ValueError, match="`resolution`"):
        pf.Spec.for_resolution(64)
    assert pf.Spec.for_resolution(32, num_distractor_snakes=7).num_distractor_snakes == 7
    with pytest.raises(ValueError, match="`level`") as e:
        pf.Spec.for_resolution(32, "extreme")
    assert "\n" not in str(e.value)


def test_generate_is_seeded_balanced_and_independent_of_workers(tmp_path, monkeypatch):
    spec = pf.Spec.for_resolution(32)
    monkeypatch.setattr(pf, "CHUNK", 25)  # several chunks, so that workers share them out
    a, ya = pf.generate(100, spec, seed=1, workers=1, progress=False)
    b, yb = pf.generate(100, spec, seed=1, workers=3, progress=False)
    assert np.array_equal(a, b) and np.array_equal(ya, yb)
    # chunk k is default_rng([seed, k])'s, whoever draws it
    third, y3 = pf._chunk((spec, 1, 2, 25))
    assert np.array_equal(third, a[50:75]) and np.array_equal(y3, ya[50:75])
    assert 0.35 < ya.mean() < 0.65
    c, _ = pf.generate(25, spec, seed=2, workers=1, progress=False)
    assert not np.array_equal(c, a[:25])
    pf.write_splits(tmp_path, spec, 20, seed=1, workers=1)
    sizes = {s: len(np.load(tmp_path / f"{s}.npz")["labels"]) for s in ("train", "val", "test")}
    assert sizes == {"train": 16, "val": 2, "test": 2}
