"""`hgrn2 bench ops --quick` runs end to end on the CPU (no timings checked: the GPU run is the benchmark)."""

import argparse
import json

from hgrn2.bench import ops


def test_quick_run_writes_rows(tmp_path):
    parser = argparse.ArgumentParser()
    ops.add_arguments(parser)
    out = tmp_path / "bench.json"
    assert ops.run(parser.parse_args(["--quick", "--device", "cpu", "--out", str(out), "--skip", "seq"])) == 0
    result = json.loads(out.read_text())
    kinds = [r["kind"] for r in result["rows"]]
    assert sorted(kinds) == ["add+rmsnorm", "ce", "decode", "decode", "hgrn1", "layer", "rmsnorm", "swiglu"]
    for row in result["rows"]:
        assert row["ours_ms"] > 0, row
        if row["kind"] == "decode":
            assert row["ours_api_ms"] > 0, row
        if row["kind"] in ("rmsnorm", "add+rmsnorm", "swiglu", "ce"):
            assert row["note"].startswith("composite "), row
    assert "ours_ms" in result["table"]
