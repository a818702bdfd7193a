"""TopkSDP-FL's contrastive term L_con, reconstructed (the paper lost its
equations); `contrastive_form` picks the reading, one term each:

  'bounded'     + mu1/2 ||w - w^t||^2 - mu2/2 min(||w - w_prev||^2, r^2)
  'moon_params' + mu1 * -log(e^{s_g/tau} / (e^{s_g/tau} + e^{s_p/tau})),
                s_g = cos(w, w^t), s_p = cos(w, w_prev) over flattened parameters

Both pull towards the global model and push from the client's previous local
model, and both are bounded below (the plain -||w - w_prev||^2 is not).
w_prev is the client's local model from its previous participation (w^t the
first time): the shared `prev_model` slot (objective.py).
"""

import jax
import jax.numpy as jnp

from fedjax_dp.algorithms.base import LocalTerm, contrastive_nll, cosine, sq_dist


@jax.custom_vjp
def bounded_push(p, prev, r2) -> jax.Array:
  """-1/2 min(||p - prev||^2, r2), gradient -(p - prev) inside the radius, 0 outside
  (at the boundary 1/2 of it, as jnp.minimum's); none to r2. The backward pass
  recomputes p - prev from p and prev: autodiff would keep the difference from
  the forward pass, materializing a full-size array every local step that the
  distance's reduction and the gradient would otherwise each compute fused.
  r2 is an ordinary argument, so it may be a traced hyperparameter."""
  return -0.5 * jnp.minimum(sq_dist(p, prev), r2)


def _bounded_push_fwd(p, prev, r2):
  # (prev - p), not (p - prev): equal squares, but a different expression from the
  # backward pass's, so that XLA does not merge the two into one materialized array
  d2 = sq_dist(prev, p)
  return -0.5 * jnp.minimum(d2, r2), (p, prev, d2, r2)


def _bounded_push_bwd(res, g):
  p, prev, d2, r2 = res
  scale = -g * jnp.where(d2 < r2, 1.0, jnp.where(d2 == r2, 0.5, 0.0))
  return (jax.tree.map(lambda a, b: scale * (a - b), p, prev),
          jax.tree.map(jnp.zeros_like, prev), jnp.zeros_like(r2))


bounded_push.defvjp(_bounded_push_fwd, _bounded_push_bwd)


def _bounded_loss(inputs, hp):
  p = inputs.params
  return 0.5 * hp["mu1"] * sq_dist(p, inputs.global_params) + hp["mu2"] * bounded_push(
      p, inputs.prev_model, hp["radius_sq"])


def _moon_params_loss(inputs, hp):
  p = inputs.params
  return hp["mu1"] * contrastive_nll(cosine(p, inputs.global_params),
                                     cosine(p, inputs.prev_model), hp["tau"])


def contrastive(form: str = "bounded", mu1: float = 0.01, mu2: float = 0.005,
                radius: float = 1.0, tau: float = 0.5) -> LocalTerm:
  """The contrastive term in the reading `form` ('bounded' reads mu1, mu2 and radius;
  'moon_params' mu1 and tau): structure, a static choice, beside its numbers."""
  if form == "bounded":
    # r^2 squared here, in float64, and rounded once (as the Python constant was): a
    # float32 hyperparameter squared in the round would round twice
    return LocalTerm(name="contrastive", loss=_bounded_loss, needs_prev_model=True,
                     hparams={"mu1": mu1, "mu2": mu2, "radius_sq": radius ** 2})
  if form == "moon_params":
    return LocalTerm(name="contrastive", loss=_moon_params_loss, needs_prev_model=True,
                     hparams={"mu1": mu1, "tau": tau})
  raise ValueError(f"contrastive form {form!r}: allowed are bounded, moon_params")
