"""The RDP accountant against dp-accounting (the oracle) and published test vectors."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special

from fedjax_dp.privacy import accounting as acc

dpa = pytest.importorskip("dp_accounting")
from dp_accounting import rdp as dpa_rdp  # noqa: E402


def oracle_epsilon(q, z, steps, delta, orders=acc.DEFAULT_ORDERS):
  a = dpa_rdp.RdpAccountant(orders=list(orders))
  a.compose(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z)), steps)
  return a.get_epsilon_and_optimal_order(delta)


def oracle_orders(q, z):
  """The orders at which dp-accounting's fractional series converges within its
  1,000-term cap (at small z and large q it gives up on some and drops them)."""
  a = dpa_rdp.RdpAccountant(orders=list(acc.DEFAULT_ORDERS))
  a.compose(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z)), 1)
  return acc.DEFAULT_ORDERS[np.isfinite(np.asarray(a._rdp))]


@pytest.mark.parametrize("q", [1e-3, 0.01, 0.1, 0.5, 1.0])
@pytest.mark.parametrize("z", [0.5, 1.1, 4.0])
@pytest.mark.parametrize("steps,delta", [(1, 1e-5), (1000, 1e-5), (100000, 1e-6)])
def test_epsilon_matches_dp_accounting(q, z, steps, delta):
  orders = oracle_orders(q, z)
  eps, order = acc.dpsgd_epsilon(q, z, steps, delta, orders)
  want, want_order = oracle_epsilon(q, z, steps, delta, orders)
  assert eps == pytest.approx(want, rel=1e-3, abs=1e-9)
  if want > 1e-6:
    assert order == want_order
  # with every order (ours converge where the oracle's gave up) never looser
  assert acc.dpsgd_epsilon(q, z, steps, delta)[0] <= want * (1 + 1e-9)


def test_rdp_curve_matches_dp_accounting_order_by_order():
  orders = acc.DEFAULT_ORDERS
  for q, z in [(0.01, 0.3), (0.05, 1.0), (0.2, 2.0), (0.9, 100.0)]:
    mine = acc.poisson_gaussian_rdp(q, z)
    a = dpa_rdp.RdpAccountant(orders=list(orders))
    a.compose(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z)), 1)
    theirs = np.asarray(a._rdp)
    finite = np.isfinite(theirs)
    np.testing.assert_allclose(mine[finite], theirs[finite], rtol=1e-6, atol=1e-12)


def test_public_vectors():
  # TF-Privacy: q = 150/60000, z = 1.3, 15 epochs, delta 1e-5 -> 0.7242 at order 19
  steps = int(np.ceil(15 * 60000 / 150))
  eps, order = acc.dpsgd_epsilon(150 / 60000, 1.3, steps, 1e-5)
  assert eps == pytest.approx(0.7242, abs=5e-4) and order == 19
  # q = 100/1e5, z = 1.0, 30 epochs, delta 1e-7 -> 1.4155 at order 13
  eps, order = acc.dpsgd_epsilon(100 / 1e5, 1.0, int(30 * 1e5 / 100), 1e-7)
  assert eps == pytest.approx(1.4155, abs=5e-4) and order == 13
  # Opacus: q = 0.04, z = 1.5, 2250 steps, delta 1e-5 -> 7.3291 (dp-accounting 7.3293)
  eps, _ = acc.dpsgd_epsilon(0.04, 1.5, 2250, 1e-5)
  assert eps == pytest.approx(7.3292, abs=3e-4)
  # RDP at orders [1.5, 2.5, 5, 50, 100] for q = 0.01, z = 2.5, 50 steps
  orders = [1.5, 2.5, 5, 50, 100]
  rdp = 50 * acc.poisson_gaussian_rdp(0.01, 2.5, orders)
  np.testing.assert_allclose(rdp, [6.70579741e-4, 1.08548710e-3, 2.18075656e-3, 2.38460375e-2,
                                   1.67416308e2], rtol=1e-6)
  # JAX_NOTES: q = 0.01, z = 1.1, 1000 steps, delta 1e-5 -> 1.711770
  assert acc.dpsgd_epsilon(0.01, 1.1, 1000, 1e-5)[0] == pytest.approx(1.711770, rel=1e-5)


def test_unsampled_gaussian_gives_exactly_one_at_one_in_a_million():
  # z = 4.530877117 is calibrated so that one release is (1, 1e-6)-DP
  # under the RDP conversion with the default orders
  eps, _ = acc.epsilon_np(acc.gaussian_rdp(4.530877117), 1e-6)
  want, _ = oracle_epsilon(1.0, 4.530877117, 1, 1e-6)
  assert eps == pytest.approx(want, rel=1e-6)


def test_never_below_pld():
  from dp_accounting.pld import pld_privacy_accountant
  for q, z, steps in [(0.01, 1.1, 1000), (0.1, 2.0, 200)]:
    pld = pld_privacy_accountant.PLDAccountant()
    pld.compose(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z)), steps)
    assert acc.dpsgd_epsilon(q, z, steps, 1e-5)[0] >= pld.get_epsilon(1e-5)


def test_monotone():
  e = lambda q, z, t: acc.dpsgd_epsilon(q, z, t, 1e-5)[0]
  assert e(0.01, 1.0, 100) < e(0.01, 1.0, 1000) < e(0.01, 1.0, 10000)
  assert e(0.001, 1.0, 500) < e(0.01, 1.0, 500) < e(0.1, 1.0, 500)
  assert e(0.01, 0.8, 500) > e(0.01, 1.0, 500) > e(0.01, 2.0, 500)


def test_stable_at_the_edges():
  for q, z, t in [(1e-6, 0.3, 10**6), (1.0, 100.0, 10**6), (0.5, 0.3, 10), (1e-4, 100.0, 1)]:
    eps, _ = acc.dpsgd_epsilon(q, z, t, 1e-5)
    want, _ = oracle_epsilon(q, z, t, 1e-5)
    assert np.isfinite(eps)
    assert eps == pytest.approx(want, rel=1e-3, abs=1e-6)


def test_jitted_vmapped_ledger_equals_the_scalar_computation():
  event = acc.poisson_gaussian_rdp(0.02, 1.2)
  participations = jnp.array([0, 1, 7, 300], jnp.int32)

  @jax.jit
  def run(ledgers):
    ledgers = acc.compose(ledgers, event, participations)
    return jax.vmap(lambda l: acc.epsilon(l, 1e-5))(ledgers)

  eps, orders = run(acc.init_ledger(shape=(4,)))
  for k, n in enumerate([0, 1, 7, 300]):
    want, want_order = acc.dpsgd_epsilon(0.02, 1.2, n, 1e-5) if n else (0.0, None)
    assert float(eps[k]) == pytest.approx(want, rel=1e-5, abs=1e-6)
  # delta_for_epsilon inverts epsilon
  ledger = acc.compose(acc.init_ledger(), event, 300)
  e, _ = acc.epsilon(ledger, 1e-5)
  assert float(acc.delta_for_epsilon(ledger, float(e))) == pytest.approx(1e-5, rel=1e-3)


def test_multi_part_gaussian_adds_over_parts():
  rdp = acc.multi_part_gaussian_rdp([1.0, 2.0, 4.0])
  a = dpa_rdp.RdpAccountant(orders=list(acc.DEFAULT_ORDERS))
  a.compose(dpa.ComposedDpEvent([dpa.GaussianDpEvent(z) for z in (1.0, 2.0, 4.0)]))
  np.testing.assert_allclose(rdp, a._rdp, rtol=1e-12)


def test_calibration_reaches_the_target():
  z = acc.calibrate_noise_multiplier(2.0, 0.01, 1000, 1e-5)
  assert acc.dpsgd_epsilon(0.01, z, 1000, 1e-5)[0] <= 2.0
  assert acc.dpsgd_epsilon(0.01, z * 0.99, 1000, 1e-5)[0] > 2.0


def _scalar_log_a_fractional(q, z, a):
  """The fractional-order series as one scalar loop, term by term (the code before the
  terms were computed in numpy blocks)."""
  def log_add(x, y):
    if -math.inf in (x, y):
      return max(x, y)
    return max(x, y) + math.log1p(math.exp(min(x, y) - max(x, y)))

  def log_erfc(x):
    return float(np.log(special.erfcx(x))) - x * x if x > 0 else math.log(special.erfc(x))

  z0 = z * z * math.log(1 / q - 1) + 0.5
  log_a0 = log_a1 = last0 = last1 = -math.inf
  for i in range(100000):
    log_coef = float(special.gammaln(a + 1) - special.gammaln(i + 1) - special.gammaln(a - i + 1))
    j = a - i
    log_s0 = (log_coef + i * math.log(q) + j * math.log1p(-q) + (i * i - i) / (2 * z * z)
              + (math.log(0.5) + log_erfc((i - z0) / (math.sqrt(2) * z))))
    log_s1 = (log_coef + j * math.log(q) + i * math.log1p(-q) + (j * j - j) / (2 * z * z)
              + (math.log(0.5) + log_erfc((z0 - j) / (math.sqrt(2) * z))))
    log_a0, log_a1 = log_add(log_a0, log_s0), log_add(log_a1, log_s1)
    total = log_add(log_a0, log_a1)
    if log_s0 < last0 and log_s1 < last1 and max(log_s0, log_s1) < total - 30:
      return total
    last0, last1 = log_s0, log_s1
  return math.inf


@pytest.mark.parametrize("q", [1e-4, 0.01, 0.5, 0.999])
def test_fractional_orders_equal_the_scalar_series_bit_for_bit(q):
  """Golden hashes hold the privacy reports: the numpy blocks must change no bit."""
  for z in (0.1, 0.588, 1.33, 5.0, 100.0):
    for a in (1.25, 1.5, 2.5, 3.75, 10.5, 20.5):
      assert acc._log_a_fractional(q, z, a) == _scalar_log_a_fractional(q, z, a), (q, z, a)


def test_calibration_equals_a_plain_bisection_and_skips_the_large_multipliers():
  """Epsilon falls as z grows, so mids above a z found to meet the target are not
  evaluated (the fixed-size accountant takes seconds at z ~ 500); the result is the
  plain bisection's to the bit."""
  def plain(target, f, low=0.1, high=1000.0, tol=1e-4):
    if f(high) > target:
      raise ValueError("out of reach")
    if f(low) <= target:
      return low
    while high - low > tol * high:
      mid = 0.5 * (low + high)
      high, low = (mid, low) if f(mid) <= target else (high, mid)
    return high

  f = lambda z: acc.dpsgd_epsilon(0.01, z, 1000, 1e-5)[0]
  for target in (0.05, 0.5, 2.0, 8.0, 400.0):
    asked = []
    z = acc.calibrate_noise_multiplier(target, 0.01, 1000, 1e-5,
                                       epsilon_fn=lambda z: asked.append(z) or f(z))
    assert z == plain(target, f)
    assert max(asked) < 2 * z + 0.2        # doubling stops at the first z that meets it
  with pytest.raises(ValueError, match="out of reach even with noise multiplier 1000"):
    acc.calibrate_noise_multiplier(1e-4, 0.01, 1000, 1e-5)


@pytest.mark.parametrize("bad", [dict(q=0.0), dict(q=1.5), dict(noise_multiplier=0.0)])
def test_bad_arguments(bad):
  args = dict(q=0.1, noise_multiplier=1.0)
  args.update(bad)
  with pytest.raises(ValueError, match="must be"):
    acc.poisson_gaussian_rdp(**args)


# ------------------------------------------------------- fixed-size cohorts (WBK 2019)


def oracle_fixed_rdp(m, n, z, orders=acc.DEFAULT_ORDERS):
  a = dpa_rdp.RdpAccountant(orders=list(orders),
                            neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
  a.compose(dpa.SampledWithoutReplacementDpEvent(n, m, dpa.GaussianDpEvent(z)), 1)
  return np.asarray(a._rdp)


@pytest.mark.parametrize("m,n", [(10, 100), (100, 60000), (30, 100), (5, 20)])
@pytest.mark.parametrize("z", [0.3, 1.0, 4.0])
def test_fixed_size_rdp_matches_dp_accounting(m, n, z):
  mine = acc.fixed_size_gaussian_rdp(m, n, z)
  theirs = oracle_fixed_rdp(m, n, z)
  # same bound order by order up to 256, where ours is also capped by the unsampled
  # Gaussian (binding at large m/n and small z); beyond 256 ours keeps the moment arm
  upto = acc.DEFAULT_ORDERS <= 256
  capped = np.minimum(theirs, acc.gaussian_rdp(z))
  np.testing.assert_allclose(mine[upto], capped[upto], rtol=1e-9)
  assert np.all(mine <= theirs * (1 + 1e-12))
  for steps, delta in [(1, 1e-5), (1000, 1e-6)]:
    want, want_order = dpa_rdp.RdpAccountant(
        orders=list(acc.DEFAULT_ORDERS),
        neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE).compose(
            dpa.SampledWithoutReplacementDpEvent(n, m, dpa.GaussianDpEvent(z)),
            steps).get_epsilon_and_optimal_order(delta)
    eps, order = acc.fixed_size_epsilon(m, n, z, steps, delta)
    assert eps <= want * (1 + 1e-9)
    if z >= 1:  # the cap does not bind at the optimal order
      assert eps == pytest.approx(want, rel=1e-3, abs=1e-9)


def test_likelihood_ratio_moments_against_quadrature():
  """E_Q[(P/Q - 1)^j] by the exact decimal forward difference against numerical
  integration over u ~ N(0, 1), x = z u, P/Q = exp((2x - 1) / (2 z^2))."""
  from scipy import special
  u = np.linspace(-150, 150, 1_500_001)
  for z in [1.0, 10.0, 100.0]:
    moments = acc._log_likelihood_ratio_moments(z)
    with np.errstate(divide="ignore"):
      log_ratio_m1 = np.log(np.abs(np.expm1((2 * z * u - 1) / (2 * z * z))))
    for j in [2, 4, 10, 66] + ([128, 256] if z >= 10 else []):
      quad = special.logsumexp(-u * u / 2 + j * log_ratio_m1) + np.log(u[1] - u[0]) \
          - 0.5 * np.log(2 * np.pi)
      assert moments[j] == pytest.approx(quad, abs=1e-6), (z, j)
  # large z: close to the Gaussian moments (j - 1)!! / z^j
  assert acc._log_likelihood_ratio_moments(1e3)[4] == pytest.approx(np.log(3 / 1e12), abs=1e-2)


def test_fixed_size_at_large_noise_is_tighter_than_dp_accountings_float_differences():
  # dp-accounting takes the forward differences in float64 log space; at z = 100
  # they cancel to nothing and its bound falls back to the coarse arm
  mine, theirs = acc.fixed_size_gaussian_rdp(3, 10, 100.0), oracle_fixed_rdp(3, 10, 100.0)
  assert np.all(mine <= theirs * (1 + 1e-12)) and np.any(mine < 0.5 * theirs)


def test_fixed_size_edges():
  # the whole population every step is the plain Gaussian
  np.testing.assert_allclose(acc.fixed_size_gaussian_rdp(50, 50, 2.0), acc.gaussian_rdp(2.0))
  # subsampling only helps, and more of it helps more
  full = acc.gaussian_rdp(1.0)
  r10, r50 = acc.fixed_size_gaussian_rdp(10, 100, 1.0), acc.fixed_size_gaussian_rdp(50, 100, 1.0)
  assert np.all(r10 <= r50 + 1e-15) and np.all(r50 <= full + 1e-12)
  with pytest.raises(ValueError, match="1 <= m <= n"):
    acc.fixed_size_gaussian_rdp(11, 10, 1.0)


def test_heterogeneous_rounds_compose_like_dp_accounting():
  """Rounds with different mechanisms add in the ledger, order by order."""
  events = [(0.01, 1.0, 100), (0.05, 2.0, 30), (1.0, 5.0, 2)]
  ledger = acc.init_ledger()
  a = dpa_rdp.RdpAccountant(orders=list(acc.DEFAULT_ORDERS))
  for q, z, t in events:
    ledger = acc.compose(ledger, acc.poisson_gaussian_rdp(q, z), t)
    a.compose(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z)), t)
  want, want_order = a.get_epsilon_and_optimal_order(1e-5)
  eps, order = acc.epsilon(ledger, 1e-5)
  assert float(eps) == pytest.approx(want, rel=1e-4)
  assert float(order) == pytest.approx(want_order)


def test_float32_ledger_rounds_up_never_below_the_exact_rdp():
  event = acc.poisson_gaussian_rdp(0.013, 0.9)
  steps = 20000
  ledger, _ = jax.jit(lambda l: jax.lax.scan(lambda l, _: (acc.compose(l, event), None), l, None,
                                             length=steps))(acc.init_ledger())
  exact = steps * event
  ledger = np.asarray(ledger, np.float64)
  assert np.all(ledger >= exact)
  assert np.all(ledger <= exact * (1 + 2.4e-7 * steps))
  # a zero count adds nothing, even after rounding up
  np.testing.assert_array_equal(acc.compose(acc.init_ledger(), event, 0), 0.0)
