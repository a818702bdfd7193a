"""FedDyn (Acar et al. 2021, "Federated Learning Based on Dynamic Regularization").

Client i minimises
  L_i(w) - <g_i, w> + alpha/2 ||w - w^t||^2
with its own state g_i (init 0, an estimate of grad L_i at its optimum), and
after training sets g_i <- g_i - alpha (w_i - w^t); it uploads w_i - w^t as
FedAvg does. The server keeps h (init 0):
  h <- h - alpha (1/N) sum_{i in S} (w_i - w^t),    N = num_clients,
  w^{t+1} = mean_{i in S} w_i - h / alpha,
so `server_update` adds -h/alpha to the released mean update (with the preset
server optimizer, sgd at server_lr 1, that is the paper's step). The sum is
taken as cohort_size times the released mean: the round's mean is FedAvg's
example-weighted one (the paper's is uniform; the same for equal sizes), and
under central DP the server only has the noised mean of the clipped updates.
So h and the correction are post-processing of what was released; g_i never
leaves the client. A round whose update is not applied keeps h.
"""

import jax
import jax.numpy as jnp

from fedjax_dp.algorithms.base import LocalTerm, dot, reciprocal, sq_dist, zeros_like_tree


def _loss(inputs, hp):
  p = inputs.params
  return -dot(inputs.client_state["feddyn_g"], p) \
      + 0.5 * hp["alpha"] * sq_dist(p, inputs.global_params)


def _finish(inputs, upload, state, hp):
  g = state["feddyn_g"]
  new_g = jax.tree.map(lambda gi, d: gi - hp["alpha"] * d, g, inputs.delta)
  return upload, {**state, "feddyn_g": inputs.keep(new_g, g)}, {}


def _server_update(update, server_state, ctx, hp):
  alpha = hp["alpha"]
  share = jnp.asarray(ctx.cohort_size, jnp.float32) / ctx.num_clients
  h = jax.tree.map(lambda h, u: jnp.where(ctx.applied, h - alpha * share * u, h),
                   server_state["feddyn_h"], update)
  inv_alpha = reciprocal(alpha)
  update = jax.tree.map(lambda u, hh: u - hh * inv_alpha, update, h)
  return update, {**server_state, "feddyn_h": h}


def _init_client(params) -> dict:
  return {"feddyn_g": zeros_like_tree(params)}


def _init_server(params) -> dict:
  return {"feddyn_h": zeros_like_tree(params)}


def feddyn(alpha: float = 0.01) -> LocalTerm:
  """The FedDyn term with regulariser weight `alpha`."""
  return LocalTerm(
      name="feddyn", hparams={"alpha": alpha},
      init_client=_init_client, init_server=_init_server, loss=_loss, finish=_finish,
      server_update=_server_update, excludes=("fedadmm",),
      exclusion_reason="both keep a dual variable of the same consensus constraint; use one")
