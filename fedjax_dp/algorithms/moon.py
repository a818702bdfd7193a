"""MOON (Li, He, Song 2021): the client adds
  mu * mean_b -log(e^{c_g/tau} / (e^{c_g/tau} + e^{c_p/tau})),
c_g = cos(z, z_g), c_p = cos(z, z_prev): representations (the last hidden
layer) of the batch under w, w^t and w_prev (the shared `prev_model` slot)."""

import jax
import jax.numpy as jnp

from fedjax_dp.algorithms.base import LocalTerm, contrastive_nll


def _row_cosine(a, b):
  return jnp.sum(a * b, -1) / jnp.maximum(
      jnp.linalg.norm(a, axis=-1) * jnp.linalg.norm(b, axis=-1), 1e-12)


def _loss(inputs, hp):
  xb, z = inputs.xb, inputs.features
  _, z_g = inputs.features_fn(inputs.global_params, xb)
  _, z_p = inputs.features_fn(inputs.prev_model, xb)
  nll = contrastive_nll(_row_cosine(z, jax.lax.stop_gradient(z_g)),
                        _row_cosine(z, jax.lax.stop_gradient(z_p)), hp["tau"])
  m = inputs.mb.astype(nll.dtype)
  return hp["mu"] * jnp.sum(nll * m) / jnp.maximum(jnp.sum(m), 1.0)


def moon(mu: float = 1.0, tau: float = 0.5) -> LocalTerm:
  """The MOON term with weight `mu` and temperature `tau`."""
  return LocalTerm(name="moon", hparams={"mu": mu, "tau": tau}, loss=_loss,
                   needs_prev_model=True, needs_features=True)
