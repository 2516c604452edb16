"""Training: language models (config, trainer, optimisers, checkpoints, distributed, CUDA-graph steps) and the
experiment commands (MQAR and the ablations over `sweep.py`, LRA, images)."""
