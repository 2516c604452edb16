"""BENCHMARKS.md sections of the experiment and generation records, rendered from small records written here (the
real ones live in benchmarks/results/; these never do)."""

import json

from hgrn2.bench import report

ENV = {"device": "NVIDIA H100 80GB HBM3", "device_slug": "h100", "versions": {"torch": "2.11.0", "triton": "3.6.0"},
       "commit": "abc1234", "date": "2026-11-20", "quick": False}


def render(tmp_path, records: dict[str, dict]) -> str:
    folder = tmp_path / "results" / "h100"
    folder.mkdir(parents=True, exist_ok=True)
    for name, extra in records.items():
        (folder / f"{name}.json").write_text(json.dumps({"benchmark": name, "command": f"hgrn2 {name}", **ENV,
                                                         **extra}))
    return report.render(tmp_path / "results")


def _lm_row(variant, ppl, complete=True, **extra):
    return {"variant": variant, "token_mixer": "hgrn2", "parameters": 2_500_000, "val_loss": 1.0 + ppl / 100,
            "val_ppl": ppl, "steps": 1500 if complete else 700, "complete": complete, **extra}


ABLATE = {"scale": "small", "data": "data: 7,000,000 training tokens", "figure": "x.png",
          "train": {"max_steps": 1500, "batch_size": 32, "seq_len": 256, "lr": 1e-3, "precision": "bf16"}}


def test_ablations_one_section_per_recipe_with_the_papers_ordering_checked(tmp_path):
    text = render(tmp_path, {
        "ablate_small_lower-bound": {**ABLATE, "recipe": "lower-bound", "title": "forget-gate lower bound on and off",
                                     "rows": [_lm_row("bound-on", 31.5), _lm_row("bound-off", 30.25)]},
        "ablate_small_expand": {**ABLATE, "recipe": "expand", "title": "perplexity against the expand ratio",
                                "rows": [_lm_row("e1", 40.0, expand_ratio=1), _lm_row("e2", 35.5, expand_ratio=2),
                                         _lm_row("e4", 36.25, expand_ratio=4), _lm_row("e8", 30.0, expand_ratio=8),
                                         _lm_row("e16", 20.0, False, expand_ratio=16)]},
        "ablate_paper_hgrn1": {**ABLATE, "scale": "paper", "recipe": "hgrn1", "title": "HGRN1 against HGRN2",
                               "rows": [_lm_row("hgrn1-complex", 24.14), _lm_row("hgrn1-real", 25.34),
                                        _lm_row("hgrn1-real-2d", 24.04), _lm_row("hgrn2", 23.1)]},
        "mqar": {"rows": [{"mixer": "hgrn2", "d_model": 64, "seq_len": 256, "kv_pairs": 16, "lr": 1e-3,
                           "final_accuracy": 0.5, "epochs_run": 64}]},
    })
    expand = text.index("## Ablation (small scale): perplexity against the expand ratio")
    bound = text.index("## Ablation (small scale): forget-gate lower bound on and off")
    paper = text.index("## Ablation (paper scale): HGRN1 against HGRN2")
    assert text.index("## MQAR") < paper < expand < bound  # after MQAR; by scale, then in the recipe file's order
    assert "The paper's ordering holds here for 3 of 3 pairs." in text[paper:expand]
    assert ("ordering holds here for 2 of 3 pairs; not for e4 < e2 (36.25 vs 35.50) (1 of 5 runs incomplete, left "
            "out).") in text
    assert "| e16 | 2.50 | 1.2000 | 20.00 | 700 | no |" in text
    assert "holds here for 0 of 1 pairs; not for bound-on < bound-off (31.50 vs 30.25)." in text
    assert "data: 7,000,000 training tokens; 1500 steps × 32 × 256 tokens" in text
    assert "![Ablation (small scale): forget-gate lower bound on and off, NVIDIA H100 80GB HBM3](" in text
    assert "Expand Ratio (Head Dimension) Ablation" in text[expand:bound]


def test_lra_table_beside_the_papers(tmp_path):
    rows = [{"task": "listops", "model": "hgrn2", "parameters": 1234, "test_acc": 0.5987, "best_val_acc": 0.6012,
             "epochs_done": 50, "epochs": 50, "steps": 37500, "time_per_epoch_s": 61.5, "stopped": None,
             "world_size": 1},
            {"task": "pathfinder", "model": "hgrn2", "parameters": 4321, "test_acc": 0.8125, "best_val_acc": 0.8,
             "epochs_done": 3, "epochs": 200, "steps": 9000, "time_per_epoch_s": 120.0, "stopped": "max_minutes",
             "world_size": 1},
            {"task": "listops", "model": "hgrn2", "settings": "hgrn1", "parameters": 999, "test_acc": 0.6052,
             "best_val_acc": 0.61, "epochs_done": 50, "epochs": 50, "steps": 37500, "time_per_epoch_s": 30.0,
             "stopped": None, "world_size": 1}]  # records before `settings` name none: the model's own
    paper = {"HGRN1 (paper)": dict(zip(("listops", "text", "retrieval", "image", "pathfinder", "pathx"),
                                       (59.95, 88.14, 94.23, 88.69, 92.92, 97.50))),
             "HGRN2 (paper)": dict(zip(("listops", "text", "retrieval", "image", "pathfinder", "pathx"),
                                       (60.52, 88.97, 95.07, 89.33, 93.95, 98.12)))}
    text = render(tmp_path, {"lra": {"rows": rows, "paper": paper}})
    assert "| model | ListOps | Text | Retrieval | Image | Pathfinder | Path-X |" in text
    assert "| HGRN2 (paper) | 60.52 | 88.97 | 95.07 | 89.33 | 93.95 | 98.12 |" in text
    assert "| hgrn2 (here) | 59.87 | - | - | - | 81.25* | - |" in text  # * : its epochs are not all done
    # records before the last and best test readings leave them out
    assert "| pathfinder | hgrn2 | 2222 | 4,321 | 81.25 | 80.00 | - | - | 3 / 200 | 9000 | 120.0 | 1 |" in text
    assert "| hgrn2, hgrn1's settings (here) | 60.52 | - | - | - | - | - |" in text
    assert "| listops | hgrn2, hgrn1's settings | 2222 | 999 | 60.52 |" in text
    assert "what it changes" not in text  # no ablation variant, no table of them
    rows.append(dict(rows[0], variant="fp32", variant_note="32-bit training", test_acc=0.61, test_acc_last=0.605,
                     test_acc_max=0.625))
    text = render(tmp_path, {"lra": {"rows": rows, "paper": paper}})
    assert "| hgrn2 [fp32] (here) | 61.00 |" in text
    assert "| listops | hgrn2 [fp32] | 2222 | 1,234 | 61.00 | 60.12 | 60.50 | 62.50 | 50 / 50 |" in text
    assert "| task | variant | what it changes |\n|---|---|---|\n| listops | fp32 | 32-bit training |" in text
    rows.append(dict(rows[0], seed=1, test_acc=0.6187))  # a second seed: the mean ± std over the two, and its row
    text = render(tmp_path, {"lra": {"rows": rows, "paper": paper}})
    assert "| hgrn2 (here) | 60.87 ± 1.41 (2) | - | - | - | 81.25* | - |" in text
    assert "| listops | hgrn2 | 1 | 1,234 | 61.87 |" in text



def test_lra_changes_against_the_preset_over_the_epochs_both_have(tmp_path):
    """A variant and another model's settings beside the preset's run of the same seed, both cut to the epochs
    both have trained; runs without curves (older records) and other seeds' presets stay out."""
    def row(curve, **kw):
        return {"task": "listops", "model": "hgrn2", "parameters": 1, "test_acc": curve[-1][2],
                "best_val_acc": curve[-1][1], "epochs_done": curve[-1][0], "epochs": 50, "steps": 1,
                "time_per_epoch_s": 1.0, "stopped": None, "world_size": 1, "seed": 2222, "curve": curve, **kw}

    preset = row([[1, 0.30, 0.29], [2, 0.50, 0.47], [3, 0.45, 0.60], [4, 0.58, 0.57]])
    wide = row([[1, 0.35, 0.33], [2, 0.50, 0.52]], variant="wide", variant_note="a wider model")
    small = row([[1, 0.20, 0.19], [2, 0.40, 0.41], [3, 0.44, 0.43]], settings="hgrn1")
    other_seed = row([[1, 0.9, 0.9], [2, 0.9, 0.9]], seed=1)
    old = dict(row([[1, 0.1, 0.1]], variant="old", variant_note="before curves"))
    del old["curve"]
    paper = {"HGRN2 (paper)": {"listops": 60.52}}
    # fewer epochs as the change (read from the preset's own run): each over its own epochs, the preset's all four
    short = row(preset["curve"][:2], variant="short", variant_note="two epochs", read_from_preset=4)
    text = render(tmp_path, {"lra": {"rows": [preset, wide, small, other_seed, old, short], "paper": paper}})
    assert ("| task | model | change | epochs | test acc % | preset's % | difference | best val % | preset's best val "
            "% |\n|---|---|---|---|---|---|---|---|---|\n"
            "| listops | hgrn2 | wide | 2 | 52.00 | 47.00 | +5.00 | 50.00 | 50.00 |\n"
            "| listops | hgrn2 | hgrn1's settings | 3 | 43.00 | 47.00 | -4.00 | 44.00 | 50.00 |\n"
            "| listops | hgrn2 | short | 2 vs 4 | 47.00 | 57.00 | -10.00 | 50.00 | 58.00 |\n") in text
    assert "| listops | old |" not in text.split("preset's best val %")[1]
    assert "| listops | short | two epochs (its row: the preset's run read at epoch 2 of the 4 it trained) |" in text

def test_vision_throughput_and_the_fashion_mnist_run(tmp_path):
    bench = [{"model": "hgrn2", "parameters": 6_100_000, "images_per_s": 3000.0, "images_per_s_range": [2990, 3010],
              "ratio_to_deit": 0.75, "peak_gib": 9.5},
             {"model": "deit", "parameters": 5_700_000, "images_per_s": 4000.0, "images_per_s_range": [3990, 4010],
              "peak_gib": 8.25}]
    curve = [{"epoch": 1, "step": 468, "train_loss": 0.9, "val_loss": 0.6, "acc1": 80.0, "acc5": 98.0, "lr": 2e-3,
              "train_images_per_s": 5000.0, "val_images": 10000},
             {"epoch": 2, "step": 936, "train_loss": 0.7, "val_loss": 0.5, "acc1": 85.5, "acc5": 99.0, "lr": 1e-3,
              "train_images_per_s": 5100.0, "val_images": 10000}]
    config = {"dataset": "fashion_mnist", "model_args": {"patch_size": 7}, "batch_size": 128, "lr": 2e-3,
              "lr_batch": 128, "precision": "bf16"}
    text = render(tmp_path, {
        "vision": {"rows": bench, "args": {"batch_size": 128, "image_size": 224, "precision": "bf16 autocast",
                                           "rounds": 3, "steps": 20}},
        "vision_fashion_mnist": {"rows": curve, "config": config, "model": "deit_tiny", "parameters": 60_000,
                                 "epochs_done": 2, "epochs": 10, "steps": 936, "best_acc1": 85.5, "acc1": 85.5,
                                 "acc5": 99.0, "val_images": 10000, "figure": "vision_fashion_mnist.png"}})
    assert text.index("## Image classification: training throughput") < text.index(
        "## Image classification: deit_tiny on Fashion-MNIST")
    assert "| hgrn2 | 6.10 | 3000 | 2990–3010 | 0.75 | 9.50 |" in text and "skipped" not in text
    assert "2 of 10 epochs, batch 128" in text and "top-1 85.50% on 10,000 validation images" in text
    assert "| 2 | 0.7000 | 0.5000 | 85.50 | 99.00 | 1.00e-03 | 5100 |" in text and "EMA" not in text


def test_generate_table_with_the_floor_and_the_speed_ups(tmp_path):
    def row(model, ms, status="ok"):
        base = {"model": model, "size": "1.3b", "hidden": 2048, "layers": 24, "batch": 1, "prompt": 2048,
                "new_tokens": 256, "params": 1_300_000_000, "floor_ms": 0.5, "status": status}
        return base if status != "ok" else {**base, "prefill_ms": 100.0, "prefill_tok_per_s": 20480.0,
                                            "forward_ms_per_step": None, "decode_ms_per_step": ms,
                                            "decode_tok_per_s": 1e3 / ms, "total_ms": 256 * ms, "peak_gib": 3.0}
    rows = [row("hgrn2-static", 0.75), row("llama-static", 3.0), row("fla", 0, "OOM")]
    text = render(tmp_path, {"generate": {"rows": rows, "args": {"prompt": 2048, "new": 256}, "copy_gb_per_s": 3000.0}})
    assert "## Generation: prefill and decode" in text and "copy bandwidth 3000 GB/s" in text
    assert "| hgrn2-static | 1.3b B1 | 20480 | 1333 | 0.75 | - | 0.500 | 1.5 | 3.0 | - | ok |" in text
    assert "| fla | 1.3b B1 |" in text and "| OOM |" in text
    assert "hgrn2-static 1.3b B1 decode tokens/s: 4.00× llama-static" in text


def test_gate_table_shows_rounds_only_where_a_row_was_confirmed():
    row = dict(base_ms=1.0, tree_ms=1.01, ratio=1.01, fla_ms=None, tree_vs_fla=None, max_rel_diff=0.0)
    rec = dict(base=".gpu/main", rounds=5, tolerance=0.05,
               rows=[dict(row, row="fwd", rounds=5), dict(row, row="varlen", rounds=15)])
    table = report.gate_table(rec)
    assert "| tree / base | rounds |" in table
    assert "| varlen | 1.0000 | 1.0100 | 1.010 | 15 |" in table
    rec["rows"][1]["rounds"] = 5
    assert "rounds |" not in report.gate_table(rec)


def test_fsdp_table_leaves_out_the_checkpoint_table_of_a_run_without_checkpoints():
    rec = dict(preset="hgrn2-1b", world_size=1, batch=40, seq_len=2048, micro=10, steps=20,
               rows=[dict(run="1 GPU", tok_per_s=74072.0, peak_gib=47.9)])
    assert "| checkpoint |" not in report.fsdp_table(rec)
    rec["checkpoints"] = [dict(checkpoint="sharded", save_s=27.4, load_s=18.8, gib=11.9)]
    assert "| sharded | 27.4 | 18.8 | 11.9 |" in report.fsdp_table(rec)


def test_engine_speed_table_names_the_base_and_each_rows_step():
    rec = dict(base="/tmp/base", rounds=2, rows=[
        dict(task="LRA ListOps hgrn2", step="eager", unit="steps/s", base=30.0, tree=33.0, ratio=1.1),
        dict(task="image training fashion_mnist", step="CUDA graph", unit="steps/s", base=50.0, tree=100.0, ratio=2.0)])
    text = report.engine_speed_table(rec)
    assert text.startswith("Base: `/tmp/base`; 2 round(s).")
    assert "| image training fashion_mnist | CUDA graph | steps/s | 50.0 | 100.0 | 2.000 |" in text
    assert "engine_speed" in report.SECTIONS and "engine_speed" in report.TABLES
