"""`hgrn2 bench tune`: the recurrence's rows of `hgrn2 bench gate` under several launch configs, side by side in one
process on one GPU, for choosing the kernels' settings (`hgrn2.ops.triton.config`).

A variant is a comma-separated list of FIELD=VALUE of one config family (`--family`, default chunk_parallel:
`ChunkParallelConfig`), e.g. `small_programs_per_sm=4` or `block_k_bwd=64,num_warps_bwd=8`; the current config
(the defaults) is always timed, as "current". Each round times every variant on the row (the order rotating from
round to round); a variant's time is the median over rounds. Beside each: its ratio to the current config's and the
largest relative difference of its output and gradients (dβ included) from the current config's. On a CPU the
recurrence takes no Triton kernel, so the configs change nothing there (`--quick`: a smoke run of the command).

    hgrn2 bench tune --rows fast,closed --variant small_programs_per_sm=4 --variant block_k_bwd=64,num_warps_bwd=8
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import statistics
from collections.abc import Callable

import torch

import hgrn2.ops as ops

from .common import command_of, environment, format_table, rel_err, time_ms, write_result
from .gate import op_call, rows_spec, select_rows

FAMILIES = {"chunk_parallel": "ChunkParallelConfig", "fused_chunk": "FusedChunkConfig", "dispatch": "DispatchConfig"}
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
COLUMNS = [("row", "row", ""), ("variant", "variant", ""), ("ms", "ms", ".4f"), ("× current", "vs_current", ".3f"),
           ("max rel. diff", "max_rel_diff", ".1e")]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--family", choices=sorted(FAMILIES), default="chunk_parallel",
                   help="the config the variants change (default chunk_parallel)")
    p.add_argument("--variant", action="append", required=True, metavar="FIELD=VALUE[,...]",
                   help="a config to time beside the current one (repeat for more)")
    p.add_argument("--rows", default=None, help="comma-separated gate rows or their first words, as `bench gate "
                                                "--rows` (default: every row of the recurrence, not the layer's)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds per row (default 3)")
    p.add_argument("--quick", action="store_true", help="tiny shapes, a smoke run (works on the CPU)")
    p.add_argument("--out", default=None, metavar="DIR", help="also write the table as DIR/tune.json")


def _config():
    """`hgrn2.ops.triton.config`, which the Triton package holds."""
    try:
        from hgrn2.ops.triton import config
    except ImportError as e:
        raise ValueError(f"--family: the kernels' launch configs need Triton ({e})") from None
    return config


def parse_variant(family: str, text: str):
    """The current config of `family` with the fields of `text` ("FIELD=VALUE,...") replaced."""
    config = _config()
    cls = getattr(config, FAMILIES[family])
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    changes = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        name, sep, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name or not value:
            raise ValueError(f"--variant: expected FIELD=VALUE, got {item!r}")
        if name not in fields:
            close = difflib.get_close_matches(name, fields, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ValueError(f"--variant: {cls.__name__} has no field {name!r}{hint}")
        changes[name] = _value(name, value, fields[name].metadata["kind"])
    if not changes:
        raise ValueError(f"--variant: expected FIELD=VALUE, got {text!r}")
    try:
        return dataclasses.replace(config.current(cls), **changes)
    except ValueError as e:
        raise ValueError(f"--variant: {e}") from None


def _value(name: str, text: str, kind: str):
    """text as the type that a field of this kind holds (a kind ending in ? also takes "none")."""
    if kind.endswith("?") and text.lower() == "none":
        return None
    kind = kind.rstrip("?")
    try:
        if kind in ("block", "warps", "count", "rows"):
            return int(text)
        if kind in ("share", "spread"):
            return float(text)
    except ValueError:
        raise ValueError(f"--variant: {name} takes a number, got {text!r}") from None
    if kind == "flag":
        if text.lower() not in ("true", "false"):
            raise ValueError(f"--variant: {name} takes true or false, got {text!r}")
        return text.lower() == "true"
    if kind == "dtype":
        if text.removeprefix("torch.") not in DTYPES:
            raise ValueError(f"--variant: {name} takes one of {sorted(DTYPES)}, got {text!r}")
        return DTYPES[text.removeprefix("torch.")]
    return text


def _under(family: str, cfg, fn: Callable[[], object]) -> Callable[[], object]:
    launch_config = _config().launch_config

    def run():
        with launch_config(**{family: cfg}):
            return fn()

    return run


def _results(family: str, cfg, inputs, dy, grad: bool, kw: dict) -> list[torch.Tensor]:
    """Output and (with grad) the gradients of every input that takes one, under cfg."""
    leaves = [x.detach().clone().requires_grad_(grad and x.requires_grad) for x in inputs]
    with _config().launch_config(**{family: cfg}), torch.set_grad_enabled(grad):
        y, _ = ops.hgrn2(*leaves, o_act="silu", scale=inputs[0].shape[-1] ** -0.5, **kw)
    got = [y.detach()]
    if grad:
        got += list(torch.autograd.grad(y, [x for x in leaves if x.requires_grad], dy))
    return got


def run(args: argparse.Namespace) -> int:
    if args.rounds < 1:
        raise ValueError(f"--rounds: expected at least 1, got {args.rounds}")
    config = _config()
    variants = {"current": config.current(getattr(config, FAMILIES[args.family]))}
    for text in args.variant:
        variants[text] = parse_variant(args.family, text)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    spec = select_rows([s for s in rows_spec(args.quick, device, dtype) if not s.get("layer")], args.rows)
    warmup, rep = (2, 5) if args.quick else (10, 40)
    out = []
    for s in spec:
        inputs, kw = s["inputs"], s.get("kw", {})
        dy = torch.randn_like(inputs[2])
        want = _results(args.family, variants["current"], inputs, dy, s["grad"], kw)
        calls, diffs = {}, {}
        for name, cfg in variants.items():
            got = _results(args.family, cfg, inputs, dy, s["grad"], kw)  # compiles outside the timed rounds too
            diffs[name] = max(rel_err(a, b) for a, b in zip(got, want))
            calls[name] = _under(args.family, cfg, op_call(ops, inputs, dy, grad=s["grad"], **kw))
        times = {name: [] for name in calls}
        names = list(calls)
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                times[name].append(time_ms(calls[name], device=device, inputs=inputs, warmup=warmup, rep=rep,
                                           grad_to_none=inputs))
        base = statistics.median(times["current"])
        for name in names:
            ms = statistics.median(times[name])
            out.append({"row": s["name"], "variant": name, "ms": ms, "vs_current": ms / base,
                        "max_rel_diff": diffs[name], "rounds": args.rounds})
        print(f"{s['name']}: " + ", ".join(f"{n} {statistics.median(t):.4f} ms" for n, t in times.items()),
              flush=True)
    if args.out:
        path = write_result(args.out, "tune", environment(device), out, command_of(args), quick=args.quick,
                            family=args.family)
        print(f"wrote {path}")
    print(format_table(out, COLUMNS))
    return 0
