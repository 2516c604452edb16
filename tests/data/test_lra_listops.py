import pytest

from hgrn2.data.lra import listops as lo


def test_evaluator_on_hand_written_expressions():
    assert lo.evaluate("( ( ( ( [MAX 2 ) 9 ) ( ( [MIN 4 ) 7 ) ] ) ) 0 ) ]") == 9
    assert lo.evaluate("[MAX 2 9 [MIN 4 7 ] 0 ]") == 9
    assert lo.evaluate("[SM 5 6 [SM 9 9 ] ]") == (5 + 6 + 8) % 10
    assert lo.evaluate("[MED 1 2 3 4 ]") == 2  # int(np.median) of 2.5
    assert lo.evaluate("[MED 7 [MIN 3 8 ] 5 ]") == 5
    assert lo.evaluate("4") == 4
    for bad in ("[MAX 1 2", "[MAX 1 x ]"):
        with pytest.raises(ValueError, match="source"):
            lo.evaluate(bad)


def test_every_generated_label_equals_the_evaluator():
    short = lo.generate(300, seed=3, workers=1, min_length=5, max_length=120, progress=False)
    full = lo.generate(8, seed=4, workers=1, progress=False)
    for source, label in short + full:
        assert label == lo.evaluate(source)
        assert 0 <= label <= 9
    # LRA's length limits, strictly between 500 and 2000 (tokens without brackets, before the end token)
    assert all(lo.MIN_LENGTH < len(lo.tokenize(s)) - 1 < lo.MAX_LENGTH for s, _ in full)
    assert len({s for s, _ in short}) == len(short)
    ops = {t for s, _ in short for t in s.split() if t.startswith("[")}
    assert ops == set(lo.OPERATORS)


def test_generation_is_seeded_and_independent_of_workers():
    a = lo.generate(40, seed=5, workers=1, min_length=5, max_length=60, progress=False)
    b = lo.generate(40, seed=5, workers=2, min_length=5, max_length=60, progress=False)
    c = lo.generate(40, seed=6, workers=1, min_length=5, max_length=60, progress=False)
    assert a == b and a != c


def test_write_and_read_splits(tmp_path):
    sizes = {"train": 6, "val": 2, "test": 2}
    lo.write_splits(tmp_path, seed=1, sizes=sizes, workers=1, min_length=5, max_length=60)
    for split, n in sizes.items():
        sources, labels = lo.read_split(tmp_path / f"basic_{split}.tsv")
        assert len(sources) == n and [lo.evaluate(s) for s in sources] == labels.tolist()
    tokens = lo.tokenize("( ( [SM 3 ) 4 ) ]")
    assert tokens == [lo.TOKEN_ID[t] for t in ("[SM", "3", "4", "]", "<eos>")]
    (tmp_path / "bad.tsv").write_text("a\tb\n")
    with pytest.raises(ValueError, match="Source"):
        lo.read_split(tmp_path / "bad.tsv")
