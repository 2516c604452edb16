import pytest
import torch

from hgrn2 import ops
from hgrn2.models.lra import (
    MIXERS,
    BiHGRU1,
    BiHGRU2,
    LRAClassifier,
    LRAModelConfig,
    SeqNorm,
    hgrn2_elementwise,
    num_parameters,
    scan_directions,
)


@pytest.mark.parametrize("batched", [False, True])
def test_scan_directions_cover_the_sequence_and_the_grid(batched):
    x = torch.randn(2, 16, 3, dtype=torch.float64)
    calls = []

    def run(reverse, x):
        calls.append(x.shape[0])
        return x.cumsum(1)

    assert torch.allclose(scan_directions(run, (x,), "causal", batched), x.cumsum(1))
    # forward + reverse prefix sums: the whole sum plus the token itself
    assert torch.allclose(scan_directions(run, (x,), "bi", batched), x.sum(1, keepdim=True) + x)
    # rows and columns of the 4×4 grid, both ways: row sum + column sum + 2·token
    g = x.view(2, 4, 4, 3)
    want = g.sum(2, keepdim=True) + g.sum(1, keepdim=True) + 2 * g
    assert torch.allclose(scan_directions(run, (x,), "2d", batched), want.view(2, 16, 3))
    # batched: one call per scan, on the directions stacked along the batch
    assert calls == ([2, 4, 32] if batched else [2, 2, 2, 8, 8, 8, 8])
    with pytest.raises(ValueError, match="square"):
        scan_directions(run, (x[:, :15],), "2d", batched)


def test_elementwise_route_equals_the_hgrn2_reference():
    torch.manual_seed(0)
    B, T, H, K = 2, 37, 3, 2
    q, f, i = (torch.randn(B, T, H, K, dtype=torch.float64, requires_grad=True) for _ in range(3))
    lb = torch.rand(H, K, dtype=torch.float64) * 0.9
    want = ops.hgrn2(q, f, i, lb, o_act="sigmoid", backend="reference")[0]
    got = hgrn2_elementwise(q, f, i, lb, o_act="sigmoid")
    assert torch.allclose(got, want, atol=1e-12)
    gw = torch.autograd.grad(want.square().sum(), (q, f, i))
    gg = torch.autograd.grad(got.square().sum(), (q, f, i))
    assert all(torch.allclose(a, b, atol=1e-10) for a, b in zip(gw, gg))


def _hgrn2_block_params(d, m):
    mixer = 4 * (d * d + d) + 2 * d          # q, f, i, o projections with bias; LayerNorm on the output
    glu = 2 * (d * m + m) + m * d + d        # gate, up, down with bias
    return mixer + glu + 2 * 2 * d           # two BatchNorms (weight, bias)


def test_parameter_counts():
    d, L, vocab, classes = 32, 6, 17, 10  # the ListOps preset
    cfg = LRAModelConfig(mixer="hgrn2", num_classes=classes, vocab_size=vocab, hidden_size=d, num_layers=L,
                         glu_expand=1)
    want = vocab * d + L * _hgrn2_block_params(d, d) + 2 * d + L * d + d * classes + classes
    assert num_parameters(LRAClassifier(cfg)) == want
    dual = LRAModelConfig(mixer="hgrn2", num_classes=2, vocab_size=vocab, hidden_size=d, num_layers=1, dual=True)
    head = 4 * d * d + d + d * 2 + 2
    assert num_parameters(LRAClassifier(dual)) == vocab * d + _hgrn2_block_params(d, d) + 2 * d + d + head
    # HGRN1: input 2d, λ d, θ forward and reverse 2d, gate 2d, LayerNorm 4d, out 2d → d
    pix = LRAModelConfig(mixer="hgrn1", num_classes=classes, hidden_size=d, num_layers=1, glu_expand=1)
    hgrn1 = (2 * d * d + 2 * d) + (d * d + d) + 2 * d + (2 * d * d + 2 * d) + 4 * d + (2 * d * d + d)
    glu_norms = _hgrn2_block_params(d, d) - (4 * (d * d + d) + 2 * d)
    assert num_parameters(LRAClassifier(pix)) == 2 * d + hgrn1 + glu_norms + 2 * d + d + d * classes + classes


@pytest.mark.parametrize("mixer", MIXERS)
@pytest.mark.parametrize("directions", ["causal", "bi", "2d"])
def test_shapes_and_padding(mixer, directions):
    torch.manual_seed(0)
    cfg = LRAModelConfig(mixer=mixer, num_classes=3, vocab_size=11, hidden_size=16, num_layers=2,
                         directions=directions, num_heads=2, norm="layer")
    model = LRAClassifier(cfg).eval()
    ids = torch.randint(2, 11, (3, 36))
    mask = torch.ones(3, 36, dtype=torch.bool)
    mask[0, 27:] = False  # mid-row in the 6 × 6 grid
    out = model(ids, mask)
    assert out.shape == (3, 3) and torch.isfinite(out).all()
    # padded tokens neither feed the state nor move it, in any scan direction
    other = ids.clone()
    other[0, 27:] = 5
    assert torch.allclose(model(other, mask), out, atol=1e-5)
    pixels = LRAClassifier(LRAModelConfig(mixer=mixer, num_classes=4, hidden_size=16, num_layers=1,
                                          directions=directions, num_heads=2))
    assert pixels(torch.rand(2, 36, 1)).shape == (2, 4)


@pytest.mark.parametrize("cls", [BiHGRU2, BiHGRU1])
def test_only_the_bidirectional_mixers_see_the_future(cls):
    torch.manual_seed(0)
    x = torch.randn(2, 12, 8)
    later = x.clone()
    later[:, -1] += 1.0
    for directions, sees in (("causal", False), ("bi", True)):
        mixer = cls(8, directions=directions)
        moved = (mixer(x) - mixer(later))[:, 0].abs().max()
        assert (moved > 1e-4) == sees


def test_config_errors():
    with pytest.raises(ValueError, match="mixer"):
        LRAModelConfig(mixer="lstm")
    with pytest.raises(ValueError, match="directions"):
        LRAModelConfig(directions="up")
    with pytest.raises(ValueError, match="hidden_size"):
        LRAModelConfig(hidden_size=0)
    model = LRAClassifier(LRAModelConfig(hidden_size=8, num_layers=1, max_len=16))
    with pytest.raises(ValueError, match="max_len"):
        model(torch.rand(1, 25, 1))


def test_batch_norm_over_batch_and_positions_matches_batchnorm1d_on_channels():
    norm, ref = SeqNorm("batch", 8).double(), torch.nn.BatchNorm1d(8).double()
    with torch.no_grad():
        norm.norm.weight.uniform_(0.5, 1.5)
        norm.norm.bias.normal_()
    ref.load_state_dict(norm.norm.state_dict())
    x = torch.randn(3, 5, 8, dtype=torch.float64, requires_grad=True)
    for train in (True, False):
        norm.train(train), ref.train(train)
        got, want = norm(x), ref(x.transpose(1, 2)).transpose(1, 2)
        assert torch.allclose(got, want, atol=1e-12)
        gx = torch.autograd.grad(got.sin().sum(), x)[0]
        assert torch.allclose(gx, torch.autograd.grad(want.sin().sum(), x)[0], atol=1e-12)
    assert torch.allclose(norm.norm.running_var, ref.running_var, atol=1e-12)
