"""Training: language models (config, trainer, optimisers, checkpoints, distributed) and the MQAR sweep."""
