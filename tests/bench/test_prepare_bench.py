"""`hgrn2 bench prepare`: a small corpus, its record, the check that every worker count writes the same index, and
a cut-short run continuing with the worker counts it had not measured."""

import json

import pytest

from hgrn2.bench import prepare as bench
from hgrn2.cli import main
from tests.bench.test_records import check_record


def test_quick_run_writes_its_record_and_reuses_finished_counts(tmp_path, capsys, monkeypatch):
    argv = ["bench", "prepare", "--quick", "--work", str(tmp_path / "w"), "--out", str(tmp_path / "r")]
    assert main(argv) == 0
    rec = check_record(tmp_path / "r" / "prepare_scaling.json", "prepare_scaling")
    assert rec["quick"] and rec["device_slug"].startswith("cpu")
    rows = rec["rows"]
    assert [r["workers"] for r in rows] == [w for w in (1, 2) if w <= bench.worker_count(None)]
    assert len({r["meta_sha256"] for r in rows}) == 1 and rows[0]["speedup"] == 1.0
    assert sum(len(p.read_bytes()) for p in (tmp_path / "w").glob("corpus-*/*.jsonl")) >= 1_000_000
    assert capsys.readouterr().out.rstrip().splitlines()[-1].startswith("|")

    def not_again(*a, **k):
        raise AssertionError("measured again")

    monkeypatch.setattr(bench, "_measure", not_again)
    assert main(argv) == 0
    assert json.loads((tmp_path / "r" / "prepare_scaling.json").read_text())["rows"] == rows


def test_a_differing_index_fails_the_benchmark(tmp_path):
    done = {"1": {"seconds": 1.0, "tokens": 10, "meta_sha256": "a"}, "2": {"seconds": 1.0, "tokens": 10,
                                                                            "meta_sha256": "b"}}
    with pytest.raises(RuntimeError, match="index differs between worker counts"):
        bench._record(type("A", (), {"corpus_bytes": 1, "vocab": 1, "shard_size": 1, "out": str(tmp_path),
                                     "quick": True, "command_line": "x"})(), {}, [1, 2], done, [])
