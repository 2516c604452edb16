"""`hgrn2 bench vision`: training throughput (images/s) of the DeiT-Tiny-sized HGRN2 against timm's DeiT-Tiny.

Each step is forward + backward + AdamW on random 224×224 images and labels under bf16 autocast with fp32 weights
(`hgrn2.models.vision` preset `deit_tiny`, bidirectional scans on the Triton kernels on a GPU; timm's
`deit_tiny_patch16_224`, built without weights). `--warmup` untimed steps, then `--rounds` rounds of `--steps`
steps timed between CUDA synchronises, interleaved over the models; the median round is reported with the range.
Data loading is not included. Peak memory is each model's own: the most allocated during its warm-up steps beyond what
the models built before it hold.

    hgrn2 bench vision                 # writes benchmarks/results/<device>/vision.json (--out DIR: DIR/vision.json)
    hgrn2 bench vision --quick         # tiny CPU smoke run of the same code path
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from ..models.vision import HGRN2ForImageClassification, num_parameters, preset
from .common import _version, add_output_argument, command_of, environment, write_result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", default="hgrn2,hgrn2-graph,deit",
                        help="comma list of hgrn2 (ours), hgrn2-graph (ours, each step one CUDA graph, as "
                             "cuda_graph=true trains), deit (timm's)")
    parser.add_argument("--batch-size", type=int, default=128, help="images per step (the authors' per-GPU batch)")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=3)
    add_output_argument(parser)
    parser.add_argument("--quick", action="store_true", help="tiny CPU-sized smoke run (28×28 images, batch 2)")


def build(name: str, image_size: int) -> torch.nn.Module:
    if name in ("hgrn2", "hgrn2-graph"):
        patch = 14 if image_size % 14 == 0 else 16
        return HGRN2ForImageClassification(preset("deit_tiny", image_size=image_size, patch_size=patch))
    if name == "deit":
        import timm

        return timm.create_model("deit_tiny_patch16_224", pretrained=False, img_size=image_size,
                                 patch_size=16 if image_size % 16 == 0 else 14)
    raise ValueError(f"`--models`: unknown model {name!r}; choose from hgrn2, hgrn2-graph, deit")


def make_step(model, batch: int, image_size: int, device: torch.device, graph: bool = False):
    """A closure running one training step on fixed random data; `graph`: the step replayed as one CUDA graph
    (`hgrn2.train.graphed`, the trainer's cuda_graph step)."""
    x = torch.randn(batch, 3, image_size, image_size, device=device)
    y = torch.randint(0, 1000, (batch,), device=device)
    lr = torch.tensor(1e-4, device=device) if graph else 1e-4
    opt = torch.optim.AdamW(model.parameters(), lr=lr, capturable=graph)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda",
                              cache_enabled=not graph)

    def compute_loss(x, y):
        with autocast:
            return F.cross_entropy(model(x).float(), y)

    if graph:
        from ..train.graphed import GraphedStep

        graphed = GraphedStep(compute_loss, opt)
        return lambda: graphed(x, y)

    def step():
        loss = compute_loss(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def run(args: argparse.Namespace) -> int:
    if args.quick:
        args.image_size, args.batch_size, args.warmup, args.steps, args.rounds = 28, 2, 1, 1, 2
    for key in ("batch_size", "image_size", "steps", "rounds"):
        if getattr(args, key) < 1:
            raise ValueError(f"--{key.replace('_', '-')}: expected at least 1, got {getattr(args, key)}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    rows, steps = {}, {}
    torch.manual_seed(0)
    for name in names:
        resident = torch.cuda.memory_allocated() if device.type == "cuda" else 0
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        if name == "hgrn2-graph" and device.type != "cuda":
            rows[name] = {"model": name, "skipped": "CUDA graphs need a GPU"}
            continue
        try:
            model = build(name, args.image_size).to(device)
        except Exception as e:  # noqa: BLE001 - a missing or broken timm skips that model, with the reason
            if name != "deit":
                raise
            rows[name] = {"model": name, "skipped": f"{type(e).__name__}: {e}"}
            continue
        rows[name] = {"model": name, "parameters": num_parameters(model), "seconds": []}
        steps[name] = make_step(model, args.batch_size, args.image_size, device, graph=name == "hgrn2-graph")
        for _ in range(max(args.warmup, 1)):  # one step at least: the peak below is that of a whole step
            steps[name]()
        # this model's own peak (weights, optimiser state, activations), the models built before it left out
        rows[name]["peak_gib"] = ((torch.cuda.max_memory_allocated() - resident) / 2**30
                                  if device.type == "cuda" else None)
    for _ in range(args.rounds):
        for name, step in steps.items():
            _sync(device)
            t0 = time.perf_counter()
            for _ in range(args.steps):
                step()
            _sync(device)
            rows[name]["seconds"].append(time.perf_counter() - t0)
    for name in steps:
        rates = [args.batch_size * args.steps / s for s in rows[name]["seconds"]]
        rows[name].update(images_per_s=statistics.median(rates), images_per_s_range=[min(rates), max(rates)])
    for name in ("hgrn2", "hgrn2-graph"):
        if name in steps and "deit" in steps:
            rows[name]["ratio_to_deit"] = rows[name]["images_per_s"] / rows["deit"]["images_per_s"]
    env = environment(device)
    print(f"{'model':<12} {'params':>9} {'images/s':>10} {'range':>19} {'peak GiB':>9}")
    for row in rows.values():
        if "skipped" in row:
            print(f"{row['model']:<12} skipped: {row['skipped']}")
            continue
        lo, hi = row["images_per_s_range"]
        peak = "-" if row["peak_gib"] is None else f"{row['peak_gib']:.2f}"
        print(f"{row['model']:<12} {row['parameters'] / 1e6:>8.2f}M {row['images_per_s']:>10.1f} "
              f"{lo:>9.1f}–{hi:<9.1f} {peak:>9}")
    for name in ("hgrn2", "hgrn2-graph"):
        if "ratio_to_deit" in rows.get(name, {}):
            print(f"{name} / deit: {rows[name]['ratio_to_deit']:.2f}× on {env['device']}")
    env["versions"]["timm"] = _version("timm")
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "command_line")}
    settings["precision"] = "bf16 autocast" if device.type == "cuda" else "fp32"
    path = write_result(args.out, "vision", env, list(rows.values()), command_of(args), args=settings)
    print(f"wrote {path}")
    return 0
