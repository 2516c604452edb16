"""The paper's experiments as commands over many training runs: `hgrn2 mqar`, `hgrn2 ablate` and `hgrn2 lra` (their
runs train through `hgrn2.train`), with the sweep runner they share (`sweep.py`), their tables, plots and records."""
