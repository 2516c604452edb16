"""`hgrn2 <command>`: one entry point; each command lives in its own module with `add_arguments` and `run`."""

from __future__ import annotations

import argparse
import importlib
import os
import shlex
import sys

# command words -> (module, one-line help). Modules are imported only when their command runs.
COMMANDS: dict[tuple[str, ...], tuple[str, str]] = {
    ("info",): ("hgrn2.info", "versions, devices and the backends hgrn2 will use"),
    ("convert-fla",): ("hgrn2.models.convert", "convert a local fla HGRN2 checkpoint directory to hgrn2"),
    ("generate",): ("hgrn2.models.generate_cli", "generate text from a saved model"),
    ("bench", "ops"): ("hgrn2.bench.ops", "time the recurrence against fla and SDPA"),
    ("bench", "train"): ("hgrn2.bench.train", "training throughput against fla HGRN2 and Llama/SDPA"),
    ("bench", "generate"): ("hgrn2.bench.generate", "decoding speed and memory against fla HGRN2 and Llama"),
    ("data", "corpus"): ("hgrn2.data.corpus", "assemble a plain-text corpus from installed documentation"),
    ("bench", "layer"): ("hgrn2.bench.layer", "the HGRU2 layer with projections against fla's HGRN2Attention"),
    ("bench", "profile"): ("hgrn2.bench.profile", "where a layer's or a training step's time goes"),
    ("bench", "accuracy"): ("hgrn2.bench.accuracy", "every output and gradient against the fp64 reference"),
    ("bench", "convert-fla"): ("hgrn2.bench.convert_fla", "a converted fla checkpoint against fla: logits, greedy"),
    ("bench", "memory"): ("hgrn2.bench.memory", "activation bytes a training step keeps for the backward"),
    ("bench", "tests"): ("hgrn2.bench.tests", "run pytest (the GPU suite) and record the outcome per test file"),
    ("bench", "report"): ("hgrn2.bench.report", "render BENCHMARKS.md from the result JSONs"),
    ("bench", "gate"): ("hgrn2.bench.gate", "the working tree's recurrence against main's, side by side: a speed gate"),
    ("bench", "tune"): ("hgrn2.bench.tune", "the recurrence's gate rows under several kernel launch configs"),
    ("bench", "vision"): ("hgrn2.bench.vision", "image training throughput: HGRN2 DeiT-Tiny size against timm's DeiT"),
    ("bench", "prepare"): ("hgrn2.bench.prepare", "`data prepare` tokens/s against its number of worker processes"),
    ("bench", "lra-share"): ("hgrn2.bench.lra_share", "LRA training steps/s of runs sharing one GPU (and MPS)"),
    ("bench", "train-parity"): ("hgrn2.bench.parity", "training loss curves of ours and fla's from the same weights"),
    ("data", "prepare"): ("hgrn2.data.prepare", "tokenise a corpus into token shards (parallel, resumable)"),
    ("data", "merge"): ("hgrn2.data.merge", "join the parts of `data prepare --part I/N` into one dataset"),
    ("train",): ("hgrn2.train.cli", "train a language model (works under torchrun)"),
    ("plot",): ("hgrn2.train.plot", "draw loss curves from training logs"),
    ("eval", "ppl"): ("hgrn2.eval.ppl", "perplexity and the per-position loss curve of a saved model"),
    ("eval", "lm-eval"): ("hgrn2.eval.harness", "lm-evaluation-harness tasks on a saved model"),
    ("eval", "needle"): ("hgrn2.eval.needle", "needle-in-a-haystack grid (context length x depth) and heatmap"),
    ("eval", "scrolls"): ("hgrn2.eval.scrolls", "SCROLLS-format long-document tasks scored by ROUGE-1/2/L"),
    ("mqar",): ("hgrn2.experiments.mqar", "multi-query associative recall sweep (the paper's MQAR figure)"),
    ("ablate",): ("hgrn2.experiments.ablate", "the paper's LM ablations (expand ratio, PESE, HGRN1, lower bound)"),
    ("lra",): ("hgrn2.experiments.lra", "Long Range Arena: train, evaluate, resume; --report for the paper's table"),
    ("vision",): ("hgrn2.train.vision", "image classification: `vision train` (works under torchrun), `eval`, "
                                        "`report`"),
}


# every command's --help, written by `write_help()` from the parsers themselves (tests/test_cli.py checks it is
# current), so that help prints without importing a command's module, which imports torch (seconds)
HELP_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cli_help.json")


def _usage(group: tuple[str, ...] = ()) -> str:
    rows = [f"  {' '.join(k[len(group):]):<18} {h}" for k, (_, h) in COMMANDS.items() if k[:len(group)] == group]
    name = " ".join(("hgrn2", *group))
    head = f"usage: {name} <command> [options]   ({name} <command> --help for its options)"
    return head + "\n\ncommands:\n" + "\n".join(rows)


def _parser(words: tuple[str, ...]) -> argparse.ArgumentParser:
    module, help_ = COMMANDS[words]
    parser = argparse.ArgumentParser(prog="hgrn2 " + " ".join(words), description=help_)
    importlib.import_module(module).add_arguments(parser)
    return parser


def help_texts() -> dict[str, str]:
    """Each command's --help (and each of its subcommands', as `vision train`) as its parser prints it on a terminal
    100 columns wide."""
    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "102"  # argparse wraps at COLUMNS - 2
    try:
        texts = {}
        for words in COMMANDS:
            parser = _parser(words)
            texts[" ".join(words)] = parser.format_help()
            for action in parser._actions:
                if isinstance(action, argparse._SubParsersAction):
                    texts |= {" ".join((*words, name)): sub.format_help() for name, sub in action.choices.items()}
        return texts
    finally:
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns


def write_help() -> None:
    """Rewrite HELP_FILE after a command's arguments change."""
    import json

    with open(HELP_FILE, "w", encoding="utf-8") as f:
        json.dump(help_texts(), f, indent=1, sort_keys=True)
        f.write("\n")


def _saved_help(words: tuple[str, ...], rest: list[str]) -> str | None:
    """The saved help of `words`, or of its subcommand when the first word after it names one."""
    import json

    try:
        with open(HELP_FILE, encoding="utf-8") as f:
            texts = json.load(f)
    except (OSError, ValueError):
        return None
    sub = [a for a in rest if not a.startswith("-")][:1]
    return texts.get(" ".join((*words, *sub))) or texts.get(" ".join(words))


def _what_was_wrong(argv: list[str]) -> str:
    subs = sorted(" ".join(k[1:]) for k in COMMANDS if k[0] == argv[0] and len(k) > 1)
    if not subs:
        return f"unknown command '{argv[0]}'"
    if len(argv) == 1 or argv[1].startswith("-"):
        return f"'hgrn2 {argv[0]}' needs one of: {', '.join(subs)}"
    return f"unknown command 'hgrn2 {argv[0]} {argv[1]}' (choose one of: {', '.join(subs)})"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if argv[0] == "--version":
        from hgrn2 import __version__

        print(f"hgrn2 {__version__}")
        return 0
    for words in sorted(COMMANDS, key=len, reverse=True):
        if tuple(argv[: len(words)]) == words:
            rest = argv[len(words):]
            asks_help = any(a in ("-h", "--help") for a in rest[: rest.index("--") if "--" in rest else None])
            saved = _saved_help(words, rest) if asks_help else None
            if saved is not None:
                print(saved, end="")
                return 0
            importlib.import_module("hgrn2.models")  # registers the Auto classes that commands load models with
            parser = _parser(words)
            args = parser.parse_args(rest)
            args.command_line = shlex.join(["hgrn2", *argv])  # what results record as their command
            return int(importlib.import_module(COMMANDS[words][0]).run(args) or 0)
    group = tuple(argv[:1])
    if any(k[:1] == group and len(k) > 1 for k in COMMANDS) and argv[1:2] in (["-h"], ["--help"]):
        print(_usage(group))
        return 0
    print(f"hgrn2: {_what_was_wrong(argv)}\n\n{_usage()}", file=sys.stderr)
    return 2


def console(argv: list[str] | None = None) -> int:
    """`main` for a terminal: an error in what was asked for (ValueError, OSError, a YAML error: a bad argument, a
    missing file, a malformed file, a full disk; exit 2), a run that cannot go on (`RunError`, exit 1) or Ctrl-C
    (exit 130) prints as one line instead of a traceback, which HGRN2_TRACEBACK=1 shows."""
    import yaml  # a malformed YAML file handed to any command is a bad argument too

    try:
        return main(argv)
    except (ValueError, OSError, yaml.YAMLError) as e:
        if os.environ.get("HGRN2_TRACEBACK") == "1":
            raise
        print(f"hgrn2: error: {e}  (HGRN2_TRACEBACK=1 shows where)", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: every long job writes atomically, so nothing half-written is left
        if os.environ.get("HGRN2_TRACEBACK") == "1":
            raise
        print("hgrn2: interrupted; the same command resumes a run from its last checkpoint", file=sys.stderr)
        return 130
    except RuntimeError as e:  # a run that cannot go on (diverged, its directory in use, no intact checkpoint)
        from hgrn2.train.guard import RunError, print_error

        if not isinstance(e, RunError) or os.environ.get("HGRN2_TRACEBACK") == "1":
            raise
        print_error("hgrn2", e)
        return 1


if __name__ == "__main__":
    sys.exit(console())
