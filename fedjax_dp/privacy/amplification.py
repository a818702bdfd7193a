"""(epsilon, delta) chains that RDP cannot carry: shuffling, subsampling, composition.

Every function returns a `Bound`: the figure, the theorem it comes from, and,
where the theorem's conditions do not hold, `valid=False` with the reason and
the fallback figure (no amplification) in place of a silent number.

  Shuffling (eps0, delta0)-LDP reports of n users:
    FMT 2021 Thm 3.1 (Feldman, McMillan, Talwar), delta0 = 0, valid for
    eps0 <= ln(n / (16 ln(2/delta))):
      eps = ln(1 + (e^eps0 - 1)/(e^eps0 + 1) * (8 sqrt(e^eps0 ln(4/delta) / n) + 8 e^eps0 / n))
    FMT 2021 Thm 3.8, delta0 > 0 (e.g. Gaussian reports), the same condition and eps:
      (eps, delta + (e^eps + 1)(1 + e^-eps0 / 2) n delta0)
      The n delta0 term is at least 2 n delta0: a vacuous bound (delta >= 1) is
      reported as invalid, never as a number.
    Erlingsson et al. 2019, delta0 = 0 only, valid for eps0 <= 1/2 and n >= 1000:
      eps = 12 eps0 sqrt(ln(1/delta) / n)
    Where no theorem applies, no amplification: the reports' own (eps0, delta0).
    A Poisson cohort's n is random: `shuffle_poisson` takes a lower bound on n
    and adds the probability that it fails to delta.
  Subsampling with rate q (Balle, Barthe, Gaboardi 2018):
      (ln(1 + q (e^eps - 1)), q delta)
  Composition of k (eps, delta) mechanisms:
    basic:       (k eps, k delta)
    advanced:    (sqrt(2 k ln(1/delta')) eps + k eps (e^eps - 1), k delta + delta')
                 (Dwork, Rothblum, Vadhan 2010)
    optimal:     the exact homogeneous bound of Kairouz, Oh, Viswanath 2015 (Thm 3.3)
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from scipy import special, stats


@dataclasses.dataclass(frozen=True)
class Bound:
  epsilon: float
  delta: float
  bound: str             # the theorem used
  valid: bool = True
  reason: str = ""       # why the theorem does not apply, when valid is False

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)


def _check(eps0=None, n=None, delta=None, q=None, k=None, delta0=None):
  if eps0 is not None and not (eps0 > 0 and math.isfinite(eps0)):
    raise ValueError(f"eps0 = {eps0}: must be a finite number > 0")
  if delta0 is not None and not (0 <= delta0 < 1):
    raise ValueError(f"delta0 = {delta0}: must be in [0, 1)")
  if n is not None and not (n >= 1):
    raise ValueError(f"n = {n}: must be >= 1")
  if delta is not None and not (0 < delta < 1):
    raise ValueError(f"delta = {delta}: must be in (0, 1)")
  if q is not None and not (0 < q <= 1):
    raise ValueError(f"q = {q}: must be in (0, 1]")
  if k is not None and not (k >= 1):
    raise ValueError(f"k = {k}: must be >= 1")


def clone_delta(eps: float, eps0: float, n: float, delta0: float) -> float:
  """FMT 2021 Thm 3.8's price of delta0 > 0: (e^eps + 1)(1 + e^-eps0 / 2) n delta0."""
  return (math.exp(eps) + 1) * (1 + math.exp(-eps0) / 2) * n * delta0


def _fmt_epsilon(eps0: float, n: float, delta: float) -> float:
  e = math.exp(eps0)
  return math.log1p((e - 1) / (e + 1) * (8 * math.sqrt(e * math.log(4 / delta) / n) + 8 * e / n))


def shuffle_fmt(eps0: float, n: int, delta: float, delta0: float = 0.0) -> Bound:
  """FMT 2021 closed form: Thm 3.1 for eps0-LDP reports, Thm 3.8 for (eps0, delta0)-LDP
  ones (delta grows by clone_delta). Outside the condition, or where the total
  delta reaches 1: no amplification, (eps0, delta0), marked invalid."""
  _check(eps0=eps0, n=n, delta=delta, delta0=delta0)
  limit = math.log(n / (16 * math.log(2 / delta))) if n > 16 * math.log(2 / delta) else -math.inf
  name = ("Feldman-McMillan-Talwar 2021 Thm 3.1 (closed form)" if delta0 == 0 else
          "Feldman-McMillan-Talwar 2021 Thm 3.8 ((eps0, delta0) reports; Thm 3.1's epsilon, "
          "delta + (e^eps + 1)(1 + e^-eps0/2) n delta0)")
  if eps0 > limit:
    why = (f"needs eps0 <= ln(n / (16 ln(2/delta))) = {limit:.4g}; got eps0 = {eps0:g}"
           if math.isfinite(limit) else
           f"needs n > 16 ln(2/delta) = {16 * math.log(2 / delta):.1f} for any eps0; got n = {n}")
    return Bound(eps0, delta0, name, valid=False, reason=why + ": no amplification")
  eps = _fmt_epsilon(eps0, n, delta)
  total = delta + clone_delta(eps, eps0, n, delta0)
  if total >= 1:
    return Bound(eps0, delta0, name, valid=False,
                 reason=f"delta = {delta:g} + (e^eps + 1)(1 + e^-eps0/2) n delta0 = {total:.4g} "
                        f">= 1 (n = {n}, delta0 = {delta0:.4g}): vacuous; no amplification")
  return Bound(min(eps, eps0), total, name)


def shuffle_erlingsson(eps0: float, n: int, delta: float, delta0: float = 0.0) -> Bound:
  """Erlingsson et al. 2019: 12 eps0 sqrt(ln(1/delta)/n), for eps0 <= 1/2, n >= 1000
  and pure eps0-LDP reports (delta0 = 0)."""
  _check(eps0=eps0, n=n, delta=delta, delta0=delta0)
  name = "Erlingsson et al. 2019 (amplification by shuffling)"
  if delta0 > 0:
    return Bound(eps0, delta0, name, valid=False,
                 reason=f"needs pure eps0-LDP reports; got delta0 = {delta0:.4g}: no amplification")
  if eps0 > 0.5 or n < 1000:
    return Bound(eps0, 0.0, name, valid=False,
                 reason=f"needs eps0 <= 0.5 and n >= 1000; got eps0 = {eps0:g}, n = {n}: "
                        "no amplification")
  return Bound(min(12 * eps0 * math.sqrt(math.log(1 / delta) / n), eps0), delta, name)


def shuffle(eps0: float, n: int, delta: float, delta0: float = 0.0) -> Bound:
  """The tightest valid shuffle bound, or no amplification, (eps0, delta0), with both reasons."""
  bounds = [shuffle_fmt(eps0, n, delta, delta0), shuffle_erlingsson(eps0, n, delta, delta0)]
  valid = [b for b in bounds if b.valid]
  if valid:
    return min(valid, key=lambda b: b.epsilon)
  return Bound(eps0, delta0, "none", valid=False, reason="; ".join(b.reason for b in bounds))


def shuffle_poisson(eps0: float, population: int, q: float, delta: float,
                    delta0: float = 0.0) -> Bound:
  """Shuffling a Poisson cohort, whose size is random: a client that takes part is
  shuffled among n = 1 + Binomial(N - 1, q) reports.

  n_lo is the largest n with beta = P(n < n_lo) <= delta. At every n >= n_lo the
  fixed-n bound holds with eps(n) <= eps(n_lo) and its condition met (both are
  monotone in n), i.e. (eps(n_lo), delta + (e^eps(n_lo) + 1)(1 + e^-eps0/2) n delta0);
  n's law is the same on neighbouring datasets (sampling ignores the data), so
  mixing over n gives
    (eps(n_lo), beta + delta + (e^eps(n_lo) + 1)(1 + e^-eps0/2) E[n] delta0),
    E[n] = 1 + (N - 1) q.
  A lower bound on n with its failure probability, rather than the expected
  cohort taken as if fixed: a guarantee, not an assumption, for at most delta more."""
  _check(eps0=eps0, n=population, delta=delta, q=q, delta0=delta0)
  sizes = np.arange(population)                      # values of Binomial(N - 1, q)
  cdf = stats.binom.cdf(sizes, population - 1, q)
  below = sizes[cdf <= delta]
  n_lo = int(below.max()) + 2 if below.size else 1
  beta = float(cdf[n_lo - 2]) if n_lo >= 2 else 0.0
  mean_n = 1 + (population - 1) * q
  cohort = (f"Poisson cohort n = 1 + Binomial({population - 1}, {q:g}), mean {mean_n:.4g}: "
            f"n >= {n_lo} but with probability {beta:.3g}")
  b = shuffle(eps0, n_lo, delta, delta0)
  if not b.valid:
    return dataclasses.replace(b, reason=f"{cohort}; {b.reason}")
  total = beta + delta
  if delta0 > 0:   # only Thm 3.8 takes delta0 > 0; its price uses the theorem's own eps
    total += clone_delta(_fmt_epsilon(eps0, n_lo, delta), eps0, mean_n, delta0)
  if total >= 1:
    return Bound(eps0, delta0, b.bound, valid=False,
                 reason=f"{cohort}; delta = {total:.4g} >= 1: vacuous; no amplification")
  return Bound(b.epsilon, total, f"{b.bound}, at n_lo = {n_lo} ({cohort}; beta added to delta, "
                                 "E[n] in the delta0 term)")


def subsample(eps: float, delta: float, q: float) -> Bound:
  """Amplification by Poisson subsampling with rate q (add/remove-one)."""
  _check(q=q)
  return Bound(math.log1p(q * math.expm1(eps)), q * delta,
               "amplification by subsampling (Balle, Barthe, Gaboardi 2018)")


def compose_basic(eps: float, delta: float, k: int) -> Bound:
  _check(k=k)
  return Bound(k * eps, min(k * delta, 1.0), "basic composition")


def compose_advanced(eps: float, delta: float, k: int, delta_prime: float) -> Bound:
  _check(k=k, delta=delta_prime)
  e = math.sqrt(2 * k * math.log(1 / delta_prime)) * eps + k * eps * math.expm1(eps)
  return Bound(e, min(k * delta + delta_prime, 1.0),
               "advanced composition (Dwork, Rothblum, Vadhan 2010)")


def compose_optimal(eps: float, delta: float, k: int, delta_prime: float) -> Bound:
  """Kairouz, Oh, Viswanath 2015 Thm 3.3: the exact k-fold homogeneous composition.

  For i = 0..floor(k/2), the composition is ((k - 2i) eps, 1 - (1-delta)^k (1 - d_i))-DP with
    d_i = sum_{l=0}^{i-1} C(k, l) (e^{(k-l) eps} - e^{(k-2i+l) eps}) / (1 + e^eps)^k.
  Returns the smallest (k - 2i) eps whose total delta is <= delta + k-fold part + delta_prime,
  i.e. the smallest epsilon with 1 - (1-delta)^k (1 - d_i) <= 1 - (1-delta)^k (1 - delta_prime).
  """
  _check(k=k, delta=delta_prime)
  log_norm = k * np.logaddexp(0.0, eps)
  best = None
  for i in range(k // 2 + 1):
    if i == 0:
      d_i = 0.0
    else:
      l = np.arange(i, dtype=np.float64)
      log_binom = special.gammaln(k + 1) - special.gammaln(l + 1) - special.gammaln(k - l + 1)
      # e^{(k-l)eps} - e^{(k-2i+l)eps} = e^{(k-l)eps} (1 - e^{-2(i-l)eps}), positive for l < i
      terms = log_binom + (k - l) * eps + np.log(-np.expm1(-2 * (i - l) * eps)) - log_norm
      d_i = float(np.exp(special.logsumexp(terms)))
    if d_i <= delta_prime:
      best = (k - 2 * i) * eps
    else:
      break  # d_i grows with i
  total_delta = 1 - (1 - delta) ** k * (1 - delta_prime)
  if best is None:
    return Bound(k * eps, total_delta, "optimal composition (Kairouz, Oh, Viswanath 2015)")
  return Bound(best, total_delta, "optimal composition (Kairouz, Oh, Viswanath 2015)")
