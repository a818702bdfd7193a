"""Per-client privacy budgets (the dynamic-DP paper, section 3.3 and Table 1).

The paper's tier table (TIER_BUDGETS): a target epsilon per tier with a
range, a delta, and a composition weight. Budgets are allocated over N clients
by maximising a concave utility

    max  sum_i U_i(eps_i),   U_i(eps) = 1 - exp(-gamma_i eps)
    s.t. sum_i eps_i <= eps_total,   lo_i <= eps_i <= hi_i

`allocate_pga` is the paper's solver, projected gradient ascent with momentum
(eta, mu); `allocate_closed_form` is the exact optimum by the KKT conditions
(water filling): eps_i = clip(ln(gamma_i / lam) / gamma_i, lo_i, hi_i) with the
multiplier lam >= 0 set by bisection so the budgets sum to eps_total (lam = 0,
every eps_i = hi_i, when that already fits). Both are jittable.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.data.tabular import TIERS


class TierBudget(NamedTuple):
  epsilon: float
  low: float
  high: float
  delta: float
  weight: float   # the paper's composition weight


# the paper's Table 1 (metadata: no budget, weight 0)
TIER_BUDGETS = {
    "high": TierBudget(0.1, 0.05, 0.15, 1e-7, 2.5),
    "medium": TierBudget(0.5, 0.3, 0.7, 1e-6, 1.5),
    "low": TierBudget(1.0, 0.8, 1.5, 1e-5, 1.0),
    "public": TierBudget(2.0, 1.5, 3.0, 1e-4, 0.5),
    "metadata": TierBudget(math.inf, math.inf, math.inf, 1.0, 0.0),
}
assert tuple(TIER_BUDGETS) == TIERS


def utility(eps: jax.Array, gamma: jax.Array) -> jax.Array:
  return jnp.sum(1.0 - jnp.exp(-gamma * eps))


def project(x: jax.Array, total: float, lo: jax.Array, hi: jax.Array,
            iters: int = 60) -> jax.Array:
  """Euclidean projection onto {sum x <= total, lo <= x <= hi}: clip(x - tau,
  lo, hi) with the least tau >= 0 that satisfies the sum (bisection on tau)."""
  fits = lambda tau: jnp.sum(jnp.clip(x - tau, lo, hi)) <= total
  hi_tau = jnp.max(x - lo) + 1.0

  def step(_, b):
    a, c = b
    mid = 0.5 * (a + c)
    ok = fits(mid)
    return jnp.where(ok, a, mid), jnp.where(ok, mid, c)
  _, tau = jax.lax.fori_loop(0, iters, step, (jnp.zeros_like(hi_tau), hi_tau))
  tau = jnp.where(fits(0.0), 0.0, tau)
  return jnp.clip(x - tau, lo, hi)


def allocate_pga(gamma: jax.Array, total: float, lo: jax.Array, hi: jax.Array,
                 eta: float = 0.01, momentum: float = 0.9, steps: int = 5000) -> jax.Array:
  """The paper's projected gradient ascent with momentum, from the feasible point
  lo + the even share of what is left."""
  gamma = jnp.asarray(gamma, jnp.float32)
  lo = jnp.broadcast_to(jnp.asarray(lo, jnp.float32), gamma.shape)
  hi = jnp.broadcast_to(jnp.asarray(hi, jnp.float32), gamma.shape)
  x0 = project(lo + (total - jnp.sum(lo)) / gamma.shape[0], total, lo, hi)

  def step(_, carry):
    x, v = carry
    v = momentum * v + gamma * jnp.exp(-gamma * x)   # dU/deps
    return project(x + eta * v, total, lo, hi), v
  x, _ = jax.lax.fori_loop(0, steps, step, (x0, jnp.zeros_like(x0)))
  return x


def allocate_closed_form(gamma: jax.Array, total: float, lo: jax.Array, hi: jax.Array,
                         iters: int = 200) -> jax.Array:
  """The exact optimum by water filling (float64 numpy would do; this is jnp for jit)."""
  gamma = jnp.asarray(gamma, jnp.float32)
  lo = jnp.broadcast_to(jnp.asarray(lo, jnp.float32), gamma.shape)
  hi = jnp.broadcast_to(jnp.asarray(hi, jnp.float32), gamma.shape)
  at = lambda log_lam: jnp.clip((jnp.log(gamma) - log_lam) / gamma, lo, hi)
  # the budgets fall as lam grows; search log lam in a bracket wide enough for any
  # eps in [lo, hi]: log lam = log gamma - gamma eps
  a = jnp.min(jnp.log(gamma) - gamma * hi) - 1.0
  c = jnp.max(jnp.log(gamma) - gamma * lo) + 1.0

  def step(_, b):
    a, c = b
    mid = 0.5 * (a + c)
    over = jnp.sum(at(mid)) > total
    return jnp.where(over, mid, a), jnp.where(over, c, mid)
  _, c = jax.lax.fori_loop(0, iters, step, (a, c))
  return jnp.where(jnp.sum(hi) <= total, hi, at(c))


def client_budgets(target_epsilon: float, sizes, client_tiers, steps: int = 5000) -> np.ndarray:
  """Per-client budgets [N] for a run, by the paper's PGA allocator.

  Client i's range is its sensitivity tier's range of Table 1 relative to the
  tier's epsilon, times target_epsilon (high [0.5, 1.5], medium [0.6, 1.4],
  low [0.8, 1.5] x target); gamma_i = (n_i / mean n) / target_epsilon (more data,
  more use of budget; scale-free in epsilon); the total is N x target_epsilon,
  so the mean budget is at most the target. Table 1's absolute epsilons have
  no stated unit of time, hence the relative ranges (our reading)."""
  sizes = np.asarray(sizes, np.float64)
  tiers = [TIERS[int(t)] for t in client_tiers]
  lo = np.array([TIER_BUDGETS[t].low / TIER_BUDGETS[t].epsilon for t in tiers]) * target_epsilon
  hi = np.array([TIER_BUDGETS[t].high / TIER_BUDGETS[t].epsilon for t in tiers]) * target_epsilon
  gamma = sizes / max(sizes.mean(), 1e-12) / target_epsilon
  gamma = np.maximum(gamma, 1e-6)
  total = len(sizes) * target_epsilon
  eps = allocate_pga(jnp.asarray(gamma), total, jnp.asarray(lo), jnp.asarray(hi), steps=steps)
  return np.asarray(eps, np.float64)
