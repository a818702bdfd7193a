"""centered_clip: centred clipping (Karimireddy, He, Jaggi 2021, "Learning from
History for Byzantine Robust Optimization"). From the previous round's aggregate
v (its state; zeros at first), `cclip_iters` = L times
  v <- v + (1/n) sum_i (u_i - v) min(1, tau / ||u_i - v||),   tau = `cclip_tau`,
over the n usable participants (uniform, as the paper; weights are not used).
Each participant moves v by at most tau / n per step, however large its upload.
The result is the aggregate and the next round's state; a round with no usable
upload returns 0 and keeps the state. flagged: participants clipped in the last
step (their distance to the centre was above tau), plus non-finite uploads.
"""

import jax
import jax.numpy as jnp

from fedjax_dp.kernels.weighted_mean import EXACT
from fedjax_dp.robust.base import Aggregator, metrics, on_finite_uploads


def centered_clipping(u, mask, center, tau, iters):
  """(v [d] after `iters` clipping steps from `center`, participants clipped in the
  last step); u finite."""
  n = jnp.sum(mask, dtype=jnp.int32)
  part = mask.astype(u.dtype)

  def step(_, carry):
    v, _ = carry
    diff = u - v
    norm = jnp.sqrt(jnp.sum(jnp.square(diff), axis=1))
    scale = jnp.minimum(1.0, tau / jnp.maximum(norm, 1e-30)) * part
    clipped = jnp.sum(mask & (norm > tau), dtype=jnp.int32)
    return v + jnp.matmul(scale, diff, precision=EXACT) / jnp.maximum(n, 1).astype(u.dtype), clipped

  return jax.lax.fori_loop(0, iters, step, (center, jnp.zeros((), jnp.int32)))


def _aggregate(u, mask, weights, state, hp):
  v, clipped = centered_clipping(u, mask, state, hp["tau"], hp["iters"])
  agg = jnp.where(jnp.any(mask), v, 0.0)
  return agg, v, metrics(clipped)


_AGGREGATE = on_finite_uploads(_aggregate)


def _init(d: int, num_clients: int):
  return jnp.zeros((d,), jnp.float32)   # the last round's aggregate, the next centre


def centered_clip(tau: float = 1.0, iters: int = 1) -> Aggregator:
  """`iters` clipping steps of radius `tau` around the last round's aggregate."""
  return Aggregator(name="centered_clip", aggregate=_AGGREGATE,
                    hparams={"tau": tau, "iters": iters}, init=_init, stateful=True,
                    reports=("flagged",))
