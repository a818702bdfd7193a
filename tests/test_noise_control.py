"""Adaptive noise (convergence score, both formulas, EMA controller), its in-round
accounting, per-client allocated budgets and the paper's per-round charge."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dp.privacy import accounting, budgets, noise_control as nc
from fedjax_dp import make_config
from fedjax_dp.errors import ConfigError
from tests.helpers import toy_problem, toy_simulation


def test_convergence_score_and_ema_against_a_plain_loop():
  lam, w, rho = 0.1, 3, 0.5
  rng = np.random.default_rng(0)
  updates = [rng.normal(size=4).astype(np.float32) for _ in range(8)]
  state = nc.init_state(4, w, 2)
  diffs, c = [], 0.0
  prev = np.zeros(4)
  for t, g in enumerate(updates):
    state = nc.observe(state, jnp.asarray(g), lam, rho, "update_diff")
    if t > 0:
      diffs.append(np.linalg.norm(g - prev))
    prev = g
    s = math.exp(-lam * sum(diffs[-w:])) if len(diffs) >= w else 0.0
    c = rho * c + (1 - rho) * s
    assert float(state["score"]) == pytest.approx(c, rel=1e-5, abs=1e-7)
  # the norm-evolution measure
  state = nc.init_state(4, 1, 2)
  state = nc.observe(state, jnp.asarray(updates[0]), lam, 0.0, "norm_diff")
  state = nc.observe(state, jnp.asarray(updates[1]), lam, 0.0, "norm_diff")
  want = math.exp(-lam * abs(np.linalg.norm(updates[1]) - np.linalg.norm(updates[0])))
  assert float(state["score"]) == pytest.approx(want, rel=1e-5)


def test_noise_formulas_by_hand():
  m = (2.0, 1.0, 0.5)
  np.testing.assert_allclose(nc.noise_scales("static", 0.7, m, 0.3), m)
  np.testing.assert_allclose(nc.noise_scales("convergence", 0.5, m, 0.3),
                             [2 * 0.85, 0.85, 0.5 * 0.85], rtol=1e-6)
  # base * (2 w + 0.5 (1 - f)), w = 1.0 / 0.5 / 0.25, f = 0.8 * score
  np.testing.assert_allclose(nc.noise_scales("weighted", 0.5, m, 0.3),
                             [2 * 1.0 + 0.5 * 0.6, 2 * 0.5 + 0.3, 2 * 0.25 + 0.3], rtol=1e-6)
  assert nc.paper_round_epsilon(2.0, 1e-5) == pytest.approx(math.sqrt(2 * math.log(1.25e5)) / 2)


def test_local_event_is_the_composed_gaussians_rounded_up():
  fractions, scales, z = (0.6, 0.8), (2.0, 0.5), 1.3
  want = sum(accounting.gaussian_rdp(z * s / f / 2) for f, s in zip(fractions, scales))
  got = np.asarray(nc.local_event_rdp(z, fractions, scales), np.float64)
  assert np.all(got >= want) and np.allclose(got, want, rtol=2e-6)
  np.testing.assert_allclose(nc.local_event_rdp_np(z, fractions, scales), want, rtol=1e-12)


def _tiers_sim(**over):
  x, y, parts = toy_problem(sizes=(9, 12, 7, 10), features=4, seed=2)
  tiers = np.array([0, 1, 2, 1], np.int32)
  values = dict(dp="local", noise_multiplier=1.5, clip_parts="tiers", clip_norm=0.5,
                noise_schedule="convergence", convergence_window=2, convergence_lambda=0.01,
                noise_ema=0.5, convergence_measure="norm_diff", clients_per_round=2)
  values.update(over)
  return toy_simulation(x, y, parts, feature_tiers=tiers, **values)


def test_adaptive_local_ledgers_compose_each_rounds_actual_noise():
  sim = _tiers_sim()
  state = sim.init_state()
  p = sim.privacy
  want = np.zeros((4, len(accounting.DEFAULT_ORDERS)))
  scores = []
  for _ in range(8):
    score = float(state.server_state["noise_control"]["score"])
    scores.append(score)
    before = np.asarray(state.server_state["noise_control"]["participations"])
    event = nc.local_event_rdp_np(p.update_noise_multiplier, p.layout.fractions,
                                  np.asarray(nc.noise_scales("convergence", score,
                                                             p.tier_scales(), 0.3)))
    np.testing.assert_allclose(sim.next_event_rdp(state), event)
    state, _ = sim.run_rounds(state, 1)
    took = np.asarray(state.server_state["noise_control"]["participations"]) - before
    want += took[:, None] * event
  assert scores[0] == 0 and max(scores) > 0.1    # the controller moved the noise
  got = np.asarray(state.privacy.ledger, np.float64)
  assert np.all(got >= want * (1 - 1e-9)) and np.allclose(got, want, rtol=1e-5)
  # the paper's charge: sqrt(2 ln(1.25/delta)) / (z (1 - beta c)) per participation
  paper = np.asarray(state.server_state["noise_control"]["paper_epsilon"])
  assert paper.max() > 0


def test_adaptive_central_charges_at_least_the_noise_used_and_stops_at_the_target():
  over = dict(dp="central", noise_multiplier=0.8, clients_per_round=2, sampling="fixed")
  sim = _tiers_sim(**over)
  state = sim.init_state()
  p = sim.privacy
  low = np.zeros(len(accounting.DEFAULT_ORDERS))
  for _ in range(6):
    score = float(state.server_state["noise_control"]["score"])
    scales = np.asarray(nc.noise_scales("convergence", score, p.tier_scales(), 0.3), np.float64)
    z_acc = accounting.effective_noise_multiplier(
        [p.update_noise_multiplier * s / f for s, f in zip(scales, p.layout.fractions)])
    from fedjax_dp.recipes.privacy import event_rdp
    low += event_rdp(sim.cfg, z_acc)
    state, _ = sim.run_rounds(state, 1)
  got = np.asarray(state.privacy.ledger, np.float64)
  assert np.all(got >= low * (1 - 1e-9))
  # with a target, the round that would pass it is skipped and nothing more is charged
  sim = _tiers_sim(target_epsilon=3.0, **over)
  state, stats = sim.run_rounds(sim.init_state(), 40)
  eps, _ = sim.epsilons(state)
  assert eps <= 3.0 and int(np.sum(stats.spent)) > 0
  assert int(state.server_state["noise_control"]["skipped"]) == int(np.sum(stats.spent))


# ~11 s (calibration over 10 rounds): `make test-slow` (CI runs it); the adaptive
# noise's charge is test_adaptive_central_charges_at_least_the_noise_used_and_stops_at_the_target
@pytest.mark.slow
def test_calibrated_adaptive_central_stays_within_the_target():
  sim = _tiers_sim(dp="central", noise_multiplier=None, target_epsilon=2.0, rounds=10,
                   sampling="poisson", clients_per_round=2)
  state, stats = sim.run_rounds(sim.init_state(), 10)
  eps, _ = sim.epsilons(state)
  assert eps <= 2.0 and int(np.sum(stats.spent)) == 0


def test_allocated_client_budgets():
  sizes = np.array([10, 40, 25, 100, 5])
  tiers = np.array([0, 1, 2, 1, 0])
  b = budgets.client_budgets(2.0, sizes, tiers)
  rel = {0: (0.5, 1.5), 1: (0.6, 1.4), 2: (0.8, 1.5)}
  for e, t in zip(b, tiers):
    lo, hi = rel[t]
    assert 2 * lo - 1e-4 <= e <= 2 * hi + 1e-4
  assert b.sum() <= 10.0 + 1e-3
  gamma = sizes / sizes.mean() / 2.0
  lo = np.array([rel[t][0] for t in tiers]) * 2
  hi = np.array([rel[t][1] for t in tiers]) * 2
  exact = np.asarray(budgets.allocate_closed_form(jnp.asarray(gamma), 10.0, jnp.asarray(lo),
                                                  jnp.asarray(hi)))
  np.testing.assert_allclose(b, exact, atol=2e-3)


def test_per_client_budgets_stop_each_client_at_its_own():
  x, y, parts = toy_problem(sizes=(9, 12, 7, 10), features=4, seed=2)
  sim = toy_simulation(x, y, parts, dp="local", noise_multiplier=2.0, target_epsilon=2.0,
                       client_budgets="allocated", clients_per_round=4)
  from fedjax_dp.core.build import build_simulation
  from fedjax_dp.recipes.plan import plan_run
  sim = build_simulation(plan_run(sim.cfg, sim.model, client_budgets=np.array([1.0, 2.0, 3.0, 1.5])),
                         sim.model, sim.store, sim.mesh)
  state, _ = sim.run_rounds(sim.init_state(), 30)
  eps, _ = sim.epsilons(state)
  assert np.all(eps <= np.array([1.0, 2.0, 3.0, 1.5]))
  one = accounting.epsilon_np(sim.privacy.event_rdp, 1e-5)[0]
  # each stopped within one participation of its own budget
  assert np.all(eps > np.array([1.0, 2.0, 3.0, 1.5]) - 2 * one)


@pytest.mark.parametrize("over, match", [
    (dict(noise_schedule="weighted", dp="local", noise_multiplier=1.0), "weighted"),
    (dict(noise_schedule="convergence"), "dp 'none'"),
    (dict(noise_schedule="convergence", dp="central", noise_multiplier=1.0, accountant="pld",
          sampling="poisson"), "pld"),
    (dict(client_budgets="allocated", dp="local", noise_multiplier=1.0), "allocated"),
])
def test_config_errors(over, match):
  with pytest.raises(ConfigError, match=match):
    make_config(over)


def test_cluster_noise_factors_by_hand():
  got = nc.cluster_noise_factors(jnp.array([0.0, 2.0, 4.0, 8.0, 16.0]), jnp.float32(4.0))
  np.testing.assert_allclose(np.asarray(got), [1.0, 1.0, 1.0, math.sqrt(2), 2.0], rtol=1e-6)


def test_per_cluster_noise_ledgers_follow_each_clients_factor():
  # two groups of clients with opposite labels' data: updates cluster apart
  rng = np.random.default_rng(5)
  x, y, parts = toy_problem(sizes=(8, 8, 8, 8, 8, 8), features=4, seed=5)
  x[parts[3]] += 3.0
  sim = toy_simulation(x, y, parts, dp="local", noise_multiplier=0.05, clip_norm=1.0,
                       aggregator="cluster", cluster_threshold=0.2, cluster_noise="equalize",
                       clients_per_round=6)
  state = sim.init_state()
  want = np.zeros((6, len(accounting.DEFAULT_ORDERS)))
  seen_factor = []
  for _ in range(4):
    cn = state.server_state["aggregator"]   # the cluster rule's state
    f = np.asarray(nc.cluster_noise_factors(cn["size"], cn["median"]), np.float64)
    seen_factor.append(f)
    np.testing.assert_allclose(sim.next_event_rdp(state),
                               sim.privacy.event_rdp[None, :] / f[:, None] ** 2)
    state, stats = sim.run_rounds(state, 1)
    want += sim.privacy.event_rdp[None, :] / f[:, None] ** 2   # everyone takes part
  assert int(stats.clusters[0]) >= 2
  assert np.all(seen_factor[0] == 1.0) and np.any(np.concatenate(seen_factor[1:]) > 1.0)
  got = np.asarray(state.privacy.ledger, np.float64)
  assert np.all(got >= want * (1 - 1e-9)) and np.allclose(got, want, rtol=1e-5)


def test_cluster_noise_needs_the_cluster_rule_and_local_dp():
  with pytest.raises(ConfigError, match="cluster_noise") as e:
    make_config(dict(cluster_noise="equalize", dp="local", noise_multiplier=1.0))
  assert "aggregator 'cluster'" in str(e.value)
  with pytest.raises(ConfigError, match="per-cluster noise needs dp 'local'"):
    make_config(dict(cluster_noise="equalize", aggregator="cluster"))
