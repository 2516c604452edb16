"""Text corpora: tokenise (prepare), pack into fixed-length sequences, load (packed)."""
