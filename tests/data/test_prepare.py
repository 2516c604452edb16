"""`hgrn2 data prepare` and the packed loader: exact round trips, split rule, dtype choice, bad input, order."""

import json
import random
import shutil

import numpy as np
import pytest
import torch

from hgrn2.data.packed import PackedDataset, StepSampler, eval_batches, read_meta, read_split, train_loader
from hgrn2.data.prepare import prepare
from hgrn2.data.tokenizer import load_tokenizer

WORDS = "the cat sat on a mat dog ran far away and then slept under old green trees".split()


def _docs(n, seed=0):
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 25))) + rng.choice(["", ".", "!"])
            for _ in range(n)]


def _read(out, split):
    return np.asarray(read_split(str(out), split))


def _split_docs(ids, eos):
    """Token ids (each document followed by eos) -> list of per-document id lists."""
    cuts = np.flatnonzero(ids == eos)
    return [ids[a + 1 : b].tolist() for a, b in zip(np.r_[-1, cuts[:-1]], cuts)]


@pytest.fixture(scope="module")
def text_corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    docs = _docs(400)
    # blank lines are not documents: they must be skipped, not written as empty documents
    (d / "a.txt").write_text("\n".join(docs[:250]) + "\n\n  \n")
    (d / "b.txt").write_text("\n".join(docs[250:]) + "\n")
    out = d / "out"
    meta = prepare([str(d / "a.txt"), str(d / "b.txt")], str(out), train_tokenizer=300, val_fraction=0.1,
                   batch_docs=37)
    return d, docs, out, meta


def test_text_round_trip_and_split_rule(text_corpus):
    d, docs, out, meta = text_corpus
    tok = load_tokenizer(str(out / "tokenizer.json"))
    assert meta["dtype"] == "uint16" and meta["vocab_size"] == tok.get_vocab_size()
    eos = meta["eos_id"]
    assert tok.id_to_token(eos) == "<|endoftext|>"
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(out))  # the prepared folder is a transformers tokenizer folder
    assert (hf.eos_token_id, hf.pad_token_id, hf.bos_token_id) == (eos, eos, eos)
    assert hf(docs[3])["input_ids"] == tok.encode(docs[3], add_special_tokens=False).ids
    want_val = [t for i, t in enumerate(docs) if i % 10 == 0]
    want_train = [t for i, t in enumerate(docs) if i % 10 != 0]
    for split, want in (("train", want_train), ("val", want_val)):
        ids = _read(out, split)
        info = meta["splits"][split]
        assert (info["tokens"], info["documents"]) == (len(ids), len(want))
        by = info["by_source"]  # the input each document came from
        assert sorted(by) == [str(d / "a.txt"), str(d / "b.txt")] and sum(c["tokens"] for c in by.values()) == len(ids)
        assert by[str(d / "a.txt")]["documents"] == sum((i % 10 != 0) == (split == "train") for i in range(250))
        assert ids[-1] == eos
        got = [tok.decode(x) for x in _split_docs(ids, eos)]
        assert got == want  # byte-level BPE is lossless: every document comes back exactly, in order


def test_batch_size_does_not_change_output(text_corpus, tmp_path):
    d, _, out, _ = text_corpus
    meta = prepare([str(d / "a.txt"), str(d / "b.txt")], str(tmp_path / "o"), tokenizer=str(out),
                   val_fraction=0.1, batch_docs=1)
    for split in ("train", "val"):
        assert np.array_equal(_read(out, split), _read(tmp_path / "o", split))
    assert meta["splits"] == read_meta(str(out))["splits"]


def test_jsonl_parquet_separate_val_and_uint32(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "</s>": 1, **{w: 70000 + i for i, w in enumerate(WORDS)}}
    vocab.update({f"pad{i}": i + 2 for i in range(70000 - 2)})  # ids up to 70015: needs uint32
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    (tmp_path / "tok").mkdir()
    tok.save(str(tmp_path / "tok" / "tokenizer.json"))
    train_docs, val_docs = _docs(30, 1), _docs(5, 2)
    with open(tmp_path / "train.jsonl", "w") as f:
        for t in train_docs:
            f.write(json.dumps({"content": t, "id": 1}) + "\n")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"content": val_docs}), tmp_path / "val.parquet")
    meta = prepare([str(tmp_path / "train.jsonl")], str(tmp_path / "o"), tokenizer=str(tmp_path / "tok"),
                   val_inputs=[str(tmp_path / "val.parquet")], text_field="content")
    assert meta["dtype"] == "uint32" and meta["eos_id"] == 1
    for split, docs in (("train", train_docs), ("val", val_docs)):
        ids = _read(tmp_path / "o", split)
        want = [tok.encode(t, add_special_tokens=False).ids for t in docs]
        assert _split_docs(ids, 1) == want
        assert ids.max() >= 70000


def test_bad_input(tmp_path, text_corpus):
    _, _, out, _ = text_corpus
    with pytest.raises(FileNotFoundError, match="does not exist"):
        prepare([str(tmp_path / "missing.txt")], str(tmp_path / "o"), tokenizer=str(out))
    (tmp_path / "blank.txt").write_text("\n \n\n")
    with pytest.raises(ValueError, match="training corpus is empty"):
        prepare([str(tmp_path / "blank.txt")], str(tmp_path / "o"), tokenizer=str(out))
    assert not list((tmp_path / "o" / "shards").glob("*.bin*")) and not (tmp_path / "o" / "meta.json").exists()
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(ValueError, match="empty"):
        prepare([str(tmp_path / "empty.txt")], str(tmp_path / "o"), tokenizer=str(out))
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match="unsupported file type"):
        prepare([str(tmp_path / "x.csv")], str(tmp_path / "o"), tokenizer=str(out))
    with pytest.raises(ValueError, match="exactly one"):
        prepare([str(tmp_path / "blank.txt")], str(tmp_path / "o"))
    with pytest.raises(FileExistsError, match="--overwrite"):
        prepare([str(tmp_path / "blank.txt")], str(out), tokenizer=str(out))
    with pytest.raises(FileNotFoundError, match="tokenizer"):
        prepare([str(tmp_path / "blank.txt")], str(tmp_path / "o"), tokenizer=str(tmp_path / "nope.json"))
    (tmp_path / "d.jsonl").write_text('{"body": "hello there"}\n')
    with pytest.raises(ValueError, match=r"'text' is not a column; columns: \['body'\]"):
        prepare([str(tmp_path / "d.jsonl")], str(tmp_path / "o"), tokenizer=str(out))


def test_cli(tmp_path, text_corpus, capsys):
    from hgrn2.cli import main

    d, _, out, _ = text_corpus
    assert main(["data", "prepare", str(d / "a.txt"), "--tokenizer", str(out), "--out", str(tmp_path / "c"),
                 "--val-fraction", "0.05"]) == 0
    assert "train" in capsys.readouterr().out
    assert read_meta(str(tmp_path / "c"))["splits"]["val"]["documents"] == 13  # ceil(250 / 20)


# ---------------------------------------------------------------------------------------------------------------
# packed sequences


def test_packed_windows_and_errors(text_corpus, tmp_path):
    _, _, out, meta = text_corpus
    ids = _read(out, "train")
    ds = PackedDataset(str(out), "train", 64)
    assert len(ds) == len(ids) // 64
    assert torch.equal(ds[3], torch.from_numpy(ids[192:256].astype(np.int64)))
    with pytest.raises(ValueError, match="fewer than seq_len"):
        PackedDataset(str(out), "val", meta["splits"]["val"]["tokens"] + 1)
    with pytest.raises(FileNotFoundError, match="no meta.json"):
        PackedDataset(str(tmp_path), "train", 64)
    shutil.copytree(out, tmp_path / "c")
    shard = tmp_path / "c" / meta["splits"]["train"]["shards"][0]["file"]
    shard.write_bytes(shard.read_bytes()[:-2])
    with pytest.raises(ValueError, match="truncated"):
        PackedDataset(str(tmp_path / "c"), "train", 64)
    shard.unlink()
    with pytest.raises(FileNotFoundError, match=f"{shard} is missing"):
        PackedDataset(str(tmp_path / "c"), "train", 64)


def test_sampler_order_sharding_and_resume():
    n, b = 23, 3
    full = list(StepSampler(n, b, 2, 0, 1, seed=5, start_step=0, max_steps=10))
    # each epoch visits every sequence once
    flat = [i for batch in full for i in batch]
    assert sorted(flat[:n]) == list(range(n)) and flat[:n] != list(range(n))
    # same set of sequences per optimiser step for (world 2, accum 1) and (world 1, accum 2)
    ranks = [list(StepSampler(n, b, 1, r, 2, seed=5, start_step=0, max_steps=10)) for r in range(2)]
    for s in range(10):
        assert full[2 * s] + full[2 * s + 1] == ranks[0][s] + ranks[1][s]
    # resuming at step 4 continues exactly where the full run would be
    assert list(StepSampler(n, b, 2, 0, 1, seed=5, start_step=4, max_steps=10)) == full[8:]
    assert list(StepSampler(n, b, 2, 0, 1, seed=6, start_step=0, max_steps=10)) != full


def test_loader_workers_keep_order(text_corpus):
    _, _, out, _ = text_corpus
    ds = PackedDataset(str(out), "train", 16)
    s = StepSampler(len(ds), 4, 1, 0, 1, seed=0, start_step=0, max_steps=6)
    a = [x for x in train_loader(ds, s, num_workers=0)]
    b = [x for x in train_loader(ds, s, num_workers=2)]
    assert len(a) == 6 and all(torch.equal(x, y) for x, y in zip(a, b))
    assert torch.equal(a[1][2], ds[s.index(4 + 2)])


def test_eval_batches_cover_every_sequence_once(text_corpus):
    _, _, out, _ = text_corpus
    ds = PackedDataset(str(out), "val", 8)
    seen = []
    counts = []
    for r in range(3):
        batches = list(eval_batches(ds, 2, r, 3))
        counts.append(len(batches))
        for x, y in batches:
            seen += [tuple(row.tolist()) for row, lab in zip(x, y) if lab[0] != -100]
    assert len(set(counts)) == 1
    assert sorted(seen) == sorted(tuple(ds[i].tolist()) for i in range(len(ds)))
