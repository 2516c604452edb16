"""A saved directory loads with transformers' Auto classes, `pipeline` and lm-eval's own CLI in an interpreter that
never imports hgrn2 itself (`trust_remote_code=True`: config.json's `auto_map` and the modules beside the weights)."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

from hgrn2.models import HGRN2Config, HGRN2ForCausalLM
from hgrn2.models.remote_code import AUTO_MAP, MODULES

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "hgrn2" / "eval" / "tasks" / "hgrn2_tiny_mc"


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> pathlib.Path:
    """A tiny model (output weights scaled up, so greedy continuations differ by prompt) and a BPE tokenizer."""
    from pydoc_data.topics import topics

    from hgrn2.data.tokenizer import pretrained_tokenizer, train_bpe

    path = tmp_path_factory.mktemp("saved")
    bpe = train_bpe(iter(topics[k] for k in sorted(topics)), 300)
    bpe.save(str(path / "bpe.json"))
    tok = pretrained_tokenizer(str(path / "bpe.json"), bpe.token_to_id("<|endoftext|>"))
    (path / "bpe.json").unlink()
    torch.manual_seed(0)
    cfg = HGRN2Config.from_preset("tiny", vocab_size=len(tok), eos_token_id=tok.eos_token_id,
                                  pad_token_id=tok.pad_token_id, bos_token_id=None)
    model = HGRN2ForCausalLM(cfg)
    with torch.no_grad():
        model.lm_head.weight.mul_(20)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _env(tmp_path) -> dict:
    """hgrn2 importable (as when installed) but never imported by the script itself; a private module cache."""
    return dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
                HF_MODULES_CACHE=str(tmp_path / "modules"), HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1",
                TOKENIZERS_PARALLELISM="false")


def _python(script: str, tmp_path, cwd) -> str:
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=cwd, env=_env(tmp_path),
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p.stdout


def test_saved_directory_names_its_modules(saved):
    config = json.loads((saved / "config.json").read_text())
    assert config["auto_map"] == AUTO_MAP
    for name in MODULES:
        assert "from hgrn2.models." in (saved / name).read_text()
    assert json.loads((saved / "tokenizer_config.json").read_text())["padding_side"] == "left"


def test_standard_tools_load_without_importing_hgrn2(saved, tmp_path):
    out = _python("""
        import json, sys
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, pipeline

        d = sys.argv[1] if len(sys.argv) > 1 else "MODEL"
        assert "hgrn2" not in sys.modules
        config = AutoConfig.from_pretrained(d, trust_remote_code=True)
        model = AutoModelForCausalLM.from_pretrained(d, trust_remote_code=True).eval()
        tok = AutoTokenizer.from_pretrained(d, trust_remote_code=True)
        prompts = ["The for statement", "A class definition defines"]
        batch = tok(prompts, return_tensors="pt", padding=True)
        with torch.no_grad():
            out = model.generate(**batch, max_new_tokens=8, do_sample=False)
        batched = tok.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
        single = []
        for p in prompts:
            one = tok(p, return_tensors="pt")
            with torch.no_grad():
                new = model.generate(**one, max_new_tokens=8, do_sample=False)[:, one["input_ids"].shape[1]:]
            single += tok.batch_decode(new, skip_special_tokens=True)
        piped = pipeline("text-generation", model=d, trust_remote_code=True)(prompts[0], max_new_tokens=8,
                                                                             do_sample=False)
        model.save_pretrained("again")  # transformers has registered the class as remote code by now
        print(json.dumps({"config": type(config).__name__, "model": type(model).__name__,
                          "padding_side": tok.padding_side, "batched": batched, "single": single,
                          "piped": piped[0]["generated_text"],
                          "mask_padded": int((batch["attention_mask"] == 0).sum())}))
        """.replace('"MODEL"', repr(str(saved))), tmp_path, cwd=tmp_path)
    r = json.loads(out.strip().splitlines()[-1])
    assert (r["config"], r["model"], r["padding_side"]) == ("HGRN2Config", "HGRN2ForCausalLM", "left")
    assert r["mask_padded"] > 0  # the prompts differ in length, so the batch really was padded
    assert r["batched"] == r["single"] and r["batched"][0] != r["batched"][1]
    assert r["piped"] == "The for statement" + r["single"][0]
    # saved again after a remote-code load: transformers would copy our module, which does not import outside the
    # package, so the small modules are written instead
    for name, text in MODULES.items():
        assert (tmp_path / "again" / name).read_text() == text
    assert json.loads((tmp_path / "again" / "config.json").read_text())["auto_map"] == AUTO_MAP


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("lm_eval") is None, reason="lm-eval is not installed (pip install -e '.[eval]')")
def test_lm_eval_cli_loads_it_as_an_hf_model(saved, tmp_path):
    """lm-eval's own command, typed as its docs say, on the bundled task from another folder (about 15 s)."""
    p = subprocess.run(["lm_eval", "--model", "hf", "--model_args", f"pretrained={saved},trust_remote_code=True",
                        "--tasks", "hgrn2_tiny_mc", "--include_path", str(FIXTURE), "--device", "cpu",
                        "--batch_size", "4", "--output_path", str(tmp_path / "out")],
                       cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    results = [json.loads(f.read_text()) for f in (tmp_path / "out").rglob("results*.json")]
    assert len(results) == 1 and 0 <= results[0]["results"]["hgrn2_tiny_mc"]["acc,none"] <= 1
