"""The empirical privacy audit (privacy/audit.py, `fedjax-dp audit`): the
Gaussians' epsilon against the Gaussian DP closed form and dp-accounting, the
canary stage, and audits that pass where the accountant is right and fail where
the round applies half the noise it charges."""

import json
import math
import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
from scipy.stats import norm

from fedjax_dp.privacy import audit


def gdp_delta(eps, mu):
  """Dong, Roth, Su: mu-GDP's delta(eps)."""
  return norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)


@pytest.mark.parametrize("mu", [0.5, 1.0, 2.236, 4.0])
def test_equal_variances_are_gaussian_dp(mu):
  for eps in (0.1, 1.0, 3.0, 8.0):
    assert audit.gaussians_delta(eps, 0.3 + 2 * mu, 2.0, 0.3, 2.0) == pytest.approx(
        max(gdp_delta(eps, mu), 0.0), abs=1e-12)


@pytest.mark.parametrize("mu,eps", [(4.0, 24.38), (5.0, 33.10), (6.0, 42.84)])
def test_large_epsilons_keep_their_tails(mu, eps):
  """1 - cdf cancelled Q's upper tail to 0 and overstated these by up to 0.75
  (an audit's finding): the exact mu-GDP epsilon at delta 1e-5."""
  got = audit.gaussians_epsilon(mu, 1.0, 0.0, 1.0, 1e-5)
  assert got == pytest.approx(eps, abs=0.01)
  assert gdp_delta(got, mu) == pytest.approx(1e-5, rel=1e-4)


def test_the_estimate_needs_canaries_and_copes_with_no_spread():
  with pytest.raises(ValueError, match="at least 10 inserted and held-out"):
    audit.estimate(np.ones(3), np.zeros(3), 1e-5)
  # identical cosines within each set: every resample has no spread
  r = audit.estimate(np.full(12, 0.1), np.zeros(12), 1e-5, bootstrap=20)
  assert r["empirical_epsilon"] == math.inf and r["ci95"] == [math.inf, math.inf]
  rng = np.random.default_rng(0)
  r = audit.estimate(rng.normal(0, 1, 50), rng.normal(0, 1, 50), 1e-5, bootstrap=50)
  assert 0 <= r["ci95"][0] <= r["empirical_epsilon"] <= r["ci95"][1] < 3


@pytest.mark.parametrize("z", [0.5, 1.0, 2.0])
def test_the_gaussian_mechanisms_epsilon_is_dp_accountings(z):
  """N(1, z^2) against N(0, z^2) is one Gaussian mechanism of sensitivity 1."""
  import dp_accounting
  from dp_accounting.pld import pld_privacy_accountant
  acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
  acc.compose(dp_accounting.GaussianDpEvent(z))
  want = acc.get_epsilon(1e-5)
  assert audit.gaussians_epsilon(1.0, z, 0.0, z, 1e-5) == pytest.approx(want, rel=2e-3)


def test_unequal_variances_against_numerical_integration():
  x = np.linspace(-40, 40, 2_000_001)
  for (m1, s1, m0, s0) in [(1.0, 1.5, 0.0, 1.0), (0.5, 0.7, 0.0, 1.0), (2.0, 1.0, 0.0, 1.3)]:
    p, q = norm.pdf(x, m1, s1), norm.pdf(x, m0, s0)
    for eps in (0.0, 0.5, 2.0):
      want = np.trapezoid(np.maximum(p - math.exp(eps) * q, 0), x)
      assert audit.gaussians_delta(eps, m1, s1, m0, s0) == pytest.approx(want, abs=1e-7)


def test_the_canary_stage_replaces_the_canaries_uploads_alone():
  n, count, seed = 12, 4, 7
  table = audit.canary_clients(n, count, seed)
  assert table.sum() == count
  np.testing.assert_array_equal(table, audit.canary_clients(n, count, seed))
  stage = audit.make_canary_stage(n, count, seed)
  ids = jnp.asarray([3, 0, 11, 5, 8, 1, 2, 4, 6, 7, 9, 10])
  uploads = {"w": jnp.ones((12, 3, 2)), "b": jnp.full((12, 2), 2.0)}
  out = stage(uploads, ids, jnp.float32(0.5))
  # ravel_pytree's order: the leaves by key, "b" then "w"
  flat = np.concatenate([np.asarray(out["b"]), np.asarray(out["w"]).reshape(12, -1)], axis=1)
  is_canary = table[np.asarray(ids)]
  np.testing.assert_array_equal(flat[~is_canary], np.r_[2.0, 2.0, np.ones(6)][None].repeat(
      int((~is_canary).sum()), 0))
  np.testing.assert_allclose(np.linalg.norm(flat[is_canary], axis=1), 0.5, rtol=1e-6)
  want = 0.5 * np.asarray(audit.directions(audit.canary_key(seed), ids[is_canary], 8))
  np.testing.assert_allclose(flat[is_canary], want, rtol=1e-6)
  assert audit.make_canary_stage(n, 0, seed) is None


def test_cosines_are_the_model_changes_with_each_direction():
  change = {"a": np.arange(6.0).reshape(2, 3), "b": np.ones(2)}
  inserted, held = audit.cosines(change, 10, 3, 2, seed=1)
  flat = np.r_[np.arange(6.0), 1.0, 1.0]
  key = audit.canary_key(1)
  ids = np.flatnonzero(audit.canary_clients(10, 3, 1))
  dirs = np.asarray(audit.directions(key, jnp.asarray(ids), 8), np.float64)
  np.testing.assert_allclose(inserted, dirs @ flat / np.linalg.norm(flat), rtol=1e-6)
  assert len(held) == 2


AUDITED = dict(dataset="synthetic", synthetic_examples=2400, synthetic_features=100,
               synthetic_classes=10, num_clients=240, clients_per_round=240, sampling="poisson",
               accountant="pld", local_epochs=1, rounds=5, eval_every=5, hidden=[64], lr=0.1,
               noise_multiplier=1.0, clip_norm=1.0)


@pytest.mark.slow
@pytest.mark.parametrize("dp,factor,exceeds", [("central", None, False), ("local", None, False),
                                                ("central", 0.5, True)])
def test_the_audit_passes_an_honest_accountant_and_catches_one_that_undercharges(
    tmp_path, dp, factor, exceeds):
  """Every client in every round (Poisson q = 1), a plain server step: the
  central release is the Gaussian mechanism the PLD accountant charges exactly
  (11.48; measured 11.15, interval 9.8-12.6). With half the charged noise the
  estimate is 20.7 (18.8-22.6): above. Local DP's final model hides each upload
  among the others' noise: 0.7 against the accounted 28.4."""
  import fedjax_dp
  report = fedjax_dp.audit(
      {**AUDITED, "dp": dp}, out=str(tmp_path / "a"), canaries=200, bootstrap=300,
      progress=False, log=lambda m: None, undercharge=factor)
  acc = report["accounted_epsilon"]
  # local DP charges each upload as released (replace-one: sensitivity 2 clip_norm)
  assert acc == pytest.approx({"central": 11.48, "local": 28.37}[dp], abs=0.05)
  assert report["exceeds_accounted"] == exceeds
  if not exceeds:
    assert report["ci95"][0] <= acc
  else:
    assert report["ci95"][0] > 1.5 * acc
  with open(tmp_path / "a" / "audit.json") as f:
    assert json.load(f) == report


def cli(*args):
  exe = os.path.join(os.path.dirname(sys.executable), "fedjax-dp")
  return subprocess.run([exe, "audit", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.slow   # make test's 10 minutes (CI runs it in make test-slow)
def test_cli_audits_a_small_run_and_refuses_what_it_cannot_audit(tmp_path):
  keys = ["dataset=synthetic", "synthetic_examples=400", "num_clients=40",
          "clients_per_round=40", "rounds=1", "eval_every=1", "hidden=[8]", "dp=central",
          "noise_multiplier=1.0"]
  done = cli("--set", *keys, "--canaries", "20", "--bootstrap", "50", "--out",
             str(tmp_path / "a"), "--no-progress")
  assert done.returncode == 0, done.stderr
  assert "privacy audit: 20 canaries inserted, 20 held out" in done.stdout
  report = json.loads((tmp_path / "a" / "audit.json").read_text())
  assert report["canaries"] == 20 and report["accounted_epsilon"] > 0
  again = cli("--set", *keys, "--canaries", "20", "--out", str(tmp_path / "a"))
  assert again.returncode == 2 and "is not empty" in again.stderr
  nodp = cli("--set", *keys[:-2], "--canaries", "20", "--out", str(tmp_path / "b"))
  assert nodp.returncode == 2 and "dp 'none' has no differential-privacy" in nodp.stderr
  few = cli("--set", *keys, "--canaries", "5", "--out", str(tmp_path / "d"))
  assert few.returncode == 2 and "at least 10 of each" in few.stderr
  many = cli("--set", *keys, "--canaries", "40", "--out", str(tmp_path / "c"))
  assert many.returncode == 2 and "'audit_canaries' = 40: must be below num_clients" in (
      many.stderr)
  bad = cli("--set", *keys, "--canaries", "20", "--undercharge", "1.5", "--out",
            str(tmp_path / "e"))
  assert bad.returncode == 2 and "--undercharge 1.5: a fraction in (0, 1)" in bad.stderr
  test_mode = cli("--set", *keys, "--canaries", "20", "--bootstrap", "50", "--undercharge",
                  "0.5", "--out", str(tmp_path / "f"), "--no-progress")
  assert test_mode.returncode == 0, test_mode.stderr
  assert test_mode.stdout.startswith("TEST MODE: the rounds applied 0.5 times the noise")
  assert "undercharged_test_mode" in json.loads((tmp_path / "f" / "audit.json").read_text())
