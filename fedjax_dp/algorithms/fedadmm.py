"""FedADMM (Gong, Li, Freris 2022).

The client adds <y_i, w - w^t> + rho/2 ||w - w^t||^2; after training
y_i <- y_i + rho (w_i - w^t). The dual y_i stays on the client. What it
uploads, `admm_upload` (a static choice, one term each):

  augmented   (w_i - w^t) + y_i / rho: its augmented model w_i + y_i / rho less
              w^t, so the server's mean is ADMM's consensus step under full
              participation; under partial participation the cohort's duals do
              not sum to zero, and their mean / rho moves w^t every round
  change      (w_i - w^t) + (y_i - y_i^old) / rho = 2 (w_i - w^t): the change of
              its augmented model, as the authors' code sends it
              (github.com/YonghaiGong/FedADMM, src/update.py), which vanishes
              at a fixed point whoever takes part
"""

import jax
import jax.numpy as jnp

from fedjax_dp.algorithms.base import LocalTerm, dot, reciprocal, sq_dist, zeros_like_tree


def _loss(inputs, hp):
  p, w_t = inputs.params, inputs.global_params
  return dot(inputs.client_state["dual"], jax.tree.map(jnp.subtract, p, w_t)) \
      + 0.5 * hp["rho"] * sq_dist(p, w_t)


def _new_dual(inputs, state, rho):
  """y_i + rho (w_i - w^t) where the client took part, else its old dual."""
  return inputs.keep(jax.tree.map(lambda y, d: y + rho * d, state["dual"], inputs.delta),
                     state["dual"])


def _finish(inputs, upload, state, hp):
  new_dual = _new_dual(inputs, state, hp["rho"])
  inv_rho = reciprocal(hp["rho"])
  upload = jax.tree.map(lambda d, y: d + y * inv_rho, inputs.delta, new_dual)
  return upload, {**state, "dual": new_dual}, {}


def _init_client(params) -> dict:
  return {"dual": zeros_like_tree(params)}


def _finish_change(inputs, upload, state, hp):
  new_dual = _new_dual(inputs, state, hp["rho"])
  # (y_new - y_old) / rho = delta exactly: the upload is 2 delta, not a rounded quotient
  upload = jax.tree.map(lambda d: d + d, inputs.delta)
  return upload, {**state, "dual": new_dual}, {}


def fedadmm(rho: float = 0.01, upload: str = "augmented") -> LocalTerm:
  """The FedADMM term with penalty `rho`, uploading as `upload` says (module
  docstring): structure, a static choice, beside its number."""
  finish = {"augmented": _finish, "change": _finish_change}.get(upload)
  if finish is None:
    raise ValueError(f"fedadmm upload {upload!r}: allowed are augmented, change")
  return LocalTerm(name="fedadmm", hparams={"rho": rho}, init_client=_init_client, loss=_loss,
                   finish=finish)
