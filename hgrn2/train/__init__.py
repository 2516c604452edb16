"""Training loops and sweeps. Import the submodules directly."""
