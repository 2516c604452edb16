"""Needle in a haystack: prompt construction (length, depth, sentence boundary), scoring, replies equal to the
model's own greedy decoding, the JSON/PNG outputs and errors."""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
import pytest
import torch

from hgrn2.cli import main
from hgrn2.eval import needle
from hgrn2.eval.common import load_model, load_tokenizer


@pytest.fixture(scope="module")
def hay_file(tmp_path_factory, corpus_text):
    f = tmp_path_factory.mktemp("hay") / "hay.txt"
    f.write_text(corpus_text[:20000])
    return str(f)


def _find(seq, sub):
    return next(i for i in range(len(seq) - len(sub) + 1) if seq[i:i + len(sub)] == sub)


@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_prompt_length_depth_and_boundary(hgrn2_dir, corpus_text, depth):
    tok = load_tokenizer(hgrn2_dir)
    hay = tok(corpus_text[:20000])["input_ids"]
    ids = needle.build_prompt(tok, hay, 300, depth, needle.NEEDLE, "Question: q?\nAnswer:")
    assert len(ids) == 300
    inserted = tok("\n" + needle.NEEDLE + "\n")["input_ids"]
    at = _find(ids, inserted)
    budget = 300 - len(inserted) - len(tok("\n\nQuestion: q?\nAnswer:")["input_ids"])
    assert at <= round(depth * budget) and (depth == 0 or at >= round(depth * budget) - 256)
    if 0 < depth < 1:
        assert needle.ends_sentence(tok.decode(ids[at - 1:at]))
    assert ids[:at] == hay[:at]


def test_modes_and_scores():
    args = argparse.Namespace(mode="easy", needle=needle.NEEDLE, question=needle.QUESTION,
                              answer_prefix=needle.ANSWER_PREFIX)
    inserted, ask, answer = needle._needle(args, None)
    assert needle.QUESTION in inserted and needle.NEEDLE in inserted and ask.endswith(needle.ANSWER_PREFIX)
    assert answer == "eat a sandwich and sit in Dolores Park on a sunny day"
    args.mode = "standard"
    assert needle._needle(args, None)[0] == needle.NEEDLE
    assert needle.exact_match("Eat a sandwich, and sit in Dolores Park on a sunny day!", answer) == 1.0
    assert needle.exact_match("eat a sandwich", answer) == 0.0
    assert needle.rouge_l("eat a sandwich", answer) == pytest.approx(2 * (3 / 3) * (3 / 12) / (1 + 3 / 12))
    assert needle.rouge_l(answer, answer) == 1.0


def test_cli_grid_replies_are_greedy(hgrn2_dir, hay_file, tmp_path):
    out = tmp_path / "n"
    assert main(["eval", "needle", hgrn2_dir, "--haystack", hay_file, "--out", str(out), "--lengths", "300,400",
                 "--depths", "3", "--batch-size", "2", "--device", "cpu"]) == 0
    res = json.loads((out / "needle.json").read_text())
    assert os.path.getsize(out / "needle.png") > 1000
    assert np.asarray(res["grid"]["rougeL"]).shape == (3, 2) and len(res["cells"]) == 6
    model, tok = load_model(hgrn2_dir, "cpu", "float32"), load_tokenizer(hgrn2_dir)
    hay = tok(open(hay_file).read(), add_special_tokens=False)["input_ids"]
    for cell in res["cells"][:2]:
        inserted, ask, answer = needle._needle(argparse.Namespace(
            mode="easy", needle=needle.NEEDLE, question=needle.QUESTION, answer_prefix=needle.ANSWER_PREFIX), None)
        ids = needle.build_prompt(tok, hay, cell["length"], cell["depth"] / 100, inserted, ask)
        assert cell["prompt_tokens"] == len(ids) == cell["length"]
        gen = model.generate(input_ids=torch.tensor([ids]), do_sample=False, max_new_tokens=len(
            tok(answer, add_special_tokens=False)["input_ids"]) + 8, pad_token_id=tok.pad_token_id)
        text = tok.decode(gen[0, len(ids):], skip_special_tokens=True).split("\n")[0].strip()
        assert cell["reply"] == text
        assert cell["rougeL"] == needle.rouge_l(text, answer)
        assert res["grid"]["rougeL"][res["depths"].index(cell["depth"])][res["lengths"].index(cell["length"])] \
            == cell["rougeL"]


def test_passkey_without_haystack(hgrn2_dir, tmp_path):
    assert main(["eval", "needle", hgrn2_dir, "--mode", "passkey", "--out", str(tmp_path), "--lengths", "150",
                 "--depths", "2", "--trials", "2", "--device", "cpu"]) == 0
    cells = json.loads((tmp_path / "needle.json").read_text())["cells"]
    assert len(cells) == 4 and all(c["answer"].isdigit() and len(c["answer"]) == 5 for c in cells)


def test_record_holds_every_cell_and_renders_as_a_grid(hgrn2_dir, tmp_path):
    from hgrn2.bench import report

    rec_dir = tmp_path / "results" / "cpu"
    assert main(["eval", "needle", hgrn2_dir, "--mode", "passkey", "--out", str(tmp_path / "n"), "--lengths",
                 "100,150", "--depths", "2", "--trials", "2", "--device", "cpu", "--record", str(rec_dir)]) == 0
    rec = json.loads((rec_dir / "eval_needle.json").read_text())
    cells = json.loads((tmp_path / "n" / "needle.json").read_text())["cells"]
    assert rec["benchmark"] == "eval_needle" and rec["rows"] == cells and rec["mode"] == "passkey"
    assert (rec_dir / "eval_needle.png").is_file()
    text = report.render(tmp_path / "results")
    assert "## Evaluation: needle in a haystack" in text and "| depth | 100 tokens | 150 tokens |" in text
    assert text.count("| 0% |") == 1 and text.count("| 100% |") == 1


@pytest.mark.parametrize("argv, message", [
    (["--lengths", "128"], "exceed the model's context limit of 64"),
    (["--lengths", "a,b"], "--lengths: expected comma-separated integers"),
    (["--mode", "standard", "--haystack"], "--haystack: required in standard mode"),
])
def test_errors(llama_dir, hay_file, tmp_path, capsys, argv, message):
    argv = argv if "--haystack" in argv else argv + ["--haystack", hay_file]
    assert main(["eval", "needle", llama_dir, "--out", str(tmp_path), "--device", "cpu"] + argv) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("hgrn2 eval needle: error: ") and message in last


def test_resumes_from_its_log(hgrn2_dir, tmp_path):
    argv = ["eval", "needle", hgrn2_dir, "--mode", "passkey", "--out", str(tmp_path), "--lengths", "150",
            "--depths", "3", "--device", "cpu"]
    assert main(argv) == 0
    log = tmp_path / "needle.log.jsonl"
    lines = log.read_text().splitlines()
    rec = json.loads(lines[2])
    rec["reply"] = json.loads((tmp_path / "needle.json").read_text())["cells"][1]["answer"]
    log.write_text("\n".join([lines[0], lines[1], json.dumps(rec)]) + "\n")  # the third cell is to be redone
    assert main(argv) == 0
    cells = json.loads((tmp_path / "needle.json").read_text())["cells"]
    assert [c["exact"] for c in cells].count(1.0) >= 1 and cells[1]["exact"] == 1.0
    assert len(log.read_text().splitlines()) == 4


def test_a_haystack_folder_stands_for_its_text_files(tmp_path):
    """A folder given to --haystack is its .txt files below it, in name order; one without any is refused."""
    (tmp_path / "docs" / "b").mkdir(parents=True)
    (tmp_path / "docs" / "b" / "2.txt").write_text("two")
    (tmp_path / "docs" / "1.txt").write_text("one")
    (tmp_path / "docs" / "notes.md").write_text("not text")
    (tmp_path / "empty").mkdir()
    single = tmp_path / "3.txt"
    single.write_text("three")
    files = needle._haystack_files([str(tmp_path / "docs"), str(single)])
    assert [os.path.relpath(f, tmp_path) for f in files] == ["docs/1.txt", "docs/b/2.txt", "3.txt"]
    with pytest.raises(needle.EvalError, match="--haystack: the folder .* holds no .txt files"):
        needle._haystack_files([str(tmp_path / "empty")])
    with pytest.raises(needle.EvalError, match="does not exist"):
        needle._haystack_files([str(tmp_path / "missing")])
