"""fla HGRN2 checkpoint → hgrn2: same logits and greedy generations (fla's own kernels run under TRITON_INTERPRET
on the CPU; its Triton autotuner is told every config takes 0 ms)."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

import hgrn2  # noqa: F401
from hgrn2.bench.common import rel_err
from hgrn2.cli import main as cli_main
from hgrn2.models import HGRN2ForCausalLM
from hgrn2.models.convert import convert_fla_checkpoint, greedy_decode

fla_models = pytest.importorskip("fla.models", reason="flash-linear-attention not installed")
DEV = "cuda" if torch.cuda.is_available() else "cpu"  # fla's Triton kernels take CUDA tensors where a GPU exists


@pytest.fixture(autouse=True)
def _no_autotune_benchmark(monkeypatch):
    """fla's kernels take their first config: its autotuner cannot time in the interpreter, and on a GPU it
    spends minutes compiling and timing configs that do not change the results checked here."""
    import triton.runtime.autotuner as autotuner
    monkeypatch.setattr(autotuner.Autotuner, "_bench", lambda self, *a, config=None, **k: [0.0, 0.0, 0.0])


def fla_model(device=DEV, **kw):
    cfg = dict(vocab_size=128, hidden_size=32, num_hidden_layers=3, expand_ratio=8, intermediate_size=64,
               fuse_norm=False, fuse_swiglu=False, fuse_cross_entropy=False)
    torch.manual_seed(3)
    m = fla_models.HGRN2ForCausalLM(fla_models.HGRN2Config(**{**cfg, **kw})).to(device).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "lower_bounds" in name:
                p.copy_(torch.randn_like(p))
            elif "norm" in name:
                p.copy_(1 + 0.3 * torch.randn_like(p))
            elif "i_proj" in name:  # small inputs make g_norm's eps (1e-5 in fla) matter for the check below
                p.copy_(0.01 * torch.randn_like(p))
            else:
                p.copy_(0.3 * torch.randn_like(p))
    return m


@pytest.mark.parametrize("short_conv", [False, True])
@torch.no_grad()
def test_convert_matches_fla_logits_and_greedy(tmp_path, short_conv):
    ref = fla_model(use_short_conv=short_conv)
    ref.save_pretrained(tmp_path / "fla")
    assert cli_main(["convert-fla", str(tmp_path / "fla"), str(tmp_path / "ours")]) == 0
    ours = AutoModelForCausalLM.from_pretrained(tmp_path / "ours", backend="reference").to(DEV).eval()
    assert type(ours) is HGRN2ForCausalLM and ours.config.g_norm_eps == 1e-5
    ids = torch.randint(0, 128, (2, 12), device=DEV)
    want = ref(ids).logits
    assert rel_err(ours(ids).logits, want) <= 1e-4
    # the eps really matters at these magnitudes: fla's norm_eps (1e-6) in g_norm would not pass
    wrong = AutoModelForCausalLM.from_pretrained(tmp_path / "ours", backend="reference", g_norm_eps=1e-6)
    wrong = wrong.to(DEV).eval()
    assert rel_err(wrong(ids).logits, want) > 1e-3
    mask = torch.ones_like(ids)
    b = ours.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False)
    assert torch.equal(greedy_decode(ref, ids, 4), b)  # fla's own cache, decoded by hand


@torch.no_grad()
def test_convert_bin_weights_and_tied_head(tmp_path):
    ref = fla_model(tie_word_embeddings=True)
    ref.save_pretrained(tmp_path / "fla")
    for f in (tmp_path / "fla").glob("*.safetensors"):
        f.unlink()
    state = {k: v for k, v in ref.state_dict().items() if k != "lm_head.weight"}
    torch.save(state, tmp_path / "fla" / "pytorch_model.bin")
    ours = convert_fla_checkpoint(tmp_path / "fla", tmp_path / "ours")
    assert ours.lm_head.weight.data_ptr() == ours.model.embeddings.weight.data_ptr()
    loaded = HGRN2ForCausalLM.from_pretrained(tmp_path / "ours", backend="reference").to(DEV).eval()
    ids = torch.randint(0, 128, (1, 9), device=DEV)
    assert rel_err(loaded(ids).logits, ref(ids).logits) <= 1e-4


@torch.no_grad()
def test_convert_without_g_norm_weight(tmp_path):
    ref = fla_model(elementwise_affine=False)
    assert ref.model.layers[0].attn.g_norm.weight is None
    ref.save_pretrained(tmp_path / "fla")
    ours = convert_fla_checkpoint(tmp_path / "fla", tmp_path / "ours")
    assert torch.equal(ours.model.layers[0].attn.g_norm.weight, torch.ones(32))
    loaded = HGRN2ForCausalLM.from_pretrained(tmp_path / "ours", backend="reference").to(DEV).eval()
    ids = torch.randint(0, 128, (1, 9), device=DEV)
    assert rel_err(loaded(ids).logits, ref(ids).logits) <= 1e-4


def _edit_config(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("changes, match", [
    (dict(attn={"layers": [1], "num_heads": 4}), "hybrid"),
    (dict(attnres_block_size=2), "attnres"),
    (dict(model_type="gla"), "model_type"),
    (dict(num_hidden_layers=4), "missing: model.layers.3"),
    (dict(vocab_size=100), r"model.embeddings.weight: checkpoint \(128, 32\) vs config \(100, 32\)"),
])
def test_convert_refuses_clearly(tmp_path, changes, match):
    fla_model().save_pretrained(tmp_path / "fla")
    _edit_config(tmp_path / "fla", **changes)
    with pytest.raises(ValueError, match=match):
        convert_fla_checkpoint(tmp_path / "fla", tmp_path / "ours")


@torch.no_grad()
def test_convert_bf16_logits_and_greedy(tmp_path):
    """bf16, fla's own initialisation (std 0.02) with random lower bounds and norm weights: logits within 1e-2
    of fla's and the same greedy tokens. On the CPU fla's kernels run in Triton's interpreter, which
    `hgrn2.ops.triton` makes round bf16 as a GPU does (its truncating casts would double fla's error)."""
    import hgrn2.ops.triton  # noqa: F401  (applies the interpreter fix)

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = fla_models.HGRN2Config(vocab_size=1000, hidden_size=256, num_hidden_layers=2, expand_ratio=64,
                                 fuse_cross_entropy=False)
    torch.manual_seed(0)
    ref = fla_models.HGRN2ForCausalLM(cfg).eval()
    for name, p in ref.named_parameters():
        if "lower_bounds" in name:
            p.copy_(torch.randn_like(p))
        elif "norm" in name:
            p.copy_(1 + 0.2 * torch.randn_like(p))
    ref.save_pretrained(tmp_path / "fla")
    convert_fla_checkpoint(tmp_path / "fla", tmp_path / "ours")
    ours = HGRN2ForCausalLM.from_pretrained(tmp_path / "ours", dtype=torch.bfloat16).to(dev).eval()
    ref = ref.to(dev, torch.bfloat16)
    ids = torch.randint(0, 1000, (2, 64), device=dev)
    assert rel_err(ours(ids).logits, ref(ids).logits) <= 1e-2
    mask = torch.ones_like(ids)
    want = greedy_decode(ref, ids, 8)
    assert torch.equal(ours.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False), want)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@torch.no_grad()
def test_convert_bf16_cuda_long_sequence(tmp_path):
    ref = fla_model("cuda", hidden_size=256, expand_ratio=64, intermediate_size=512).to(torch.bfloat16)
    ref.save_pretrained(tmp_path / "fla")
    convert_fla_checkpoint(tmp_path / "fla", tmp_path / "ours")
    ours = HGRN2ForCausalLM.from_pretrained(tmp_path / "ours", dtype=torch.bfloat16).cuda().eval()
    ids = torch.randint(0, 128, (2, 300), device="cuda")
    assert rel_err(ours(ids).logits.float(), ref(ids).logits.float()) <= 2e-2


@pytest.mark.slow
def test_gpu_convert_script_reports_divergences_as_near_ties(tmp_path):
    """`hgrn2 bench convert-fla` (the GPU evidence of the conversion) runs on the CPU too; where bf16
    greedy generations of fla and ours part, the fp64 reference finds the two tokens a near-tie."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(root)}
    subprocess.run([sys.executable, "-m", "hgrn2.cli", "bench", "convert-fla", "--device", "cpu", "--hidden", "64",
                    "--expand", "16", "--layers", "2", "--prompt-len", "20", "--new-tokens", "60",
                    "--out", str(tmp_path)], cwd=root, env=env, check=True, capture_output=True)
    fp32, bf16 = json.loads((tmp_path / "convert_fla.json").read_text())["rows"]
    assert fp32["ours_vs_fp64"] < 1e-5 and fp32["ours_vs_fla"] < 1e-5 and fp32["greedy_equal"]
    assert bf16["ours_vs_fp64"] < 2e-2 and bf16["ours_vs_fla"] < 2e-2 and bf16["argmax_ours_fla"] > 0.95
    assert bf16["greedy_equal"] or bf16["near_tie"]
