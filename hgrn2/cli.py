"""`hgrn2 <command>`: one entry point; each command lives in its own module with `add_arguments` and `run`."""

from __future__ import annotations

import argparse
import importlib
import sys

# command words -> (module, one-line help). Modules are imported only when their command runs.
COMMANDS: dict[tuple[str, ...], tuple[str, str]] = {
    ("info",): ("hgrn2.info", "versions, devices and the backends hgrn2 will use"),
    ("convert-fla",): ("hgrn2.models.convert", "convert a local fla HGRN2 checkpoint directory to hgrn2"),
    ("generate",): ("hgrn2.models.generate_cli", "generate text from a saved model"),
    ("bench", "ops"): ("hgrn2.bench.ops", "time the recurrence against fla and SDPA"),
    ("bench", "train"): ("hgrn2.bench.train", "training throughput against fla HGRN2 and Llama/SDPA"),
    ("bench", "vision"): ("hgrn2.bench.vision", "image training throughput: HGRN2 DeiT-Tiny size against timm's DeiT"),
    ("data", "prepare"): ("hgrn2.data.prepare", "tokenise a corpus into a token memmap"),
    ("train",): ("hgrn2.train.cli", "train a language model (works under torchrun)"),
    ("plot",): ("hgrn2.train.plot", "draw loss curves from training logs"),
    ("mqar",): ("hgrn2.train.mqar", "multi-query associative recall sweep (the paper's MQAR figure)"),
    ("vision",): ("hgrn2.train.vision", "image classification: `vision train` (works under torchrun), `vision eval`"),
}


def _usage() -> str:
    rows = [f"  {' '.join(k):<14} {h}" for k, (_, h) in COMMANDS.items()]
    return "usage: hgrn2 <command> [options]\n\ncommands:\n" + "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    for words in sorted(COMMANDS, key=len, reverse=True):
        if tuple(argv[: len(words)]) == words:
            module, help_ = COMMANDS[words]
            mod = importlib.import_module(module)
            parser = argparse.ArgumentParser(prog="hgrn2 " + " ".join(words), description=help_)
            mod.add_arguments(parser)
            return int(mod.run(parser.parse_args(argv[len(words):])) or 0)
    print(_usage(), file=sys.stderr if argv and argv[0] not in ("-h", "--help") else sys.stdout)
    return 0 if not argv or argv[0] in ("-h", "--help") else 2


if __name__ == "__main__":
    sys.exit(main())
