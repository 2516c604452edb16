"""Language-model training: config, trainer loop, optimisers and schedules, checkpoints, distributed."""
