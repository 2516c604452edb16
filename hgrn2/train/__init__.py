"""Training: language models (config, trainer, optimisers, checkpoints, distributed, CUDA-graph steps) and the
experiment commands (MQAR, ablations, LRA, images) over `sweep.py`."""
