"""The character LSTM of the FedAvg and LEAF papers' Shakespeare task."""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp


class CharLSTM(nn.Module):
  """Character ids [B, T] -> logits [B, vocab] for the next character: an
  embedding of 8, two LSTM layers of 256 units, a dense layer over the last
  step's output (McMahan et al. 2017; LEAF's Shakespeare baseline). The ids may
  come as floats (the store keeps inputs as float32; ids below 2^24 are exact)."""
  vocab: int
  embed: int = 8
  units: int = 256
  layers: int = 2

  @nn.compact
  def __call__(self, x, with_features: bool = False):
    h = nn.Embed(self.vocab, self.embed)(x.astype(jnp.int32))   # [B, T, embed]
    for _ in range(self.layers):
      # the zero state made from the inputs: inside the round's shard_map a constant
      # would be device-invariant while the scan's carried state varies per device
      zero = jnp.zeros((h.shape[0], self.units), h.dtype) + 0.0 * h[:, 0, :1]
      cell = nn.OptimizedLSTMCell(self.units)
      h = nn.RNN(cell)(h, initial_carry=(zero, zero))   # [B, T, units]
    last = h[:, -1]
    logits = nn.Dense(self.vocab)(last)
    return (logits, last) if with_features else logits
