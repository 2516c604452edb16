"""`hgrn2 bench tests`: pytest's outcomes per file, as a record that BENCHMARKS.md renders."""

import argparse
import json

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
                                                    "xfailed": 1, "xpassed": 1}
    assert sorted(row["failures"]) == ["test_bad", "test_fixed"]
    assert rec["pytest_exit"] == 1 and rec["totals"]["passed"] == 1
    text = report.render(tmp_path / "results")
    assert "## Tests on the GPU" in text and "test_bad, test_fixed" in text and "pytest exit 1" in text
