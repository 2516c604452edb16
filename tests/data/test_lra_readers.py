from pathlib import Path

import numpy as np
import pytest

from hgrn2.data.lra import readers, tasks

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "lra"


def test_text_reads_aclimdb_as_bytes():
    d = readers.read_text(FIX, max_len=200)
    train = d["train"]
    assert train.inputs.shape == (5, 200) and sorted(train.labels.tolist()) == [0, 0, 1, 1, 1]
    first = (FIX / "aclImdb" / "train" / "neg" / "0_7.txt").read_bytes()
    row = train.inputs[0]
    assert bytes((row[: len(first)] - readers.BYTE_OFFSET).astype(np.uint8)) == first
    assert row[len(first)] == 1 and train.lengths[0] == len(first) + 1
    assert train.truncated == 1  # the 6,000-byte review, cut to the task's length
    assert d["val"] is d["test"]  # LRA evaluates IMDB on its test split


def test_retrieval_reads_the_lra_release_pairs():
    d = readers.read_retrieval(FIX, max_len=32)
    assert set(d) == {"train", "val", "test"}
    s = d["train"]
    assert s.inputs.shape == (4, 2, 32) and s.lengths.shape == (4, 2) and s.labels.tolist() == [0, 1, 0, 1]
    text = bytes((s.inputs[1, 1, : s.lengths[1, 1] - 1] - readers.BYTE_OFFSET).astype(np.uint8))
    assert text == b"paper 1 cites it"


def test_image_reads_cifar_in_grey():
    d = readers.read_image(FIX, val_fraction=0.2)
    assert d["train"].inputs.shape == (8, 1024) and d["val"].inputs.shape == (2, 1024)
    assert d["test"].inputs.shape == (2, 1024) and d["test"].labels.tolist() == [1, 7]
    assert np.array_equal(readers.grey(np.array([[255, 255, 255], [255, 0, 0]], np.uint8)), [255, 76])


def test_grey_is_pils():
    Image = pytest.importorskip("PIL.Image")
    rgb = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    assert np.array_equal(readers.grey(rgb), np.asarray(Image.fromarray(rgb, "RGB").convert("L")))


def test_fashion_mnist_reads_idx_files():
    d = readers.read_fashion_mnist(FIX / "fashion-mnist", val_fraction=0.25)
    assert d["train"].inputs.shape == (36, 784) and d["val"].inputs.shape == (12, 784)
    assert d["test"].inputs.dtype == np.uint8 and d["test"].labels.tolist() == [0, 1] * 6


def test_listops_reads_the_release_layout():
    d = tasks.load("listops", data_root=str(FIX))
    assert [len(d[s].labels) for s in ("train", "val", "test")] == [8, 2, 2]
    assert (d["train"].inputs[np.arange(8), d["train"].lengths - 1] == 1).all()


@pytest.mark.parametrize("read,layout", [(readers.read_text, "aclImdb"), (readers.read_retrieval, "new_aan_pairs"),
                                         (readers.read_image, "cifar-10-batches-py"),
                                         (readers.read_fashion_mnist, "images-idx3")])
def test_missing_files_name_the_expected_layout(tmp_path, read, layout):
    with pytest.raises(readers.MissingData, match=layout):
        read(tmp_path)


def test_tasks_need_a_data_path():
    with pytest.raises(ValueError, match="--data"):
        tasks.load("text")
    with pytest.raises(ValueError, match="task"):
        tasks.check_task("cifar100")


def test_pathfinder_reads_the_lra_release():
    import torch
    from PIL import Image

    with pytest.warns(UserWarning, match="1 empty image"):
        d = readers.read_pathfinder(FIX, 32, "hard", fractions=(0.2, 0.2), workers=1)
    assert [len(d[s].labels) for s in ("train", "val", "test")] == [3, 1, 1]
    order = torch.randperm(5, generator=torch.Generator().manual_seed(42)).tolist()  # LRA code's random_split
    base = FIX / "lra_release" / "pathfinder32" / "curv_contour_length_14" / "imgs" / "0"
    for split, k in (("val", order[3]), ("test", order[4])):
        png = np.asarray(Image.open(base / f"sample_{k}.png")).reshape(-1)
        assert np.array_equal(d[split].inputs[0], png) and d[split].labels[0] == k % 2
    with pytest.raises(readers.MissingData, match="curv_contour_length_14"):
        readers.read_pathfinder(FIX, 128)


def test_image_reads_the_binary_cifar_release(tmp_path):
    d = tmp_path / "cifar-10-batches-bin"
    d.mkdir()
    py = FIX / "cifar-10-batches-py"
    for name in [f"data_batch_{k}" for k in range(1, 6)] + ["test_batch"]:
        import pickle

        with open(py / name, "rb") as f:
            batch = pickle.load(f, encoding="bytes")
        rows = np.concatenate([np.array(batch[b"labels"], np.uint8)[:, None], batch[b"data"]], 1)
        rows.tofile(d / f"{name}.bin")
    binary, python = readers.read_image(tmp_path, val_fraction=0.2), readers.read_image(FIX, val_fraction=0.2)
    for split in ("train", "val", "test"):
        assert np.array_equal(binary[split].inputs, python[split].inputs)
        assert np.array_equal(binary[split].labels, python[split].labels)


def test_generated_listops_tokens_are_cached_beside_their_tsv(tmp_path, monkeypatch):
    """The first load tokenizes and keeps the tokens beside each TSV; later loads read them (no tokenizing); a TSV
    written again (another size or time) is tokenized afresh; a cache that cannot be written warns and loads."""
    from hgrn2.data.lra import listops

    first = tasks.load("listops", data_dir=tmp_path, examples=200, workers=1)
    base = next(tmp_path.glob("listops-seed0-*"))
    assert sorted(p.name for p in base.glob("*.tokens.npz")) == [f"basic_{s}.tokens.npz" for s in ("test", "train",
                                                                                                    "val")]
    real = listops.tokenize
    monkeypatch.setattr(listops, "tokenize", lambda s: pytest.fail("tokenized again"))
    again = tasks.load("listops", data_dir=tmp_path, examples=200, workers=1)
    for split in first:
        a, b = first[split], again[split]
        assert b.inputs.dtype == np.int64 and np.array_equal(a.inputs, b.inputs)
        assert np.array_equal(a.lengths, b.lengths) and np.array_equal(a.labels, b.labels)
    tsv = base / "basic_val.tsv"
    rows = tsv.read_text().splitlines()
    tsv.write_text("\n".join([rows[0], *rows[2:]]) + "\n")  # one expression fewer
    monkeypatch.setattr(listops, "tokenize", real)
    assert len(tasks.load("listops", data_dir=tmp_path, examples=200, workers=1)["val"].labels) == len(rows) - 2
    tsv.write_text("\n".join(rows) + "\n")

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np, "savez", full)
    with pytest.warns(UserWarning, match="not written"):
        d = tasks.load("listops", data_dir=tmp_path, examples=200, workers=1)
    assert np.array_equal(d["val"].inputs, first["val"].inputs) and not list(base.glob("*.tmp"))
