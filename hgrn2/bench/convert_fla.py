"""`hgrn2 bench convert-fla`: an fla HGRN2 checkpoint converted to hgrn2 gives fla's logits and greedy generations.

    hgrn2 bench convert-fla                    # writes benchmarks/results/<device>/convert_fla.json
    TRITON_INTERPRET=1 hgrn2 bench convert-fla --device cpu --hidden 64 --expand 16 --layers 2 --prompt-len 20 \
        --new-tokens 4                         # the same check on a CPU (fla's kernels in Triton's interpreter)

Builds fla's `HGRN2ForCausalLM` (flash-linear-attention 0.6.0, its own fused norms and kernels) with random
weights, saves it, converts it with `hgrn2 convert-fla`, and compares on the same GPU:
- logits: fla and ours (Triton kernels) against our fp64 step-loop reference of the converted model (for bf16,
  of the model with its weights rounded to bf16, so that only the arithmetic differs), and against each other,
  in fp32 and in bf16 (relative L2 over all logits);
- greedy generation of --new-tokens tokens after a --prompt-len prompt, batch 2 (fla's recurrent cache vs ours);
  where the two differ, the fp64 reference's logits at the first differing token tell whether that was a
  near-tie (a gap between the two tokens smaller than the logit error that bf16 makes anyway) or a mistake;
- teacher-forced argmax agreement over every prompt position (ours vs fla, each vs the fp64 reference).
The lower bounds and norm weights are randomised too, so that a mis-mapped one cannot go unnoticed.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import torch

from hgrn2.bench.common import add_output_argument, command_of, environment, rel_err, write_result
from hgrn2.models import HGRN2ForCausalLM
from hgrn2.models.convert import convert_fla_checkpoint, greedy_decode


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--expand", type=int, default=128)
    p.add_argument("--vocab", type=int, default=1000)
    p.add_argument("--prompt-len", type=int, default=300)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    add_output_argument(p)


def fla_model(args):
    from fla.models import HGRN2Config
    from fla.models import HGRN2ForCausalLM as FlaHGRN2

    cfg = HGRN2Config(vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
                      expand_ratio=args.expand, fuse_cross_entropy=False)
    torch.manual_seed(0)
    model = FlaHGRN2(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lower_bounds" in name:
                p.copy_(torch.randn_like(p))
            elif "norm" in name:
                p.copy_(1 + 0.2 * torch.randn_like(p))
    return model.to(args.device).eval()


def log(t0, what):
    print(f"[{time.time() - t0:6.1f} s] {what}", flush=True)


def first_difference(a, b):
    diff = (a != b).nonzero()
    return None if len(diff) == 0 else tuple(int(x) for x in diff[diff[:, 1].argmin()])


def divergence(oracle, ga, gb, err_rms):
    """At the first token where fla's greedy ga and ours gb [B, T] differ: fp64 logits of both choices."""
    where = first_difference(ga, gb)
    if where is None:
        return {"first_differing_position": None}
    row, t = where
    logits = oracle(ga[row:row + 1, :t]).logits[0, -1]
    fla_tok, our_tok = int(ga[row, t]), int(gb[row, t])
    gap = (logits[fla_tok] - logits[our_tok]).item()
    return {"first_differing_position": t, "fla_token": fla_tok, "our_token": our_tok,
            "fp64_prefers": "fla" if gap > 0 else "ours", "fp64_logit_gap": abs(gap),
            "logit_error_rms": err_rms, "near_tie": abs(gap) < 2 * err_rms}


def agreement(x, y):
    return (x.argmax(-1) == y.argmax(-1)).double().mean().item()


@torch.no_grad()
def run(args: argparse.Namespace) -> int:
    # fla's GLA kernels leave tl.dot's precision at Triton's default, tf32 for fp32 inputs, whose error would hide a
    # conversion error in the fp32 comparison: fla runs with IEEE fp32 dots, as ours do
    os.environ.setdefault("TRITON_F32_DEFAULT", "ieee")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device: cuda is not available (fla's kernels need a GPU or TRITON_INTERPRET=1)")
    if args.device == "cpu":  # fla's kernels in Triton's interpreter: make it round bf16 as a GPU does
        import hgrn2.ops.triton  # noqa: F401
    # a correctness check: fla's autotuner (minutes of compiling and timing configs on a cold cache, and it
    # cannot time at all in Triton's CPU interpreter) takes each kernel's first config instead
    import triton.runtime.autotuner as autotuner
    autotuner.Autotuner._bench = lambda self, *a, config=None, **k: [0.0, 0.0, 0.0]
    env = environment(args.device)
    t0 = time.time()
    ref_fla = fla_model(args)
    with tempfile.TemporaryDirectory() as tmp:
        ref_fla.save_pretrained(Path(tmp) / "fla")
        convert_fla_checkpoint(Path(tmp) / "fla", Path(tmp) / "ours")
        ours = HGRN2ForCausalLM.from_pretrained(Path(tmp) / "ours").to(args.device).eval()
        oracle = HGRN2ForCausalLM.from_pretrained(Path(tmp) / "ours", backend="reference",
                                                  dtype=torch.float64).to(args.device).eval()
    log(t0, "models built and converted")
    torch.manual_seed(1)
    ids = torch.randint(0, args.vocab, (2, args.prompt_len), device=args.device)
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        fla_m, ours_m = ref_fla.to(dtype), ours.to(dtype)
        want = oracle.to(dtype).to(torch.float64)(ids).logits
        a = fla_m(ids).logits
        log(t0, f"{dtype}: fla logits")
        b = ours_m(ids).logits
        log(t0, f"{dtype}: our logits")
        mask = torch.ones_like(ids)
        ga = greedy_decode(fla_m, ids, args.new_tokens)  # fla's own cache, decoded by hand
        log(t0, f"{dtype}: fla greedy")
        gb = ours_m.generate(ids, attention_mask=mask, max_new_tokens=args.new_tokens, do_sample=False)
        log(t0, f"{dtype}: our generate")
        err_rms = max((a - want).pow(2).mean(), (b - want).pow(2).mean()).sqrt().item()
        row = {"dtype": str(dtype).removeprefix("torch."), "fla_vs_fp64": rel_err(a, want),
               "ours_vs_fp64": rel_err(b, want), "ours_vs_fla": rel_err(b, a),
               "argmax_ours_fla": agreement(b, a), "argmax_fla_fp64": agreement(a, want),
               "argmax_ours_fp64": agreement(b, want),
               "greedy_equal": bool(torch.equal(ga, gb)), "new_tokens": args.new_tokens,
               **divergence(oracle, ga, gb, err_rms)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    seconds = round(time.time() - t0, 1)
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "command_line")}
    path = write_result(args.out, "convert_fla", env, rows, command_of(args), args=settings, seconds=seconds)
    print(f"wrote {path}")
    lines = [f"# {env['device']}: fla HGRN2 (d={args.hidden}, {args.layers} layers, expand {args.expand}) "
             f"→ hgrn2, prompt 2x{args.prompt_len}, {args.new_tokens} greedy tokens, {seconds} s",
             "| dtype | fla vs fp64 ref | ours vs fp64 ref | ours vs fla | argmax ours=fla (prompt) | greedy equal |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        greedy = str(r["greedy_equal"])
        if not r["greedy_equal"]:
            whose = "fla's" if r["fp64_prefers"] == "fla" else "our"
            greedy += (f" (first difference at {r['first_differing_position']}: the fp64 reference prefers {whose} "
                       f"token by {r['fp64_logit_gap']:.2e}, logit error rms {r['logit_error_rms']:.2e}"
                       f"{', a near-tie' if r['near_tie'] else ''})")
        lines.append(f"| {r['dtype']} | {r['fla_vs_fp64']:.2e} | {r['ours_vs_fp64']:.2e} | {r['ours_vs_fla']:.2e} "
                     f"| {r['argmax_ours_fla']:.4f} | {greedy} |")
    print("\n".join(lines))
    return 0
