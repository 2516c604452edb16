"""Data: synthetic tasks (MQAR) and text corpora (prepare, packed loading). Import the submodules directly."""
