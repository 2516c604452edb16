"""`hgrn2 train`: train a causal LM on a prepared corpus; alone or under torchrun (DDP / FSDP2), single or multi-node.

    hgrn2 train --config wikitext103 --set data=data/wt103 out_dir=runs/wt103
    hgrn2 train --config wikitext103 --set data=data/wt103 --cuda-graph   # require each step as one CUDA graph
    torchrun --nproc_per_node=8 -m hgrn2.cli train --config hgrn2-1b --set data=data/pile parallel=fsdp
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import yaml

from .config import make_config, preset_names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=None, help="preset name or YAML file (see --list-presets)")
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE", action="extend",
                        help="override config keys, e.g. lr=3e-4 model.num_hidden_layers=12")
    parser.add_argument("--cuda-graph", action="store_true",
                        help="require each step to be replayed as one CUDA graph (--set cuda_graph=true; by default it "
                             "is for HGRN2's token mixer wherever it can be: one GPU, no compile; --set "
                             "cuda_graph=false for eager steps; see `cuda_graph` in hgrn2/train/config.py)")
    parser.add_argument("--list-presets", action="store_true", help="print the preset names and exit")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")


def run(args: argparse.Namespace) -> int:
    if args.list_presets:
        from hgrn2.models.presets import MODEL_PRESETS

        print("\n".join(f"{n} (or {MODEL_PRESETS[n]})" if n in MODEL_PRESETS else n for n in preset_names()))
        return 0
    try:
        cfg = make_config(args.config, args.set + (["cuda_graph=true"] if args.cuda_graph else []))
    except (ValueError, FileNotFoundError) as e:
        print(f"hgrn2 train: error: {e}", file=sys.stderr)
        return 2
    if args.print_config:  # needs no data: shows what a run would use
        print(yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False), end="")
        return 0
    from . import distributed as D
    from .guard import train_command
    from .trainer import Trainer

    return train_command("hgrn2 train", lambda: Trainer(cfg, D.init(cfg.device)))
