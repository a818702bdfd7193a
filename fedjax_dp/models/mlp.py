"""The MLP: Flatten -> [Dense -> ReLU] * len(hidden) -> Dense(outputs)."""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn


class MLP(nn.Module):
  """Flatten -> [Dense -> ReLU] * len(hidden) -> Dense(num_classes)."""
  hidden: Sequence[int]
  num_classes: int

  @nn.compact
  def __call__(self, x, with_features: bool = False):
    """x: [batch, ...] -> logits [batch, classes] (and the last hidden layer's
    activations [batch, hidden[-1]], MOON's representation, if with_features)."""
    x = x.reshape((x.shape[0], -1))
    for width in self.hidden:
      x = nn.relu(nn.Dense(width)(x))
    logits = nn.Dense(self.num_classes)(x)
    return (logits, x) if with_features else logits
