"""Local objectives and the per-client and server state they carry.

The client minimises CE(w; D_i) plus the terms of the configured `algorithm`
(a '+'-joined list, e.g. `fedprox`, `contrastive+scaffold`):

  fedprox      (Li et al. 2020)         + mu/2 ||w - w^t||^2
  contrastive  (TopkSDP-FL's L_con, reconstructed: the paper lost its equations;
                `contrastive_form` picks the reading)
     'bounded'     + mu1/2 ||w - w^t||^2 - mu2/2 min(||w - w_prev||^2, r^2)
     'moon_params' + mu1 * -log(e^{s_g/tau} / (e^{s_g/tau} + e^{s_p/tau})),
                   s_g = cos(w, w^t), s_p = cos(w, w_prev) over flattened parameters
     Both pull towards the global model and push from the client's previous
     local model, and both are bounded below (the plain -||w - w_prev||^2 is not).
  moon         (Li, He, Song 2021)      + mu * mean_b -log(e^{c_g/tau} / (e^{c_g/tau} + e^{c_p/tau})),
                c_g = cos(z, z_g), c_p = cos(z, z_prev): representations (the last hidden
                layer) of the batch under w, w^t and w_prev
  scaffold     (Karimireddy et al. 2020) + <w, c - c_i>, i.e. the gradient step uses
                g - c_i + c; after training, option II:
                c_i <- c_i - c + (w^t - w_i) / (K lr), K = local steps; the server
                sets c <- c + (1/N) sum_{i in S} (c_i' - c_i). Option II assumes
                plain SGD; with client momentum beta (heavy ball, optax's trace) K
                steps of a constant gradient g move w by lr g sum_{k=1..K}
                (1 - beta^k) / (1 - beta), so that sum replaces K (it is K at
                beta = 0), and c_i stays an estimate of the mean gradient rather
                than 1 / (1 - beta) of it. A client that ran no step keeps c_i.
  fedadmm      (Gong, Li, Freris 2022)   + <y_i, w - w^t> + rho/2 ||w - w^t||^2; after
                training y_i <- y_i + rho (w_i - w^t) and the client uploads
                (w_i - w^t) + y_i / rho (its augmented model less w^t)

w_prev is the client's local model from its previous participation; a client
seen for the first time uses w^t. Per-client state lives in
`SimState.client_state` with a leading [num_clients] axis; each client reads and
writes its row inside the compiled round (simulation.map_clients_with_state, or
map_clients_with_resident_state when every client takes part in every round). Memory per client:
one parameter vector each for `prev_model` (contrastive, moon), `control`
(scaffold), `dual` (fedadmm) and `model` (solo: each client's own model,
trained from its last one, never aggregated): 4 d bytes each (0.8 MB for the 199,210-
parameter MLP), plus one byte for `seen`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_dp.client import masked_cross_entropy

# algorithm names: the local terms each one adds, and the server optimizer it implies
ALGORITHMS = {
    "fedavg": ((), "sgd"),
    "fedavgm": ((), "momentum"),
    "fedadam": ((), "adam"),
    "fedprox": (("fedprox",), "sgd"),
    "contrastive": (("contrastive",), "sgd"),
    "topksdp": (("contrastive",), "sgd"),
    "moon": (("moon",), "sgd"),
    "scaffold": (("scaffold",), "sgd"),
    "fedadmm": (("fedadmm",), "sgd"),
    "solo": (("solo",), "sgd"),
}
TERMS = ("fedprox", "contrastive", "moon", "scaffold", "fedadmm", "solo")


def parse_algorithm(name: str) -> tuple[tuple[str, ...], str]:
  """'contrastive+scaffold' -> (('contrastive', 'scaffold'), 'sgd'); raises ValueError."""
  parts = [p.strip() for p in name.split("+") if p.strip()]
  bad = [p for p in parts if p not in ALGORITHMS]
  if not parts or bad:
    raise ValueError(f"algorithm {name!r}: allowed are {', '.join(ALGORITHMS)}, or a '+'-joined "
                     "combination of local terms (e.g. fedprox+scaffold)")
  terms, server = [], "sgd"
  for p in parts:
    t, s = ALGORITHMS[p]
    terms += [x for x in t if x not in terms]
    server = s if s != "sgd" else server
  if "solo" in terms and len(parts) > 1:
    raise ValueError(f"algorithm {name!r}: solo (each client trains alone) combines with nothing")
  return tuple(terms), server


class LocalContext(NamedTuple):
  """What one client's objective sees: w^t, its own state, the server's state."""
  global_params: Any
  client_state: dict
  server_state: dict


def _sq_dist(a, b) -> jax.Array:
  return sum(jnp.sum(jnp.square(x - y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _dot(a, b) -> jax.Array:
  return sum(jnp.sum(x * y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _cosine(a, b) -> jax.Array:
  return _dot(a, b) / jnp.maximum(jnp.sqrt(_dot(a, a) * _dot(b, b)), 1e-12)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def bounded_push(p, prev, r2: float) -> jax.Array:
  """-1/2 min(||p - prev||^2, r2), gradient -(p - prev) inside the radius, 0 outside
  (at the boundary 1/2 of it, as jnp.minimum's). The backward pass recomputes
  p - prev from p and prev: autodiff would keep the difference from the forward
  pass, materializing a full-size array every local step that the distance's
  reduction and the gradient would otherwise each compute fused."""
  return -0.5 * jnp.minimum(_sq_dist(p, prev), r2)


def _bounded_push_fwd(p, prev, r2):
  # (prev - p), not (p - prev): equal squares, but a different expression from the
  # backward pass's, so that XLA does not merge the two into one materialized array
  d2 = _sq_dist(prev, p)
  return -0.5 * jnp.minimum(d2, r2), (p, prev, d2)


def _bounded_push_bwd(r2, res, g):
  p, prev, d2 = res
  scale = -g * jnp.where(d2 < r2, 1.0, jnp.where(d2 == r2, 0.5, 0.0))
  return (jax.tree.map(lambda a, b: scale * (a - b), p, prev),
          jax.tree.map(jnp.zeros_like, prev))


bounded_push.defvjp(_bounded_push_fwd, _bounded_push_bwd)


def contrastive_nll(sim_pos: jax.Array, sim_neg: jax.Array, tau: float) -> jax.Array:
  """-log(e^{p/tau} / (e^{p/tau} + e^{n/tau})) = softplus((n - p) / tau)."""
  return jax.nn.softplus((sim_neg - sim_pos) / tau)


@dataclasses.dataclass(frozen=True)
class Objective:
  terms: tuple[str, ...] = ()
  prox_mu: float = 0.001
  contrastive_form: str = "bounded"
  mu1: float = 0.01
  mu2: float = 0.005
  radius: float = 1.0
  contrastive_tau: float = 0.5
  moon_mu: float = 1.0
  moon_tau: float = 0.5
  rho: float = 0.01
  momentum: float = 0.0     # the client optimizer's (SCAFFOLD's step count, see above)
  # the task's loss (outputs, targets, mask) -> scalar, in place of CE (losses.py)
  data_loss: Callable = masked_cross_entropy

  @property
  def solo(self) -> bool:
    """SOLO: every client trains its own model from its own last one; no aggregation."""
    return "solo" in self.terms

  @property
  def needs_prev_model(self) -> bool:
    return "contrastive" in self.terms or "moon" in self.terms

  # ------------------------------------------------------------------ state
  def init_client_state(self, params) -> dict:
    """One client's state (no leading axis)."""
    zeros = jax.tree.map(jnp.zeros_like, params)
    state = {}
    if self.needs_prev_model:
      state["prev_model"] = zeros
      state["seen"] = jnp.zeros((), bool)
    if "scaffold" in self.terms:
      state["control"] = zeros
    if "fedadmm" in self.terms:
      state["dual"] = zeros
    if self.solo:
      state["model"] = params  # every client starts from the same initial model
    return state

  def init_server_state(self, params) -> dict:
    if "scaffold" in self.terms:
      return {"control": jax.tree.map(jnp.zeros_like, params)}
    return {}

  # ------------------------------------------------------------------ loss
  def make_loss(self, apply_fn: Callable, features_fn: Callable, ctx: LocalContext):
    """(p, xb, yb, mb) -> (objective, cross-entropy) for one client's minibatch."""
    w_t = ctx.global_params
    prev = None
    if self.needs_prev_model:
      seen = ctx.client_state["seen"]
      prev = jax.tree.map(lambda a, b: jnp.where(seen, a, b), ctx.client_state["prev_model"], w_t)

    def loss(p, xb, yb, mb):
      if "moon" in self.terms:
        logits, z = features_fn(p, xb)
      else:
        logits = apply_fn(p, xb)
      ce = self.data_loss(logits, yb, mb)
      total = ce
      if "fedprox" in self.terms:
        total += 0.5 * self.prox_mu * _sq_dist(p, w_t)
      if "contrastive" in self.terms:
        if self.contrastive_form == "bounded":
          total += 0.5 * self.mu1 * _sq_dist(p, w_t) + self.mu2 * bounded_push(
              p, prev, self.radius ** 2)
        else:
          total += self.mu1 * contrastive_nll(_cosine(p, w_t), _cosine(p, prev),
                                              self.contrastive_tau)
      if "moon" in self.terms:
        _, z_g = features_fn(w_t, xb)
        _, z_p = features_fn(prev, xb)
        cos = lambda a, b: jnp.sum(a * b, -1) / jnp.maximum(
            jnp.linalg.norm(a, axis=-1) * jnp.linalg.norm(b, axis=-1), 1e-12)
        nll = contrastive_nll(cos(z, jax.lax.stop_gradient(z_g)),
                              cos(z, jax.lax.stop_gradient(z_p)), self.moon_tau)
        m = mb.astype(nll.dtype)
        total += self.moon_mu * jnp.sum(nll * m) / jnp.maximum(jnp.sum(m), 1.0)
      if "scaffold" in self.terms:
        correction = jax.tree.map(jnp.subtract, ctx.server_state["control"],
                                  ctx.client_state["control"])
        total += _dot(p, jax.lax.stop_gradient(correction))
      if "fedadmm" in self.terms:
        total += _dot(ctx.client_state["dual"], jax.tree.map(jnp.subtract, p, w_t)) \
            + 0.5 * self.rho * _sq_dist(p, w_t)
      return total, ce
    return loss

  # ------------------------------------------------------------------ after training
  def finish(self, ctx: LocalContext, delta, local_model, steps: jax.Array, lr: jax.Array,
             took_part, keep_rows: bool = True):
    """(upload, new client state, server contribution) after local training.

    delta = w_i - w^t; local_model = w_i itself, kept as the previous local
    model (MOON, the contrastive term) and as SOLO's model: w^t + delta would
    round differently and cost a pass over the model; steps = K local steps;
    took_part: bool (a padded or refused slot contributes nothing, and with
    keep_rows its state row comes back unchanged). keep_rows=False where the
    caller drops or never reads a non-participant's row: the select would make
    XLA copy the old row out of the in-place table (0.1 ms a client)."""
    state = dict(ctx.client_state)
    upload, contrib = delta, {}
    keep = ((lambda new, old: jax.tree.map(lambda a, b: jnp.where(took_part, a, b), new, old))
            if keep_rows else (lambda new, old: new))
    if self.needs_prev_model:
      state["prev_model"] = keep(local_model, state["prev_model"])
      state["seen"] = state["seen"] | took_part
    if "scaffold" in self.terms:
      c, c_i = ctx.server_state["control"], state["control"]
      scale = 1.0 / (jnp.maximum(self.effective_steps(steps), 1e-30) * lr)
      trained = took_part & (steps > 0)
      new_c_i = jax.tree.map(lambda ci, cc, d: jnp.where(trained, ci - cc - d * scale, ci),
                             c_i, c, delta)
      contrib["control"] = jax.tree.map(lambda n, o: jnp.where(trained, n - o, 0.0), new_c_i, c_i)
      new_c_i = keep(new_c_i, c_i)
      state["control"] = new_c_i
    if self.solo:
      state["model"] = keep(local_model, state["model"])
      upload = jax.tree.map(jnp.zeros_like, delta)
    if "fedadmm" in self.terms:
      new_dual = keep(jax.tree.map(lambda y, d: y + self.rho * d, state["dual"], delta),
                      state["dual"])
      state["dual"] = new_dual
      upload = jax.tree.map(lambda d, y: d + y / self.rho, delta, new_dual)
    return upload, state, contrib

  def effective_steps(self, steps: jax.Array) -> jax.Array:
    """sum_{k=1..K} (1 - beta^k) / (1 - beta): how many plain-SGD steps of a
    constant gradient K momentum steps move as far as (K at beta = 0)."""
    k = steps.astype(jnp.float32)
    if self.momentum == 0:
      return k
    b = self.momentum
    return (k - b * (1.0 - b ** k) / (1.0 - b)) / (1.0 - b)

  def server_step(self, server_state: dict, contrib_sum: dict, num_clients: int) -> dict:
    if "scaffold" in self.terms:
      return {**server_state,
              "control": jax.tree.map(lambda c, s: c + s / num_clients,
                                      server_state["control"], contrib_sum["control"])}
    return server_state


def make_objective(cfg, data_loss: Callable = masked_cross_entropy) -> Objective:
  terms, _ = parse_algorithm(cfg.algorithm)
  return Objective(terms=terms, prox_mu=cfg.prox_mu, contrastive_form=cfg.contrastive_form,
                   mu1=cfg.contrastive_mu1, mu2=cfg.contrastive_mu2, radius=cfg.contrastive_radius,
                   contrastive_tau=cfg.contrastive_tau, moon_mu=cfg.moon_mu, moon_tau=cfg.moon_tau,
                   rho=cfg.admm_rho, momentum=cfg.momentum, data_loss=data_loss)
