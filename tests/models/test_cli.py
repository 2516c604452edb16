import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from hgrn2.cli import console
from hgrn2.cli import main as cli_main
from hgrn2.models import HGRN2Config, HGRN2ForCausalLM


def _tokenizer():
    words = ["<pad>", "<s>", "</s>", "<unk>"] + [f"w{i}" for i in range(124)]
    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.decoder = decoders.WordPiece()  # words joined by spaces
    return PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", padding_side="left")


def test_generate_cli_matches_generate(tmp_path, capsys):
    tok = _tokenizer()
    torch.manual_seed(0)
    model = HGRN2ForCausalLM(HGRN2Config.from_preset("tiny", pad_token_id=0, eos_token_id=2)).eval()
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    prompts = ["w5 w7 w9", "w1"]
    assert cli_main(["generate", str(tmp_path), "--prompt", prompts[0], "--prompt", prompts[1],
                     "--max-new-tokens", "5", "--device", "cpu"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "--- 1/2 ---" and printed[2:4] == ["", "--- 2/2 ---"] and len(printed) == 5
    for prompt, line in zip(prompts, printed[1::3]):
        ids = tok(prompt, return_tensors="pt").input_ids
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=5, do_sample=False,
                             pad_token_id=0)
        assert line.startswith(prompt + " ")  # the prompt echoed, then its continuation
        assert line == tok.decode(out[0], skip_special_tokens=True)


def test_generate_cli_one_prompt_prints_it_with_its_continuation(tmp_path, capsys):
    tok = _tokenizer()
    HGRN2ForCausalLM(HGRN2Config.from_preset("tiny", pad_token_id=0, eos_token_id=2)).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    assert cli_main(["generate", str(tmp_path), "--prompt", "w5 w7", "--max-new-tokens", "3", "--device", "cpu"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 1 and printed[0].startswith("w5 w7 ") and len(printed[0].split()) == 5


def test_generate_cli_corrupt_weights_one_line(tmp_path, capsys):
    tok = _tokenizer()
    HGRN2ForCausalLM(HGRN2Config.from_preset("tiny", pad_token_id=0, eos_token_id=2)).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    capsys.readouterr()
    assert console(["generate", str(tmp_path), "--prompt", "w5", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(weights) in err[0] and "not a readable safetensors file" in err[0]


def test_generate_cli_refuses_empty_prompts_and_sampling_settings_out_of_range(tmp_path, capsys):
    """Checked before the model loads: one line naming the argument."""
    for extra, name in ((["--prompt", ""], "--prompt"), (["--prompt", " "], "--prompt"),
                        (["--prompt", "w5", "--sample", "--top-p", "1.5"], "--top-p"),
                        (["--prompt", "w5", "--sample", "--top-p", "0"], "--top-p"),
                        (["--prompt", "w5", "--sample", "--temperature", "0"], "--temperature"),
                        (["--prompt", "w5", "--top-k", "-1"], "--top-k")):
        assert console(["generate", str(tmp_path / "no-model"), *extra, "--device", "cpu"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"`{name}`" in err[0], err
