"""SCAFFOLD (Karimireddy et al. 2020), option II.

The client adds <w, c - c_i>, i.e. the gradient step uses g - c_i + c; after
training c_i <- c_i - c + (w^t - w_i) / (K lr), K = local steps; the server
sets c <- c + (1/N) sum_{i in S} (c_i' - c_i). Option II assumes plain SGD;
with client momentum beta (heavy ball, optax's trace) K steps of a constant
gradient g move w by lr g sum_{k=1..K} (1 - beta^k) / (1 - beta), so that sum
replaces K (it is K at beta = 0), and c_i stays an estimate of the mean
gradient rather than 1 / (1 - beta) of it. A client that ran no step keeps c_i.
c_i' - c_i is sent to the server unnoised (`outside_dp`: recipes refuse DP and kept noise).
"""

import jax
import jax.numpy as jnp

from fedjax_dp.algorithms.base import LocalTerm, dot, zeros_like_tree


def effective_steps(steps: jax.Array, momentum: float) -> jax.Array:
  """sum_{k=1..K} (1 - beta^k) / (1 - beta): how many plain-SGD steps of a
  constant gradient K momentum steps move as far as (K at beta = 0)."""
  k = steps.astype(jnp.float32)
  if momentum == 0:
    return k
  b = momentum
  return (k - b * (1.0 - b ** k) / (1.0 - b)) / (1.0 - b)


def _loss(inputs, hp):
  correction = jax.tree.map(jnp.subtract, inputs.server_state["control"],
                            inputs.client_state["control"])
  return dot(inputs.params, jax.lax.stop_gradient(correction))


def _finish(inputs, upload, state, hp):
  c, c_i = inputs.context.server_state["control"], state["control"]
  steps = inputs.steps
  scale = 1.0 / (jnp.maximum(effective_steps(steps, inputs.momentum), 1e-30) * inputs.lr)
  trained = inputs.took_part & (steps > 0)
  new_c_i = jax.tree.map(lambda ci, cc, d: jnp.where(trained, ci - cc - d * scale, ci),
                         c_i, c, inputs.delta)
  contrib = {"control": jax.tree.map(lambda n, o: jnp.where(trained, n - o, 0.0), new_c_i, c_i)}
  return upload, {**state, "control": inputs.keep(new_c_i, c_i)}, contrib


def _server_step(server_state, contrib_sum, num_clients, hp):
  return {**server_state,
          "control": jax.tree.map(lambda c, s: c + s / num_clients,
                                  server_state["control"], contrib_sum["control"])}


_TERM = LocalTerm(name="scaffold", init_client=lambda params: {"control": zeros_like_tree(params)},
                  init_server=lambda params: {"control": zeros_like_tree(params)},
                  loss=_loss, finish=_finish, server_step=_server_step,
                  outside_dp="SCAFFOLD's control variates are not privatized, so no guarantee "
                             "would hold",
                  outside_kept_noise="SCAFFOLD's control-variate update c_i' - c_i is built "
                                     "from the raw, unclipped update and reaches the server "
                                     "unnoised, so no kept-noise guarantee would hold")


def scaffold() -> LocalTerm:
  """The SCAFFOLD term (no tunable number: its step count follows local training)."""
  return _TERM
