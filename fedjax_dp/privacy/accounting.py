"""Rényi-DP accounting: event RDP curves on the host, ledgers as arrays inside jit.

A ledger is a vector over a fixed grid of orders a > 1 holding the RDP of
everything composed so far (RDP adds under composition, order by order). One
ledger per client is a [clients, orders] array. The pure functions below,
`compose`, `epsilon` and `delta_for_epsilon`, are jittable and vmappable.

Event curves are computed once per distinct mechanism, in float64 numpy, in
log space:

  Gaussian, noise multiplier z (sensitivity 1, std z):   RDP(a) = a / (2 z^2)

  Poisson-subsampled Gaussian, rate q (Mironov, Talwar, Zhang 2019):
    RDP(a) = log(A_a) / (a - 1), with, for integer a,
    A_a = sum_{i=0..a} C(a, i) q^i (1-q)^(a-i) exp((i^2 - i) / (2 z^2)),
    and for fractional a the two-sided series of their section 3.3 (below).

Conversion to (epsilon, delta) (Balle et al. 2020; Canonne, Kamath, Steinke 2020):
  epsilon = min_a [ RDP(a) + log1p(-1/a) - (log delta + log a) / (a - 1) ],  max with 0
(0 at an order where delta^2 + expm1(-RDP(a)) > 0: RDP(a) bounds the KL
divergence, and delta >= sqrt(1 - exp(-KL)) is already (0, delta)-DP), and
its inverse per order for delta at a given epsilon.
"""

from __future__ import annotations

import decimal
import functools
import math

import jax.numpy as jnp
import numpy as np
from scipy import special

# dp-accounting's default grid, so that results are comparable with it order by order.
DEFAULT_ORDERS = np.array([1 + x / 10.0 for x in range(1, 100)] + list(range(11, 64)) +
                          [128, 256, 512, 1024], dtype=np.float64)


# --------------------------------------------------------------------------- events (host)


def _log_add(a: float, b: float) -> float:
  if a == -math.inf:
    return b
  if b == -math.inf:
    return a
  hi, lo = max(a, b), min(a, b)
  return hi + math.log1p(math.exp(lo - hi))


def _log_erfc(x: np.ndarray) -> np.ndarray:
  """log(erfc(x)) elementwise, accurate for large positive x where erfc underflows.
  (The same float per element as the scalar `np.log(erfcx(x)) - x * x` if x > 0 else
  `math.log(erfc(x))` that it replaced: tests/test_accounting.py checks it.)"""
  out = np.empty_like(x)
  pos = x > 0
  out[pos] = np.log(special.erfcx(x[pos])) - x[pos] * x[pos]
  out[~pos] = [math.log(v) for v in special.erfc(x[~pos])]
  return out


def _log_a_integer(q: float, z: float, a: int) -> float:
  i = np.arange(a + 1, dtype=np.float64)
  log_binom = special.gammaln(a + 1) - special.gammaln(i + 1) - special.gammaln(a - i + 1)
  terms = log_binom + i * math.log(q) + (a - i) * math.log1p(-q) + (i * i - i) / (2 * z * z)
  return float(special.logsumexp(terms))


_SERIES_BLOCK = 128  # terms computed together; the sums run in order, term by term


def _log_a_fractional(q: float, z: float, a: float) -> float:
  """Mironov, Talwar, Zhang 2019, sec. 3.3: A_a split at z0, where the two
  Gaussians' likelihood ratio crosses, into two binomial series whose terms
  carry erfc tail factors. Past i > a the binomial coefficients alternate in
  sign; summing their absolute values bounds A_a from above (so the RDP is
  conservative) and avoids the catastrophic cancellation of the signed sum,
  which came out 1 % low at z = 0.5. dp-accounting 0.6 bounds it the same way.

  The terms are computed in blocks of i with numpy (each the same float the scalar
  loop gave); the log-sums and the stopping rule stay a loop, in order.
  """
  z0 = z * z * math.log(1 / q - 1) + 0.5
  log_q, log_1mq = math.log(q), math.log1p(-q)
  gammaln_a1 = special.gammaln(a + 1)
  sqrt2_z, two_z2, log_half = math.sqrt(2) * z, 2 * z * z, math.log(0.5)
  log_a0 = log_a1 = -math.inf
  last0 = last1 = -math.inf
  for start in range(0, 100000, _SERIES_BLOCK):
    i = np.arange(start, start + _SERIES_BLOCK, dtype=np.float64)
    j = a - i
    log_coef = gammaln_a1 - special.gammaln(i + 1) - special.gammaln(j + 1)
    log_e0 = log_half + _log_erfc((i - z0) / sqrt2_z)
    log_e1 = log_half + _log_erfc((z0 - j) / sqrt2_z)
    series0 = log_coef + i * log_q + j * log_1mq + (i * i - i) / two_z2 + log_e0
    series1 = log_coef + j * log_q + i * log_1mq + (j * j - j) / two_z2 + log_e1
    for log_s0, log_s1 in zip(series0.tolist(), series1.tolist()):
      log_a0, log_a1 = _log_add(log_a0, log_s0), _log_add(log_a1, log_s1)
      total = _log_add(log_a0, log_a1)
      # stop once both series are falling and their terms are negligible
      if log_s0 < last0 and log_s1 < last1 and max(log_s0, log_s1) < total - 30:
        return total
      last0, last1 = log_s0, log_s1
  return math.inf  # no convergence: this order gives no bound


def gaussian_rdp(noise_multiplier: float, orders=DEFAULT_ORDERS) -> np.ndarray:
  """RDP of one Gaussian release with L2 sensitivity 1 and std `noise_multiplier`."""
  _check_z(noise_multiplier)
  return np.asarray(orders, np.float64) / (2.0 * noise_multiplier ** 2)


def poisson_gaussian_rdp(q: float, noise_multiplier: float, orders=DEFAULT_ORDERS) -> np.ndarray:
  """RDP of one Poisson-subsampled Gaussian step (add/remove-one neighbours)."""
  _check_q(q)
  _check_z(noise_multiplier)
  orders = np.asarray(orders, np.float64)
  if q == 1.0:
    return gaussian_rdp(noise_multiplier, orders)
  return _poisson_gaussian_rdp(q, noise_multiplier, tuple(orders)).copy()


# Calibrations, resumes and the tests ask for the same (q, z) curve many times, and its
# fractional orders cost about 0.2 s each time: remembered per process (a pure function;
# typed, so a float32 z, whose arithmetic differs, is never answered with a float's curve).
@functools.lru_cache(maxsize=1024, typed=True)
def _poisson_gaussian_rdp(q, z, orders: tuple[float, ...]) -> np.ndarray:
  out = np.empty(len(orders), np.float64)
  for k, a in enumerate(orders):
    if float(a).is_integer():
      log_a = _log_a_integer(q, z, int(a))
    else:
      log_a = _log_a_fractional(q, z, float(a))
    out[k] = max(log_a, 0.0) / (a - 1)  # inf where the series did not converge
  return out


def fixed_size_gaussian_rdp(sample_size: int, population: int, noise_multiplier: float,
                            orders=DEFAULT_ORDERS) -> np.ndarray:
  """RDP of one Gaussian step on a uniformly random subset of exactly m = sample_size of
  n = population records (sampling without replacement), under replace-one neighbours.

  `noise_multiplier` is the noise std over the replace-one sensitivity: for a sum of
  updates clipped to C that sensitivity is 2C, so pass z / 2 for noise std z C.

  Wang, Balle, Kasiviswanathan 2019 (arXiv 1808.00087, Thm 27, the strengthened bound
  for the subsampled Gaussian), with gamma = m / n and eps(j) = j / (2 z^2), for
  integer a >= 2:
    A_a = 1 + gamma^2 C(a,2) min(4 (e^eps(2) - 1), 2 e^eps(2))
            + sum_{j=3..a} gamma^j C(a,j) min(4 X_j, 2 e^((j-1) eps(j))),
    RDP(a) = log(A_a) / (a - 1),
  where X_j bounds E_Q|P/Q - 1|^j for P = N(1, z^2), Q = N(0, z^2): for even j it
  is that moment, the j-th forward difference at 0 of E_Q[(P/Q)^k] = e^(k(k-1)/(2z^2));
  for odd j, by Cauchy-Schwarz, sqrt(X_{j-1} X_{j+1}). Moments are used up to
  j = 256, the coarse arm beyond; the result is capped by the unsampled Gaussian's
  a / (2 z^2). Fractional orders interpolate log A_a linearly
  between the neighbouring integers, an upper bound because the cumulant
  (a - 1) RDP(a) is convex in a (their Corollary 10).
  """
  _check_z(noise_multiplier)
  m, n = sample_size, population
  if not (isinstance(m, (int, np.integer)) and isinstance(n, (int, np.integer)) and 1 <= m <= n):
    raise ValueError(f"sample size {m} of population {n}: need integers 1 <= m <= n")
  orders = np.asarray(orders, np.float64)
  if m == n:
    return gaussian_rdp(noise_multiplier, orders)
  log_a = functools.partial(_log_a_without_replacement, m / n, float(noise_multiplier))
  out = np.empty_like(orders)
  for k, a in enumerate(orders):
    lo, t = int(math.floor(a)), a - math.floor(a)
    value = log_a(lo) if t == 0 else (1 - t) * log_a(lo) + t * log_a(lo + 1)
    out[k] = value / (a - 1)
  # subsampling never hurts: coupling the two samples, the Renyi divergence is at
  # most the base mechanism's (WBK's bound alone is looser at large m/n and small a)
  return np.minimum(out, gaussian_rdp(noise_multiplier, orders))


_MOMENT_ORDERS = 256  # exact moment arm up to this j, as dp-accounting does


@functools.lru_cache(maxsize=64)
def _log_likelihood_ratio_moments(z: float) -> np.ndarray:
  """[0..256]: log E_Q[(P/Q - 1)^j] at even j (nan at odd j), P = N(1, z^2), Q = N(0, z^2).

  The forward difference sum_k (-1)^(j-k) C(j,k) e^(k(k-1)/(2 z^2)) cancels to
  hundreds of digits at large z, so it is summed in decimal arithmetic, with the
  precision doubled until every result keeps 30 significant digits.
  """
  jmax = _MOMENT_ORDERS
  prec = 60
  while True:
    ctx = decimal.Context(prec=prec, Emax=decimal.MAX_EMAX, Emin=decimal.MIN_EMIN)
    two_z2 = ctx.multiply(2, ctx.multiply(decimal.Decimal(z), decimal.Decimal(z)))
    s = [ctx.exp(ctx.divide(decimal.Decimal(k * (k - 1)), two_z2)) for k in range(jmax + 1)]
    out = np.full(jmax + 1, np.nan)
    ok = True
    for j in range(0, jmax + 1, 2):
      total, scale = decimal.Decimal(0), decimal.Decimal(0)
      for k in range(j + 1):
        term = ctx.multiply(math.comb(j, k), s[k])
        # ctx.subtract, not unary minus: that rounds to the default 28 digits
        total = ctx.add(total, term) if (j - k) % 2 == 0 else ctx.subtract(total, term)
        scale = max(scale, term)
      if j >= 2 and (total <= 0 or ctx.divide(total, scale) < decimal.Decimal(10) ** (30 - prec)):
        ok = False
        break
      out[j] = float(total.ln(ctx)) if j >= 2 else 0.0
    if ok:
      return out
    prec *= 2


def _log_a_without_replacement(q: float, z: float, a: int) -> float:
  """log A_a of `fixed_size_gaussian_rdp` at an integer order a >= 1."""
  if a == 1:
    return 0.0
  moments = _log_likelihood_ratio_moments(z)
  eps2 = 1.0 / (z * z)
  terms = [0.0, 2 * math.log(q) + _log_comb(a, 2)
           + min(math.log(4) + eps2 + math.log(-math.expm1(-eps2)), math.log(2) + eps2)]
  for j in range(3, a + 1):
    coarse = math.log(2) + (j - 1) * j / (2 * z * z)
    if j <= _MOMENT_ORDERS:
      x = moments[j] if j % 2 == 0 else 0.5 * (moments[j - 1] + moments[j + 1]) \
          if j + 1 <= _MOMENT_ORDERS else math.inf
      arm = min(math.log(4) + x, coarse)
    else:
      arm = coarse
    terms.append(j * math.log(q) + _log_comb(a, j) + arm)
  return float(special.logsumexp(terms))


def _log_comb(n: int, k: int) -> float:
  return float(special.gammaln(n + 1) - special.gammaln(k + 1) - special.gammaln(n - k + 1))


def multi_part_gaussian_rdp(noise_multipliers, orders=DEFAULT_ORDERS) -> np.ndarray:
  """Several Gaussians on disjoint parts of one vector, each part clipped to its
  own bound and noised with its own multiplier: RDP adds over the parts
  (they are features of the same record, not disjoint records)."""
  return sum(gaussian_rdp(z, orders) for z in noise_multipliers)


def effective_noise_multiplier(noise_multipliers) -> float:
  """The single Gaussian equivalent to Gaussians on the parts of one record:
  (sum_p z_p^-2)^(-1/2); its RDP a / (2 z^2) is `multi_part_gaussian_rdp`'s, and
  unlike a sum of curves it can be subsampled."""
  for z in noise_multipliers:
    _check_z(z)
  return float(sum(z ** -2.0 for z in noise_multipliers) ** -0.5)


def _check_q(q: float) -> None:
  if not (0.0 < q <= 1.0):
    raise ValueError(f"sampling rate q = {q}: must be in (0, 1]")


def _check_z(z: float) -> None:
  if not (z > 0):
    raise ValueError(f"noise multiplier = {z}: must be > 0")


# --------------------------------------------------------------------------- ledgers (jit)


def init_ledger(orders=DEFAULT_ORDERS, shape: tuple[int, ...] = ()) -> jnp.ndarray:
  """A zero ledger [*shape, orders] (nothing spent)."""
  return jnp.zeros(tuple(shape) + (len(orders),), jnp.float32)


def event_to_float32(event_rdp) -> np.ndarray:
  """A float64 event curve as float32, rounded up (never below the true RDP)."""
  e64 = np.asarray(event_rdp, np.float64)
  e32 = e64.astype(np.float32)
  return np.where(e32.astype(np.float64) < e64, np.nextafter(e32, np.float32(np.inf)), e32)


def compose(ledger: jnp.ndarray, event_rdp, count=1) -> jnp.ndarray:
  """Adds `count` repetitions of an event; `count` may be an array broadcasting
  against the ledger's leading axes (e.g. [clients] participation flags).

  The ledger is float32 (no x64 inside the round), so every step rounds up: the
  event is cast upwards and each product and sum is moved one ulp towards +inf.
  The ledger is then an upper bound of the exact RDP, off by at most about
  2 ulp per composition (1e-4 relative after 500 rounds), on the safe side.
  """
  up = lambda x: jnp.nextafter(x, jnp.float32(jnp.inf))
  count = jnp.asarray(count, jnp.float32)
  if isinstance(event_rdp, np.ndarray):
    event_rdp = event_to_float32(event_rdp)
  added = up(count[..., None] * jnp.asarray(event_rdp, jnp.float32))
  return jnp.where(count[..., None] == 0, ledger, up(ledger + added))  # no participation: no change


def epsilon(ledger: jnp.ndarray, delta: float, orders=DEFAULT_ORDERS):
  """(epsilon, optimal order) of a ledger [..., orders] at `delta`."""
  a = jnp.asarray(orders, jnp.float32)
  eps = ledger + jnp.log1p(-1.0 / a) - (jnp.log(delta) + jnp.log(a)) / (a - 1.0)
  # RDP(a) >= KL, and delta >= sqrt(1 - exp(-KL)) already gives (0, delta)-DP
  eps = jnp.where(delta ** 2 + jnp.expm1(-ledger) > 0, 0.0, eps)
  k = jnp.argmin(eps, axis=-1)
  best = jnp.take_along_axis(eps, k[..., None], axis=-1)[..., 0]
  return jnp.maximum(best, 0.0), a[k]


def delta_for_epsilon(ledger: jnp.ndarray, eps: float, orders=DEFAULT_ORDERS) -> jnp.ndarray:
  """Smallest delta over the orders at which the ledger is (eps, delta)-DP (at most 1)."""
  a = jnp.asarray(orders, jnp.float32)
  log_delta = (a - 1.0) * (ledger - eps + jnp.log1p(-1.0 / a)) - jnp.log(a)
  return jnp.minimum(jnp.exp(jnp.min(log_delta, axis=-1)), 1.0)


def epsilon_np(rdp: np.ndarray, delta: float, orders=DEFAULT_ORDERS) -> tuple[float, float]:
  """The same conversion in float64 numpy, for reports: (epsilon, optimal order) of one curve."""
  eps, order = epsilons_np(rdp, delta, orders)
  return float(eps), float(order)


def epsilons_np(ledgers: np.ndarray, delta: float, orders=DEFAULT_ORDERS):
  """`epsilon_np` over the last axis of [..., orders] ledgers: (epsilons, orders) arrays
  (scalars for one ledger); infinite where the ledger is."""
  a = np.asarray(orders, np.float64)
  rdp = np.asarray(ledgers, np.float64)
  with np.errstate(invalid="ignore"):
    eps = rdp + np.log1p(-1.0 / a) - (math.log(delta) + np.log(a)) / (a - 1.0)
  eps = np.where(delta ** 2 + np.expm1(-rdp) > 0, 0.0, eps)
  eps = np.where(np.isnan(eps), np.inf, eps)
  k = np.argmin(eps, axis=-1)
  best = np.maximum(np.take_along_axis(eps, k[..., None], axis=-1)[..., 0], 0.0)
  return best, a[k]


def dpsgd_epsilon(q: float, noise_multiplier: float, steps: int, delta: float,
                  orders=DEFAULT_ORDERS) -> tuple[float, float]:
  """(epsilon, order) of `steps` Poisson-subsampled Gaussian steps, by RDP."""
  return epsilon_np(steps * poisson_gaussian_rdp(q, noise_multiplier, orders), delta, orders)


def fixed_size_epsilon(sample_size: int, population: int, noise_multiplier: float, steps: int,
                       delta: float, orders=DEFAULT_ORDERS) -> tuple[float, float]:
  """(epsilon, order) of `steps` fixed-size-subsampled Gaussian steps (replace-one), by RDP.
  `noise_multiplier` is relative to the replace-one sensitivity (see fixed_size_gaussian_rdp)."""
  rdp = fixed_size_gaussian_rdp(sample_size, population, noise_multiplier, orders)
  return epsilon_np(steps * rdp, delta, orders)


def calibrate_noise_multiplier(target_epsilon: float, q: float, steps: int, delta: float,
                               epsilon_fn=None, low: float = 0.1, high: float = 1000.0,
                               tol: float = 1e-4) -> float:
  """Smallest noise multiplier (to relative `tol`) whose epsilon is <= target, by bisection.

  `epsilon_fn(z) -> epsilon` defaults to the RDP accountant; epsilon falls as z grows.
  """
  f = epsilon_fn or (lambda z: dpsgd_epsilon(q, z, steps, delta)[0])
  if f(low) <= target_epsilon:
    return low
  # Any z above one that meets the target meets it too. One found by doubling from
  # `low` spares evaluating the first bisection steps' large z (there the fixed-size
  # accountant's moments take seconds); the bisection's path and result are unchanged.
  meets = 2.0 * low
  while meets < high and f(meets) > target_epsilon:
    meets *= 2.0
  if meets >= high and f(high) > target_epsilon:
    raise ValueError(f"target epsilon {target_epsilon} is out of reach even with noise "
                     f"multiplier {high}")
  while high - low > tol * high:
    mid = 0.5 * (low + high)
    if mid >= meets or f(mid) <= target_epsilon:
      high = mid
    else:
      low = mid
  return high
