"""Byzantine attacks (adversary/attacks.py) against hand computations: ALIE's z and
upload, IPM's, and the malicious clients drawn afresh each round."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.stats import norm

from fedjax_dp import make_config
from fedjax_dp.errors import ConfigError
from fedjax_dp.adversary import attacks
from tests.helpers import flat, round_zero_deltas, toy_problem, toy_simulation

U = np.array([[1.0, -2.0, 0.5],     # malicious
              [2.0, 0.0, 1.0],
              [4.0, 2.0, -1.0],
              [0.0, 5.0, 3.0],     # malicious
              [np.nan, np.inf, 7.0]], np.float32)   # absent slot: garbage
BAD = np.array([True, False, False, True, False])
MASK = np.array([True, True, True, True, False])


def attacked(kind, scale=3.0):
  out = attacks.replace_uploads({"u": jnp.asarray(U)}, jnp.asarray(BAD), jnp.arange(5),
                                jax.random.PRNGKey(0), kind, scale, jnp.asarray(MASK))
  return np.asarray(out["u"])


@pytest.mark.parametrize("n,m", [(4, 1), (4, 2), (10, 2), (10, 3), (50, 10), (100, 30),
                                 (7, 0), (3, 3)])
def test_alie_z_is_the_papers_z_max(n, m):
  """z_max = Phi^-1((n - s) / n), s = floor(n/2 + 1) - m (Baruch et al. 2019, eq. in
  section 4), within [0, Phi^-1(0.999)]."""
  s = np.floor(n / 2 + 1) - m
  want = norm.ppf(np.clip((n - s) / n, 0.5, 0.999))
  got = float(attacks.alie_z(jnp.asarray(n), jnp.asarray(m)))
  assert got == pytest.approx(want, rel=1e-4, abs=1e-5), (n, m)


def test_alie_sends_the_honest_mean_minus_z_sigma():
  # honest participants: rows 1 and 2 (row 4 is absent, its NaN must not leak in)
  mu = np.array([3.0, 1.0, 0.0])
  sigma = np.array([1.0, 1.0, 1.0])          # population std of two values
  z = norm.ppf((4 - (np.floor(4 / 2 + 1) - 2)) / 4)     # n = 4 participants, m = 2
  out = attacked("alie")
  for i in (0, 3):
    np.testing.assert_allclose(out[i], mu - z * sigma, rtol=1e-5)
  np.testing.assert_array_equal(out[1:3], U[1:3])
  assert np.isnan(out[4, 0]) and np.isinf(out[4, 1])    # an absent slot passes unread


def test_ipm_sends_minus_scale_times_the_honest_mean():
  out = attacked("ipm", scale=0.5)
  for i in (0, 3):
    np.testing.assert_allclose(out[i], -0.5 * np.array([3.0, 1.0, 0.0]), rtol=1e-6)
  np.testing.assert_array_equal(out[1:3], U[1:3])


def test_with_no_honest_participant_the_colluders_send_zeros():
  out = attacks.replace_uploads({"u": jnp.asarray(U[:2])}, jnp.asarray([True, True]),
                                jnp.arange(2), jax.random.PRNGKey(0), "ipm", 2.0)
  np.testing.assert_array_equal(np.asarray(out["u"]), 0.0)


def test_malicious_clients_drawn_each_round_or_once():
  n, frac = 20, 0.25
  ones = {"u": jnp.ones((n, 2))}
  ids, mask = jnp.arange(n), jnp.ones(n, bool)

  def who(draw, round_key):
    stage = attacks.make_byzantine(n, frac, 0, "sign_flip", 1.0, 9, draw, 10)
    return np.asarray(stage(ones, ids, mask, round_key)["u"][:, 0] < 0)
  keys = [jax.random.fold_in(jax.random.PRNGKey(1), r) for r in range(6)]
  fixed = [who("fixed", k) for k in keys]
  fresh = [who("round", k) for k in keys]
  assert all(np.array_equal(f, attacks.malicious_clients(n, frac, 0)) for f in fixed)
  assert all(f.sum() == 5 for f in fresh)
  assert len({tuple(np.flatnonzero(f)) for f in fresh}) == 6      # a new set each round
  np.testing.assert_array_equal(who("round", keys[2]), fresh[2])  # the round key decides
  # over many rounds every client is sometimes malicious, at the fraction's rate
  many = np.mean([who("round", jax.random.fold_in(keys[0], r)) for r in range(200)], axis=0)
  assert np.all(many > 0.1) and abs(many.mean() - frac) < 1e-9


@pytest.mark.parametrize("devices", [1, 2])
@pytest.mark.parametrize("kind", ["alie", "ipm"])
def test_a_round_averages_the_colluders_upload_with_the_honest_ones(kind, devices):
  """One round, weighted mean: the honest clients' deltas (computed outside the
  round) and the malicious ones' common upload, by numpy; on 2 devices the
  statistics are still the whole cohort's (an audit found them per device)."""
  x, y, parts = toy_problem(sizes=(8, 9, 10, 11, 7, 12, 9, 10, 8, 11))
  sim = toy_simulation(x, y, parts, devices=devices, hidden=[6], byzantine_fraction=0.3,
                       byzantine_attack=kind,
                       **({"byzantine_scale": 2.0} if kind == "ipm" else {}))
  s0 = sim.init_state()
  deltas = np.stack([flat(d) for d in round_zero_deltas(sim, s0)]).astype(np.float64)
  bad = attacks.malicious_clients(10, 0.3, seed=0)
  mu, sd = deltas[~bad].mean(0), deltas[~bad].std(0)
  z = norm.ppf((10 - (np.floor(10 / 2 + 1) - 3)) / 10)
  sent = mu - z * sd if kind == "alie" else -2.0 * mu
  uploads = np.where(bad[:, None], sent, deltas)
  n = np.array([len(p) for p in parts], float)
  p0 = flat(s0.params)
  s1, _ = sim.run_rounds(s0, 1)      # donates s0
  np.testing.assert_allclose(flat(s1.params) - p0,
                             (n[:, None] * uploads).sum(0) / n.sum(), rtol=1e-4, atol=1e-6)


def test_config_refuses_what_the_attack_does_not_read():
  with pytest.raises(ConfigError, match="'byzantine_scale' = 2.0 is read by nothing"):
    make_config({"byzantine_fraction": 0.2, "byzantine_attack": "alie", "byzantine_scale": 2.0})
  with pytest.raises(ConfigError, match="'byzantine_draw' = 'round' is read by nothing"):
    make_config({"byzantine_draw": "round"})
  with pytest.raises(ConfigError, match="'byzantine_attack' = 'lie'"):
    make_config({"byzantine_fraction": 0.2, "byzantine_attack": "lie"})
  make_config({"byzantine_fraction": 0.2, "byzantine_attack": "ipm", "byzantine_scale": 0.1,
               "byzantine_draw": "round"})
  with pytest.raises(ConfigError, match="'byzantine_attack' = 'alie' with dp 'central'"):
    make_config({"byzantine_fraction": 0.2, "byzantine_attack": "alie", "dp": "central",
                 "noise_multiplier": 1.0})
  make_config({"byzantine_fraction": 0.2, "byzantine_attack": "alie", "dp": "local",
               "noise_multiplier": 1.0})
