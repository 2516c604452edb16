"""The lm-eval adapter: log-likelihoods equal a direct computation from the logits and lm-eval's own `hf` model on
the same checkpoint; greedy generation; an offline task from a local YAML through `hgrn2 eval lm-eval`."""

from __future__ import annotations

import json
import pathlib

import pytest
import torch
import torch.nn.functional as F
from lm_eval.api.instance import Instance

from hgrn2.cli import main
from hgrn2.eval.harness import HGRN2LM

FIXTURE = pathlib.Path(__file__).resolve().parents[2] / "hgrn2" / "eval" / "tasks" / "hgrn2_tiny_mc"

PAIRS = [
    ("The grammar of the language", " is defined here."),
    ("The grammar of the language", " describes tokens."),
    ("The grammar of the language", " x"),
    ("A", " class definition creates a new object."),
    ("A", " function."),
    ("An assignment statement evaluates the expression list and assigns the single resulting object to each of"
     " the target lists, from left to right. ", "Assignment is defined recursively."),
    ("", "Lone continuation."),
]


def _instances(kind, args):
    return [Instance(request_type=kind, doc={}, arguments=a, idx=i) for i, a in enumerate(args)]


@pytest.fixture(scope="module")
def lm(hgrn2_dir):
    return HGRN2LM(hgrn2_dir, device="cpu", dtype="float32", batch_size=2, chunk=8)


def _direct(lm, ctx, cont):
    x = torch.tensor([ctx + cont])
    with torch.no_grad():
        logits = lm.model(input_ids=x, use_cache=False).logits[0].double()
    lp = F.log_softmax(logits[len(ctx) - 1:-1], -1)
    target = torch.tensor(cont)
    return float(lp.gather(1, target[:, None]).sum()), bool((lp.argmax(-1) == target).all())


def test_loglikelihood_equals_logits(lm):
    got = lm.loglikelihood(_instances("loglikelihood", PAIRS))
    for (ctx, cont), (ll, greedy) in zip(PAIRS, got):
        if ctx:
            ctx_ids, cont_ids = lm._encode_pair(ctx, cont)
        else:
            ctx_ids, cont_ids = [lm.prefix_token_id], lm.tok_encode(cont)
        ref, ref_greedy = _direct(lm, ctx_ids, cont_ids)
        assert ll == pytest.approx(ref, abs=1e-4)
        assert greedy == ref_greedy
    assert len({round(ll, 3) for ll, _ in got}) == len(PAIRS)


def test_equals_lm_eval_hf_model(lm, hgrn2_dir):
    from lm_eval.models.huggingface import HFLM

    hf = HFLM(pretrained=hgrn2_dir, device="cpu", dtype="float32", batch_size=3)
    for kind, args in [("loglikelihood", PAIRS), ("loglikelihood_rolling", [(c + d,) for c, d in PAIRS])]:
        ours = getattr(lm, kind)(_instances(kind, args))
        theirs = getattr(hf, kind)(_instances(kind, args))
        for a, b in zip(ours, theirs):
            a, b = (a[0], b[0]) if kind == "loglikelihood" else (a, b)
            assert a == pytest.approx(b, abs=1e-4)


def test_generate_until_is_greedy_and_stops(lm):
    prompts = ["The grammar of the language", "A class"]
    got = lm.generate_until(_instances("generate_until", [(p, {"until": ["\n\n"], "max_gen_toks": 12})
                                                          for p in prompts]))
    for p, text in zip(prompts, got):
        ids = torch.tensor([lm.tok_encode(p)])
        ref = lm.model.generate(input_ids=ids, max_new_tokens=12, do_sample=False,
                                pad_token_id=lm.tokenizer.pad_token_id, eos_token_id=lm.eot_token_id)
        new = ref[0, ids.shape[1]:].tolist()
        new = new[: new.index(lm.eot_token_id)] if lm.eot_token_id in new else new
        assert text == lm.tok_decode(new).split("\n\n")[0]


def test_cli_runs_local_task(lm, hgrn2_dir, tmp_path, monkeypatch):
    data = FIXTURE / "hgrn2_tiny_mc.jsonl"
    out = tmp_path / "r.json"
    monkeypatch.chdir(tmp_path)  # the bundled task's data resolves beside its YAML, not from the working directory
    assert main(["eval", "lm-eval", hgrn2_dir, "--tasks", "hgrn2_tiny_mc", "--device", "cpu", "--out", str(out)]) == 0
    acc = json.loads(out.read_text())["results"]["hgrn2_tiny_mc"]["acc,none"]
    docs = [json.loads(line) for line in data.read_text().splitlines()]
    right = 0
    for d in docs:
        ctx = f"Question: {d['question']}\nAnswer:"
        lls = [ll for ll, _ in lm.loglikelihood(_instances("loglikelihood", [(ctx, " " + c) for c in d["choices"]]))]
        right += max(range(len(lls)), key=lls.__getitem__) == d["label"]
    assert acc == pytest.approx(right / len(docs))


def test_rejects_non_recurrent_models(llama_dir):
    with pytest.raises(ValueError, match="not an HGRN2-family model"):
        HGRN2LM(llama_dir, device="cpu")


@pytest.mark.slow
def test_cli_unknown_task(hgrn2_dir, capsys):
    assert main(["eval", "lm-eval", hgrn2_dir, "--tasks", "piqa,no_such_task", "--device", "cpu"]) == 2
    assert "unknown task name(s) ['no_such_task']" in capsys.readouterr().err.strip().splitlines()[-1]


def test_registered_with_lm_eval():
    from lm_eval.api.registry import get_model

    assert get_model("hgrn2") is HGRN2LM


@pytest.mark.slow
def test_lm_eval_own_cli(hgrn2_dir, tmp_path):
    import os
    import subprocess
    import sys

    root = pathlib.Path(__file__).parents[2]
    env = dict(os.environ, PYTHONPATH=f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    # as the README types it: no --device (the default is the device that exists), from another folder
    run = subprocess.run([sys.executable, "-m", "hgrn2.eval.harness", "--model", "hgrn2", "--model_args",
                          f"pretrained={hgrn2_dir},dtype=float32", "--tasks", "hgrn2_tiny_mc",
                          "--include_path", str(FIXTURE), "--output_path", str(tmp_path / "o")],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "hgrn2_tiny_mc" in run.stdout and "acc" in run.stdout
