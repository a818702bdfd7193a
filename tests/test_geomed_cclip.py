"""The geometric median (RFA's smoothed Weiszfeld) and centred clipping against
plain numpy references, the centred-clipping state carried between rounds, and
both in a round with Byzantine clients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dp.kernels import reference
from fedjax_dp.robust import get_aggregator
from tests.helpers import flat, round_zero_deltas, toy_problem, toy_simulation


def cohort(m=9, d=13, seed=0, absent=(2, 7)):
  rng = np.random.default_rng(seed)
  u = rng.normal(size=(m, d)).astype(np.float32)
  u[0] += 8.0                       # one far update: the median and the mean differ
  mask = np.ones(m, bool)
  mask[list(absent)] = False
  u[~mask] = 1e6                    # absent slots hold garbage that must never matter
  w = rng.uniform(1, 5, size=m).astype(np.float32)
  return u, mask, w


np_weiszfeld = reference.weiszfeld   # float64, from the weighted mean


@pytest.mark.parametrize("iters", [0, 1, 4, 30])
@pytest.mark.parametrize("absent", [(), (2, 7)])
def test_geometric_median_against_numpy_weiszfeld(iters, absent):
  u, mask, w = cohort(absent=absent)
  rule = get_aggregator("geometric_median")
  hp = {"iters": iters, "eps": 1e-6}
  agg, state, metrics = jax.jit(rule.aggregate)(u, mask, w, (), hp)
  want = np_weiszfeld(u[mask], w[mask], iters, 1e-6)
  np.testing.assert_allclose(agg, want, rtol=2e-5, atol=2e-6)
  assert state == () and int(metrics["flagged"]) == 0
  if iters == 30:   # converged: the weighted sum of distances is at its minimum
    p, wp, z = u[mask].astype(np.float64), w[mask], np.asarray(agg, np.float64)
    dist = np.linalg.norm(p - z, axis=1)
    grad = (wp[:, None] * (z - p) / dist[:, None]).sum(0)
    assert np.linalg.norm(grad) < 1e-3 * wp.sum()
    mean = (wp[:, None] * p).sum(0) / wp.sum()
    assert np.sum(wp * dist) < np.sum(wp * np.linalg.norm(p - mean, axis=1))


np_centered_clip = reference.centered_clip   # float64, uniform over the participants


@pytest.mark.parametrize("tau,iters", [(0.5, 1), (2.0, 3), (100.0, 2)])
def test_centered_clipping_against_numpy_over_rounds(tau, iters):
  """Four rounds of different cohorts and masks: the state (the previous
  aggregate) is carried by the rule and by the numpy recursion alike."""
  rule = get_aggregator("centered_clip")
  hp = {"tau": tau, "iters": iters}
  step = jax.jit(rule.aggregate)
  state = rule.init(13, 20)
  assert state.shape == (13,) and not np.any(np.asarray(state))
  v = np.zeros(13)
  for r, absent in enumerate([(), (2, 7), (0, 1, 2, 3), (8,)]):
    u, mask, w = cohort(seed=r, absent=absent)
    agg, state, metrics = step(u, mask, w, state, hp)
    v, clipped = np_centered_clip(u[mask], v, tau, iters)
    np.testing.assert_allclose(agg, v, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(agg, state)
    assert int(metrics["flagged"]) == clipped
  # with a huge tau nothing is clipped and one step is the plain mean
  u, mask, w = cohort(seed=9)
  agg, _, metrics = step(u, mask, w, jnp.zeros(13), {"tau": 1e9, "iters": 1})
  np.testing.assert_allclose(agg, u[mask].mean(0), rtol=1e-5)
  assert int(metrics["flagged"]) == 0


def test_centered_clipping_bounds_each_participant_and_keeps_state_without_uploads():
  rule = get_aggregator("centered_clip")
  u, mask, w = cohort(absent=())
  hostile = u.copy()
  hostile[4] = 1e30                  # finite, huge: moves v by at most tau / n
  center = jnp.asarray(np.full(13, 0.25, np.float32))
  clean, _, _ = rule.aggregate(u, mask, w, center, {"tau": 0.3, "iters": 1})
  bad, _, _ = rule.aggregate(hostile, mask, w, center, {"tau": 0.3, "iters": 1})
  assert np.linalg.norm(np.asarray(bad) - np.asarray(clean)) <= 2 * 0.3 / mask.sum() + 1e-6
  none = np.zeros(9, bool)
  agg, state, _ = rule.aggregate(u, none, w, center, {"tau": 0.3, "iters": 2})
  np.testing.assert_array_equal(agg, np.zeros(13))
  np.testing.assert_array_equal(state, center)


@pytest.mark.parametrize("aggregator,extra", [
    pytest.param("geometric_median", {}, marks=pytest.mark.slow),
    ("centered_clip", {}),                    # tau 1, one step: the attackers are clipped
])
def test_rule_beats_the_mean_against_byzantine_clients(aggregator, extra):
  """Two of ten clients send -100 x their update, on 2 devices: the rule's update
  stays near the honest clients' mean, the plain mean does not; centred
  clipping's state is the applied update (server sgd at lr 1), carried on."""
  from fedjax_dp.adversary import attacks
  x, y, parts = toy_problem(sizes=(8, 9, 10, 11, 7, 12, 9, 10, 8, 11))
  common = dict(hidden=[6], byzantine_fraction=0.2, byzantine_attack="sign_flip",
                byzantine_scale=100.0, devices=2)
  bad = attacks.malicious_clients(10, 0.2, seed=0)
  sim = toy_simulation(x, y, parts, aggregator=aggregator, **common, **extra)
  s0 = sim.init_state()
  deltas = np.stack([flat(d) for d in round_zero_deltas(sim, s0)])
  n = np.array([len(p) for p in parts], float)
  honest = (n[~bad, None] * deltas[~bad]).sum(0) / n[~bad].sum()
  sent = np.where(bad[:, None], -100.0 * deltas, deltas)
  mean = (n[:, None] * sent).sum(0) / n.sum()
  p0 = flat(s0.params)
  s1, stats = sim.run_rounds(s0, 1)
  got = flat(s1.params) - p0
  assert np.linalg.norm(got - honest) < 0.1 * np.linalg.norm(mean - honest)
  if aggregator == "centered_clip":
    np.testing.assert_allclose(np.asarray(s1.server_state["aggregator"]), got, atol=1e-6)
    assert int(stats.flagged[0]) == 2         # the attackers were clipped
    p1 = flat(s1.params)
    s2, _ = sim.run_rounds(s1, 1)
    np.testing.assert_allclose(np.asarray(s2.server_state["aggregator"]),
                               flat(s2.params) - p1, atol=1e-6)
  else:
    assert "aggregator" not in s1.server_state


def test_metrics_rows_carry_what_each_rule_reports():
  # metrics.jsonl's keys come from the rule's `reports`, not from a list of names
  from fedjax_dp import make_config
  from fedjax_dp.experiment.metrics_row import aggregator_metrics
  row = lambda name, **kw: aggregator_metrics(make_config({"aggregator": name, **kw}),
                                               3.0, 8.0, 4, 5.0)
  assert row("centered_clip") == {"flagged": 3}
  assert row("krum") == {"flagged": 3} and row("outlier_median") == {"flagged": 3}
  assert row("cluster") == {"clusters": 2.0}
  assert row("mean") == {} and row("median") == {} and row("geometric_median") == {}
  # the server's norm bound has its own count, apart from the rule's
  assert row("mean", server_clip_l2=1.0) == {"norm_bounded": 5}
  assert row("krum", server_clip_l2=1.0) == {"flagged": 3, "norm_bounded": 5}


def test_a_user_rule_marked_linear_is_refused():
  # linear=True makes the round run its fused weighted mean: the rule would never run
  from fedjax_dp.robust import base, registry
  rule = base.Aggregator(name="my_mean", aggregate=lambda u, m, w, s, hp: (u[0], s, {}),
                         linear=True)
  with pytest.raises(ValueError, match="linear=True means the built-in weighted mean"):
    registry.register_aggregator(rule)
  assert "my_mean" not in registry.AGGREGATORS
