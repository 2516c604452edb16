"""Data: text corpora (assembly, prepare, packed loading), MQAR, LRA and the idx files of Fashion-MNIST. Import the
submodules directly."""
