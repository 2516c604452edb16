"""SCROLLS reader: examples grouped by id, prompts as lm-eval's scrolls tasks, metrics against rouge-score and
hand-computed F1/EM, predictions equal to the model's own greedy decoding, errors."""

from __future__ import annotations

import json
import pathlib

import pytest
import torch

from hgrn2.cli import main
from hgrn2.eval import scrolls
from hgrn2.eval.common import load_model, load_tokenizer

FIXTURE = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "eval" / "scrolls" / "qmsum_validation.jsonl"


def test_read_and_prompt(hgrn2_dir):
    ex = scrolls.read_examples(str(FIXTURE))
    assert [e["id"] for e in ex] == ["m1", "m2", "m3"] and len(ex[0]["outputs"]) == 2
    tok = load_tokenizer(hgrn2_dir)
    ids, cut = scrolls.build_prompt(tok, "qmsum", ex[2]["input"], None)
    text = tok.decode(ids)
    assert text.startswith("Designer: The old logo") and not cut
    assert text.endswith("\n\nQuestion: What colour will the new logo be?\nAnswer:")
    short, cut = scrolls.build_prompt(tok, "qmsum", ex[2]["input"], 5)
    assert cut and short[:5] == ids[:5] and short[5:] == ids[len(ids) - len(short) + 5:]
    assert tok.decode(short).endswith("Answer:")


def test_metrics():
    m = scrolls.score("qasper", ["the new logo will be green", "nothing"], [["The new logo will be green."],
                                                                           ["Member C", "no answer at all"]])
    assert m["rouge1"] == pytest.approx(50.0) and m["rougeL"] == pytest.approx(50.0)
    assert m["f1"] == pytest.approx(50.0)
    assert scrolls.token_f1("green logo", "The new logo will be green.") == pytest.approx(2 * 1 * 0.4 / 1.4)
    m = scrolls.score("contract_nli", ["Entailment", "entailment."], [["Contradiction"], ["Entailment"]])
    assert m["em"] == pytest.approx(50.0)


def test_cli_predictions_are_greedy(hgrn2_dir, tmp_path):
    assert main(["eval", "scrolls", hgrn2_dir, str(FIXTURE), "--task", "qmsum", "--out", str(tmp_path),
                 "--max-new-tokens", "6", "--max-input-tokens", "40", "--batch-size", "2", "--device", "cpu"]) == 0
    res = json.loads((tmp_path / "scrolls.json").read_text())
    assert res["examples"] == 3 and res["truncated"] == 3
    model, tok = load_model(hgrn2_dir, "cpu", "float32"), load_tokenizer(hgrn2_dir)
    ex = scrolls.read_examples(str(FIXTURE))
    ids, _ = scrolls.build_prompt(tok, "qmsum", ex[1]["input"], 40)
    gen = model.generate(input_ids=torch.tensor([ids]), do_sample=False, max_new_tokens=6,
                         pad_token_id=tok.pad_token_id)
    assert res["predictions"][1]["prediction"] == tok.decode(gen[0, len(ids):], skip_special_tokens=True) \
        .split("\n")[0].strip()
    preds = [p["prediction"] for p in res["predictions"]]
    assert res["metrics"] == pytest.approx(scrolls.score("qmsum", preds, [e["outputs"] for e in ex]))


@pytest.mark.parametrize("argv, message", [
    (["--task", "qmsumm"], "--task: unknown task 'qmsumm'"),
    (["--task", "qmsum", "--max-new-tokens", "0"], "--max-new-tokens: expected >= 1"),
])
def test_errors(hgrn2_dir, tmp_path, capsys, argv, message):
    assert main(["eval", "scrolls", hgrn2_dir, str(FIXTURE), "--out", str(tmp_path)] + argv) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("hgrn2 eval scrolls: error: ") and message in last


def test_bad_files(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"id": "x", "input": "q\\n\\ntext"}\n')
    with pytest.raises(ValueError, match="lacks SCROLLS field"):
        scrolls.read_examples(str(tmp_path / "a.jsonl"))
    (tmp_path / "b.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="has no examples"):
        scrolls.read_examples(str(tmp_path / "b.jsonl"))


def test_left_padded_batches_match_single_prompts_on_llama(llama_dir, tmp_path):
    assert main(["eval", "scrolls", llama_dir, str(FIXTURE), "--task", "qmsum", "--out", str(tmp_path),
                 "--max-new-tokens", "5", "--max-input-tokens", "6", "--batch-size", "3", "--device", "cpu"]) == 0
    res = json.loads((tmp_path / "scrolls.json").read_text())
    model, tok = load_model(llama_dir, "cpu", "float32"), load_tokenizer(llama_dir)
    lengths = set()
    for ex, pred in zip(scrolls.read_examples(str(FIXTURE)), res["predictions"]):
        ids, _ = scrolls.build_prompt(tok, "qmsum", ex["input"], 6)
        lengths.add(len(ids))
        gen = model.generate(input_ids=torch.tensor([ids]), do_sample=False, max_new_tokens=5,
                             pad_token_id=tok.pad_token_id)
        assert pred["prediction"] == tok.decode(gen[0, len(ids):], skip_special_tokens=True).split("\n")[0].strip()
    assert len(lengths) > 1  # the batch was padded


def test_resumes_from_its_log(hgrn2_dir, tmp_path, capsys):
    argv = ["eval", "scrolls", hgrn2_dir, str(FIXTURE), "--task", "qmsum", "--out", str(tmp_path),
            "--max-new-tokens", "4", "--device", "cpu"]
    assert main(argv + ["--limit", "2"]) == 0
    log = tmp_path / "scrolls.log.jsonl"
    lines = log.read_text().splitlines()
    assert len(lines) == 3  # settings + two answers
    rec = json.loads(lines[1])
    rec["prediction"] = "kept from the log"
    log.write_text("\n".join([lines[0], json.dumps(rec), lines[2], '{"key": "cut sh']) + "\n")
    assert main(argv) == 0
    res = json.loads((tmp_path / "scrolls.json").read_text())
    assert res["examples"] == 3
    assert [p["prediction"] for p in res["predictions"]].count("kept from the log") == 1
    assert len(log.read_text().splitlines()) == 4
    assert main(argv[:-4] + ["--max-new-tokens", "5", "--device", "cpu"]) == 2
    assert "holds a run with other settings" in capsys.readouterr().err.strip().splitlines()[-1]
