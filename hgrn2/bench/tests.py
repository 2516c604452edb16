"""`hgrn2 bench tests`: run pytest (on a GPU, the kernels' tests compile for real) and record the outcome per test
file as a benchmark record, so that the GPU suite's result sits in BENCHMARKS.md beside the timings.

    hgrn2 bench tests tests/ops/test_gate_edges.py tests/ops/triton -m ""   # -> benchmarks/results/<device>/tests.json
    hgrn2 bench tests tests/ops tests/layers tests/models --shard 2/3   # part 2 of 3 -> tests_shard2of3.json
    hgrn2 bench tests --quick   # the tests marked gpu_quick (every kernel variant once) -> tests_quick.json
    hgrn2 bench tests --workers 4 tests/ops tests/layers tests/models   # 4 pytest processes side by side

Everything after the options goes to pytest unchanged; the exit status is pytest's. Each record also keeps every
test's seconds (setup, call and teardown: on a GPU the first test of a kernel variant pays its compile), which a
`--quick` run prints, slowest first.
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import torch

from hgrn2.bench.common import add_output_argument, command_of, environment, write_result

OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed", "interrupted")
QUICK_MARK = "gpu_quick"  # pyproject.toml's marker of the quick tier (tests/ops/triton/test_quick.py)
GPU_SUITE = ("tests/ops", "tests/layers", "tests/models")  # a --quick run's paths when none are given
# pytest options whose value is the next argument (not a test path)
TAKE_VALUE = {"-k", "-m", "-p", "-o", "-c", "-W", "--deselect", "--ignore", "--ignore-glob", "--rootdir", "--maxfail",
              "--durations", "--basetemp", "--confcutdir", "--junitxml", "--shard"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("pytest_args", nargs=argparse.REMAINDER, help="test paths and pytest options")
    p.add_argument("--quick", action="store_true",
                   help=f"only the quick tier: the tests marked {QUICK_MARK} (every kernel variant once against fp64) "
                        f"under the paths given (default: {' '.join(GPU_SUITE)}); records tests_quick.json and prints "
                        "each test's seconds")
    p.add_argument("--workers", type=int, default=1, metavar="K",
                   help="pytest processes side by side, each on its share of the tests (as --shard J/K), sharing the "
                        "GPU: a cold run's time goes to compiling kernels, which then runs K at a time (default 1)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="the device named in the record (default: cuda if available)")
    add_output_argument(p)


def outcome(case: ET.Element) -> str:
    """A junit <testcase>'s outcome; pytest writes xfail as a skip whose message starts with "xfail"."""
    for child in case:
        if child.tag == "failure":
            return "xpassed" if (child.get("message") or "").startswith("[XPASS(strict)]") else "failed"
        if child.tag == "error":
            return "error"
        if child.tag == "skipped":
            return "xfailed" if (child.get("type") or "") == "pytest.xfail" else "skipped"
    return "passed"


def file_of(case: ET.Element) -> str:
    """A junit <testcase>'s file (the interrupt's own entry has no class name)."""
    return case.get("classname").replace(".", "/") + ".py" if case.get("classname") else "(interrupted)"


def durations(junits: list[Path]) -> dict[str, float]:
    """Every test's seconds (setup, call and teardown) by node id, in the order run (file by file)."""
    return {f"{file_of(case)}::{case.get('name') or '(interrupted)'}": round(float(case.get("time") or 0), 2)
            for junit in junits for case in ET.parse(junit).getroot().iter("testcase")}


def print_durations(seconds: dict[str, float]) -> None:
    """Each test's seconds, slowest first, and their sum."""
    print("seconds per test (setup + call + teardown; the first test of a kernel variant pays its compile):")
    for name, s in sorted(seconds.items(), key=lambda kv: -kv[1]):
        print(f"  {s:8.2f}  {name}")
    print(f"  {sum(seconds.values()):8.2f}  (sum over {len(seconds)} tests)")


def summarise(junits: list[tuple[Path, bool]]) -> list[dict]:
    """One row per test file of the junit files: the count of each outcome, the seconds, and the failures' names.
    A junit file's flag: its pytest was stopped (exit status 2), and the last test it wrote is the one the interrupt
    cut short."""
    files: dict[str, dict] = collections.defaultdict(lambda: {**dict.fromkeys(OUTCOMES, 0), "seconds": 0.0,
                                                               "failures": []})
    for junit, interrupted in junits:
        cases = list(ET.parse(junit).getroot().iter("testcase"))
        for n, case in enumerate(cases):
            count(files[file_of(case)], case, "interrupted" if interrupted and n == len(cases) - 1 else outcome(case))
    return [{"file": name, **row, "seconds": round(row["seconds"], 1)} for name, row in sorted(files.items())]


def count(row: dict, case: ET.Element, kind: str) -> None:
    """Add a test of this outcome to its file's row."""
    row[kind] += 1
    row["seconds"] += float(case.get("time") or 0)
    if kind in ("failed", "error", "xpassed", "interrupted"):
        row["failures"].append(case.get("name") or "(the test running at the interrupt)")


def shard_of(pytest_args: list[str]) -> tuple[str, str] | None:
    """(I, N) of a `--shard I/N` among the pytest arguments (`pytest_shard`), else None: each part's
    record is then tests_shardIofN.json, so that the parts of one suite do not overwrite each other."""
    for n, arg in enumerate(pytest_args):
        value = arg.removeprefix("--shard=") if arg.startswith("--shard=") else (
            pytest_args[n + 1] if arg == "--shard" and n + 1 < len(pytest_args) else None)
        if value is not None:
            i, _, total = value.partition("/")
            return i, total
    return None


def quick_args(pytest_args: list[str]) -> list[str]:
    """The pytest arguments of a `--quick` run: the given ones, selecting the quick tier's marker."""
    if any(a == "-m" or a.startswith(("-m=", "--markexpr")) or (a.startswith("-m") and len(a) > 2)
           for a in pytest_args):
        raise ValueError(f"--quick: selects the tests marked {QUICK_MARK}; leave out -m")
    if shard_of(pytest_args):
        raise ValueError("--quick: the quick tier runs in one call; leave out --shard")
    values = {n + 1 for n, a in enumerate(pytest_args) if a in TAKE_VALUE}
    paths = [a for n, a in enumerate(pytest_args) if n not in values and not a.startswith("-")]
    return [*pytest_args, *([] if paths else GPU_SUITE), "-m", QUICK_MARK]


def exit_status(codes: list[int]) -> int:
    """One exit status for the workers' pytest runs: interrupted (2) before the worst other, and no tests collected
    (5) only when no worker had any."""
    ran = [c for c in codes if c != 5] or [5]
    return 2 if 2 in ran else max(ran)


def run_pytest(pytest_args: list[str], workers: int, folder: Path) -> tuple[int, list[tuple[Path, bool]]]:
    """pytest in `workers` processes side by side, worker J on the J-th share of the tests: (exit status, the
    junit files they wrote with their interrupted flags)."""
    parts = [[]] if workers == 1 else [["--shard", f"{j}/{workers}"] for j in range(1, workers + 1)]
    env = dict(os.environ)
    if not torch.cuda.is_available():  # as tests/conftest.py, before the plugin's import of hgrn2 loads Triton
        env.setdefault("TRITON_INTERPRET", "1")
    procs = []
    for j, part in enumerate(parts):
        junit = folder / f"junit{j}.xml"
        procs.append((junit, subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                                               "hgrn2.bench.pytest_shard", f"--junitxml={junit}", *pytest_args,
                                               *part], env=env)))
    codes = []
    for _, proc in procs:
        try:
            codes.append(proc.wait())
        except KeyboardInterrupt:  # a time limit's SIGINT reaches pytest too, which still writes what it ran
            codes.append(proc.wait())
    return exit_status(codes), [(junit, rc == 2) for (junit, _), rc in zip(procs, codes) if junit.is_file()]


OWN_OPTIONS = {"--out": "out", "--workers": "workers", "--device": "device"}  # this command's options taking a value


def take_own_options(args: argparse.Namespace) -> None:
    """This command's own options written after the test paths (argparse hands everything from the first path on to
    pytest, which would refuse them): moved from `pytest_args` onto `args`."""
    rest, it = [], iter(args.pytest_args)
    for arg in it:
        name, eq, value = arg.partition("=")
        if name in OWN_OPTIONS:
            value = value if eq else next(it, None)
            if value is None:
                raise ValueError(f"`{name}`: expected a value")
            if name == "--workers" and not value.isdigit():
                raise ValueError(f"`--workers`: expected a count, got {value!r}")
            setattr(args, OWN_OPTIONS[name], int(value) if name == "--workers" else value)
        elif arg == "--quick":
            args.quick = True
        else:
            rest.append(arg)
    args.pytest_args = rest


def run(args: argparse.Namespace) -> int:
    take_own_options(args)
    quick = getattr(args, "quick", False)
    workers = getattr(args, "workers", 1)
    if workers < 1:
        raise ValueError(f"--workers: expected a count of at least 1, got {workers}")
    pytest_args = quick_args(args.pytest_args) if quick else args.pytest_args
    shard = shard_of(pytest_args)
    if shard and workers > 1:
        raise ValueError("--workers: shares the tests out itself; leave out --shard")
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.time()
        rc, junits = run_pytest(pytest_args, workers, Path(tmp))
        if not junits:
            print(f"pytest exited with {rc} and wrote no results; nothing recorded", file=sys.stderr)
            return rc or 1
        rows = summarise(junits)
        seconds = durations([junit for junit, _ in junits])
    total = {k: sum(r[k] for r in rows) for k in OUTCOMES}
    stem = "tests_quick" if quick else f"tests_shard{shard[0]}of{shard[1]}" if shard else None
    path = write_result(args.out, "tests", environment(args.device), rows, command_of(args), file_stem=stem,
                        pytest_exit=rc, totals=total, wall_s=round(time.time() - t0, 1), durations=seconds,
                        workers=workers, **({"tier": "quick"} if quick else {}))
    if quick:
        print_durations(seconds)
    print(" ".join(f"{v} {k}" for k, v in total.items() if v) + f"; record {path}")
    return rc
