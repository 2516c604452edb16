"""`hgrn2 ablate`: the HGRN2 paper's language-model ablations as sweeps that train, evaluate perplexity and plot.

    hgrn2 ablate all --scale small --out runs/ablate-small --max-minutes 30   # every recipe, one GPU
    hgrn2 ablate expand --scale paper --data data/wt103 --out runs/ablate-wt103
    hgrn2 ablate pese hgrn1 --scale small --report --out runs/ablate-small    # tables and plots, no training
    hgrn2 ablate all --scale small --report --out runs/ablate-small --record  # + benchmark records per recipe
    hgrn2 ablate all --scale small --prepare-only --out runs/ablate-small     # only the corpus, into OUT/data

Recipes (hgrn2/configs/ablate.yaml): `expand` (perplexity against the expand ratio 1, 2, ..., 128; a plot),
`pese` (the PESE table: HGRN1, Naive, LR, GLT, GLTI, KRP, KP at n = 4, LR also 8, against HGRN2), `hgrn1`
(complex and real HGRN1 against HGRN2), `lower-bound` (on and off). Scales: `paper` (WikiText-103 prepared by
`hgrn2 data prepare`, given with --data; the paper's 50k steps), `small` (a corpus assembled by `hgrn2.data.corpus`
from the Debian documentation packages python3-doc and linux-doc, with a BPE trained on it; the whole set in
minutes on one GPU) and `smoke` (seconds on a CPU, for tests).

Every run is the library's `Trainer` (hgrn2.train.trainer) over `hgrn2.experiments.sweep`: resumable (a killed sweep
continues from each run's last checkpoint), several runs at once on one device (`--concurrent`), a time budget
(`--max-minutes`; cut runs are marked * and continue on the next call). Output: `OUT/runs/*.json` (one per run),
`OUT/<recipe>.txt` (table), `OUT/<recipe>.png` (plot), `OUT/results.json` (every recipe's rows). `--record`
writes `benchmarks/results/<device>/ablate_<scale>_<recipe>.json` with its plot, in the environment (device,
versions, commit) each run saved where it trained; `--report` finds the runs of an `OUT` copied from another
machine.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import yaml

from hgrn2.bench.common import add_record_argument, command_of, environment, runs_environment, write_result
from hgrn2.data.files import write_json
from hgrn2.experiments.sweep import best_device, read_result, sweep
from hgrn2.models.device import device_name
from hgrn2.train.distributed import main_process
from hgrn2.train.plot import pyplot

CONFIG_PATH = Path(__file__).resolve().parent.parent / "configs" / "ablate.yaml"
SOURCES = ("debian-docs", "python-docs")


def load_config(path: str | Path = CONFIG_PATH) -> dict:
    with open(path) as f:
        return yaml.safe_load(f)


@dataclass
class LMRun:
    """One language-model run: HGRN2Config fields, TrainConfig fields and the prepared corpus."""

    model: dict
    train: dict
    data: str
    seed: int = 1234
    labels: list = field(default_factory=list, compare=False)  # "recipe/variant" names this run answers

    @property
    def run_id(self) -> str:
        key = json.dumps(dict(model=self.model, train=self.train, data=os.path.abspath(self.data), seed=self.seed),
                         sort_keys=True)
        mixer = self.model.get("token_mixer", "hgrn2")
        return f"{mixer}-{hashlib.md5(key.encode()).hexdigest()[:10]}"

    @property
    def total_steps(self) -> int:
        return int(self.train["max_steps"])


# ---------------------------------------------------------------------------------------------------------------
# corpus


def assemble_corpus(source: str, out: Path, max_bytes: int | None, vocab_size: int) -> Path:
    """Assemble the source's documents (`hgrn2.data.corpus`, into `out`-text), train a BPE on the training
    documents and tokenise both splits (`hgrn2.data.prepare`) into `out`; returns `out`. Reuses `out` when it
    already holds a prepared corpus."""
    from hgrn2.data.corpus import assemble
    from hgrn2.data.prepare import prepare

    if (out / "meta.json").is_file():
        return out
    # the text beside the tokens, not in them: the prepared folder alone is what a GPU machine needs
    text = assemble(source, out.with_name(out.name + "-text"), max_bytes, val_fraction=0.05, overwrite=True)
    print(f"corpus {source} in {text}; training a BPE of {vocab_size} tokens")
    prepare([str(text / "train")], str(out), train_tokenizer=vocab_size, val_inputs=[str(text / "valid")],
            sample_by="document", overwrite=True)
    return out


# ---------------------------------------------------------------------------------------------------------------
# one run


def train_lm(spec: LMRun, device: str, *, deadline: float | None = None, on_step=None,
             checkpoint_dir: str | Path | None = None) -> dict:
    """Train one run with the library's Trainer (its checkpoints and log in `checkpoint_dir`, from whose newest
    checkpoint it continues) and evaluate perplexity on the whole validation split."""
    from hgrn2.train import distributed as D
    from hgrn2.train.config import TrainConfig
    from hgrn2.train.logger import read_log
    from hgrn2.train.trainer import Trainer

    out = Path(checkpoint_dir or "runs/ablate-run")
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev.index or 0)
        dev = torch.device("cuda", dev.index or 0)
    cfg = TrainConfig(**spec.train, model=dict(spec.model), data=spec.data, out_dir=str(out), seed=spec.seed,
                      device="cuda" if dev.type == "cuda" else "cpu", num_workers=0, progress=False,
                      tensorboard=False, keep_last=1)
    cfg.validate()
    start = time.time()

    def after_step() -> bool:
        if on_step is not None:
            on_step()
        return deadline is not None and time.time() > deadline

    out.mkdir(parents=True, exist_ok=True)
    with open(out / "train.out", "a") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        trainer = Trainer(cfg, D.Dist(0, 1, dev.index or 0, dev))
        final = trainer.train(after_step=after_step)
    records = read_log(str(out / "log.jsonl")) if (out / "log.jsonl").is_file() else []
    complete = "stopped_at" not in final
    last_val = final if complete else next((r for r in reversed(records) if r["kind"] == "val"), {})
    return dict(run_id=spec.run_id, spec=asdict(spec), complete=complete, steps=trainer.step,
                val_loss=last_val.get("val_loss"), val_ppl=last_val.get("val_ppl"), parameters=trainer.n_params,
                seconds=round(time.time() - start, 1), device=str(dev), environment=environment(dev),
                corpus=_data_note(spec.data),
                history=[r for r in records if r["kind"] == "val"],
                train_loss=[(r["step"], r["loss"]) for r in records if r["kind"] == "train"])


# ---------------------------------------------------------------------------------------------------------------
# the recipes' runs


def base_model(scale: dict, variant: str) -> dict:
    from hgrn2.models.presets import PRESETS

    preset = scale.get("variant_presets", {}).get(variant) or scale.get("preset")
    return dict(PRESETS[preset]) if preset else dict(scale["model"])


def build_runs(recipes: list[str], scale_name: str, data: str, cfg: dict, steps: int | None = None
               ) -> tuple[dict[str, list[tuple[str, LMRun]]], list[LMRun]]:
    """{recipe: [(variant, run)]} and the distinct runs (a run shared by several recipes is trained once)."""
    if scale_name not in cfg["scales"]:
        raise ValueError(f"--scale: expected one of {sorted(cfg['scales'])}, got {scale_name!r}")
    scale = cfg["scales"][scale_name]
    train = dict(scale["train"], **({"max_steps": steps} if steps else {}))
    by_recipe, unique = {}, {}
    for recipe in recipes:
        if recipe not in cfg["recipes"]:
            raise ValueError(f"recipe: expected one of {sorted(cfg['recipes'])} or all, got {recipe!r}")
        spec = cfg["recipes"][recipe]
        rows = []
        for variant, fields in spec["variants"].items():
            model = {**base_model(scale, variant), **spec.get("common", {}), **fields}
            run = LMRun(model=model, train=train, data=data)
            run = unique.setdefault(run.run_id, run)
            run.labels.append(f"{recipe}/{variant}")
            rows.append((variant, run))
        by_recipe[recipe] = rows
    return by_recipe, list(unique.values())


# ---------------------------------------------------------------------------------------------------------------
# reporting


def rows_of(rows: list[tuple[str, LMRun]], results: dict[str, dict]) -> list[dict]:
    out = []
    for variant, run in rows:
        r = results.get(run.run_id)
        out.append(dict(variant=variant, run_id=run.run_id, token_mixer=run.model.get("token_mixer", "hgrn2"),
                        expand_ratio=run.model.get("expand_ratio"), mixer_options=run.model.get("mixer_options", {}),
                        use_lower_bound=run.model.get("use_lower_bound", True),
                        parameters=r and r["parameters"], val_ppl=r and r["val_ppl"], val_loss=r and r["val_loss"],
                        steps=r and r["steps"], complete=bool(r and r["complete"])))
    return out


def table(recipe: str, title: str, rows: list[dict]) -> str:
    lines = [f"{recipe}: {title} (validation perplexity; * = cut by the budget, - = not run)",
             f"{'variant':<16}{'params (M)':>12}{'val ppl':>12}{'steps':>8}"]
    for r in rows:
        ppl = "-" if r["val_ppl"] is None else f"{r['val_ppl']:.2f}" + ("" if r["complete"] else "*")
        params = "-" if r["parameters"] is None else f"{r['parameters'] / 1e6:.2f}"
        lines.append(f"{r['variant']:<16}{params:>12}{ppl:>12}{r['steps'] or '-':>8}")
    return "\n".join(lines)


def plot(recipe: str, title: str, rows: list[dict], path: Path) -> Path | None:
    """Expand: perplexity against the expand ratio (log scale); other recipes: one bar per variant."""
    plt = pyplot()
    if plt is None:
        return None
    done = [r for r in rows if r["val_ppl"] is not None]
    if not done:
        return None
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    if recipe == "expand":
        ax.plot([r["expand_ratio"] for r in done], [r["val_ppl"] for r in done], marker="o")
        ax.set_xscale("log", base=2)
        ax.set_xticks([r["expand_ratio"] for r in done], [str(r["expand_ratio"]) for r in done])
        ax.set(xlabel="expand ratio (head dimension)", ylabel="validation perplexity")
    else:
        ax.bar([r["variant"] for r in done], [r["val_ppl"] for r in done],
               color=["tab:orange" if r["token_mixer"] == "hgrn2" else "tab:blue" for r in done])
        ax.set(ylabel="validation perplexity")
        ax.set_ylim(0.95 * min(r["val_ppl"] for r in done), 1.02 * max(r["val_ppl"] for r in done))
        ax.tick_params(axis="x", rotation=30)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return path


def record(args, cfg: dict, data: str, by_recipe: dict, report: dict, by_id: dict) -> list[Path]:
    """One benchmark record per recipe, `ablate_<scale>_<recipe>.json` with its plot, in the environment its runs
    recorded where they trained; recipes without a finished run are left out. Smoke runs are marked quick. Rows
    leave out the run ids, which hold this machine's corpus path."""
    out, paths = Path(args.out), []
    for recipe, rows in report.items():
        runs = [by_id[r.run_id] for _, r in by_recipe[recipe] if r.run_id in by_id]
        if not runs:
            print(f"{recipe}: no finished run to record")
            continue
        figure = out / f"{recipe}.png"
        env = runs_environment([r.get("environment") for r in runs], out)
        train = cfg["scales"][args.scale]["train"] | ({"max_steps": args.steps} if args.steps else {})
        paths.append(write_result(
            args.record or None, f"ablate_{args.scale}_{recipe}", env,
            [{k: v for k, v in r.items() if k != "run_id"} for r in rows], command_of(args),
            quick=args.scale == "smoke", figure=figure if figure.is_file() else None, recipe=recipe, scale=args.scale,
            title=cfg["recipes"][recipe]["title"], train=train, data=runs[0].get("corpus") or _data_note(data)))
        print(f"wrote record {paths[-1]}")
    return paths


def _data_note(data: str) -> str:
    """The corpus by its folder name and size (its meta.json), not by this machine's path."""
    path, name = Path(data) / "meta.json", Path(data).name
    if not path.is_file():
        return name
    meta = json.loads(path.read_text())
    s = meta["splits"]
    return (f"{name}: {s['train']['tokens']:,} training and {s['val']['tokens']:,} validation tokens, vocabulary "
            f"{meta['vocab_size']}")


def _settings(spec: dict) -> str:
    return json.dumps([spec["model"], spec["train"], spec["seed"]], sort_keys=True)


def finished_anywhere(runs: list[LMRun], out: Path) -> list[dict]:
    """The saved results of `runs` in `out`/runs: by run id, else by the run's settings but the corpus (a run id
    holds the corpus's absolute path, which differs once `out` is copied from the machine that trained it)."""
    saved = [r for p in sorted((out / "runs").glob("*.json")) if (r := read_result(p)) and "spec" in r]
    by_id, by_settings = {r["run_id"]: r for r in saved}, {}
    for r in saved:
        by_settings.setdefault(_settings(r["spec"]), []).append(r)
    found = []
    for run in runs:
        res = by_id.get(run.run_id)
        if res is None:
            same = by_settings.get(_settings(asdict(run)), [])
            if len({r["spec"]["data"] for r in same}) > 1:
                raise ValueError(f"--out: {out}/runs holds runs of {', '.join(run.labels)} on several corpora "
                                 f"({', '.join(sorted({r['spec']['data'] for r in same}))}); report each from a "
                                 "folder of its own")
            res = same[0] if same else None
        if res is not None:
            found.append(dict(res, run_id=run.run_id))
    return found


def _summary_line(r: dict) -> str:
    ppl = "-" if r["val_ppl"] is None else f"{r['val_ppl']:.2f}"
    return (f"{', '.join(r['spec']['labels'])}: val ppl {ppl} after {r['steps']} steps, "
            f"{r['parameters'] / 1e6:.2f}M parameters, {r['seconds']:.0f}s" + ("" if r["complete"] else " [cut]"))


# ---------------------------------------------------------------------------------------------------------------
# command line


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("recipes", nargs="+", help="expand, pese, hgrn1, lower-bound, or all")
    p.add_argument("--scale", default="small", help="paper, small (default) or smoke (hgrn2/configs/ablate.yaml)")
    p.add_argument("--data", help="a corpus prepared by `hgrn2 data prepare` (required at --scale paper; else the "
                                  "scale's corpus is assembled into OUT/data)")
    p.add_argument("--source", choices=SOURCES, help="corpus source for the assembled corpus (default: the scale's)")
    p.add_argument("--out", default="runs/ablate", help="output folder (runs/*.json, tables, plots, results.json)")
    p.add_argument("--steps", type=int, help="override the scale's training steps (smoke runs)")
    p.add_argument("--device", type=device_name, help="cuda, mps or cpu (default: the best present)")
    p.add_argument("--concurrent", type=int, help="runs trained at once sharing the device (default: 8 on CUDA, "
                                                  "else 1)")
    p.add_argument("--max-minutes", type=float, help="stop after this many minutes; a rerun continues cut runs")
    p.add_argument("--config", default=str(CONFIG_PATH), help="the YAML file with the scales and recipes")
    p.add_argument("--list", action="store_true", help="print the runs and exit")
    p.add_argument("--prepare-only", action="store_true", help="assemble the corpus into OUT/data and exit")
    p.add_argument("--report", action="store_true", help="train nothing: tables, plots and results.json from the "
                                                         "runs already finished in --out")
    add_record_argument(p)


def _data_dir(args, scale: dict, out: Path) -> str:
    if args.report or args.list:  # nothing is read from the corpus
        return args.data or str(out / "data")
    if args.data:
        if not (Path(args.data) / "meta.json").is_file():
            raise ValueError(f"--data: {args.data!r} is not a prepared corpus (no meta.json); run `hgrn2 data "
                             "prepare`")
        return args.data
    if "corpus" not in scale:
        raise ValueError(f"--data: --scale {args.scale} trains on a corpus you prepare (hgrn2 data prepare): give "
                         "its directory")
    c = scale["corpus"]
    return str(assemble_corpus(args.source or c["source"], out / "data", c.get("max_bytes"), c["vocab_size"]))


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    recipes = list(cfg["recipes"]) if args.recipes == ["all"] else args.recipes
    if args.steps is not None and args.steps < 1:
        raise ValueError(f"--steps: expected a positive number, got {args.steps}")
    if args.concurrent is not None and args.concurrent < 1:
        raise ValueError(f"--concurrent: expected a positive number, got {args.concurrent}")
    if args.max_minutes is not None and not (math.isfinite(args.max_minutes) and args.max_minutes > 0):
        raise ValueError(f"--max-minutes: expected a positive number of minutes, got {args.max_minutes}")
    build_runs(recipes, args.scale, "", cfg)  # a bad recipe or scale fails here, before a corpus is assembled
    out = Path(args.out)
    data = _data_dir(args, cfg["scales"][args.scale], out)
    if args.prepare_only:
        print(f"corpus ready in {data}")
        return 0
    by_recipe, runs = build_runs(recipes, args.scale, data, cfg, args.steps)
    if args.list:
        for r in runs:
            print(r.run_id, ", ".join(r.labels), json.dumps(r.model, sort_keys=True))
        return 0
    device = args.device or best_device()
    concurrent = args.concurrent or (min(8, len(runs)) if device.startswith("cuda") else 1)
    if args.report:
        results, errors = finished_anywhere(runs, out), 0
    else:
        results, errors = sweep(runs, out, device, train_lm, concurrent=concurrent, max_minutes=args.max_minutes,
                                name="ablate", summary=_summary_line)
        if not main_process():  # torchrun: rank 0 writes the tables
            return 1 if errors else 0
    by_id = {r["run_id"]: r for r in results}
    report = {}
    for recipe, rows in by_recipe.items():
        title = cfg["recipes"][recipe]["title"]
        report[recipe] = rows_of(rows, by_id)
        text = table(recipe, title, report[recipe])
        print("\n" + text)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{recipe}.txt").write_text(text + "\n")
        plot(recipe, title, report[recipe], out / f"{recipe}.png")
    write_json(out / "results.json", dict(scale=args.scale, data=data, recipes=report))
    if args.record is not None:
        record(args, cfg, data, by_recipe, report, by_id)
    missing = sum(1 for r in runs if not by_id.get(r.run_id, {}).get("complete"))
    print(f"\nresults: {out / 'results.json'}, tables and plots in {out}")
    if missing:
        print(f"{missing} of {len(runs)} runs are not complete: run the same command"
              + (" without --report" if args.report else " again") + " to continue")
    return 1 if errors else 0


__all__ = ["LMRun", "train_lm", "build_runs", "assemble_corpus", "table", "plot", "add_arguments", "run"]
