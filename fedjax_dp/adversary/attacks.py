"""Byzantine clients, for exercising the robust aggregators.

A `byzantine_fraction` of the clients, floor(fraction N) of them, is malicious:
drawn once from the data seed (`byzantine_draw: fixed`), or afresh each round
from the round key (`round`). Whenever one of them takes part, the server
receives, instead of its honest upload u (after its pipeline: a malicious client
follows no protocol), the attack below. Each attack acts on the report the client
sends (`placement`, privacy/boundary.py): under central DP before the trusted
server's clip and noise, which bound it as any upload; under local DP after the
client's own clip and noise, as post-processing of its report:

  sign_flip   -s u
  scaled      s u                                   (model boosting)
  gaussian    N(0, s^2) per coordinate, from the client's own key
  alie        mu - z sigma                          (Baruch et al. 2019, "A little is enough")
  ipm         -s mu                                 (Xie et al. 2020, inner product manipulation)

with s = `byzantine_scale`. mu and sigma are the coordinate-wise mean and standard
deviation of the round's honest uploads (unweighted, sigma with 1/n): the attackers
of alie and ipm collude and are omniscient, they see every honest upload of the
round, and all of them send the same vector. ALIE's z is the paper's z_max for
n participants of whom m are malicious: z = Phi^-1((n - s) / n) with
s = floor(n/2 + 1) - m, the honest clients the attackers need on their side for a
majority; under a normal model of the honest values, that many lie farther from
the mean than mu - z sigma (z capped at Phi^-1(0.999) = 3.09, where the
attackers hold a majority and the formula leaves [0, 1]).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.privacy.boundary import StagePlacement

ATTACKS = ("sign_flip", "scaled", "gaussian", "alie", "ipm")
DRAWS = ("fixed", "round")
COLLUDING = ("alie", "ipm")    # they read the honest uploads' statistics
Z_CAP_P = 0.999                # ALIE's z at most Phi^-1(0.999)
MALICIOUS_DRAW = 2**20 + 1  # folded into the data seed, apart from the round keys


def placement(kind: str) -> StagePlacement:
  """Where the attack `kind` acts: on the report its client sends; the colluding
  ones read the other clients' uploads (privacy/boundary.py). A data attack's
  poisoning is inside local training ('protocol'); its boost acts on the report."""
  return StagePlacement(acts_on="sent", reads_other_uploads=kind in COLLUDING)


def malicious_clients(num_clients: int, fraction: float, seed: int) -> np.ndarray:
  """bool [num_clients]: the floor(fraction N) malicious clients, by a seeded permutation."""
  count = malicious_count(num_clients, fraction)
  perm = np.random.default_rng([seed, MALICIOUS_DRAW]).permutation(num_clients)
  out = np.zeros(num_clients, bool)
  out[perm[:count]] = True
  return out


def malicious_count(num_clients: int, fraction: float) -> int:
  return int(np.floor(fraction * num_clients + 1e-9))


def malicious_this_round(num_clients: int, count: int, key: jax.Array) -> jax.Array:
  """bool [num_clients]: `count` clients drawn uniformly without replacement from `key`."""
  perm = jax.random.permutation(key, num_clients)
  return jnp.zeros(num_clients, bool).at[perm[:count]].set(True)


def alie_z(n: jax.Array, m: jax.Array) -> jax.Array:
  """Baruch et al.'s z_max for n participants, m of them malicious:
  Phi^-1((n - s) / n) with s = floor(n/2 + 1) - m (float32 scalar)."""
  n = n.astype(jnp.float32)
  s = jnp.floor(n / 2 + 1) - m.astype(jnp.float32)
  p = jnp.clip((n - s) / jnp.maximum(n, 1.0), 0.5, Z_CAP_P)
  return jax.scipy.stats.norm.ppf(p)


def attack(u: jax.Array, key: jax.Array, kind: str, scale: float,
           honest_mean: jax.Array | None = None, honest_std: jax.Array | None = None,
           z: jax.Array | None = None) -> jax.Array:
  """A malicious client's upload in place of its honest flat update u [d]."""
  if kind == "sign_flip":
    return -scale * u
  if kind == "scaled":
    return scale * u
  if kind == "gaussian":
    return scale * jax.random.normal(key, u.shape, u.dtype)
  if kind == "alie":
    return honest_mean - z * honest_std
  if kind == "ipm":
    return -scale * honest_mean
  raise ValueError(f"byzantine attack {kind!r}: allowed are {', '.join(ATTACKS)}")


def honest_statistics(flat: jax.Array, honest: jax.Array, total: Callable = lambda t: t):
  """(mean [d], std [d]) over the rows of flat [m, d] where honest [m]; zeros if none.
  `total`: the sum over the devices of a value summed over this device's rows
  (placement.executor.sum_over_devices inside the round; identity on one slice)."""
  n = jnp.maximum(total(jnp.sum(honest.astype(flat.dtype))), 1.0)
  rows = jnp.where(honest[:, None], flat, 0.0)      # an absent slot may hold garbage
  mean = total(jnp.sum(rows, axis=0)) / n
  var = total(jnp.sum(jnp.where(honest[:, None], jnp.square(flat - mean), 0.0), axis=0)) / n
  return mean, jnp.sqrt(var)


def replace_uploads(uploads, malicious: jax.Array, client_ids: jax.Array, key: jax.Array,
                    kind: str, scale: float, mask: jax.Array | None = None,
                    total: Callable = lambda t: t):
  """The cohort's uploads (leaves [m, ...]) with each malicious participant's
  (`malicious` [m] bool, participants only) replaced by its attack, drawn from
  fold_in(key, id). `mask` [m]: the participants (None: every slot); the colluding
  attacks read the honest ones, mask & ~malicious, of the whole cohort: `total`
  sums a count or a row sum over the devices that hold the rest of it."""
  from jax.flatten_util import ravel_pytree
  flat = jax.vmap(lambda u: ravel_pytree(u)[0])(uploads)                # [m, d]
  unravel = ravel_pytree(jax.tree.map(lambda a: a[0], uploads))[1]
  stats = {}
  if kind in COLLUDING:
    mask = jnp.ones(malicious.shape, bool) if mask is None else mask
    stats["honest_mean"], stats["honest_std"] = honest_statistics(flat, mask & ~malicious, total)
    stats["z"] = alie_z(total(jnp.sum(mask, dtype=jnp.int32)),
                        total(jnp.sum(malicious & mask, dtype=jnp.int32)))

  def one(u, is_bad, cid):
    return jnp.where(is_bad, attack(u, jax.random.fold_in(key, cid), kind, scale, **stats), u)
  return jax.vmap(unravel)(jax.vmap(one)(flat, malicious, client_ids))


def make_byzantine(num_clients: int, fraction: float, seed: int, kind: str, scale: float,
                   tag: int, draw: str = "fixed", draw_tag: int | None = None
                   ) -> Callable | None:
  """The round's attack stage: (uploads [m, ...], ids [m], mask [m], round_key) ->
  uploads with each malicious participant's replaced, drawn from
  fold_in(fold_in(round_key, tag), id); None without malicious clients, or for a
  data attack (poisoning.py) but the backdoor's boost (model replacement: scale u).
  draw 'round': the malicious clients are drawn from fold_in(round_key, draw_tag)."""
  if fraction <= 0:
    return None
  from fedjax_dp.adversary.poisoning import DATA_ATTACKS
  if kind in DATA_ATTACKS:   # poisoned data, honest protocol; a backdoor may boost its upload
    if kind != "backdoor" or scale == 1.0:
      return None
    kind = "scaled"
  if draw not in DRAWS:
    raise ValueError(f"byzantine_draw {draw!r}: allowed are {', '.join(DRAWS)}")
  fixed = malicious_clients(num_clients, fraction, seed)
  count = malicious_count(num_clients, fraction)

  def apply(uploads, ids, mask, round_key, total=lambda t: t):
    table = (jnp.asarray(fixed) if draw == "fixed" else
             malicious_this_round(num_clients, count, jax.random.fold_in(round_key, draw_tag)))
    return replace_uploads(uploads, table[ids] & mask, ids, jax.random.fold_in(round_key, tag),
                           kind, scale, mask, total)
  return apply


def make_data_redraw(num_clients: int, fraction: float, kind: str, draw: str, offset: int,
                     draw_tag: int) -> Callable | None:
  """A data attack under `byzantine_draw: round`: (rows [m, max_n] of example
  indices, ids [m], round_key) -> rows, where each client malicious this round
  (the draw of make_byzantine, from fold_in(round_key, draw_tag)) reads its
  examples `offset` further on, in the poisoned copy of every client's data that
  the store holds after the clean one (experiment/setup.py). None otherwise."""
  from fedjax_dp.adversary.poisoning import DATA_ATTACKS
  if fraction <= 0 or kind not in DATA_ATTACKS or draw != "round":
    return None
  count = malicious_count(num_clients, fraction)

  def apply(rows, ids, round_key):
    table = malicious_this_round(num_clients, count, jax.random.fold_in(round_key, draw_tag))
    return rows + jnp.where(table[ids], offset, 0).astype(rows.dtype)[:, None]
  return apply
