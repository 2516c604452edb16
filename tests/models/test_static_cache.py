"""The static-state decode path: the same tokens and logits as the dynamic cache, buffers at fixed addresses, the
CUDA graph used on a GPU only."""

import pytest
import torch

from hgrn2.models import HGRN2Cache, HGRN2Config, HGRN2ForCausalLM, HGRN2StaticCache
from hgrn2.models.modeling_hgrn2 import CACHE_FIELD

CUDA = torch.cuda.is_available()
# fixed-size states of three shapes: HGRU2's [B, H, V, K]; the tuple with short-conv tails; HGRU1's [B, D]
CONFIGS = {"hgrn2": {}, "hgrn2-conv": dict(o_act="sigmoid", i_act="silu", attn_scale=1.0, use_short_conv=True),
           "hgrn1": dict(token_mixer="hgrn1")}


def model(device="cpu", backend="reference", **kw) -> HGRN2ForCausalLM:
    torch.manual_seed(1)
    options = {} if kw.get("token_mixer") else dict(backend=backend)
    m = HGRN2ForCausalLM(HGRN2Config.from_preset("tiny", pad_token_id=0, **options, **kw)).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            p.copy_(torch.randn_like(p) * (0.5 if "lower_bounds" in name else 0.3) + ("norm" in name))
    return m.to(device)


def left_padded(lengths, device="cpu"):
    T = max(lengths)
    ids = torch.zeros(len(lengths), T, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, n in enumerate(lengths):
        ids[b, T - n:], mask[b, T - n:] = torch.randint(1, 128, (n,)), 1
    return ids.to(device), mask.to(device)


def greedy(m, ids, mask, **kw):
    out = m.generate(ids, attention_mask=mask, max_new_tokens=7, do_sample=False, return_dict_in_generate=True,
                     output_logits=True, **kw)
    return out.sequences, torch.stack(out.logits)


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("lengths", [(6,), (7, 3, 5)], ids=["batch1", "left-padded"])
@torch.no_grad()
def test_static_generate_equals_dynamic(config, lengths):
    m = model(**CONFIGS[config])
    torch.manual_seed(2)
    ids, mask = left_padded(lengths)
    seq, logits = greedy(m, ids, mask)
    for _ in range(2):  # the second call reuses the first one's cache buffers
        seq_s, logits_s = greedy(m, ids, mask, static_cache=True)
        assert torch.equal(seq_s, seq)
        assert torch.equal(logits_s, logits)
    assert isinstance(m._static_cache, HGRN2StaticCache) and m._static_cache.get_seq_length() == ids.shape[1] + 6


@pytest.mark.parametrize("config", ["hgrn2", "hgrn2-conv"])
@torch.no_grad()
def test_buffers_stay_in_place(config):
    m = model(**CONFIGS[config])
    ids = torch.randint(1, 128, (2, 6))
    cache = HGRN2StaticCache(m.config.num_hidden_layers)
    dynamic = getattr(m(ids, use_cache=True), CACHE_FIELD)
    assert isinstance(dynamic, HGRN2Cache) and not isinstance(dynamic, HGRN2StaticCache)
    out = m(ids, use_cache=True, **{CACHE_FIELD: cache})
    ptrs = cache_ptrs(cache)
    for _ in range(4):
        nxt = out.logits[:, -1:].argmax(-1)
        out = m(nxt, use_cache=True, **{CACHE_FIELD: cache})
        expected = m(nxt, use_cache=True, **{CACHE_FIELD: dynamic})
        dynamic = getattr(expected, CACHE_FIELD)
        assert getattr(out, CACHE_FIELD) is cache and cache_ptrs(cache) == ptrs
        assert torch.equal(out.logits, expected.logits)
    assert cache.get_seq_length() == 10 and cache.memory_bytes() == dynamic.memory_bytes()
    cache.reset()
    assert cache.get_seq_length() == 0 and cache[0] is None  # the next prompt starts from no state...
    m(ids, use_cache=True, **{CACHE_FIELD: cache})
    assert cache_ptrs(cache) == ptrs  # ...written into the same buffers


def cache_ptrs(cache):
    return [t.data_ptr() for layer in cache.layers
            for t in (layer.buffers if isinstance(layer.buffers, tuple) else (layer.buffers,))]


@torch.no_grad()
def test_cuda_graph_skipped_on_cpu(monkeypatch):
    def no_graph(*a, **k):
        raise AssertionError("a CUDA graph was built for a CPU model")
    monkeypatch.setattr(torch.cuda, "CUDAGraph", no_graph)
    m = model()
    ids, mask = left_padded((5, 3))
    greedy(m, ids, mask, static_cache=True)
    assert m._static_cache.graph is None and not m._static_cache.graphable(ids[:, -1:])


@torch.no_grad()
def test_growing_state_refused():
    m = model(token_mixer="attention")
    ids = torch.randint(1, 128, (1, 4))
    with pytest.raises(ValueError, match="fixed-size states"):
        m.generate(ids, max_new_tokens=3, do_sample=False, static_cache=True)


def test_static_cache_and_cache_refused():
    m = model()
    ids = torch.randint(1, 128, (1, 4))
    with pytest.raises(ValueError, match="static_cache"):
        m.generate(ids, max_new_tokens=2, static_cache=True, **{CACHE_FIELD: HGRN2Cache(2)})


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("config", ["hgrn2", "hgrn2-conv"])
@pytest.mark.parametrize("lengths", [(6,), (9, 3, 5, 1)], ids=["batch1", "left-padded"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@torch.no_grad()
def test_graph_replay_equals_eager(config, lengths, dtype):
    m = model("cuda", backend="triton", **CONFIGS[config]).to(dtype)
    torch.manual_seed(2)
    ids, mask = left_padded(lengths, "cuda")
    seq, logits = greedy(m, ids, mask, **{CACHE_FIELD: HGRN2StaticCache(2, cuda_graph=False)})
    for _ in range(2):  # captured on the first call, replayed by both
        seq_g, logits_g = greedy(m, ids, mask, static_cache=True)
        assert m._static_cache.graph is not None and m._static_cache.get_seq_length() == ids.shape[1] + 6
        assert torch.equal(seq_g, seq)
        tol = 1e-5 if dtype == torch.float32 else 1e-2  # the same kernels replayed; cuBLAS may pick others
        torch.testing.assert_close(logits_g, logits, rtol=tol, atol=tol)
    seq_d, logits_d = greedy(m, ids, mask)  # eager: the same kernels on the same values
    assert torch.equal(seq_d, seq) and torch.equal(logits_d, logits)


@torch.no_grad()
def test_beam_search_reorders_buffers_in_place():
    m = model(**CONFIGS["hgrn2-conv"])
    ids, mask = left_padded((5, 3))
    kw = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, num_beams=3)
    assert torch.equal(m.generate(ids, static_cache=True, **kw), m.generate(ids, **kw))
