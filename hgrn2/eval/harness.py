"""lm-evaluation-harness adapter for HGRN2-family models (ours and converted fla checkpoints), and
`hgrn2 eval lm-eval MODEL --tasks ...`.

Importing this module registers the model name "hgrn2" with lm-eval (lm-eval finds models only through its
registry, filled at import time). Three ways in:

    hgrn2 eval lm-eval DIR --tasks piqa,hellaswag          # this wrapper around lm_eval.simple_evaluate
    python -m hgrn2.eval.harness --model hgrn2 --model_args pretrained=DIR --tasks piqa   # lm-eval's own CLI
    import hgrn2.eval.harness; lm_eval.simple_evaluate(model="hgrn2", model_args={"pretrained": DIR}, ...)

The recurrent cache makes sharing exact: each distinct context runs once (left-padded batches of similar length),
its state is copied to every continuation, and each continuation is scored from that state. Rolling
log-likelihoods score the whole document in one pass (no windows: a recurrent model has no context limit).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
from collections import defaultdict

import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model

from hgrn2.data.files import write_json

from .common import (
    EvalError,
    add_device_arguments,
    check_out_file,
    default_device,
    evaluate_or_report,
    forward,
    greedy_generate,
    is_recurrent,
    load_model,
    load_tokenizer,
)
from .ppl import score_carried

# tasks that ship with hgrn2 (an offline multiple-choice example, `hgrn2_tiny_mc`), always on the include path
TASKS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tasks")


@register_model("hgrn2")
class HGRN2LM(TemplateLM):
    """An lm-eval `LM` over a local HGRN2 model directory. model_args: pretrained (dir), tokenizer (dir),
    device, dtype, batch_size, chunk (tokens per forward), max_gen_toks. lm-eval also passes max_batch_size,
    which only bounds its "auto" batch-size search, so it is accepted and not used."""

    def __init__(self, pretrained: str, tokenizer: str | None = None, device: str | None = None,
                 dtype: str | None = None, batch_size: int | str = 8, chunk: int | str = 2048,
                 max_gen_toks: int | str = 256, max_batch_size: int | None = None, **unused):
        super().__init__()
        if unused:
            raise EvalError(f"--model_args: unknown argument(s) {sorted(unused)} for the hgrn2 model")
        for name, v in (("batch_size", batch_size), ("chunk", chunk), ("max_gen_toks", max_gen_toks)):
            if not (str(v).isdigit() and int(v) >= 1) and not (name == "batch_size" and str(v).startswith("auto")):
                raise EvalError(f"{name}: expected a whole number >= 1, got {v!r}")
        self._device = device or default_device()
        self.model = load_model(pretrained, self._device, None if dtype in (None, "auto") else dtype)
        if not is_recurrent(self.model):
            raise EvalError(f"pretrained: {pretrained!r} is not an HGRN2-family model; use lm-eval's `hf` model")
        self.tokenizer = load_tokenizer(tokenizer or pretrained)
        # "auto" batch sizes are lm-eval's probing of a transformer's memory; a fixed default serves here
        self.batch_size = int(batch_size) if str(batch_size).isdigit() else 8
        self.chunk, self.max_gen_toks = int(chunk), int(max_gen_toks)

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self) -> int:
        t = self.tokenizer
        return t.bos_token_id if t.bos_token_id is not None else t.eos_token_id

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        bos = self.tokenizer.bos_token
        if add_special_tokens is None and bos and string.startswith(bos):
            add_special_tokens = False
        kw = {} if add_special_tokens is None else {"add_special_tokens": add_special_tokens}
        return self.tokenizer.encode(string, **kw)

    def tok_decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    # ------------------------------------------------------------------------------------------------------------

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        """(sum of log p(continuation | context), whether greedy decoding reproduces it) per request."""
        from tqdm.auto import tqdm

        groups: dict[tuple[int, ...], list[int]] = defaultdict(list)
        for i, (_, ctx, _) in enumerate(requests):
            groups[tuple(ctx)].append(i)
        contexts = sorted(groups, key=len, reverse=True)
        results: list[tuple[float, bool] | None] = [None] * len(requests)
        for b in tqdm(range(0, len(contexts), self.batch_size), desc="loglikelihood", disable=disable_tqdm):
            batch = contexts[b:b + self.batch_size]
            last, cache = self._run_contexts([list(c) for c in batch])
            rows = [(r, i) for r, c in enumerate(batch) for i in groups[c]]
            for s in range(0, len(rows), self.batch_size):
                part = rows[s:s + self.batch_size]
                scores = self._score_continuations(last, cache, [r for r, _ in part],
                                                   [requests[i][2] for _, i in part])
                for (_, i), sc in zip(part, scores):
                    results[i] = sc
        return results

    @torch.no_grad()
    def _run_contexts(self, contexts: list[list[int]]):
        """Left-padded forward over the contexts in chunks; the last position's log-probabilities and the cache."""
        dev = self.device
        T, shortest = max(map(len, contexts)), min(map(len, contexts))
        ids = torch.full((len(contexts), T), self.prefix_token_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for r, c in enumerate(contexts):
            ids[r, T - len(c):], mask[r, T - len(c):] = torch.tensor(c), 1
        ids, mask = ids.to(dev), mask.to(dev)
        # the first call holds all the padding (a padded row must start from a zero state)
        bounds = [0, min(T, max(self.chunk, T - shortest + 1))]
        bounds += list(range(bounds[1] + self.chunk, T, self.chunk)) + ([T] if bounds[1] < T else [])
        cache = logits = None
        for s, e in zip(bounds[:-1], bounds[1:]):
            logits, cache = forward(self.model, ids[:, s:e], cache, mask[:, s:e] if s == 0 else None, keep=1)
        return F.log_softmax(logits[:, -1].float(), -1), cache

    @torch.no_grad()
    def _score_continuations(self, last, cache, rows: list[int], conts: list[list[int]]):
        """Score each continuation from a copy of its context's state (row `rows[k]` of the batch)."""
        idx = torch.tensor(rows, device=last.device)
        lp0 = last.index_select(0, idx)
        total = lp0.gather(1, torch.tensor([c[0] for c in conts], device=last.device)[:, None])[:, 0].double()
        greedy = lp0.argmax(-1).cpu() == torch.tensor([c[0] for c in conts])
        n = max(map(len, conts))
        if n > 1:
            state = copy.deepcopy(cache)
            state.batch_select_indices(idx)
            x = torch.zeros((len(conts), n), dtype=torch.long)
            for r, c in enumerate(conts):
                x[r, : len(c)] = torch.tensor(c)
            x = x.to(last.device)
            lps, tops = [], []
            for s in range(0, n - 1, self.chunk):
                e = min(s + self.chunk, n - 1)
                logits, state = forward(self.model, x[:, s:e], state)
                lp = F.log_softmax(logits.float(), -1)
                lps.append(lp.gather(2, x[:, s + 1:e + 1, None])[..., 0])
                tops.append(lp.argmax(-1) == x[:, s + 1:e + 1])
            lp, top = torch.cat(lps, 1).double().cpu(), torch.cat(tops, 1).cpu()
            for r, c in enumerate(conts):
                total[r] += lp[r, : len(c) - 1].sum()
                greedy[r] &= bool(top[r, : len(c) - 1].all())
        return [(float(t), bool(g)) for t, g in zip(total.cpu(), greedy)]

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        import numpy as np

        seqs = [np.asarray([self.prefix_token_id] + self.tok_encode(req.args[0]), dtype=np.int64) for req in requests]
        losses = score_carried(self.model, seqs, self.chunk, self.batch_size, desc="loglikelihood_rolling")
        return [-float(x.sum()) for x in losses]

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy continuations cut at the first stop string (`until`) or eos."""
        out: list[str | None] = [None] * len(requests)
        groups: dict[str, list[int]] = defaultdict(list)
        for i, req in enumerate(requests):
            groups[json.dumps(req.args[1], sort_keys=True, default=str)].append(i)
        for key, idx in groups.items():
            kw = json.loads(key)
            if kw.get("do_sample") and float(kw.get("temperature", 1.0)) > 0:
                raise EvalError("generate_until: the hgrn2 adapter decodes greedily; the task asks for sampling")
            until = kw.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            prompts = [self.tok_encode(requests[i].args[0]) for i in idx]
            gens = greedy_generate(self.model, self.tokenizer, prompts, int(kw.get("max_gen_toks", self.max_gen_toks)),
                                   self.batch_size, stop_ids=[self.eot_token_id], stop_strings=until)
            for i, g in zip(idx, gens):
                text = self.tok_decode(g)
                for stop in until:
                    text = text.split(stop)[0]
                out[i] = text
        return out


# ----------------------------------------------------------------------------------------------------------------
# `hgrn2 eval lm-eval`


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="HGRN2 model directory (save_pretrained or `hgrn2 convert-fla`)")
    p.add_argument("--tasks", required=True, help="comma-separated lm-eval task names")
    p.add_argument("--include-path", default=None, help="directory of extra task YAMLs (e.g. with local data_files)")
    p.add_argument("--num-fewshot", type=int, default=None)
    p.add_argument("--limit", type=float, default=None, help="documents per task (a fraction if < 1)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--chunk", type=int, default=2048, help="tokens per forward")
    add_device_arguments(p)
    p.add_argument("--out", default=None, help="write the results JSON here")


def run(args: argparse.Namespace) -> int:
    results = evaluate_or_report("lm-eval", evaluate, args)
    if results is None:
        return 2
    from lm_eval.utils import make_table

    print(make_table(results))
    if args.out:
        write_json(args.out, {k: results[k] for k in ("results", "versions", "n-shot", "config") if k in results})
        print(f"wrote {args.out}")
    return 0


def evaluate(args: argparse.Namespace) -> dict:
    import lm_eval
    from lm_eval.tasks import TaskManager

    for name in ("batch_size", "chunk", "num_fewshot"):
        v = getattr(args, name)
        if v is not None and v < (0 if name == "num_fewshot" else 1):
            raise EvalError(f"--{name.replace('_', '-')}: expected >= {0 if name == 'num_fewshot' else 1}, got {v}")
    if args.limit is not None and not args.limit > 0:
        raise EvalError(f"--limit: expected > 0, got {args.limit}")
    if args.out:
        check_out_file(args.out)
    if args.include_path and not os.path.isdir(args.include_path):
        raise EvalError(f"--include-path: {args.include_path!r} is not a directory")
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    local = [TASKS_DIR, *([args.include_path] if args.include_path else [])]
    # indexing lm-eval's own task tree takes seconds: skip it when the local tasks suffice
    manager = TaskManager(include_path=local, include_defaults=False)
    if not all(manager.match_tasks([t]) for t in tasks):
        manager = TaskManager(include_path=local)
    unknown = [t for t in tasks if not manager.match_tasks([t])]
    if unknown:
        raise EvalError(f"--tasks: unknown task name(s) {unknown} (list them with `lm-eval ls tasks`)")
    lm = HGRN2LM(args.model, device=args.device, dtype=args.dtype, batch_size=args.batch_size, chunk=args.chunk)
    limit = int(args.limit) if args.limit is not None and args.limit >= 1 else args.limit
    return lm_eval.simple_evaluate(model=lm, tasks=tasks, num_fewshot=args.num_fewshot, limit=limit,
                                   task_manager=manager, log_samples=False)


if __name__ == "__main__":  # lm-eval's own CLI with "hgrn2" registered
    import sys

    from lm_eval.__main__ import cli_evaluate

    if not any(a == "--device" or a.startswith("--device=") for a in sys.argv[1:]):
        sys.argv += ["--device", default_device()]  # lm-eval's default is cuda:0, absent on a CPU-only host
    cli_evaluate()
