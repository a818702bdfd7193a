"""Robust aggregators against plain numpy references, Byzantine clients in the
round, and the aggregator options end to end."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dp import make_config
from fedjax_dp.errors import ConfigError
from fedjax_dp.kernels import reference
from fedjax_dp.kernels import robust_aggregation as ra
from tests.helpers import flat, keyed_state, round_zero_deltas, toy_problem, toy_simulation


def cohort(m=9, d=13, seed=0, absent=(2, 7)):
  rng = np.random.default_rng(seed)
  u = rng.normal(size=(m, d)).astype(np.float32)
  mask = np.ones(m, bool)
  mask[list(absent)] = False
  u[~mask] = 1e6          # absent slots hold garbage that must never matter
  w = rng.uniform(1, 5, size=m).astype(np.float32)
  return u, mask, w


def np_krum_scores(u, f):
  n = len(u)
  out = []
  for i in range(n):
    d = sorted(float(np.sum((u[i] - u[j]) ** 2)) for j in range(n) if j != i)
    out.append(sum(d[:max(n - f - 2, 1)]))
  return np.array(out)


@pytest.mark.parametrize("m", [1, 2, 3, 5, 12, 60, 64, 65, 130])
def test_sort_network_equals_numpy_sort(m):
  """The bitonic network sorts every column as numpy does: ties, infinities,
  sizes that are and are not powers of two; above its limit jnp.sort does it."""
  rng = np.random.default_rng(m)
  x = rng.normal(size=(m, 37)).astype(np.float32)
  x[:, :5] = np.round(x[:, :5])                  # ties
  x[rng.random(x.shape) < 0.1] = np.inf          # absent slots' padding
  x[rng.random(x.shape) < 0.05] = -np.inf
  np.testing.assert_array_equal(np.asarray(jax.jit(ra.sort_columns)(x)), np.sort(x, axis=0))


def test_sort_columns_above_the_network_limit(monkeypatch):
  monkeypatch.setattr(ra, "SORT_NETWORK_MAX", 4)
  x = np.random.default_rng(0).normal(size=(9, 6)).astype(np.float32)
  np.testing.assert_array_equal(np.asarray(ra.sort_columns(x)), np.sort(x, axis=0))


@pytest.mark.parametrize("absent", [(), (2, 7), (0, 1, 2)])
def test_coordinatewise_rules_against_numpy(absent):
  u, mask, w = cohort(absent=absent)
  p = u[mask]
  np.testing.assert_allclose(ra.weighted_mean(u, mask, w),
                             (w[mask, None] * p).sum(0) / w[mask].sum(), rtol=1e-5)
  np.testing.assert_allclose(ra.coordinate_median(u, mask), np.median(p, axis=0), rtol=1e-6)
  for beta in (0.0, 0.1, 0.25, 0.4):
    t = int(np.floor(beta * len(p)))
    want = np.sort(p, axis=0)[t:len(p) - t].mean(0)
    np.testing.assert_allclose(ra.trimmed_mean(u, mask, beta=beta), want, rtol=1e-5, atol=1e-6)


def test_krum_and_multi_krum_against_numpy():
  u, mask, _ = cohort(m=10, absent=(4,))
  p, idx = u[mask], np.flatnonzero(mask)
  for f in (0, 1, 3):
    want = np_krum_scores(p, f)
    got = np.asarray(ra.krum_scores(u, mask, f))
    np.testing.assert_allclose(got[mask], want, rtol=1e-4)
    assert np.all(np.isinf(got[~mask]))
    np.testing.assert_allclose(ra.krum(u, mask, f=f), p[np.argmin(want)], rtol=1e-6)
    best3 = np.argsort(want)[:3]
    np.testing.assert_allclose(ra.krum(u, mask, f=f, m_keep=3), p[best3].mean(0), rtol=1e-5)


@pytest.mark.parametrize("offset", [10.0, 100.0])
def test_krum_scores_hold_for_updates_with_a_large_common_part(offset):
  # float64 Krum by its definition against the kernel, on a cohort whose updates
  # differ by 1e-4 of their size: the plain Gram form cancels away the differences
  rng = np.random.default_rng(0)
  m, d, f = 10, 2000, 2
  u = (offset + 0.01 * rng.normal(size=(m, d))).astype(np.float32)
  u[0] += (0.005 * rng.normal(size=d)).astype(np.float32)
  p = u.astype(np.float64)
  d2 = ((p[:, None] - p[None]) ** 2).sum(-1)
  want = [sum(sorted(np.delete(d2[i], i))[:m - f - 2]) for i in range(m)]
  got = np.asarray(ra.krum_scores(jnp.asarray(u), jnp.ones(m, bool), f))
  np.testing.assert_allclose(got, want, rtol=1e-3)
  assert int(np.argmin(got)) == int(np.argmin(want))


def test_krum_keeps_a_lone_participant():
  # one participant has no neighbours; the empty slot's leftover value must not win
  u = jnp.asarray([[5.0], [1.0]])
  mask = jnp.asarray([False, True])
  np.testing.assert_array_equal(np.asarray(ra.krum(u, mask)), [1.0])
  np.testing.assert_array_equal(np.asarray(ra.krum(u, mask, m_keep=2)), [1.0])


@pytest.mark.parametrize("algorithm,extra", [("fedavgm", {}), ("fedadam", {"server_lr": 0.01})])
def test_a_round_nobody_takes_part_in_leaves_the_model_and_momentum(algorithm, extra):
  x, y, parts = toy_problem(sizes=(7, 12, 3, 9))
  sim = toy_simulation(x, y, parts, algorithm=algorithm, sampling="poisson", clients_per_round=1,
                       seed=0, **extra)
  state, seen_empty = sim.init_state(), 0
  for _ in range(40):
    # copies: the round donates its input state
    params, opt = flat(state.params), [np.asarray(a) for a in
                                       jax.tree.leaves(state.server_opt_state)]
    state, st = sim.run_rounds(state, 1)
    if int(st.participants[0]) == 0:
      seen_empty += 1
      np.testing.assert_array_equal(flat(state.params), params)
      for a, b in zip(jax.tree.leaves(state.server_opt_state), opt):
        np.testing.assert_array_equal(np.asarray(a), b)
  assert seen_empty > 0


def test_outlier_rule_switches_to_the_median():
  u, mask, w = cohort(m=12, d=20, absent=(5,))
  agg, flagged = ra.median_if_outliers(u, mask, w)
  assert int(flagged) == 0     # Gaussian updates: no outlier, the weighted mean
  np.testing.assert_allclose(agg, ra.weighted_mean(u, mask, w), rtol=1e-6)
  u2 = u.copy()
  u2[3] *= 50.0                # one update far from the others
  flags = np.asarray(ra.outlier_flags(u2, mask))
  # reference: robust z of the distance to the coordinate-wise median
  p = u2[mask]
  dist = np.linalg.norm(p - np.median(p, 0), axis=1)
  z = (dist - np.median(dist)) / (1.4826 * np.median(np.abs(dist - np.median(dist))))
  np.testing.assert_array_equal(flags[mask], z > 3.5)
  assert flags[3] and flags.sum() == 1
  agg, flagged = ra.median_if_outliers(u2, mask, w)
  assert int(flagged) == 1
  np.testing.assert_allclose(agg, np.median(p, axis=0), rtol=1e-6)


def np_components(u, threshold):
  n = len(u)
  un = u / np.linalg.norm(u, axis=1, keepdims=True)
  adj = un @ un.T > threshold
  labels = list(range(n))
  for _ in range(n):
    for i, j in itertools.product(range(n), range(n)):
      if adj[i, j]:
        labels[i] = labels[j] = min(labels[i], labels[j])
  return np.array(labels)


def test_cosine_clusters_and_clustered_mean_against_numpy():
  rng = np.random.default_rng(3)
  centers = rng.normal(size=(3, 30))
  which = np.array([0, 1, 0, 2, 1, 0, 2, 2])
  u = (centers[which] + 0.05 * rng.normal(size=(8, 30))).astype(np.float32)
  mask = np.ones(9, bool)
  mask[8] = False
  u = np.concatenate([u, np.full((1, 30), 1e6, np.float32)])
  w = rng.uniform(1, 3, size=9).astype(np.float32)
  labels = np.asarray(ra.cosine_clusters(u, mask, 0.9))
  np.testing.assert_array_equal(labels[:8], np_components(u[:8], 0.9))
  assert labels[8] == 9 and len(set(labels[:8])) == 3
  agg, k = ra.clustered_mean(u, mask, w, 0.9)
  want = np.mean([np.average(u[:8][labels[:8] == c], axis=0, weights=w[:8][labels[:8] == c])
                  for c in sorted(set(labels[:8]))], axis=0)
  assert int(k) == 3
  np.testing.assert_allclose(agg, want, rtol=1e-5, atol=1e-6)


def np_filtered_mean(u, w, cos_min, z):
  """Gradient filtering by its definition, in float64: (aggregate, dropped)."""
  u = u.astype(np.float64)
  med = np.median(u, 0)
  norm = np.linalg.norm(u, axis=1)
  cos = u @ med / (norm * np.linalg.norm(med))
  mad = np.median(np.abs(norm - np.median(norm)))
  drop = (cos < cos_min) | ((norm - np.median(norm)) / max(1.4826 * mad, 1e-30) > z)
  if drop.all():
    return med, int(drop.sum())
  return np.average(u[~drop], axis=0, weights=w[~drop]), int(drop.sum())


def test_gradient_filtering_drops_the_backward_and_the_huge_updates():
  rng = np.random.default_rng(4)
  honest = rng.normal(1.0, 0.3, size=(8, 40))
  u = np.concatenate([honest, -2 * honest[:1], 30 * honest[1:2], np.full((1, 40), np.nan)])
  u = u.astype(np.float32)
  mask = np.r_[np.ones(10, bool), False]
  w = rng.uniform(1, 4, size=11).astype(np.float32)
  agg, dropped = ra.filtered_mean(np.nan_to_num(u), mask, w, 0.0, 3.5)
  want, n_drop = np_filtered_mean(u[:10], w[:10], 0.0, 3.5)
  assert int(dropped) == n_drop == 2
  np.testing.assert_allclose(np.asarray(agg), want, rtol=1e-5)
  np.testing.assert_allclose(want, np.average(honest, axis=0, weights=w[:8]), rtol=1e-6)
  # nothing kept (a threshold no update meets): the median
  agg, dropped = ra.filtered_mean(np.nan_to_num(u), mask, w, 1.1, 3.5)
  assert int(dropped) == 10
  np.testing.assert_allclose(np.asarray(agg), np.median(u[:10], 0), rtol=1e-6)


def _own_options(aggregator, **options):
  """The options among `options` that `aggregator` reads (a key no stage reads is refused)."""
  from fedjax_dp.recipes.flat import stage_keys
  return {k: v for k, v in options.items() if k in stage_keys("aggregator", aggregator)}


@pytest.mark.parametrize("aggregator", ["median", "trimmed_mean", "krum", "multi_krum",
                                        "outlier_median", "cluster", "filtered_mean"])
def test_round_applies_the_rule_to_the_clients_deltas(aggregator):
  """One round on 2 devices equals the numpy rule applied to the per-client deltas."""
  x, y, parts = toy_problem(sizes=(8, 9, 10, 11, 7, 12))
  sim = toy_simulation(x, y, parts, hidden=[6], devices=2, aggregator=aggregator,
                       **_own_options(aggregator, trim_fraction=0.2, byzantine_f=1,
                                      cluster_threshold=0.3, filter_cosine=0.5))
  s0 = sim.init_state()
  deltas = np.stack([flat(d) for d in round_zero_deltas(sim, s0)])
  p0 = flat(s0.params)
  s1, stats = sim.run_rounds(s0, 1)
  n = np.array([len(p) for p in parts], float)
  if aggregator == "median":
    want = np.median(deltas, 0)
  elif aggregator == "trimmed_mean":
    want = np.sort(deltas, 0)[1:5].mean(0)
  elif aggregator == "krum":
    want = deltas[np.argmin(np_krum_scores(deltas, 1))]
  elif aggregator == "multi_krum":
    want = deltas[np.argsort(np_krum_scores(deltas, 1))[:5]].mean(0)
  elif aggregator == "filtered_mean":
    want, dropped = np_filtered_mean(deltas, n, 0.5, 3.5)
    assert int(stats.flagged[0]) == dropped
  elif aggregator == "outlier_median":
    want = (n[:, None] * deltas).sum(0) / n.sum() if int(stats.flagged[0]) == 0 \
        else np.median(deltas, 0)
  else:
    labels = np_components(deltas, 0.3)
    want = np.mean([np.average(deltas[labels == c], axis=0, weights=n[labels == c])
                    for c in sorted(set(labels))], axis=0)
    assert int(stats.clusters[0]) == len(set(labels))
  np.testing.assert_allclose(flat(s1.params) - p0, want, rtol=1e-4, atol=1e-6)


def test_byzantine_clients_send_their_attack_and_robust_rules_resist():
  from fedjax_dp.adversary import attacks
  bad = attacks.malicious_clients(10, 0.2, seed=0)
  assert bad.sum() == 2
  np.testing.assert_array_equal(bad, attacks.malicious_clients(10, 0.2, seed=0))
  x, y, parts = toy_problem(sizes=(8, 9, 10, 11, 7, 12, 9, 10, 8, 11))
  common = dict(hidden=[6], byzantine_fraction=0.2, byzantine_attack="sign_flip",
                byzantine_scale=100.0)
  mean_sim = toy_simulation(x, y, parts, **common)
  s0 = keyed_state(mean_sim)   # the median's run below draws the same (another release)
  deltas = np.stack([flat(d) for d in round_zero_deltas(mean_sim, s0)])
  p0 = flat(s0.params)
  honest = np.where(bad[:, None], -100.0 * deltas, deltas)
  n = np.array([len(p) for p in parts], float)
  s1, _ = mean_sim.run_rounds(s0, 1, same_draws=True)
  np.testing.assert_allclose(flat(s1.params) - p0, (n[:, None] * honest).sum(0) / n.sum(),
                             rtol=1e-4, atol=1e-6)
  med_sim = toy_simulation(x, y, parts, aggregator="median", **common)
  s1, _ = med_sim.run_rounds(keyed_state(med_sim), 1, same_draws=True)
  got = flat(s1.params) - p0
  np.testing.assert_allclose(got, np.median(honest, 0), rtol=1e-4, atol=1e-6)
  # the median stays within the honest updates' range; the mean does not
  assert np.all(got <= deltas[~bad].max(0) + 1e-6) and np.all(got >= deltas[~bad].min(0) - 1e-6)


def test_aggregator_config_errors():
  with pytest.raises(ConfigError, match="'aggregator' = 'median' with dp 'central'"):
    make_config({"aggregator": "median", "dp": "central", "noise_multiplier": 1.0})
  with pytest.raises(ConfigError, match="'aggregator' = 'krum' with shuffle"):
    make_config({"aggregator": "krum", "shuffle": "layerwise"})
  with pytest.raises(ConfigError, match="'byzantine_f' = 8: Krum needs"):
    make_config({"aggregator": "krum", "byzantine_f": 8, "clients_per_round": 10})
  with pytest.raises(ConfigError, match="'trim_fraction' = 0.5"):
    make_config({"trim_fraction": 0.5})
  with pytest.raises(ConfigError, match="'aggregator' = 'mode'"):
    make_config({"aggregator": "mode"})
  # with local DP the rules are post-processing of noised uploads: allowed
  make_config({"aggregator": "median", "dp": "local", "noise_multiplier": 1.0})


@pytest.mark.parametrize("scale", [1e3, 1e4, 1e19, 1e25])
def test_krum_resists_one_huge_upload_as_exact_krum_does(scale):
  """Found by an audit: centring the Gram distances on the participants' mean let
  one large upload move that mean, and float32 cancellation then put the honest
  scores off by 53 % (scale 1e3), up to choosing the attacker (1e25). Against
  float64 Krum by its definition."""
  rng = np.random.default_rng(int(np.log10(scale)))
  n, d, f = 10, 2000, 2
  for _ in range(5):
    h = (0.05 + 0.01 * rng.normal(size=(n, d))).astype(np.float32)
    u = h.copy()
    u[[3, 6]] = -scale * h[[3, 6]]
    want = np_krum_scores(u.astype(np.float64), f)
    got = np.asarray(ra.krum_scores(jnp.asarray(u), jnp.ones(n, bool), f))
    honest = np.setdiff1d(np.arange(n), [3, 6])
    np.testing.assert_allclose(got[honest], want[honest], rtol=1e-4)
    assert int(np.argmin(got)) == int(np.argmin(want)) not in (3, 6)


@pytest.mark.parametrize("aggregator", ["median", "trimmed_mean", "krum", "multi_krum",
                                        "outlier_median", "cluster", "geometric_median",
                                        "centered_clip"])
def test_robust_rules_drop_non_finite_uploads_and_ignore_masked_slots(aggregator):
  """A NaN or inf upload is left out by every robust rule (and counted in
  flagged); a masked slot holding NaN or inf changes nothing (0 * inf was NaN)."""
  from fedjax_dp.recipes.flat import build_stage
  cfg = make_config({"aggregator": aggregator, "clients_per_round": 8, "num_clients": 8,
                     **_own_options(aggregator, byzantine_f=1, trim_fraction=0.2)})
  spec = build_stage("aggregator", aggregator, cfg)

  def rule(u, mask, w):   # one call from the rule's initial state
    agg, _, metrics = spec.aggregate(u, mask, w, spec.init(u.shape[1], 8), dict(spec.hparams))
    return agg, metrics["flagged"], metrics["clusters"]
  rng = np.random.default_rng(3)
  u = rng.normal(size=(9, 5)).astype(np.float32)
  mask = np.array([1, 1, 1, 1, 1, 1, 0, 0, 0], bool)
  w = rng.uniform(1, 3, size=9).astype(np.float32)
  clean, clean_flagged, clean_k = rule(jnp.asarray(u), jnp.asarray(mask), jnp.asarray(w))
  dirty = u.copy()
  dirty[6], dirty[7, 2] = np.nan, np.inf                # masked slots
  dirty = np.concatenate([dirty, [[np.nan, 1, 1, 1, 1], [np.inf, -np.inf, 0, 0, 0]]])
  dmask = np.concatenate([mask, [True, True]])          # two participants, non-finite
  dw = np.concatenate([w, [1.0, 1.0]]).astype(np.float32)
  got, flagged, k = rule(jnp.asarray(dirty), jnp.asarray(dmask), jnp.asarray(dw))
  np.testing.assert_array_equal(np.asarray(got), np.asarray(clean))
  assert int(flagged) == int(clean_flagged) + 2 and int(k) == int(clean_k)


def test_krum_and_byzantine_config_bounds():
  with pytest.raises(ConfigError, match="'byzantine_f' = 4: Krum needs clients_per_round > 2"):
    make_config({"aggregator": "krum", "byzantine_f": 4, "clients_per_round": 10})
  make_config({"aggregator": "krum", "byzantine_f": 3, "clients_per_round": 10})
  with pytest.raises(ConfigError, match="'multi_krum_m' = 50: at most clients_per_round"):
    make_config({"aggregator": "multi_krum", "multi_krum_m": 50, "clients_per_round": 10})
  with pytest.raises(ConfigError, match="'byzantine_fraction' = 0.05: of 10 clients that is no"):
    make_config({"byzantine_fraction": 0.05, "num_clients": 10})
  with pytest.raises(ConfigError, match="'byzantine_scale' = 1e\\+39: above float32"):
    make_config({"byzantine_scale": 1e39})


def test_the_kernel_references_agree_with_these_loops_and_the_kernels():
  # kernels/reference.py is the benchmarks' yardstick: vectorized numpy, checked
  # here against the loops above and against the JAX kernels
  rng = np.random.default_rng(5)
  centers = rng.normal(size=(3, 40))
  u = (centers[rng.integers(0, 3, 12)] + 0.3 * rng.normal(size=(12, 40))).astype(np.float32)
  u[4] *= 30.0                                     # an outlier
  mask, w = np.ones(12, bool), rng.uniform(1, 3, 12).astype(np.float32)
  for f in (0, 2, 5):
    np.testing.assert_allclose(reference.krum_scores(u, f), np_krum_scores(
        u.astype(np.float64), f), rtol=1e-9)
    np.testing.assert_allclose(reference.krum(u, f, 3), ra.krum(u, mask, f=f, m_keep=3),
                               rtol=1e-5, atol=1e-5)
  for t in (0.1, 0.5, 0.9):
    np.testing.assert_array_equal(reference.components(u, t), np_components(u, t))
    agg, k = reference.clustered_mean(u, w, t)
    got, got_k = ra.clustered_mean(u, mask, w, t)
    assert int(got_k) == k
    np.testing.assert_allclose(got, agg, rtol=1e-4, atol=1e-5)
  np.testing.assert_array_equal(reference.outlier_flags(u, 3.5), ra.outlier_flags(u, mask, 3.5))
  agg, flagged = ra.median_if_outliers(u, mask, w, 3.5)
  assert int(flagged) == 1
  np.testing.assert_allclose(agg, reference.median_if_outliers(u, w, 3.5), rtol=1e-6)
  np.testing.assert_allclose(ra.trimmed_mean(u, mask, beta=0.25),
                             reference.trimmed_mean(u, 0.25), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(ra.coordinate_median(u, mask), reference.coordinate_median(u),
                             rtol=1e-6)



def test_the_equalizing_cluster_rule_keeps_each_clients_cluster_size():
  """cluster(noise='equalize') is a stateful rule: each clustered client's cluster size
  written at its id, the round's median kept, masked (padded) slots and non-finite
  uploads writing nothing whatever their ids, the aggregate the plain rule's; its
  client_noise is noise_control.cluster_noise_factors of that state (checked by hand)."""
  from fedjax_dp.privacy import noise_control
  from fedjax_dp.robust.cluster import cluster
  plain, rule = cluster(0.5), cluster(0.5, noise="equalize")
  assert rule.stateful and rule.takes_ids and plain.client_noise is None
  rng = np.random.default_rng(3)
  base = rng.normal(size=(2, 6)).astype(np.float32)
  # slots 0-2 near direction a, 3-4 near b, 5 masked (garbage id 0), 6 not finite
  u = np.stack([base[0] + 0.01 * rng.normal(size=6) for _ in range(3)] +
               [base[1] + 0.01 * rng.normal(size=6) for _ in range(2)] +
               [np.full(6, 1e3), np.full(6, np.nan)]).astype(np.float32)
  mask = jnp.asarray([True] * 5 + [False, True])
  ids = jnp.asarray([7, 2, 9, 4, 1, 0, 3], jnp.int32)
  w = jnp.ones(7, jnp.float32)
  hp = {"threshold": jnp.float32(0.5)}
  state = rule.init(6, 10)
  state = {"size": state["size"].at[3].set(5.0).at[0].set(4.0), "median": state["median"]}
  agg, new, m = rule.aggregate(jnp.asarray(u), mask, w, state, hp, ids)
  want_agg, _, want_m = plain.aggregate(jnp.asarray(u), mask, w, (), hp)
  np.testing.assert_array_equal(agg, want_agg)
  assert int(m["flagged"]) == int(want_m["flagged"]) == 1 and int(m["clusters"]) == 2
  size = np.asarray(new["size"])
  np.testing.assert_array_equal(size[[7, 2, 9]], 3.0)
  np.testing.assert_array_equal(size[[4, 1]], 2.0)
  assert size[0] == 4.0 and size[3] == 5.0        # masked and non-finite: kept
  assert float(new["median"]) in (2.0, 2.5, 3.0)   # the median of cluster sizes {3, 2}
  np.testing.assert_array_equal(rule.client_noise(new), noise_control.cluster_noise_factors(
      new["size"], new["median"]))
  _, again, _ = rule.aggregate(jnp.asarray(u), jnp.zeros(7, bool), w, new, hp, ids)
  np.testing.assert_array_equal(again["size"], new["size"])   # nobody clustered
  assert float(again["median"]) == float(new["median"])
