"""Bad arguments to the config and the model: a one-line ValueError naming the argument."""

import pytest
import torch

from hgrn2.models import HGRN2Config, HGRN2ForCausalLM


@pytest.mark.parametrize("field, value, match", [
    ("attn_scale", float("nan"), "`attn_scale`: expected 'auto' or a finite number"),
    ("attn_scale", float("inf"), "`attn_scale`: expected 'auto' or a finite number"),
    ("norm_eps", -1, "`norm_eps`: expected a positive finite number"),
    ("norm_eps", 0.0, "`norm_eps`: expected a positive finite number"),
    ("g_norm_eps", float("nan"), "`g_norm_eps`: expected a positive finite number"),
])
def test_config_rejects(field, value, match):
    with pytest.raises(ValueError, match=match):
        HGRN2Config(vocab_size=11, hidden_size=16, num_hidden_layers=1, expand_ratio=8, **{field: value})


@pytest.mark.parametrize("bad", [11, 100, -1])
def test_token_ids_outside_vocab(bad):
    model = HGRN2ForCausalLM(HGRN2Config(vocab_size=11, hidden_size=16, num_hidden_layers=1, expand_ratio=8))
    ids = torch.tensor([[1, 2, bad, 3]])
    with pytest.raises(ValueError, match=r"`input_ids`: expected token ids in \[0, vocab_size=11\)"):
        model(input_ids=ids)


@pytest.mark.parametrize("kind", ["missing", "no_config", "no_tokenizer"])
def test_generate_cli_names_a_bad_model_dir(tmp_path, capsys, kind):
    from hgrn2.cli import main

    path = tmp_path / "model"
    if kind != "missing":
        path.mkdir()
    if kind == "no_tokenizer":
        (path / "config.json").write_text("{}")
    assert main(["generate", str(path), "--prompt", "hi"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hgrn2 generate: error: `model_dir`:") and "\n" not in err
    assert {"missing": "no such directory", "no_config": "no config.json", "no_tokenizer": "no tokenizer"}[kind] in err
