"""`hgrn2 eval scrolls MODEL FILE.jsonl --task NAME`: a SCROLLS task from a local JSONL file, answered by greedy
decoding and scored as in the SCROLLS paper: ROUGE-1/2/L for GovReport, SummScreenFD and QMSum, token F1 for
Qasper and NarrativeQA, exact match for QuALITY and ContractNLI (ROUGE is reported for every task).

The file holds SCROLLS rows, {"id", "pid", "input", "output"} (the layout of the `tau/scrolls` data: one row per
reference, rows of one example share `id`). Prompts follow lm-eval's `scrolls` tasks: the question (text before
the first blank line of `input`) is moved after the document. lm-eval's own `scrolls` tasks fetch their metric
script from the hub at run time, so this reader is the offline route.

`--max-input-tokens N` keeps the first N tokens of each document (SCROLLS' baselines truncate the same way); the
number of truncated examples is reported. Writes OUT/scrolls.json (metrics ×100 and every prediction); answers are
logged to OUT/scrolls.log.jsonl as they come, so an interrupted run resumes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import string
from collections import Counter

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
)

TASKS = {"gov_report": "rouge", "summ_screen_fd": "rouge", "qmsum": "rouge", "qasper": "f1", "narrative_qa": "f1",
         "quality": "em", "contract_nli": "em"}
QUESTION_FIRST = ("qmsum", "qasper", "narrative_qa", "quality", "contract_nli")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="model directory (ours, converted fla, or any HF causal LM), with a tokenizer")
    p.add_argument("data", help="SCROLLS-format JSONL file (e.g. qmsum/validation.jsonl)")
    p.add_argument("--task", required=True, help=f"one of {', '.join(TASKS)}")
    p.add_argument("--out", required=True, type=out_folder, help="output directory for scrolls.json")
    p.add_argument("--max-input-tokens", type=int, default=None, help="keep the first N tokens of each document")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--limit", type=int, default=None, help="evaluate the first N examples")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--tokenizer", default=None, help="tokenizer directory (default: MODEL)")
    add_device_arguments(p)


def run(args: argparse.Namespace) -> int:
    result = evaluate_or_report("scrolls", evaluate, args)
    if result is None:
        return 2
    m = result["metrics"]
    print(f"{args.task}: {result['examples']} examples ({result['truncated']} truncated), "
          + ", ".join(f"{k} {v:.2f}" for k, v in m.items()))
    print(f"wrote {os.path.join(args.out, 'scrolls.json')}")
    return 0


def evaluate(args: argparse.Namespace) -> dict:
    if args.task not in TASKS:
        raise EvalError(f"--task: unknown task {args.task!r}; expected one of {', '.join(TASKS)}")
    for name in ("max_input_tokens", "max_new_tokens", "limit", "batch_size"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise EvalError(f"--{name.replace('_', '-')}: expected >= 1, got {getattr(args, name)}")
    examples = read_examples(args.data)[: args.limit]
    if args.task in QUESTION_FIRST:
        bad = next((ex for ex in examples if "\n\n" not in ex["input"]), None)
        if bad is not None:
            raise EvalError(f"DATA: {args.data}:{bad['line']}: a {args.task} input starts with its question and a "
                            f"blank line before the document; this one has no blank line")
    tok = load_tokenizer(args.tokenizer or args.model)
    prompts, truncated = [], 0
    for ex in examples:
        ids, cut = build_prompt(tok, args.task, ex["input"], args.max_input_tokens)
        prompts.append(ids)
        truncated += cut
    device = args.device or default_device()
    model = load_model(args.model, device, args.dtype)
    check_length(model, max(map(len, prompts)) + args.max_new_tokens, "prompt + --max-new-tokens (use "
                 "--max-input-tokens)")
    settings = {"weights": fingerprint(args.model), "data": fingerprint(args.data), "task": args.task,
                "max_input_tokens": args.max_input_tokens, "max_new_tokens": args.max_new_tokens,
                "dtype": str(next(model.parameters()).dtype)}
    os.makedirs(args.out, exist_ok=True)
    log = ResultLog(os.path.join(args.out, "scrolls.log.jsonl"), settings)
    try:
        _generate(model, tok, examples, prompts, args, log)
    finally:
        log.close()
    preds = [log.done[ex["id"]]["prediction"] for ex in examples]
    metrics = score(args.task, preds, [ex["outputs"] for ex in examples])
    result = {"model": os.path.abspath(args.model), "data": os.path.abspath(args.data), "task": args.task,
              "examples": len(examples), "truncated": truncated, "max_input_tokens": args.max_input_tokens,
              "max_new_tokens": args.max_new_tokens, "metrics": metrics,
              "predictions": [{"id": ex["id"], "prediction": p, "references": ex["outputs"]}
                              for ex, p in zip(examples, preds)]}
    write_json(os.path.join(args.out, "scrolls.json"), result)
    return result


def _generate(model, tok, examples, prompts, args, log: ResultLog) -> None:
    """Greedy answers for the examples not in `log` yet, longest prompts first, logged batch by batch."""
    from tqdm.auto import tqdm

    eos = [tok.eos_token_id] if tok.eos_token_id is not None else []
    todo = sorted((i for i, ex in enumerate(examples) if ex["id"] not in log.done), key=lambda i: -len(prompts[i]))
    for s in tqdm(range(0, len(todo), args.batch_size), desc=args.task, dynamic_ncols=True):
        part = todo[s:s + args.batch_size]
        gens = greedy_generate(model, tok, [prompts[i] for i in part], args.max_new_tokens, args.batch_size,
                               stop_ids=eos, stop_strings=["\n"])
        for i, g in zip(part, gens):
            log.add(examples[i]["id"], {"prediction": tok.decode(g, skip_special_tokens=True).split("\n")[0].strip()})


def read_examples(path: str) -> list[dict]:
    """Examples in file order, each {"id", "input", "outputs"} with the references of all rows sharing its id."""
    if not os.path.isfile(path):
        raise EvalError(f"DATA: {path!r} does not exist")
    by_id: dict[str, dict] = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise EvalError(f"DATA: {path}:{n} is not JSON ({e.msg})") from e
            if not isinstance(row, dict):
                raise EvalError(f"DATA: {path}:{n} is not a JSON object with the SCROLLS fields id, input, output")
            missing = [k for k in ("id", "input", "output") if k not in row]
            if missing:
                raise EvalError(f"DATA: {path}:{n} lacks SCROLLS field(s) {missing}")
            wrong = [f"{k} is {type(row[k]).__name__}" for k in ("id", "input", "output")
                     if not isinstance(row[k], str)]
            if wrong:
                raise EvalError(f"DATA: {path}:{n}: expected text in id, input and output, but {', '.join(wrong)}")
            if not row["input"].strip():
                raise EvalError(f"DATA: {path}:{n} has an empty input")
            ex = by_id.setdefault(row["id"], {"id": row["id"], "input": row["input"], "outputs": [], "line": n})
            ex["outputs"].append(row["output"])
    if not by_id:
        raise EvalError(f"DATA: {path!r} has no examples")
    return list(by_id.values())


def build_prompt(tok, task: str, text: str, max_input_tokens: int | None) -> tuple[list[int], bool]:
    """Prompt token ids (question after the document, as lm-eval's scrolls tasks) and whether it was truncated."""
    question = "What is a summary of the preceding text?"
    if task in QUESTION_FIRST:
        split = text.find("\n\n")
        question, text = text[:split], text[split + 2:]
    doc = tok(text, add_special_tokens=True)["input_ids"]
    cut = max_input_tokens is not None and len(doc) > max_input_tokens
    doc = doc[:max_input_tokens] if cut else doc
    ask, reply = ("Hypothesis", "Conclusion") if task == "contract_nli" else ("Question", "Answer")
    tail = f"\n\n{ask}: {question}\n{reply}:"
    return doc + tok(tail, add_special_tokens=False)["input_ids"], cut


def score(task: str, preds: list[str], refs: list[list[str]]) -> dict[str, float]:
    """Metrics ×100, each the mean over examples of the best score over that example's references."""
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    best = {k: 0.0 for k in ("rouge1", "rouge2", "rougeL")}
    for p, rs in zip(preds, refs):
        scores = [scorer.score(r, p) for r in rs]
        for k in best:
            best[k] += max(s[k].fmeasure for s in scores)
    out = {k: 100 * v / len(preds) for k, v in best.items()}
    if TASKS[task] == "f1":
        out["f1"] = 100 * sum(max(token_f1(p, r) for r in rs) for p, rs in zip(preds, refs)) / len(preds)
    elif TASKS[task] == "em":
        out["em"] = 100 * sum(max(float(_norm(p) == _norm(r)) for r in rs) for p, rs in zip(preds, refs)) / len(preds)
    return out


def _norm(text: str) -> str:
    """SQuAD normalisation: lower case, no punctuation, no articles, single spaces."""
    text = text.lower().translate(str.maketrans("", "", string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def token_f1(pred: str, ref: str) -> float:
    p, r = _norm(pred).split(), _norm(ref).split()
    common = sum((Counter(p) & Counter(r)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(p), common / len(r)
    return 2 * precision * recall / (precision + recall)
