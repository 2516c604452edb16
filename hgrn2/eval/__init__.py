"""Evaluation: perplexity and length curves (`ppl`), the lm-eval-harness adapter (`harness`), needle-in-a-haystack
(`needle`) and SCROLLS (`scrolls`). Every command works offline on local model directories and local data."""
