"""Data: synthetic tasks (MQAR) and text corpora. Import the submodules directly."""
