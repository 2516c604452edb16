"""Data: synthetic tasks (MQAR) and text corpora (assembly, prepare, packed loading). Import the submodules directly."""
