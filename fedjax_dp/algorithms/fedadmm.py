"""FedADMM (Gong, Li, Freris 2022).

The client adds <y_i, w - w^t> + rho/2 ||w - w^t||^2; after training
y_i <- y_i + rho (w_i - w^t), and it uploads (w_i - w^t) + y_i / rho (its
augmented model less w^t). The dual y_i stays on the client.
"""

import jax
import jax.numpy as jnp

from fedjax_dp.algorithms.base import LocalTerm, dot, reciprocal, sq_dist, zeros_like_tree


def _loss(inputs, hp):
  p, w_t = inputs.params, inputs.global_params
  return dot(inputs.client_state["dual"], jax.tree.map(jnp.subtract, p, w_t)) \
      + 0.5 * hp["rho"] * sq_dist(p, w_t)


def _finish(inputs, upload, state, hp):
  rho = hp["rho"]
  new_dual = inputs.keep(jax.tree.map(lambda y, d: y + rho * d, state["dual"], inputs.delta),
                         state["dual"])
  inv_rho = reciprocal(rho)
  upload = jax.tree.map(lambda d, y: d + y * inv_rho, inputs.delta, new_dual)
  return upload, {**state, "dual": new_dual}, {}


TERM = LocalTerm(name="fedadmm", hparams=lambda cfg: {"rho": cfg.admm_rho},
                 init_client=lambda params: {"dual": zeros_like_tree(params)},
                 loss=_loss, finish=_finish, keys=("admm_rho",))
