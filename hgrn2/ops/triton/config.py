"""Launch settings of the HGRN2 training kernels: one frozen dataclass per kernel family, plus the dispatch rule.

The defaults are the tuned settings; tests and sweeps override them per call (`config=` of the launchers) or for
a block of code:

    with launch_config(chunk_parallel=ChunkParallelConfig(block_t=32)):
        y, _ = hgrn2_triton(o, g, i)

Each config has a `key` (its repr) that the torch custom ops take as a string argument, so a compiled graph
holds the settings as a constant. torch.compile reads the context's settings when it traces (they are not
guarded): a graph compiled under one `launch_config` keeps those settings.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator

import torch

_BY_KEY: dict[str, _Config] = {}
_WARPS = (1, 2, 4, 8, 16, 32)
_PRECISIONS = ("ieee", "tf32", "tf32x3")


def _fail(cfg, name: str, want: str, got) -> None:
    raise ValueError(f"{type(cfg).__name__}.{name} must be {want}, got {got!r}")


def _pow2(n) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n >= 16 and n & (n - 1) == 0


@dataclasses.dataclass(frozen=True)
class _Config:
    """Validation and the registry of keys, shared by the configs below."""

    key: str = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if f.init:
                self._check(f.name, getattr(self, f.name), f.metadata["kind"])
        object.__setattr__(self, "key", repr(self))
        _BY_KEY.setdefault(self.key, self)

    def _check(self, name: str, v, kind: str) -> None:
        if v is None and kind.endswith("?"):
            return
        kind = kind.rstrip("?")
        if kind == "block" and not _pow2(v):
            _fail(self, name, "a power of two ≥ 16", v)
        if kind == "warps" and v not in _WARPS:
            _fail(self, name, f"one of {_WARPS}", v)
        if kind == "share" and (isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0):
            _fail(self, name, "a number ≥ 0", v)
        if kind == "spread" and (isinstance(v, bool) or not isinstance(v, (int, float))):
            _fail(self, name, "a number", v)
        if kind == "flag" and not isinstance(v, bool):
            _fail(self, name, "True or False", v)
        if kind == "count" and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            _fail(self, name, "an integer ≥ 0", v)
        if kind == "precision" and v not in _PRECISIONS:
            _fail(self, name, f"one of {_PRECISIONS}", v)
        if kind == "dtype" and v not in (torch.bfloat16, torch.float16, torch.float32):
            _fail(self, name, "torch.bfloat16, torch.float16 or torch.float32", v)


def _knob(default, kind: str):
    """A config field; kind names its check (a trailing ? also allows None)."""
    return dataclasses.field(default=default, metadata={"kind": kind})


@dataclasses.dataclass(frozen=True)
class FusedChunkConfig(_Config):
    """The fused-chunk kernels (`fused_chunk.py`): one program walks a sequence (per head and V-block) in steps of
    block_t tokens, the state in registers. NOTES.md gives the reason for each default."""

    block_t_fwd: int = _knob(32, "block")  # tokens per step of the forward
    # tokens per step of the backward's sweeps (both must step alike); None: 32 for the split form, 16 fused
    block_t_bwd: int | None = _knob(None, "block?")
    # the backward's reverse sweep as a state-only sweep plus a parallel kernel per step (True) or one sweep
    # (False); None: split where V is split and the dot operands are bf16
    bwd_split: bool | None = _knob(None, "flag?")
    max_bv_fwd: int = _knob(128, "block")  # the widest V-block of a program
    max_bv_bwd: int = _knob(128, "block")
    num_warps_fwd: int | None = _knob(None, "warps?")  # None: 8 for states of 8192+ elements, else 4
    num_warps_bwd: int | None = _knob(None, "warps?")
    num_stages_fwd: int | None = _knob(None, "count?")  # software-pipelining stages (None: Triton's default)
    num_stages_bwd: int | None = _knob(None, "count?")
    # V is split while the programs fill less than this share of the SMs
    split_below_fwd: float = _knob(0.5, "share")
    split_below_bwd: float = _knob(0.5, "share")
    # the largest exponent of a dot operand's decay factor: steps whose log-decay spread is below twice this take
    # one product for A (below this for its gradients), the others the exact tier
    max_spread: float = _knob(60.0, "spread")
    fp32_dot_precision: str = _knob("ieee", "precision")  # tl.dot precision for fp32 inputs


@dataclasses.dataclass(frozen=True)
class ChunkParallelConfig(_Config):
    """The chunk-parallel kernels (`chunk_parallel.py`): chunk-start states by a short sequential walk, then one
    program per chunk. NOTES.md gives the reason for each default."""

    block_t: int = _knob(64, "block")  # tokens per chunk, bf16 inputs
    block_t_fp32: int = _knob(32, "block")  # tokens per chunk, fp32 / fp16 inputs (fp32 dot operands)
    block_k: int = _knob(32, "block")  # K-block of the forward output kernel
    block_k_bwd: int = _knob(32, "block")  # K-block of the parallel backward kernel
    block_v: int | None = _knob(None, "block?")  # V-block of the parallel kernels (None: 128; fp32: 32)
    block_k_seq: int | None = _knob(64, "block?")  # widest K-block of the sequential walks (None: K)
    block_k_decay: int = _knob(32, "block")  # K-block of the decay kernel (the rounding of its scan follows it)
    block_v_seq: int | None = _knob(None, "block?")  # widest V-block of the sequential walks (None: 128; fp32: 64)
    # the sequential walks' blocks shrink (K first) while their programs fill less than this share of the SMs
    seq_split_below: float = _knob(0.5, "share")
    num_warps: int = _knob(4, "warps")  # forward output kernel
    num_warps_bwd: int | None = _knob(None, "warps?")  # None: 8 when block_t·max(BK, BV) ≥ 4096, else 4
    num_warps_seq: int | None = _knob(None, "warps?")  # None: 8 when BK·BV ≥ 4096, else 4
    maxnreg_seq: int | None = _knob(None, "count?")  # register cap of the sequential walks (None: the compiler's)
    state_dtype: torch.dtype | None = _knob(None, "dtype?")  # the stored chunk states (None: the input dtype)
    save_a: bool = _knob(True, "flag")  # keep the forward's intra-chunk A for the backward
    save_b: bool = _knob(True, "flag")  # keep the forward's within-chunk cumsum of log f for the backward
    # the backward in two parallel launches (dv; dq/dk/dg); None: split exactly when A is rebuilt
    bwd_split: bool | None = _knob(None, "flag?")
    # the small-gates dβ kernel (chunk_parallel_bwd_small_kernel): programs per SM, the V sub-block of its loops
    # over all of V (64 spills in bf16); its pair form's warps, (row, channel) pairs per step, the most steps
    # per channel holding a small gate for which a chunk takes it, and its K-block (the blocks without a small gate
    # skipped, as in the channel form); its channel form's warps and K-block (None: block_k_bwd)
    small_programs_per_sm: int = _knob(8, "count")
    sub_block_v_small: int = _knob(32, "block")
    num_warps_small: int = _knob(4, "warps")
    pairs_per_step_small: int = _knob(16, "block")
    pair_steps_per_channel: int = _knob(2, "count")
    block_k_pairs: int | None = _knob(16, "block?")  # the pair form's K-block (None: all of K up to 128)
    # register cap of both forms' launches (None: the compiler's; a lower cap keeps more programs resident per SM,
    # as their work is latency-bound, at the cost of spills)
    maxnreg_small: int | None = _knob(None, "count?")
    num_warps_channels: int = _knob(4, "warps")
    block_k_small: int | None = _knob(16, "block?")
    chunk_max_spread: float = _knob(120.0, "spread")  # chunks whose log-decay is below this: one product
    # chunks past chunk_max_spread whose two halves each decay by less than this: one product per half (heads
    # that forget fast), for bf16 dot operands; the others take the sub-block or exact tier. fp32 dot operands
    # (fp32, fp16 inputs): off, as the halves tier's exponents keep the rounding of b (~1e-6·|b|), which they show
    half_max_spread: float = _knob(120.0, "spread")
    half_max_spread_fp32: float = _knob(-1.0, "spread")
    # the forward walk takes e^{b_last − b} from b's difference below this chunk decay where the dot operands are
    # bf16 (b's rounding, ~1e-6·|b|, stays under a tenth of bf16's), from sums over the later rows above it; fp32
    # operands use chunk_max_spread
    walk_max_spread: float = _knob(256.0, "spread")
    max_spread: float = _knob(60.0, "spread")  # 16-token sub-blocks whose spread is below this: one product each
    fp32_dot_precision: str = _knob("ieee", "precision")  # tl.dot precision for fp32 inputs


@dataclasses.dataclass(frozen=True)
class DispatchConfig(_Config):
    """Which kernel `hgrn2_triton` runs (see its docstring)."""

    decode_max_t: int = _knob(16, "count")  # at most this many tokens without autograd: the recurrent kernel
    # the chunk-parallel kernels take at most this many (sequence, head) pairs of at least parallel_min_t tokens
    # per sequence, and, with autograd, any input of at least parallel_train_min_work tokens × heads
    parallel_max_programs: int = _knob(64, "count")
    parallel_min_t: int = _knob(1024, "count")
    parallel_train_min_work: int = _knob(131072, "count")


# the defaults are frozen, so sharing them is safe
_CURRENT = {cls: contextvars.ContextVar(cls.__name__, default=cls())  # noqa: B039
            for cls in (FusedChunkConfig, ChunkParallelConfig, DispatchConfig)}


@contextlib.contextmanager
def launch_config(*, fused_chunk: FusedChunkConfig | None = None, chunk_parallel: ChunkParallelConfig | None = None,
                  dispatch: DispatchConfig | None = None) -> Iterator[None]:
    """Run the block with these configs in place of the current ones (None: keep the current)."""
    tokens = []
    for cls, cfg in ((FusedChunkConfig, fused_chunk), (ChunkParallelConfig, chunk_parallel),
                     (DispatchConfig, dispatch)):
        if cfg is not None:
            if not isinstance(cfg, cls):
                raise TypeError(f"launch_config: expected a {cls.__name__}, got {type(cfg).__name__}")
            tokens.append((cls, _CURRENT[cls].set(cfg)))
    try:
        yield
    finally:
        for cls, token in reversed(tokens):
            _CURRENT[cls].reset(token)


def _current_key(cls):
    var = _CURRENT[cls]

    @torch.compiler.assume_constant_result  # torch.compile cannot trace ContextVar.get: a trace-time constant
    def key() -> str:
        return var.get().key

    return key


_fused_chunk_key = _current_key(FusedChunkConfig)
_chunk_parallel_key = _current_key(ChunkParallelConfig)
_dispatch_key = _current_key(DispatchConfig)


_CURRENT_KEY = {FusedChunkConfig: _fused_chunk_key, ChunkParallelConfig: _chunk_parallel_key,
                DispatchConfig: _dispatch_key}


def config_key(cfg: _Config | None, cls: type[_Config]) -> str:
    """The key of cfg, or of the current config of type cls when cfg is None."""
    if cfg is None:
        return _CURRENT_KEY[cls]()
    if not isinstance(cfg, cls):
        raise TypeError(f"config must be a {cls.__name__}, got {type(cfg).__name__}")
    return cfg.key


def from_key(key: str) -> _Config:
    """The config with this key (made again from the key where a compiled graph outlived the process)."""
    cfg = _BY_KEY.get(key)
    if cfg is None:
        names = {"torch": torch, "FusedChunkConfig": FusedChunkConfig, "ChunkParallelConfig": ChunkParallelConfig,
                 "DispatchConfig": DispatchConfig}
        cfg = eval(key, {"__builtins__": {}}, names)  # noqa: S307 - a repr of one of the classes above
    return cfg


def current_dispatch(cfg: DispatchConfig | None = None) -> DispatchConfig:
    """cfg, or the current dispatch config."""
    return from_key(config_key(cfg, DispatchConfig))


def current(cls: type[_Config]) -> _Config:
    """The config of type cls in effect here (the defaults outside any `launch_config`)."""
    return _CURRENT[cls].get()
