"""Long Range Arena classifiers: HGRN2, HGRN1 and softmax-attention encoders with HGRN1's LRA settings.

The layout follows the authors' LRA code (OpenNLPLab/lra `src/models/sequence/model.py`, mixers from
Doraemonzzz/hgru-pytorch and hgru2-pytorch):

    x → embedding (tokens) or linear (pixels) → + sinusoidal positions ("position" encoder; none for "id")
      → L × [pre-norm → token mixer → residual, pre-norm → GLU → residual] → norm → pool → head

Token mixers scan in both directions with shared projections and sum the directions' outputs before the output
norm (`BiHgru1d`, `BiHgru2_1d`), or in four directions over the image grid (`Hgru2d`, `Hgru2_2d_parallel`: along
rows and columns, forward and reverse); HGRN2's "2d_series" (`Hgru2_2d_series`) runs the whole mixer along the
columns both ways, then again, with the same weights, along the rows of its output. Lower bounds are HGRN's cumax
over layers. Retrieval is a dual encoder: one encoder reads both documents and the head sees [a, b, a − b, a·b]
(LRA's NLI-style `RetrievalHead`).

Padding: pooling always averages over the real tokens only (the LRA decoder's `use_lengths`). With `mask_padding`
the mixers also skip padded positions; without it they read the padding like any token, as the authors' code does
(its sequence lengths reach only the decoder), so a reverse scan starts in the batch's padding. `pad_group` pads as
a data-parallel launch does, each GPU's share of the batch to its own longest sequence.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..layers.glu import GLU
from ..layers.hgru1 import HGRU1Complex
from ..layers.hgru2 import HGRU2
from ..ops import SMALL_HEADS_MAX, hgrn1, hgrn2, hgrn2_small_heads
from ..ops.gates import layer_bounds, lower_bounds_from_logits
from ..ops.projection import linears

MIXERS = ("hgrn2", "hgrn1", "attention")
DIRECTIONS = ("causal", "bi", "2d", "2d_series")
NORMS = ("batch", "layer")
POOLINGS = ("mean", "last")


@dataclass
class LRAModelConfig:
    """One LRA encoder. `vocab_size` None means real-valued inputs of `in_channels` per position (pixels).

    `dropout` acts on each residual branch (and attention weights); `embed_dropout` on the embedded input.
    `mask_padding`: padded positions neither feed nor move the mixers' scans (False: they are read as tokens).
    `bn_group`: in training, BatchNorm statistics over each group of this many consecutive sequences of the batch
    (the running statistics from the first group), as plain BatchNorm on each GPU of a data-parallel launch computes
    them over its own share; None: over the whole batch (SyncBatchNorm under DDP).
    `pad_group`: each group of this many consecutive sequences is padded to its own longest only, as each GPU of a
    data-parallel launch pads its share (the LRA code's collate_fn): positions past a group's longest neither feed
    nor move the mixers and stay out of the BatchNorm statistics; None: the whole batch padded to its longest.
    """

    mixer: str = "hgrn2"
    num_classes: int = 10
    vocab_size: int | None = None
    in_channels: int = 1
    hidden_size: int = 128
    num_layers: int = 4
    expand_ratio: int = 2
    glu_expand: float = 1.0
    directions: str = "bi"
    norm: str = "batch"
    dropout: float = 0.0
    embed_dropout: float = 0.0
    pooling: str = "mean"
    positional: bool = True
    max_len: int = 16384
    dual: bool = False
    use_lower_bound: bool = True
    num_heads: int = 8
    mask_padding: bool = True
    bn_group: int | None = None
    pad_group: int | None = None

    def __post_init__(self) -> None:
        for name, value, choices in (("mixer", self.mixer, MIXERS), ("directions", self.directions, DIRECTIONS),
                                     ("norm", self.norm, NORMS), ("pooling", self.pooling, POOLINGS)):
            if value not in choices:
                raise ValueError(f"`{name}`: expected one of {choices}, got {value!r}")
        if self.directions == "2d_series" and self.mixer == "hgrn1":
            raise ValueError("`directions`: '2d_series' is HGRN2's (hgru2-pytorch Hgru2_2d_series); hgrn1 scans '2d'")
        for name in ("num_classes", "hidden_size", "num_layers", "expand_ratio", "in_channels", "max_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"`{name}`: expected a positive int, got {value!r}")
        if self.bn_group is not None:
            if not isinstance(self.bn_group, int) or isinstance(self.bn_group, bool) or self.bn_group <= 0:
                raise ValueError(f"`bn_group`: expected a positive int or None, got {self.bn_group!r}")
            if self.norm != "batch" or self.dual:
                raise ValueError("`bn_group`: groups BatchNorm statistics of a single encoder; needs norm 'batch' "
                                 f"and dual False, got norm {self.norm!r}, dual {self.dual}")
        if self.pad_group is not None:
            if not isinstance(self.pad_group, int) or isinstance(self.pad_group, bool) or self.pad_group <= 0:
                raise ValueError(f"`pad_group`: expected a positive int or None, got {self.pad_group!r}")
            if self.bn_group is not None or self.dual:
                raise ValueError("`pad_group`: pads the groups of a single encoder's batch; needs bn_group None and "
                                 f"dual False, got bn_group {self.bn_group!r}, dual {self.dual}")
        if self.vocab_size is not None and (not isinstance(self.vocab_size, int) or self.vocab_size <= 0):
            raise ValueError(f"`vocab_size`: expected a positive int or None (pixels), got {self.vocab_size!r}")
        for name in ("dropout", "embed_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"`{name}`: expected a probability in [0, 1), got {getattr(self, name)!r}")

    def to_dict(self) -> dict:
        return asdict(self)


def scan_directions(run: Callable[..., torch.Tensor], tensors: tuple[torch.Tensor, ...], directions: str,
                    batched: bool = False) -> torch.Tensor:
    """Sum of `run(reverse, *tensors)` over the scan directions; tensors [B, T, ...] share B and T.

    "causal": forward only; "bi": forward plus the flipped sequence's output flipped back; "2d": T = S², forward and
    reverse along the rows and along the columns of the S × S grid (row-major positions). `batched`: `run` ignores
    `reverse`, so every direction goes through one call on the directions stacked along the batch (one launch of
    each kernel instead of one per direction).
    """
    if directions not in ("causal", "bi", "2d"):
        raise ValueError(f"`directions`: expected 'causal', 'bi' or '2d', got {directions!r}")
    B, T = tensors[0].shape[:2]
    side = _grid_side(T, directions)
    views = [_direction_views(t, directions, side) for t in tensors]
    reverse = [k % 2 == 1 for k in range(len(views[0]))]
    if batched and len(reverse) > 1:
        ys = run(False, *(torch.cat(v) for v in views)).chunk(len(reverse))
    else:
        ys = [run(rev, *(v[k] for v in views)) for k, rev in enumerate(reverse)]
    if directions == "causal":
        return ys[0]
    if directions == "bi":
        return ys[0] + ys[1].flip(1)
    rest = ys[0].shape[2:]
    rows = (ys[0] + ys[1].flip(1)).reshape(B, T, *rest)
    return rows + _transpose_grid((ys[2] + ys[3].flip(1)).reshape(B, T, *rest), side)


def _grid_side(T: int, directions: str) -> int:
    side = math.isqrt(T)
    if directions.startswith("2d") and side * side != T:
        raise ValueError(f"`directions`: {directions!r} needs a square number of positions, got {T}")
    return side


def _transpose_grid(t: torch.Tensor, side: int) -> torch.Tensor:
    """`t` [B, side², ...] in row-major grid order → column-major (its own inverse)."""
    B, rest = t.shape[0], t.shape[2:]
    return t.reshape(B, side, side, *rest).transpose(1, 2).reshape(t.shape)


def _direction_views(t: torch.Tensor, directions: str, side: int) -> list[torch.Tensor]:
    """`t` [B, T, ...] as each direction reads it: [forward] ("causal"), [forward, reversed] ("bi"), or the rows
    and the columns of the grid, [B·S, S, ...] each, forward and reversed ("2d")."""
    if directions == "causal":
        return [t]
    if directions == "bi":
        return [t, t.flip(1)]
    B, rest = t.shape[0], t.shape[2:]
    rows = t.reshape(B * side, side, *rest)
    cols = _transpose_grid(t, side).reshape(B * side, side, *rest)
    return [rows, rows.flip(1), cols, cols.flip(1)]


SMALL_HEADS_BACKEND = {"chunk": "scan"}  # the layer's `hgrn2` backend → `hgrn2_small_heads`'s (HGRN1's) name


def scan_both_ways(run: Callable[..., torch.Tensor], tensors: tuple[torch.Tensor, ...], directions: str
                   ) -> torch.Tensor:
    """`scan_directions` for a `run(bidirectional, *tensors)` that scans both ways itself (forward plus reverse
    summed): once on the sequence ("causal" forward only, "bi"), or on the grid's rows and on its columns ("2d")."""
    if directions in ("causal", "bi"):
        return run(directions == "bi", *tensors)
    if directions != "2d":
        raise ValueError(f"`directions`: expected 'causal', 'bi' or '2d', got {directions!r}")
    B, T = tensors[0].shape[:2]
    side = _grid_side(T, directions)
    rows = run(True, *(t.reshape(B * side, side, *t.shape[2:]) for t in tensors))
    cols = run(True, *(_transpose_grid(t, side).reshape(B * side, side, *t.shape[2:]) for t in tensors))
    return rows.reshape(B, T, *rows.shape[2:]) + _transpose_grid(cols.reshape(B, T, *cols.shape[2:]), side)


class BiHGRU2(HGRU2):
    """HGRU2 (paper parameterisation) scanning in several directions with shared projections (`BiHgru2_1d`), or
    composed along columns then rows ("2d_series")."""

    def __init__(self, hidden_size: int, *, directions: str = "bi", **options: Any) -> None:
        options = {"expand_ratio": 2, "o_act": "sigmoid", "i_act": "silu", "scale": 1.0, "norm": "layernorm",
                   "bias": True, **options}
        super().__init__(hidden_size, **options)
        self.directions = directions

    def forward(self, x: torch.Tensor, lower_bound: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        if self.directions != "2d_series":
            return self._mix(x, lower_bound, attention_mask, self.directions)
        B, T, D = x.shape
        side = _grid_side(T, self.directions)
        mask = None if attention_mask is None else _transpose_grid(attention_mask, side).reshape(B * side, side)
        cols = self._mix(_transpose_grid(x, side).reshape(B * side, side, D), lower_bound, mask, "bi")
        rows = _transpose_grid(cols.reshape(B, T, D), side).reshape(B * side, side, D)
        mask = None if attention_mask is None else attention_mask.reshape(B * side, side)
        return self._mix(rows, lower_bound, mask, "bi").reshape(B, T, D)

    def _mix(self, x: torch.Tensor, lower_bound: torch.Tensor | None, attention_mask: torch.Tensor | None,
             directions: str) -> torch.Tensor:
        """Projections, the scans of `directions` summed, output norm and projection: x [B, T, D] → [B, T, D]."""
        B, T, D = x.shape
        H, K = self.num_heads, self.head_dim
        projs = (self.q_proj, self.f_proj, self.i_proj)
        q, f, i = (t.view(B, T, H, K) for t in linears(x, (p.weight for p in projs), (p.bias for p in projs)))
        i = F.silu(i) if self.i_act == "silu" else i
        if attention_mask is not None:
            # padding contributes no input and keeps the state, in either direction
            keep = attention_mask.to(torch.bool)[..., None, None]
            i, f = i * keep, f.masked_fill(~keep, 1e4)
        lb = None if lower_bound is None else lower_bound.view(H, K)

        if K <= SMALL_HEADS_MAX:
            backend = SMALL_HEADS_BACKEND.get(self.backend, self.backend)

            def run_both(bidirectional: bool, q, f, i):
                return hgrn2_small_heads(q, f, i, lb, scale=self.scale, o_act=self.o_act, bidirectional=bidirectional,
                                         backend=backend)

            y = scan_both_ways(run_both, (q, f, i), directions)
        else:
            def run(reverse: bool, q, f, i):
                return hgrn2(q, f, i, lb, scale=self.scale, o_act=self.o_act, backend=self.backend)[0]

            y = scan_directions(run, (q, f, i), directions, batched=True)
        return self.o_proj(self.g_norm(y.reshape(B, T, D)))


class BiHGRU1(HGRU1Complex):
    """Complex HGRU scanning in several directions with shared projections and one θ per direction (`BiHgru1d`)."""

    def __init__(self, hidden_size: int, *, directions: str = "bi", **options: Any) -> None:
        super().__init__(hidden_size, **options)
        self.directions = directions
        self.theta_reverse = nn.Parameter(self.theta.detach().clone())

    def forward(self, x: torch.Tensor, lower_bound: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        u = F.silu(self.input_proj(x)) if self.act == "silu" else self.input_proj(x)
        u = u.float().unflatten(-1, (self.hidden_size, 2))
        i, g = torch.complex(u[..., 0], u[..., 1]), self.lambda_proj(x).float()
        if attention_mask is not None:
            # the state still rotates through padding, harmlessly: padding is a suffix, so forward scans meet it
            # after every real token and reverse scans start in it from a zero state
            keep = attention_mask.to(torch.bool)[..., None]
            i, g = i * keep, g.masked_fill(~keep, 1e4)

        def run(reverse: bool, i, g):
            return hgrn1(i, g, lower_bound, theta=self.theta_reverse if reverse else self.theta,
                         backend=self.backend)[0]

        h = scan_directions(run, (i, g), self.directions)
        feature = self.norm(torch.cat([h.real, h.imag], -1).to(x.dtype))
        gate = self.gate(x)
        return self.out_proj(feature * (F.silu(gate) if self.act == "silu" else gate))


class BiAttention(nn.Module):
    """Multi-head softmax attention over the whole sequence (no causal mask), padded keys masked."""

    def __init__(self, hidden_size: int, *, num_heads: int = 8, dropout: float = 0.0) -> None:
        super().__init__()
        if hidden_size % num_heads:
            raise ValueError(f"`num_heads`: expected a divisor of hidden_size={hidden_size}, got {num_heads}")
        self.num_heads, self.dropout = num_heads, dropout
        self.qkv_proj = nn.Linear(hidden_size, 3 * hidden_size)
        self.o_proj = nn.Linear(hidden_size, hidden_size)

    def forward(self, x: torch.Tensor, lower_bound: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        B, T, D = x.shape
        q, k, v = self.qkv_proj(x).view(B, T, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        mask = None if attention_mask is None else attention_mask.to(torch.bool)[:, None, None, :]
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, D))


class SeqNorm(nn.Module):
    """LayerNorm over channels, or BatchNorm over (batch, positions) per channel (SyncBatchNorm under DDP); with
    `group`, training statistics over each `group` sequences of the batch (see `LRAModelConfig.bn_group`); given
    `valid` positions, training statistics over those alone (`LRAModelConfig.pad_group`)."""

    def __init__(self, kind: str, hidden_size: int, group: int | None = None):
        super().__init__()
        self.kind, self.group = kind, group
        self.norm = nn.BatchNorm1d(hidden_size) if kind == "batch" else nn.LayerNorm(hidden_size)

    def forward(self, x: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """x [B, T, D]; `valid` [B, T] bool: in training, BatchNorm's statistics come from these positions alone and
        the others come out 0 (nothing reads them); None: all positions."""
        if self.kind != "batch":
            return self.norm(x)
        if valid is not None and self.training:
            return self._masked(x, valid)
        if self.group is None or not self.training or x.shape[0] <= self.group:
            # [B·T, D] rows: statistics over batch and positions, without transposed copies
            return self.norm(x.reshape(-1, x.shape[-1])).view(x.shape)
        first, *rest = x.split(self.group)
        n = self.norm
        rows = [n(first.reshape(-1, x.shape[-1]))]  # the only group that moves the running statistics
        rows += [F.batch_norm(g.reshape(-1, x.shape[-1]), None, None, n.weight, n.bias, True, 0.0, n.eps) for g in rest]
        return torch.cat(rows).view(x.shape)

    def _masked(self, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Training BatchNorm over the `valid` positions, summed over the ranks for a SyncBatchNorm in a process group,
        from sums (no data-dependent shapes, so nothing waits for the GPU); float32 at least, as under autocast."""
        n = self.norm
        rows = x.reshape(-1, x.shape[-1])
        rows = rows.to(torch.promote_types(rows.dtype, torch.float32))
        w = valid.reshape(-1, 1).to(rows.dtype)
        first = _rank_sum(torch.cat([w.sum(0), (rows * w).sum(0)]), n)
        count, mean = first[0], first[1:] / first[0]
        centred = (rows - mean) * w
        var = _rank_sum((centred * centred).sum(0), n) / count
        with torch.no_grad():
            n.num_batches_tracked.add_(1)
            n.running_mean.lerp_(mean.to(n.running_mean.dtype), n.momentum)
            n.running_var.lerp_((var * count / (count - 1)).to(n.running_var.dtype), n.momentum)
        return (centred * torch.rsqrt(var + n.eps) * n.weight + n.bias * w).view(x.shape)


def _rank_sum(t: torch.Tensor, norm: nn.Module) -> torch.Tensor:
    """`t` summed over the ranks of a SyncBatchNorm's process group (differentiably); `t` itself otherwise."""
    import torch.distributed as dist

    if not (isinstance(norm, nn.SyncBatchNorm) and dist.is_available() and dist.is_initialized()):
        return t
    from torch.distributed.nn.functional import all_reduce

    return all_reduce(t, group=norm.process_group or dist.group.WORLD)


class Block(nn.Module):
    """Pre-norm residual token mixer, then pre-norm residual GLU (the LRA code's two residual layers per block)."""

    def __init__(self, cfg: LRAModelConfig, layer_idx: int):
        super().__init__()
        d = cfg.hidden_size
        self.mixer_norm, self.mlp_norm = SeqNorm(cfg.norm, d, cfg.bn_group), SeqNorm(cfg.norm, d, cfg.bn_group)
        if cfg.mixer == "hgrn2":
            self.mixer = BiHGRU2(d, layer_idx=layer_idx, expand_ratio=cfg.expand_ratio, directions=cfg.directions)
        elif cfg.mixer == "hgrn1":
            self.mixer = BiHGRU1(d, layer_idx=layer_idx, directions=cfg.directions)
        else:
            self.mixer = BiAttention(d, num_heads=cfg.num_heads, dropout=cfg.dropout)
        self.mlp = GLU(d, intermediate_size=max(1, int(d * cfg.glu_expand)), bias=True)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, lower_bound: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, valid: torch.Tensor | None = None) -> torch.Tensor:
        """`valid`: the positions the norms' batch statistics come from (`SeqNorm`)."""
        x = x + self.drop(self.mixer(self.mixer_norm(x, valid), lower_bound=lower_bound,
                                     attention_mask=attention_mask))
        return x + self.drop(self.mlp(self.mlp_norm(x, valid)))


def sinusoidal(max_len: int, d: int) -> torch.Tensor:
    """[max_len, d] sin/cos position table (the LRA code's `PositionalEncoder`)."""
    pos = torch.arange(max_len, dtype=torch.float32)[:, None]
    div = torch.exp(-math.log(10000.0) * torch.arange(0, d, 2, dtype=torch.float32) / d)
    pe = torch.zeros(max_len, d)
    pe[:, 0::2] = torch.sin(pos * div)
    pe[:, 1::2] = torch.cos(pos * div)[:, : d // 2]
    return pe


class LRAEncoder(nn.Module):
    """Inputs [B, T] token ids or [B, T, C] pixels (+ mask [B, T]) → pooled features [B, hidden]."""

    def __init__(self, cfg: LRAModelConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.hidden_size
        self.embed = nn.Embedding(cfg.vocab_size, d) if cfg.vocab_size else nn.Linear(cfg.in_channels, d)
        if cfg.positional:
            self.register_buffer("positions", sinusoidal(cfg.max_len, d), persistent=False)
        self.drop = nn.Dropout(cfg.embed_dropout)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.num_layers))
        self.norm = SeqNorm(cfg.norm, d, cfg.bn_group)
        # layer 0's bound is 0, so a single layer has none to learn (and DDP refuses parameters without gradients)
        use_lb = cfg.use_lower_bound and cfg.mixer != "attention" and cfg.num_layers > 1
        self.lower_bounds = nn.Parameter(torch.zeros(cfg.num_layers, d)) if use_lb else None

    def forward(self, inputs: torch.Tensor, attention_mask: torch.Tensor | None = None,
                valid: torch.Tensor | None = None) -> torch.Tensor:
        """`valid` [B, T] bool: the positions the batch would hold if padded to its longest sequence only; a batch
        padded further (one shape for every batch, as a CUDA graph needs) passes it, and the model computes what it
        computes on the shorter batch. None: every position."""
        T = inputs.shape[1]
        if valid is not None and self.cfg.bn_group is not None:
            raise ValueError("`valid`: BatchNorm statistics per bn_group are taken over every position; a batch "
                             "padded past its longest sequence needs bn_group None")
        if T > self.cfg.max_len:
            raise ValueError(f"`inputs`: {T} positions exceed max_len={self.cfg.max_len}")
        x = self.embed(inputs if self.cfg.vocab_size else inputs.to(self.embed.weight.dtype))
        if self.cfg.positional:
            x = x + self.positions[:T].to(x.dtype)
        x = self.drop(x)
        betas = layer_bounds(lower_bounds_from_logits(self.lower_bounds) if self.lower_bounds is not None else None,
                             len(self.layers))
        if self.cfg.pad_group is not None and attention_mask is not None:
            group = group_padding(attention_mask, self.cfg.pad_group)
            valid = group if valid is None else valid & group
        mixer_mask = attention_mask if self.cfg.mask_padding else valid
        for layer, beta in zip(self.layers, betas):
            x = layer(x, beta, mixer_mask, valid)
        x = self.norm(x, valid)
        return pool(x, attention_mask, self.cfg.pooling)


def group_padding(mask: torch.Tensor, group: int) -> torch.Tensor:
    """[B, T] bool: the positions before the longest sequence of each group of `group` consecutive rows of `mask`
    (0/1 [B, T], right padding), i.e. those a batch of that group alone would have."""
    lengths = mask.long().sum(1)
    n = -(-lengths.shape[0] // group)
    longest = F.pad(lengths, (0, n * group - lengths.shape[0])).view(n, group).amax(1)
    return torch.arange(mask.shape[1], device=mask.device) < longest.repeat_interleave(group)[: lengths.shape[0], None]


def pool(x: torch.Tensor, mask: torch.Tensor | None, how: str) -> torch.Tensor:
    """Mean over real positions, or the last real position; x [B, T, D], mask [B, T] 0/1 (right padding)."""
    if mask is None:
        return x.mean(1) if how == "mean" else x[:, -1]
    m = mask.to(x.dtype)
    if how == "mean":
        return (x * m[..., None]).sum(1) / m.sum(1, keepdim=True).clamp(min=1)
    last = (mask.long().sum(1) - 1).clamp(min=0)
    return x[torch.arange(x.shape[0], device=x.device), last]


class LRAClassifier(nn.Module):
    """`logits = model(inputs, mask[, valid])`; with `cfg.dual`, inputs/mask/valid are pairs ([2, B, T] or a tuple of
    two). `valid`: see `LRAEncoder.forward`."""

    def __init__(self, cfg: LRAModelConfig):
        super().__init__()
        self.cfg = cfg
        self.encoder = LRAEncoder(cfg)
        d = cfg.hidden_size
        if cfg.dual:
            self.head = nn.Sequential(nn.Linear(4 * d, d), nn.GELU(), nn.Linear(d, cfg.num_classes))
        else:
            self.head = nn.Linear(d, cfg.num_classes)

    def forward(self, inputs: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
                attention_mask: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None = None,
                valid: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        if not self.cfg.dual:
            return self.head(self.encoder(inputs, attention_mask, valid))
        a, b = inputs[0], inputs[1]
        # both documents in one batch, so batch statistics (BatchNorm) see them together as in the LRA code
        feats = self.encoder(torch.cat([a, b]), _joined(attention_mask), _joined(valid))
        fa, fb = feats.chunk(2)
        return self.head(torch.cat([fa, fb, fa - fb, fa * fb], -1))


def _joined(pair) -> torch.Tensor | None:
    """A pair's two [B, ...] tensors as one [2B, ...] batch; None stays None."""
    return None if pair is None else torch.cat([pair[0], pair[1]])


def num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


__all__ = ["LRAModelConfig", "LRAClassifier", "LRAEncoder", "BiHGRU2", "BiHGRU1", "BiAttention", "scan_directions",
           "scan_both_ways", "pool", "group_padding", "num_parameters", "MIXERS"]
