import pytest
import torch

from hgrn2.bench.common import rel_err
from hgrn2.models import HGRN2Cache, HGRN2Config, HGRN2ForCausalLM
from hgrn2.models.modeling_hgrn2 import CACHE_FIELD


def model(**kw) -> HGRN2ForCausalLM:
    torch.manual_seed(1)
    m = HGRN2ForCausalLM(HGRN2Config.from_preset("tiny", backend="reference", pad_token_id=0, **kw)).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            p.copy_(torch.randn_like(p) * (0.5 if "lower_bounds" in name else 0.3) + ("norm" in name))
    return m


CONVENTIONS = {"fla": {}, "paper-conv": dict(o_act="sigmoid", i_act="silu", attn_scale=1.0, use_short_conv=True)}


@pytest.mark.parametrize("conv", CONVENTIONS)
@pytest.mark.parametrize("prefill", [1, 5])
@torch.no_grad()
def test_decode_equals_forward(conv, prefill):
    m = model(**CONVENTIONS[conv])
    ids = torch.randint(1, 128, (2, 12))
    full = m(ids, use_cache=False).logits
    out = m(ids[:, :prefill], use_cache=True)
    steps, cache = [out.logits], getattr(out, CACHE_FIELD)
    for t in range(prefill, 12):
        out = m(ids[:, t:t + 1], **{CACHE_FIELD: cache}, use_cache=True)
        steps.append(out.logits)
        cache = getattr(out, CACHE_FIELD)
    assert cache.get_seq_length() == 12
    assert rel_err(torch.cat(steps, 1), full) < 1e-5


@torch.no_grad()
def test_greedy_generate_equals_argmax_loop():
    m = model()
    ids = torch.randint(1, 128, (2, 5))
    gen = m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False)
    seq = ids
    for _ in range(8):
        nxt = m(seq, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
        seq = torch.cat([seq, nxt], 1)
    assert torch.equal(gen, seq)


@pytest.mark.parametrize("conv", CONVENTIONS)
@torch.no_grad()
def test_left_padded_batch_generate_equals_per_row(conv):
    m = model(**CONVENTIONS[conv])
    rows = [torch.randint(1, 128, (n,)) for n in (7, 3, 5)]
    T = max(len(r) for r in rows)
    ids = torch.zeros(3, T, dtype=torch.long)
    mask = torch.zeros(3, T, dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, T - len(r):], mask[b, T - len(r):] = r, 1
    batch = m.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
    logits = m(ids, attention_mask=mask).logits
    for b, r in enumerate(rows):
        assert rel_err(logits[b, T - len(r):], m(r[None]).logits[0]) < 1e-5
        alone = m.generate(r[None], attention_mask=torch.ones(1, len(r), dtype=torch.long), max_new_tokens=6,
                           do_sample=False)
        assert torch.equal(batch[b, T:], alone[0, len(r):]), b


@torch.no_grad()
def test_sampling_is_seeded_and_in_vocab():
    m = model()
    ids = torch.randint(1, 128, (2, 4))
    kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=True, top_k=20, temperature=0.9)
    torch.manual_seed(5)
    a = m.generate(ids, **kw)
    torch.manual_seed(5)
    b = m.generate(ids, **kw)
    assert torch.equal(a, b) and a.shape == (2, 10) and ((a >= 0) & (a < 128)).all()
    torch.manual_seed(5)
    c = m.generate(ids, num_return_sequences=3, **kw)
    assert c.shape == (6, 10)


@torch.no_grad()
def test_cache_memory_constant_and_not_croppable():
    m = model()
    out = m(torch.randint(1, 128, (1, 4)), use_cache=True)
    cache = getattr(out, CACHE_FIELD)
    assert isinstance(cache, HGRN2Cache)
    size = cache.memory_bytes()
    for _ in range(20):
        cache = getattr(m(torch.randint(1, 128, (1, 1)), **{CACHE_FIELD: cache}, use_cache=True), CACHE_FIELD)
    assert cache.memory_bytes() == size and cache.get_seq_length() == 24
    with pytest.raises(NotImplementedError):
        cache.crop(10)


@torch.no_grad()
def test_cache_reorder_and_repeat():
    m = model()
    cache = getattr(m(torch.randint(1, 128, (2, 4)), use_cache=True), CACHE_FIELD)
    s = cache[0].clone()
    cache.reorder_cache(torch.tensor([1, 0]))
    assert torch.equal(cache[0], s.flip(0))
    cache.batch_repeat_interleave(2)
    assert cache[1].shape[0] == 4


@torch.no_grad()
def test_generate_from_embeddings_and_continue_with_cache():
    m = model()
    ids = torch.randint(1, 128, (2, 5))
    mask = torch.ones_like(ids)
    ref = m.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False)
    emb = m.generate(inputs_embeds=m.get_input_embeddings()(ids), attention_mask=mask, max_new_tokens=4,
                     do_sample=False)
    assert torch.equal(emb, ref[:, 5:])
    emb = m.generate(inputs_embeds=m.get_input_embeddings()(ids), max_new_tokens=4, do_sample=False)
    assert torch.equal(emb, ref[:, 5:])
    cache = getattr(m(ids[:, :3], use_cache=True), CACHE_FIELD)  # continue from a user-supplied cache
    cont = m.generate(ids, attention_mask=mask, **{CACHE_FIELD: cache}, max_new_tokens=4, do_sample=False)
    assert torch.equal(cont, ref)


@torch.no_grad()
def test_beam_search_with_cache_equals_without():
    m = model()
    ids = torch.randint(1, 128, (2, 5))
    kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=4, num_beams=3, do_sample=False)
    assert torch.equal(m.generate(ids, **kw), m.generate(ids, use_cache=False, **kw))


@torch.no_grad()
def test_cache_under_either_name():
    """transformers ≥ 5.24 calls the cache `cache`, earlier versions `past_key_values`: both names are taken."""
    m = model()
    ids = torch.randint(1, 128, (2, 5))
    ref = m(ids, use_cache=True)
    for name in ("cache", "past_key_values"):
        cache = getattr(m(ids[:, :4], use_cache=True), CACHE_FIELD)
        out = m(ids[:, 4:], use_cache=True, **{name: cache})
        assert rel_err(out.logits[:, -1], ref.logits[:, -1]) < 1e-5
    with pytest.raises(ValueError, match="`cache` / `past_key_values`"):
        m(ids, cache=cache, past_key_values=cache)
