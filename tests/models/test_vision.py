"""HGRN2 image classifiers: sizes, patch order, the reverse scan against an fp64 step loop, the bidirectional mixer."""

import pytest
import torch

from hgrn2.bench.common import rel_err
from hgrn2.models.vision import (
    PRESETS,
    HGRN2ForImageClassification,
    VisionConfig,
    num_parameters,
    preset,
)
from hgrn2.ops import hgrn2

PAPER_PARAMS = {"deit_tiny": 6.1e6, "deit_small": 23.8e6}


def tiny_config(**kw) -> VisionConfig:
    base = dict(image_size=8, patch_size=4, in_channels=1, num_classes=5, hidden_size=16, num_layers=2,
                expand_ratio=8, glu_size=24)
    return VisionConfig(**{**base, **kw})


def reverse_step_loop(o, g, i, lb):
    """h_t = h_{t+1}·Diag(f_t) + i_t ⊗ (1 − f_t), y_t = h_t·o_t, walked from the last token (o_act sigmoid,
    i_act silu), written out independently of `ops`."""
    B, T, H, K = o.shape
    f = lb + (1 - lb) * torch.sigmoid(g)
    q, v = torch.sigmoid(o), torch.nn.functional.silu(i)
    h = o.new_zeros(B, H, i.shape[-1], K)
    y = torch.empty_like(i)
    for t in reversed(range(T)):
        h = h * f[:, t, :, None, :] + v[:, t, :, :, None] * (1 - f[:, t, :, None, :])
        y[:, t] = torch.einsum("bhvk,bhk->bhv", h, q[:, t])
    return y


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_parameter_counts_match_the_paper(name):
    n = num_parameters(HGRN2ForImageClassification(preset(name)))
    assert abs(n - PAPER_PARAMS[name]) / PAPER_PARAMS[name] < 0.03, n


def test_logits_shape_and_gradients():
    model = HGRN2ForImageClassification(tiny_config())
    logits = model(torch.randn(3, 1, 8, 8))
    assert logits.shape == (3, 5)
    logits.square().sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_patches_are_row_major_blocks():
    model = HGRN2ForImageClassification(tiny_config(in_channels=2))
    img = torch.arange(2 * 8 * 8.0).view(1, 2, 8, 8)
    patches = model.patchify(img)
    assert patches.shape == (1, 4, 32)
    # patch 1 is rows 0-3, columns 4-7; each patch is flattened as (row, column, channel)
    block = img[0, :, 0:4, 4:8].permute(1, 2, 0).reshape(-1)
    assert torch.equal(patches[0, 1], block)


def test_lower_bounds_exclusive_cumsum():
    model = HGRN2ForImageClassification(tiny_config(num_layers=4))
    with torch.no_grad():
        model.lower_bounds.normal_()
    beta = model.layer_lower_bounds()
    p = model.lower_bounds.softmax(0)
    assert torch.all(beta[0] == 0)
    torch.testing.assert_close(beta[3], p[:3].sum(0))
    assert torch.all(beta[1:] >= beta[:-1]) and torch.all(beta < 1)
    one = HGRN2ForImageClassification(tiny_config(num_layers=1))  # a single layer: bound 0, no parameter for it
    assert one.lower_bounds is None and torch.equal(one.layer_lower_bounds(), torch.zeros(1, 16))
    assert one(torch.randn(2, 1, 8, 8)).shape == (2, 5)


@pytest.mark.parametrize("backend", ["reference", "chunk"])
def test_reverse_scan_matches_fp64_step_loop(backend):
    B, T, H, K = 2, 37, 2, 8
    o, g, i = (torch.randn(B, T, H, K, dtype=torch.float64, requires_grad=True) for _ in range(3))
    lb = torch.rand(H, K, dtype=torch.float64) * 0.9
    y, _ = hgrn2(o.float(), g.float(), i.float(), lb.float(), o_act="sigmoid", i_act="silu", reverse=True,
                 backend=backend)
    ref = reverse_step_loop(o, g, i, lb)
    assert rel_err(y, ref) < 1e-5
    dy = torch.randn_like(ref)
    grads = torch.autograd.grad(y, (o, g, i), dy.float())
    refs = torch.autograd.grad(ref, (o, g, i), dy)
    for a, b in zip(grads, refs):
        assert rel_err(a, b) < 1e-4


def test_reverse_scan_on_triton_matches_fp64_step_loop():
    pytest.importorskip("triton")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    B, T, H, K = 1, 20, 1, 16
    o, g, i = (torch.randn(B, T, H, K, dtype=torch.float64, device=device, requires_grad=True) for _ in range(3))
    lb = torch.rand(H, K, dtype=torch.float64, device=device) * 0.9
    y, _ = hgrn2(o.float(), g.float(), i.float(), lb.float(), o_act="sigmoid", i_act="silu", reverse=True,
                 backend="triton")
    ref = reverse_step_loop(o, g, i, lb)
    assert rel_err(y, ref) < 1e-4
    dy = torch.randn_like(ref)
    for a, b in zip(torch.autograd.grad(y, (o, g, i), dy.float()), torch.autograd.grad(ref, (o, g, i), dy)):
        assert rel_err(a, b) < 1e-3


def test_bidirectional_mixer_is_forward_plus_reverse():
    torch.manual_seed(1)
    model = HGRN2ForImageClassification(tiny_config(backend="reference")).double()
    mixer = model.layers[0].token_mixer
    x = torch.randn(2, 4, 16, dtype=torch.float64)
    beta = torch.rand(16, dtype=torch.float64) * 0.5
    q, f, i = (p(x).view(2, 4, 2, 8) for p in (mixer.q_proj, mixer.f_proj, mixer.i_proj))
    lb = beta.view(2, 8)
    y = reverse_step_loop(q, f, i, lb) + reverse_step_loop(q.flip(1), f.flip(1), i.flip(1), lb).flip(1)
    expected = mixer.o_proj(mixer.g_norm(y.reshape(2, 4, 16)))
    assert rel_err(mixer(x, beta), expected) < 1e-10


def test_bidirectional_output_depends_on_later_patches_and_causal_does_not():
    for bidirectional in (True, False):
        model = HGRN2ForImageClassification(tiny_config(bidirectional=bidirectional))
        x = torch.randn(1, 4, 16)
        beta = model.layer_lower_bounds()[0]
        y = model.layers[0](x, beta)
        x2 = x.clone()
        x2[:, -1] += torch.randn(16)  # not a constant shift, which the LayerNorm would remove
        changed = (model.layers[0](x2, beta)[:, 0] - y[:, 0]).abs().max() > 0
        assert bool(changed) == bidirectional


def test_chunk_and_reference_backends_agree_on_the_model():
    torch.manual_seed(2)
    ref = HGRN2ForImageClassification(tiny_config(image_size=16, backend="reference")).double()
    fast = HGRN2ForImageClassification(tiny_config(image_size=16, backend="chunk")).double()
    fast.load_state_dict(ref.state_dict())
    x = torch.randn(2, 1, 16, 16, dtype=torch.float64)
    assert rel_err(fast(x), ref(x)) < 1e-10


@pytest.mark.parametrize("kw, word", [(dict(patch_size=3), "patch_size"), (dict(expand_ratio=5), "expand_ratio"),
                                      (dict(num_layers=0), "num_layers")])
def test_bad_config_names_the_argument(kw, word):
    with pytest.raises(ValueError, match=word):
        tiny_config(**kw)


def test_bad_image_shape_is_a_clear_error():
    model = HGRN2ForImageClassification(tiny_config())
    with pytest.raises(ValueError, match="images"):
        model(torch.randn(2, 3, 8, 8))
    with pytest.raises(ValueError, match="preset"):
        preset("deit_huge")
