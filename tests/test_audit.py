"""The empirical privacy audit (adversary/audit.py, `fedjax-dp audit`): the
Gaussians' epsilon against the Gaussian DP closed form and dp-accounting, the
canary stage, the all-iterates statistic against numpy, the multi-run bound
against scipy's exact binomial intervals and randomized response, and audits
that pass where the accountant is right and fail where the round applies less
noise than it charges."""

import json
import math
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.stats import norm

from fedjax_dp.adversary import audit


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
  out, present = stage(uploads, ids, jnp.float32(0.5), jnp.float32(1.0))
  assert np.all(np.asarray(present))
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


def test_the_canary_scale_flips_the_canaries_or_leaves_them_out_and_needs_canaries():
  from fedjax_dp import make_config
  from fedjax_dp.errors import ConfigError
  stage = audit.make_canary_stage(10, 3, 2)
  uploads = {"w": jnp.ones((10, 4))}
  ids = jnp.arange(10)
  is_canary = audit.canary_clients(10, 3, 2)
  up, _ = stage(uploads, ids, jnp.float32(2.0), jnp.float32(1.0))
  down, present = stage(uploads, ids, jnp.float32(2.0), jnp.float32(-1.0))
  np.testing.assert_array_equal(np.asarray(down["w"]), np.where(
      is_canary[:, None], -np.asarray(up["w"]), 1.0))
  assert np.all(np.asarray(present))
  _, present = stage(uploads, ids, jnp.float32(2.0), jnp.float32(0.0))
  np.testing.assert_array_equal(np.asarray(present), ~is_canary)
  with pytest.raises(ConfigError, match="'audit_canary_scale'.*audit_canaries > 0"):
    make_config({"dp": "central", "noise_multiplier": 1.0, "audit_canary_scale": 0.0})
  with pytest.raises(ConfigError, match="audit_canary_scale"):
    make_config({"dp": "central", "noise_multiplier": 1.0, "audit_canaries": 2,
                 "audit_canary_scale": -1.5})


def test_the_iterate_tracker_keeps_each_directions_largest_cosine_with_a_rounds_change():
  n, count, held, seed = 12, 3, 2, 4
  rng = np.random.default_rng(0)
  thetas = [{"b": rng.normal(size=2).astype(np.float32),
             "w": rng.normal(size=(3, 2)).astype(np.float32)} for _ in range(3)]
  thetas.insert(2, thetas[1])          # a skipped round: no change, no observation
  update, result = audit.iterate_tracker(n, count, held, seed, thetas[0])
  for p in thetas[1:]:
    update(p)
  inserted, outside = result()
  flat = [np.concatenate([t["b"], t["w"].ravel()]).astype(np.float64) for t in thetas]
  ids = np.concatenate([np.flatnonzero(audit.canary_clients(n, count, seed)), n + np.arange(held)])
  dirs = np.asarray(audit.directions(audit.canary_key(seed), jnp.asarray(ids), 8), np.float64)
  changes = [b - a for a, b in zip(flat, flat[1:]) if np.any(b != a)]
  want = np.max([dirs @ (c / np.linalg.norm(c)) for c in changes], axis=0)
  np.testing.assert_allclose(np.concatenate([inserted, outside]), want, rtol=1e-5, atol=1e-6)


def test_clopper_pearson_is_scipys_exact_interval():
  from scipy.stats import binomtest
  for k, n in [(0, 50), (3, 50), (25, 50), (49, 50), (7, 1000)]:
    want = binomtest(k, n).proportion_ci(confidence_level=0.9, method="exact").high
    assert audit.clopper_pearson_upper(k, n, 0.05) == pytest.approx(want, rel=1e-9)
  assert audit.clopper_pearson_upper(50, 50, 0.05) == 1.0


def randomized_response(eps, n, rng, inserted):
  """The bit a pure eps-DP randomized response releases: 1 with e^eps / (1 + e^eps)
  where the canary is in, with 1 / (1 + e^eps) where not."""
  p = math.exp(eps) / (1 + math.exp(eps)) if inserted else 1 / (1 + math.exp(eps))
  return (rng.random(n) < p).astype(np.float64)


def binomial_bound(inserted, held_out, alpha):
  """Steinke et al. 2023's one-run bound at delta 0, written from the paper with
  scipy: guessing 'in' for the r canaries scoring >= t, of which v are in, an
  epsilon-DP release makes v at most Binomial(r, e^eps / (1 + e^eps)); the bound
  at t is the largest epsilon whose tail P(X >= v) is below alpha. The largest
  over the thresholds the audit tries (the k-th highest score, k a fixed share)."""
  from scipy.stats import beta
  scores = np.concatenate([inserted, held_out])
  best = 0.0
  for t in audit.guess_thresholds(scores):
    r, v = int(np.sum(scores >= t)), int(np.sum(inserted >= t))
    q = beta.ppf(alpha, v, r - v + 1)   # P(Binomial(r, q) >= v) = alpha
    if v > 0 and q > 0.5:
      best = max(best, math.log(q / (1 - q)))
  return best


@pytest.mark.parametrize("mu", [1.0, 2.0, 3.0])
def test_the_one_run_bound_is_the_papers_binomial_tail(mu):
  """The bound (jax-privacy's at each threshold, delta 1e-12) is the binomial tail of
  the paper at the Bonferroni level over the thresholds tried, to the root finder's
  tolerance; delta's term lowers it; the ceiling is what perfect guesses give."""
  rng = np.random.default_rng(int(mu * 10))
  ins, out = rng.normal(mu, 1, 150), rng.normal(0, 1, 150)
  got = audit.one_run_bounds(ins, out, 1e-12, confidence=0.95)
  tried = len(audit.guess_thresholds(np.concatenate([ins, out])))
  assert got["thresholds_tried"] == tried
  assert got["epsilon_one_run"] == pytest.approx(binomial_bound(ins, out, 0.05 / tried), abs=1e-5)
  assert got["epsilon_one_run"] > 0.5
  assert audit.one_run_bounds(ins, out, 1e-3)["epsilon_one_run"] < got["epsilon_one_run"]
  perfect = binomial_bound(np.ones(150), np.zeros(150), 0.05 / tried)
  assert got["largest_possible_bound"] == pytest.approx(perfect, abs=1e-5)


def test_the_thresholds_tried_follow_the_scores_alone():
  """Fixed shares of the highest scores: the same set whichever canaries were in."""
  scores = np.random.default_rng(0).normal(size=400)
  got = audit.guess_thresholds(scores)
  want = np.sort(scores)[::-1][[1, 3, 7, 19, 39, 79, 119, 199]]
  np.testing.assert_array_equal(got, np.sort(want))


def test_the_one_run_bounds_hold_for_a_gaussian_mechanism_and_say_their_terms():
  """A mu-GDP release's canary scores (N(mu, 1) in, N(0, 1) out): over 20 runs no
  one-run bound, nor its f-DP refinement (valid here: the trade-off curve is a
  Gaussian's), passes the mechanism's exact epsilon (the GDP closed form); with no
  signal both are 0; unequal halves give none, and say why."""
  rng = np.random.default_rng(1)
  exact = audit.gaussians_epsilon(2.0, 1.0, 0.0, 1.0, 1e-5)
  for _ in range(20):
    r = audit.one_run_bounds(rng.normal(2, 1, 200), rng.normal(0, 1, 200), 1e-5,
                             gaussian_release=True)
    assert 0 < r["epsilon_one_run"] < exact and 0 < r["epsilon_one_run_fdp"] < exact
    assert r["epsilon_one_run"] <= r["epsilon_one_run_fdp"]
    assert 0.85 < r["auroc"] < 0.99 and r["tpr_at_fpr"]["0.01"] < r["tpr_at_fpr"]["0.1"]
  assert "independent coins" in r["assumes"] and "one Gaussian mechanism" in r["fdp_is"]
  assert r["fdp_is_a_bound_here"]
  same = rng.normal(0, 1, 400)
  none = audit.one_run_bounds(same[:200], same[200:], 1e-5)
  assert none["epsilon_one_run"] == none["epsilon_one_run_fdp"] == 0.0
  assert not none["fdp_is_a_bound_here"]
  odd = audit.one_run_bounds(rng.normal(2, 1, 100), rng.normal(0, 1, 50), 1e-5)
  assert odd["epsilon_one_run"] is None and "prior of one half" in odd["why_none"]
  few = audit.attack_rates(rng.normal(2, 1, 20), rng.normal(0, 1, 20))
  assert few["tpr_at_fpr"]["0.01"] is None and few["tpr_at_fpr"]["0.1"] is not None
  with pytest.raises(ValueError, match="finite"):
    audit.one_run_bounds(np.r_[rng.normal(0, 1, 99), np.inf], rng.normal(0, 1, 100), 1e-5)


def randomized_response_scores(eps, n, rng, inserted):
  """Randomized response's bit (pure eps-DP, the hardest case for the bound), with
  a small jitter so that scores are distinct."""
  p = math.exp(eps) / (1 + math.exp(eps)) if inserted else 1 / (1 + math.exp(eps))
  return (rng.random(n) < p).astype(np.float64) + 1e-3 * rng.random(n)


@pytest.mark.slow   # 100 audits: make test-slow
def test_the_one_run_bound_holds_its_level_on_randomized_response():
  """Randomized response at epsilon 2, 100 canaries in and 100 out (as the audit
  inserts them, exactly half): the 95 % bound passes the exact epsilon in at most 5
  of 100 audits (measured: none, largest 1.98), and it comes close (median 1.24)."""
  rng = np.random.default_rng(3)
  bounds = [audit.one_run_bounds(randomized_response_scores(2.0, 100, rng, True),
                                 randomized_response_scores(2.0, 100, rng, False),
                                 1e-5)["epsilon_one_run"] for _ in range(100)]
  assert sum(b > 2.0 for b in bounds) <= 5
  assert np.median(bounds) > 1.0


def test_the_multi_run_bound_holds_with_its_confidence_and_comes_close():
  """Randomized response at epsilon 1 (delta 0) is exactly as distinguishable as
  its epsilon: over 200 audits of 2,000 runs a side the bound passes 1 in at most
  5 % of them (at most 20 of 200, a generous margin), and it is not vacuous."""
  rng = np.random.default_rng(0)
  bounds = [audit.threshold_bound(randomized_response(1.0, 2000, rng, True),
                                  randomized_response(1.0, 2000, rng, False), 0.0,
                                  seed=i)["epsilon_lower_bound"] for i in range(200)]
  assert sum(b > 1.0 for b in bounds) <= 20
  assert np.median(bounds) > 0.8
  # a Gaussian mechanism at mu 4 (exact epsilon at 1e-5: ~17) with 500 runs a side
  r = audit.threshold_bound(rng.normal(4, 1, 500), rng.normal(0, 1, 500), 1e-5)
  assert 2.0 < r["epsilon_lower_bound"] < audit.gaussians_epsilon(4, 1, 0, 1, 1e-5)
  assert r["runs_tested"] == [250, 250] and r["runs_fit"] == [250, 250]
  with pytest.raises(ValueError, match="at least 10 runs"):
    audit.threshold_bound(np.ones(5), np.zeros(30), 1e-5)
  # a NaN is on neither side of a threshold: it would pass for a perfect test
  with pytest.raises(ValueError, match="finite"):
    audit.threshold_bound(np.r_[rng.normal(0, 1, 99), np.nan], rng.normal(0, 1, 100), 1e-5)
  # with no error on 50 + 50 held-out runs, at 95 %: the most 100 runs can show
  best = audit.threshold_bound(np.full(100, 1.0), np.zeros(100), 1e-5)
  assert best["false_positives"] == best["false_negatives"] == 0
  assert best["epsilon_lower_bound"] == best["largest_possible_bound"] == pytest.approx(
      math.log((1 - 1e-5 - (1 - 0.025 ** (1 / 50))) / (1 - 0.025 ** (1 / 50))))


def test_the_multi_run_audit_refuses_what_one_figure_cannot_cover(tmp_path):
  from fedjax_dp.experiment import audit_run
  from fedjax_dp.errors import RunError
  base = dict(dataset="synthetic", num_clients=20, clients_per_round=10, dp="central",
              noise_multiplier=1.0)
  run = lambda cfg, **kw: audit_run.audit_runs(cfg, out=str(tmp_path / "x"),
                                               **{"runs": 40, **kw})
  with pytest.raises(RunError, match="--runs 12: at least 20"):
    run(base, runs=12)
  with pytest.raises(RunError, match="--confidence 1.5: a probability"):
    run(base, confidence=1.5)
  with pytest.raises(RunError, match="noise_schedule 'convergence'"):
    run({**base, "noise_schedule": "convergence", "target_epsilon": 5.0,
         "noise_multiplier": None})
  with pytest.raises(RunError, match="clients_per_round 10 of 20"):
    run({**base, "dp": "local"})
  with pytest.raises(RunError, match="'audit_canaries' = 3: the audit sets the canaries"):
    run({**base, "audit_canaries": 3})
  (tmp_path / "x").mkdir()
  (tmp_path / "x" / "keep.txt").write_text("mine")
  with pytest.raises(RunError, match="is not empty"):
    run(base)
  from fedjax_dp import make_config
  assert audit_run.neighbour_scale(make_config({**base, "sampling": "poisson"})) == 0.0
  assert audit_run.neighbour_scale(make_config({**base, "sampling": "fixed"})) == -1.0
  assert audit_run.neighbour_scale(make_config({**base, "dp": "local",
                                                "sampling": "poisson"})) == -1.0


def test_running_round_by_round_changes_nothing(tmp_path):
  """The all-iterates audit's chunks of one round give the model of the usual chunks."""
  import fedjax_dp
  from fedjax_dp.experiment.final_model import load_params
  cfg = dict(dataset="synthetic", synthetic_examples=400, num_clients=20, clients_per_round=10,
             rounds=4, eval_every=4, hidden=[8], dp="central", noise_multiplier=1.0)
  by_round = fedjax_dp.callbacks.Callback(
      on_run_start=lambda ctx: setattr(ctx, "round_by_round", True))
  chunks = []
  seen = fedjax_dp.callbacks.Callback(after_chunk=lambda ctx, s: chunks.append(ctx.round))
  for name, cbs in (("a", [seen]), ("b", [by_round, seen])):
    fedjax_dp.run(cfg, out=str(tmp_path / name), progress=False, log=lambda m: None,
                  callbacks=cbs)
  assert chunks == [4, 1, 2, 3, 4]
  a, b = load_params(str(tmp_path / "a")), load_params(str(tmp_path / "b"))
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


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
  (11.48; measured 9.89, interval 8.65-11.32). With half the charged noise the
  estimate is 20.4 (18.3-22.7): above. Local DP's final model hides each upload
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
  # the one-run bound holds whatever the noise: at most about 3.9 from 400 canaries
  assert 0 <= report["one_run"]["epsilon_one_run"] <= min(acc, 4.0)
  with open(tmp_path / "a" / "audit.json") as f:
    assert json.load(f) == report


@pytest.mark.slow
@pytest.mark.parametrize("dp,factor", [("central", None), ("local", None), ("central", 0.05)])
def test_the_one_run_bound_stays_under_an_honest_accountant_and_catches_an_undercharge(
    tmp_path, dp, factor):
  """At a small accounted epsilon (z 6 for central DP, 2 rounds: 0.87 by PLD), the
  one-run lower bound (a bound at 95 %, not an estimate) is below the accountant's
  figure where the rounds apply the charged noise, and above it where they apply
  a twentieth of it (central: 2.9 against 0.87). Local DP's undercharge is not
  caught from the final model: each upload's noise is hidden among the other 239
  clients' (as the one-shot estimate finds, above)."""
  import fedjax_dp
  cfg = {**AUDITED, "dp": dp, "rounds": 2, "eval_every": 2,
         "noise_multiplier": {"central": 6.0, "local": 12.0}[dp]}
  report = fedjax_dp.audit(cfg, out=str(tmp_path / "a"), canaries=100, bootstrap=100,
                           progress=False, log=lambda m: None, undercharge=factor)
  bound, acc = report["one_run"]["epsilon_one_run"], report["accounted_epsilon"]
  assert acc < 2.0
  assert report["one_run"]["exceeds_accounted"] == (factor is not None) == (bound > acc)


@pytest.mark.slow
@pytest.mark.parametrize("dp", ["tree", "bandmf", "blt"])
def test_the_one_run_bound_stays_under_correlated_noise_and_catches_its_undercharge(
    tmp_path, dp):
  """Each correlated-noise mechanism (cyclic participation: 240 clients in 4 groups,
  8 rounds, two participations each), audited: the one-run lower bound is below
  the accounted epsilon (one Gaussian of multiplier 5: 0.95) with the charged
  noise, and above it with a twentieth of it."""
  import fedjax_dp
  cfg = {**AUDITED, "dp": dp, "sampling": "cyclic", "clients_per_round": 60, "rounds": 8,
         "eval_every": 8, "noise_multiplier": 5.0, "accountant": "rdp"}
  for factor in (None, 0.05):
    report = fedjax_dp.audit(cfg, out=str(tmp_path / f"{dp}-{factor}"), canaries=100,
                             bootstrap=100, progress=False, log=lambda m: None,
                             undercharge=factor)
    bound, acc = report["one_run"]["epsilon_one_run"], report["accounted_epsilon"]
    assert acc < 1.5
    assert report["one_run"]["exceeds_accounted"] == (factor is not None) == (bound > acc)


@pytest.mark.slow
@pytest.mark.parametrize("name,keys", [
    ("half the clients a round", {"clients_per_round": 120}),
    ("adaptive clipping", {"adaptive_clipping": True}),
    ("per-layer clipping", {"clip_parts": "per_layer"}),
    ("tiers", {"dataset": "healthcare", "clip_parts": "tiers", "hidden": [32]})])
def test_the_audit_stays_under_the_accountant_with_sampling_adaptive_clipping_and_tiers(
    tmp_path, name, keys):
  """The mechanism's variants the accountant charges differently: Poisson sampling
  at q = 0.5 (amplification), adaptive clipping (its count noise charged too),
  per-layer and per-tier clip norms (parts clipped and noised apart). The
  estimate's interval never starts above the accounted epsilon."""
  import fedjax_dp
  cfg = {**AUDITED, "dp": "central", **keys}
  if name == "tiers":
    for k in ("synthetic_examples", "synthetic_features", "synthetic_classes"):
      del cfg[k]
  report = fedjax_dp.audit(cfg, out=str(tmp_path / "a"), canaries=100, bootstrap=300,
                           progress=False, log=lambda m: None)
  assert report["ci95"][0] <= report["accounted_epsilon"], report
  assert not report["exceeds_accounted"]


@pytest.mark.slow
def test_the_all_iterates_statistic_reads_every_round_and_leaves_the_final_model_alone(
    tmp_path):
  """The README's central audit with --all-iterates: the final model's estimate
  is the one a plain audit gives (9.89), and the all-iterates estimate, the
  largest of five rounds' cosines (each round's release a Gaussian mechanism at
  mu = 1), stays under the accounted epsilon; with half the noise it rises."""
  import fedjax_dp
  honest = fedjax_dp.audit({**AUDITED, "dp": "central"}, out=str(tmp_path / "a"), canaries=200,
                           bootstrap=300, progress=False, log=lambda m: None, all_iterates=True)
  assert honest["empirical_epsilon"] == pytest.approx(9.89, abs=0.01)
  it = honest["all_iterates"]
  assert it["ci95"][0] <= honest["accounted_epsilon"] and not it["exceeds_accounted"]
  loud = fedjax_dp.audit({**AUDITED, "dp": "central"}, out=str(tmp_path / "b"), canaries=200,
                         bootstrap=300, progress=False, log=lambda m: None, all_iterates=True,
                         undercharge=0.5)
  assert loud["all_iterates"]["empirical_epsilon"] > 1.5 * it["empirical_epsilon"]


TINY = dict(dataset="synthetic", synthetic_examples=2400, synthetic_features=100,
            synthetic_classes=10, num_clients=240, clients_per_round=240, sampling="poisson",
            accountant="pld", local_epochs=1, rounds=1, eval_every=1, hidden=[16], lr=0.01,
            dp="central", noise_multiplier=5.0, clip_norm=1.0)


@pytest.mark.slow
@pytest.mark.parametrize("keys,factor", [({}, None), ({}, 0.1),
                                         ({"sampling": "fixed", "accountant": "rdp"}, 0.1),
                                         ({"dp": "local", "sampling": "fixed"}, None)])
def test_the_multi_run_audit_bounds_epsilon_and_catches_an_undercharge(tmp_path, keys, factor):
  """200 trainings of a tiny model, one canary in 100 of them: one round at z = 5
  with every client is the Gaussian mechanism at mu = 0.2 (accounted 0.726).
  The 95 % lower bound stays under it; with a tenth of the noise (mu = 2) it is
  above it, so the audit fails as it should. Fixed-size cohorts are charged for
  replacing a client (the canary's upload negated in the other runs, mu = 0.4),
  and a tenth of their noise is caught too; local DP's final model hides the
  canary's upload among the others' noise."""
  import fedjax_dp
  out = tmp_path / "m"
  report = fedjax_dp.audit_runs({**TINY, **keys}, out=str(out), runs=200, bootstrap=300,
                                progress=False, log=lambda m: None, undercharge=factor)
  acc = report["accounted_epsilon"]
  if not keys:
    assert acc == pytest.approx(0.726, abs=0.005)
  assert report["neighbours"].startswith("replace-one" if keys else "add/remove")
  assert report["inserted_runs"] == 100 and report["runs_tested"] == [50, 50]
  assert report["can_exceed_accounted"]
  if factor is None:
    assert report["epsilon_lower_bound"] <= acc and not report["exceeds_accounted"]
    lo, hi = report["gaussian_fit"]["ci95"]
    assert lo <= acc and (keys or acc <= hi)
  else:
    assert report["epsilon_lower_bound"] > acc and report["exceeds_accounted"]
  rows = (out / "runs.csv").read_text().splitlines()
  # in the test mode the runs' epsilon is the charged one, and the column says so
  column = "ledger_epsilon" if factor is None else "charged_epsilon_test_mode"
  assert rows[0] == f"run,seed,inserted,statistic,{column}" and len(rows) == 201
  assert sum(int(r.split(",")[2]) for r in rows[1:]) == 100
  # run 0 is an ordinary run folder; its statistic is the model it saved
  assert (out / "run" / "summary.json").exists()
  assert json.loads((out / "audit.json").read_text()) == report


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
  assert "one-run lower bound: epsilon >= " in done.stdout and "attack: AUROC" in done.stdout
  assert report["one_run"]["epsilon_one_run"] <= report["accounted_epsilon"]
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
  # said before anything else (the noise line after it gives the charged multiplier),
  # and again in the report
  assert test_mode.stdout.startswith("TEST MODE: the rounds apply 0.5 times the noise")
  assert "\nTEST MODE: the rounds applied 0.5 times the noise" in test_mode.stdout
  assert "undercharged_test_mode" in json.loads((tmp_path / "f" / "audit.json").read_text())
  both = cli("--set", *keys, "--runs", "40", "--canaries", "20", "--out", str(tmp_path / "g"))
  assert both.returncode == 2 and "--canaries with --runs" in both.stderr
  few_runs = cli("--set", *keys, "--runs", "10", "--out", str(tmp_path / "g"))
  assert few_runs.returncode == 2 and "--runs 10: at least 20" in few_runs.stderr
  conf = cli("--set", *keys, "--confidence", "1.5", "--out", str(tmp_path / "g"))
  assert conf.returncode == 2 and "--confidence 1.5: a probability in (0, 1)" in conf.stderr
  runs = cli("--set", *keys, "--runs", "20", "--bootstrap", "50", "--confidence", "0.9",
             "--out", str(tmp_path / "a"))
  assert runs.returncode == 2 and "is not empty" in runs.stderr
  assert not (tmp_path / "g").exists()



TEST_MODE = dict(dataset="synthetic", synthetic_examples=400, num_clients=40,
                 clients_per_round=40, rounds=2, eval_every=1, hidden=[8], dp="central",
                 noise_multiplier=1.0)
TEST_MODE_WHY = ("TEST MODE: the rounds applied 0.5 times the noise the accountant charged; "
                 "no guarantee")


def assert_no_published_epsilon(run):
  """The run folder's own figures: no epsilon, and the test mode's reason."""
  summary = json.loads((run / "summary.json").read_text())
  p = summary["privacy"]
  assert p["epsilon"] is None and p["epsilon_accountant"] is None
  assert p["epsilon_why_none"] == p["test_mode"] == TEST_MODE_WHY
  assert summary["final"]["epsilon"] is None
  rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
  assert rows and all(r["epsilon"] is None and r["epsilon_why_none"] == TEST_MODE_WHY
                      for r in rows)
  assert not (run / "epsilon.png").exists()


def test_the_test_mode_publishes_no_epsilon_and_audits_against_the_charged_one(tmp_path):
  """Found by an audit: with --undercharge the run's own summary.json, metrics.jsonl
  and epsilon.png gave the charged epsilon with no mark, as if it were a guarantee.
  They now give none, with the TEST MODE reason, and audit.json still compares with
  the charged epsilon: every client every round (fixed cohort, q = 1), replace-one
  (sensitivity 2 C), two rounds of the Gaussian at z / 2 = 0.5 by dp-accounting."""
  import dp_accounting as dpa
  import fedjax_dp
  test = fedjax_dp.audit(TEST_MODE, out=str(tmp_path / "b"), canaries=10, bootstrap=50,
                         undercharge=0.5, progress=False, log=lambda m: None)
  oracle = dpa.rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
  oracle.compose(dpa.GaussianDpEvent(0.5), 2)
  assert test["accounted_epsilon"] == pytest.approx(oracle.get_epsilon(1e-5), rel=1e-5)
  assert test["accountant"] == "rdp" and test["undercharged_test_mode"]
  assert_no_published_epsilon(tmp_path / "b")
  assert json.loads((tmp_path / "b" / "audit.json").read_text()) == test


@pytest.mark.slow   # ~15 s: two audits
def test_the_test_mode_changes_no_audited_figure_in_either_audit(tmp_path):
  """The test mode's audit.json compares with the epsilon the same run reports
  without it, and the multi-run audit's first run folder publishes none either
  (its figure: the runs' ledger epsilon in runs.csv)."""
  import fedjax_dp
  quiet = dict(progress=False, log=lambda m: None)
  honest = fedjax_dp.audit(TEST_MODE, out=str(tmp_path / "a"), canaries=10, bootstrap=50,
                           **quiet)
  test = fedjax_dp.audit(TEST_MODE, out=str(tmp_path / "b"), canaries=10, bootstrap=50,
                         undercharge=0.5, **quiet)
  charged = json.loads((tmp_path / "a" / "summary.json").read_text())["privacy"]
  assert test["accounted_epsilon"] == honest["accounted_epsilon"] == charged["epsilon"] > 0
  assert (tmp_path / "a" / "epsilon.png").exists()
  runs = fedjax_dp.audit_runs({**TEST_MODE, "rounds": 1}, out=str(tmp_path / "m"), runs=20,
                              bootstrap=50, undercharge=0.5, **quiet)
  assert_no_published_epsilon(tmp_path / "m" / "run")
  table = (tmp_path / "m" / "runs.csv").read_text().splitlines()
  assert table[0].endswith(",charged_epsilon_test_mode")    # not a guarantee: said so
  ledger = table[1].split(",")[4]
  assert float(ledger) > 0 and runs["accounted_epsilon"] == pytest.approx(float(ledger),
                                                                          rel=1e-12)


@pytest.mark.parametrize("ci95,accounted,says", [
    ((12.0, 14.0), 11.48, "ABOVE the accounted epsilon"),
    ((9.845, 12.61), 11.48, "consistent with the accounted epsilon: its 95 % interval "
                            "contains it"),
    ((1.0, 3.0), 11.48, "below the accounted epsilon: this audit finds less"),
    ((1.0, 3.0), None, "no accounted epsilon to compare with"),
])
def test_the_verdict_says_how_the_interval_sits_against_the_accountant(ci95, accounted, says):
  """The first-hour review's finding 13: 'not above the accounted epsilon' for an
  interval (9.845 to 12.610) that contains the accounted 11.480."""
  from fedjax_dp.experiment.audit_text import format_report
  report = {"ci95": list(ci95), "accounted_epsilon": accounted, "accountant": "pld",
            "canaries": 20, "held_out": 20, "mu_inserted": 0.1, "sd_inserted": 0.05,
            "mu_held_out": 0.0, "sd_held_out": 0.06, "empirical_epsilon": sum(ci95) / 2,
            "delta": 1e-5, "exceeds_accounted": accounted is not None and ci95[0] > accounted,
            "one_run": ONE_RUN}
  lines = format_report(report).splitlines()
  assert lines[4].startswith("  " + says)   # after the accounted epsilon
  assert lines[5] == ("  one-run lower bound: epsilon >= 0.500 with confidence 0.95 (Steinke "
                      "et al. 2023; f-DP figure 12.000 is the Gaussian-DP equivalent, not a "
                      "bound for this subsampled release)")


ONE_RUN = {"epsilon_one_run": 0.5, "epsilon_one_run_fdp": 12.0, "confidence": 0.95,
           "exceeds_accounted": False, "auroc": 0.6, "largest_possible_bound": 3.6,
           "fdp_is_a_bound_here": False, "tpr_at_fpr": {"0.01": None, "0.1": 0.2}}


def test_the_bounds_verdict_comes_from_the_rigorous_bound_and_says_its_ceiling():
  """An f-DP figure above the accounted epsilon makes no ABOVE (it is no bound for a
  subsampled release); the one-run bound does; and a ceiling below the accounted
  epsilon is said (the multi-run audit's 'too few to tell')."""
  from fedjax_dp.experiment.audit_text import _one_run_lines
  quiet = _one_run_lines(ONE_RUN, 11.48)
  assert quiet[1] == "  the lower bound is not above the accounted epsilon"
  assert quiet[2].startswith("  too few canaries to tell: with every guess right the bound "
                             "would be 3.600")
  assert quiet[3] == "  attack: AUROC 0.600, TPR 0.2 at FPR 0.1 (ROC hull, optimistic)"
  loud = _one_run_lines({**ONE_RUN, "exceeds_accounted": True}, 0.4)
  assert loud[1].startswith("  ABOVE the accounted epsilon") and len(loud) == 3
  gaussian = _one_run_lines({**ONE_RUN, "fdp_is_a_bound_here": True}, 20.0)
  assert "f-DP refinement 12.000, a bound here (one Gaussian mechanism)" in gaussian[0]
