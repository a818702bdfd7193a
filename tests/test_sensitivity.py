"""The analyzer's statistical branch against closed forms and numpy."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dp.privacy.tiers import sensitivity as sa


def test_shannon_entropy_of_a_known_discrete_distribution():
  p = np.array([0.5, 0.3, 0.2])
  rng = np.random.default_rng(0)
  x = rng.choice(3, size=20000, p=p).astype(np.float32)
  want = -np.sum(p * np.log(p))
  assert float(sa.shannon_entropy(jnp.asarray(x))) == pytest.approx(want, abs=0.01)
  # the plug-in estimate exactly: the sample's own frequencies
  f = np.bincount(x.astype(int)) / len(x)
  assert float(sa.shannon_entropy(jnp.asarray(x))) == pytest.approx(-np.sum(f * np.log(f)),
                                                                     rel=1e-5)
  assert int(sa.distinct_values(jnp.asarray(x))) == 3


@pytest.mark.parametrize("sigma", [0.5, 1.0, 3.0])
def test_kde_entropy_of_a_gaussian(sigma):
  x = np.random.default_rng(1).normal(0, sigma, size=3000).astype(np.float32)
  want = 0.5 * math.log(2 * math.pi * math.e * sigma ** 2)
  assert float(sa.kde_entropy(jnp.asarray(x))) == pytest.approx(want, abs=0.03)


def test_kde_entropy_of_a_uniform():
  x = np.random.default_rng(2).uniform(0, 4, size=3000).astype(np.float32)
  # ln 4, plus the smoothing past the edges (Silverman's bandwidth is tuned for a
  # Gaussian and oversmooths a box), which can only add entropy
  h = float(sa.kde_entropy(jnp.asarray(x)))
  assert math.log(4) < h < math.log(4) + 0.08


def test_correlation_against_numpy():
  rng = np.random.default_rng(3)
  s = rng.normal(size=(500, 2))
  x = np.stack([s[:, 0] + 0.5 * rng.normal(size=500), rng.normal(size=500),
                -s[:, 1] + 0.1 * rng.normal(size=500), np.ones(500)], axis=1)
  got = np.asarray(sa.max_abs_correlation(jnp.asarray(x, jnp.float32), jnp.asarray(s, jnp.float32)))
  for f in range(3):
    want = max(abs(np.corrcoef(x[:, f], s[:, k])[0, 1]) for k in range(2))
    assert got[f] == pytest.approx(want, abs=1e-5)
  assert got[3] == 0.0    # a constant feature correlates with nothing


def test_kl_of_two_gaussians():
  rng = np.random.default_rng(4)
  mu1, s1, mu2, s2 = 0.5, 1.0, 0.0, 1.5
  x = rng.normal(mu1, s1, size=50000).astype(np.float32)
  ref = rng.normal(mu2, s2, size=50000).astype(np.float32)
  want = math.log(s2 / s1) + (s1 ** 2 + (mu1 - mu2) ** 2) / (2 * s2 ** 2) - 0.5
  assert float(sa.kl_to_reference(jnp.asarray(x), jnp.asarray(ref), bins=64)) == pytest.approx(
      want, abs=0.02)
  assert float(sa.kl_to_reference(jnp.asarray(ref), jnp.asarray(ref))) == pytest.approx(0, abs=1e-6)


def test_statistical_scores_rank_the_healthcare_features():
  from fedjax_dp.data.tabular import healthcare_data
  x, _, tiers, _, sensitive = healthcare_data(400, seed=0)
  x = (x - x.mean(0)) / (x.std(0) + 1e-9)
  cols = [0, 1, 305, 483, 484, 493, 525, 526]   # 2 genotypes, clinical, 3 sensitive, 2 imaging
  out = jax.jit(sa.statistical_scores)(jnp.asarray(x[:200, cols]), jnp.asarray(x[:200][:, sensitive]),
                              jnp.asarray(x[200:, cols]))
  disc = np.asarray(out["discrete"])
  assert disc[:2].all() and not disc[-2:].any()       # genotypes discrete, imaging continuous
  # the sensitive attributes correlate perfectly with themselves
  np.testing.assert_allclose(np.asarray(out["correlation"])[3:6], 1.0, atol=1e-5)
  for key in ("entropy_score", "correlation_score", "kl_score", "score"):
    v = np.asarray(out[key])
    assert np.all(v >= 0) and np.all(v <= 1 + 1e-6), key
