"""Evaluation as a newcomer types it: bad arguments and files refused in one line before any work, partial results
kept with the weights they came from (not the model's path), damaged weights named."""

from __future__ import annotations

import json
import os
import pathlib
import shutil

import numpy as np
import pytest

from hgrn2.cli import main
from hgrn2.data.prepare import write_corpus

SCROLLS = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "eval" / "scrolls" / "qmsum_validation.jsonl"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    rng = np.random.default_rng(0)
    docs = [np.append(rng.integers(1, 300, size=n), 0) for n in (37, 5, 80, 1, 61)]
    out = tmp_path_factory.mktemp("corpus")
    write_corpus(str(out), {"train": np.concatenate(docs), "val": np.concatenate(docs)}, vocab_size=301, eos_id=0)
    return str(out)


def _last_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    return err[-1] if err else ""


def test_ppl_refuses_a_window_of_one(hgrn2_dir, corpus, tmp_path, capsys):
    assert main(["eval", "ppl", hgrn2_dir, corpus, "--mode", "windows", "--window", "1", "--out",
                 str(tmp_path)]) == 2
    assert "--window: expected >= 2" in _last_error(capsys)
    assert not (tmp_path / "ppl.json").exists()


def test_ppl_corrupt_weights_one_line(hgrn2_dir, corpus, tmp_path, capsys):
    model = tmp_path / "model"
    shutil.copytree(hgrn2_dir, model)
    (model / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{broken}")
    assert main(["eval", "ppl", str(model), corpus, "--out", str(tmp_path / "o")]) == 2
    last = _last_error(capsys)
    assert last.startswith("hgrn2 eval ppl: error: MODEL: ") and "model.safetensors" in last


def _stop(*args, **kwargs):
    raise KeyboardInterrupt


def test_ppl_parts_are_kept_with_the_weights_not_the_path(hgrn2_dir, llama_dir, corpus, tmp_path, monkeypatch,
                                                          capsys):
    """Another model copied to the same path is refused; the same weights moved elsewhere resume."""
    from hgrn2.eval import ppl

    model = tmp_path / "model"
    shutil.copytree(hgrn2_dir, model)
    argv = ["eval", "ppl", str(model), corpus, "--out", str(tmp_path / "o"), "--batch-size", "2",
            "--ignore-context-limit"]
    monkeypatch.setattr(ppl, "plot_curve", _stop)
    with pytest.raises(KeyboardInterrupt):
        main(argv)
    monkeypatch.undo()
    assert (tmp_path / "o" / "ppl.parts").is_dir()
    shutil.rmtree(model)
    shutil.copytree(llama_dir, model)  # another model under the same name
    assert main(argv) == 2
    assert "holds a run with other settings" in _last_error(capsys)
    shutil.rmtree(model)
    shutil.copytree(hgrn2_dir, tmp_path / "moved")
    assert main(["eval", "ppl", str(tmp_path / "moved"), *argv[3:]]) == 0
    assert not (tmp_path / "o" / "ppl.parts").exists()


def test_needle_log_is_kept_with_the_weights(hgrn2_dir, llama_dir, tmp_path, capsys):
    model = tmp_path / "model"
    shutil.copytree(hgrn2_dir, model)
    argv = ["eval", "needle", str(model), "--mode", "passkey", "--out", str(tmp_path / "o"), "--lengths", "150",
            "--depths", "2", "--device", "cpu", "--tokenizer", hgrn2_dir, "--ignore-context-limit"]
    assert main(argv) == 0
    shutil.rmtree(model)
    shutil.copytree(llama_dir, model)
    assert main(argv) == 2
    assert "holds a run with other settings" in _last_error(capsys)


@pytest.mark.parametrize("row, message", [
    ({"id": "a", "input": "q\n\ntext", "output": None}, "output is NoneType"),
    ({"id": ["a"], "input": "q\n\ntext", "output": "x"}, "id is list"),
    ({"id": "a", "input": 3, "output": "x"}, "input is int"),
    ([1, 2], "is not a JSON object"),
    ({"id": "a", "input": "What is it? The document, no blank line.", "output": "x"}, "has no blank line"),
])
def test_scrolls_input_checked_before_the_model_loads(row, message, tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    good = {"id": "ok", "input": "q\n\ntext", "output": "x"}
    data.write_text(json.dumps(good) + "\n" + json.dumps(row) + "\n")
    # a model directory that does not exist: the file must be refused first
    assert main(["eval", "scrolls", str(tmp_path / "no-model"), str(data), "--task", "qmsum", "--out",
                 str(tmp_path / "o")]) == 2
    last = _last_error(capsys)
    assert f"{data}:2" in last and message in last


def test_scrolls_log_is_kept_with_the_data(hgrn2_dir, tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    shutil.copy(SCROLLS, data)
    argv = ["eval", "scrolls", hgrn2_dir, str(data), "--task", "qmsum", "--out", str(tmp_path / "o"),
            "--max-new-tokens", "2", "--limit", "1", "--device", "cpu"]
    assert main(argv) == 0
    data.write_text(SCROLLS.read_text().replace("logo", "sign"))
    assert main(argv) == 2
    assert "holds a run with other settings" in _last_error(capsys)


@pytest.mark.parametrize("argv, message", [
    (["--batch-size", "0"], "--batch-size: expected >= 1, got 0"),
    (["--chunk", "0"], "--chunk: expected >= 1, got 0"),
    (["--limit", "0"], "--limit: expected > 0"),
    (["--out", "FILE/sub/r.json"], "is a file, not a folder"),
    (["--out", "/"], "is a directory"),
])
def test_lm_eval_arguments_checked_before_any_work(argv, message, tmp_path, capsys):
    """The model directory does not exist: an argument error must come first."""
    (tmp_path / "file").write_text("")
    argv = [a.replace("FILE", str(tmp_path / "file")) for a in argv]
    assert main(["eval", "lm-eval", str(tmp_path / "no-model"), "--tasks", "hgrn2_tiny_mc"] + argv) == 2
    assert message in _last_error(capsys)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_lm_eval_unwritable_out(tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    assert main(["eval", "lm-eval", str(tmp_path / "no-model"), "--tasks", "x", "--out", str(locked / "r.json")]) == 2
    assert "is not writable" in _last_error(capsys)


@pytest.mark.parametrize("text", ['{"format": "hgrn2-tok', "[1, 2]", "\xff\xfe"])
def test_corrupt_meta_json_names_the_file(text, corpus, hgrn2_dir, tmp_path, capsys):
    from hgrn2.cli import console

    data = tmp_path / "data"
    shutil.copytree(corpus, data)
    (data / "meta.json").write_bytes(text.encode("latin-1"))
    assert console(["eval", "ppl", hgrn2_dir, str(data), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]  # after the progress of loading the model
    assert last.startswith("hgrn2 eval ppl: error: data: ") and str(data / "meta.json") in last
