"""`hgrn2 data merge OUT PART...`: join the parts of a `hgrn2 data prepare --part I/N` run into one dataset.

Each PART is a folder holding `part-I-of-N.json` files (or one such file). OUT gets `meta.json`, which lists the
parts' shards where they lie (relative paths; nothing is copied but the tokenizer files), and equals the meta.json
of the same prepare run on one machine when every part wrote into OUT itself (a shared folder).
"""

from __future__ import annotations

import argparse
import sys

from .prepare import _print_summary, merge


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out", help="the dataset folder to write meta.json into (may be a part's own folder)")
    parser.add_argument("parts", nargs="+", help="folders with part-I-of-N.json files, or those files")


def run(args: argparse.Namespace) -> int:
    try:
        meta = merge(args.out, args.parts)
    except (ValueError, OSError) as e:
        print(f"hgrn2 data merge: error: {e}", file=sys.stderr)
        return 2
    _print_summary(args.out, meta)
    return 0
