"""`hgrn2 bench ops --quick` runs end to end on the CPU and writes its result record (no timings checked: the GPU
run is the benchmark)."""

import argparse
import json

from hgrn2.bench import ops


def test_quick_run_writes_rows(tmp_path):
    parser = argparse.ArgumentParser()
    ops.add_arguments(parser)
    assert ops.run(parser.parse_args(["--quick", "--device", "cpu", "--out", str(tmp_path), "--skip", "seq"])) == 0
    result = json.loads((tmp_path / "ops.json").read_text())
    kinds = [r["kind"] for r in result["rows"]]
    assert sorted(kinds) == ["add+rmsnorm", "ce", "decode", "decode", "hgrn1", "rmsnorm", "swiglu"]
    for row in result["rows"]:
        assert not any(k.endswith("_error") for k in row), row
        if row["kind"] == "decode":
            assert row["ours_api_ms"] > 0 and row.get("ours_graph_ms") is None, row  # the kernel's graph: CUDA only
        else:
            assert row["ours_ms"] > 0, row
        if row["kind"] in ("rmsnorm", "add+rmsnorm", "swiglu", "ce"):
            assert row["note"].startswith("composite "), row


def test_unknown_skip_kind_is_named():
    import pytest

    from hgrn2.cli import main

    with pytest.raises(ValueError, match=r"--skip: unknown row kinds \['layer'\]"):
        main(["bench", "ops", "--quick", "--skip", "layer"])


def test_interleaved_rounds_take_each_median_and_keep_a_failure():
    from hgrn2.bench.common import interleaved

    calls, times = [], {"ours": iter([1.0, 9.0, 2.0]), "fla": iter([5.0, 4.0, 6.0])}

    def thunk(name):
        def run():
            calls.append(name)
            return next(times[name])
        return run

    def broken():
        calls.append("sdpa")
        raise RuntimeError("no flash kernel")

    row = {}
    got = interleaved(row, {"ours": thunk("ours"), "fla": thunk("fla"), "sdpa": broken}, 3)
    assert got == {"ours_ms": 2.0, "fla_ms": 5.0, "sdpa_ms": None}
    assert calls == ["ours", "fla", "sdpa", "ours", "fla", "ours", "fla"]  # rounds interleaved; a failure not retried
    assert row["sdpa_error"] == "RuntimeError: no flash kernel"


def test_graph_replay_time_on_the_gpu():
    """graph_ms replays `calls` captured calls and divides: a graph of 8 of a kernel takes about the time of 8
    eager calls' GPU work, and what the graph computes is what the calls compute."""
    import pytest
    import torch

    from hgrn2.bench.common import graph_ms, time_ms

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    x = torch.randn(4096, 4096, device="cuda")
    out = torch.empty_like(x)
    one = graph_ms(lambda: torch.mm(x, x, out=out), time_ms)
    per_call = graph_ms(lambda: torch.mm(x, x, out=out), time_ms, calls=8)
    assert 0.5 < per_call / one < 1.5
    torch.testing.assert_close(out, x @ x)
