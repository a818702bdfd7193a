"""LSTM language models that predict every next token: TFF / FedJAX's Shakespeare
character model and the Stack Overflow next-word model."""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp


class LSTMLanguageModel(nn.Module):
  """Token ids [B, T] -> logits [B, T, vocab], each position's next token: an
  embedding, `layers` LSTMs of `units`, an optional dense projection to `project`
  units, and a dense layer to the vocabulary. The ids may come as floats (the
  store keeps inputs as float32; ids below 2^24 are exact).

  Shakespeare (McMahan et al. 2017; FedJAX's create_lstm_shakespeare_model):
  embed 8, two layers of 256, no projection. Stack Overflow (Reddi et al. 2021,
  'Adaptive Federated Optimization'; 4,050,748 parameters at a vocabulary of
  10,004): embed 96, one layer of 670, projection to 96 (TFF's baseline; FedJAX's
  puts a tanh before the projection). flax's LSTM starts its forget-gate bias at
  0, Keras's and Haiku's at 1."""
  vocab: int
  embed: int = 8
  units: int = 256
  layers: int = 2
  project: int | None = None

  @nn.compact
  def __call__(self, x, with_features: bool = False):
    h = nn.Embed(self.vocab, self.embed)(x.astype(jnp.int32))   # [B, T, embed]
    for _ in range(self.layers):
      # the zero state made from the inputs: inside the round's shard_map a constant
      # would be device-invariant while the scan's carried state varies per device
      zero = jnp.zeros((h.shape[0], self.units), h.dtype) + 0.0 * h[:, 0, :1]
      h = nn.RNN(nn.OptimizedLSTMCell(self.units))(h, initial_carry=(zero, zero))
    if self.project:
      h = nn.Dense(self.project)(h)                             # [B, T, project]
    logits = nn.Dense(self.vocab)(h)                            # [B, T, vocab]
    return (logits, h[:, -1]) if with_features else logits
