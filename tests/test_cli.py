"""The `hgrn2` command's own behaviour: fast help, clear errors for unknown commands and bad arguments, the
version, and the typed entry points of every command module."""

import ast
import pathlib
import subprocess
import sys

import pytest

from hgrn2 import __version__
from hgrn2.cli import COMMANDS, console, main

COMMANDS_WORDS = [" ".join(k) for k in COMMANDS]


def _cli(*args: str) -> subprocess.CompletedProcess:
    code = ("import sys, hgrn2_cli; sys.argv = ['hgrn2', *sys.argv[1:]]; rc = hgrn2_cli.main(); "
            "print('torch imported' if 'torch' in sys.modules else 'torch not imported', file=sys.stderr); "
            "sys.exit(rc)")
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)


def test_help_lists_commands_without_importing_torch():
    r = _cli("--help")
    assert r.returncode == 0
    assert "train" in r.stdout and "bench ops" in r.stdout
    assert "torch not imported" in r.stderr


def test_saved_help_is_current():
    """hgrn2/cli_help.json is what the parsers print; after changing a command's arguments run
    `python -c "from hgrn2.cli import write_help; write_help()"`."""
    import json

    from hgrn2.cli import HELP_FILE, help_texts

    with open(HELP_FILE, encoding="utf-8") as f:
        saved = json.load(f)
    assert saved == help_texts(), "stale hgrn2/cli_help.json: rewrite it with hgrn2.cli.write_help()"


def test_every_help_prints_at_once_without_importing_torch():
    """Each command's and command group's --help, as the `hgrn2` command runs it: exit 0, its own text, no torch
    (importing it takes seconds), well under half a second each after the interpreter has started."""
    import json

    from hgrn2.cli import HELP_FILE

    with open(HELP_FILE, encoding="utf-8") as f:
        saved = json.load(f)
    groups = sorted({k.split()[0] for k in COMMANDS_WORDS if len(k.split()) > 1})
    code = ("import contextlib, io, json, sys, time, hgrn2_cli\n"
            "from hgrn2.cli import main\n"
            "out = {}\n"
            "for words in json.loads(sys.argv[1]):\n"
            "    buf, t = io.StringIO(), time.perf_counter()\n"
            "    with contextlib.redirect_stdout(buf):\n"
            "        rc = main([*words.split(), '--help'])\n"
            "    out[words] = [rc, buf.getvalue(), time.perf_counter() - t]\n"
            "print(json.dumps({'torch': 'torch' in sys.modules, 'out': out}))\n")
    words = sorted(saved) + groups
    r = subprocess.run([sys.executable, "-c", code, json.dumps(words)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout)
    assert not got["torch"]
    for w in words:
        rc, text, seconds = got["out"][w]
        assert rc == 0 and seconds < 0.5, (w, rc, seconds)
        if w in groups:
            assert text.startswith(f"usage: hgrn2 {w} <command>"), w
            assert all(f"  {k.split(' ', 1)[1]} " in text for k in COMMANDS_WORDS if k.startswith(w + " ")), w
        else:
            assert text == saved[w], w


def test_unknown_command_says_what_was_wrong(capsys):
    assert main(["trian"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[0] == "hgrn2: unknown command 'trian'"
    assert main(["bench"]) == 2
    assert capsys.readouterr().err.startswith("hgrn2: 'hgrn2 bench' needs one of: ")
    assert main(["bench", "nope"]) == 2
    assert capsys.readouterr().err.startswith("hgrn2: unknown command 'hgrn2 bench nope'")


def test_a_bad_argument_is_one_line_on_the_console(tmp_path, capsys, monkeypatch):
    """The console entry point prints an input error (ValueError, OSError) as its message alone; main() raises it
    (as tests and scripts want), and so does the console with HGRN2_TRACEBACK=1."""
    monkeypatch.delenv("HGRN2_TRACEBACK", raising=False)
    for argv in (["lra", "listops", "--epochs", "0"], ["bench", "train-parity", "--data", str(tmp_path)]):
        assert console(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("hgrn2: error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert "`--epochs`" not in err and "meta.json" in err
    monkeypatch.setenv("HGRN2_TRACEBACK", "1")
    with pytest.raises(ValueError, match="`--epochs`: expected at least 1, got 0"):
        console(["lra", "listops", "--epochs", "0"])


def test_ctrl_c_is_one_line_on_the_console(capsys, monkeypatch):
    """Ctrl-C during a command ends it with one line and exit 130; HGRN2_TRACEBACK=1 lets the interrupt through."""
    import hgrn2.cli as cli

    def interrupted(argv=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "main", interrupted)
    monkeypatch.delenv("HGRN2_TRACEBACK", raising=False)
    assert console(["train"]) == 130
    err = capsys.readouterr().err
    assert err.startswith("hgrn2: interrupted") and err.count("\n") == 1
    monkeypatch.setenv("HGRN2_TRACEBACK", "1")
    with pytest.raises(KeyboardInterrupt):
        console(["train"])


def test_version_is_the_package_version():
    r = _cli("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"hgrn2 {__version__}"
    import importlib.metadata

    assert importlib.metadata.version("hgrn2") == __version__


def test_every_command_module_has_typed_entry_points():
    root = pathlib.Path(__file__).resolve().parents[1]
    want = {"add_arguments": ("argparse.ArgumentParser", "None"), "run": ("argparse.Namespace", "int")}
    for module in sorted({m for m, _ in COMMANDS.values()}):
        tree = ast.parse((root / (module.replace(".", "/") + ".py")).read_text(encoding="utf-8"))
        defs = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name in want}
        got = {name: (ast.unparse(f.args.args[0].annotation) if f.args.args[0].annotation else None,
                      ast.unparse(f.returns) if f.returns else None) for name, f in defs.items()}
        assert got == want, module
