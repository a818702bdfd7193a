"""(epsilon, delta) chains that RDP cannot carry: shuffling, subsampling, composition.

Every function returns a `Bound`: the figure, the theorem it comes from, and,
where the theorem's conditions do not hold, `valid=False` with the reason and
the fallback figure (no amplification) in place of a silent number.

  Shuffling eps0-LDP reports of n users:
    FMT 2021 Thm 3.1 (Feldman, McMillan, Talwar), valid for eps0 <= ln(n / (16 ln(2/delta))):
      eps = ln(1 + (e^eps0 - 1)/(e^eps0 + 1) * (8 sqrt(e^eps0 ln(4/delta) / n) + 8 e^eps0 / n))
    Erlingsson et al. 2019, valid for eps0 <= 1/2 and n >= 1000:
      eps = 12 eps0 sqrt(ln(1/delta) / n)
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
from scipy import special


@dataclasses.dataclass(frozen=True)
class Bound:
  epsilon: float
  delta: float
  bound: str             # the theorem used
  valid: bool = True
  reason: str = ""       # why the theorem does not apply, when valid is False

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)


def _check(eps0=None, n=None, delta=None, q=None, k=None):
  if eps0 is not None and not (eps0 > 0 and math.isfinite(eps0)):
    raise ValueError(f"eps0 = {eps0}: must be a finite number > 0")
  if n is not None and not (n >= 1):
    raise ValueError(f"n = {n}: must be >= 1")
  if delta is not None and not (0 < delta < 1):
    raise ValueError(f"delta = {delta}: must be in (0, 1)")
  if q is not None and not (0 < q <= 1):
    raise ValueError(f"q = {q}: must be in (0, 1]")
  if k is not None and not (k >= 1):
    raise ValueError(f"k = {k}: must be >= 1")


def shuffle_fmt(eps0: float, n: int, delta: float) -> Bound:
  """FMT 2021 Thm 3.1 closed form; outside its condition: no amplification (eps0, 0)."""
  _check(eps0=eps0, n=n, delta=delta)
  limit = math.log(n / (16 * math.log(2 / delta))) if n > 16 * math.log(2 / delta) else -math.inf
  name = "Feldman-McMillan-Talwar 2021 Thm 3.1 (closed form)"
  if eps0 > limit:
    why = (f"needs eps0 <= ln(n / (16 ln(2/delta))) = {limit:.4g}; got eps0 = {eps0:g}"
           if math.isfinite(limit) else
           f"needs n > 16 ln(2/delta) = {16 * math.log(2 / delta):.1f} for any eps0; got n = {n}")
    return Bound(eps0, 0.0, name, valid=False, reason=why + ": no amplification")
  e = math.exp(eps0)
  eps = math.log1p((e - 1) / (e + 1) * (8 * math.sqrt(e * math.log(4 / delta) / n) + 8 * e / n))
  return Bound(min(eps, eps0), delta, name)


def shuffle_erlingsson(eps0: float, n: int, delta: float) -> Bound:
  """Erlingsson et al. 2019: 12 eps0 sqrt(ln(1/delta)/n), for eps0 <= 1/2 and n >= 1000."""
  _check(eps0=eps0, n=n, delta=delta)
  name = "Erlingsson et al. 2019 (amplification by shuffling)"
  if eps0 > 0.5 or n < 1000:
    return Bound(eps0, 0.0, name, valid=False,
                 reason=f"needs eps0 <= 0.5 and n >= 1000; got eps0 = {eps0:g}, n = {n}: "
                        "no amplification")
  return Bound(min(12 * eps0 * math.sqrt(math.log(1 / delta) / n), eps0), delta, name)


def shuffle(eps0: float, n: int, delta: float) -> Bound:
  """The tightest valid shuffle bound, or no amplification with both reasons."""
  bounds = [shuffle_fmt(eps0, n, delta), shuffle_erlingsson(eps0, n, delta)]
  valid = [b for b in bounds if b.valid]
  if valid:
    return min(valid, key=lambda b: b.epsilon)
  return Bound(eps0, 0.0, "none", valid=False, reason="; ".join(b.reason for b in bounds))


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
