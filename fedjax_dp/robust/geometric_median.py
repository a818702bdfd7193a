"""geometric_median: RFA (Pillutla, Kakade, Harchaoui 2022), the smoothed
Weiszfeld algorithm for the weighted geometric median
  argmin_z sum_i w_i ||z - u_i||
of the participants' updates: start at the weighted mean, then `geomed_iters` times
  beta_i = w_i / max(eps, ||z - u_i||),   z <- sum_i beta_i u_i / sum_i beta_i
with the smoothing eps = `geomed_eps` (the authors' defaults: 5 passes, i.e. the
mean and 4 Weiszfeld steps, and 1e-6). Masked slots have weight 0; non-finite
uploads are left out first (flagged). Each step is one pass over the [m, d] uploads.
"""

import jax
import jax.numpy as jnp

from fedjax_dp.kernels.weighted_mean import EXACT
from fedjax_dp.robust.base import Aggregator, metrics, on_finite_uploads


def weiszfeld(u, mask, weights, iters, eps):
  """[d] the smoothed-Weiszfeld estimate after `iters` steps (u finite)."""
  w = jnp.where(mask, weights, 0.0).astype(u.dtype)
  u = jnp.where(mask[:, None], u, 0.0)

  def step(_, z):
    dist = jnp.sqrt(jnp.sum(jnp.square(u - z), axis=1))
    beta = w / jnp.maximum(eps, dist)
    return jnp.matmul(beta, u, precision=EXACT) / jnp.maximum(jnp.sum(beta), 1e-30)

  start = jnp.matmul(w, u, precision=EXACT) / jnp.maximum(jnp.sum(w), 1e-30)
  return jax.lax.fori_loop(0, iters, step, start)


def _aggregate(u, mask, weights, state, hp):
  return weiszfeld(u, mask, weights, hp["iters"], hp["eps"]), state, metrics()


_AGGREGATE = on_finite_uploads(_aggregate)


def geometric_median(iters: int = 4, eps: float = 1e-6) -> Aggregator:
  """`iters` Weiszfeld steps from the weighted mean, distances smoothed by `eps`."""
  return Aggregator(name="geometric_median", aggregate=_AGGREGATE,
                    hparams={"iters": iters, "eps": eps})
