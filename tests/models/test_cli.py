import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from hgrn2.cli import main as cli_main
from hgrn2.models import HGRN2Config, HGRN2ForCausalLM


def test_generate_cli_matches_generate(tmp_path, capsys):
    words = ["<pad>", "<s>", "</s>", "<unk>"] + [f"w{i}" for i in range(124)]
    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                  unk_token="<unk>")
    torch.manual_seed(0)
    model = HGRN2ForCausalLM(HGRN2Config.from_preset("tiny", pad_token_id=0, eos_token_id=2)).eval()
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    prompts = ["w5 w7 w9", "w1"]
    assert cli_main(["generate", str(tmp_path), "--prompt", prompts[0], "--prompt", prompts[1],
                     "--max-new-tokens", "5", "--device", "cpu"]) == 0
    printed = capsys.readouterr().out.splitlines()
    for prompt, line in zip(prompts, printed):
        ids = tok(prompt, return_tensors="pt").input_ids
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=5, do_sample=False,
                             pad_token_id=0)
        assert line == tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    assert len(printed) == 2
