"""Budget allocation: the paper's projected gradient ascent against the closed-form
optimum, its constraints, and the tier table."""

import math

import numpy as np
import pytest
from scipy import optimize

from fedjax_dp.privacy import budgets


def test_interior_optimum_matches_the_hand_derived_formula():
  # no bound binds: eps_i = ln(g_i / lam) / g_i with
  # ln lam = (sum ln(g_i) / g_i - total) / sum 1 / g_i
  g = np.array([1.0, 2.0, 4.0])
  total = 1.5
  log_lam = (np.sum(np.log(g) / g) - total) / np.sum(1 / g)
  want = (np.log(g) - log_lam) / g
  assert np.all(want > 0.01) and np.all(want < 5)
  got_cf = np.asarray(budgets.allocate_closed_form(g, total, 0.01, 5.0))
  got_pga = np.asarray(budgets.allocate_pga(g, total, 0.01, 5.0))
  np.testing.assert_allclose(got_cf, want, atol=1e-5)
  np.testing.assert_allclose(got_pga, want, atol=1e-3)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pga_meets_constraints_and_matches_scipy_with_bounds(seed):
  rng = np.random.default_rng(seed)
  n = 12
  g = rng.uniform(0.5, 5.0, size=n)
  lo, hi = rng.uniform(0.05, 0.2, size=n), rng.uniform(0.5, 1.5, size=n)
  total = 0.5 * (lo.sum() + hi.sum())
  ref = optimize.minimize(lambda e: -np.sum(1 - np.exp(-g * e)), (lo + hi) / 2 * 0.9,
                          jac=lambda e: -g * np.exp(-g * e), method="SLSQP",
                          bounds=list(zip(lo, hi)),
                          constraints=[{"type": "ineq", "fun": lambda e: total - e.sum()}],
                          options={"ftol": 1e-12, "maxiter": 500}).x
  for solver, tol in [(budgets.allocate_closed_form, 1e-4), (budgets.allocate_pga, 2e-3)]:
    got = np.asarray(solver(g, total, lo, hi), np.float64)
    assert got.sum() <= total + 1e-4
    assert np.all(got >= lo - 1e-6) and np.all(got <= hi + 1e-6)
    np.testing.assert_allclose(got, ref, atol=tol)
    util = lambda e: np.sum(1 - np.exp(-g * e))
    assert util(got) >= util(ref) - 1e-4


def test_loose_total_gives_every_client_its_maximum():
  g = np.array([1.0, 3.0])
  np.testing.assert_allclose(budgets.allocate_closed_form(g, 10.0, 0.1, 1.0), [1.0, 1.0])
  np.testing.assert_allclose(budgets.allocate_pga(g, 10.0, 0.1, 1.0), [1.0, 1.0], atol=1e-6)


def test_projection_against_a_quadratic_program():
  rng = np.random.default_rng(4)
  x = rng.normal(size=8)
  lo, hi, total = -0.5 * np.ones(8), np.ones(8), 1.0
  ref = optimize.minimize(lambda z: np.sum((z - x) ** 2), np.zeros(8), method="SLSQP",
                          bounds=list(zip(lo, hi)),
                          constraints=[{"type": "ineq", "fun": lambda z: total - z.sum()}],
                          options={"ftol": 1e-14}).x
  np.testing.assert_allclose(budgets.project(x, total, lo, hi), ref, atol=1e-5)


def test_tier_table_is_the_papers():
  t = budgets.TIER_BUDGETS
  assert [t[k].epsilon for k in ("high", "medium", "low", "public")] == [0.1, 0.5, 1.0, 2.0]
  assert [(t[k].low, t[k].high) for k in ("high", "medium", "low", "public")] == [
      (0.05, 0.15), (0.3, 0.7), (0.8, 1.5), (1.5, 3.0)]
  assert [t[k].delta for k in ("high", "medium", "low", "public")] == [1e-7, 1e-6, 1e-5, 1e-4]
  assert [t[k].weight for k in budgets.TIERS] == [2.5, 1.5, 1.0, 0.5, 0.0]
  assert math.isinf(t["metadata"].epsilon)
