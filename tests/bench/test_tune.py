"""`hgrn2 bench tune`: variants of a launch config parsed from FIELD=VALUE, timed beside the current config on the
gate's rows, with each variant's agreement with the current config's results."""

import argparse
import json

import pytest
import torch

from hgrn2.bench import tune
from hgrn2.ops.triton.config import ChunkParallelConfig, DispatchConfig


def test_variants_take_each_field_in_its_type():
    cfg = tune.parse_variant("chunk_parallel", "small_programs_per_sm=2, chunk_max_spread=90, save_a=false,"
                                               "block_v=none,state_dtype=float32")
    assert isinstance(cfg, ChunkParallelConfig)
    assert (cfg.small_programs_per_sm, cfg.chunk_max_spread, cfg.save_a, cfg.block_v, cfg.state_dtype) == (
        2, 90.0, False, None, torch.float32)
    assert cfg.block_t == ChunkParallelConfig().block_t  # the rest as the current config
    assert tune.parse_variant("dispatch", "decode_max_t=4") == DispatchConfig(decode_max_t=4)


@pytest.mark.parametrize("text, message", [
    ("small_programs_per_sm", "expected FIELD=VALUE"),
    ("", "expected FIELD=VALUE"),
    ("block_kk=64", "did you mean block_k"),
    ("block_k=wide", "block_k takes a number"),
    ("save_a=yes", "save_a takes true or false"),
    ("block_k=40", "block_k must be a power of two"),
    ("state_dtype=int8", "state_dtype takes one of"),
])
def test_bad_variants_are_named(text, message):
    with pytest.raises(ValueError, match=message) as e:
        tune.parse_variant("chunk_parallel", text)
    assert str(e.value).startswith("--variant: ")


def args(**kw):
    base = dict(family="chunk_parallel", variant=["small_programs_per_sm=2"], rows="closed gates B2 T64", rounds=1,
                quick=True, out=None)
    return argparse.Namespace(**{**base, **kw})


def test_quick_run_times_each_variant_beside_the_current_config(tmp_path, capsys):
    assert tune.run(args(variant=["small_programs_per_sm=2", "num_warps_small=8"], out=str(tmp_path))) == 0
    rec = json.loads((tmp_path / "tune.json").read_text())
    assert rec["family"] == "chunk_parallel" and rec["quick"]
    assert [(r["row"], r["variant"]) for r in rec["rows"]] == [
        ("closed gates B2 T64", v) for v in ("current", "small_programs_per_sm=2", "num_warps_small=8")]
    assert rec["rows"][0]["vs_current"] == 1 and all(r["max_rel_diff"] < 1e-5 for r in rec["rows"])
    assert "closed gates B2 T64" in capsys.readouterr().out


@pytest.mark.parametrize("kw, message", [(dict(rows="layer"), "--rows"), (dict(rounds=0), "--rounds"),
                                         (dict(variant=["nothing=1"]), "--variant")])
def test_argument_errors(kw, message):
    with pytest.raises(ValueError, match=message):
        tune.run(args(**kw))
