"""README's "Preparing the Pile or SlimPajama": every command parses with the current options."""

import argparse
import importlib
import pathlib
import re
import shlex

from hgrn2.cli import COMMANDS

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def test_the_commands_parse():
    section = re.search(r"\n## Preparing the Pile[^\n]*\n(.*?)\n## ", README.read_text(), re.S).group(1)
    commands = [c for block in re.findall(r"```bash\n(.*?)```", section, re.S)
                for c in block.replace("\\\n", " ").strip().splitlines() if c.startswith("hgrn2 ")]
    assert len(commands) == 6 and {c.split()[2] for c in commands} == {"prepare", "merge"}
    for line in commands:
        argv = shlex.split(line.split("#")[0])[1:]
        module, _ = COMMANDS[tuple(argv[:2])]
        parser = argparse.ArgumentParser()
        importlib.import_module(module).add_arguments(parser)
        parser.parse_args(argv[2:])
