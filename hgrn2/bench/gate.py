"""`hgrn2 bench gate`: the working tree's recurrence against a base tree's (main by default), side by side in one
process on one GPU; exits 1 when any row is more than `--tolerance` slower than the base.

Both trees are imported at once: the base's `hgrn2/ops` and `hgrn2/layers` are copied from git (`--base REF`) or
from a folder (`--base-dir`, e.g. made by `git archive REF hgrn2 | tar -x -C DIR` on a machine without the
repository) into a temporary package `hgrn2_base`, with its custom-op namespace renamed so that both register.
Every row runs both trees on the same inputs; rounds interleave the trees (alternating which goes first) and each
tree's time is the median over rounds of `hgrn2.bench.common.time_ms` medians. A row past the tolerance is timed
again (`--confirm-rounds` more rounds of both trees) and judged on all its rounds. Rows (bf16, H 16, head 128;
`--quick`: H 2, head 32, tiny shapes, also on a CPU):

  fwd+bwd    hgrn2(o, g, i, β, o_act="silu", scale=K^-½) at B8 T2048, B2 T8192, B1 T32768, β ~ U[0.01, 0.9)
             learnable
  small β    the same at B8 T2048 with β ~ U[0, 0.9) and some channels of every head at 0, 1e-6 and 2^-9
  fast forgetting
             the small-β case with those channels' g lowered by 2: they forget by ~e^-75 per 32 tokens (as a head of
             layer 0, whose bound is 0, may learn); once with the bound learnable, once (fixed bound) without a
             gradient, as layer 0's
  closed gates
             fast forgetting with every channel of a quarter of the heads at β 0 and g lowered by 6 more, the bound
             learnable: most of those gates lie below SMALL_F, the small-gates dβ kernel's worst case; it and fast
             forgetting also with every β raised to 0.01 (β ≥ 0.01): the same gates without small bounds, the time
             a small bound's exact dβ is measured against
  fwd        the forward alone, without autograd, at the three shapes, and on the fast-forgetting inputs
  fused chunk
             fwd+bwd at B8 T512 and B4 T512 (and the latter fast forgetting) with a bound that takes no gradient:
             the fused-chunk kernels, which small training inputs take
  varlen     fwd+bwd of 16K tokens packed from sequences of random lengths (cu_seqlens)
  reverse    fwd+bwd at B8 T2048 with reverse=True
  layer      the HGRU2 layer with its projections (d 2048), fwd+bwd at B8 T2048, its bound learnable
  cross entropy
             the LM head's linear_cross_entropy, fwd+bwd over 8192 rows of d 2048, at GPT-2's vocabulary (50265,
             an odd row length) and at 32000

    hgrn2 bench gate                      # the working tree against main; the table, then the verdict
    hgrn2 bench gate --base HEAD~1 --fla  # another base; fla's chunk_gla as a third column where it applies
"""

from __future__ import annotations

import argparse
import importlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

from hgrn2.bench.common import (
    add_output_argument,
    command_of,
    environment,
    fla_available,
    format_table,
    rel_err,
    write_result,
)
from hgrn2.bench.common import time_ms as _time_ms

BASE_PACKAGE = "hgrn2_base"
SUBPACKAGES = ("ops", "layers")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base", default="main", help="git revision of the base tree (default: main)")
    p.add_argument("--base-dir", default=None, metavar="DIR",
                   help="a folder holding the base tree's hgrn2/ package, in place of --base")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds per row (default 5)")
    p.add_argument("--confirm-rounds", type=int, default=10,
                   help="more rounds for a row past the tolerance, judged on all its rounds (default 10; 0: none)")
    p.add_argument("--tolerance", type=float, default=0.05,
                   help="a row fails when the tree's time exceeds the base's by more than this share (default 0.05)")
    p.add_argument("--rows", default=None, help="comma-separated row names to run (default: all)")
    p.add_argument("--fla", action="store_true", help="also time fla's chunk_gla where a row has an fla twin")
    p.add_argument("--quick", action="store_true", help="tiny shapes, a smoke run (works on the CPU)")
    add_output_argument(p)


# ---------------------------------------------------------------------------------------------------------------
# the base tree as a second package


def base_source(args: argparse.Namespace, tmp: Path) -> Path:
    """The base tree's hgrn2/ folder: --base-dir's, or one exported from git at --base."""
    if args.base_dir is not None:
        src = Path(args.base_dir) / "hgrn2"
        if not (src / "ops" / "__init__.py").is_file():
            raise ValueError(f"--base-dir: {args.base_dir} holds no hgrn2/ops package")
        return src
    root = Path(__file__).resolve().parents[2]
    try:
        archive = subprocess.run(["git", "archive", args.base, "hgrn2"], cwd=root, capture_output=True, check=True,
                                 timeout=60).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        detail = getattr(e, "stderr", b"") or b""
        raise ValueError(f"--base: cannot export {args.base!r} from git ({detail.decode().strip() or e}); "
                         "pass --base-dir on a machine without the repository") from None
    subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive, check=True)
    return tmp / "hgrn2"


def import_base(src: Path, tmp: Path):
    """Import the base tree's ops and layers as `hgrn2_base` (an empty package __init__: no model registration),
    with the custom-op namespace `hgrn2::` renamed `hgrn2_base::`; returns the package."""
    dst = tmp / "pkg" / BASE_PACKAGE
    dst.mkdir(parents=True)
    (dst / "__init__.py").write_text('"""The base tree of `hgrn2 bench gate`."""\n')
    for sub in SUBPACKAGES:
        shutil.copytree(src / sub, dst / sub)
    for path in dst.rglob("*.py"):
        text = path.read_text()
        new = re.sub(r'"hgrn2::', f'"{BASE_PACKAGE}::', text)
        new = re.sub(r"\b(from|import) hgrn2\.", rf"\1 {BASE_PACKAGE}.", new)
        if new != text:
            path.write_text(new)
    sys.path.insert(0, str(dst.parent))
    try:
        return importlib.import_module(BASE_PACKAGE)
    finally:
        sys.path.remove(str(dst.parent))


# ---------------------------------------------------------------------------------------------------------------
# rows


def dims(quick: bool) -> tuple[int, int, list[tuple[int, int]]]:
    """(heads, head size, the three (B, T) shapes)."""
    if quick:
        return 2, 32, [(2, 64), (1, 128), (1, 256)]
    return 16, 128, [(8, 2048), (2, 8192), (1, 32768)]


def op_inputs(B, T, H, K, device, dtype, small_beta=False, fast_forget=False, closed=False, seed=0,
              bound_grad=True, floor=0.0):
    """o, g, i [B, T, H, K] (g ~ 2·N(0, 1), as `bench ops`) and a learnable β [H, K]: U[0.01, 0.9), or with
    `small_beta` U[0, 0.9) with channels 0-2 of every head at 0, 1e-6 and 2^-9; `fast_forget` (with small_beta):
    those channels' g lowered by 2, so that they forget by ~e^-75 per 32 tokens (f ≈ 0.1); `closed` (with
    fast_forget): also every channel of the first quarter of the heads at β 0 with g lowered by 6, so that most of
    their gates are below SMALL_F. bound_grad=False: β takes no gradient (as layer 0's bound, and the fused-chunk
    kernels' training case). `floor`: every β raised to at least this, the same gates without small bounds."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    o, g, i = (torch.randn(B, T, H, K, generator=gen) for _ in range(3))
    g = 2 * g
    lb = torch.rand(H, K, generator=gen) * 0.89 + 0.01
    if small_beta or fast_forget or closed:
        lb = torch.rand(H, K, generator=gen) * 0.9
        lb[:, :3] = torch.tensor([0.0, 1e-6, 2.0 ** -9])
    if fast_forget or closed:
        g[..., :3] -= 2.0
    if closed:
        lb[:max(1, H // 4)] = 0.0
        g[:, :, :max(1, H // 4)] -= 6.0
    leaves = [x.to(device, dtype).requires_grad_() for x in (o, g, i)]
    return leaves + [lb.clamp(min=floor).to(device).requires_grad_(bound_grad)]


def packed_lengths(total: int, seed: int = 0) -> list[int]:
    """Random sequence lengths (64 to total/4 tokens) that add up to `total`."""
    gen = torch.Generator().manual_seed(seed)
    lens, left = [], total
    while left > 0:
        n = min(left, int(torch.randint(64, max(65, total // 4), (1,), generator=gen)))
        lens.append(n)
        left -= n
    return lens


def op_call(ops, args, dy, *, grad: bool, **kw) -> Callable[[], object]:
    """A step of `ops.hgrn2` on args: forward without autograd, or forward and backward with output gradient dy."""
    K = args[0].shape[-1]

    def fwd():
        with torch.no_grad():
            return ops.hgrn2(*args, o_act="silu", scale=K ** -0.5, **kw)

    def fwd_bwd():
        y, _ = ops.hgrn2(*args, o_act="silu", scale=K ** -0.5, **kw)
        y.backward(dy)

    return fwd_bwd if grad else fwd


def fla_call(args, dy, *, grad: bool) -> Callable[[], object] | None:
    """fla's HGRN2Attention glue + chunk_gla on the same inputs (None without fla)."""
    if not fla_available():
        return None
    from fla.ops.gla import chunk_gla

    o, g, i, lb = args
    K = o.shape[-1]

    def run():
        lg = torch.logaddexp(lb.log(), torch.log1p(-lb) + F.logsigmoid(g))
        return chunk_gla(F.silu(o), (1 - lg.exp()).to(i), i, lg, scale=K ** -0.5, state_v_first=True)

    def fwd():
        with torch.no_grad():
            return run()

    def fwd_bwd():
        run()[0].backward(dy)

    return fwd_bwd if grad else fwd


def rows_spec(quick: bool, device, dtype) -> list[dict]:
    """Each row: name, kwargs of the call, inputs, and whether it runs the backward."""
    H, K, shapes = dims(quick)
    spec = []
    for B, T in shapes:
        spec.append(dict(name=f"fwd+bwd B{B} T{T}", grad=True, inputs=op_inputs(B, T, H, K, device, dtype)))
    B0, T0 = shapes[0]
    spec.append(dict(name=f"small β B{B0} T{T0}", grad=True,
                     inputs=op_inputs(B0, T0, H, K, device, dtype, small_beta=True)))
    for case in ("fast_forget", "closed"):  # each beside the same gates with every bound raised to 0.01 at least
        label = "fast forgetting" if case == "fast_forget" else "closed gates"
        for floor in (0.0, 0.01):
            spec.append(dict(name=f"{label}{' β ≥ 0.01' if floor else ''} B{B0} T{T0}", grad=True,
                             inputs=op_inputs(B0, T0, H, K, device, dtype, floor=floor, **{case: True})))
    spec.append(dict(name=f"fast forgetting fixed bound B{B0} T{T0}", grad=True,
                     inputs=op_inputs(B0, T0, H, K, device, dtype, fast_forget=True, bound_grad=False)))
    if dtype != torch.float32:  # fp32 takes its own blocks and dot precision: its two training rows, without fla,
        for small in (False, True):  # whose fp32 autotuning takes minutes and is not what the gate compares
            spec.append(dict(name=f"{'small β' if small else 'fwd+bwd'} fp32 B{B0} T{T0}", grad=True, fla=False,
                             inputs=op_inputs(B0, T0, H, K, device, torch.float32, small_beta=small)))
    for B, T in shapes:
        spec.append(dict(name=f"fwd B{B} T{T}", grad=False, inputs=op_inputs(B, T, H, K, device, dtype)))
    spec.append(dict(name=f"fwd fast forgetting B{B0} T{T0}", grad=False,
                     inputs=op_inputs(B0, T0, H, K, device, dtype, fast_forget=True)))
    # the fused-chunk kernels' training case: small inputs (tokens × heads below the chunk-parallel threshold, not few
    # long sequences) and a bound without a gradient; B/2 sequences split V (the split backward, 32-token steps). No
    # fla column: its kernels would autotune again at these shapes (minutes)
    Tf = T0 // 4
    for Bf, fast in ((B0, False), (B0 // 2, False), (B0 // 2, True)):
        spec.append(dict(name=f"fused chunk{' fast forgetting' if fast else ''} B{Bf} T{Tf}", grad=True, fla=False,
                         inputs=op_inputs(Bf, Tf, H, K, device, dtype, fast_forget=fast, bound_grad=False)))
    lens = packed_lengths(B0 * T0)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    spec.append(dict(name=f"varlen {len(lens)} seqs T{B0 * T0}", grad=True, kw=dict(cu_seqlens=cu),
                     inputs=op_inputs(1, B0 * T0, H, K, device, dtype)))
    spec.append(dict(name=f"reverse B{B0} T{T0}", grad=True, kw=dict(reverse=True),
                     inputs=op_inputs(B0, T0, H, K, device, dtype)))
    spec.append(dict(name=f"layer d{H * K} B{B0} T{T0}", grad=True, layer=True, shape=(B0, T0, H * K, K)))
    N, d = (64, 32) if quick else (8192, 2048)
    for V in (50265, 32000):
        spec.append(dict(name=f"cross entropy V{V} N{N}", grad=True, ce=(N, d, V)))
    return spec


def select_rows(spec: list[dict], rows: str | None) -> list[dict]:
    """The rows of spec that `--rows` names (comma-separated names or their first words; None: all)."""
    if not rows:
        return spec
    wanted = {r.strip() for r in rows.split(",")}
    spec = [s for s in spec if s["name"] in wanted or s["name"].split(" ")[0] in wanted]
    if not spec:
        raise ValueError(f"--rows: none of {sorted(wanted)} names a row")
    return spec


def layer_calls(trees: dict, shape, device, dtype) -> tuple[dict[str, Callable[[], object]], list[torch.Tensor]]:
    """Each tree's HGRU2 (layer 1, the same weights) forward+backward on one input, its bound learnable."""
    B, T, d, K = shape
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(B, T, d, generator=gen).to(device, dtype).requires_grad_()
    dy = torch.randn(B, T, d, generator=gen).to(device, dtype)
    lb = (torch.rand(d, generator=gen) * 0.9).to(device).requires_grad_()
    mods, calls = {}, {}
    for name, pkg in trees.items():
        layer = importlib.import_module(f"{pkg}.layers.hgru2").HGRU2(d, layer_idx=1, expand_ratio=K).to(device, dtype)
        if mods:
            layer.load_state_dict(next(iter(mods.values())).state_dict())
        mods[name] = layer
        calls[name] = lambda layer=layer: layer(x, lower_bound=lb)[0].backward(dy)
    return calls, [x, lb]


def ce_calls(trees: dict, shape, device, dtype) -> tuple[dict[str, Callable[[], object]], list[torch.Tensor], dict]:
    """Each tree's linear_cross_entropy forward+backward on one input, and the trees' largest relative difference
    (loss and both gradients)."""
    N, d, V = shape
    gen = torch.Generator().manual_seed(2)
    h = torch.randn(N, d, generator=gen).to(device, dtype).requires_grad_()
    w = (torch.randn(V, d, generator=gen) * d ** -0.5).to(device, dtype).requires_grad_()
    labels = torch.randint(0, V, (N,), generator=gen).to(device)
    calls, outs = {}, []
    for name, pkg in trees.items():
        ce = importlib.import_module(f"{pkg}.ops.cross_entropy").linear_cross_entropy
        calls[name] = lambda ce=ce: ce(h, w, labels).backward()
        loss = ce(h, w, labels)
        outs.append([loss.detach(), *torch.autograd.grad(loss, (h, w))])
    return calls, [h, w], {"max_rel_diff": max(rel_err(a, b) for a, b in zip(*outs))}


def time_row(calls: dict[str, Callable[[], object]], rounds: int, confirm_rounds: int, tolerance: float,
             time_fn: Callable[[Callable[[], object]], float]) -> dict[str, list[float]]:
    """Each call's times over `rounds` interleaved rounds (alternating which goes first). A row whose tree median
    is past the tolerance gets `confirm_rounds` more rounds of base and tree (a short row can move by more than the
    tolerance between rounds of identical code); its verdict is then the median of all its rounds."""
    t = {name: [] for name in calls}

    def more(names, n):
        for r in range(n):
            for name in names if r % 2 == 0 else reversed(names):
                t[name].append(time_fn(calls[name]))

    more(list(calls), rounds)
    if statistics.median(t["tree"]) > (1 + tolerance) * statistics.median(t["base"]):
        more(["base", "tree"], confirm_rounds)
    return t


def verdicts(times: dict[str, dict[str, list[float]]], tolerance: float) -> list[dict]:
    """Per row: each tree's median over rounds, the ratio tree / base and whether it passes."""
    out = []
    for name, t in times.items():
        base, tree = statistics.median(t["base"]), statistics.median(t["tree"])
        row = {"row": name, "base_ms": base, "tree_ms": tree, "ratio": tree / base,
               "passed": tree <= (1 + tolerance) * base, "rounds": len(t["tree"])}
        if t.get("fla"):
            row["fla_ms"] = statistics.median(t["fla"])
            row["tree_vs_fla"] = tree / row["fla_ms"]
        out.append(row)
    return out


def run(args: argparse.Namespace) -> int:
    if args.rounds < 1:
        raise ValueError(f"--rounds: expected at least 1, got {args.rounds}")
    if args.confirm_rounds < 0:
        raise ValueError(f"--confirm-rounds: expected a count ≥ 0, got {args.confirm_rounds}")
    if not args.tolerance >= 0:
        raise ValueError(f"--tolerance: expected a share ≥ 0, got {args.tolerance}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    spec = select_rows(rows_spec(args.quick, device, dtype), args.rows)
    with tempfile.TemporaryDirectory() as tmp:
        import_base(base_source(args, Path(tmp)), Path(tmp))
        import hgrn2.ops as tree_ops

        base_ops = importlib.import_module(f"{BASE_PACKAGE}.ops")
        warmup, rep = (2, 5) if args.quick else (10, 40)

        def time_ms(fn, inputs):
            return _time_ms(fn, device=device, inputs=inputs, warmup=warmup, rep=rep, grad_to_none=inputs)

        times, checks = {}, {}
        base = args.base_dir or args.base

        def record(complete: bool):
            rows = verdicts(times, args.tolerance)
            for row in rows:
                row.update(checks.get(row["row"], {}))
            # written after every row: a run cut short (a time limit) still leaves the rows it finished
            path = write_result(args.out, "gate", environment(device), rows, command_of(args), quick=args.quick,
                                base=str(base), rounds=args.rounds, confirm_rounds=args.confirm_rounds,
                                tolerance=args.tolerance, complete=complete, rows_total=len(spec))
            return rows, path

        for s in spec:
            if s.get("layer"):
                calls, inputs = layer_calls({"base": BASE_PACKAGE, "tree": "hgrn2"}, s["shape"], device, dtype)
            elif s.get("ce"):
                calls, inputs, checks[s["name"]] = ce_calls({"base": BASE_PACKAGE, "tree": "hgrn2"}, s["ce"], device,
                                                            dtype)
            else:
                inputs = s["inputs"]
                dy = torch.randn_like(inputs[2])
                kw = s.get("kw", {})
                calls = {"base": op_call(base_ops, inputs, dy, grad=s["grad"], **kw),
                         "tree": op_call(tree_ops, inputs, dy, grad=s["grad"], **kw)}
                checks[s["name"]] = agreement(base_ops, tree_ops, inputs, dy, s["grad"], kw)
                if args.fla and not kw and s.get("fla", True):
                    fla = fla_call(inputs, dy, grad=s["grad"])
                    if fla is not None:
                        calls["fla"] = fla
            for fn in calls.values():  # compile and autotune outside the timed rounds
                fn()
            t = time_row(calls, args.rounds, args.confirm_rounds, args.tolerance, partial(time_ms, inputs=inputs))
            times[s["name"]] = t
            more = f" (past the tolerance: judged on {len(t['tree'])} rounds)" if len(t["tree"]) > args.rounds else ""
            print(f"{s['name']}: " + ", ".join(f"{n} {statistics.median(v):.4f} ms" for n, v in t.items()) + more,
                  flush=True)
            if len(times) < len(spec):
                record(complete=False)
        rows, path = record(complete=True)
    print(f"wrote {path}")
    print(format_table(rows, [("row", "row", ""), ("base ms", "base_ms", ".4f"), ("tree ms", "tree_ms", ".4f"),
                              ("tree / base", "ratio", ".3f"), ("fla ms", "fla_ms", ".4f"),
                              ("tree / fla", "tree_vs_fla", ".3f"), ("max rel. diff", "max_rel_diff", ".1e")]))
    slow = [r["row"] for r in rows if not r["passed"]]
    if slow:
        print(f"gate: FAILED, more than {args.tolerance:.0%} slower than {base}: {', '.join(slow)}")
        return 1
    print(f"gate: passed, every row within {args.tolerance:.0%} of {base}")
    return 0


def agreement(base_ops, tree_ops, inputs, dy, grad: bool, kw: dict) -> dict:
    """The largest relative difference between the two trees' output (and gradients, dβ included)."""
    outs = []
    for ops in (base_ops, tree_ops):
        leaves = [x.detach().clone().requires_grad_(grad and x.requires_grad) for x in inputs]
        with torch.set_grad_enabled(grad):
            y, _ = ops.hgrn2(*leaves, o_act="silu", scale=inputs[0].shape[-1] ** -0.5, **kw)
        got = [y.detach()]
        if grad:
            got += list(torch.autograd.grad(y, [x for x in leaves if x.requires_grad], dy))
        outs.append(got)
    return {"max_rel_diff": max(rel_err(a, b) for a, b in zip(*outs))}
