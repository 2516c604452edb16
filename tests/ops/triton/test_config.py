"""The kernels' launch configs (`hgrn2.ops.triton.config`): frozen, validated, overridable per call and per block
of code, restored after the block, and handed to the launchers as the key a compiled graph keeps."""

import dataclasses

import pytest
import torch

from hgrn2.ops.triton import chunk_parallel as parallel_mod
from hgrn2.ops.triton import fused_chunk as fused_mod
from hgrn2.ops.triton import hgrn2_chunk_parallel_triton, hgrn2_fused_chunk_triton, takes_chunk_parallel
from hgrn2.ops.triton.config import (
    ChunkParallelConfig,
    DispatchConfig,
    FusedChunkConfig,
    config_key,
    current,
    from_key,
    launch_config,
)

from .harness import make_inputs, needs_triton


def test_defaults_are_the_tuned_settings():
    """The defaults the launchers have always used (a change here changes every kernel's launch)."""
    f = FusedChunkConfig()
    assert (f.block_t_fwd, f.block_t_bwd, f.bwd_split, f.max_bv_fwd, f.max_bv_bwd, f.num_warps_fwd, f.num_warps_bwd,
            f.num_stages_fwd, f.num_stages_bwd, f.split_below_fwd, f.split_below_bwd, f.max_spread,
            f.fp32_dot_precision) == (32, None, None, 128, 128, None, None, None, None, 0.5, 0.5, 60.0, "ieee")
    p = ChunkParallelConfig()
    assert (p.block_t, p.block_t_fp32, p.block_k, p.block_k_bwd, p.block_v, p.block_k_seq, p.block_k_decay,
            p.block_v_seq, p.seq_split_below, p.num_warps, p.num_warps_bwd, p.num_warps_seq, p.maxnreg_seq,
            p.state_dtype, p.save_a, p.save_b, p.bwd_split, p.chunk_max_spread, p.walk_max_spread, p.half_max_spread,
            p.half_max_spread_fp32, p.max_spread, p.fp32_dot_precision) == (
        64, 32, 32, 32, None, 64, 32, None, 0.5, 4, None, None, None, None, True, True, None, 120.0, 256.0, 120.0,
        -1.0, 60.0, "ieee")
    d = DispatchConfig()
    assert (d.decode_max_t, d.parallel_max_programs, d.parallel_min_t, d.parallel_train_min_work) == (
        16, 64, 1024, 131072)


@pytest.mark.parametrize("cls", [FusedChunkConfig, ChunkParallelConfig, DispatchConfig])
def test_frozen(cls):
    cfg = cls()
    field = dataclasses.fields(cfg)[1].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(cfg, field, getattr(cfg, field))


@pytest.mark.parametrize("cls,field,value,message", [
    (ChunkParallelConfig, "block_t", 40, "ChunkParallelConfig.block_t must be a power of two ≥ 16, got 40"),
    (ChunkParallelConfig, "block_v", 8, "ChunkParallelConfig.block_v must be a power of two ≥ 16, got 8"),
    (ChunkParallelConfig, "num_warps", 3, "ChunkParallelConfig.num_warps must be one of"),
    (ChunkParallelConfig, "save_a", 1, "ChunkParallelConfig.save_a must be True or False, got 1"),
    (ChunkParallelConfig, "state_dtype", torch.int8, "ChunkParallelConfig.state_dtype must be torch.bfloat16"),
    (FusedChunkConfig, "fp32_dot_precision", "tf64", "FusedChunkConfig.fp32_dot_precision must be one of"),
    (FusedChunkConfig, "split_below_fwd", -1, "FusedChunkConfig.split_below_fwd must be a number ≥ 0, got -1"),
    (FusedChunkConfig, "max_spread", "60", "FusedChunkConfig.max_spread must be a number, got '60'"),
    (DispatchConfig, "decode_max_t", 1.5, "DispatchConfig.decode_max_t must be an integer ≥ 0, got 1.5"),
])
def test_bad_values_are_clear_errors(cls, field, value, message):
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(".", r"\.")):
        cls(**{field: value})


def test_context_manager_overrides_and_restores():
    default = current(ChunkParallelConfig)
    small, smaller = ChunkParallelConfig(block_t=32), ChunkParallelConfig(block_t=16)
    with launch_config(chunk_parallel=small, dispatch=DispatchConfig(decode_max_t=0)):
        assert current(ChunkParallelConfig) is small and current(DispatchConfig).decode_max_t == 0
        assert current(FusedChunkConfig) == FusedChunkConfig()  # not named: unchanged
        with launch_config(chunk_parallel=smaller):
            assert current(ChunkParallelConfig) is smaller
        assert current(ChunkParallelConfig) is small
    assert current(ChunkParallelConfig) is default and current(DispatchConfig) == DispatchConfig()
    with pytest.raises(RuntimeError), launch_config(fused_chunk=FusedChunkConfig(block_t_fwd=16)):
        raise RuntimeError  # restored on errors too
    assert current(FusedChunkConfig) == FusedChunkConfig()


def test_wrong_config_type_is_a_clear_error():
    with pytest.raises(TypeError, match="expected a FusedChunkConfig, got ChunkParallelConfig"):
        with launch_config(fused_chunk=ChunkParallelConfig()):
            pass
    with pytest.raises(TypeError, match="config must be a ChunkParallelConfig, got FusedChunkConfig"):
        config_key(FusedChunkConfig(), ChunkParallelConfig)


def test_key_names_the_config_across_processes():
    """The key (the repr) gives back an equal config, also one this process never made (a cached compiled
    graph's)."""
    cfg = ChunkParallelConfig(block_t=32, state_dtype=torch.float32, save_a=False)
    assert from_key(cfg.key) is cfg or from_key(cfg.key) == cfg
    fresh = "FusedChunkConfig(block_t_fwd=16, max_bv_bwd=64, fp32_dot_precision='tf32x3')"
    assert from_key(fresh) == FusedChunkConfig(block_t_fwd=16, max_bv_bwd=64, fp32_dot_precision="tf32x3")


def test_dispatch_threshold_by_argument_and_context():
    assert not takes_chunk_parallel(4, 2, 320, grad=True)
    assert takes_chunk_parallel(4, 2, 320, grad=True, config=DispatchConfig(parallel_train_min_work=600))
    with launch_config(dispatch=DispatchConfig(parallel_train_min_work=600)):
        assert takes_chunk_parallel(4, 2, 320, grad=True)
        assert not takes_chunk_parallel(4, 2, 320, grad=True, config=DispatchConfig())  # the argument wins


def _spy_keys(monkeypatch, mod, name):
    """Record the config each launch of mod.name receives."""
    seen = []
    real = getattr(mod, name)

    def spy(*args):
        seen.append(from_key(args[-1]))
        return real(*args)

    monkeypatch.setattr(mod, name, spy)
    return seen


@needs_triton
def test_launchers_take_the_config_by_argument_and_context(monkeypatch):
    """Both families' forward and backward launch with the config given as an argument, else the context's, else
    the defaults; the argument wins over the context."""
    seen = {"fused": _spy_keys(monkeypatch, fused_mod, "fused_chunk_fwd"),
            "fused_bwd": _spy_keys(monkeypatch, fused_mod, "fused_chunk_bwd"),
            "parallel": _spy_keys(monkeypatch, parallel_mod, "chunk_parallel_fwd")}
    o, g, i, lb, _ = make_inputs(1, 20, 1, 16, 16)
    arg, ctx = FusedChunkConfig(block_t_fwd=16), FusedChunkConfig(max_spread=-1.0)
    i.requires_grad_()
    hgrn2_fused_chunk_triton(o, g, i, lb)[0].sum().backward()
    with launch_config(fused_chunk=ctx, chunk_parallel=ChunkParallelConfig(block_t_fp32=16)):
        hgrn2_fused_chunk_triton(o, g, i, lb)[0].sum().backward()
        hgrn2_fused_chunk_triton(o, g, i, lb, config=arg)
        hgrn2_chunk_parallel_triton(o, g, i, lb)
    hgrn2_chunk_parallel_triton(o, g, i, lb, config=ChunkParallelConfig(save_b=False))
    assert seen["fused"] == [FusedChunkConfig(), ctx, arg]
    assert seen["fused_bwd"] == [FusedChunkConfig(), ctx]
    assert seen["parallel"] == [ChunkParallelConfig(block_t_fp32=16), ChunkParallelConfig(save_b=False)]


def test_no_module_imports_another_ones_private_names():
    """Shared kernel helpers live in `_common.py` under public names: no module of hgrn2/ops/triton imports a
    private (underscored) name from another module."""
    import ast
    import pathlib

    import hgrn2.ops.triton as pkg

    offending = []
    for path in pathlib.Path(pkg.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                offending += [f"{path.name}: {alias.name}" for alias in node.names if alias.name.startswith("_")]
    assert not offending
