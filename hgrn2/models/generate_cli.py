"""`hgrn2 generate MODEL_DIR --prompt TEXT`: text generation from a saved model directory (model + tokenizer)."""

from __future__ import annotations

import argparse
import os
import sys

import torch

from .device import device_name

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model_dir", help="directory written by save_pretrained (or `hgrn2 convert-fla`), with a tokenizer")
    p.add_argument("--prompt", action="append", required=True, help="prompt text; repeat for a batch")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--sample", action="store_true", help="sample instead of greedy decoding")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0, help="0 disables top-k")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", type=device_name)
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None,
                   help="default: bfloat16 on CUDA, float32 on CPU")


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")


def check_model_dir(path: str) -> None:
    """A local directory with a config and a tokenizer (names are never looked up on a hub)."""
    if not os.path.isdir(path):
        raise ValueError(f"`model_dir`: {path!r} is not a directory (no such directory; models load from local paths)")
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise ValueError(f"`model_dir`: {path!r} holds no config.json (expected a directory written by "
                         f"save_pretrained, `hgrn2 train` or `hgrn2 convert-fla`)")
    if not any(os.path.isfile(os.path.join(path, f)) for f in TOKENIZER_FILES):
        raise ValueError(f"`model_dir`: {path!r} has no tokenizer (one of {', '.join(TOKENIZER_FILES)})")


def run(args: argparse.Namespace) -> int:
    try:
        if args.max_new_tokens < 1:
            raise ValueError(f"`--max-new-tokens`: expected >= 1, got {args.max_new_tokens}")
        if not all(p.strip() for p in args.prompt):
            raise ValueError("`--prompt`: a prompt is empty; the model continues text, so give it some")
        if args.sample and not 0.0 < args.top_p <= 1.0:
            raise ValueError(f"`--top-p`: expected a number in (0, 1], got {args.top_p}")
        if args.sample and not args.temperature > 0.0:
            raise ValueError(f"`--temperature`: expected a positive number, got {args.temperature}")
        if args.top_k < 0:
            raise ValueError(f"`--top-k`: expected 0 (off) or a positive number, got {args.top_k}")
        check_model_dir(args.model_dir)
    except ValueError as e:
        print(f"hgrn2 generate: error: {e}", file=sys.stderr)
        return 2
    # the Auto classes know hgrn2: this module's package, hgrn2.models, registers them on import
    from transformers import AutoTokenizer

    from .saved import load_causal_lm

    torch.manual_seed(args.seed)
    dtype = DTYPES[args.dtype] if args.dtype else (torch.bfloat16 if args.device.startswith("cuda") else torch.float32)
    tok = AutoTokenizer.from_pretrained(args.model_dir)
    tok.padding_side = "left"  # the recurrent state must start at the first real token
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token if tok.eos_token is not None else tok.unk_token
    if tok.pad_token is None and len(args.prompt) > 1:
        print(f"hgrn2 generate: error: the tokenizer in {args.model_dir!r} has no padding, end-of-text or unknown "
              f"token to pad a batch of prompts with; give one --prompt, or save the tokenizer with a pad token",
              file=sys.stderr)
        return 2
    model = load_causal_lm(args.model_dir, dtype=dtype).to(args.device).eval()
    batch = tok(args.prompt, return_tensors="pt", padding=len(args.prompt) > 1).to(args.device)
    kw = dict(do_sample=True, temperature=args.temperature, top_k=args.top_k or None, top_p=args.top_p) \
        if args.sample else dict(do_sample=False)
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=args.max_new_tokens, pad_token_id=tok.pad_token_id, **kw)
    texts = tok.batch_decode(out, skip_special_tokens=True)  # each prompt (its padding dropped) and what follows
    for n, text in enumerate(texts, 1):
        if len(texts) > 1:
            print(("\n" if n > 1 else "") + f"--- {n}/{len(texts)} ---")
        print(text)
    return 0
