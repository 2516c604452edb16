"""Trainer pieces: config and overrides, schedules, optimiser groups, checkpoints, bad input, a short run with
logs / save_pretrained / plot, and accumulation equivalence."""

import math
import os

import pytest
import torch

from hgrn2.cli import main
from hgrn2.train import checkpoint as ckpt
from hgrn2.train import sharded
from hgrn2.train.config import make_config, preset_names
from hgrn2.train.optim import build_optimizer, lr_at
from tests.train.helpers import base_overrides, losses, make_corpus


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("corpus") / "data")


# --- config ------------------------------------------------------------------------------------------------------


def test_presets_load_and_paper_wikitext_settings():
    assert {"wikitext103", "hgrn2-0.15b", "hgrn2-0.385b", "hgrn2-1b", "hgrn2-2.9b", "tiny"} <= set(preset_names())
    for name in preset_names():
        make_config(name, ["data=x"])
    c = make_config("wikitext103", ["data=x"])
    assert (c.seq_len, c.batch_size, c.max_steps, c.warmup_steps, c.lr) == (512, 128, 50000, 4000, 5e-4)
    assert (c.schedule, c.betas, c.weight_decay) == ("inverse_sqrt", [0.9, 0.98], 0.1)


def test_overrides_typed_and_checked():
    c = make_config("tiny", ["data=d", "lr=3e-4", "max_steps=7", "compile=true", "model.hidden_size=48"])
    assert (c.lr, c.max_steps, c.compile, c.model["hidden_size"], c.model["num_hidden_layers"]) == (3e-4, 7, True,
                                                                                                   48, 2)
    assert make_config("tiny", ["data=d", "model={hidden_size: 8}"]).model == {"hidden_size": 8}
    with pytest.raises(ValueError, match=r"unknown config key 'lrr' \(did you mean 'lr'\?\); valid keys: .*warmup"):
        make_config("tiny", ["data=d", "lrr=1"])
    with pytest.raises(ValueError, match="'max_steps' expects int, got 'abc'"):
        make_config("tiny", ["data=d", "max_steps=abc"])
    with pytest.raises(ValueError, match="'compile' expects bool"):
        make_config("tiny", ["data=d", "compile=3"])
    with pytest.raises(ValueError, match="key=value"):
        make_config("tiny", ["data"])
    with pytest.raises(ValueError, match="schedule must be one of"):
        make_config("tiny", ["data=d", "schedule=linear"])
    with pytest.raises(ValueError, match="fsdp_reshard must be one of"):
        make_config("tiny", ["data=d", "fsdp_reshard=sometimes"])
    with pytest.raises(ValueError, match="fsdp_prefetch must be >= 0, got -1"):
        make_config("tiny", ["data=d", "fsdp_prefetch=-1"])
    with pytest.raises(ValueError, match="fsdp_unit must be >= 1, got 0"):
        make_config("tiny", ["data=d", "fsdp_unit=0"])
    assert make_config("tiny", ["data=d", "fsdp_param_dtype=bf16"]).fsdp_param_dtype == "bf16"
    for lr in ("0", "1e39", "nan", "inf"):  # 1e39: the optimiser's fp32 arithmetic would overflow mid-step
        with pytest.raises(ValueError, match=r"need 0 < lr < 1e30 .*got lr="):
            make_config("tiny", ["data=d", f"lr={lr}"])
    assert make_config("tiny", []).data == ""  # a config without data is valid; training it is not
    with pytest.raises(FileNotFoundError, match="presets: "):
        make_config("no-such-preset", ["data=d"])


def test_model_key_typo():
    from hgrn2.train.model_factory import model_config

    with pytest.raises(ValueError, match=r"model \(LlamaConfig\) key 'hiden_size' \(did you mean 'hidden_size'"):
        model_config("llama", {"hiden_size": 8}, 100)
    with pytest.raises(ValueError, match="smaller than the tokenizer's vocabulary"):
        model_config("llama", {"vocab_size": 50}, 100)
    assert model_config("llama", {}, 123).vocab_size == 123


# --- optimiser and schedules -------------------------------------------------------------------------------------


def test_schedules():
    kw = dict(lr=1e-3, warmup_steps=10, max_steps=110)
    assert lr_at(0, schedule="inverse_sqrt", **kw) == pytest.approx(1e-4)
    assert lr_at(9, schedule="inverse_sqrt", **kw) == pytest.approx(1e-3)
    # fairseq: lr · sqrt(warmup) / sqrt(num_updates), num_updates = step + 1
    assert lr_at(39, schedule="inverse_sqrt", **kw) == pytest.approx(1e-3 * math.sqrt(10 / 40))
    assert lr_at(10, schedule="cosine", min_lr=1e-4, **kw) == pytest.approx(1e-3)
    assert lr_at(60, schedule="cosine", min_lr=1e-4, **kw) == pytest.approx(5.5e-4)
    assert lr_at(110, schedule="cosine", min_lr=1e-4, **kw) == pytest.approx(1e-4)
    assert lr_at(50, schedule="constant", **kw) == 1e-3


def test_weight_decay_only_on_matrices():
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    opt = build_optimizer(m, "adamw", 1e-3, (0.9, 0.98), 1e-8, 0.1)
    decayed, plain = opt.param_groups
    assert [p.shape for p in decayed["params"]] == [(4, 4)] and decayed["weight_decay"] == 0.1
    assert len(plain["params"]) == 3 and plain["weight_decay"] == 0.0
    assert isinstance(build_optimizer(m, "adam", 1e-3, (0.9, 0.98), 1e-8, 0.1), torch.optim.Adam)


def test_fused_optimizer_takes_the_same_steps(data, tmp_path):
    """fused_optimizer=true: torch's fused AdamW, the same update as the default kernels up to rounding."""
    from hgrn2.train.trainer import Trainer

    runs = {}
    for fused in (False, True):
        cfg = make_config(None, base_overrides(data, str(tmp_path / f"f{fused}"), dropout=0.0, max_steps=4,
                                               save_every=0, eval_every=0, fused_optimizer=str(fused).lower()))
        t = Trainer(cfg)
        assert t.engine.optimizer.defaults.get("fused") is (True if fused else None)
        t.train()
        runs[fused] = losses(cfg.out_dir)
    assert runs[True].keys() == runs[False].keys() and len(runs[True]) == 4
    for step, loss in runs[False].items():
        assert runs[True][step] == pytest.approx(loss, rel=1e-5)


# --- checkpoints -------------------------------------------------------------------------------------------------


def test_checkpoint_keep_last_and_fallback(tmp_path):
    d = str(tmp_path)
    assert sharded.read_latest(d) is None
    for step in (1, 2, 3, 4):
        ckpt.save(d, step, {"step": step, "w": torch.full((100,), float(step))}, keep_last=3)
    names = sorted(os.listdir(d))
    assert names == [f"step_0000000{s}.{e}" for s in (2, 3, 4) for e in ("json", "pt")]
    assert sharded.read_latest(d)["step"] == 4

    with open(os.path.join(d, "step_00000004.pt"), "r+b") as f:  # truncated
        f.truncate(100)
    with pytest.warns(UserWarning, match=r"step_00000004.pt is unusable \(size"):
        assert sharded.read_latest(d)["step"] == 3
    with open(os.path.join(d, "step_00000003.pt"), "r+b") as f:  # same size, one byte flipped
        f.seek(200)
        b = f.read(1)
        f.seek(200)
        f.write(bytes([b[0] ^ 0xFF]))
    os.remove(os.path.join(d, "step_00000002.json"))  # killed between the rename and the sidecar
    with pytest.warns(UserWarning) as rec:
        with pytest.raises(RuntimeError, match="no intact checkpoint among 3"):
            sharded.read_latest(d)
    text = " ".join(str(w.message) for w in rec)
    assert "sha256 mismatch" in text and "no checksum sidecar" in text


# --- bad input, reported before training ------------------------------------------------------------------------


def test_bad_input_stops_before_training(data, tmp_path, capsys):
    good = base_overrides(data, str(tmp_path / "run"))
    cases = [
        (["data=" + str(tmp_path / "nothing")], "no meta.json"),
        (["seq_len=100000"], "fewer than seq_len=100000"),
        (["model.vocab_size=50"], "smaller than the tokenizer's vocabulary"),
        (["batch_size=6"], "not a multiple of micro_batch_size"),
        (["warmup_step=3"], "did you mean 'warmup_steps'"),
    ]
    for extra, message in cases:
        assert main(["train", "--set", *good, *extra]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err
    assert not os.path.exists(tmp_path / "run" / "log.jsonl")
    assert main(["train", "--config", "tiny"]) == 2
    assert "data is not set: --set data=DIR" in capsys.readouterr().err


def test_print_config_needs_no_data(capsys):
    import yaml

    assert main(["train", "--config", "tiny", "--print-config", "--set", "lr=2e-3"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["data"] == "" and printed["lr"] == 2e-3 and printed["model"]["hidden_size"] == 64
    assert main(["train", "--config", "tiny", "--print-config", "--set", "lrr=1"]) == 2
    assert "did you mean 'lr'" in capsys.readouterr().err


# --- a short run --------------------------------------------------------------------------------------------------


def test_short_run_logs_saves_and_plots(data, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    out = str(tmp_path / "run")
    assert main(["train", "--set", *base_overrides(data, out, max_steps=6, eval_every=3, tensorboard=True)]) == 0
    tr, val = losses(out), losses(out, "val", "val_ppl")
    assert sorted(tr) == list(range(1, 7)) and sorted(val) == [3, 6]
    assert set(losses(out, "val", "sequences").values()) == {8}  # the final validation samples as the periodic ones
    assert all(math.isfinite(v) for v in tr.values())
    assert any(f.startswith("events.out.tfevents") for f in os.listdir(os.path.join(out, "tb")))
    assert "val loss" in capsys.readouterr().out
    final = os.path.join(out, "final")
    model = AutoModelForCausalLM.from_pretrained(final)
    saved = sharded.read_model(os.path.join(out, "checkpoints", "step_00000006"))
    assert all(torch.equal(model.state_dict()[k], v) for k, v in saved.items())
    assert os.path.isfile(os.path.join(final, "train_config.yaml"))
    png = str(tmp_path / "loss.png")
    assert main(["plot", out, "--out", png, "--smooth", "2"]) == 0
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert main(["plot", str(tmp_path / "missing")]) == 2
    assert main(["train", "--set", *base_overrides(data, out, max_steps=6, resume=False)]) == 2
    assert "holds checkpoints of an earlier run" in capsys.readouterr().err


def test_accumulation_equals_larger_micro_batch(data, tmp_path):
    from hgrn2.train.trainer import Trainer

    runs = {}
    for micro in (8, 4, 2):
        cfg = make_config(None, base_overrides(data, str(tmp_path / f"m{micro}"), dropout=0.0, max_steps=5,
                                               micro_batch_size=micro, save_every=0, eval_every=0))
        t = Trainer(cfg)
        assert t.accum == 8 // micro
        t.train()
        runs[micro] = losses(cfg.out_dir)
    for micro in (4, 2):
        for step, loss in runs[8].items():
            assert runs[micro][step] == pytest.approx(loss, rel=1e-5)


@pytest.mark.slow  # Inductor compiles C++ for every block: minutes on a 2-core machine
def test_compiled_blocks_train_like_eager(data, tmp_path):
    """compile=true (torch.compile of each block) follows the eager run's losses: the same model, data order and
    optimiser steps; only the kernels differ (Inductor's fused CPU code here)."""
    from hgrn2.train.trainer import Trainer

    runs = {}
    for compiled in (False, True):
        cfg = make_config(None, base_overrides(data, str(tmp_path / f"c{compiled}"), dropout=0.0, max_steps=3,
                                               save_every=0, eval_every=0, compile=str(compiled).lower()))
        Trainer(cfg).train()
        runs[compiled] = losses(cfg.out_dir)
    assert runs[True].keys() == runs[False].keys() and len(runs[True]) == 3
    for step, loss in runs[False].items():
        assert runs[True][step] == pytest.approx(loss, rel=1e-4)


def test_validation_line_does_not_break_the_progress_bar(data, tmp_path):
    """Bar and validation lines in one stream (as in a terminal): each validation line starts a line of its own."""
    import contextlib
    import io

    from hgrn2.train.trainer import Trainer

    cfg = make_config(None, base_overrides(data, str(tmp_path / "run"), max_steps=4, eval_every=2, save_every=0,
                                           progress=True))
    screen = io.StringIO()
    with contextlib.redirect_stdout(screen), contextlib.redirect_stderr(screen):
        Trainer(cfg).train()
    lines = [seg for line in screen.getvalue().split("\n") for seg in [line.split("\r")[-1]] if "val loss" in line]
    assert len(lines) == 2 and all(seg.startswith("step ") for seg in lines), screen.getvalue()
    assert "4/4" in screen.getvalue()


# --- a saved model is usable by transformers and `hgrn2 generate` --------------------------------------------


@pytest.fixture(scope="module")
def text_data(tmp_path_factory):
    """A real text corpus: the python-docs source, a BPE trained on it; its end-of-text id is 0."""
    from hgrn2.data.corpus import assemble
    from hgrn2.data.prepare import prepare

    root = tmp_path_factory.mktemp("text")
    src = assemble("python-docs", root / "corpus", max_bytes=60_000, progress=False)
    prepare([str(src / "train")], str(root / "data"), val_inputs=[str(src / "valid")], sample_by="document",
            train_tokenizer=320)
    return str(root / "data")


def test_saved_model_carries_tokenizer_and_special_tokens(text_data, tmp_path, capsys):
    import json
    import shutil

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hgrn2.data.packed import read_meta

    eos = read_meta(text_data)["eos_id"]
    out = str(tmp_path / "run")
    assert main(["train", "--set", *base_overrides(text_data, out, max_steps=2, eval_every=0, save_every=0)]) == 0
    final = os.path.join(out, "final")
    tok = AutoTokenizer.from_pretrained(final)
    assert (tok.eos_token, tok.eos_token_id, tok.pad_token_id, tok.bos_token_id) == ("<|endoftext|>", eos, eos, eos)
    assert tok.convert_tokens_to_ids('"') != eos  # the quote is an ordinary token
    for name in ("config.json", "generation_config.json"):
        with open(os.path.join(final, name)) as f:
            saved = json.load(f)
        assert (saved["eos_token_id"], saved["pad_token_id"], saved["bos_token_id"]) == (eos, eos, eos), name
    model = AutoModelForCausalLM.from_pretrained(final)
    assert model.config.eos_token_id == eos
    assert tok.decode(tok("The for statement")["input_ids"]) == "The for statement"
    capsys.readouterr()
    assert main(["generate", final, "--prompt", "The for", "--prompt", "x", "--max-new-tokens", "4",
                 "--device", "cpu"]) == 0
    assert len(capsys.readouterr().out.splitlines()) >= 2

    bare = tmp_path / "bare"
    shutil.copytree(final, bare)
    for f in os.listdir(bare):
        if f.startswith("tokenizer"):
            os.remove(bare / f)
    for path, message in ((str(tmp_path / "missing"), "is not a directory"), (str(bare), "has no tokenizer"),
                          (str(tmp_path), "holds no config.json")):
        assert main(["generate", path, "--prompt", "a"]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1 and "Traceback" not in err
    assert main(["generate", final, "--prompt", "a", "--max-new-tokens", "0"]) == 2
    assert "--max-new-tokens" in capsys.readouterr().err

    shutil.copy(os.path.join(final, "tokenizer.json"), bare)  # a bare tokenizer.json: no special tokens known
    assert main(["generate", str(bare), "--prompt", "The", "--max-new-tokens", "2", "--device", "cpu"]) == 0
    capsys.readouterr()
    assert main(["generate", str(bare), "--prompt", "a", "--prompt", "b", "--device", "cpu"]) == 2
    assert "no padding, end-of-text or unknown token" in capsys.readouterr().err


def test_plot_draws_a_logged_non_finite_loss_as_a_gap(tmp_path):
    """A diverged step's loss is logged as null (strict JSON); smoothing and the validation panel take it as NaN."""
    pytest.importorskip("matplotlib")
    from hgrn2.train.plot import plot

    rows = [{"kind": "train", "step": s, "tokens": 10 * s, "loss": loss} for s, loss in ((1, 2.0), (2, None), (3, 1.0))]
    rows.append({"kind": "val", "step": 3, "tokens": 30, "val_loss": None})
    plot({"run": rows}, str(tmp_path / "curves.png"), smooth=2)
    assert (tmp_path / "curves.png").stat().st_size > 0
