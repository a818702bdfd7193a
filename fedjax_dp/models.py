"""Flax models: an MLP of any depth, the 2-conv + 2-dense CNN of FedAvg papers, and yours.

Models are pure `(init, apply)` pairs over a params pytree, so that a cohort of
per-client parameters is just the same pytree with a leading client axis.
`from_flax` wraps any deterministic flax.linen module the same way.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np


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
  apply: Callable[[dict, jax.Array], jax.Array]  # (params, x [B, ...]) -> outputs [B, ...]
  name: str
  # (params, x) -> (outputs, representation [B, h]): MOON's; None when the model has none
  apply_with_features: Callable | None = None


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


def from_flax(module: nn.Module, example_input, *, name: str | None = None) -> Model:
  """Your flax.linen module as a Model.

  example_input: a batch of inputs [B, ...] (x[:1] is enough; only its shape
  after the batch axis is read). The module must be deterministic and keep
  all its variables in 'params' (no BatchNorm statistics, no dropout key).
  apply_with_features is set when the module takes `with_features=True` and then
  returns (outputs, representation [B, h]), as the built-in models do (MOON
  needs it); otherwise it is None and MOON refuses the model.
  Raises ValueError (one line) when the module cannot be initialised that way.
  """
  name = name or type(module).__name__
  shape = tuple(np.shape(example_input))
  if len(shape) < 1 or shape[0] < 1:
    raise ValueError(f"from_flax({name}): example_input of shape {shape}: expected a batch "
                     "[B, ...] with B >= 1 (e.g. x[:1])")
  dummy = jnp.zeros((1,) + shape[1:], jnp.float32)
  try:
    variables = jax.eval_shape(module.init, jax.random.PRNGKey(0), dummy)
  except Exception as e:  # flax raises many kinds; one line with the first of its message
    raise ValueError(f"from_flax({name}): module.init(key, x) failed on inputs of shape "
                     f"{dummy.shape}: {type(e).__name__}: {_first_line(e)}") from None
  extra = sorted(k for k in variables if k != "params")
  if extra:
    raise ValueError(f"from_flax({name}): variable collections {', '.join(extra)} besides "
                     "'params': only parameters are trained and averaged (use LayerNorm or "
                     "GroupNorm instead of BatchNorm)")
  apply = lambda params, x: module.apply({"params": params}, x)
  with_features = lambda params, x: module.apply({"params": params}, x, with_features=True)
  return Model(init=lambda key: module.init(key, dummy)["params"], apply=apply, name=name,
               apply_with_features=(with_features if _has_features(with_features,
                                                                    variables["params"], dummy)
                                    else None))


def _first_line(e: Exception) -> str:
  return (str(e).strip().splitlines() or [""])[0][:200]


def _has_features(with_features: Callable, params, dummy) -> bool:
  """Whether the module's with_features=True call returns (outputs, [B, h])."""
  try:
    out = jax.eval_shape(with_features, params, dummy)
  except Exception:
    return False
  return (isinstance(out, tuple) and len(out) == 2 and len(out[1].shape) == 2
          and out[1].shape[0] == dummy.shape[0])


def num_params(params) -> int:
  return int(sum(x.size for x in jax.tree.leaves(params)))
