import pytest
import torch
import torch.nn.functional as F
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

import hgrn2  # noqa: F401  registers the Auto classes
from hgrn2.bench.common import rel_err
from hgrn2.models import HGRN2Config, HGRN2ForCausalLM, HGRN2ForSequenceClassification, HGRN2Model


def tiny(**kw) -> HGRN2Config:
    return HGRN2Config.from_preset("tiny", backend="reference", **kw)


def randomised(config: HGRN2Config, cls=HGRN2ForCausalLM):
    """A model with every weight random (norm weights around 1, lower-bound logits spread out)."""
    torch.manual_seed(1)
    m = cls(config).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            p.copy_(torch.randn_like(p) * (0.5 if "lower_bounds" in name else 0.2) + ("norm" in name))
    return m


def fla_names(L: int) -> set[str]:
    names = {"model.lower_bounds", "model.embeddings.weight", "model.norm.weight", "lm_head.weight"}
    for i in range(L):
        p = f"model.layers.{i}."
        names |= {p + "attn_norm.weight", p + "attn.g_norm.weight", p + "mlp_norm.weight"}
        names |= {p + f"attn.{x}_proj.weight" for x in "qfio"}
        names |= {p + f"mlp.{x}_proj.weight" for x in ("gate", "up", "down")}
    return names


def test_state_dict_names_match_fla():
    m = HGRN2ForCausalLM(tiny())
    assert set(m.state_dict()) == fla_names(2)
    assert torch.equal(m.model.lower_bounds, torch.zeros(2, 32))
    assert m.model.layers[0].mlp.intermediate_size == 64


def test_default_config_is_fla_default():
    c = HGRN2Config()
    assert (c.hidden_size, c.num_hidden_layers, c.expand_ratio, c.num_heads, c.vocab_size) == (2048, 24, 128, 16, 32000)
    assert (c.o_act, c.i_act, c.attn_scale, c.g_norm, c.g_norm_eps, c.norm_eps) == ("silu", None, "auto", "rmsnorm",
                                                                                   1e-5, 1e-6)
    assert (c.bos_token_id, c.eos_token_id, c.tie_word_embeddings) == (1, 2, False)
    with torch.device("meta"):
        m = HGRN2ForCausalLM(HGRN2Config.from_preset("fla-1.3b"))
    assert m.model.layers[0].mlp.intermediate_size == 5632


@pytest.mark.parametrize("kw, match", [
    (dict(hidden_size=32, expand_ratio=5), "expand_ratio"),
    (dict(hidden_size=32, expand_ratio=0), "expand_ratio"),
    (dict(hidden_size=32, expand_ratio=None, num_heads=3), "num_heads"),
    (dict(hidden_size=32, expand_ratio=8, num_heads=2), "num_heads"),
    (dict(token_mixer="mamba"), "token_mixer"),
    (dict(o_act="gelu"), "o_act"),
    (dict(g_norm="batch"), "g_norm"),
    (dict(mixer_options=[1]), "mixer_options"),
])
def test_config_errors(kw, match):
    with pytest.raises(ValueError, match=match):
        HGRN2Config(**kw)


def test_presets():
    with pytest.raises(ValueError, match="name"):
        HGRN2Config.from_preset("gpt-5")
    c = HGRN2Config.from_preset("paper-385m")
    assert (c.o_act, c.i_act, c.attn_scale, c.hidden_size, c.num_hidden_layers) == ("sigmoid", "silu", 1.0, 1024, 26)
    assert HGRN2Config(hidden_size=64, expand_ratio=None, num_heads=4).expand_ratio == 16


def test_save_load_auto_round_trip(tmp_path):
    m = randomised(tiny())
    m.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    cfg = AutoConfig.from_pretrained(tmp_path)
    assert type(cfg) is HGRN2Config and cfg.model_type == "hgrn2_lm" and cfg.backend == "reference"
    m2 = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(m2) is HGRN2ForCausalLM
    ids = torch.randint(0, 128, (2, 7))
    assert torch.equal(m(ids).logits, m2(ids).logits)
    assert type(AutoModel.from_config(cfg)) is HGRN2Model


def test_lower_bounds_used_from_layer_1():
    m = randomised(tiny())
    seen = []
    for layer in m.model.layers:
        layer.attn.register_forward_hook(lambda mod, args, kwargs, out: seen.append(kwargs["lower_bound"]),
                                         with_kwargs=True)
    m(torch.randint(0, 128, (1, 3)))
    beta = torch.cumsum(m.model.lower_bounds.softmax(0), 0)
    assert seen[0] is None and torch.allclose(seen[1], beta[1] - beta[0])


@pytest.mark.parametrize("layers", [1, 2])
def test_every_trainable_parameter_gets_a_gradient(layers):
    """With one layer no output depends on the bound logits Γ (layer 0 is unbounded): they ask for no gradient, as
    DDP refuses a trainable parameter that none reaches; the state dict keeps them (fla's checkpoints hold them)."""
    m = randomised(tiny(num_hidden_layers=layers)).train()
    m(torch.randint(0, 128, (2, 5)), labels=torch.randint(0, 128, (2, 5))).loss.backward()
    assert m.model.lower_bounds.requires_grad == (layers > 1) and "model.lower_bounds" in m.state_dict()
    assert all(p.grad is not None for p in m.parameters() if p.requires_grad)


def test_one_layer_bound_logits_stay_untrainable_when_loaded(tmp_path):
    """`from_pretrained` (the trainer's init_from) makes every loaded parameter trainable: a one-layer model's Γ
    comes back with its values and still asks for no gradient."""
    from transformers import AutoModelForCausalLM

    from hgrn2.train.model_factory import build_model

    m = tiny(num_hidden_layers=1)
    saved = HGRN2ForCausalLM(m)
    with torch.no_grad():
        saved.model.lower_bounds.copy_(torch.randn_like(saved.model.lower_bounds))
    saved.save_pretrained(tmp_path)
    for loaded in (AutoModelForCausalLM.from_pretrained(tmp_path), build_model("hgrn2", {}, 128, str(tmp_path))):
        assert torch.equal(loaded.model.lower_bounds, saved.model.lower_bounds)
        loaded(torch.randint(0, 128, (2, 5)), labels=torch.randint(0, 128, (2, 5))).loss.backward()
        assert all(p.grad is not None for p in loaded.parameters() if p.requires_grad)


def test_loss_matches_cross_entropy_and_logits_to_keep():
    m = randomised(tiny())
    ids = torch.randint(0, 128, (2, 9))
    labels = ids.clone()
    labels[0, :3] = -100
    out = m(ids, labels=labels)
    logits = m(ids).logits
    ref = F.cross_entropy(logits[:, :-1].reshape(-1, 128), labels[:, 1:].reshape(-1))
    assert out.logits is None and rel_err(out.loss, ref) < 1e-5
    (g1,) = torch.autograd.grad(out.loss, m.model.layers[0].attn.f_proj.weight)
    (g2,) = torch.autograd.grad(F.cross_entropy(m(ids).logits[:, :-1].reshape(-1, 128), labels[:, 1:].reshape(-1)),
                                m.model.layers[0].attn.f_proj.weight)
    assert rel_err(g1, g2) < 1e-4
    n = (labels[:, 1:] != -100).sum()
    assert rel_err(m(ids, labels=labels, num_items_in_batch=n).loss, ref) < 1e-5
    assert rel_err(m(ids, logits_to_keep=2).logits, logits[:, -2:]) < 1e-6
    assert rel_err(m(ids, num_logits_to_keep=1).logits, logits[:, -1:]) < 1e-6
    assert m(ids, logits_to_keep=1).logits.shape == (2, 1, 128)


def test_gradient_checkpointing_same_grads():
    m = randomised(tiny()).train()
    ids = torch.randint(0, 128, (2, 8))
    m(ids, labels=ids).loss.backward()
    ref = {n: p.grad.clone() for n, p in m.named_parameters()}
    m.zero_grad()
    m.gradient_checkpointing_enable()
    assert m.model.gradient_checkpointing
    m(ids, labels=ids).loss.backward()
    for n, p in m.named_parameters():
        assert rel_err(p.grad, ref[n]) < 1e-6, n


def test_gradient_checkpointing_returns_no_cache_rather_than_an_empty_one():
    """Checkpointed layers return no state: use_cache=True under gradient checkpointing warns and gives no cache
    (a cache that counted the positions but held no state decoded wrongly from it)."""
    m = randomised(tiny()).train()
    m.gradient_checkpointing_enable()
    ids = torch.randint(0, 128, (1, 8))
    with pytest.warns(UserWarning, match="gradient checkpointing"):
        out = m(ids, use_cache=True)
    from hgrn2.models.modeling_hgrn2 import CACHE_FIELD
    assert getattr(out, CACHE_FIELD) is None


@pytest.mark.parametrize("mixer", ["hgrn2", "attention"])
def test_evaluation_forward_of_right_padded_or_packed_rows_needs_no_use_cache(mixer):
    """In eval mode the default cache is left out where no state can follow the rows: right padding (outputs at the
    real tokens as without padding) and packed sequences (as separate runs)."""
    opts = dict(token_mixer=mixer, mixer_options=dict(head_dim=8)) if mixer == "attention" else {}
    m = randomised(tiny(**opts)).eval()
    ids = torch.randint(1, 128, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[0, 5:] = 0
    with torch.no_grad():
        out = m(ids, attention_mask=mask)
        alone = m(ids[:1, :5], use_cache=False).logits
        assert rel_err(out.logits[:1, :5], alone) < 1e-5
        packed = m(ids[:1], cu_seqlens=torch.tensor([0, 3, 8])).logits
        assert rel_err(packed[:, 3:], m(ids[:1, 3:], use_cache=False).logits) < 1e-5
    from hgrn2.models.modeling_hgrn2 import CACHE_FIELD
    assert getattr(out, CACHE_FIELD) is None
    if mixer == "hgrn2":  # asked for, a recurrent state cannot follow right padding
        with pytest.raises(ValueError, match="use_cache=False"):
            m(ids, attention_mask=mask, use_cache=True)


def test_an_option_the_mixer_does_not_take_is_named():
    with pytest.raises(ValueError, match="`mixer_options`: the 'hgrn1' token mixer takes no option 'expand_ratio'"):
        HGRN2ForCausalLM(tiny(token_mixer="hgrn1", mixer_options={"expand_ratio": 8}))


def test_input_ids_of_a_float_dtype_are_named():
    m = randomised(tiny())
    with pytest.raises(ValueError, match="`input_ids`: expected an integer tensor of token ids, got torch.float32"):
        m(torch.ones(1, 4))


def test_paper_convention_and_short_conv_build():
    m = randomised(tiny(o_act="sigmoid", i_act="silu", attn_scale=1.0, g_norm="layernorm", use_short_conv=True))
    attn = m.model.layers[1].attn
    assert (attn.o_act, attn.i_act, attn.scale) == ("sigmoid", "silu", 1.0)
    assert "model.layers.0.attn.q_conv1d.weight" in m.state_dict()
    assert m(torch.randint(0, 128, (1, 5))).logits.isfinite().all()


def test_sequence_classification():
    m = randomised(tiny(num_labels=3, pad_token_id=0), HGRN2ForSequenceClassification)
    ids = torch.randint(1, 128, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1, :2] = 0
    out = m(ids, attention_mask=mask, labels=torch.tensor([0, 2]))
    alone = m(ids[1:, 2:]).logits
    assert out.logits.shape == (2, 3) and out.loss.isfinite() and rel_err(out.logits[1], alone[0]) < 1e-5


@torch.no_grad()
def test_packed_sequences_equal_separate():
    m = randomised(tiny())
    a, b = torch.randint(0, 128, (1, 5)), torch.randint(0, 128, (1, 4))
    cu = torch.tensor([0, 5, 9])
    packed = m(torch.cat([a, b], 1), cu_seqlens=cu).logits
    assert rel_err(packed[:, :5], m(a).logits) < 1e-5 and rel_err(packed[:, 5:], m(b).logits) < 1e-5
    ids = torch.cat([a, b], 1)
    loss = m(ids, labels=ids, cu_seqlens=cu).loss
    la, lb = m(a, labels=a).loss, m(b, labels=b).loss
    assert rel_err(loss, (4 * la + 3 * lb) / 7) < 1e-5  # no target across the boundary
