import pytest

from hgrn2.cli import main


@pytest.mark.parametrize("argv, message", [
    (["--processes", "0"], "--processes: expected at least 1, got 0"),
    (["--steps", "0"], "--steps: expected at least 1, got 0"),
    (["--task", "retrieval"], "--task: retrieval's pairs of documents are not timed here"),
    (["--mps", "--device", "cpu"], "--mps: needs a CUDA device and nvidia-cuda-mps-control on the PATH"),
])
def test_bad_arguments_are_refused_in_one_line(tmp_path, capsys, argv, message):
    assert main(["bench", "lra-share", *argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(message) and len(err.splitlines()) == 1
    assert not list(tmp_path.iterdir())  # nothing timed, nothing written
