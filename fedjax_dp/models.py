"""Flax models: an MLP of any depth and the 2-conv + 2-dense CNN of FedAvg papers.

Models are pure `(init, apply)` pairs over a params pytree, so that a cohort of
per-client parameters is just the same pytree with a leading client axis.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp


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


class CNN(nn.Module):
  """Conv(32, 5x5) -> pool -> Conv(64, 5x5) -> pool -> Dense(hidden) -> Dense(classes).

  The CNN of McMahan et al. 2017 and of the TopkSDP-FL paper's CIFAR-10 runs;
  'SAME' padding so that it also fits 8x8 digits, 28x28 and 32x32 images.
  """
  num_classes: int
  dense: int = 512

  @nn.compact
  def __call__(self, x, with_features: bool = False):  # x: [batch, H, W, C]
    x = nn.max_pool(nn.relu(nn.Conv(32, (5, 5), padding="SAME")(x)), (2, 2), (2, 2))
    x = nn.max_pool(nn.relu(nn.Conv(64, (5, 5), padding="SAME")(x)), (2, 2), (2, 2))
    x = x.reshape((x.shape[0], -1))
    x = nn.relu(nn.Dense(self.dense)(x))
    logits = nn.Dense(self.num_classes)(x)
    return (logits, x) if with_features else logits


class Model(NamedTuple):
  init: Callable[[jax.Array], dict]         # key -> params
  apply: Callable[[dict, jax.Array], jax.Array]  # (params, x [B, ...]) -> logits [B, classes]
  name: str
  apply_with_features: Callable = None      # (params, x) -> (logits, representation [B, h])


def make_model(name: str, input_shape: tuple[int, ...], num_classes: int,
               hidden: Sequence[int] = (200, 200)) -> Model:
  if name == "mlp":
    module = MLP(hidden=tuple(hidden), num_classes=num_classes)
  elif name == "cnn":
    if len(input_shape) != 3:
      raise ValueError(f"model 'cnn' needs image inputs [H, W, C]; got input shape {input_shape}")
    module = CNN(num_classes=num_classes, dense=hidden[0] if hidden else 512)
  else:
    raise ValueError(f"unknown model {name!r} (allowed: mlp, cnn)")
  dummy = jnp.zeros((1,) + tuple(input_shape), jnp.float32)
  return Model(init=lambda key: module.init(key, dummy)["params"],
               apply=lambda params, x: module.apply({"params": params}, x),
               name=name,
               apply_with_features=lambda params, x: module.apply({"params": params}, x,
                                                                  with_features=True))


def num_params(params) -> int:
  return int(sum(x.size for x in jax.tree.leaves(params)))
