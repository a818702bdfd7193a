"""The local-term protocol: what one term of a client's objective owns.

A local term is an optax-style bundle of pure functions plus static
properties (a NamedTuple, no classes, nothing mutable), built by a constructor
that takes its numbers (`fedprox(mu=0.001)`), one module each in this package
and one line in `registry.TERMS`:

  init_client(params) -> dict           its slots of one client's state ({}: none)
  init_server(params) -> dict           its slots of the server state ({}: none)
  loss(inputs, hp) -> scalar            added to the client's minibatch objective
  finish(inputs, upload, state, hp)     after local training:
      -> (upload, state, contribution)  the upload, the client's new state and
                                        what it sends the server ({}: nothing)
  server_step(server_state, contrib_sum, num_clients, hp) -> server_state
                                        the server's state from the cohort's
                                        summed contributions
  server_update(update, server_state, ctx, hp) -> (update, server_state)
                                        may change the released aggregate update
                                        before the server optimizer (FedDyn's
                                        correction); post-processing of it

Any of the functions may be None (the term has no such part). `hp` is the
term's hyperparameters, a flat dict {name: number}: the constructor's numbers,
kept in the term's `hparams`. They enter as call arguments, never as constants
of the term, so that a caller may pass traced float32 (or int32) arrays (vmap
over replicas, a change without recompiling). Structure (which branch, a loop's
shape) stays static and lives in the term itself (contrastive's `form` builds
one of two terms). A config key feeds a constructor argument through its row
in config/keys.py (`feeds`): recipes.from_config builds the term from it.
"""

from __future__ import annotations

import types
from typing import Any, Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp


class LocalContext(NamedTuple):
  """What one client's objective sees: w^t, its own state, the server's state."""
  global_params: Any
  client_state: dict
  server_state: dict


class LossInputs(NamedTuple):
  """One minibatch's view for a term's loss contribution."""
  params: Any          # p: the model being trained
  global_params: Any   # w^t
  prev_model: Any      # w_prev: the client's previous local model (w^t the first time); None
                       # unless a term needs_prev_model
  client_state: dict
  server_state: dict
  xb: jax.Array        # the minibatch's inputs
  mb: jax.Array        # [B] bool: its real examples
  features: Any        # z: the representation of xb under p (needs_features), else None
  features_fn: Callable | None   # (params, xb) -> (logits, z)


class FinishInputs(NamedTuple):
  """One client's result of local training, for a term's `finish`."""
  context: LocalContext
  delta: Any           # w_i - w^t
  local_model: Any     # w_i itself (w^t + delta would round differently)
  steps: jax.Array     # K local steps, int32
  lr: jax.Array        # this round's client learning rate
  took_part: jax.Array  # bool: a padded or refused slot contributes nothing
  keep: Callable       # keep(new, old): new where took_part, else old (identity of new
                       # where the caller drops non-participants' rows)
  momentum: float      # the client optimizer's momentum (static)


class ServerContext(NamedTuple):
  """What a term's server_update knows of the round (all public to the server)."""
  num_clients: int       # N, the population
  cohort_size: Any       # the count the released mean averages over: the participants,
                         # or under central DP its fixed denominator clients_per_round
  applied: Any           # bool: the round's update is applied (someone took part and the
                         # round was not skipped); a term keeps its server state otherwise


def _none(*_):
  return {}


_NO_NUMBERS = types.MappingProxyType({})


class LocalTerm(NamedTuple):
  """One local term; see the module docstring. Static properties after the functions."""
  name: str
  hparams: Mapping[str, Any] = _NO_NUMBERS        # its numbers {name: number}
  init_client: Callable[[Any], dict] = _none
  init_server: Callable[[Any], dict] = _none
  loss: Callable | None = None
  finish: Callable | None = None
  server_step: Callable | None = None
  server_update: Callable | None = None
  needs_prev_model: bool = False   # reads the client's previous local model (a shared slot)
  needs_features: bool = False     # reads the representation z of the batch
  own_model: bool = False          # each client trains its own model, never aggregated
                                   # (SOLO): combines with no other term
  excludes: tuple[str, ...] = ()   # terms it does not combine with
  exclusion_reason: str = ""
  # Why no privacy guarantee on the upload would describe a run with this term ('': the
  # term only post-processes, or keeps its extra state on the client); recipes refuse the
  # combination with a DP mechanism / kept noise with this reason.
  outside_dp: str = ""
  outside_kept_noise: str = ""


# -------------------------------------------------------------- pytree arithmetic
def sq_dist(a, b) -> jax.Array:
  """||a - b||^2 over all leaves."""
  return sum(jnp.sum(jnp.square(x - y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def dot(a, b) -> jax.Array:
  """<a, b> over all leaves."""
  return sum(jnp.sum(x * y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def cosine(a, b) -> jax.Array:
  """cos(a, b) of the flattened pytrees."""
  return dot(a, b) / jnp.maximum(jnp.sqrt(dot(a, a) * dot(b, b)), 1e-12)


def reciprocal(x) -> jax.Array:
  """1 / x in float32, for dividing by a hyperparameter: XLA rewrites a division
  by a constant c into a product with 1 / c (folded in float32), but divides
  by a traced value. Multiplying by this gives the same numbers either way, so
  the config's Python floats and the same numbers passed as arrays agree bit
  for bit."""
  return 1.0 / jnp.asarray(x, jnp.float32)


def contrastive_nll(sim_pos: jax.Array, sim_neg: jax.Array, tau) -> jax.Array:
  """-log(e^{p/tau} / (e^{p/tau} + e^{n/tau})) = softplus((n - p) / tau)."""
  return jax.nn.softplus((sim_neg - sim_pos) * reciprocal(tau))


def zeros_like_tree(params):
  return jax.tree.map(jnp.zeros_like, params)
