"""Sensitivity tiers over parameters: the tier-to-parameter map, per-tier
clipping, per-tier noise in the round, and accounting against dp-accounting's
composition of the per-tier Gaussians."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from fedjax_dp.privacy import accounting, clip_layout
from fedjax_dp.kernels import clipping
from fedjax_dp.models import make_model
from fedjax_dp.data.tabular import HIGH, LOW, MEDIUM, METADATA, PUBLIC, TIERS
from tests.helpers import flat, toy_problem, toy_simulation

dpa = pytest.importorskip("dp_accounting")
MULTS = (2.0, 1.0, 0.5, 0.25, 0.1)
FEATURE_TIERS = np.array([HIGH, HIGH, LOW, PUBLIC, METADATA, LOW])


def mlp_params(features=6, hidden=(64,), classes=3):
  model = make_model("mlp", (features,), classes, list(hidden))
  return model.init(jax.random.PRNGKey(0))


def test_tier_map_over_parameters_by_hand():
  params = mlp_params()
  layout = clip_layout.tier_layout(params, FEATURE_TIERS, MEDIUM, MULTS)
  assert layout.names == ("high", "medium", "low", "public", "metadata")
  # leaves: Dense_0 bias [64], Dense_0 kernel [6, 64], Dense_1 bias [3], Dense_1 kernel [64, 3]
  shapes = [x.shape for x in jax.tree.leaves(params)]
  assert shapes == [(64,), (6, 64), (3,), (64, 3)]
  assert layout.part_of_leaf == (1, (0, 0, 2, 3, 4, 2), 1, 1)
  sizes = np.array([2 * 64, 64 + 3 + 192, 2 * 64, 64, 64], float)  # per tier, by hand
  np.testing.assert_allclose(np.square(layout.fractions), sizes / sizes.sum())
  assert layout.noise_scales == MULTS
  with pytest.raises(ValueError, match="no parameter has 7 rows"):
    clip_layout.tier_layout(params, np.zeros(7, int), MEDIUM, MULTS)


def test_per_tier_clip_against_numpy():
  params = mlp_params()
  layout = clip_layout.tier_layout(params, FEATURE_TIERS, MEDIUM, MULTS)
  rng = np.random.default_rng(0)
  update = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), params)
  clip = 0.7
  got, norms = clip_layout.clip_update(update, jnp.float32(clip), layout)
  # numpy: the tier of every coordinate, then each tier scaled to its bound
  leaves = [np.asarray(x) for x in jax.tree.leaves(update)]
  tier_of = [np.full(x.shape, MEDIUM) for x in leaves]
  tier_of[1] = np.repeat(FEATURE_TIERS[:, None], 64, axis=1)
  u, t = np.concatenate([x.ravel() for x in leaves]), np.concatenate([a.ravel() for a in tier_of])
  want = u.copy()
  for j, tier in enumerate(TIERS):
    sel = t == TIERS.index(tier)
    bound = clip * layout.fractions[j]
    want[sel] *= min(1.0, bound / np.linalg.norm(u[sel]))
  np.testing.assert_allclose(flat(got), want, rtol=1e-5)
  assert float(norms) == pytest.approx(np.linalg.norm(u), rel=1e-5)
  assert np.linalg.norm(flat(got)) <= clip * (1 + 1e-5)


def test_tiered_accounting_equals_dp_accountings_composition():
  x, y, parts = toy_problem(sizes=(8, 9, 10, 11))
  z = 1.3
  sim = toy_simulation(x, y, parts, hidden=[64], dp="local", noise_multiplier=z,
                       clip_parts="tiers", feature_tiers=FEATURE_TIERS)
  layout = sim.privacy.layout
  z_parts = [z * m / f for f, m in zip(layout.fractions, layout.noise_scales)]
  a = dpa.rdp.RdpAccountant(orders=list(accounting.DEFAULT_ORDERS),
                            neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
  # local DP, replace-one: each tier a Gaussian of sensitivity 2 C_t, multiplier z_t / 2
  a.compose(dpa.ComposedDpEvent([dpa.GaussianDpEvent(zp / 2) for zp in z_parts]), 7)
  eps_theirs = a.get_epsilon(1e-5)
  eps_ours = accounting.epsilon_np(7 * np.asarray(sim.privacy.event_rdp), 1e-5)[0]
  assert eps_ours == pytest.approx(eps_theirs, rel=1e-6)
  # the tiers add; the least-noised tier alone would claim less
  least = accounting.epsilon_np(7 * accounting.gaussian_rdp(min(z_parts) / 2), 1e-5)[0]
  assert eps_ours > least


@pytest.mark.slow   # ~12 s: make test-slow, so make test stays under 10 minutes
def test_tiered_central_pld_report_uses_the_composed_multiplier():
  from dp_accounting.pld import pld_privacy_accountant
  from fedjax_dp.experiment.reports.privacy_report import privacy_report
  x, y, parts = toy_problem(sizes=(8, 9, 10, 11, 12, 13, 14, 15, 16, 17))
  z, q, rounds = 1.0, 0.3, 6
  sim = toy_simulation(x, y, parts, hidden=[16], dp="central", noise_multiplier=z,
                       clip_parts="tiers", feature_tiers=FEATURE_TIERS, sampling="poisson",
                       clients_per_round=3, accountant="pld")
  state, _ = sim.run_rounds(sim.init_state(), rounds)
  report = privacy_report(sim.cfg, sim, state)
  layout = sim.privacy.layout
  z_eff = sum((z * m / f) ** -2 for f, m in zip(layout.fractions, layout.noise_scales)) ** -0.5
  assert z_eff < z / 2   # the tiers' composition is much less noise than the base z
  oracle = pld_privacy_accountant.PLDAccountant()
  oracle.compose(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z_eff)), rounds)
  assert report["pld_epsilon"] == pytest.approx(oracle.get_epsilon(1e-5), rel=1e-3)
  assert report["epsilon"] <= report["pld_epsilon"] + 1e-9


def test_tiered_noise_in_the_round_has_each_tiers_std():
  x, y, parts = toy_problem(sizes=(8, 9, 10, 11))
  z, clip = 400.0, 0.01
  sim = toy_simulation(x, y, parts, hidden=[64], dp="local", noise_multiplier=z, clip_norm=clip,
                       clip_parts="tiers", feature_tiers=FEATURE_TIERS, momentum=0.0)
  s0 = sim.init_state()
  p0 = jax.tree.map(np.asarray, s0.params)
  s1, _ = sim.run_rounds(s0, 1)
  step = [np.asarray(b) - a for a, b in zip(jax.tree.leaves(p0), jax.tree.leaves(s1.params))]
  # mean of 4 reports, each with its own N(0, (z C m_t)^2); the clipped signal is tiny
  first = step[1]                                   # [6, 64]: row f has feature f's tier
  for f, tier in enumerate(FEATURE_TIERS):
    assert first[f].std() == pytest.approx(z * clip * MULTS[tier] / 2, rel=0.3)
  rest = np.concatenate([step[0], step[2], step[3].ravel()])
  assert rest.std() == pytest.approx(z * clip * MULTS[MEDIUM] / 2, rel=0.1)
  assert stats.kstest(rest / (z * clip / 2), "norm").pvalue > 1e-3
  high = first[FEATURE_TIERS == HIGH].ravel()
  assert stats.kstest(high / (z * clip * 2.0 / 2), "norm").pvalue > 1e-3


def test_tiers_config_errors(tmp_path):
  from fedjax_dp import make_config
  from fedjax_dp.errors import ConfigError
  from fedjax_dp.experiment.setup import setup
  with pytest.raises(ConfigError, match="needs noise_multiplier"):
    make_config({"clip_parts": "tiers", "dp": "local", "target_epsilon": 1.0})
  with pytest.raises(ConfigError, match="'tier_noise_multipliers' = "):
    make_config({"tier_noise_multipliers": [1, 2]})
  assert make_config({"tier_noise_multipliers": "[3, 2, 1, 0.5, 0.2]", "dp": "central",
                      "noise_multiplier": 1.0, "clip_parts": "tiers"}).tier_noise_multipliers \
      == (3.0, 2.0, 1.0, 0.5, 0.2)
  with pytest.raises(ConfigError, match="the data has no sensitivity tiers"):
    setup(make_config({"clip_parts": "tiers", "dp": "local", "noise_multiplier": 1.0}))
