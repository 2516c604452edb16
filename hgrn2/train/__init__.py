"""Training: one engine (`engine.py`: the step, schedule, distribution, checkpoints, exact resume, guarantees) and
its tasks: the language model (config, trainer, optimisers), MQAR, LRA and image-classification runs. Commands over
many runs (sweeps, ablations, the LRA table) are in `hgrn2.experiments`."""
