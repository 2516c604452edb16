"""`hgrn2 eval needle MODEL --haystack FILE...`: needle-in-a-haystack over a grid of context lengths × depths.

A fact (the needle) is inserted into a haystack of local text at a chosen depth (0% = start, 100% = end, moved back
to the preceding sentence end), the question is asked at the end, and the greedy answer is scored against the
expected one by exact match (the normalised answer occurs in the normalised reply) and ROUGE-L F1 (`rouge-score`).

Modes:
    easy      the question and its answer are both in the haystack (the HGRN2 paper's setting: a base model has
              to find the question and copy what followed it)
    standard  only the answer's sentence is in the haystack
    passkey   a random 5-digit pass key; without --haystack the filler is the classic repeated sentences

Writes OUT/needle.json (every cell's prompt length, reply and scores) and OUT/needle.png (a heatmap of the chosen
metric, context length on x and depth on y, as in the paper's figure). Replies are logged to OUT/needle.log.jsonl as
they come, so an interrupted run resumes.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import string
from pathlib import Path

import numpy as np

from hgrn2.bench.common import add_record_argument
from hgrn2.data.files import out_folder, write_json

from .common import (
    EvalError,
    ResultLog,
    add_device_arguments,
    check_length,
    default_device,
    evaluate_or_report,
    fingerprint,
    greedy_generate,
    load_model,
    load_tokenizer,
    model_label,
    save_figure,
    write_record,
)

NEEDLE = "The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day."
QUESTION = "What is the best thing to do in San Francisco?"
ANSWER_PREFIX = "The best thing to do in San Francisco is"
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="model directory (ours, converted fla, or any HF causal LM), with a tokenizer")
    p.add_argument("--haystack", nargs="*", default=None,
                   help="local text files, or folders of .txt files (repeated if too short)")
    p.add_argument("--out", required=True, type=out_folder, help="output directory for needle.json and needle.png")
    p.add_argument("--mode", choices=["easy", "standard", "passkey"], default="easy")
    p.add_argument("--lengths", default="1024,2048,4096", help="comma-separated context lengths in tokens")
    p.add_argument("--depths", type=int, default=11, help="number of evenly spaced depths from 0%% to 100%%")
    p.add_argument("--trials", type=int, default=1, help="haystack offsets (and pass keys) per cell")
    p.add_argument("--needle", default=NEEDLE, help="the fact (easy/standard)")
    p.add_argument("--question", default=QUESTION, help="the question asked at the end (easy/standard)")
    p.add_argument("--answer-prefix", default=ANSWER_PREFIX,
                   help="opening of the needle that is repeated after the question; the rest is the answer")
    p.add_argument("--metric", choices=["rougeL", "exact"], default="rougeL", help="what the heatmap shows")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--tokenizer", default=None, help="tokenizer directory (default: MODEL)")
    p.add_argument("--seed", type=int, default=0)
    add_device_arguments(p, context_limit=True)
    add_record_argument(p)


def run(args: argparse.Namespace) -> int:
    result = evaluate_or_report("needle", evaluate, args)
    if result is None:
        return 2
    grid = np.asarray(result["grid"][args.metric])
    print(f"{args.metric} ({result['mode']} mode), rows: depth %, columns: context length")
    print(f"{'depth':>6} " + " ".join(f"{n:>7}" for n in result["lengths"]))
    for d, row in zip(result["depths"], grid):
        print(f"{d:>6.0f} " + " ".join(f"{v:7.2f}" for v in row))
    print(f"mean exact {np.mean(result['grid']['exact']):.3f}, mean rougeL {np.mean(result['grid']['rougeL']):.3f}; "
          f"wrote {os.path.join(args.out, 'needle.json')} and needle.png")
    return 0


def evaluate(args: argparse.Namespace) -> dict:
    lengths, depths = _grid_args(args)
    tok = load_tokenizer(args.tokenizer or args.model)
    hay = _haystack(args.haystack, args.mode, tok)
    device = args.device or default_device()
    model = load_model(args.model, device, args.dtype)
    check_length(model, max(lengths), "--lengths", args.ignore_context_limit)
    rng = random.Random(args.seed)
    cells = []  # (length index, depth index, trial, prompt ids, answer, log key)
    for li, n in enumerate(lengths):
        for t in range(args.trials):
            needle, question, answer = _needle(args, rng)
            for di, d in enumerate(depths):
                ids = build_prompt(tok, hay, n, d / 100, needle, question, offset=t * 997)
                cells.append((li, di, t, ids, answer, _key(n, d, t)))
    settings = {k: v for k, v in sorted(vars(args).items()) if k not in (
        "out", "batch_size", "device", "metric", "ignore_context_limit", "record", "command_line", "model")}
    settings.update(weights=fingerprint(args.model), dtype=str(next(model.parameters()).dtype))
    os.makedirs(args.out, exist_ok=True)
    log = ResultLog(os.path.join(args.out, "needle.log.jsonl"), settings)
    try:
        _answer(model, tok, cells, args.batch_size, log)
    finally:
        log.close()
    replies = [log.done[c[5]]["reply"] for c in cells]
    exact = np.zeros((len(depths), len(lengths)))
    rouge = np.zeros_like(exact)
    records = []
    for (li, di, t, ids, answer, _), reply in zip(cells, replies):
        e, r = exact_match(reply, answer), rouge_l(reply, answer)
        exact[di, li] += e / args.trials
        rouge[di, li] += r / args.trials
        records.append({"length": lengths[li], "depth": depths[di], "trial": t, "prompt_tokens": len(ids),
                        "answer": answer, "reply": reply, "exact": e, "rougeL": r})
    result = {"model": os.path.abspath(args.model), "mode": args.mode, "haystack": args.haystack or "filler",
              "lengths": lengths, "depths": depths, "trials": args.trials,
              "grid": {"exact": exact.tolist(), "rougeL": rouge.tolist()}, "cells": records}
    os.makedirs(args.out, exist_ok=True)
    write_json(os.path.join(args.out, "needle.json"), result)
    plot_heatmap(result, args.metric, os.path.join(args.out, "needle.png"), model_label(args.model))
    if args.record is not None:
        path = write_record(args, "eval_needle", records, os.path.join(args.out, "needle.png"), device,
                            mode=args.mode, metric=args.metric, trials=args.trials, lengths=lengths, depths=depths)
        print(f"wrote record {path}")
    return result


def _grid_args(args) -> tuple[list[int], list[float]]:
    try:
        lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
    except ValueError as e:
        raise EvalError(f"--lengths: expected comma-separated integers, got {args.lengths!r}") from e
    if not lengths or min(lengths) < 64:
        raise EvalError(f"--lengths: expected context lengths >= 64 tokens, got {args.lengths!r}")
    for name in ("depths", "trials", "batch_size"):
        if getattr(args, name) < 1:
            raise EvalError(f"--{name.replace('_', '-')}: expected >= 1, got {getattr(args, name)}")
    if args.mode != "passkey" and not args.needle.startswith(args.answer_prefix):
        raise EvalError("--answer-prefix: the needle must start with it (the rest of the needle is the answer)")
    depths = [100 * i / (args.depths - 1) for i in range(args.depths)] if args.depths > 1 else [50.0]
    return lengths, depths


def _haystack_files(paths) -> list[str]:
    """The files given, a folder standing for the .txt files below it (in name order)."""
    files = []
    for p in paths:
        if os.path.isdir(p):
            found = sorted(str(f) for f in Path(p).rglob("*.txt") if f.is_file())
            if not found:
                raise EvalError(f"--haystack: the folder {p!r} holds no .txt files")
            files += found
        elif os.path.isfile(p):
            files.append(p)
        else:
            raise EvalError(f"--haystack: {p!r} does not exist")
    return files


def _haystack(files, mode: str, tok) -> list[int]:
    if not files:
        if mode != "passkey":
            raise EvalError(f"--haystack: required in {mode} mode (local text files)")
        return tok(FILLER * 8, add_special_tokens=False)["input_ids"]
    parts = []
    for f in _haystack_files(files):
        with open(f, encoding="utf-8") as fh:
            parts.append(fh.read())
    text = "\n\n".join(p for p in parts if p.strip())
    if not text:
        raise EvalError("--haystack: the files are empty")
    return tok(text, add_special_tokens=False)["input_ids"]


def _needle(args, rng: random.Random) -> tuple[str, str, str]:
    """(text inserted in the haystack, text after it at the end, expected answer)."""
    if args.mode == "passkey":
        key = str(rng.randint(10000, 99999))
        return (f"The pass key is {key}. Remember it. {key} is the pass key.",
                "What is the pass key? The pass key is", key)
    answer = args.needle[len(args.answer_prefix):].strip().rstrip(".")
    ask = f"Question: {args.question}\nAnswer: {args.answer_prefix}"
    inserted = f"Question: {args.question}\nAnswer: {args.needle}" if args.mode == "easy" else args.needle
    return inserted, ask, answer


def build_prompt(tok, hay: list[int], length: int, depth: float, needle: str, question: str,
                 offset: int = 0) -> list[int]:
    """`length` tokens: haystack (cycled from `offset`) with the needle at `depth` of it, then the question."""
    needle_ids = tok("\n" + needle + "\n", add_special_tokens=False)["input_ids"]
    ask_ids = tok("\n\n" + question, add_special_tokens=False)["input_ids"]
    prefix = tok("", add_special_tokens=True)["input_ids"]  # a BOS where the tokenizer adds one
    budget = length - len(needle_ids) - len(ask_ids) - len(prefix)
    if budget < 16:
        raise EvalError(f"--lengths: {length} tokens leave no room for the haystack around the needle and question")
    reps = (offset + budget) // len(hay) + 1
    body = (hay * reps)[offset % len(hay):][:budget]
    at = _sentence_end(tok, body, round(depth * budget))
    return prefix + body[:at] + needle_ids + body[at:] + ask_ids


def _sentence_end(tok, body: list[int], at: int, reach: int = 256) -> int:
    """The position just after the last sentence-ending token at or before `at` (within `reach`), else `at`."""
    if at in (0, len(body)):
        return at
    for i in range(at, max(0, at - reach), -1):
        if ends_sentence(tok.decode(body[i - 1:i])):
            return i
    return at


def ends_sentence(text: str) -> bool:
    return text.endswith("\n") or text.rstrip().endswith((".", "!", "?"))


def _key(length: int, depth: float, trial: int) -> str:
    return f"{length}/{depth:g}/{trial}"


def _answer(model, tok, cells, batch_size: int, log: ResultLog) -> None:
    """Greedy replies (first line) for the cells not in `log` yet, logged batch by batch."""
    from tqdm.auto import tqdm

    longest = max(len(tok(c[4], add_special_tokens=False)["input_ids"]) for c in cells)
    eos = [tok.eos_token_id] if tok.eos_token_id is not None else []
    todo = [c for c in cells if c[5] not in log.done]
    for s in tqdm(range(0, len(todo), batch_size), desc="needle", dynamic_ncols=True):
        part = todo[s:s + batch_size]
        gens = greedy_generate(model, tok, [c[3] for c in part], longest + 8, batch_size, stop_ids=eos,
                               stop_strings=["\n"])
        for c, g in zip(part, gens):
            log.add(c[5], {"reply": tok.decode(g, skip_special_tokens=True).split("\n")[0].strip()})


def _normalise(text: str) -> str:
    text = text.lower().translate(str.maketrans("", "", string.punctuation))
    return re.sub(r"\s+", " ", text).strip()


def exact_match(reply: str, answer: str) -> float:
    """1 when the normalised answer occurs in the normalised reply."""
    return float(_normalise(answer) in _normalise(reply))


def rouge_l(reply: str, answer: str) -> float:
    """ROUGE-L F1 of the reply against the answer."""
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rougeL"]).score(answer, reply)["rougeL"].fmeasure


def plot_heatmap(result: dict, metric: str, path: str, label: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import LinearSegmentedColormap

    cmap = LinearSegmentedColormap.from_list("niah", ["#F0496E", "#EBB839", "#0CD79F"])
    grid = np.asarray(result["grid"][metric])
    fig, ax = plt.subplots(figsize=(1.2 + 0.9 * len(result["lengths"]), 1.0 + 0.35 * len(result["depths"])))
    im = ax.imshow(grid, cmap=cmap, vmin=0, vmax=1, aspect="auto")
    ax.set_xticks(range(len(result["lengths"])), [str(n) for n in result["lengths"]])
    ax.set_yticks(range(len(result["depths"])), [f"{d:.0f}" for d in result["depths"]])
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("depth (%)")
    ax.set_title(f"{label}: needle in a haystack, {result['mode']} mode ({metric})")
    fig.colorbar(im, ax=ax, label=metric)
    save_figure(fig, path)
    plt.close(fig)
