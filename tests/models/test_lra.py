import pytest
import torch
import torch.nn.functional as F

from hgrn2 import ops
from hgrn2.models.lra import (
    MIXERS,
    BiHGRU1,
    BiHGRU2,
    LRAClassifier,
    LRAModelConfig,
    SeqNorm,
    group_padding,
    num_parameters,
    scan_both_ways,
    scan_directions,
    sinusoidal,
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


@pytest.mark.parametrize("backend", ["reference", "scan"])
def test_elementwise_route_equals_the_hgrn2_reference(backend):
    torch.manual_seed(0)
    B, T, H, K = 2, 37, 3, 2
    q, f, i = (torch.randn(B, T, H, K, dtype=torch.float64, requires_grad=True) for _ in range(3))
    lb = torch.rand(H, K, dtype=torch.float64) * 0.9
    want = ops.hgrn2(q, f, i, lb, o_act="sigmoid", backend="reference")[0]
    got = ops.hgrn2_small_heads(q, f, i, lb, o_act="sigmoid", backend=backend)
    assert torch.allclose(got, want, atol=1e-12)
    gw = torch.autograd.grad(want.square().sum(), (q, f, i))
    gg = torch.autograd.grad(got.square().sum(), (q, f, i))
    assert all(torch.allclose(a, b, atol=1e-10) for a, b in zip(gw, gg))


def test_scan_both_ways_matches_scan_directions():
    x = torch.randn(2, 16, 3, dtype=torch.float64)

    def run_both(bidirectional, x):
        return x.cumsum(1) + (x.flip(1).cumsum(1).flip(1) if bidirectional else 0)

    def run(reverse, x):
        return x.cumsum(1)

    for directions in ("causal", "bi", "2d"):
        assert torch.allclose(scan_both_ways(run_both, (x,), directions), scan_directions(run, (x,), directions))
    with pytest.raises(ValueError, match="square"):
        scan_both_ways(run_both, (x[:, :15],), "2d")


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
    # one layer: no lower bounds (layer 0's is 0)
    assert num_parameters(LRAClassifier(dual)) == vocab * d + _hgrn2_block_params(d, d) + 2 * d + head
    # HGRN1: input 2d, λ d, θ forward and reverse 2d, gate 2d, LayerNorm 4d, out 2d → d
    pix = LRAModelConfig(mixer="hgrn1", num_classes=classes, hidden_size=d, num_layers=1, glu_expand=1)
    hgrn1 = (2 * d * d + 2 * d) + (d * d + d) + 2 * d + (2 * d * d + 2 * d) + 4 * d + (2 * d * d + d)
    glu_norms = _hgrn2_block_params(d, d) - (4 * (d * d + d) + 2 * d)
    assert num_parameters(LRAClassifier(pix)) == 2 * d + hgrn1 + glu_norms + 2 * d + d * classes + classes


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


def test_unmasked_padding_feeds_the_scans_but_not_the_pool():
    torch.manual_seed(0)
    ids = torch.randint(2, 11, (3, 20))
    mask = torch.ones(3, 20, dtype=torch.bool)
    mask[0, 13:] = False
    other = ids.clone()
    other[0, 13:] = 7
    for directions, moves in (("causal", False), ("bi", True)):
        cfg = LRAModelConfig(num_classes=3, vocab_size=11, hidden_size=8, num_layers=2, directions=directions,
                             norm="layer", mask_padding=False)
        model = LRAClassifier(cfg).eval()
        out = model(ids, mask)
        # the reverse scan starts in the padding; a forward scan meets it only after the pooled tokens
        assert (model(other, mask) - out)[0].abs().max() > 1e-4 if moves else torch.allclose(model(other, mask), out)
        assert torch.allclose(model(other, mask)[1:], out[1:])


def _scan(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """h_t = f_t·h_{t−1} + x_t over dim 1, one step at a time (real or complex)."""
    h, out = torch.zeros_like(x[:, 0]), []
    for t in range(x.shape[1]):
        h = f[:, t] * h + x[:, t]
        out.append(h)
    return torch.stack(out, 1)


def _both_ways(x: torch.Tensor, f: torch.Tensor, f_reverse: torch.Tensor | None = None) -> torch.Tensor:
    f_reverse = f if f_reverse is None else f_reverse
    return _scan(x, f) + _scan(x.flip(1), f_reverse.flip(1)).flip(1)


def _lin(x: torch.Tensor, layer: torch.nn.Linear) -> torch.Tensor:
    return torch.nn.functional.linear(x, layer.weight, layer.bias)


def _ln(x: torch.Tensor, norm: torch.nn.LayerNorm) -> torch.Tensor:
    return torch.nn.functional.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)


def _bihgru2(x, m, beta):
    """hgru2-pytorch's BiHgru2_1d: state [k, v] per head of e = 2, forget gate on k, output gate read over k."""
    H, e = m.num_heads, m.head_dim
    i, o, f = (t.unflatten(-1, (H, e)) for t in (F.silu(_lin(x, m.i_proj)), _lin(x, m.q_proj).sigmoid(),
                                                  _lin(x, m.f_proj).sigmoid()))
    lam = beta.view(H, e) + (1 - beta.view(H, e)) * f
    x_in = ((1 - lam)[..., :, None] * i[..., None, :]).flatten(2)
    s = _both_ways(x_in, lam[..., None].expand(*lam.shape, e).flatten(2)).unflatten(-1, (H, e, e))
    return _lin(_ln((s * o[..., None]).sum(-2).flatten(2), m.g_norm), m.o_proj)


def _bihgru1(x, m, beta):
    """hgru-pytorch's BiHgru1d: complex state, one θ per direction, LayerNorm([Re, Im]) gated by silu."""
    u = F.silu(_lin(x, m.input_proj))
    lam = beta + (1 - beta) * _lin(x, m.lambda_proj).sigmoid()
    x_in = (1 - lam) * torch.complex(u[..., 0::2], u[..., 1::2])
    h = _both_ways(x_in, lam * torch.exp(1j * m.theta), lam * torch.exp(1j * m.theta_reverse))
    return _lin(_ln(torch.cat([h.real, h.imag], -1), m.norm) * F.silu(_lin(x, m.gate)), m.out_proj)


@pytest.mark.parametrize("mixer, reference", [("hgrn2", _bihgru2), ("hgrn1", _bihgru1)])
def test_classifier_matches_a_step_by_step_reference(mixer, reference):
    """The authors' LRA layout (OpenNLPLab/lra SequenceModel with the bidirectional HGRU layers), written out: pre-BN
    residual mixer and GLU blocks, layer l bounded below by the softmax weights of the layers before it, a final
    BN, the mean over each sequence's real tokens, padding read by the scans."""
    torch.manual_seed(0)
    d, T = 8, 11
    cfg = LRAModelConfig(mixer=mixer, num_classes=5, vocab_size=9, hidden_size=d, num_layers=3, glu_expand=1,
                         norm="batch", mask_padding=False)
    model = LRAClassifier(cfg).double()
    with torch.no_grad():
        model.encoder.lower_bounds.normal_()
        for p in model.parameters():
            if p.dim() == 1:
                p.normal_(0, 0.3)
    ids = torch.randint(0, 9, (4, T))
    lengths = torch.tensor([T, 7, 9, 4])
    got = model(ids, torch.arange(T)[None] < lengths[:, None])

    def bn(x, norm):
        return F.batch_norm(x.transpose(1, 2), None, None, norm.weight, norm.bias, True, eps=norm.eps).transpose(1, 2)

    enc = model.encoder
    x = enc.embed(ids) + sinusoidal(T, d).double()
    w = enc.lower_bounds.softmax(0)
    for layer, block in enumerate(enc.layers):
        # β_l = w_1 + … + w_l; the authors' w_0 + … + w_{l−1} is the same family with Γ's rows shifted by one
        x = x + reference(bn(x, block.mixer_norm.norm), block.mixer, w[1:layer + 1].sum(0))
        g, y = block.mlp, bn(x, block.mlp_norm.norm)
        x = x + _lin(F.silu(_lin(y, g.gate_proj)) * _lin(y, g.up_proj), g.down_proj)
    x = bn(x, enc.norm.norm)
    pooled = torch.stack([x[b, :n].mean(0) for b, n in enumerate(lengths)])
    assert torch.allclose(got, model.head(pooled), atol=1e-12)


def test_series_2d_scan_runs_the_mixer_down_the_columns_then_along_the_rows():
    """hgru2-pytorch's Hgru2_2d_series on an image of S × S positions (row-major), written out with explicit
    columns and rows: the whole bidirectional mixer over each column, then, with the same weights, over each row
    of that output."""
    torch.manual_seed(0)
    B, S, d = 2, 4, 8
    m = BiHGRU2(d, expand_ratio=2, directions="2d_series").double()
    x = torch.randn(B, S * S, d, dtype=torch.float64)
    beta = torch.rand(d, dtype=torch.float64) * 0.9
    got = m(x, beta)
    cols = _bihgru2(torch.stack([x[b, j::S] for b in range(B) for j in range(S)]), m, beta)  # [B·S, S, d]
    mid = torch.stack([torch.stack([cols[b * S + j, r] for r in range(S) for j in range(S)]) for b in range(B)])
    rows = _bihgru2(torch.stack([mid[b, r * S:(r + 1) * S] for b in range(B) for r in range(S)]), m, beta)
    assert torch.allclose(got, rows.reshape(B, S * S, d), atol=1e-12)
    # not the parallel scan: the same weights scanning the four directions at once give another result
    parallel = BiHGRU2(d, expand_ratio=2, directions="2d").double()
    parallel.load_state_dict(m.state_dict())
    assert (parallel(x, beta) - got).abs().max() > 1e-3
    # padding (a mask) neither feeds nor moves either pass
    mask = torch.ones(B, S * S, dtype=torch.bool)
    mask[0, 10:] = False
    other = x.clone()
    other[0, 10:] += 1.0
    out = m(x, beta, mask)
    assert torch.allclose(m(other, beta, mask)[0, :10], out[0, :10], atol=1e-12)
    with pytest.raises(ValueError, match="square"):
        m(x[:, :15], beta)


def test_series_2d_in_the_classifier():
    torch.manual_seed(0)
    cfg = LRAModelConfig(mixer="hgrn2", num_classes=2, hidden_size=8, num_layers=2, directions="2d_series")
    model = LRAClassifier(cfg)
    out = model(torch.rand(3, 64, 1))
    assert out.shape == (3, 2) and torch.isfinite(out).all()
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    with pytest.raises(ValueError, match="2d_series"):
        LRAModelConfig(mixer="hgrn1", directions="2d_series")
    with pytest.raises(ValueError, match="directions"):
        scan_directions(lambda reverse, x: x, (torch.rand(1, 4, 1),), "2d_series")


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


def test_grouped_batch_norm_normalises_each_group_alone_and_keeps_the_first_groups_statistics():
    """bn_group: the statistics each GPU of an 8-GPU launch computes over its own share of a batch (plain BatchNorm
    under DDP); the running statistics are rank 0's, from the first group."""
    torch.manual_seed(0)
    x = torch.randn(10, 6, 8, dtype=torch.float64) * 3 + 1
    norm = SeqNorm("batch", 8, group=4).double()
    with torch.no_grad():
        norm.norm.weight.normal_()
        norm.norm.bias.normal_()
    refs = [torch.nn.BatchNorm1d(8).double() for _ in range(3)]
    for ref in refs:
        ref.load_state_dict(norm.norm.state_dict())
    got = norm(x)
    want = torch.cat([ref(g.reshape(-1, 8)).view(g.shape) for ref, g in zip(refs, x.split(4))])
    assert torch.allclose(got, want, atol=1e-12)
    assert torch.allclose(norm.norm.running_mean, refs[0].running_mean)
    assert torch.allclose(norm.norm.running_var, refs[0].running_var)
    assert norm.norm.num_batches_tracked == 1
    # the whole batch where it is no larger than a group, and in evaluation
    whole = SeqNorm("batch", 8).double()
    whole.load_state_dict(norm.state_dict())
    assert torch.allclose(SeqNorm("batch", 8, group=10).double()(x), SeqNorm("batch", 8).double()(x))
    norm.eval()
    whole.eval()
    assert torch.equal(norm(x), whole(x))


def test_grouped_batch_norm_in_the_classifier_and_its_errors():
    torch.manual_seed(0)
    cfg = LRAModelConfig(num_classes=2, vocab_size=None, hidden_size=8, num_layers=2, directions="2d", bn_group=2)
    model = LRAClassifier(cfg)
    x = torch.randn(6, 16, 1)
    # a batch's groups are normalised alone: the logits of one group do not depend on another group's images
    a, b = model(x), model(torch.cat([x[:4], torch.randn(2, 16, 1)]))
    assert torch.allclose(a[:4], b[:4], atol=1e-6) and not torch.allclose(a[4:], b[4:])
    for bad, match in (({"bn_group": 0}, "expected a positive int"),
                       ({"bn_group": 2, "norm": "layer"}, "got norm 'layer'"),
                       ({"bn_group": 2, "dual": True}, "dual True")):
        with pytest.raises(ValueError, match=f"`bn_group`: .*{match}"):
            LRAModelConfig(**bad)


def test_pad_group_pads_each_group_as_one_gpu_of_a_data_parallel_launch_would():
    """pad_group: each group of consecutive sequences padded to its own longest only (the LRA code's collate_fn on
    each GPU's share): in evaluation a group's logits are those of the group alone, trimmed to its longest; in
    training, positions past a group's longest reach neither the scans nor the BatchNorm statistics."""
    torch.manual_seed(0)
    lengths = torch.tensor([9, 12, 4, 6, 5])
    T = 12
    mask = torch.arange(T)[None] < lengths[:, None]
    ids = torch.randint(1, 11, (5, T)).masked_fill(~mask, 0)
    valid = group_padding(mask, 2)
    assert torch.equal(valid, torch.arange(T)[None] < torch.tensor([12, 12, 6, 6, 5])[:, None])
    for mixer in ("hgrn2", "hgrn1"):
        cfg = LRAModelConfig(mixer=mixer, num_classes=3, vocab_size=11, hidden_size=8, num_layers=2, norm="batch",
                             mask_padding=False, expand_ratio=2, pad_group=2)
        model = LRAClassifier(cfg).double()
        plain = LRAClassifier(LRAModelConfig(**{**cfg.to_dict(), "pad_group": None})).double()
        plain.load_state_dict(model.state_dict())
        model.train(), plain.train()
        got = model(ids, mask)
        # the first norm's running mean: the statistics of the embedded positions before each group's longest
        enc = model.encoder
        x0 = (enc.embed(ids) + enc.positions[:T].double())[valid]
        assert torch.allclose(enc.layers[0].mixer_norm.norm.running_mean, 0.1 * x0.mean(0), atol=1e-12)
        # what lies past a group's longest is invisible; the padding before it is read (the reverse scans start there)
        past, inside = ids.clone(), ids.clone()
        past[2:4, 6:] = 7
        inside[2, 4:6] = 7
        assert torch.allclose(model(past, mask), got, atol=1e-12)
        assert not torch.allclose(model(inside, mask)[2], got[2], atol=1e-6)
        assert not torch.allclose(plain(past, mask)[2:4], plain(ids, mask)[2:4], atol=1e-6)
        plain.load_state_dict(model.state_dict())  # the same running statistics
        model.eval(), plain.eval()
        for rows, longest in ((slice(0, 2), 12), (slice(2, 4), 6), (slice(4, 5), 5)):
            alone = plain(ids[rows, :longest], mask[rows, :longest])
            assert torch.allclose(model(ids, mask)[rows], alone, atol=1e-10), (mixer, rows)
        # one group as large as the batch: the batch as it comes
        whole = LRAClassifier(LRAModelConfig(**{**cfg.to_dict(), "pad_group": 5})).double().train()
        whole.load_state_dict(model.state_dict())
        plain.load_state_dict(model.state_dict())
        assert torch.allclose(whole(ids, mask), plain.train()(ids, mask), atol=1e-12)
    # over every position, the masked statistics are BatchNorm's: outputs, input gradients, running statistics
    x = torch.randn(3, 5, 8, dtype=torch.float64, requires_grad=True) * 2 + 1
    masked, ref = SeqNorm("batch", 8).double(), torch.nn.BatchNorm1d(8).double()
    with torch.no_grad():
        masked.norm.weight.normal_(), masked.norm.bias.normal_()
    ref.load_state_dict(masked.norm.state_dict())
    got, want = masked(x, torch.ones(3, 5, dtype=torch.bool)), ref(x.reshape(-1, 8)).view(x.shape)
    assert torch.allclose(got, want, atol=1e-12)
    assert torch.allclose(*(torch.autograd.grad(y.sin().sum(), x)[0] for y in (got, want)), atol=1e-12)
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        assert torch.allclose(getattr(masked.norm, name).double(), getattr(ref, name).double(), atol=1e-12), name
    for bad, match in (({"pad_group": 0}, "expected a positive int"),
                       ({"pad_group": 2, "bn_group": 2}, "bn_group 2"),
                       ({"pad_group": 2, "dual": True}, "dual True")):
        with pytest.raises(ValueError, match=f"`pad_group`: .*{match}"):
            LRAModelConfig(**bad)


@pytest.mark.parametrize("mixer", MIXERS)
@pytest.mark.parametrize("mask_padding, pad_group", [(False, None), (True, None), (False, 2)])
def test_a_batch_padded_past_its_longest_with_valid_computes_the_trimmed_batch(mixer, mask_padding, pad_group):
    """One shape for every batch (a CUDA graph's): padded to the whole length with `valid` marking the positions
    before the batch's longest, the training forward gives the trimmed batch's logits, parameter gradients and
    BatchNorm statistics, whatever the positions past the longest hold."""
    torch.manual_seed(0)
    lengths, T, full = torch.tensor([9, 12, 4, 6, 5]), 12, 20
    mask = torch.arange(full)[None] < lengths[:, None]
    ids = torch.randint(1, 11, (5, full)).masked_fill(~mask, 0)
    valid = (torch.arange(full) < T).expand(5, full)
    cfg = LRAModelConfig(mixer=mixer, num_classes=3, vocab_size=11, hidden_size=8, num_layers=2, num_heads=2,
                         expand_ratio=2, mask_padding=mask_padding, pad_group=pad_group, max_len=full)
    models = [LRAClassifier(cfg).double().train() for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    junk = ids.clone()
    junk[:, T:] = torch.randint(1, 11, (5, full - T))  # nothing past the longest may matter
    trimmed = models[0](ids[:, :T], mask[:, :T])
    padded = models[1](junk, mask, valid)
    assert torch.allclose(padded, trimmed, atol=1e-10)
    grads = [torch.autograd.grad(y.sin().sum(), list(m.parameters()), allow_unused=True)
             for m, y in zip(models, (trimmed, padded))]
    for (name, _), a, b in zip(models[0].named_parameters(), *grads):
        assert (a is None) == (b is None), name
        assert a is None or torch.allclose(a, b, atol=1e-7), name
    for (name, a), b in zip(models[0].named_buffers(), models[1].buffers()):
        assert torch.allclose(a.double(), b.double(), atol=1e-12), name
    with pytest.raises(ValueError, match="`valid`: .*bn_group None"):
        LRAClassifier(LRAModelConfig(**{**cfg.to_dict(), "pad_group": None, "bn_group": 2}))(junk, mask, valid)


def test_pairs_padded_past_their_longest_with_valid_compute_the_trimmed_pairs():
    torch.manual_seed(0)
    lengths, T, full = torch.tensor([[9, 3], [5, 10], [4, 4]]), 10, 16
    mask = (torch.arange(full) < lengths[..., None]).transpose(0, 1)  # [2, B, full]
    ids = torch.randint(1, 11, (2, 3, full)).masked_fill(~mask, 0)
    valid = (torch.arange(full) < T).expand(mask.shape)
    cfg = LRAModelConfig(num_classes=2, vocab_size=11, hidden_size=8, num_layers=1, expand_ratio=2,
                         mask_padding=False, dual=True, max_len=full)
    model = LRAClassifier(cfg).double().train()
    got = model(ids.masked_fill(~valid, 5), mask, valid)
    assert torch.allclose(got, model(ids[..., :T], mask[..., :T]), atol=1e-10)


def _masked_norm_rank(rank: int, path: str, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=2)
    torch.manual_seed(0)
    x = (torch.randn(4, 6, 8, dtype=torch.float64) * 2 + 1)[2 * rank: 2 * rank + 2].requires_grad_()
    valid = (torch.arange(6)[None] < torch.tensor([6, 3, 4, 2])[:, None])[2 * rank: 2 * rank + 2]
    norm = SeqNorm("batch", 8).double()
    norm.norm = torch.nn.SyncBatchNorm.convert_sync_batchnorm(norm.norm)
    y = norm(x, valid)
    dx = torch.autograd.grad((y * torch.arange(8.0, dtype=torch.float64)).sin().sum(), x)[0]
    torch.save({"y": y.detach(), "dx": dx, "mean": norm.norm.running_mean}, f"{out}.{rank}")
    dist.destroy_process_group()


@pytest.mark.slow
def test_masked_batch_norm_sums_over_the_ranks_of_a_sync_batch_norm(tmp_path):
    """pad_group under DDP: the statistics of the valid positions of every rank, as SyncBatchNorm's over all ranks."""
    torch.multiprocessing.spawn(_masked_norm_rank, args=(str(tmp_path / "store"), str(tmp_path / "out")), nprocs=2)
    torch.manual_seed(0)
    x = (torch.randn(4, 6, 8, dtype=torch.float64) * 2 + 1).requires_grad_()
    valid = torch.arange(6)[None] < torch.tensor([6, 3, 4, 2])[:, None]
    norm = SeqNorm("batch", 8).double()
    y = norm(x, valid)
    dx = torch.autograd.grad((y * torch.arange(8.0, dtype=torch.float64)).sin().sum(), x)[0]
    ranks = [torch.load(tmp_path / f"out.{r}") for r in range(2)]
    assert torch.allclose(torch.cat([r["y"] for r in ranks]), y.detach(), atol=1e-12)
    assert torch.allclose(torch.cat([r["dx"] for r in ranks]), dx, atol=1e-12)
    assert all(torch.allclose(r["mean"], norm.norm.running_mean, atol=1e-12) for r in ranks)
