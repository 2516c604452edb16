"""README's results (every block between `<!-- results` and `<!-- /results -->`) quote BENCHMARKS.md: every number there
appears in BENCHMARKS.md as written, so a headline cannot drift from the measured tables."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
# a number not glued to a word (B8, H200, bf16 are names): 0.318, 8, 2048, 7.1e-06, 0.6.0
NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)*(?:e[-+]\d+)?(?![\w.]*[a-df-zA-DF-Z_])")


def numbers(text: str) -> list[str]:
    return NUMBER.findall(text)


def readme_results() -> str:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"<!-- results.*?-->(.*?)<!-- /results -->", text, re.S)
    assert blocks, "README.md: no <!-- results --> ... <!-- /results --> block"
    return "\n".join(blocks)


def test_number_pattern():
    assert numbers("0.318× fla, B8 × T2048, 8×2048, 7.1e-06, fla 0.6.0, H200, bf16, 21.4 GiB, 374M") == \
        ["0.318", "8", "2048", "7.1e-06", "0.6.0", "21.4"]


def test_readme_results_quote_benchmarks():
    quoted = numbers(readme_results())
    assert len(quoted) > 20  # the block holds the headline figures
    measured = set(numbers((ROOT / "BENCHMARKS.md").read_text()))
    missing = sorted(set(quoted) - measured)
    assert not missing, f"README.md's results quote numbers that BENCHMARKS.md does not hold: {missing}"
