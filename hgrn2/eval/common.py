"""What every eval command shares: loading a model directory and its tokenizer, the cache keyword, the context
limit, greedy generation, atomic JSON and the argument-error type."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Sequence

import torch

from hgrn2.models import HGRN2ForCausalLM
from hgrn2.models.device import device_name
from hgrn2.models.modeling_hgrn2 import CACHE_FIELD

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class EvalError(ValueError):
    """Bad input to an eval command; the CLI prints it as one line."""


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_dtype(name: str | None, device: str) -> torch.dtype:
    """bf16 on GPU, fp32 on CPU unless named."""
    if name is None:
        return torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    if name not in DTYPES:
        raise EvalError(f"--dtype: expected one of {sorted(DTYPES)}, got {name!r}")
    return DTYPES[name]


def load_model(path: str, device: str | None = None, dtype: str | torch.dtype | None = None):
    """A causal LM from a local directory (ours, a converted fla checkpoint, or any transformers model), in eval
    mode on `device`."""
    from hgrn2.models.saved import load_causal_lm

    if not os.path.isdir(path) or not os.path.isfile(os.path.join(path, "config.json")):
        raise EvalError(f"MODEL: {path!r} is not a model directory (no config.json)")
    device = device or default_device()
    dtype = dtype if isinstance(dtype, torch.dtype) else resolve_dtype(dtype, device)
    try:
        model = load_causal_lm(path, dtype=dtype)
    except ValueError as e:
        raise EvalError(f"MODEL: {e}") from None
    return model.to(device).eval()


def check_out_file(path: str, flag: str = "--out") -> None:
    """Refuse an output file that could not be written (its missing folders are made when it is), before the work
    whose result it would hold."""
    if os.path.isdir(path):
        raise EvalError(f"{flag}: {path!r} is a directory; expected a file name")
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise EvalError(f"{flag}: {path!r} cannot be written: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise EvalError(f"{flag}: {path!r} is not writable")


def fingerprint(*paths: str) -> str:
    """sha256 over files (for a directory: its config.json and weight files), so that partial results are kept with
    what they were computed from rather than with a path whose contents may be replaced."""
    h = hashlib.sha256()
    for path in paths:
        files = [path]
        if os.path.isdir(path):
            files = [os.path.join(path, n) for n in sorted(os.listdir(path))
                     if n == "config.json" or n.endswith((".safetensors", ".bin", ".pt"))]
        for file in files:
            h.update(os.path.basename(file).encode() + b"\0")
            with open(file, "rb") as f:
                for block in iter(lambda: f.read(1 << 22), b""):  # noqa: B023 - f is read in this loop only
                    h.update(block)
    return h.hexdigest()


def load_tokenizer(path: str):
    """The directory's transformers tokenizer; a bare tokenizer.json (as `hgrn2 data prepare` writes) gets its
    end-of-text token as data prepare names it."""
    from hgrn2.data.tokenizer import eos_id, pretrained_tokenizer
    from hgrn2.data.tokenizer import load_tokenizer as load_raw

    names = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
    if not os.path.isdir(path) or not any(os.path.isfile(os.path.join(path, n)) for n in names):
        raise EvalError(f"--tokenizer: no tokenizer files ({', '.join(names)}) in {path!r} (without --tokenizer: "
                        "the model's directory)")
    configured = os.path.isfile(os.path.join(path, "tokenizer_config.json"))
    tok = pretrained_tokenizer(path, None if configured else eos_id(load_raw(path)))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token if tok.eos_token is not None else tok.unk_token
    return tok


def is_recurrent(model) -> bool:
    """True when the model has no position limit (an HGRN2-family model: its cache is a constant-size state)."""
    return isinstance(model, HGRN2ForCausalLM)


def context_limit(model) -> int | None:
    """The longest context the model accepts: None for recurrent models, else max_position_embeddings."""
    if is_recurrent(model):
        return None
    cfg = model.config
    return getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)


def check_length(model, length: int, what: str, ignore_limit: bool = False) -> None:
    """Refuse inputs past max_position_embeddings unless asked (rotary models run there, to show extrapolation)."""
    limit = context_limit(model)
    if limit is not None and length > limit and not ignore_limit:
        raise EvalError(f"{what}: {length} tokens exceed the model's context limit of {limit} "
                        f"(max_position_embeddings; --ignore-context-limit evaluates past it)")


def forward(model, ids: torch.Tensor, cache=None, attention_mask=None, keep: int = 0):
    """One causal-LM forward carrying `cache`; returns (logits [B, T or keep, V], the updated cache)."""
    out = model(input_ids=ids, attention_mask=attention_mask, use_cache=True, logits_to_keep=keep,
                **{CACHE_FIELD: cache})
    return out.logits, getattr(out, CACHE_FIELD)


@torch.no_grad()
def greedy_generate(model, tok, prompts: Sequence[list[int]], max_new_tokens: int, batch_size: int = 8,
                    stop_ids: Sequence[int] = (), stop_strings: Sequence[str] = ()) -> list[list[int]]:
    """Greedy continuations of token-id prompts (left-padded batches), cut before the first stop id. Decoding of a
    batch ends early once every row has produced one of `stop_strings` (the caller cuts the text there)."""
    device = next(model.parameters()).device
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
    out: list[list[int]] = [[] for _ in prompts]
    for s in range(0, len(order), batch_size):
        idx = order[s:s + batch_size]
        T = max(len(prompts[i]) for i in idx)
        ids = torch.full((len(idx), T), pad, dtype=torch.long)
        mask = torch.zeros((len(idx), T), dtype=torch.long)
        for r, i in enumerate(idx):
            ids[r, T - len(prompts[i]):] = torch.tensor(prompts[i])
            mask[r, T - len(prompts[i]):] = 1
        gen = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), do_sample=False,
                             max_new_tokens=max_new_tokens, pad_token_id=pad, eos_token_id=list(stop_ids) or None,
                             **({"stop_strings": list(stop_strings), "tokenizer": tok} if stop_strings else {}))
        for r, i in enumerate(idx):
            new = gen[r, T:].tolist()
            cut = next((k for k, t in enumerate(new) if t in stop_ids), len(new))
            out[i] = new[:cut]
    return out


class ResultLog:
    """Finished items of a long run, one JSON line each in `path` (flushed and synced per item), so a run that was
    stopped resumes where it left off. The first line holds the run's settings; a log written with other settings
    is refused. A last line cut short by a crash is dropped."""

    def __init__(self, path: str, settings: dict):
        self.path, self.done = path, {}
        header = {"settings": settings}
        lines = []
        if os.path.exists(path):
            with open(path) as f:
                lines = f.read().splitlines()
            if lines and json.loads(lines[0]) != json.loads(json.dumps(header)):
                raise EvalError(f"--out: {path} holds a run with other settings; remove it or choose another --out")
            for line in lines[1:]:
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    break
                self.done[rec["key"]] = rec
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path + ".tmp", "w") as f:  # rewritten without a cut-off last line
            f.writelines(json.dumps(r) + "\n" for r in [header, *self.done.values()])
        os.replace(path + ".tmp", path)
        self.file = open(path, "a")  # noqa: SIM115 - closed in close()

    def add(self, key: str, record: dict) -> None:
        record = {"key": key, **record}
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        os.fsync(self.file.fileno())
        self.done[key] = record

    def close(self) -> None:
        self.file.close()


def model_label(path: str) -> str:
    """A model directory's last two path components, for plot titles ("run/final" rather than "final")."""
    return os.path.join(*os.path.normpath(os.path.abspath(path)).split(os.sep)[-2:])


def evaluate_or_report(command: str, evaluate, args):
    """`evaluate(args)`, or None after one line on stderr naming what the user got wrong."""
    try:
        return evaluate(args)
    except (EvalError, FileNotFoundError) as e:
        print(f"hgrn2 eval {command}: error: {e}", file=sys.stderr)
        return None


def add_device_arguments(p, context_limit: bool = False) -> None:
    """--device and --dtype (and --ignore-context-limit), shared by the eval commands."""
    if context_limit:
        p.add_argument("--ignore-context-limit", action="store_true",
                       help="evaluate past max_position_embeddings (rotary models run there; shows extrapolation)")
    p.add_argument("--device", default=None, type=device_name, help="default: cuda if available, else cpu")
    p.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16 (default: bf16 on GPU, fp32 on CPU)")


def write_record(args, benchmark: str, rows: list[dict], figure: str, device: str, **extra) -> str:
    """The result as a benchmark record (`hgrn2.bench.common.write_result`: command, device, versions, commit, date,
    rows) at `args.record`/<benchmark>.json, the figure copied beside it, the model's training recipe as its note."""
    from hgrn2.bench.common import command_of, environment, write_result

    note = training_note(args.model)
    path = write_result(args.record or None, benchmark, environment(device), rows, command_of(args), figure=figure,
                        **({"note": note} if note else {}), **extra)
    return str(path)


def training_note(model_dir: str) -> str | None:
    """One line on how `hgrn2 train` made the model (its `train_config.yaml`), or None for other models."""
    path = os.path.join(model_dir, "train_config.yaml")
    if not os.path.isfile(path):
        return None
    import yaml

    with open(path) as f:
        c = yaml.safe_load(f)
    m = ", ".join(f"{k} {v}" for k, v in (c.get("model") or {}).items())
    data = str(c.get("data"))
    meta = os.path.join(data, "meta.json")
    if os.path.isfile(meta):
        with open(meta) as f:
            splits = json.load(f)["splits"]
        data += f" ({splits['train']['tokens']:,} training tokens)"
    return (f"model: `hgrn2 train` {c.get('arch')} ({m}) on {data}, seq_len {c.get('seq_len')}, "
            f"{c.get('max_steps')} steps × {c.get('batch_size')} sequences, lr {c.get('lr')}, {c.get('precision')}")


def save_figure(fig, path: str) -> None:
    """Save a matplotlib figure atomically."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp.png"
    fig.savefig(tmp, dpi=150, bbox_inches="tight")
    os.replace(tmp, path)
