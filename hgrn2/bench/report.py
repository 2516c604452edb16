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

from hgrn2.bench.common import (
    LRA_SEED,
    REQUIRED_KEYS,
    RESULTS_DIR,
    VISION_CURVE_COLUMNS,
    best_val_reading,
    format_table,
    lra_run_label,
    seeds_cell,
)

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
            "Each time is the median of three rounds, ours, fla and SDPA interleaved in each (records from before "
            "2026-11-29: one round). \"ours in a graph\": the forward replayed from a CUDA graph, the GPU's time "
            "without the host's launches. "
            "The floor is max(bytes / copy bandwidth, FLOPs / bf16 matmul rate), both measured in the same run. "
            "err: relative L2 of ours against fla (output)."),
    "decode": ("Decode: one token from a state",
               "The decode rows of `hgrn2 bench ops`: bf16, H 16, head 128; ours as the Triton decode kernel "
               "replayed from a CUDA graph, as the CUDA-graph decode runs it (older records: called eagerly, \"ours "
               "kernel ms\"), and as the public op called eagerly; fla's `fused_recurrent_gla` with its glue, "
               "eagerly; inputs rotate through enough copies that each call reads from outside L2. An eager call "
               "of one short kernel takes the host's launch time, not the GPU's."),
    "layer": ("Layer: HGRU2 with its projections against fla's HGRN2Attention",
              "Forward+backward of the token mixer with its projections, same width and head size, bf16."),
    "train": ("Training throughput",
              "~374M-parameter causal LMs of the same width, depth and MLP (d 1024, 24 layers, SwiGLU 2816, vocab "
              "32000): ours, fla's HGRN2ForCausalLM and transformers' Llama with SDPA; forward + backward + fused "
              "AdamW under bf16 autocast on random tokens; tokens/s is the median of interleaved rounds. hgrn2+graph: "
              "each step replayed as one CUDA graph (the trainer's default on one GPU), which is \"ours\" in the "
              "ratios where it was measured."),
    "mqar": ("MQAR (multi-query associative recall)",
             "`hgrn2 mqar`, the `quick` preset on a GPU and the `laptop` preset on a CPU: test accuracy (final), the "
             "best learning rate per mixer and width."),
    "ablate": ("Ablations", "`hgrn2 ablate RECIPE --scale SCALE --report --record`: one section per recipe and scale."),
    "lra": ("Long Range Arena",
            "`hgrn2 lra --report --record` over the runs of `hgrn2 lra TASK...` (the authors' per-task presets): "
            "test accuracy (%) at the epoch of the best validation accuracy, as LRA reports, beside the HGRN2 paper's "
            "table; with several seeds (`--seed A B ...`), their mean ± sample standard deviation (count) over the "
            "runs equally far along (the finished ones if any); * marks a cell of runs that have not finished their "
            "epochs, [k of n seeds] one that leaves the others out. \"hgrn2, hgrn1's settings\" is HGRN2 trained "
            "with HGRN1's presets, as the paper describes its LRA runs (`--settings-of hgrn1`); plain \"hgrn2\" "
            "uses the presets of HGRN2's own launch script. The curves are validation accuracy per epoch and against "
            "GPU-minutes (each epoch's wall time times the run's GPUs; a GPU that several runs shared counts whole "
            "for each). ListOps' validation and test splits hold 2,000 examples each (LRA's 96K/2K/2K): an accuracy "
            "near 58% read on one of them estimates the task's with a binomial standard error of 1.1 points, and the "
            "paper's was read on another draw of 2,000 (LRA's released split): even for one model, the difference of "
            "the two readings has a standard error of 1.6 points. The LRA code scores the test split every epoch and "
            "the paper does not say which reading it reports: the run table also gives the last epoch's (last test) "
            "and the largest over the epochs (best test), which picks on the test split and so reads high. Pathfinder "
            "reads generated images (`hgrn2.data.lra.pathfinder`, LRA's 32-px parameters, hard level, 160K/20K/20K): "
            "near 90% a split of 20,000 has a standard error of 0.2 points. There a single epoch's validation and test "
            "accuracy can fall near chance while the training accuracy holds; the best-validation reading passes "
            "over such epochs."),
    "vision": ("Image classification: training throughput against DeiT-Tiny",
               "`hgrn2 bench vision`: forward + backward + AdamW on random 224×224 images under bf16 autocast, the "
               "DeiT-Tiny-sized HGRN2 (`hgrn2.models.vision` preset `deit_tiny`, bidirectional scans on the Triton "
               "kernels; `hgrn2-graph`: each step replayed as one CUDA graph, as `cuda_graph=true` trains) against "
               "timm's `deit_tiny_patch16_224`; images/s is the median of interleaved rounds, data loading excluded; "
               "peak memory is each model's own (weights, optimiser state, activations)."),
    "generate": ("Generation: prefill and decode",
                 "`hgrn2 bench generate`: greedy decoding with random bf16 weights after a prompt; ours (`hgrn2`: "
                 "transformers' `generate` with the dynamic cache; `hgrn2-static`: fixed state buffers, the decode "
                 "step replayed from a CUDA graph), fla's HGRN2 (a hand-written greedy loop) and transformers' Llama "
                 "(SDPA; `llama-static`: the static cache) at the same width, depth and MLP. ms/step is one decode "
                 "step inside `generate`, forward ms our one-token forward alone; the floor is reading every weight "
                 "once at the copy bandwidth measured in the same run."),
    "train_parity": ("Training parity: ours and fla's HGRN2 from the same weights",
                     "`hgrn2 bench train-parity`: both models start from fla's initialisation and train on the same "
                     "batches of real text (AdamW, bf16 autocast, clipping 1.0); ours steps as `hgrn2 train` does by "
                     "default on one GPU. The largest relative difference between the two loss curves, and the "
                     "curves."),
    "small_heads": ("LRA's small heads: the fused scan against HGRN1's scan on the expanded state",
                    "`benchmarks/gpu_small_heads.py`: HGRN2 with heads of K = V = 4 (the ListOps preset's mixer) at "
                    "B × T × H × K of `shape`, bf16, learnable bound, sigmoid output gate, both directions summed "
                    "(\"both\") or the forward scan alone; `old` expands the state to [B, T, H·V·K] for HGRN1's "
                    "element-wise scan, `fused` is `hgrn2_small_heads` (BLOCK_HEADS:CHUNK:WARPS, 0: its default). "
                    "max rel. diff against the old path over y and every gradient."),
    "prepare_scaling": ("Corpus preparation: tokens/s against worker processes",
                        "`hgrn2 bench prepare`: `hgrn2 data prepare` of a corpus of JSON lines assembled offline "
                        "(reordered copies of CPython's help topics) with a trained byte-level BPE, at each number of "
                        "worker processes; speed-up over one worker, efficiency = speed-up / workers. Every run "
                        "writes the same index, byte for byte."),
    "lra_share": ("LRA: training runs sharing one GPU",
                  "`hgrn2 bench lra-share`: the preset's training step (forward, backward, AdamW) on random inputs of "
                  "the task's shape, in one process alone, in several started together (as `hgrn2 lra --concurrent` "
                  "trains them), and in as many under NVIDIA MPS; steps/s of each process over the steps all of "
                  "them time at once, their sum, and that sum against the process alone."),
    "accuracy": ("Accuracy against the fp64 reference",
                 "Relative L2 error of the output, the final state and every gradient against the fp64 step-by-step "
                 "reference, random cotangents."),
    "ddp": ("Multi-GPU: DDP and FSDP2 against one GPU",
            "The hgrn2-0.15b preset in bf16, 32 × 2048 tokens per optimiser step on a synthetic corpus: one GPU with "
            "gradient accumulation against `torchrun` with DDP and with FSDP2; tokens/s is the median of each run's "
            "second half, the loss difference the largest relative one over all steps."),
    "fsdp_variants": ("Multi-GPU: FSDP2 options and checkpoints at the 1B preset",
                      "`benchmarks/gpu_ddp.py --fsdp-variants`: the hgrn2-1b preset in bf16 autocast on the same "
                      "global batches of a synthetic source, one GPU without wrapping (its record is the baseline) "
                      "against each FSDP2 option set and DDP under torchrun; tokens/s over each run's second half. "
                      "With --profile, two more steps per run under the profiler on rank 0, per step: the GPU's "
                      "span, the time no kernel runs (idle: the GPU waits on the host), the time only communication "
                      "kernels run and the optimiser's kernels. Checkpoints: model and AdamW state saved and loaded "
                      "the old way (full state dicts gathered to rank 0, torch.save) against the sharded one "
                      "(torch.distributed.checkpoint)."),
    "engine_speed": ("Training engine: each task's step against the loops it replaced",
                     "`benchmarks/engine_speed.py`: each task's own command from an older tree (the base: an exported "
                     "`hgrn2/` of the commit before the training engine) and from this one, in one call on one GPU, "
                     "the runs of a round one after the other: the language model's tokens/s (hgrn2-0.15b, 16 × 2048 "
                     "tokens per step, synthetic corpus), LRA ListOps' and image training's (fashion_mnist preset, "
                     "batch 128) steps/s, read from each run's log over its second half without evaluations; the "
                     "median over rounds. Rows: the eager step, and the CUDA-graph step (ListOps on batches padded "
                     "to the whole length, and images, against the base's eager step, since their loops had none)."),
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
    "gate": ("Speed gate: the working tree against main",
             "`hgrn2 bench gate`: the recurrence of the working tree and of a base tree (the landed main, exported "
             "with `git archive main hgrn2` into the folder `--base-dir` names) side by side in one process on one "
             "GPU, bf16 (a row named fp32: fp32 inputs), H 16, head 128, β learnable (U[0.01, 0.9); the small-β rows "
             "U[0, 0.9) with channels at 0, 1e-6 and 2^-9, which the fast-forgetting rows also give gates lowered "
             "by 2; the closed-gates row puts a quarter of the heads at β 0 with gates lowered by 6 more, most of "
             "them below 2^-8; the fused-chunk rows' β and the fixed-bound row's take no gradient); each time the "
             "median over interleaved rounds; max rel. diff: the trees' outputs and gradients against each other. A "
             "row more than the tolerance slower than the base fails the gate."),
    "tests": ("Tests on the GPU",
              "`hgrn2 bench tests PATHS`: pytest on the device, the Triton kernels compiled rather than interpreted, "
              "each test file's outcomes (xfailed: known gaps marked strict, so a fix shows as a failure to update "
              "the mark)."),
}

SOURCES = {"decode": "ops"}  # sections rendered from another benchmark's record
OPS_SEQ = [("shape", "shape", ""), ("mode", "mode", ""), ("ours ms", "ours_ms", ".4f"),
           ("ours in a graph ms", "ours_graph_ms", ".4f"), ("fla ms", "fla_ms", ".4f"),
           ("SDPA ms", "sdpa_ms", ".4f"), ("ours / fla", "vs_fla", ".3f"), ("ours / SDPA", "vs_sdpa", ".3f"),
           ("floor ms", "floor_ms", ".4f"), ("ours / floor", "vs_floor", ".1f"), ("err", "err_vs_fla_y", ".2e")]
OPS_DECODE = [("shape", "shape", ""), ("ours kernel in a graph ms", "ours_graph_ms", ".4f"),
              ("ours kernel ms", "ours_ms", ".4f"), ("ours op ms", "ours_api_ms", ".4f"),
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


def _present(rows: list[dict], columns: list[tuple]) -> list[tuple]:
    """The columns that some row fills (older records lack the graph-replay times)."""
    return [c for c in columns if any(r.get(c[1]) is not None for r in rows)]


def ops_tables(rec: dict) -> str:
    rows = [r for r in _ops_rows(rec) if r["kind"] != "decode"]
    seq = sorted((r for r in rows if r["kind"] == "seq"), key=lambda r: (r["T"], r["mode"]))
    glue = [r for r in rows if r["kind"] != "seq"]
    parts = [format_table(seq, _present(seq, OPS_SEQ)), format_table(glue, OPS_GLUE)]
    return "\n\n".join(p for p in parts if p.count("\n") > 1)


def decode_table(rec: dict) -> str:
    rows = [r for r in _ops_rows(rec) if r["kind"] == "decode"]
    return format_table(rows, _present(rows, OPS_DECODE))


def train_table(rec: dict) -> str:
    ok = [r for r in rec["rows"] if r.get("status") == "ok"]
    # ours: the trainer's default step, a CUDA graph on one GPU where that row was measured, else eager
    ours = {(r["batch"], r["seq_len"]): r for r in ok if r["model"] == "hgrn2"}
    ours.update({(r["batch"], r["seq_len"]): r for r in ok if r["model"] == "hgrn2+graph"})
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


def fsdp_table(rec: dict) -> str:
    head = (f"{rec['preset']}, {rec['world_size']} rank(s), {rec['batch']} × {rec['seq_len']} tokens per step "
            f"(micro-batch {rec['micro']}), {rec['steps']} steps.\n\n")
    profiled = any("idle_ms" in r for r in rec["rows"])  # --profile: where rank 0's step time goes
    runs = format_table(rec["rows"], [("run", "run", ""), ("tokens/s", "tok_per_s", ".0f"),
                                      ("× 1 GPU", "speedup_vs_1gpu", ".2f"), ("peak GiB", "peak_gib", ".1f"),
                                      ("max rel. loss diff", "max_rel_loss_diff_vs_1gpu", ".1e"),
                                      *([("GPU span ms", "span_ms", ".1f"), ("GPU idle ms", "idle_ms", ".1f"),
                                         ("exposed comm. ms", "exposed_comm_ms", ".1f"),
                                         ("optimiser ms", "optimizer_ms", ".1f")] if profiled else [])])
    if not rec.get("checkpoints"):  # a run with --no-checkpoint
        return f"{head}{runs}"
    saves = format_table(rec["checkpoints"], [("checkpoint", "checkpoint", ""), ("save s", "save_s", ".1f"),
                                              ("load s", "load_s", ".1f"), ("GiB", "gib", ".1f")])
    return f"{head}{runs}\n\n{saves}"


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


_PESE = ("lr", "lr-n8", "glt", "glti", "krp", "kp")
# each ablation recipe: the paper's claim, and its orderings as pairs (lower perplexity, higher perplexity)
ABLATIONS = {
    "expand": ("The paper's figure \"Expand Ratio (Head Dimension) Ablation\" (WikiText-103 and the Pile): perplexity "
               "falls as the expand ratio grows, the gains diminishing towards 128.",
               [(f"e{2 * k}", f"e{k}") for k in (1, 2, 4, 8, 16, 32, 64)]),
    "pese": ("The paper's table \"PESE Ablation\" (Pile, 385M): every expansion to n = 4 beats HGRN1, low rank (LR) "
             "is the best of them, and HGRN2 at head dimension 128 is lowest of all (the paper has no naive row).",
             [("hgrn2", v) for v in (*_PESE, "hgrn1")] + [(v, "hgrn1") for v in _PESE]
             + [("lr", v) for v in _PESE[2:]]),
    "hgrn1": ("The paper's tables \"Comparison of real HGRN and complex HGRN\" and \"Results on Wikitext-103\": real "
              "HGRN1 with state 2d (24.04) below complex HGRN1 (24.14) below real HGRN1 with state d (25.34), and "
              "HGRN2 (23.10) lowest.",
              [("hgrn2", "hgrn1-real-2d"), ("hgrn1-real-2d", "hgrn1-complex"), ("hgrn1-complex", "hgrn1-real")]),
    "lower-bound": ("HGRN's layer-wise lower bound on the forget gate (paper §2.2): perplexity is lower with it.",
                    [("bound-on", "bound-off")]),
}


def ablate_section(rec: dict) -> tuple[str, str]:
    claim = ABLATIONS.get(rec["recipe"], ("", []))[0]
    return (f"Ablation ({rec['scale']} scale): {rec['title']}",
            f"`hgrn2 ablate {rec['recipe']} --scale {rec['scale']}`, validation perplexity over the whole validation "
            f"split. {claim}")


def ablate_table(rec: dict) -> str:
    rows = [dict(r, params_m=r["parameters"] and r["parameters"] / 1e6, done="yes" if r["complete"] else "no")
            for r in rec["rows"]]
    table = format_table(rows, [("variant", "variant", ""), ("params M", "params_m", ".2f"),
                                ("val loss", "val_loss", ".4f"), ("perplexity", "val_ppl", ".2f"),
                                ("steps", "steps", ""), ("complete", "done", "")])
    t = rec["train"]
    setting = (f"{rec['data']}; {t['max_steps']} steps × {t['batch_size']} × {t['seq_len']} tokens, lr {t['lr']}, "
               f"{t['precision']}.")
    return f"{setting} {ablate_verdict(rec)}\n\n{table}"


def ablate_verdict(rec: dict) -> str:
    """How many of the paper's orderings the complete runs show, and which they do not."""
    ppl = {r["variant"]: r["val_ppl"] for r in rec["rows"] if r["complete"] and r["val_ppl"] is not None}
    missing = len(rec["rows"]) - len(ppl)
    tail = f" ({missing} of {len(rec['rows'])} runs incomplete, left out)" if missing else ""
    pairs = [(a, b) for a, b in ABLATIONS.get(rec["recipe"], ("", []))[1] if a in ppl and b in ppl]
    if not pairs:
        return f"No ordering of the paper to compare among the complete runs{tail}."
    broken = [f"{a} < {b} ({ppl[a]:.2f} vs {ppl[b]:.2f})" for a, b in pairs if not ppl[a] < ppl[b]]
    held = f"The paper's ordering holds here for {len(pairs) - len(broken)} of {len(pairs)} pairs"
    return held + (f"; not for {', '.join(broken)}" if broken else "") + f"{tail}."


LRA_NAMES = {"listops": "ListOps", "text": "Text", "retrieval": "Retrieval", "image": "Image",
             "pathfinder": "Pathfinder", "pathx": "Path-X", "fashion_mnist": "Fashion-MNIST"}


def lra_table(rec: dict) -> str:
    rows, paper = rec["rows"], rec["paper"]
    tasks = list(dict.fromkeys([*next(iter(paper.values())), *(r["task"] for r in rows)]))
    matrix = [{"model": label, **{t: f"{v:.2f}" for t, v in values.items()}} for label, values in paper.items()]
    runs: dict[str, dict[str, list[dict]]] = {}  # label → task → its seeds' rows
    for r in rows:
        runs.setdefault(_lra_label(r), {}).setdefault(r["task"], []).append(r)
    for run, tasks_of in runs.items():
        matrix.append({"model": f"{run} (here)", **{
            t: seeds_cell([(r["test_acc"], r["epochs_done"], r["epochs"]) for r in rs])
            for t, rs in tasks_of.items()}})
    table = format_table(matrix, [("model", "model", "")] + [(LRA_NAMES.get(t, t), t, "") for t in tasks])
    details = format_table([dict(r, model=_lra_label(r), test=_pct(r["test_acc"]), val=_pct(r["best_val_acc"]),
                                 last=_pct(r.get("test_acc_last")), best=_pct(r.get("test_acc_max")),
                                 seed=r.get("seed", LRA_SEED), epochs_str=f"{r['epochs_done']} / {r['epochs']}",
                                 commit=r.get("commit") or "–")
                            for r in rows],
                           [("task", "task", ""), ("model", "model", ""), ("seed", "seed", "d"),
                            ("params", "parameters", ",d"), ("test acc %", "test", ".2f"), ("best val %", "val", ".2f"),
                            ("last test %", "last", ".2f"), ("best test %", "best", ".2f"),
                            ("epochs", "epochs_str", ""), ("steps", "steps", "d"),
                            ("s / epoch", "time_per_epoch_s", ".1f"), ("GPUs", "world_size", "d"),
                            ("commit", "commit", "")])
    notes = {(r["task"], r["variant"]): _variant_note(r) for r in rows if r.get("variant")}
    if not notes:
        return f"{table}\n\n{details}"
    changes = format_table([{"task": t, "variant": v, "note": n} for (t, v), n in notes.items()],
                           [("task", "task", ""), ("variant", "variant", ""), ("what it changes", "note", "")])
    parts = [table, details, f"Each variant is one change against the task's preset:\n\n{changes}"]
    compared = _lra_controlled(rows)
    if compared:
        columns = [("task", "task", ""), ("model", "model", ""), ("change", "change", ""), ("epochs", "epochs", ""),
                   ("test acc %", "test", ".2f"), ("preset's %", "base", ".2f"), ("difference", "delta", "+.2f"),
                   ("best val %", "val", ".2f"), ("preset's best val %", "base_val", ".2f")]
        parts.append("Each change against the preset's run of the same seed, over the epochs both have trained (a "
                     "change of the epochs alone: each over its own): test accuracy at the best validation epoch "
                     "among them, and the difference in points:\n\n"
                     + format_table(compared, columns))
    return "\n\n".join(parts)


def _lra_controlled(rows: list[dict]) -> list[dict]:
    """Each run that changes something against its task's preset (a variant, or another model's settings) beside
    the preset's run of the same model and seed, both cut to the epochs both have (rows with per-epoch curves)."""
    def own(r):
        return r.get("settings", r["model"]) == r["model"] and not r.get("variant")

    def at(curve, k):  # (test, val) in %
        val, test = best_val_reading(curve, k)
        return 100 * test, 100 * val

    out = []
    for r in rows:
        base = next((b for b in rows if own(b) and b.get("curve") and (b["task"], b["model"], b.get("seed")) ==
                     (r["task"], r["model"], r.get("seed"))), None)
        if own(r) or not r.get("curve") or base is None:
            continue
        k = min(r["curve"][-1][0], base["curve"][-1][0])
        (test, val), (base_test, base_val) = at(r["curve"], k), at(base["curve"], k)
        if r.get("read_from_preset"):  # fewer epochs is the change: the preset's reading at its own end
            (base_test, base_val), k = at(base["curve"], base["curve"][-1][0]), f"{k} vs {base['curve'][-1][0]}"
        settings = r.get("settings", r["model"])
        change = r.get("variant") or f"{settings}'s settings"
        if r.get("variant") and settings != r["model"]:
            change = f"{settings}'s settings + {change}"
        out.append({"task": r["task"], "model": r["model"], "change": change, "epochs": k, "test": test,
                    "base": base_test, "delta": test - base_test, "val": val, "base_val": base_val})
    return out


def _variant_note(r: dict) -> str | None:
    if not r.get("read_from_preset"):
        return r.get("variant_note")
    return (f"{r.get('variant_note') or ''} (its row: the preset's run read at epoch {r['epochs_done']} of the "
            f"{r['read_from_preset']} it trained)").strip()


def _pct(x: float | None) -> float | None:
    return None if x is None else 100 * x


def _lra_label(r: dict) -> str:
    return lra_run_label(r["model"], r.get("settings", r["model"]), r.get("variant"))


def vision_table(rec: dict) -> str:
    rows = [dict(r, params_m=r.get("parameters") and r["parameters"] / 1e6,
                 spread=r.get("images_per_s_range") and "{:.0f}–{:.0f}".format(*r["images_per_s_range"]))
            for r in rec["rows"]]
    cols = [("model", "model", ""), ("params M", "params_m", ".2f"), ("images/s", "images_per_s", ".0f"),
            ("rounds' range", "spread", ""), ("÷ DeiT-Tiny", "ratio_to_deit", ".2f"), ("peak GiB", "peak_gib", ".2f"),
            ("skipped", "skipped", "")]
    table = format_table(rows, [c for c in cols if c[1] != "skipped" or any("skipped" in r for r in rows)])
    a = rec.get("args", {})
    return (f"Batch {a.get('batch_size')}, {a.get('image_size')}×{a.get('image_size')} images, {a.get('precision')}, "
            f"{a.get('rounds')} rounds of {a.get('steps')} steps.\n\n{table}")


def vision_run_section(rec: dict) -> tuple[str, str]:
    data = "Fashion-MNIST" if rec["config"]["dataset"] == "fashion_mnist" else "ImageFolder data"
    return (f"Image classification: {rec['model']} on {data}",
            "`hgrn2 vision train` (the authors' DeiT-style recipe; `hgrn2 vision report --record` records it): "
            "validation top-1 and top-5 (%) and the losses after each epoch, training images/s per epoch.")


def vision_run_table(rec: dict) -> str:
    c = rec["config"]
    table = format_table(rec["rows"], [col for col in VISION_CURVE_COLUMNS if any(col[1] in r for r in rec["rows"])])
    args = ", ".join(f"{k} {v}" for k, v in (c.get("model_args") or {}).items())
    return (f"{rec['model']} ({args}), {rec['parameters']:,} parameters; {rec['epochs_done']} of {rec['epochs']} "
            f"epochs, batch {c['batch_size']}, lr {c['lr']} (× batch / {c['lr_batch']}), "
            f"{c['precision'] if rec['device_slug'] != 'cpu' else 'fp32'}: top-1 "
            f"{rec['acc1']:.2f}% on {rec['val_images']:,} validation images (best {rec['best_acc1']:.2f}%)."
            f"\n\n{table}")


def generate_table(rec: dict) -> str:
    from hgrn2.bench.generate import TABLE, ratios

    rows = [dict(r, shape=f"{r['size']} B{r['batch']}") for r in rec["rows"]]
    for r in rows:
        if r.get("status") == "ok":
            r["floor_x"] = r["decode_ms_per_step"] / r["floor_ms"]
    a = rec.get("args", {})
    lines = "".join(f"\n- {line}" for line in ratios(rec["rows"]))
    return (f"Prompt {a.get('prompt')} tokens, {a.get('new')} new; copy bandwidth {rec['copy_gb_per_s']:.0f} GB/s."
            f"\n\n{format_table(rows, TABLE)}\n{lines}").rstrip()


# records named <key>_<...> rendered as a section each after SECTIONS[key]: (title and text, table)
FAMILIES = {"ablate": (ablate_section, ablate_table), "vision": (vision_run_section, vision_run_table)}
ABLATE_ORDER = list(ABLATIONS)


def _family(name: str) -> str | None:
    return next((k for k in FAMILIES if name.startswith(k + "_") and name not in SECTIONS), None)


def _order(records: dict) -> list[str]:
    """SECTIONS' order, each key followed by its family's records (ablations by scale, then recipe), then the rest
    in name order."""
    def key(name: str):
        rec = records[name][0][1]
        recipe = rec.get("recipe")
        return (rec.get("scale", ""), ABLATE_ORDER.index(recipe) if recipe in ABLATE_ORDER else len(ABLATE_ORDER),
                name)

    names = []
    for section in SECTIONS:
        names.append(section)
        names += sorted((n for n in records if _family(n) == section), key=key)
    return names + sorted(set(records) - set(names))


LRA_SHARE_COLUMNS = [("phase", "phase", ""), ("processes", "processes", "d"), ("steps/s each", "each", ""),
                     ("steps/s in all", "total", ".2f"), ("÷ alone", "vs_alone", ".2f")]
PREPARE_COLUMNS = [("workers", "workers", ""), ("seconds", "seconds", ".1f"), ("tokens", "tokens", ","),
                   ("tokens/s", "tokens_per_s", ",.0f"), ("speed-up", "speedup", ".2f"),
                   ("efficiency", "efficiency", ".2f")]


def tests_table(rec: dict) -> str:
    rows = [{**r, "failures": ", ".join(r["failures"]) or "-"} for r in rec["rows"]]
    t = rec["totals"]
    workers = f" ({rec['workers']} pytest processes)" if rec.get("workers", 1) > 1 else ""
    head = (f"pytest exit {rec['pytest_exit']}: " + ", ".join(f"{v} {k}" for k, v in t.items() if v)
            + f" in {rec['wall_s']:.0f} s{workers}.\n\n")
    table = head + format_table(rows, [("file", "file", ""), ("passed", "passed", "d"), ("failed", "failed", "d"),
                                       ("xfailed", "xfailed", "d"), ("skipped", "skipped", "d"),
                                       ("interrupted", "interrupted", "d"),
                                       ("seconds", "seconds", ".1f"), ("failures", "failures", "")])
    if rec.get("tier") != "quick":
        return table
    # the quick tier's tests one by one: where its time goes (mostly the first compile of each kernel variant)
    per_test = [{"test": t, "seconds": s} for t, s in sorted(rec["durations"].items(), key=lambda kv: -kv[1])]
    columns = [("test", "test", ""), ("seconds", "seconds", ".2f")]
    return f"{table}\n\nPer test, slowest first:\n\n{format_table(per_test, columns)}"


def parity_table(rec: dict) -> str:
    rows = [dict(r, first=r["losses"][0], last=r["losses"][-1], steps=len(r["losses"]), status="ok")
            if "losses" in r else r for r in rec["rows"]]
    table = format_table(rows, [("model", "model", ""), ("mode", "mode", ""), ("steps", "steps", "d"),
                                ("first loss", "first", ".4f"), ("last loss", "last", ".4f"), ("status", "status", "")])
    s, data = rec.get("settings"), rec.get("data")
    if s:
        setup = (f"{s['layers']} layers, d {s['hidden']}, MLP {s['intermediate']}; {s['steps']} steps of "
                 f"{s['batch']} × {s['seq_len']} tokens, lr {s['lr']:g} after {s['warmup']} warm-up steps, seed "
                 f"{s['seed']}")
        if data:
            docs = "" if data["documents"] is None else f" in {data['documents']:,} documents"  # `write_corpus`
            setup += (f"; data: {data['train_tokens']:,} training tokens{docs}, vocabulary {data['vocab_size']:,} "
                      f"({data['source']})")
        table = f"{setup}.\n\n{table}"
    summary = rec.get("summary")
    if summary:
        table += (f"\n\nLargest relative difference between the curves: {summary['max_rel_diff']:.2e} (step "
                  f"{summary['max_rel_diff_step']}); mean loss over the last 20 steps: ours "
                  f"{summary['ours_last20']:.4f}, fla {summary['fla_last20']:.4f}.")
    return table


def gate_table(rec: dict) -> str:
    head = f"Base: `{rec['base']}`; {rec['rounds']} rounds; tolerance {rec['tolerance']:.0%}.\n\n"
    if rec.get("complete") is False:
        head += f"The run stopped after {len(rec['rows'])} of its {rec['rows_total']} rows.\n\n"
    # a row past the tolerance is timed again (--confirm-rounds) and judged on all its rounds: show how many
    confirmed = any(r.get("rounds", rec["rounds"]) != rec["rounds"] for r in rec["rows"])
    return head + format_table(rec["rows"], [
        ("row", "row", ""), ("base ms", "base_ms", ".4f"), ("tree ms", "tree_ms", ".4f"),
        ("tree / base", "ratio", ".3f"), *([("rounds", "rounds", "")] if confirmed else []),
        ("fla ms", "fla_ms", ".4f"), ("tree / fla", "tree_vs_fla", ".3f"), ("max rel. diff", "max_rel_diff", ".1e")])


def engine_speed_table(rec: dict) -> str:
    head = f"Base: `{rec['base']}`; {rec['rounds']} round(s).\n\n"
    return head + format_table(rec["rows"], [
        ("task", "task", ""), ("this tree's step", "step", ""), ("unit", "unit", ""), ("base", "base", ".1f"),
        ("this tree", "tree", ".1f"), ("÷ base", "ratio", ".3f")])


def generic_table(rec: dict) -> str:
    keys = [k for k, v in rec["rows"][0].items() if isinstance(v, (str, int, float, bool))] if rec["rows"] else []
    return format_table(rec["rows"], [(k, k, ".4g" if isinstance(rec["rows"][0][k], float) else "") for k in keys])


TABLES = {"ops": ops_tables, "decode": decode_table, "layer": lambda rec: format_table(rec["rows"], [
    ("layer", "layer", ""), ("shape", "shape", ""), ("fwd+bwd ms", "ms", ".4f"), ("÷ fla", "vs_fla", ".3f")]),
    "train": train_table, "mqar": mqar_table, "accuracy": accuracy_table, "ddp": ddp_table, "fsdp_variants": fsdp_table,
    "prepare_scaling": lambda rec: format_table(rec["rows"], PREPARE_COLUMNS),
    "lra_share": lambda rec: format_table(rec["rows"], LRA_SHARE_COLUMNS),
    "convert_fla": convert_table, "eval_ppl": eval_ppl_table, "eval_needle": eval_needle_table, "lra": lra_table,
    "vision": vision_table, "generate": generate_table, "tests": tests_table, "train_parity": parity_table,
    "gate": gate_table, "engine_speed": engine_speed_table, "small_heads": lambda rec: format_table(rec["rows"], [
        ("directions", "directions", ""), ("path", "path", ""), ("fwd ms", "fwd_ms", ".3f"),
        ("fwd+bwd ms", "fwd_bwd_ms", ".3f"), ("max rel. diff", "max_rel_diff", ".1e")])}


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
    for name in _order(records):
        source = SOURCES.get(name, name)
        if source not in records:
            continue
        family = _family(name)
        title, what = FAMILIES[family][0](records[name][0][1]) if family else SECTIONS.get(name, (name, ""))
        table = FAMILIES[family][1] if family else TABLES.get(name, generic_table)
        parts.append(f"## {title}\n\n{textwrap.fill(what, 116)}".rstrip())
        for path, rec in records[source]:
            versions = ", ".join(f"{k} {v}" for k, v in rec["versions"].items() if v and k != "python")
            note = f" ({rec['note']})" if rec.get("note") else ""
            parts.append(f"**{rec['device']}** — `{rec['command']}`{note} — {versions} — commit {rec['commit']}, "
                         f"{rec['date']} — [{path.parent.name}/{path.name}]({path.as_posix()})")
            parts.append(table(rec))
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
