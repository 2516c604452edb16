"""`hgrn2 bench tests`: pytest's outcomes per file, as a record that BENCHMARKS.md renders."""

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hgrn2.bench import report, tests

SAMPLE = '''
import pytest

def test_ok():
    pass

def test_bad():
    assert 1 == 2

@pytest.mark.xfail(strict=True, reason="known gap")
def test_gap():
    assert False

@pytest.mark.xfail(strict=True, reason="fixed since")
def test_fixed():
    pass

@pytest.mark.skip(reason="no GPU")
def test_gpu():
    pass
'''


def test_outcomes_per_file_recorded_and_rendered(tmp_path):
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    out = tmp_path / "results" / "cpu"
    args = argparse.Namespace(pytest_args=[str(tmp_path / "test_sample.py"), "-p", "no:randomly"], device="cpu",
                              out=str(out), command_line="hgrn2 bench tests test_sample.py")
    assert tests.run(args) == 1  # pytest's exit status: a test failed
    rec = json.loads((out / "tests.json").read_text())
    (row,) = rec["rows"]
    assert row["file"].endswith("test_sample.py")
    assert {k: row[k] for k in tests.OUTCOMES} == {"passed": 1, "failed": 1, "error": 0, "skipped": 1,
                                                    "xfailed": 1, "xpassed": 1, "interrupted": 0}
    assert sorted(row["failures"]) == ["test_bad", "test_fixed"]
    assert rec["pytest_exit"] == 1 and rec["totals"]["passed"] == 1
    text = report.render(tmp_path / "results")
    assert "## Tests on the GPU" in text and "test_bad, test_fixed" in text and "pytest exit 1" in text


def test_a_time_limit_still_records_what_ran(tmp_path):
    """`timeout -s INT` signals the whole process group: pytest stops, writes what it ran, and the record says so."""
    marker = tmp_path / "hanging"
    (tmp_path / "test_slow.py").write_text(
        "import pathlib, time\n\ndef test_quick():\n    pass\n\n"
        f"def test_hangs():\n    pathlib.Path({str(marker)!r}).touch()\n    time.sleep(120)\n")
    out = tmp_path / "results"
    proc = subprocess.Popen([sys.executable, "-m", "hgrn2.cli", "bench", "tests", "--device", "cpu", "--out",
                             str(out), str(tmp_path / "test_slow.py")], start_new_session=True,
                            cwd=Path(__file__).resolve().parents[2])
    deadline = time.time() + 120
    while not marker.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=60) == 2  # pytest's exit status when interrupted
    rec = json.loads((out / "tests.json").read_text())
    assert rec["pytest_exit"] == 2 and rec["totals"]["passed"] == 1 and rec["totals"]["interrupted"] == 1
    assert len(sum((r["failures"] for r in rec["rows"]), [])) == 1


@pytest.mark.slow
def test_shards_split_files_and_name_their_records(tmp_path):
    """--shard I/N (hgrn2.bench.pytest_shard) runs each file in exactly one part; each part's record is its own
    file."""
    for n in range(3):
        (tmp_path / f"test_part{n}.py").write_text("".join(f"def test_{k}():\n    pass\n" for k in range(n + 1)))
    ran = []
    for i in (1, 2):
        out = tmp_path / "results" / "cpu"
        args = argparse.Namespace(pytest_args=[str(tmp_path), "--shard", f"{i}/2", "-p", "no:randomly"],
                                  device="cpu", out=str(out), command_line="hgrn2 bench tests")
        assert tests.run(args) == 0
        rec = json.loads((out / f"tests_shard{i}of2.json").read_text())
        ran.append({r["file"]: r["passed"] for r in rec["rows"]})
    assert set(ran[0]).isdisjoint(ran[1]) and sum(map(sum, (r.values() for r in ran))) == 6
