"""`hgrn2 eval ppl MODEL DATA`: perplexity and the per-position loss curve (length extrapolation) of a saved model.

DATA is a directory written by `hgrn2 data prepare` (a token memmap; documents end at `eos_id`) or raw text files
tokenised with the model's tokenizer. Sequences are the documents (`--sequences documents`) or the token stream cut
into `--length`-token pieces (`--sequences stream`). Two modes:

    carried   one pass per sequence, the model's cache carried across `--chunk`-token forwards (the natural mode for
              a recurrent model; for attention models the cache grows with the sequence)
    windows   each sequence cut into non-overlapping `--window`-token windows, each scored from an empty state (the
              first token of a window is not predicted)

The loss at position p (predicting token p from tokens < p) is averaged over the sequences that reach p, so one run
gives the length-extrapolation curve. Writes OUT/ppl.json (totals, the curve, its binned form) and OUT/ppl.png.
Finished batches are kept in OUT/ppl.parts until the run completes, so an interrupted run resumes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil

import numpy as np
import torch
import torch.nn.functional as F

from hgrn2.bench.common import add_record_argument
from hgrn2.data.files import out_folder, write_json
from hgrn2.data.packed import read_split

from .common import (
    EvalError,
    add_device_arguments,
    check_length,
    default_device,
    evaluate_or_report,
    fingerprint,
    forward,
    load_model,
    load_tokenizer,
    model_label,
    save_figure,
    write_record,
)

TEXT_SUFFIXES = (".txt", ".text", ".raw", ".md", ".rst")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="model directory (save_pretrained, `hgrn2 convert-fla`, or any HF causal LM)")
    p.add_argument("data", nargs="+", help="a `hgrn2 data prepare` directory, or raw text files")
    p.add_argument("--out", required=True, type=out_folder, help="output directory for ppl.json and ppl.png")
    p.add_argument("--split", default="val", help="split of a prepared directory (default: val)")
    p.add_argument("--tokenizer", default=None, help="tokenizer directory for raw text (default: MODEL)")
    p.add_argument("--sample-by", choices=["document", "paragraph", "line"], default="document",
                   help="what one document is in a raw text file (a whole file by default)")
    p.add_argument("--sequences", choices=["documents", "stream"], default="documents",
                   help="score each document, or the token stream cut into --length pieces")
    p.add_argument("--length", type=int, default=None,
                   help="stream: piece length (required); documents: split longer documents into pieces this long")
    p.add_argument("--mode", choices=["carried", "windows"], default="carried")
    p.add_argument("--window", type=int, default=None, help="windows mode: window length in tokens")
    p.add_argument("--chunk", type=int, default=2048, help="carried mode: tokens per forward")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--max-sequences", type=int, default=None, help="score only the first N sequences")
    p.add_argument("--train-length", type=int, default=None, help="marks the training length on the plot")
    p.add_argument("--compare", nargs="*", default=[], metavar="PPL_JSON",
                   help="ppl.json files of other runs drawn on the same plot (e.g. a Llama baseline)")
    p.add_argument("--bin", type=int, default=None, help="curve bin width in tokens (default: ~200 bins)")
    add_device_arguments(p, context_limit=True)
    add_record_argument(p)


def run(args: argparse.Namespace) -> int:
    result = evaluate_or_report("ppl", evaluate, args)
    if result is None:
        return 2
    print(f"{result['sequences']} sequences, {result['tokens']:,} predicted tokens: "
          f"loss {result['loss']:.4f}, ppl {result['ppl']:.3f}")
    b = result["binned"]
    print(f"{'positions':>18} {'loss':>8} {'ppl':>10}")
    for lo, hi, loss in zip(b["start"], b["end"], b["loss"]):
        if loss is not None and (lo == 1 or hi >= b["end"][-1] or _is_pow2_bin(lo, hi)):
            print(f"{lo:>8}-{hi:<9} {loss:8.4f} {math.exp(loss):10.3f}")
    print(f"wrote {os.path.join(args.out, 'ppl.json')} and ppl.png")
    return 0


def evaluate(args: argparse.Namespace) -> dict:
    _check_args(args)
    others = [_read_result(f) for f in args.compare]
    device = args.device or default_device()
    model = load_model(args.model, device, args.dtype)
    docs, source = read_documents(args.data, args.split, args.tokenizer or args.model, args.sample_by)
    seqs = make_sequences(docs, args.sequences, args.length)[: args.max_sequences]
    if not seqs:
        raise EvalError("DATA: no sequence has two or more tokens to score")
    vocab = model.config.vocab_size
    top = max(int(s.max()) for s in seqs)
    if top >= vocab:
        raise EvalError(f"DATA: token id {top} is outside the model's vocabulary of {vocab}")
    if args.mode == "carried":
        check_length(model, max(len(s) for s in seqs), "--mode carried (longest sequence)",
                     args.ignore_context_limit)
    else:
        check_length(model, args.window, "--window", args.ignore_context_limit)
    parts = _parts_dir(args, model)
    if args.mode == "carried":
        losses = score_carried(model, seqs, args.chunk, args.batch_size, parts=parts)
    else:
        losses = score_windows(model, seqs, args.window, args.batch_size, parts=parts)
    result = summarize(losses, args.bin)
    result.update(model=os.path.abspath(args.model), data=source, split=args.split, mode=args.mode,
                  window=args.window, chunk=args.chunk, sequences_from=args.sequences, length=args.length,
                  dtype=str(next(model.parameters()).dtype).removeprefix("torch."), device=str(device))
    os.makedirs(args.out, exist_ok=True)
    write_json(os.path.join(args.out, "ppl.json"), result)
    plot_curve([result] + others, os.path.join(args.out, "ppl.png"), args.train_length)
    shutil.rmtree(parts)
    if args.record is not None:
        _record(args, result, device)
    return result


def _record(args, result: dict, device: str) -> None:
    b = result["binned"]
    rows = [{"start": lo, "end": hi, "loss": v, "ppl": math.exp(v), "tokens": n}
            for lo, hi, v, n in zip(b["start"], b["end"], b["loss"], b["count"]) if v is not None]
    path = write_record(args, "eval_ppl", rows, os.path.join(args.out, "ppl.png"), device,
                        train_length=args.train_length, **{k: result[k] for k in (
                            "loss", "ppl", "sequences", "tokens", "mode", "sequences_from", "length", "chunk",
                            "window", "dtype")})
    print(f"wrote record {path}")


def _parts_dir(args, model) -> str:
    """OUT/ppl.parts: each finished batch's losses, so an interrupted run resumes; refused if written with other
    settings or other weights (their checksum, wherever the model lies)."""
    settings = {k: v for k, v in sorted(vars(args).items()) if k in (
        "data", "split", "tokenizer", "sample_by", "sequences", "length", "mode", "window", "chunk", "batch_size",
        "max_sequences")}
    settings.update(weights=fingerprint(args.model), dtype=str(next(model.parameters()).dtype))
    settings = json.loads(json.dumps(settings))
    parts = os.path.join(args.out, "ppl.parts")
    path = os.path.join(parts, "settings.json")
    if os.path.isfile(path):
        with open(path) as f:
            if json.load(f) != settings:
                raise EvalError(f"--out: {parts} holds a run with other settings; remove it or choose another --out")
    else:
        os.makedirs(parts, exist_ok=True)
        write_json(path, settings)
    return parts


def _read_result(path: str) -> dict:
    try:
        with open(path) as f:
            res = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise EvalError(f"--compare: cannot read {path!r} ({e})") from e
    if "binned" not in res or "model" not in res:
        raise EvalError(f"--compare: {path!r} is not a ppl.json written by `hgrn2 eval ppl`")
    return res


def _check_args(args) -> None:
    for name in ("length", "window", "chunk", "batch_size", "max_sequences", "bin", "train_length"):
        v = getattr(args, name)
        if v is not None and v < 1:
            raise EvalError(f"--{name.replace('_', '-')}: expected >= 1, got {v}")
    if args.sequences == "stream" and args.length is None:
        raise EvalError("--length: required with --sequences stream")
    if args.mode == "windows" and args.window is None:
        raise EvalError("--window: required with --mode windows")
    if args.window is not None and args.window < 2:
        raise EvalError(f"--window: expected >= 2 (a window's first token is not predicted), got {args.window}")
    if args.length is not None and args.length < 2:
        raise EvalError(f"--length: expected >= 2 (one context and one predicted token), got {args.length}")


# ----------------------------------------------------------------------------------------------------------------
# data


def read_documents(data: list[str], split: str, tokenizer: str, sample_by: str) -> tuple[list[np.ndarray], str]:
    """Token documents from a prepared directory (split at eos, each keeping its eos) or from raw text files."""
    if len(data) == 1 and os.path.isdir(data[0]):
        return _prepared_documents(data[0], split), f"{os.path.abspath(data[0])}:{split}"
    for f in data:
        if not os.path.isfile(f):
            raise EvalError(f"DATA: {f!r} is neither a prepared directory (with meta.json) nor a text file")
        if not f.endswith(TEXT_SUFFIXES):
            raise EvalError(f"DATA: {f!r}: expected a text file ({', '.join(TEXT_SUFFIXES)}) or a prepared directory")
    tok = load_tokenizer(tokenizer)
    docs = []
    for f in data:
        with open(f, encoding="utf-8") as fh:
            text = fh.read()
        if not text.strip():
            raise EvalError(f"DATA: {f!r} is empty")
        docs += [np.asarray(tok(t)["input_ids"], dtype=np.int64) for t in _split_text(text, sample_by)]
    return docs, [os.path.abspath(f) for f in data]


def _split_text(text: str, sample_by: str) -> list[str]:
    if sample_by == "document":
        return [text]
    parts = text.split("\n\n") if sample_by == "paragraph" else text.splitlines()
    return [p for p in parts if p.strip()]


def _prepared_documents(path: str, split: str) -> list[np.ndarray]:
    from hgrn2.data.packed import read_meta

    try:
        meta = read_meta(path)
    except (ValueError, FileNotFoundError) as e:
        raise EvalError(str(e)) from None
    if split not in meta["splits"]:
        raise EvalError(f"--split: {split!r} is not in {path!r} (splits: {sorted(meta['splits'])})")
    tokens = read_split(path, split)  # the single file or the shards of `hgrn2 data prepare`
    if tokens.size == 0:
        raise EvalError(f"DATA: split {split!r} of {path!r} is empty")
    eos = meta.get("eos_id")
    if eos is None:
        return [np.asarray(tokens, dtype=np.int64)]
    bounds = np.unique(np.concatenate([[0], np.flatnonzero(tokens == eos) + 1, [tokens.size]]))
    return [np.asarray(tokens[a:b], dtype=np.int64) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def make_sequences(docs: list[np.ndarray], how: str, length: int | None) -> list[np.ndarray]:
    """The sequences to score (two or more tokens each): documents, or the stream cut into `length` pieces."""
    if how == "stream":
        stream = np.concatenate(docs)
        pieces = [stream[i:i + length] for i in range(0, stream.size, length)]
    elif length is not None:
        pieces = [d[i:i + length] for d in docs for i in range(0, d.size, length)]
    else:
        pieces = docs
    return [p for p in pieces if p.size >= 2]


# ----------------------------------------------------------------------------------------------------------------
# scoring


@torch.no_grad()
def score_carried(model, seqs: list[np.ndarray], chunk: int, batch_size: int, desc: str = "ppl",
                  parts: str | None = None) -> list[np.ndarray]:
    """Next-token losses (nats, float64, length n−1 per sequence), one pass per sequence carrying the cache across
    `chunk`-token forwards. Batches hold sequences of similar length, right-padded (padding only follows the real
    tokens, so no real position sees it). With `parts`, each batch's losses are saved there and reused."""
    from tqdm.auto import tqdm

    device = next(model.parameters()).device
    order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i]))
    out: list[np.ndarray] = [np.empty(0)] * len(seqs)
    bar = tqdm(total=sum(len(s) - 1 for s in seqs), unit="tok", desc=desc, dynamic_ncols=True)
    for b in range(0, len(order), batch_size):
        idx = order[b:b + batch_size]
        saved = os.path.join(parts, f"{desc}-{b // batch_size:07d}.npy") if parts else None
        if saved and os.path.isfile(saved):
            loss = np.load(saved)
            for r, i in enumerate(idx):
                out[i] = loss[r, : len(seqs[i]) - 1]
            bar.update(sum(len(seqs[i]) - 1 for i in idx))
            continue
        n = max(len(seqs[i]) for i in idx)
        x = torch.zeros((len(idx), n), dtype=torch.long)
        for r, i in enumerate(idx):
            x[r, : len(seqs[i])] = torch.from_numpy(seqs[i])
        x = x.to(device)
        losses, cache = [], None
        for s in range(0, n - 1, chunk):
            e = min(s + chunk, n - 1)
            logits, cache = forward(model, x[:, s:e], cache)
            losses.append(F.cross_entropy(logits.float().transpose(1, 2), x[:, s + 1:e + 1], reduction="none"))
            bar.update(sum(max(0, min(e, len(seqs[i]) - 1) - s) for i in idx))
        loss = torch.cat(losses, 1).double().cpu().numpy()
        if saved:
            with open(saved + ".tmp", "wb") as f:
                np.save(f, loss)
            os.replace(saved + ".tmp", saved)
        for r, i in enumerate(idx):
            out[i] = loss[r, : len(seqs[i]) - 1]
    bar.close()
    return out


def score_windows(model, seqs: list[np.ndarray], window: int, batch_size: int,
                  parts: str | None = None) -> list[np.ndarray]:
    """Next-token losses per sequence with the state reset every `window` tokens; NaN where a window starts."""
    pieces = [(j, s) for j, seq in enumerate(seqs) for s in range(0, len(seq), window)]
    scored = score_carried(model, [seqs[j][s:s + window] for j, s in pieces if len(seqs[j][s:s + window]) >= 2],
                           window, batch_size, parts=parts)
    out = [np.full(len(seq) - 1, np.nan) for seq in seqs]
    k = 0
    for j, s in pieces:
        if len(seqs[j][s:s + window]) >= 2:
            out[j][s:s + len(scored[k])] = scored[k]
            k += 1
    return out


def summarize(losses: list[np.ndarray], bin_width: int | None = None) -> dict:
    """Totals (token-weighted mean loss, its exp) and the loss at each position averaged over sequences."""
    n = max(len(x) for x in losses)
    total = np.zeros(n)
    count = np.zeros(n, dtype=np.int64)
    for x in losses:
        ok = ~np.isnan(x)
        total[: len(x)][ok] += x[ok]
        count[: len(x)][ok] += 1
    mean = np.where(count > 0, total / np.maximum(count, 1), np.nan)
    loss = float(total.sum() / count.sum())
    width = bin_width or max(1, math.ceil(n / 200))
    starts = list(range(0, n, width))
    binned = {"start": [s + 1 for s in starts], "end": [min(s + width, n) for s in starts],
              "loss": [_ratio(total[s:s + width].sum(), count[s:s + width].sum()) for s in starts],
              "count": [int(count[s:s + width].sum()) for s in starts]}
    return {"sequences": len(losses), "tokens": int(count.sum()), "loss": loss, "ppl": math.exp(loss),
            "curve": {"position": list(range(1, n + 1)), "loss": [None if np.isnan(v) else float(v) for v in mean],
                      "count": count.tolist()},
            "binned": binned}


def _ratio(a: float, b: int) -> float | None:
    return float(a / b) if b else None


def _is_pow2_bin(lo: int, hi: int) -> bool:
    return any(lo <= 2**k <= hi for k in range(40))


def plot_curve(results: list[dict], path: str, train_length: int | None = None) -> None:
    """Loss against position (binned), one line per result, with the training length marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for res in results:
        b = res["binned"]
        xs = [(lo + hi) / 2 for lo, hi, v in zip(b["start"], b["end"], b["loss"]) if v is not None]
        ax.plot(xs, [v for v in b["loss"] if v is not None],
                label=f"{model_label(res['model'])} ({res['mode']}, ppl {res['ppl']:.2f})")
    if train_length:
        ax.axvline(train_length, color="gray", linestyle="--", label=f"training length {train_length}")
    ax.set_xlabel("position (tokens)")
    ax.set_ylabel("next-token loss (nats)")
    ax.set_title(f"per-position loss over {results[0]['sequences']} sequences")
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3)
    save_figure(fig, path)
    plt.close(fig)
