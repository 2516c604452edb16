"""The static-state decode path: the same tokens and logits as the dynamic cache, buffers at fixed addresses, the
CUDA graph used on a GPU only."""

import contextlib

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

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


class _Recorder(TorchDispatchMode):
    """Records every tensor op with its arguments (the same tensor objects), as a CUDA graph records kernels with
    their addresses."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops.append((func, args, kwargs or {}, out))
        return out


class _FakeGraph:
    """A CPU stand-in for torch.cuda.CUDAGraph: replay reruns the recorded ops on whatever the recorded tensors hold
    now and writes each result into the tensor recorded as that op's output. A step that read anything but fixed
    tensors (a state passed by value, a fresh tensor per step) would replay stale values."""

    captured = 0

    def __init__(self):
        self.ops = []
        _FakeGraph.captured += 1

    def replay(self):
        for func, args, kwargs, out in self.ops:
            res = func(*args, **kwargs)
            for o, r in zip(_tensors(out), _tensors(res)):
                if o is not r and (o.data_ptr(), o.stride()) != (r.data_ptr(), r.stride()):
                    o.copy_(r)


def _tensors(x):
    return [t for t in (x if isinstance(x, (tuple, list)) else (x,)) if isinstance(t, torch.Tensor)]


@contextlib.contextmanager
def _fake_capture(graph, **kw):
    with _Recorder() as rec:
        yield
    graph.ops = rec.ops


class _FakeStream:
    def __init__(self, *a, **k):
        pass

    def wait_stream(self, other):
        pass


@pytest.mark.parametrize("config", ["hgrn2", "hgrn2-conv"])
@pytest.mark.parametrize("lengths", [(6,), (7, 3, 5)], ids=["batch1", "left-padded"])
@torch.no_grad()
def test_graph_bookkeeping_with_an_emulated_graph(monkeypatch, config, lengths):
    """The capture/replay logic of `HGRN2StaticCache.decode` on the CPU, with the CUDA graph emulated."""
    monkeypatch.setattr(HGRN2StaticCache, "graph_devices", ("cuda", "cpu"))
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", _fake_capture)
    monkeypatch.setattr(torch.cuda, "Stream", _FakeStream)
    monkeypatch.setattr(torch.cuda, "current_stream", _FakeStream)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    m = model(**CONFIGS[config])
    torch.manual_seed(2)
    ids, mask = left_padded(lengths)
    seq, logits = greedy(m, ids, mask)
    before = _FakeGraph.captured
    for _ in range(2):  # captured on the first call, replayed by both
        seq_g, logits_g = greedy(m, ids, mask, static_cache=True)
        assert m._static_cache.graph is not None and m._static_cache.get_seq_length() == ids.shape[1] + 6
        assert torch.equal(seq_g, seq)
        torch.testing.assert_close(logits_g, logits, rtol=1e-6, atol=1e-6)
    assert _FakeGraph.captured == before + 1
    m.to(torch.float64).to(torch.float32)  # the weights move (a graph would read the old ones): captured again
    m.lm_head.weight.mul_(2)
    seq, logits = greedy(m, ids, mask)
    seq_g, logits_g = greedy(m, ids, mask, static_cache=True)
    assert torch.equal(seq_g, seq) and _FakeGraph.captured == before + 2
    torch.testing.assert_close(logits_g, logits, rtol=1e-6, atol=1e-6)
    greedy(m, ids.repeat(2, 1), mask.repeat(2, 1), static_cache=True)  # another batch size: captured again
    assert _FakeGraph.captured == before + 3


@torch.no_grad()
def test_failed_capture_leaves_the_state_as_it_was(monkeypatch):
    @contextlib.contextmanager
    def failing_capture(graph, **kw):
        raise RuntimeError("operation not permitted when stream is capturing")
        yield

    for name, fake in (("CUDAGraph", _FakeGraph), ("graph", failing_capture), ("Stream", _FakeStream),
                       ("current_stream", _FakeStream), ("stream", lambda s: contextlib.nullcontext())):
        monkeypatch.setattr(torch.cuda, name, fake)
    monkeypatch.setattr(HGRN2StaticCache, "graph_devices", ("cpu",))
    m = model(**CONFIGS["hgrn2-conv"])
    ids = torch.randint(1, 128, (2, 6))
    cache = HGRN2StaticCache(m.config.num_hidden_layers)
    m(ids, use_cache=True, **{CACHE_FIELD: cache})
    expected = getattr(m(ids, use_cache=True), CACHE_FIELD)
    with pytest.raises(RuntimeError, match="capturing"):
        m(ids[:, -1:], use_cache=True, **{CACHE_FIELD: cache})  # the warm-up steps ran, then the capture failed
    assert cache.graph is None and cache.get_seq_length() == 6
    for layer, ref in zip(cache.layers, expected.layers):
        assert all(torch.equal(a, b) for a, b in zip(layer.buffers, ref.state))


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
