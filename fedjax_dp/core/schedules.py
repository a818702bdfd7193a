"""The clients' learning rate by round: constant, or cosine decay to lr_min (the
server's: training/server.cosine_factor)."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import optax



def learning_rate_schedule(schedule: str, lr: float, lr_min: float,
                           rounds: int) -> Callable[[jax.Array], jax.Array]:
  """Client learning rate as a function of the round (constant, or cosine from lr to
  lr_min over `rounds`)."""
  if schedule == "constant":
    return lambda r: jnp.float32(lr)
  return optax.cosine_decay_schedule(lr, decay_steps=rounds, alpha=lr_min / lr)


def round_learning_rate(hp: dict, round_index: jax.Array, schedule: str, rounds: int):
  """learning_rate_schedule's value from the hyperparameters as data (hparams.py):
  optax's cosine decay, lr (span c + alpha), with the same roundings."""
  if schedule == "constant":
    return hp["lr"]
  count = jnp.minimum(round_index, float(rounds))
  cosine = 0.5 * (1 + jnp.cos(jnp.pi * count / float(rounds)))
  return hp["lr"] * (hp["lr_span"] * cosine ** 1.0 + hp["lr_alpha"])
