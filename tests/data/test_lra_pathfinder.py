import numpy as np
import pytest

from hgrn2.data.lra import pathfinder as pf


@pytest.mark.parametrize("resolution,count", [(32, 40), (128, 4)])
def test_positives_connected_negatives_not(resolution, count):
    spec = pf.Spec.for_resolution(resolution)
    rng = np.random.default_rng(resolution)
    for k in range(count):
        positive = bool(k % 2)
        img, markers = pf.draw(rng, spec, positive)
        assert img.shape == (resolution, resolution) and img.dtype == np.uint8
        assert set(np.unique(img)) == {0, 255}
        assert pf.connected(img, *markers) == positive
        # the marker discs are drawn: a full 3×3 block of ink around each centre
        for y, x in markers:
            assert (img[y - 1:y + 2, x - 1:x + 2] == 255).all()


def test_levels_set_the_contour_length():
    assert [pf.Spec.for_resolution(32, lv).segments for lv in ("easy", "intermediate", "hard")] == [6, 9, 14]
    assert pf.Spec.for_resolution(128).segment_length == 4 * pf.Spec.for_resolution(32).segment_length
    with pytest.raises(ValueError, match="level"):
        pf.Spec.for_resolution(32, "extreme")


def test_flood_fill_itself():
    img = np.zeros((8, 8), np.uint8)
    img[1, 1:6] = 255       # a horizontal stroke
    img[2, 6] = 255         # diagonal neighbour: 8-connected
    img[5, 1:4] = 255       # a separate stroke
    assert pf.connected(img, (1, 1), (2, 6))
    assert not pf.connected(img, (1, 1), (5, 3))
    with pytest.raises(ValueError, match="ink"):
        pf.connected(img, (0, 0), (1, 1))


def test_generate_is_seeded_and_balanced(tmp_path):
    spec = pf.Spec.for_resolution(32)
    a, ya = pf.generate(30, spec, seed=1, workers=1, progress=False)
    b, yb = pf.generate(30, spec, seed=1, workers=2, progress=False)
    assert np.array_equal(a, b) and np.array_equal(ya, yb)
    assert 0 < ya.mean() < 1
    pf.write_splits(tmp_path, spec, 20, seed=1, workers=1)
    sizes = {s: len(np.load(tmp_path / f"{s}.npz")["labels"]) for s in ("train", "val", "test")}
    assert sizes == {"train": 16, "val": 2, "test": 2}
