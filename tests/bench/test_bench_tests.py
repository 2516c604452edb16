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


def _default_sigint():
    """SIGINT back to its default in the child, as `timeout` leaves it: a shell starts background jobs with it
    ignored, and Python then installs no KeyboardInterrupt handler."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_a_time_limit_still_records_what_ran(tmp_path):
    """`timeout -s INT` signals the whole process group: pytest stops, writes what it ran, and the record says so."""
    marker = tmp_path / "hanging"
    (tmp_path / "test_slow.py").write_text(
        "import pathlib, time\n\ndef test_quick():\n    pass\n\n"
        f"def test_hangs():\n    pathlib.Path({str(marker)!r}).touch()\n    time.sleep(120)\n")
    out = tmp_path / "results"
    proc = subprocess.Popen([sys.executable, "-m", "hgrn2.cli", "bench", "tests", "--device", "cpu", "--out",
                             str(out), str(tmp_path / "test_slow.py")], start_new_session=True,
                            cwd=Path(__file__).resolve().parents[2], preexec_fn=_default_sigint)
    deadline = time.time() + 120
    while not marker.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=60) == 2  # pytest's exit status when interrupted
    rec = json.loads((out / "tests.json").read_text())
    assert rec["pytest_exit"] == 2 and rec["totals"]["passed"] == 1 and rec["totals"]["interrupted"] == 1
    assert len(sum((r["failures"] for r in rec["rows"]), [])) == 1


@pytest.mark.slow
def test_quick_runs_the_marked_tests_in_workers_and_prints_their_seconds(tmp_path, capsys):
    """--quick: only the tests marked gpu_quick, here in two pytest processes, recorded together as tests_quick.json
    with each test's seconds, which it prints and BENCHMARKS.md shows."""
    marked = "".join(f"@pytest.mark.gpu_quick\ndef test_variant{k}():\n    pass\n\n" for k in range(3))
    (tmp_path / "test_tier.py").write_text(f"import pytest\n\n{marked}def test_other():\n    pass\n")
    out = tmp_path / "results" / "cpu"
    args = argparse.Namespace(pytest_args=[str(tmp_path / "test_tier.py"), "-p", "no:randomly"], device="cpu",
                              out=str(out), quick=True, workers=2, command_line="hgrn2 bench tests --quick")
    assert tests.run(args) == 0
    rec = json.loads((out / "tests_quick.json").read_text())
    assert rec["tier"] == "quick" and rec["totals"]["passed"] == 3 and not (out / "tests.json").exists()
    assert sorted(name.split("::")[1] for name in rec["durations"]) == ["test_variant0", "test_variant1",
                                                                        "test_variant2"]
    assert "seconds per test" in capsys.readouterr().out
    text = report.render(tmp_path / "results")
    assert "Per test, slowest first" in text and "(2 pytest processes)" in text


@pytest.mark.parametrize("bad,word", [(["-m", "slow"], "-m"), (["-mslow"], "-m"), (["--shard", "1/2"], "--shard")])
def test_quick_takes_no_marker_and_no_shard(bad, word):
    args = argparse.Namespace(pytest_args=["tests", *bad], device="cpu", out=None, quick=True)
    with pytest.raises(ValueError, match=f"--quick: .*{word}"):
        tests.run(args)


def test_quick_paths_default_to_the_gpu_suite(tmp_path):
    """Without a test path --quick looks in the GPU suite's folders; an option's value is no path."""
    assert tests.quick_args(["-k", "hgrn2", "-p", "no:randomly"]) == ["-k", "hgrn2", "-p", "no:randomly",
                                                                       *tests.GPU_SUITE, "-m", "gpu_quick"]
    assert tests.quick_args([str(tmp_path), "-x"]) == [str(tmp_path), "-x", "-m", "gpu_quick"]


def test_workers_exit_status_and_arguments():
    """The workers' exit statuses as one: an interrupt first, then the worst, "no tests" only when none had any."""
    assert tests.exit_status([0, 5]) == 0 and tests.exit_status([5, 5]) == 5
    assert tests.exit_status([1, 0, 2]) == 2 and tests.exit_status([0, 1, 5]) == 1
    for workers, pytest_args, word in ((0, ["tests"], "at least 1"), (2, ["tests", "--shard", "1/2"], "--shard")):
        with pytest.raises(ValueError, match=f"--workers: .*{word}"):
            tests.run(argparse.Namespace(pytest_args=pytest_args, device="cpu", out=None, workers=workers))


def test_quick_record_shows_each_test():
    rec = {"rows": [], "totals": {"passed": 2}, "pytest_exit": 0, "wall_s": 9.0, "tier": "quick",
           "durations": {"t.py::test_a": 0.5, "t.py::test_b": 7.25}}
    text = report.tests_table(rec)
    assert text.index("t.py::test_b | 7.25") < text.index("t.py::test_a | 0.50")
    assert "Per test" not in report.tests_table({**rec, "tier": None})


@pytest.mark.slow
def test_shards_deal_the_tests_in_turn_and_name_their_records(tmp_path):
    """--shard I/N (hgrn2.bench.pytest_shard) runs each test in exactly one part, a file's tests spread over the
    parts; each part's record is its own file."""
    for n in range(3):
        (tmp_path / f"test_part{n}.py").write_text("".join(f"def test_{k}():\n    pass\n" for k in range(n + 1)))
    ran = []
    for i in (1, 2):
        out = tmp_path / "results" / "cpu"
        args = argparse.Namespace(pytest_args=[str(tmp_path), "--shard", f"{i}/2", "-p", "no:randomly"],
                                  device="cpu", out=str(out), command_line="hgrn2 bench tests")
        assert tests.run(args) == 0
        rec = json.loads((out / f"tests_shard{i}of2.json").read_text())
        ran.append(set(rec["durations"]))
    assert ran[0].isdisjoint(ran[1]) and len(ran[0]) == len(ran[1]) == 3
    assert all(any(t.split("::")[0].endswith("test_part2.py") for t in part) for part in ran)  # the 3-test file


def test_own_options_after_the_paths_are_taken_back_from_pytest(tmp_path):
    """`hgrn2 bench tests tests/train -m gpu --out DIR`: --out is this command's, not pytest's."""
    args = argparse.Namespace(pytest_args=["tests/train", "-m", "gpu", "--out", str(tmp_path), "--workers=2",
                                           "--quick", "-rf"], device="cpu", out=None, workers=1, quick=False)
    tests.take_own_options(args)
    assert args.pytest_args == ["tests/train", "-m", "gpu", "-rf"]
    assert (args.out, args.workers, args.quick) == (str(tmp_path), 2, True)
    with pytest.raises(ValueError, match="`--out`: expected a value"):
        tests.take_own_options(argparse.Namespace(pytest_args=["tests", "--out"], out=None))
