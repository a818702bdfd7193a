"""A model as a pure `(init, apply)` pair over a params pytree (Model), so that a
cohort of per-client parameters is the same pytree with a leading client axis;
`from_flax` wraps any deterministic flax.linen module so, and `as_model` does it
for the built-in modules (registry.py).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np


class Model(NamedTuple):
  init: Callable[[jax.Array], dict]         # key -> params
  apply: Callable[[dict, jax.Array], jax.Array]  # (params, x [B, ...]) -> outputs [B, ...]
  name: str
  # (params, x) -> (outputs, representation [B, h]): MOON's; None when the model has none
  apply_with_features: Callable | None = None


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
