"""Byzantine clients, for exercising the robust aggregators.

A fixed `byzantine_fraction` of the clients (drawn once from the run seed) is
malicious. Whenever one of them takes part, the server receives, instead of
its honest upload u (after its pipeline and any DP mechanism: a malicious
client follows no protocol):

  sign_flip   -byzantine_scale * u
  scaled      byzantine_scale * u          (model boosting)
  gaussian    N(0, byzantine_scale^2) per coordinate, from the client's own key
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

ATTACKS = ("sign_flip", "scaled", "gaussian")
MALICIOUS_DRAW = 2**20 + 1  # folded into the run seed, apart from the round keys


def malicious_clients(num_clients: int, fraction: float, seed: int) -> np.ndarray:
  """bool [num_clients]: the floor(fraction N) malicious clients, by a seeded permutation."""
  count = int(np.floor(fraction * num_clients + 1e-9))
  perm = np.random.default_rng([seed, MALICIOUS_DRAW]).permutation(num_clients)
  out = np.zeros(num_clients, bool)
  out[perm[:count]] = True
  return out


def attack(u: jax.Array, key: jax.Array, kind: str, scale: float) -> jax.Array:
  """A malicious client's upload in place of its honest flat update u [d]."""
  if kind == "sign_flip":
    return -scale * u
  if kind == "scaled":
    return scale * u
  if kind == "gaussian":
    return scale * jax.random.normal(key, u.shape, u.dtype)
  raise ValueError(f"byzantine attack {kind!r}: allowed are {', '.join(ATTACKS)}")


def replace_uploads(uploads, malicious: jax.Array, client_ids: jax.Array, key: jax.Array,
                    kind: str, scale: float):
  """The cohort's uploads (leaves [m, ...]) with each malicious participant's
  (`malicious` [m] bool) replaced by its attack, drawn from fold_in(key, id)."""
  from jax.flatten_util import ravel_pytree

  def one(u, is_bad, cid):
    flat, unravel = ravel_pytree(u)
    return unravel(jnp.where(is_bad, attack(flat, jax.random.fold_in(key, cid), kind, scale),
                             flat))
  return jax.vmap(one)(uploads, malicious, client_ids)
