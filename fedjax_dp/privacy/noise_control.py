"""Adaptive noise of the dynamic-DP paper (section 3.3.1), as a round-to-round controller.

Convergence score of round t, from the released global updates g (public: a
function of earlier rounds' noised outputs, so using it costs no privacy):

    s_t = exp(-lambda * sum_{tau = t-w+1}^{t} m_tau)
    m_tau = ||g_tau - g_{tau-1}||          (measure 'update_diff', the SPEC's form)
            | ||g_tau|| - ||g_{tau-1}|| |   (measure 'norm_diff', "gradient norm evolution")

with lambda = 0.1 and w = 10; s_t = 0 until w differences have been seen (most
noise while nothing is known). The feedback controller smooths the score with an
exponential moving average, c_t = rho c_{t-1} + (1 - rho) s_t (rho = 0 turns it
off), and round t + 1 uses c_t. Two noise formulas, on top of the base noise
multiplier z and per-tier multipliers m_p (tier_noise_multipliers):

    'convergence'  sigma_p = z C m_p (1 - beta c),                beta = 0.3
    'weighted'     sigma_p = z C (2 w_p + 0.5 (1 - f)),  w_p = m_p / 2 (high 1.0 ...
                   low 0.25, the paper's sensitivity weights), f = 0.8 c (the
                   paper's convergence factor, 0 .. 0.8)

Accounting: the noise of each round is fixed before the round from public
values, so the rounds compose adaptively in RDP at their actual noise
(`local_event_rdp`): one participation, replace-one (sensitivity 2 C_p per part),
costs sum_p a / (2 (z_p / 2)^2), z_p = sigma_p / C_p.

The paper's own per-round charge, eps = sqrt(2 ln(1.25 / delta)) / z_round (its
Gaussian calibration solved for epsilon, with z_round the round's base
multiplier), summed over a client's participations, is kept beside the
accountant's figure; it is not a guarantee (the calibration needs eps < 1, and
summing ignores delta).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.privacy import accounting

SCHEDULES = ("static", "convergence", "weighted")
MEASURES = ("update_diff", "norm_diff")
MAX_CONVERGENCE_FACTOR = 0.8


def init_state(d: int, window: int, num_clients: int) -> dict:
  return {"prev_update": jnp.zeros((d,), jnp.float32),
          "diffs": jnp.zeros((window,), jnp.float32),
          "seen": jnp.int32(0),          # global updates observed
          "score": jnp.float32(0.0),     # the controller's output c_t
          "paper_epsilon": jnp.zeros((num_clients,), jnp.float32),
          "participations": jnp.zeros((num_clients,), jnp.int32),
          "skipped": jnp.int32(0),
          "paper_epsilon_rounds": jnp.float32(0.0)}   # the paper's charge summed over rounds       # central DP rounds not run (budget)


def convergence_score(diffs: jax.Array, seen: jax.Array, lam: float) -> jax.Array:
  """exp(-lam sum(diffs)), or 0 until the window [w] holds w differences."""
  full = seen > diffs.shape[0]   # w differences need w + 1 updates
  return jnp.where(full, jnp.exp(-lam * jnp.sum(diffs)), 0.0)


def observe(state: dict, update: jax.Array, lam: float, ema: float, measure: str,
            ema_rest=None) -> dict:
  """Feeds the round's released global update [d] to the controller. `ema_rest`:
  1 - ema (pass it with a traced ema: 1 - float32(ema) rounds differently)."""
  prev = state["prev_update"]
  if measure == "update_diff":
    m = jnp.linalg.norm(update - prev)
  else:
    m = jnp.abs(jnp.linalg.norm(update) - jnp.linalg.norm(prev))
  seen = state["seen"] + 1
  # the first update has no predecessor: nothing enters the window
  diffs = jnp.where(state["seen"] > 0, jnp.roll(state["diffs"], 1).at[0].set(m), state["diffs"])
  s = convergence_score(diffs, seen, lam)
  return {**state, "prev_update": update, "diffs": diffs, "seen": seen,
          "score": ema * state["score"] + (1.0 - ema if ema_rest is None else ema_rest) * s}


def noise_scales(schedule: str, score, tier_scales, beta: float):
  """Per-part noise std / (z C) for a controller output `score` in [0, 1];
  tier_scales [parts] are the static per-part multipliers m_p."""
  m = jnp.asarray(tier_scales, jnp.float32)
  if schedule == "static":
    return m
  if schedule == "convergence":
    return m * (1.0 - beta * score)
  if schedule == "weighted":
    return 2.0 * (m / 2.0) + 0.5 * (1.0 - MAX_CONVERGENCE_FACTOR * score)
  raise ValueError(f"noise schedule {schedule!r}: allowed values are {', '.join(SCHEDULES)}")


def base_factor(schedule: str, score, beta: float):
  """The round's base multiplier / z, for the paper's per-round charge."""
  if schedule == "convergence":
    return 1.0 - beta * score
  if schedule == "weighted":
    return 2.0 * 0.5 + 0.5 * (1.0 - MAX_CONVERGENCE_FACTOR * score)   # the medium tier's
  return jnp.float32(1.0)


def local_event_rdp(z: float, fractions, scales, orders=accounting.DEFAULT_ORDERS) -> jax.Array:
  """RDP [orders] of one local-DP participation whose part p has bound
  C_p = fractions[p] C and noise std z C scales[p]: sum_p a / (2 (z_p / 2)^2),
  z_p = z scales[p] / fractions[p]. float32, nudged up by 1e-6 relative (more
  than the rounding of these few operations), so never below the exact value."""
  f = jnp.asarray(fractions, jnp.float32)
  zp = z * jnp.asarray(scales, jnp.float32) / f
  a = jnp.asarray(orders, jnp.float32)
  return a * 2.0 * jnp.sum(1.0 / (zp * zp)) * (1.0 + 1e-6)


def local_event_rdp_np(z: float, fractions, scales, orders=accounting.DEFAULT_ORDERS):
  """The same in float64 numpy (host-side checks)."""
  zp = z * np.asarray(scales, np.float64) / np.asarray(fractions, np.float64)
  return np.asarray(orders, np.float64) * 2.0 * np.sum(1.0 / zp ** 2)


def cluster_noise_factors(cluster_size: jax.Array, median_size: jax.Array) -> jax.Array:
  """Per-client noise multiplier factors [N] for `cluster_noise: equalize`.

  A client last seen in a cluster of s members noises with z sqrt(s / s_med),
  s_med the median cluster size of that round, and never less than z: every
  cluster's within-cluster mean of s noised updates then has the noise of a
  median-sized cluster's (std z C / sqrt(s_med)), and every client keeps at
  least the base guarantee (big clusters buy extra privacy with their size).
  Clients not yet clustered (size 0) use z."""
  ratio = cluster_size / jnp.maximum(median_size, 1.0)
  return jnp.where(cluster_size > 0, jnp.sqrt(jnp.maximum(ratio, 1.0)), 1.0)


def paper_round_epsilon(z_round, delta: float):
  """The paper's per-round charge C sqrt(2 ln(1.25/delta)) / sigma with sigma = z C."""
  return math.sqrt(2.0 * math.log(1.25 / delta)) / z_round
