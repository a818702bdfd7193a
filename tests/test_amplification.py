"""Shuffle, subsampling and composition bounds: closed forms, conditions, brute force."""

import math

import pytest

from fedjax_dp import amplification as amp


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
