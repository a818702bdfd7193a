"""The clients' learning rate by round: constant, or cosine decay to lr_min."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import optax

from fedjax_dp.config import Config


def learning_rate_schedule(cfg: Config) -> Callable[[jax.Array], jax.Array]:
  """Client learning rate as a function of the round (constant or cosine to lr_min)."""
  if cfg.lr_schedule == "constant":
    return lambda r: jnp.float32(cfg.lr)
  return optax.cosine_decay_schedule(cfg.lr, decay_steps=cfg.rounds, alpha=cfg.lr_min / cfg.lr)


def round_learning_rate(hp: dict, round_index: jax.Array, schedule: str, rounds: int):
  """learning_rate_schedule's value from the hyperparameters as data (hparams.py):
  optax's cosine decay, lr (span c + alpha), with the same roundings."""
  if schedule == "constant":
    return hp["lr"]
  count = jnp.minimum(round_index, float(rounds))
  cosine = 0.5 * (1 + jnp.cos(jnp.pi * count / float(rounds)))
  return hp["lr"] * (hp["lr_span"] * cosine ** 1.0 + hp["lr_alpha"])
