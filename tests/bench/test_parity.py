"""`hgrn2 bench train-parity`: the code path end to end on the CPU (fla needs a GPU: its row says so), the seeded
batch order, and that fla's initial weights load into our model by name."""

import json
import math

import pytest
import torch

from tests.train.helpers import make_corpus


def test_train_parity_quick(tmp_path, capsys):
    from hgrn2.cli import main

    data = make_corpus(tmp_path / "data")
    assert main(["bench", "train-parity", "--data", data, "--quick", "--out", str(tmp_path / "out")]) == 0
    record = json.loads((tmp_path / "out" / "train_parity.json").read_text())
    rows = {r["model"]: r for r in record["rows"]}
    assert record["quick"] and (tmp_path / "out" / "train_parity.png").is_file()
    assert len(rows["hgrn2"]["losses"]) == 8 and all(math.isfinite(v) for v in rows["hgrn2"]["losses"])
    assert rows["hgrn2"]["losses"][-1] < rows["hgrn2"]["losses"][0]  # it learns
    meta = json.loads((tmp_path / "data" / "meta.json").read_text())
    assert record["data"]["train_tokens"] == meta["splits"]["train"]["tokens"] > 0
    assert record["data"]["vocab_size"] == meta["vocab_size"] and record["settings"]["steps"] == 8
    from hgrn2.bench.report import parity_table

    # a corpus written by `write_corpus` counts no documents
    assert f"data: {meta['splits']['train']['tokens']:,} training tokens, vocabulary 96 (write_corpus)" in \
        parity_table(record)
    if not torch.cuda.is_available():
        assert rows["fla"]["status"] == "unavailable: fla's Triton kernels need a GPU" and record["summary"] is None


def test_batches_are_seeded_and_cycle():
    from hgrn2.bench.parity import sample_batches

    data = [torch.full((4,), i) for i in range(5)]
    a, b = sample_batches(data, 3, 2, seed=1), sample_batches(data, 3, 2, seed=1)
    assert all(torch.equal(x, y) for x, y in zip(a, b)) and all(x.shape == (2, 4) for x in a)
    assert sorted(int(x[0]) for x in torch.cat(a[:2] + [a[2][:1]])) == [0, 1, 2, 3, 4]  # a permutation first
    assert not all(torch.equal(x, y) for x, y in zip(a, sample_batches(data, 3, 2, seed=2)))


def test_fla_weights_load_into_ours_by_name():
    fla_models = pytest.importorskip("fla.models")
    from hgrn2.models import HGRN2ForCausalLM
    from hgrn2.models.convert import config_from_fla

    cfg = dict(hidden_size=64, num_hidden_layers=2, expand_ratio=16, intermediate_size=128, vocab_size=50)
    fla = fla_models.HGRN2ForCausalLM(fla_models.HGRN2Config(**cfg))
    ours = HGRN2ForCausalLM(config_from_fla(dict(model_type="hgrn2", **cfg)))
    ours.load_state_dict(fla.state_dict(), strict=True)
    assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(), fla.state_dict().values()))


def test_report_renders_the_curves_summary():
    from hgrn2.bench.report import parity_table

    rec = {"rows": [{"model": "hgrn2", "mode": "graph", "losses": [9.0, 5.0]},
                    {"model": "fla", "mode": "eager", "status": "unavailable: fla's Triton kernels need a GPU"}],
           "summary": {"max_rel_diff": 2.5e-3, "max_rel_diff_step": 2, "ours_last20": 7.0, "fla_last20": 7.01}}
    table = parity_table(rec)
    assert "| hgrn2 | graph | 2 | 9.0000 | 5.0000 | ok |" in table and "unavailable" in table
    assert "Largest relative difference between the curves: 2.50e-03 (step 2)" in table
    rec |= {"settings": dict(steps=2, batch=8, seq_len=2048, hidden=1024, layers=24, intermediate=2816, lr=3e-4,
                             warmup=20, seed=0),
            "data": dict(vocab_size=8192, train_tokens=7733035, documents=4062, source="linux-doc-6.1, python3.11")}
    assert table in parity_table(rec) and ("2 steps of 8 × 2048 tokens" in parity_table(rec))
    assert "7,733,035 training tokens in 4,062 documents, vocabulary 8,192 (linux-doc-6.1, python3.11)" in \
        parity_table(rec)


def test_data_summary_names_the_corpus_packages():
    from hgrn2.bench.parity import data_summary

    meta = {"vocab_size": 10, "splits": {"train": {"tokens": 5, "documents": 2}},
            "sources": {"train": ["/c/train/linux-doc-6.1__a.rst.txt", "/c/train/python3.11__b.html.txt",
                                  "/c/train/python3.11__c.html.txt"]}}
    assert data_summary(meta) == {"vocab_size": 10, "train_tokens": 5, "documents": 2,
                                  "source": "linux-doc-6.1, python3.11"}
    meta["sources"] = {"train": "hub:wikitext/wikitext-2-raw-v1:train", "val": "every 200th document"}
    assert data_summary(meta)["source"] == "hub:wikitext/wikitext-2-raw-v1:train"
