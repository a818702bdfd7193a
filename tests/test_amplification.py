"""Shuffle, subsampling and composition bounds: closed forms, conditions, brute force."""

import math

import pytest

from fedjax_dp.privacy import amplification as amp


def test_fmt_reference_value_and_erlingsson():
  b = amp.shuffle_fmt(4.0, 100000, 1e-6)       # SPEC.md section D: about 0.535
  assert b.valid and b.epsilon == pytest.approx(0.535, abs=5e-4) and b.delta == 1e-6
  e = amp.shuffle_erlingsson(0.5, 10000, 1e-6)
  assert e.valid and e.epsilon == pytest.approx(12 * 0.5 * math.sqrt(math.log(1e6) / 1e4))
  assert amp.shuffle(0.5, 10000, 1e-6).epsilon == min(
      e.epsilon, amp.shuffle_fmt(0.5, 10000, 1e-6).epsilon)


def test_conditions_are_enforced_never_a_silent_number():
  # SPEC.md section C: at n = 100, delta 1e-5 no eps0 qualifies for FMT
  for eps0 in (0.01, 1.0, 4.0):
    b = amp.shuffle_fmt(eps0, 100, 1e-5)
    assert not b.valid and b.epsilon == eps0 and "no amplification" in b.reason
  limit = math.log(100000 / (16 * math.log(2 / 1e-6)))
  assert amp.shuffle_fmt(limit * 0.999, 100000, 1e-6).valid
  assert not amp.shuffle_fmt(limit * 1.001, 100000, 1e-6).valid
  assert not amp.shuffle_erlingsson(0.6, 10000, 1e-6).valid
  assert not amp.shuffle_erlingsson(0.4, 999, 1e-6).valid
  none = amp.shuffle(4.0, 100, 1e-5)
  assert not none.valid and none.epsilon == 4.0 and "Erlingsson" not in none.bound


def test_subsampling_closed_form():
  b = amp.subsample(2.0, 1e-6, 0.01)
  assert b.epsilon == pytest.approx(math.log(1 + 0.01 * (math.e ** 2 - 1)))
  assert b.delta == pytest.approx(1e-8)
  assert amp.subsample(2.0, 1e-6, 1.0).epsilon == pytest.approx(2.0)


def test_basic_and_advanced_composition():
  assert amp.compose_basic(0.1, 1e-7, 50).epsilon == pytest.approx(5.0)
  adv = amp.compose_advanced(0.1, 1e-7, 50, 1e-6)
  want = math.sqrt(2 * 50 * math.log(1e6)) * 0.1 + 50 * 0.1 * (math.exp(0.1) - 1)
  assert adv.epsilon == pytest.approx(want) and adv.delta == pytest.approx(50e-7 + 1e-6)


def brute_force_delta(eps, k, eps_prime):
  """Exact delta(eps') of k-fold eps-randomized response (the worst eps-DP mechanism):
  the privacy loss is (k - 2j) eps with probability C(k, j) p^(k-j) (1-p)^j, p = e^eps/(1+e^eps),
  and delta(eps') = E[(1 - e^(eps' - L))_+]."""
  p = math.exp(eps) / (1 + math.exp(eps))
  total = 0.0
  for j in range(k + 1):
    loss = (k - 2 * j) * eps
    prob = math.comb(k, j) * p ** (k - j) * (1 - p) ** j
    total += prob * max(0.0, 1 - math.exp(eps_prime - loss))
  return total


@pytest.mark.parametrize("eps,k,delta_prime", [(0.5, 2, 0.2), (0.3, 10, 1e-3), (0.1, 40, 1e-5),
                                               (1.0, 7, 1e-2)])
def test_optimal_composition_is_the_exact_profile(eps, k, delta_prime):
  b = amp.compose_optimal(eps, 0.0, k, delta_prime)
  assert brute_force_delta(eps, k, b.epsilon) <= delta_prime * (1 + 1e-9)
  if b.epsilon >= 2 * eps:  # the next grid point down must fail
    assert brute_force_delta(eps, k, b.epsilon - 2 * eps) > delta_prime
  assert b.epsilon <= amp.compose_advanced(eps, 0.0, k, delta_prime).epsilon + 1e-12
  assert b.epsilon <= amp.compose_basic(eps, 0.0, k).epsilon


def test_two_fold_pure_dp_is_total_variation():
  # k = 2: the i = 1 point is (0, (e^eps - 1)/(e^eps + 1))
  tv = math.tanh(0.5 / 2)
  assert amp.compose_optimal(0.5, 0.0, 2, tv * 1.0001).epsilon == 0.0
  assert amp.compose_optimal(0.5, 0.0, 2, tv * 0.9999).epsilon == pytest.approx(1.0)


@pytest.mark.parametrize("call", [lambda: amp.shuffle_fmt(-1, 100, 1e-5),
                                  lambda: amp.shuffle_fmt(1, 100, 1.5),
                                  lambda: amp.subsample(1, 1e-5, 0.0),
                                  lambda: amp.compose_basic(1, 1e-5, 0)])
def test_bad_arguments(call):
  with pytest.raises(ValueError, match="must be"):
    call()


def test_shuffling_approximate_dp_reports_pays_for_delta0():
  """Found by an audit: Gaussian reports are (eps0, delta0)-LDP, and the shuffle bounds
  for pure eps0-LDP reports gave them delta alone. FMT 2021 Thm 3.8: Thm 3.1's epsilon,
  delta + (e^eps + 1)(1 + e^-eps0/2) n delta0, by hand; at least 2 n delta0."""
  pure = amp.shuffle_fmt(1.0, 100000, 1e-6)
  b = amp.shuffle_fmt(1.0, 100000, 1e-6, delta0=1e-9)
  want = 1e-6 + (math.exp(pure.epsilon) + 1) * (1 + math.exp(-1.0) / 2) * 100000 * 1e-9
  assert b.valid and b.epsilon == pure.epsilon and b.delta == pytest.approx(want)
  assert b.delta >= 1e-6 + 2 * 100000 * 1e-9 and "Thm 3.8" in b.bound
  # Erlingsson et al. is for pure reports only; the tightest valid is then FMT's
  e = amp.shuffle_erlingsson(0.5, 10000, 1e-6, delta0=1e-9)
  assert not e.valid and "pure" in e.reason and (e.epsilon, e.delta) == (0.5, 1e-9)
  assert amp.shuffle(0.5, 10000, 1e-6, 1e-9) == amp.shuffle_fmt(0.5, 10000, 1e-6, 1e-9)
  # the cohort: 1,000 reports at delta0 = 121 x 1e-5 is vacuous (delta > 2.4);
  # no amplification: the reports' own (eps0, delta0), never delta alone
  v = amp.shuffle(1.0, 1000, 1e-5, 121e-5)
  assert not v.valid and "vacuous" in v.reason and (v.epsilon, v.delta) == (1.0, 121e-5)
  assert amp.shuffle(4.0, 100, 1e-5, 1e-7).delta == 1e-7     # no theorem applies: delta0 kept


def test_shuffling_a_poisson_cohort_uses_a_lower_bound_on_its_size():
  """Poisson cohorts have a random size n = 1 + Binomial(N - 1, q): epsilon at the
  largest n_lo with P(n < n_lo) <= delta, that probability added to delta, E[n] in
  the delta0 term. n_lo and its probability from the binomial sum directly."""
  N, q, delta, delta0 = 20000, 0.05, 1e-6, 1e-9
  cdf, x = 0.0, -1
  while True:   # P(Binomial(N - 1, q) <= x + 1), summed term by term
    term = math.exp(math.lgamma(N) - math.lgamma(x + 2) - math.lgamma(N - x - 1)
                    + (x + 1) * math.log(q) + (N - x - 2) * math.log1p(-q))
    if cdf + term > delta:
      break
    cdf, x = cdf + term, x + 1
  n_lo, beta = x + 2, cdf
  b = amp.shuffle_poisson(1.0, N, q, delta, delta0)
  at_n_lo = amp.shuffle_fmt(1.0, n_lo, delta)
  assert n_lo < 1 + (N - 1) * q and f"n >= {n_lo} " in b.bound
  assert b.valid and b.epsilon == pytest.approx(at_n_lo.epsilon)
  mean_n = 1 + (N - 1) * q
  want = beta + delta + (math.exp(at_n_lo.epsilon) + 1) * (1 + math.exp(-1.0) / 2) * mean_n * delta0
  assert b.delta == pytest.approx(want, rel=1e-6)
  # a cohort too small for any theorem: no amplification, and it says why
  small = amp.shuffle_poisson(1.0, 20, 0.25, 1e-5, 121e-5)
  assert not small.valid and "Poisson cohort" in small.reason and small.delta == 121e-5
