"""`hgrn2 bench report`: BENCHMARKS.md rendered from the result JSONs under benchmarks/results/<device>/.

Updating a number is: rerun its command (it writes its JSON), copy the JSON into benchmarks/results/<device>/, then
`hgrn2 bench report` (writes BENCHMARKS.md; `--check` only compares). A test checks that BENCHMARKS.md is this
rendering of the committed JSONs, so the two cannot drift apart.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path

from hgrn2.bench.common import REQUIRED_KEYS, RESULTS_DIR, format_table

HEADER = """# Benchmarks

Current numbers only, one section per benchmark; git keeps the history. Each table comes from
`benchmarks/results/<device>/<benchmark>.json`, written by the command named above it, and this file is rendered
from those files by `hgrn2 bench report` (do not edit it by hand). To update a number: rerun the command on the
device, copy its JSON into `benchmarks/results/<device>/`, run `hgrn2 bench report`. Ratios compare runs made side
by side in one process on one device; "ours" is hgrn2, "fla" is flash-linear-attention.
"""

# benchmark file stem -> (section title, what it measures), in the order of the file
SECTIONS = {
    "ops": ("Ops: the recurrence and the glue kernels",
            "bf16, H 16, head 128, B·T = 16K tokens from the raw projections (ours: `hgrn2.ops.hgrn2`, Triton; fla: "
            "its HGRN2Attention glue + `chunk_gla`; SDPA: causal FlashAttention at the same B, T, H, D). Glue rows: "
            "RMSNorm, fused residual add + RMSNorm, SwiGLU + down projection, linear + cross entropy, HGRN1's scan. "
            "The floor is max(bytes / copy bandwidth, FLOPs / bf16 matmul rate), both measured in the same run. "
            "err: relative L2 of ours against fla (output)."),
    "decode": ("Decode: one token from a state",
               "The decode rows of `hgrn2 bench ops`: bf16, H 16, head 128; ours as the Triton decode kernel and as "
               "the public op, fla's `fused_recurrent_gla` with its glue; inputs rotate through enough copies that "
               "each call reads from outside L2."),
    "layer": ("Layer: HGRU2 with its projections against fla's HGRN2Attention",
              "Forward+backward of the token mixer with its projections, same width and head size, bf16."),
    "train": ("Training throughput",
              "~374M-parameter causal LMs of the same width, depth and MLP (d 1024, 24 layers, SwiGLU 2816, vocab "
              "32000): ours, fla's HGRN2ForCausalLM and transformers' Llama with SDPA; forward + backward + fused "
              "AdamW under bf16 autocast on random tokens; tokens/s is the median of interleaved rounds."),
    "mqar": ("MQAR (multi-query associative recall)",
             "`hgrn2 mqar`, the `quick` preset on a GPU and the `laptop` preset on a CPU: test accuracy (final), the "
             "best learning rate per mixer and width."),
    "accuracy": ("Accuracy against the fp64 reference",
                 "Relative L2 error of the output, the final state and every gradient against the fp64 step-by-step "
                 "reference, random cotangents."),
    "ddp": ("Multi-GPU: DDP and FSDP2 against one GPU",
            "The hgrn2-0.15b preset in bf16, 32 × 2048 tokens per optimiser step on a synthetic corpus: one GPU with "
            "gradient accumulation against `torchrun` with DDP and with FSDP2; tokens/s is the median of each run's "
            "second half, the loss difference the largest relative one over all steps."),
    "convert_fla": ("fla checkpoint conversion parity",
                    "fla's HGRN2ForCausalLM with random weights (bounds and norms randomised too), converted by "
                    "`hgrn2 convert-fla`: logits of both against the fp64 reference and each other (relative L2), "
                    "argmax agreement over the prompt, and whether 32 greedy tokens agree."),
    "eval_ppl": ("Evaluation: loss by position past the training length",
                 "`hgrn2 eval ppl --record`: the next-token loss at each position of held-out text, averaged over "
                 "the sequences and binned, the recurrent state carried through each whole sequence; the model "
                 "was trained on shorter sequences (training length and recipe in the note; "
                 "`benchmarks/eval_length_needle.sh` runs corpus, tokenizer, training and both evaluations). A "
                 "recurrent model that extrapolates keeps the loss flat or falling past the training length."),
    "eval_needle": ("Evaluation: needle in a haystack",
                    "`hgrn2 eval needle --record`: a fact hidden at a depth of a haystack of held-out text, the "
                    "question asked at the end, the greedy reply scored by exact match and ROUGE-L F1; cells are "
                    "depth (rows) × context length in tokens (columns), the mean over trials."),
    "memory": ("Activation memory of a training step",
               "Bytes autograd keeps for the backward, activations [B, T, ...] only, per hidden element and layer."),
}

SOURCES = {"decode": "ops"}  # sections rendered from another benchmark's record
OPS_SEQ = [("shape", "shape", ""), ("mode", "mode", ""), ("ours ms", "ours_ms", ".4f"), ("fla ms", "fla_ms", ".4f"),
           ("SDPA ms", "sdpa_ms", ".4f"), ("ours / fla", "vs_fla", ".3f"), ("ours / SDPA", "vs_sdpa", ".3f"),
           ("floor ms", "floor_ms", ".4f"), ("ours / floor", "vs_floor", ".1f"), ("err", "err_vs_fla_y", ".2e")]
OPS_DECODE = [("shape", "shape", ""), ("ours kernel ms", "ours_ms", ".4f"), ("ours op ms", "ours_api_ms", ".4f"),
              ("fla ms", "fla_ms", ".4f"), ("ours / fla", "vs_fla", ".3f"), ("floor ms", "floor_ms", ".4f"),
              ("err", "err_vs_fla_y", ".2e")]
OPS_GLUE = [("kind", "kind", ""), ("shape", "shape", ""), ("ours ms", "ours_ms", ".4f"), ("fla ms", "fla_ms", ".4f"),
            ("ours / fla", "vs_fla", ".3f"), ("floor ms", "floor_ms", ".4f"), ("note", "note", "")]


def _ratio(a, b):
    return None if a is None or not b else a / b


def _ops_rows(rec: dict) -> list[dict]:
    return [dict(r, vs_fla=_ratio(r.get("ours_ms") or r.get("ours_api_ms"), r.get("fla_ms")),
                 vs_sdpa=_ratio(r.get("ours_ms"), r.get("sdpa_ms")),
                 vs_floor=_ratio(r.get("ours_ms"), r.get("floor_ms")))
            for r in rec["rows"] if "ours_ms" in r or "ours_api_ms" in r]


def ops_tables(rec: dict) -> str:
    rows = [r for r in _ops_rows(rec) if r["kind"] != "decode"]
    seq = sorted((r for r in rows if r["kind"] == "seq"), key=lambda r: (r["T"], r["mode"]))
    parts = [format_table(seq, OPS_SEQ), format_table([r for r in rows if r["kind"] != "seq"], OPS_GLUE)]
    return "\n\n".join(p for p in parts if p.count("\n") > 1)


def decode_table(rec: dict) -> str:
    return format_table([r for r in _ops_rows(rec) if r["kind"] == "decode"], OPS_DECODE)


def train_table(rec: dict) -> str:
    ok = [r for r in rec["rows"] if r.get("status") == "ok"]
    ours = {(r["batch"], r["seq_len"]): r for r in ok if r["model"] == "hgrn2"}
    rows = []
    for r in ok:
        o = ours.get((r["batch"], r["seq_len"]))
        rows.append(dict(r, shape=f"{r['batch']}×{r['seq_len']}", params_m=r["params"] / 1e6,
                         spread=f"{min(r['tok_per_s_rounds']):.0f}–{max(r['tok_per_s_rounds']):.0f}",
                         ours_over=_ratio(o and o["tok_per_s"], r["tok_per_s"]),
                         mem_over=_ratio(o and o["peak_gib"], r["peak_gib"])))
    return format_table(rows, [("model", "model", ""), ("shape", "shape", ""), ("params M", "params_m", ".1f"),
                               ("tokens/s", "tok_per_s", ".0f"), ("rounds' range", "spread", ""),
                               ("ms/step", "step_ms", ".1f"), ("peak GiB", "peak_gib", ".1f"),
                               ("ours tokens/s ÷ this", "ours_over", ".2f"), ("ours peak ÷ this", "mem_over", ".2f")])


def mqar_table(rec: dict) -> str:
    best: dict = {}
    for r in rec["rows"]:
        key = (r["mixer"], r["d_model"], r["seq_len"])
        if key not in best or r["final_accuracy"] > best[key]["final_accuracy"]:
            best[key] = r
    rows = sorted(best.values(), key=lambda r: (r["mixer"], r["d_model"], r["seq_len"]))
    table = format_table(rows, [("mixer", "mixer", ""), ("d", "d_model", "d"), ("L", "seq_len", "d"),
                                ("kv pairs", "kv_pairs", "d"), ("best lr", "lr", "g"),
                                ("test accuracy", "final_accuracy", ".3f"), ("epochs", "epochs_run", "d"),
                                ("commit", "commit", "")])
    foot = f"{len(rec['rows'])} runs (learning rates {sorted({r['lr'] for r in rec['rows']})})"
    if rec.get("wall_seconds") is not None:
        threads = f" on {rec['threads']} CPU threads" if rec.get("threads") else ""
        foot += f"; the whole command took {rec['wall_seconds']:.0f} s{threads}"
    return f"{table}\n\n{foot}."


def accuracy_table(rec: dict) -> str:
    names = ("y", "final", "do", "dg", "di", "dbeta", "dh0")
    cols = [("impl", "impl", ""), ("dtype", "dtype", ""), ("case", "case", "")] + [(n, n, ".1e") for n in names]
    if any("commit" in r for r in rec["rows"]):
        cols.append(("commit", "commit", ""))
    return format_table(rec["rows"], cols)


def ddp_table(rec: dict) -> str:
    return format_table(rec["rows"], [("run", "run", ""), ("tokens/s", "tok_per_s", ".0f"),
                                      ("× 1 GPU", "speedup_vs_1gpu", ".2f"), ("final val loss", "val_loss", ".6f"),
                                      ("max rel. loss diff", "max_rel_loss_diff_vs_1gpu", ".1e")])


def convert_table(rec: dict) -> str:
    return format_table(rec["rows"], [("dtype", "dtype", ""), ("fla vs fp64", "fla_vs_fp64", ".2e"),
                                      ("ours vs fp64", "ours_vs_fp64", ".2e"), ("ours vs fla", "ours_vs_fla", ".2e"),
                                      ("argmax ours = fla", "argmax_ours_fla", ".4f"),
                                      ("greedy equal", "greedy_equal", "")])


def eval_ppl_table(rec: dict) -> str:
    rows = [dict(r, positions=f"{r['start']}–{r['end']}") for r in rec["rows"]]
    table = format_table(rows, [("positions", "positions", ""), ("loss", "loss", ".4f"), ("ppl", "ppl", ".2f"),
                                ("tokens", "tokens", "d")])
    return (f"{rec['sequences']} sequences ({rec['sequences_from']}, {rec['length'] or 'whole'} tokens each), "
            f"{rec['mode']} state, training length {rec['train_length']}: loss {rec['loss']:.4f}, ppl "
            f"{rec['ppl']:.2f}.\n\n{table}")


def eval_needle_table(rec: dict) -> str:
    cells: dict = {}
    for r in rec["rows"]:
        cells.setdefault((r["depth"], r["length"]), []).append(r)
    lengths = sorted({n for _, n in cells})
    rows = []
    for depth in sorted({d for d, _ in cells}):
        row = {"depth": f"{depth:.0f}%"}
        for n in lengths:
            got = cells.get((depth, n), [])
            row[n] = (f"{sum(c['exact'] for c in got) / len(got):.2f} / {sum(c['rougeL'] for c in got) / len(got):.2f}"
                      if got else None)
        rows.append(row)
    table = format_table(rows, [("depth", "depth", "")] + [(f"{n} tokens", n, "") for n in lengths])
    replies = sorted({r["reply"].strip().replace("`", "'") for r in rec["rows"]})
    sample = "; ".join(f"`{t if len(t) <= 60 else t[:60] + '…'}`" for t in replies[:3])
    return (f"{rec['mode']} mode, cells exact / ROUGE-L; expected e.g. `{rec['rows'][0]['answer'].strip()}`; "
            f"{len(replies)} distinct replies, e.g. {sample}.\n\n{table}")


def generic_table(rec: dict) -> str:
    keys = [k for k, v in rec["rows"][0].items() if isinstance(v, (str, int, float, bool))] if rec["rows"] else []
    return format_table(rec["rows"], [(k, k, ".4g" if isinstance(rec["rows"][0][k], float) else "") for k in keys])


TABLES = {"ops": ops_tables, "decode": decode_table, "layer": lambda rec: format_table(rec["rows"], [
    ("layer", "layer", ""), ("shape", "shape", ""), ("fwd+bwd ms", "ms", ".4f"), ("÷ fla", "vs_fla", ".3f")]),
    "train": train_table, "mqar": mqar_table, "accuracy": accuracy_table, "ddp": ddp_table,
    "convert_fla": convert_table, "eval_ppl": eval_ppl_table, "eval_needle": eval_needle_table}


def load(results: Path) -> dict[str, list[tuple[Path, dict]]]:
    """{benchmark: [(path, record), ...]} of every JSON under `results` but --quick runs, devices in name order."""
    out: dict[str, list[tuple[Path, dict]]] = {}
    for path in sorted(results.glob("*/*.json")):
        rec = json.loads(path.read_text())
        missing = [k for k in REQUIRED_KEYS if k not in rec]
        if missing:
            raise ValueError(f"{path}: missing keys {missing}")
        if rec.get("quick"):
            continue  # a smoke run, not a measurement
        out.setdefault(rec["benchmark"], []).append((path, rec))
    return out


def render(results: Path = RESULTS_DIR) -> str:
    records = load(results)
    parts = [HEADER.strip()]
    for name in [*SECTIONS, *sorted(set(records) - set(SECTIONS))]:
        source = SOURCES.get(name, name)
        if source not in records:
            continue
        title, what = SECTIONS.get(name, (name, ""))
        parts.append(f"## {title}\n\n{textwrap.fill(what, 116)}".rstrip())
        for path, rec in records[source]:
            versions = ", ".join(f"{k} {v}" for k, v in rec["versions"].items() if v and k != "python")
            note = f" ({rec['note']})" if rec.get("note") else ""
            parts.append(f"**{rec['device']}** — `{rec['command']}`{note} — {versions} — commit {rec['commit']}, "
                         f"{rec['date']} — [{path.parent.name}/{path.name}]({path.as_posix()})")
            parts.append(TABLES.get(name, generic_table)(rec))
            figure = rec.get("figure")
            if figure:
                parts.append(f"![{title}, {rec['device']}]({(path.parent / figure).as_posix()})")
    return "\n\n".join(parts) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--results", default=str(RESULTS_DIR), help="the folder of <device>/<benchmark>.json")
    parser.add_argument("--output", default="BENCHMARKS.md")
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 if --output differs")


def run(args: argparse.Namespace) -> int:
    text = render(Path(args.results))
    out = Path(args.output)
    if args.check:
        same = out.exists() and out.read_text() == text
        print(f"{out}: {'up to date' if same else 'differs from the rendering of ' + args.results}", file=sys.stderr)
        return 0 if same else 1
    out.write_text(text)
    print(f"wrote {out}")
    return 0
