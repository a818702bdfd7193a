"""The built-in models by name (the config's `model`): MODELS, `make_model`.

A model is one file (its flax module) plus one ModelSource line here.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

import flax.linen as nn
import jax.numpy as jnp

from fedjax_dp.models.char_lstm import CharLSTM
from fedjax_dp.models.cnn import CNN
from fedjax_dp.models.lstm_lm import LSTMLanguageModel
from fedjax_dp.models.mlp import MLP
from fedjax_dp.models.model import Model
from fedjax_dp.models.resnet import ResNet18
from fedjax_dp.models.simple_cnn import SimpleCNN


class ModelSource(NamedTuple):
  """build(input_shape, outputs, hidden) -> the flax module; `reads_hidden`: the
  config's `hidden` shapes it (else setting it is an error); `images`: it takes
  [H, W, C] inputs only; `tokens`: it takes [T] token ids only."""
  name: str
  build: Callable[[tuple[int, ...], int, tuple[int, ...]], nn.Module]
  reads_hidden: bool = False
  images: bool = False
  tokens: bool = False


MODELS: dict[str, ModelSource] = {s.name: s for s in (
    ModelSource("mlp", lambda shape, k, hidden: MLP(hidden=tuple(hidden), num_classes=k),
                reads_hidden=True),
    ModelSource("cnn", lambda shape, k, hidden: CNN(num_classes=k,
                                                     dense=hidden[0] if hidden else 512),
                reads_hidden=True, images=True),
    ModelSource("leaf_cnn", lambda shape, k, hidden: CNN(num_classes=k, dense=2048),
                images=True),
    ModelSource("resnet18", lambda shape, k, hidden: ResNet18(num_classes=k), images=True),
    ModelSource("char_lstm", lambda shape, k, hidden: CharLSTM(vocab=k), tokens=True),
    # every position's next token (next_token task: shakespeare_tff, stackoverflow)
    ModelSource("char_lstm_seq", lambda shape, k, hidden: LSTMLanguageModel(vocab=k),
                tokens=True),
    ModelSource("word_lstm", lambda shape, k, hidden: LSTMLanguageModel(
        vocab=k, embed=96, units=670, layers=1, project=96), tokens=True),
    ModelSource("simple_cnn", lambda shape, k, hidden: SimpleCNN(num_classes=k), images=True),
)}


def reads_hidden(name: str) -> bool:
  """Whether the config's `hidden` shapes model `name` (False for custom models)."""
  return name in MODELS and MODELS[name].reads_hidden


def as_model(module: nn.Module, input_shape: tuple[int, ...], name: str) -> Model:
  """A built-in flax module (it takes with_features=True) as a Model."""
  dummy = jnp.zeros((1,) + tuple(input_shape), jnp.float32)
  return Model(init=lambda key: module.init(key, dummy)["params"],
               apply=lambda params, x: module.apply({"params": params}, x),
               name=name,
               apply_with_features=lambda params, x: module.apply({"params": params}, x,
                                                                  with_features=True))


def make_model(name: str, input_shape: tuple[int, ...], num_classes: int,
               hidden: Sequence[int] = (200, 200)) -> Model:
  """Built-in model `name` (MODELS) for inputs [B, *input_shape] and `num_classes` outputs."""
  if name not in MODELS:
    raise ValueError(f"unknown model {name!r} (allowed: {', '.join(MODELS)})")
  source = MODELS[name]
  if source.images and len(input_shape) != 3:
    raise ValueError(f"model {name!r} needs image inputs [H, W, C]; got input shape "
                     f"{input_shape}")
  if source.tokens and len(input_shape) != 1:
    raise ValueError(f"model {name!r} needs token ids [T]; got input shape {input_shape}")
  return as_model(source.build(tuple(input_shape), num_classes, tuple(hidden)), input_shape, name)
