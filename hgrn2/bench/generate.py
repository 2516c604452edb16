"""`hgrn2 bench generate`: prefill and decode speed and peak memory of greedy decoding, with random weights in bf16.

Models of the same width, depth and MLP size (0.4B: d 1024, 24 layers, SwiGLU 2816; 1.3B: fla's default, d 2048,
24 layers, SwiGLU 5632; vocab 32000), each decoding `--new` tokens after a `--prompt`-token prompt:
    hgrn2          our HGRN2, transformers' `generate` with the dynamic `HGRN2Cache`
    hgrn2-static   the same with `static_cache=True` (fixed state buffers; the decode step replayed from a CUDA graph)
    fla            fla's HGRN2ForCausalLM, decoded by a hand-written loop (`greedy_decode`: fla 0.6.0's models lose
                   their cache in transformers ≥ 5.24's `generate`)
    llama          transformers' LlamaForCausalLM (SDPA, head dim 64), `generate` with its dynamic cache
    llama-static   the same with `cache_implementation="static"` (transformers compiles its decode step)
Prefill: one forward over the prompt with the cache on, after the warm-up decoding (`time_ms` on CUDA; on a CPU the
fastest of five calls taken in turns with the decodings it is compared with). Decode: one full decoding
after a warm-up one (wall clock between CUDA synchronises; a decoding takes seconds, so the timer's repeated calls
would multiply the run time), minus the prefill, over the `new − 1` one-token steps; for our models also the
one-token forward alone (`forward ms`, without `generate`'s per-step work). The floor is the time to read every
weight once at the copy bandwidth measured here. The rows are written after each one, so a run stopped by
`--budget-s` (or killed) keeps them, and the same command run again measures only the rows still missing
(`--fresh`: all of them).

    hgrn2 bench generate                           # writes benchmarks/results/<device>/generate.json
    hgrn2 bench generate --quick                   # tiny CPU smoke run of the same code path
"""

from __future__ import annotations

import argparse
import gc
import json
import time
import traceback
from pathlib import Path

from hgrn2.bench.common import (
    RESULTS_DIR,
    add_output_argument,
    command_of,
    environment,
    format_table,
    time_ms,
    write_result,
)

# name -> (hidden, layers, SwiGLU width)
SIZES = {"0.4b": (1024, 24, 2816), "1.3b": (2048, 24, 5632)}
MODELS = ("hgrn2", "hgrn2-static", "fla", "llama", "llama-static")
VOCAB = 32000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma list of {', '.join(MODELS)}")
    parser.add_argument("--sizes", default="0.4b,1.3b", help=f"comma list of {', '.join(SIZES)}")
    parser.add_argument("--batches", default="1,64", help="comma list of batch sizes")
    parser.add_argument("--prompt", type=int, default=2048, help="prompt tokens")
    parser.add_argument("--new", type=int, default=256, help="generated tokens (at least 2)")
    parser.add_argument("--budget-s", type=float, default=0.0,
                        help="start no new row after this many seconds (0: no limit); skipped rows say so")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fresh", action="store_true",
                        help="measure every row again (default: keep the ok rows of an earlier run with the same "
                             "--prompt, --new, --seed in the same JSON)")
    add_output_argument(parser)
    parser.add_argument("--quick", action="store_true", help="tiny CPU-sized smoke run (d 64, 2 layers, 32+8 tokens)")


def run(args: argparse.Namespace) -> int:
    import torch

    sizes = dict(SIZES)
    if args.quick:
        sizes = {"tiny": (64, 2, 128)}
        args.sizes, args.batches, args.prompt, args.new = "tiny", "1,3", 32, 8
    names = _choices("--models", args.models, MODELS)
    size_names = _choices("--sizes", args.sizes, sizes)
    try:
        batches = [int(b) for b in args.batches.split(",")]
    except ValueError:
        raise ValueError(f"--batches: expected a comma list of positive ints, got {args.batches!r}") from None
    if any(b < 1 for b in batches):
        raise ValueError(f"--batches: expected positive batch sizes, got {args.batches!r}")
    if args.prompt < 1 or args.new < 2:
        raise ValueError(f"--prompt / --new: expected ≥ 1 prompt and ≥ 2 new tokens, got {args.prompt}, {args.new}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type != "cuda":
        print("no GPU: fla (Triton only), peak memory and the CUDA-graph replay are skipped; timings are CPU smoke")
    vocab = 256 if args.quick else VOCAB
    bandwidth = copy_bandwidth(device, 2**24 if args.quick else 2**30)
    kept = {} if args.fresh else earlier_rows(args, device)
    start, rows = time.perf_counter(), []
    for size in size_names:
        hidden, layers, inter = sizes[size]
        for name in names:
            base = {"model": name, "size": size, "hidden": hidden, "layers": layers}
            if all((name, size, b) in kept for b in batches):
                rows += [kept[name, size, b] for b in batches]
                print(f"{name} {size}: kept from the earlier run")
                continue
            if args.budget_s and time.perf_counter() - start > args.budget_s:
                rows += [{**base, "batch": b, "status": "skipped: --budget-s reached"} for b in batches]
                continue
            rows += measure_model(name, (hidden, layers, inter, vocab), batches, args, device, bandwidth, base,
                                  start, rows, kept)
    print(f"wrote {save(args, device, rows, bandwidth)}")
    print_table(rows)
    return 0


def _choices(flag: str, value: str, allowed) -> list[str]:
    picked = [v.strip() for v in value.split(",") if v.strip()]
    bad = [v for v in picked if v not in allowed]
    if bad or not picked:
        raise ValueError(f"{flag}: expected a comma list of {', '.join(allowed)}, got {value!r}")
    return picked


def copy_bandwidth(device, nbytes: int) -> float:
    """Bytes per second moved (read + written) by a device-to-device copy of `nbytes`."""
    import torch

    x = torch.randn(nbytes // 2, dtype=torch.bfloat16, device=device)
    y = torch.empty_like(x)
    ms = time_ms(lambda: y.copy_(x), device=device, inputs=[x])
    return 2 * nbytes / (ms / 1e3)


def earlier_rows(args, device) -> dict:
    """(model, size, batch) -> row: the ok rows of this benchmark's JSON from an earlier run with the same settings."""
    folder = Path(args.out) if args.out else RESULTS_DIR / environment(device)["device_slug"]
    path = folder / "generate.json"
    if not path.exists():
        return {}
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if any(record.get("args", {}).get(k) != getattr(args, k) for k in ("prompt", "new", "seed", "quick")):
        return {}
    return {(r["model"], r["size"], r["batch"]): r for r in record.get("rows", []) if r.get("status") == "ok"}


def measure_model(name, shape, batches, args, device, bandwidth, base, start, done, kept) -> list[dict]:
    """The rows of one model at one size, one per batch; the model is freed afterwards."""
    import torch

    rows = []
    try:
        model = build(name, *shape, device, args.seed)
    except Exception as e:  # noqa: BLE001 - a missing optional model is a row, not a crash
        return [{**base, "batch": b, "status": f"unavailable: {e}"} for b in batches]
    params = sum(p.numel() for p in model.parameters())
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    for b in batches:
        if (name, base["size"], b) in kept:
            rows.append(kept[name, base["size"], b])
            continue
        row = {**base, "batch": b, "prompt": args.prompt, "new_tokens": args.new, "params": params,
               "floor_ms": 1e3 * weight_bytes / bandwidth}
        if args.budget_s and time.perf_counter() - start > args.budget_s:
            row["status"] = "skipped: --budget-s reached"
        else:
            print(f"{name} {base['size']} batch {b} ...", flush=True)
            row.update(measure(name, model, b, args.prompt, args.new, shape[3], device, args.seed))
            same_as(row, done + rows)
        rows.append(row)
        print(json.dumps(public(row)), flush=True)
        save(args, device, done + rows, bandwidth)
    del model
    if name == "llama-static":
        torch._dynamo.reset()  # transformers compiled its decode step: drop the compiled code and its graphs
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rows


def same_as(row: dict, earlier: list[dict]) -> None:
    """hgrn2-static's row says whether it decoded exactly hgrn2's tokens (same weights, same prompt); the tokens
    themselves are not kept."""
    tokens = row.pop("tokens", None)
    if row["model"] == "hgrn2":
        row["_tokens"] = tokens
    match = [r for r in earlier if r["model"] == "hgrn2" and (r["size"], r["batch"]) == (row["size"], row["batch"])
             and r.get("_tokens") is not None]
    if row["model"] == "hgrn2-static" and tokens is not None and match:
        row["same_tokens_as_hgrn2"] = bool(tokens.equal(match[0]["_tokens"]))


def build(name: str, hidden: int, layers: int, inter: int, vocab: int, device, seed: int):
    """The model `name` with random weights in bf16 on `device`, its generation config set to decode exactly the
    requested number of tokens (no end-of-sequence token)."""
    import torch

    torch.manual_seed(seed)
    if name.startswith("hgrn2"):
        from hgrn2.models import HGRN2Config, HGRN2ForCausalLM

        cls, config = HGRN2ForCausalLM, HGRN2Config(hidden_size=hidden, num_hidden_layers=layers,
                                                    expand_ratio=min(128, hidden // 4), intermediate_size=inter,
                                                    vocab_size=vocab, pad_token_id=0)
    elif name == "fla":
        if device.type != "cuda":
            raise RuntimeError("fla's Triton kernels need a GPU")
        from fla.models import HGRN2Config, HGRN2ForCausalLM

        cls, config = HGRN2ForCausalLM, HGRN2Config(hidden_size=hidden, num_hidden_layers=layers, expand_ratio=128,
                                                    intermediate_size=inter, vocab_size=vocab)
    else:
        from transformers import LlamaConfig, LlamaForCausalLM

        cls, config = LlamaForCausalLM, LlamaConfig(
            hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=max(1, hidden // 64),
            num_key_value_heads=max(1, hidden // 64), intermediate_size=inter, vocab_size=vocab,
            max_position_embeddings=8192, attn_implementation="sdpa", pad_token_id=0)
    with torch.device(device):
        model = cls(config).to(torch.bfloat16).eval()
    if hasattr(model, "generation_config"):
        model.generation_config.eos_token_id, model.generation_config.pad_token_id = None, 0
    return model


def measure(name, model, batch, prompt, new, vocab, device, seed) -> dict:
    """Prefill ms, decode ms per step, their tokens/s and peak memory (CUDA) of one model at one batch size."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (batch, prompt), generator=gen).to(device)
    cuda = device.type == "cuda"
    try:
        with torch.no_grad():
            # warm-up, before any timing; transformers' static cache is sized by the decoding length, so it warms up
            # at full length
            decode(name, model, ids, new if name == "llama-static" else min(new, 8))
            prefill = lambda: model(ids, use_cache=True, logits_to_keep=1)  # noqa: E731
            prefill_ms = time_ms(prefill, device=device, rep=200) if cuda else None
            # decoding = generating `new` tokens minus generating one (both read the prompt the same way); the
            # fastest of a few runs of each, taken in turns so that a busy spell slows both alike, since the
            # difference of two noisy times can vanish for tiny models on a CPU
            reps = 5 if device.type == "cpu" else 1
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            ones, runs, prefills = [], [], []
            for _ in range(reps):
                if not cuda:  # timed in the same turns as the decodings it is compared with
                    prefills.append(_wall_ms(prefill, cuda))
                ones.append(_wall_ms(lambda: decode(name, model, ids, 1), cuda))
                runs.append(_wall_ms(lambda: decode(name, model, ids, new), cuda, keep=True))
            prefill_ms = prefill_ms if cuda else min(prefills)
            one_ms = min(ones)
            total_ms, out = min(runs, key=lambda r: r[0])
            step_ms = forward_step_ms(name, model, ids, device) if name.startswith("hgrn2") else None
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        return {"status": "OOM"}
    except Exception as e:  # noqa: BLE001 - one model failing to decode is its row's status; the others still run
        traceback.print_exc()
        return {"status": f"failed: {type(e).__name__}: {e}"[:300]}
    if out.shape != (batch, prompt + new):
        return {"status": f"decoded {tuple(out.shape)} tokens, expected {(batch, prompt + new)}"}
    decode_ms = (total_ms - one_ms) / (new - 1)
    if decode_ms <= 0:  # the tokens still say whether the static path decodes the same
        return {"status": f"timer noise: generating {new} tokens took no longer than generating one",
                "tokens": out.cpu()}
    return {"status": "ok", "tokens": out.cpu(), "prefill_ms": prefill_ms,
            "prefill_tok_per_s": 1e3 * batch * prompt / prefill_ms, "forward_ms_per_step": step_ms,
            "decode_ms_per_step": decode_ms, "decode_tok_per_s": 1e3 * batch / decode_ms,
            "total_ms": total_ms, "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None}


def forward_step_ms(name: str, model, ids, device) -> float:
    """ms of our model's one-token forward after the prompt, called directly: the decode step without `generate`'s
    own per-step work (with a fresh static cache for hgrn2-static, so its CUDA graph is replayed on a GPU)."""
    from hgrn2.models import HGRN2StaticCache
    from hgrn2.models.modeling_hgrn2 import CACHE_FIELD

    cache = HGRN2StaticCache(model.config.num_hidden_layers) if name == "hgrn2-static" else None
    out = model(ids, use_cache=True, logits_to_keep=1, **{CACHE_FIELD: cache})
    cache, nxt = getattr(out, CACHE_FIELD), out.logits[:, -1:].argmax(-1)
    return time_ms(lambda: model(nxt, use_cache=True, **{CACHE_FIELD: cache}), device=device)


def _wall_ms(fn, cuda: bool, keep: bool = False):
    """Wall-clock milliseconds of one call (synchronised on CUDA), and its result if keep."""
    import torch

    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    if cuda:
        torch.cuda.synchronize()
    ms = 1e3 * (time.perf_counter() - t0)
    return (ms, out) if keep else ms


def decode(name: str, model, ids, new: int):
    """Greedy continuation [B, T + new] of ids [B, T] the way this model decodes fastest."""
    if name == "fla":
        from hgrn2.models.convert import greedy_decode

        return greedy_decode(model, ids, new)
    kw = {"static_cache": True} if name == "hgrn2-static" else {}
    if name == "llama-static":
        kw = {"cache_implementation": "static"}
    return model.generate(ids, max_new_tokens=new, do_sample=False, **kw)


def save(args, device, rows, bandwidth: float):
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "command_line")}
    return write_result(args.out, "generate", environment(device), [public(r) for r in rows], command_of(args),
                        quick=args.quick, args=settings, copy_gb_per_s=bandwidth / 1e9)


def public(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith("_")}


TABLE = [("model", "model", ""), ("shape", "shape", ""), ("prefill tok/s", "prefill_tok_per_s", ".0f"),
         ("decode tok/s", "decode_tok_per_s", ".0f"), ("ms/step", "decode_ms_per_step", ".2f"),
         ("forward ms", "forward_ms_per_step", ".2f"), ("floor ms", "floor_ms", ".3f"), ("× floor", "floor_x", ".1f"),
         ("peak GiB", "peak_gib", ".1f"), ("same tokens", "same_tokens_as_hgrn2", ""), ("status", "status", "")]


def print_table(rows: list[dict]) -> None:
    """The rows as a Markdown table (× floor: ms/step over the floor), then hgrn2-static's speed-ups."""
    shown = [{**r, "shape": f"{r['size']} B{r['batch']}"} for r in rows]
    for r in shown:
        if r.get("status") == "ok":
            r["floor_x"] = r["decode_ms_per_step"] / r["floor_ms"]
    print(format_table(shown, TABLE))
    for line in ratios(rows):
        print(line)


def ratios(rows: list[dict]) -> list[str]:
    """Per size and batch: hgrn2-static's decode tokens/s over every other model's."""
    ok = {(r["model"], r["size"], r["batch"]): r for r in rows if r.get("status") == "ok" and r["decode_tok_per_s"]}
    lines = []
    for (name, size, b), ours in ok.items():
        if name != "hgrn2-static":
            continue
        parts = [f"{ours['decode_tok_per_s'] / r['decode_tok_per_s']:.2f}× {other}"
                 for (other, s2, b2), r in ok.items() if (s2, b2) == (size, b) and other != name]
        if parts:
            lines.append(f"hgrn2-static {size} B{b} decode tokens/s: " + ", ".join(parts))
    return lines
