"""Entry point of the `hgrn2` command. It lives outside the package so that `hgrn2 --help` starts without
importing torch and transformers, which `import hgrn2` does to register the model classes."""

from __future__ import annotations


def main() -> int:
    from hgrn2.cli import console

    return console()
