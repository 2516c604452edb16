"""The paper's presets: parameter counts against its tables, the LM YAMLs against the presets, and two model
regressions (a float64 model's lower bounds in float64; no unused parameter with softmax attention, which DDP
rejects)."""

import os

import pytest
import torch
import yaml

from hgrn2.models import HGRN2Config, HGRN2ForCausalLM
from hgrn2.models.presets import PAPER_PARAMETERS, PRESETS, TRAINING_PRESETS
from hgrn2.ops.gates import lower_bounds_from_logits
from hgrn2.train.config import PRESET_DIR


def count(config: HGRN2Config) -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in HGRN2ForCausalLM(config).parameters())


@pytest.mark.parametrize("name", sorted(PAPER_PARAMETERS))
def test_parameter_count_matches_the_paper(name):
    # vocabulary 50265 (the GPT-2 BPE of the paper's WikiText-103 runs) with tied embeddings reproduces every table
    cfg = HGRN2Config.from_preset(name)
    assert (cfg.vocab_size, cfg.tie_word_embeddings) == (50265, True)
    assert abs(count(cfg) / PAPER_PARAMETERS[name] - 1) < 0.05


def test_paper_shapes_and_convention():
    shapes = {name: (PRESETS[name]["num_hidden_layers"], PRESETS[name]["hidden_size"], PRESETS[name]["expand_ratio"])
              for name in ("paper-150m", "paper-385m", "paper-1b", "paper-2.9b", "paper-wt103-44m")}
    assert shapes == {"paper-150m": (15, 768, 128), "paper-385m": (26, 1024, 128), "paper-1b": (18, 2048, 128),
                      "paper-2.9b": (36, 2560, 128), "paper-wt103-44m": (6, 512, 128)}
    for name in PRESETS:
        if name.startswith("paper-"):
            c = HGRN2Config.from_preset(name)
            assert (c.o_act, c.i_act, c.attn_scale) == ("sigmoid", "silu", 1.0), name


def test_an_untied_32k_vocabulary_does_not_reproduce_the_385m_count():
    cfg = HGRN2Config.from_preset("paper-385m", vocab_size=32000, tie_word_embeddings=False)
    assert abs(count(cfg) / 385e6 - 1) > 0.03


@pytest.mark.parametrize("yaml_name,preset", [("hgrn2-0.15b", "paper-150m"), ("hgrn2-0.385b", "paper-385m"),
                                              ("hgrn2-1b", "paper-1b"), ("hgrn2-2.9b", "paper-2.9b"),
                                              ("wikitext103", "paper-wt103-44m")])
def test_lm_yamls_build_their_preset(yaml_name, preset):
    with open(os.path.join(PRESET_DIR, f"{yaml_name}.yaml")) as f:
        raw = yaml.safe_load(f)
    model = {"vocab_size": 50265, **raw["model"]}
    assert HGRN2Config(**model).to_dict() == HGRN2Config.from_preset(preset).to_dict()
    assert raw["seq_len"] == (512 if yaml_name == "wikitext103" else 2048)
    assert raw["lr"] == (5e-4 if yaml_name == "wikitext103" else 3e-4)


def test_wikitext103_yaml_is_the_papers_training_table():
    with open(os.path.join(PRESET_DIR, "wikitext103.yaml")) as f:
        raw = yaml.safe_load(f)
    assert {k: raw[k] for k in ("batch_size", "max_steps", "warmup_steps", "schedule", "betas", "eps",
                                "weight_decay")} == dict(batch_size=128, max_steps=50000, warmup_steps=4000,
                                                        schedule="inverse_sqrt", betas=[0.9, 0.98], eps=1e-8,
                                                        weight_decay=0.1)


def test_float64_lower_bounds_are_float64():
    torch.manual_seed(0)
    gamma = torch.randn(5, 7, dtype=torch.float64) * 3
    beta = lower_bounds_from_logits(gamma)
    e = gamma.exp()
    ref = e.cumsum(0) / e.sum(0) - e[0] / e.sum(0)
    assert beta.dtype == torch.float64 and (beta - ref).abs().max() < 1e-15
    assert lower_bounds_from_logits(gamma.bfloat16()).dtype == torch.float32


def test_float64_model_uses_float64_bounds():
    torch.manual_seed(0)
    cfg = HGRN2Config.from_preset("tiny", num_hidden_layers=3, backend="reference")
    m = HGRN2ForCausalLM(cfg).double().eval()
    with torch.no_grad():
        m.model.lower_bounds.normal_(0, 3)
    ids = torch.randint(0, cfg.vocab_size, (2, 9))
    logits = m(ids).logits
    # perturbing Γ below float32's resolution must move the logits: the bounds are not rounded to float32
    with torch.no_grad():
        m.model.lower_bounds[1:] += 1e-12
    assert (m(ids).logits - logits).abs().max() > 0


@pytest.mark.parametrize("mixer", ["hgrn2", "hgrn1", "lr", "attention"])
def test_every_parameter_gets_a_gradient(mixer):
    # DDP fails on a parameter without a gradient: with softmax attention the model has no lower bound at all
    torch.manual_seed(0)
    cfg = HGRN2Config.from_preset("tiny", token_mixer=mixer, backend=None if mixer == "attention" else "reference")
    m = HGRN2ForCausalLM(cfg)
    assert (m.model.lower_bounds is None) == (mixer == "attention")
    ids = torch.randint(0, cfg.vocab_size, (2, 8))
    m(input_ids=ids, labels=ids).loss.backward()
    assert [n for n, p in m.named_parameters() if p.grad is None] == []


@pytest.mark.slow
def test_ddp_trains_softmax_attention(tmp_path):
    from tests.train.helpers import base_overrides, make_corpus, run_train

    data = make_corpus(tmp_path / "data")
    overrides = base_overrides(data, str(tmp_path / "out"), max_steps=2, parallel="ddp")
    p = run_train([*overrides, "model.token_mixer=attention"], nproc=2, timeout=300)
    assert "2 rank(s)" in p.stdout


@pytest.mark.parametrize("model_name, train_name", sorted(TRAINING_PRESETS.items()))
def test_both_spellings_of_a_paper_size_are_accepted_everywhere(model_name, train_name):
    import dataclasses

    from hgrn2.train.config import make_config

    assert HGRN2Config.from_preset(train_name).to_dict() == HGRN2Config.from_preset(model_name).to_dict()
    assert dataclasses.asdict(make_config(model_name)) == dataclasses.asdict(make_config(train_name))
