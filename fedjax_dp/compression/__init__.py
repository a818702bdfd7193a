"""The client upload pipeline: clips, top-k, kept noise, shuffling (optax-style stages)."""
