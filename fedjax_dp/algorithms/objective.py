"""The composite objective the round uses: cross-entropy plus the configured local terms.

It keeps what is shared between terms: the previous local model (one slot,
`prev_model` + `seen`, for every term that needs_prev_model) and the order in
which terms add up (registry.TERMS). Everything else is each term's own.

Hyperparameters as data: every method takes `hp`, {term name: {key: number}}.
None means the config's numbers this objective was built with (Python floats,
which is what the round passes today). A caller may instead pass the same dict
with traced float32 / int32 arrays (the seam for the round's hyperparameters as
data: a change does not recompile, replicas can be vmapped). Float32 arrays
rounded once from the config's float64 values then give the numbers the Python
constants give: a derived value (contrastive's r^2) is derived by its constructor,
and a term divides by a hyperparameter as a product with base.reciprocal (XLA
turns a division by a constant into that product, but divides by a traced
value). tests/test_stages.py checks it bit for bit for every term and rule at
the config's values; at other values XLA:CPU at LLVM level 0 can round a
product of two constants (moon's mu and 1/tau) differently, by an ulp.

Memory per client: one parameter vector each for `prev_model` (contrastive,
moon), `control` (scaffold), `dual` (fedadmm), `feddyn_g` (feddyn) and `model`
(solo), 4 d bytes each (0.8 MB for the 199,210-parameter MLP), plus one byte
for `seen`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp

from fedjax_dp.algorithms import scaffold
from fedjax_dp.algorithms.base import FinishInputs, LocalContext, LocalTerm, LossInputs
from fedjax_dp.losses import masked_cross_entropy


def _freeze(hp: dict) -> tuple:
  return tuple((name, tuple(sorted(values.items()))) for name, values in hp.items())


@dataclasses.dataclass(frozen=True)
class Objective:
  terms: tuple[LocalTerm, ...] = ()   # in registry order
  frozen_hp: tuple = ()               # the config's numbers: _freeze({term: {key: value}})
  momentum: float = 0.0               # the client optimizer's (SCAFFOLD's step count)
  # the task's loss (outputs, targets, mask) -> scalar, in place of CE (losses.py)
  data_loss: Callable = masked_cross_entropy

  # ------------------------------------------------------------------ properties
  @property
  def names(self) -> tuple[str, ...]:
    return tuple(t.name for t in self.terms)

  @property
  def solo(self) -> bool:
    """SOLO: every client trains its own model from its own last one; no aggregation."""
    return any(t.own_model for t in self.terms)

  @property
  def needs_prev_model(self) -> bool:
    return any(t.needs_prev_model for t in self.terms)

  @property
  def needs_features(self) -> bool:
    return any(t.needs_features for t in self.terms)

  def hyperparameters(self) -> dict[str, dict[str, Any]]:
    """{term: {key: number}}: the config's numbers (what hp=None means)."""
    return {name: dict(values) for name, values in self.frozen_hp}

  def _hp(self, hp):
    return self.hyperparameters() if hp is None else hp

  # ------------------------------------------------------------------ state
  def init_client_state(self, params) -> dict:
    """One client's state (no leading axis)."""
    state = {}
    if self.needs_prev_model:
      state["prev_model"] = jax.tree.map(jnp.zeros_like, params)
      state["seen"] = jnp.zeros((), bool)
    for term in self.terms:
      state.update(term.init_client(params))
    return state

  def init_server_state(self, params) -> dict:
    state = {}
    for term in self.terms:
      state.update(term.init_server(params))
    return state

  # ------------------------------------------------------------------ loss
  def make_loss(self, apply_fn: Callable, features_fn: Callable, ctx: LocalContext, hp=None):
    """(p, xb, yb, mb) -> (objective, cross-entropy) for one client's minibatch."""
    hp = self._hp(hp)
    w_t = ctx.global_params
    prev = None
    if self.needs_prev_model:
      seen = ctx.client_state["seen"]
      prev = jax.tree.map(lambda a, b: jnp.where(seen, a, b), ctx.client_state["prev_model"], w_t)
    with_loss = [t for t in self.terms if t.loss is not None]

    def loss(p, xb, yb, mb):
      z = None
      if self.needs_features:
        logits, z = features_fn(p, xb)
      else:
        logits = apply_fn(p, xb)
      ce = self.data_loss(logits, yb, mb)      # the task loss: one call site
      total = ce
      inputs = LossInputs(p, w_t, prev, ctx.client_state, ctx.server_state, xb, mb, z,
                          features_fn)
      for term in with_loss:
        total += term.loss(inputs, hp[term.name])
      return total, ce
    return loss

  # ------------------------------------------------------------------ after training
  def finish(self, ctx: LocalContext, delta, local_model, steps: jax.Array, lr: jax.Array,
             took_part, keep_rows: bool = True, hp=None):
    """(upload, new client state, server contribution) after local training.

    delta = w_i - w^t; local_model = w_i itself, kept as the previous local
    model (MOON, the contrastive term) and as SOLO's model: w^t + delta would
    round differently and cost a pass over the model; steps = K local steps;
    took_part: bool (a padded or refused slot contributes nothing, and with
    keep_rows its state row comes back unchanged). keep_rows=False where the
    caller drops or never reads a non-participant's row: the select would make
    XLA copy the old row out of the in-place table (0.1 ms a client)."""
    hp = self._hp(hp)
    state = dict(ctx.client_state)
    upload, contrib = delta, {}
    keep = ((lambda new, old: jax.tree.map(lambda a, b: jnp.where(took_part, a, b), new, old))
            if keep_rows else (lambda new, old: new))
    if self.needs_prev_model:
      state["prev_model"] = keep(local_model, state["prev_model"])
      state["seen"] = state["seen"] | took_part
    inputs = FinishInputs(ctx, delta, local_model, steps, lr, took_part, keep, self.momentum)
    for term in self.terms:
      if term.finish is not None:
        upload, state, part = term.finish(inputs, upload, state, hp[term.name])
        contrib.update(part)
    return upload, state, contrib

  def effective_steps(self, steps: jax.Array) -> jax.Array:
    """SCAFFOLD's step count under client momentum (scaffold.effective_steps)."""
    return scaffold.effective_steps(steps, self.momentum)

  # ------------------------------------------------------------------ server
  def server_step(self, server_state: dict, contrib_sum: dict, num_clients: int,
                  hp=None) -> dict:
    """The server state from the cohort's summed contributions."""
    hp = self._hp(hp)
    for term in self.terms:
      if term.server_step is not None:
        server_state = term.server_step(server_state, contrib_sum, num_clients, hp[term.name])
    return server_state

  def server_update(self, update, server_state: dict, ctx, hp=None):
    """(update, server_state): the terms' changes to the released aggregate update
    before the server optimizer (identity unless a term has one, e.g. FedDyn)."""
    hp = self._hp(hp)
    for term in self.terms:
      if term.server_update is not None:
        update, server_state = term.server_update(update, server_state, ctx, hp[term.name])
    return update, server_state


def of_terms(terms, momentum: float, data_loss: Callable = masked_cross_entropy) -> Objective:
  """The objective of built `terms` (registry order) with their numbers (each term's
  hparams; a recipe's: recipes.Recipe.objective)."""
  hp = {t.name: dict(t.hparams) for t in terms}
  # the numbers live in frozen_hp: the terms keep their functions and properties only,
  # so that an objective hashes and compares by structure and numbers
  return Objective(terms=tuple(t._replace(hparams=None) for t in terms), frozen_hp=_freeze(hp),
                   momentum=momentum, data_loss=data_loss)
