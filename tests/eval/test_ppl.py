"""`hgrn2 eval ppl`: perplexity equals exp of the mean next-token loss computed from the logits; carried-state
equals one window covering the document; the curve, files and errors."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hgrn2.cli import main
from hgrn2.data.prepare import write_corpus
from hgrn2.eval import ppl
from hgrn2.eval.common import load_model


def _direct_losses(model, seqs):
    out = []
    for s in seqs:
        x = torch.from_numpy(s)[None]
        with torch.no_grad():
            logits = model(input_ids=x, use_cache=False).logits
        out.append(F.cross_entropy(logits[0, :-1].double(), x[0, 1:], reduction="none").numpy())
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    rng = np.random.default_rng(0)
    docs = [np.append(rng.integers(1, 300, size=n), 0) for n in (37, 5, 80, 1, 61)]
    out = tmp_path_factory.mktemp("corpus")
    write_corpus(str(out), {"train": np.concatenate(docs), "val": np.concatenate(docs)}, vocab_size=301, eos_id=0)
    return str(out), docs


def test_documents_split_at_eos(corpus):
    path, docs = corpus
    got, _ = ppl.read_documents([path], "val", path, "document")
    assert [d.tolist() for d in got] == [d.tolist() for d in docs]
    seqs = ppl.make_sequences(got, "documents", 32)
    assert [len(s) for s in seqs] == [32, 6, 6, 32, 32, 17, 2, 32, 30]


@pytest.mark.parametrize("model_key", ["hgrn2_dir", "llama_dir"])
def test_ppl_equals_exp_mean_loss_from_logits(request, corpus, model_key):
    model = load_model(request.getfixturevalue(model_key), "cpu", "float32")
    _, docs = corpus
    seqs = ppl.make_sequences(docs, "documents", None)
    direct = _direct_losses(model, seqs)
    got = ppl.score_carried(model, seqs, chunk=16, batch_size=3)
    for a, b in zip(got, direct):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    res = ppl.summarize(got)
    flat = np.concatenate(direct)
    assert res["tokens"] == flat.size
    assert res["ppl"] == pytest.approx(math.exp(flat.mean()), rel=1e-5)
    first = np.mean([d[0] for d in direct])
    assert res["curve"]["loss"][0] == pytest.approx(first, rel=1e-5)
    assert res["curve"]["count"][0] == len(seqs)


def test_carried_equals_one_covering_window(hgrn2_dir, corpus):
    model = load_model(hgrn2_dir, "cpu", "float32")
    seqs = ppl.make_sequences(corpus[1], "documents", None)
    carried = ppl.score_carried(model, seqs, chunk=7, batch_size=2)
    windows = ppl.score_windows(model, seqs, window=128, batch_size=4)
    for a, b in zip(carried, windows):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    short = ppl.score_windows(model, seqs, window=16, batch_size=4)
    assert np.isnan(short[2][15]) and not np.isnan(short[2][14])  # position 16 starts a window: not predicted
    np.testing.assert_allclose(short[2][:15], carried[2][:15], rtol=1e-5, atol=1e-6)
    assert abs(short[2][16] - carried[2][16]) > 1e-4  # the state was reset


def test_cli_writes_json_and_png_on_prepared_data(hgrn2_dir, corpus, tmp_path):
    out = tmp_path / "ppl"
    assert main(["eval", "ppl", hgrn2_dir, corpus[0], "--out", str(out), "--chunk", "8", "--train-length",
                 "32"]) == 0
    res = json.loads((out / "ppl.json").read_text())
    assert res["sequences"] == 5 and res["tokens"] == 37 + 5 + 80 + 1 + 61
    assert os.path.getsize(out / "ppl.png") > 1000
    assert len(res["curve"]["loss"]) == 80
    assert main(["eval", "ppl", hgrn2_dir, corpus[0], "--out", str(tmp_path / "w"), "--mode", "windows", "--window",
                 "16", "--compare", str(out / "ppl.json")]) == 0
    assert os.path.getsize(tmp_path / "w" / "ppl.png") > 1000
    assert main(["eval", "ppl", hgrn2_dir, corpus[0], "--out", str(tmp_path / "x"), "--compare",
                 str(corpus[0]) + "/meta.json"]) == 2


def test_cli_raw_text_and_stream(hgrn2_dir, corpus_text, tmp_path):
    f = tmp_path / "a.txt"
    f.write_text(corpus_text[:4000])
    out = tmp_path / "o"
    assert main(["eval", "ppl", hgrn2_dir, str(f), "--out", str(out), "--sequences", "stream", "--length", "100",
                 "--mode", "windows", "--window", "50"]) == 0
    res = json.loads((out / "ppl.json").read_text())
    assert len(res["curve"]["loss"]) == 99 and res["curve"]["loss"][49] is None


@pytest.mark.parametrize("argv, message", [
    (["--mode", "windows", "--window", "65"], "exceed the model's context limit of 64"),
    (["--sequences", "stream"], "--length: required"),
])
def test_errors_llama(llama_dir, corpus, tmp_path, capsys, argv, message):
    assert main(["eval", "ppl", llama_dir, corpus[0], "--out", str(tmp_path)] + argv) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("hgrn2 eval ppl: error: ") and message in last


def test_errors_files(hgrn2_dir, tmp_path, capsys):
    empty = tmp_path / "e.txt"
    empty.write_text("  \n")
    assert main(["eval", "ppl", hgrn2_dir, str(empty), "--out", str(tmp_path)]) == 2
    assert "is empty" in capsys.readouterr().err
    bare = tmp_path / "bare"
    bare.mkdir()
    (tmp_path / "t.txt").write_text("hello")
    assert main(["eval", "ppl", hgrn2_dir, str(tmp_path / "t.txt"), "--tokenizer", str(bare), "--out",
                 str(tmp_path)]) == 2
    assert "no tokenizer files" in capsys.readouterr().err
    assert main(["eval", "ppl", str(bare), str(tmp_path / "t.txt"), "--out", str(tmp_path)]) == 2
    assert "not a model directory" in capsys.readouterr().err


def test_ignore_context_limit_runs_past_it(llama_dir, corpus, tmp_path):
    assert main(["eval", "ppl", llama_dir, corpus[0], "--out", str(tmp_path), "--ignore-context-limit"]) == 0
    assert len(json.loads((tmp_path / "ppl.json").read_text())["curve"]["loss"]) == 80  # past the limit of 64


def test_bare_tokenizer_json_gets_data_prepares_eos(hgrn2_dir, tmp_path):
    import shutil

    from hgrn2.eval.common import load_tokenizer

    shutil.copy(os.path.join(hgrn2_dir, "tokenizer.json"), tmp_path / "tokenizer.json")
    tok = load_tokenizer(str(tmp_path))
    assert tok.eos_token == "<|endoftext|>" and tok.eos_token_id == 0 and tok.pad_token_id == 0
    assert tok("class")["input_ids"] == load_tokenizer(hgrn2_dir)("class")["input_ids"]


def test_resumes_from_saved_batches(hgrn2_dir, corpus, tmp_path, monkeypatch, capsys):
    argv = ["eval", "ppl", hgrn2_dir, corpus[0], "--out", str(tmp_path), "--batch-size", "2"]

    def stop(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(ppl, "plot_curve", stop)
    with pytest.raises(KeyboardInterrupt):
        main(argv)
    monkeypatch.undo()
    parts = sorted((tmp_path / "ppl.parts").glob("*.npy"))
    assert len(parts) == 3  # 5 sequences in batches of 2
    full = json.loads((tmp_path / "ppl.json").read_text())
    first = np.load(parts[0])  # the two longest sequences (80 and 61 predicted tokens)
    removed = first[0, :80].sum() + first[1, :61].sum()
    np.save(parts[0], np.zeros_like(first))  # taken from the saved batch on resuming, so their loss is now 0
    assert main(argv + ["--chunk", "7"]) == 2
    assert "holds a run with other settings" in capsys.readouterr().err.strip().splitlines()[-1]
    assert main(argv) == 0
    res = json.loads((tmp_path / "ppl.json").read_text())
    assert res["tokens"] == full["tokens"] and res["loss"] == pytest.approx(full["loss"] - removed / 184)
    assert not (tmp_path / "ppl.parts").exists()


def test_record_is_a_benchmark_record_with_the_binned_curve(hgrn2_dir, corpus, tmp_path):
    from hgrn2.bench import report

    rec_dir = tmp_path / "results" / "cpu"
    assert main(["eval", "ppl", hgrn2_dir, corpus[0], "--out", str(tmp_path / "ppl"), "--train-length", "32",
                 "--bin", "16", "--record", str(rec_dir)]) == 0
    rec = json.loads((rec_dir / "eval_ppl.json").read_text())
    res = json.loads((tmp_path / "ppl" / "ppl.json").read_text())
    assert rec["benchmark"] == "eval_ppl" and rec["command"].startswith("hgrn2 eval ppl ")
    assert [r["loss"] for r in rec["rows"]] == res["binned"]["loss"] and rec["loss"] == res["loss"]
    assert rec["rows"][0]["ppl"] == pytest.approx(math.exp(rec["rows"][0]["loss"]))
    assert (rec_dir / "eval_ppl.png").read_bytes() == (tmp_path / "ppl" / "ppl.png").read_bytes()
    assert "note" not in rec  # not made by `hgrn2 train`
    text = report.render(tmp_path / "results")
    assert "## Evaluation: loss by position" in text and f"{rec['rows'][-1]['loss']:.4f}" in text
    assert "![Evaluation: loss by position" in text


def test_training_note_from_train_config(tmp_path):
    from hgrn2.eval.common import training_note

    (tmp_path / "train_config.yaml").write_text(
        "arch: hgrn2\nmodel:\n  hidden_size: 128\n  num_hidden_layers: 2\ndata: d\nseq_len: 256\nmax_steps: 160\n"
        "batch_size: 8\nlr: 0.003\nprecision: fp32\n")
    assert training_note(str(tmp_path)) == ("model: `hgrn2 train` hgrn2 (hidden_size 128, num_hidden_layers 2) on d, "
                                            "seq_len 256, 160 steps × 8 sequences, lr 0.003, fp32")
    assert training_note(str(tmp_path / "none")) is None
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "meta.json").write_text(json.dumps({"splits": {"train": {"tokens": 12345}}}))
    (tmp_path / "train_config.yaml").write_text(f"data: {tmp_path / 'd'}\nseq_len: 8\n")
    assert f"on {tmp_path / 'd'} (12,345 training tokens), seq_len 8" in training_note(str(tmp_path))
