"""`hgrn2.train.mps.mps_daemon` against a stand-in for nvidia-cuda-mps-control (a script on PATH that logs how it
was called and keeps a control pipe while "running"), and `hgrn2 lra --mps`'s refusals."""

import os
import subprocess
import sys

import pytest

from hgrn2.cli import main
from hgrn2.train.mps import mps_daemon

STAND_IN = """#!/bin/sh
if [ "$1" = "-d" ]; then
  [ -n "$FAIL" ] && { echo "An instance of this daemon is already running" >&2; exit 1; }
  echo "start $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY${CUDA_VISIBLE_DEVICES+ sees}" >> "$LOG"
  touch "$CUDA_MPS_PIPE_DIRECTORY/control"
else
  read command; echo "$command" >> "$LOG"; rm -f "$CUDA_MPS_PIPE_DIRECTORY/control"
fi
"""


@pytest.fixture
def control(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "nvidia-cuda-mps-control"
    exe.write_text(STAND_IN)
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("LOG", str(tmp_path / "log"))
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    monkeypatch.setenv("CUDA_MPS_LOG_DIRECTORY", "/elsewhere")
    return tmp_path / "log"


def test_processes_started_inside_find_the_daemon_which_stops_after(control):
    with mps_daemon():
        pipe = os.environ["CUDA_MPS_PIPE_DIRECTORY"]
        child = subprocess.run([sys.executable, "-c", "import os; print(os.environ['CUDA_MPS_PIPE_DIRECTORY'])"],
                               capture_output=True, text=True, check=True)
        assert child.stdout.strip() == pipe and os.path.exists(os.path.join(pipe, "control"))
    start, stop = control.read_text().splitlines()
    assert start == f"start {pipe} {os.path.join(os.path.dirname(pipe), 'log')}" and stop == "quit"
    assert "CUDA_MPS_PIPE_DIRECTORY" not in os.environ and os.environ["CUDA_MPS_LOG_DIRECTORY"] == "/elsewhere"
    assert not os.path.exists(pipe)  # its temporary folder is gone


def test_the_daemon_sees_every_device_and_the_clients_keep_their_choice(control, monkeypatch):
    """MPS clients number devices within the daemon's view: a daemon started under CUDA_VISIBLE_DEVICES=1 would leave
    a client asking for device 1 with none."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    with mps_daemon():
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "1"
    start = control.read_text().splitlines()[0]
    assert start.startswith("start ") and " sees " not in start


def test_the_daemon_stops_when_the_block_fails(control):
    with pytest.raises(KeyError), mps_daemon():
        raise KeyError("a run failed")
    assert control.read_text().splitlines()[-1] == "quit" and "CUDA_MPS_PIPE_DIRECTORY" not in os.environ


def test_a_daemon_that_cannot_start_is_one_line(control, monkeypatch):
    monkeypatch.setenv("FAIL", "1")
    with pytest.raises(RuntimeError, match=r"^`--mps`: nvidia-cuda-mps-control -d failed: An instance of this daemon "
                                           r"is already running$"), mps_daemon():
        pytest.fail("the block ran without a daemon")
    assert "CUDA_MPS_PIPE_DIRECTORY" not in os.environ


def test_without_the_control_program_it_says_so(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RuntimeError, match="nvidia-cuda-mps-control is not on the PATH"), mps_daemon():
        pass


@pytest.mark.parametrize("extra", [[], ["--concurrent", "2"]])
def test_lra_mps_needs_several_runs_side_by_side_on_a_gpu(tmp_path, extra):
    args = ["lra", "fashion_mnist", "--out", str(tmp_path), "--device", "cpu", "--seed", "1", "2", "--mps", *extra]
    with pytest.raises(ValueError, match=r"`--mps`: shares a GPU between the worker processes of --concurrent N"):
        main(args)
    assert not list(tmp_path.iterdir())
