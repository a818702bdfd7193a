"""The samplers that enforce a participation schema (placement/participation.py,
placement/cohort.py) and the accounting that reads it: each sampler's draws keep
its schema's promises, checked over many rounds against the schema and against
jax-privacy's own samplers; BandMF under cyclic Poisson sampling is accounted as
jax-privacy's amplified_bandmf_event, through dp-accounting."""

from __future__ import annotations

import json

import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_dp
from fedjax_dp.errors import ConfigError
from fedjax_dp.experiment.setup import setup as setup_run
from fedjax_dp.placement import cohort, participation
from fedjax_dp.privacy import accounting
from fedjax_dp.privacy.mechanisms import correlated

N, M = 60, 10                  # n / m = 6
SMALL = {"dataset": "digits", "num_clients": N, "clients_per_round": M, "rounds": 12,
         "eval_every": 12, "hidden": [16], "devices": 1, "clip_norm": 1.0}


@pytest.fixture(autouse=True)
def strategy_cache(tmp_path, monkeypatch):
  monkeypatch.setenv("FEDJAX_DP_CACHE", str(tmp_path / "cache"))


def draws(sampling: str, rounds: int, b: int | None = None, capacity: int = 2 * M,
          key: int = 0):
  """{client: [rounds it took part in]}, [cohort size per round], the schema: the
  sampler as build_simulation makes it, run for `rounds` rounds."""
  schema = participation.schema(sampling, N, M, rounds, b)
  sampler = cohort.make_sampler(resident=False, schema=schema, capacity=capacity, n_dev=2,
                                slots=capacity, data_seed=7)
  run_key = jax.random.PRNGKey(key)
  state = sampler.init(jax.random.fold_in(run_key, 99))
  draw = jax.jit(sampler.draw)
  seen, sizes = {c: [] for c in range(N)}, []
  for r in range(rounds):
    ids, mask, overflow, state = draw(jax.random.fold_in(run_key, r), jnp.ones(N, jnp.int32),
                                      jnp.int32(r), state)
    ids = np.asarray(ids)[np.asarray(mask)]
    assert int(overflow) == 0 and len(set(ids.tolist())) == len(ids)
    sizes.append(len(ids))
    for c in ids:
      seen[int(c)].append(r)
  return seen, np.asarray(sizes), schema


def test_cyclic_trains_each_group_whole_every_b_rounds():
  seen, sizes, schema = draws("cyclic", 19)
  assert schema == participation.Participation("cyclic", 6, 4, N, M)
  assert set(sizes) == {M}
  for rounds in seen.values():
    assert 3 <= len(rounds) <= schema.max_participations and set(np.diff(rounds)) == {6}


def test_cyclic_poisson_draws_inside_each_group_at_rate_q():
  """Each client only in its group's rounds (t = g mod b, the same public groups as
  'cyclic'), there with frequency q = m b / n (a binomial's 5 sd), independently."""
  b, rounds = 3, 3 * 400
  seen, sizes, schema = draws("cyclic_poisson", rounds, b)
  q = M * b / N
  assert schema.sampling_prob == q and schema.min_sep == b and schema.max_participations == 400
  groups = participation.cyclic_groups(N, b, 7)
  for g, members in enumerate(groups):
    for c in members:
      assert all(r % b == g for r in seen[int(c)])
      assert abs(len(seen[int(c)]) - 400 * q) < 5 * np.sqrt(400 * q * (1 - q))
  assert abs(sizes.mean() - M) < 5 * np.sqrt(M * (1 - q) / rounds)
  assert sizes.std() > 1   # random sizes, not a fixed schedule


def test_balls_in_bins_trains_each_clients_secret_bin_every_b_rounds():
  """Each client in every round of its bin (t = bin mod b, b = n / m) and no other;
  the bins come from the run key (another key, other bins) and are uneven."""
  seen, sizes, schema = draws("balls_in_bins", 24)
  assert schema.min_sep == 6 and schema.max_participations == 4
  for rounds in seen.values():
    assert len(rounds) == 4 and set(np.diff(rounds)) == {6}
  assert sizes.sum() == 4 * N and sizes.mean() == M
  other, _, _ = draws("balls_in_bins", 6, key=1)
  assert {c: r[0] for c, r in seen.items()} != {c: r[0] for c, r in other.items()}
  # the bins are a uniform draw: over many keys each client's bin is uniform
  bins = np.stack([np.asarray(jax.random.randint(jax.random.PRNGKey(k), (N,), 0, 6))
                   for k in range(200)])
  counts = np.bincount(bins.ravel(), minlength=6)
  assert np.all(np.abs(counts - 2000) < 5 * np.sqrt(2000))


def test_min_sep_keeps_b_rounds_between_participations_at_the_steady_cohort():
  """b-min-separation with random availability: no client twice within b rounds;
  cohorts of m on average from the first round (warm start), as jax-privacy's
  BMinSepSampling draws them at the same p (an independent implementation)."""
  from jax_privacy import batch_selection
  b, rounds = 4, 1500
  seen, sizes, schema = draws("min_sep", rounds, b, capacity=3 * M)
  assert schema.sampling_prob == pytest.approx(1 / (N / M - b + 1))
  for r in seen.values():
    assert len(r) == 0 or np.min(np.diff(r), initial=b) >= b
  theirs = np.asarray([len(x) for x in batch_selection.BMinSepSampling(
      sampling_prob=schema.sampling_prob, iterations=rounds, min_sep=b).batch_iterator(
          N, rng=0)])
  for ours in (sizes, sizes[:50]):
    assert abs(ours.mean() - M) < 0.5
  assert abs(sizes.mean() - theirs.mean()) < 0.5 and abs(sizes.std() - theirs.std()) < 0.4
  # every gap of exactly b happens (the rule binds, clients come back when allowed)
  gaps = np.concatenate([np.diff(r) for r in seen.values() if len(r) > 1])
  assert np.min(gaps) == b


def test_the_accountant_reads_the_samplers_schema():
  """summary.json's participation is the schema the sampler was built from."""
  from fedjax_dp.recipes.privacy import participation_of
  for sampling, b, want in (("cyclic", None, (6, 2)), ("balls_in_bins", None, (6, 2)),
                            ("cyclic_poisson", 3, (3, 4)), ("min_sep", 4, (4, 3)),
                            ("poisson", None, (1, 12))):
    cfg = fedjax_dp.make_config({**SMALL, "dp": "tree", "noise_multiplier": 1.0,
                                 "sampling": sampling, "min_separation": b})
    schema = participation_of(cfg)
    assert (schema.min_sep, schema.max_participations) == want, sampling


def amplified_epsilons(z: float, rounds: int, b: int, q: float, delta: float):
  """(RDP, PLD) epsilons of jax-privacy's amplified_bandmf_event through
  dp-accounting (the independent reference)."""
  from jax_privacy.experimental import accounting as jp_accounting
  from fedjax_dp.privacy.planning import PLD_DISCRETISATION
  event = jp_accounting.amplified_bandmf_event(z, rounds, num_bands=b, sampling_prob=q)
  rdp = dp_accounting.rdp.RdpAccountant([float(a) for a in accounting.DEFAULT_ORDERS])
  pld = dp_accounting.pld.PLDAccountant(value_discretization_interval=PLD_DISCRETISATION)
  return rdp.compose(event).get_epsilon(delta), pld.compose(event).get_epsilon(delta)


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_bandmf_under_cyclic_poisson_is_jax_privacys_amplified_bandmf(tmp_path, accountant):
  """The run's epsilon, the plan's and the noise: jax-privacy's amplified_bandmf_event
  (rounds, num_bands = the cycle, q = the sampler's float32 rate) composed by
  dp-accounting; noise std z C (one column, norm 1); a ledger read mid-run holds
  the cycles started."""
  from fedjax_dp.experiment import plan_privacy
  from fedjax_dp.privacy.mechanisms.base import poisson_rate_used
  z, b = 1.2, 3
  values = {**SMALL, "dp": "bandmf", "sampling": "cyclic_poisson", "min_separation": b,
            "noise_multiplier": z, "accountant": accountant}
  fedjax_dp.run(values, out=str(tmp_path / "r"), progress=False, log=lambda m: None)
  report = json.load(open(tmp_path / "r" / "summary.json"))["privacy"]
  q = poisson_rate_used(M * b / N)
  rdp, pld = amplified_epsilons(z, 12, b, q, 1e-5)
  assert report.get("rdp_epsilon", report["epsilon"]) == pytest.approx(rdp, rel=1e-5)
  if accountant == "pld":
    assert report["epsilon"] == pytest.approx(pld, rel=1e-9) and pld < rdp
  assert report["correlated_noise"]["sensitivity"] == pytest.approx(1.0, rel=1e-6)
  assert report["correlated_noise"]["noise_std"] == pytest.approx(z, rel=1e-6)
  planned = plan_privacy.plan(fedjax_dp.make_config(values))
  assert planned["epsilon"] == pytest.approx(report["epsilon"], rel=1e-9)
  sim = setup_run(fedjax_dp.make_config(values))[2]
  s = sim.privacy.strategy
  assert np.count_nonzero(s.charges) == 4 and np.flatnonzero(s.charges).tolist() == [0, 3, 6, 9]
  for t in (1, 4, 7, 12):   # after t rounds: the cycles begun, amplified
    assert correlated.charged_steps(z, s, t) == (q, z, (t + b - 1) // b)
  # not amplified: tree and BLT under the same sampler, BandMF under balls-in-bins
  for dp, sampling in (("tree", "cyclic_poisson"), ("blt", "cyclic_poisson"),
                       ("bandmf", "balls_in_bins")):
    cfg = fedjax_dp.make_config({**values, "dp": dp, "sampling": sampling, "min_separation":
                                 b if sampling == "cyclic_poisson" else None})
    assert plan_privacy.plan(cfg)["rdp_epsilon"] == pytest.approx(
        dp_accounting.rdp.RdpAccountant([float(a) for a in accounting.DEFAULT_ORDERS]).compose(
            dp_accounting.GaussianDpEvent(z)).get_epsilon(1e-5), rel=1e-5), (dp, sampling)


def test_amplified_calibration_reaches_its_target():
  from fedjax_dp.experiment import plan_privacy
  values = {**SMALL, "dp": "bandmf", "sampling": "cyclic_poisson", "min_separation": 6,
            "target_epsilon": 2.0, "rounds": 60}
  planned = plan_privacy.plan(fedjax_dp.make_config(values))
  from fedjax_dp.privacy.mechanisms.base import poisson_rate_used
  rdp, _ = amplified_epsilons(planned["noise_multiplier"], 60, 6, poisson_rate_used(1.0), 1e-5)
  assert planned["epsilon"] == pytest.approx(2.0, rel=1e-3) and rdp == pytest.approx(
      planned["rdp_epsilon"], rel=1e-5)


def test_the_applied_amplified_noise_is_z_c_through_the_strategy():
  """The differential method under cyclic_poisson: the same key at z = 2 and 1e-6
  (learning rate 1e-12); each round's noise on the sum has the covariance
  (z C)^2 C_s^{-1} C_s^{-T} (sensitivity 1: one column), C_s from jax-privacy."""
  from jax_privacy.matrix_factorization import banded
  from fedjax_dp.experiment.setup import setup
  from fedjax_dp.privacy.mechanisms import strategy_cache
  cfg = {**SMALL, "dp": "bandmf", "sampling": "cyclic_poisson", "min_separation": 3,
         "lr": 1e-12, "hidden": [256]}
  sims = [setup(fedjax_dp.make_config({**cfg, "noise_multiplier": z}))[2] for z in (2.0, 1e-6)]
  key = np.asarray(sims[0].init_state().key)

  def changes(sim):
    state = sim.init_state()._replace(key=jnp.asarray(key))
    flat = lambda s: np.concatenate([np.ravel(np.asarray(x, np.float64))
                                     for x in jax.tree.leaves(s.params)])
    out, last = [], flat(state)
    for _ in range(12):
      state, _ = sim.run_rounds(state, 1, same_draws=True)
      out.append(flat(state) - last)
      last = flat(state)
    return np.stack(out)
  noise = (changes(sims[0]) - changes(sims[1])) * M
  params = strategy_cache.bandmf_params(12, 3, 0.0)
  c = np.asarray(banded.ColumnNormalizedBanded(params=jnp.asarray(params)).materialize(),
                 np.float64)
  c_inv = np.linalg.inv(c)
  want = 4.0 * c_inv @ c_inv.T
  got = noise @ noise.T / noise.shape[1]
  scale = np.sqrt(np.outer(np.diag(want), np.diag(want)))
  np.testing.assert_allclose(got / scale, want / scale, atol=0.05)


def test_sampling_refusals_are_one_line():
  base = {**SMALL, "dp": "tree", "noise_multiplier": 1.0}
  for extra, match in (
      ({"sampling": "cyclic_poisson"}, "'sampling' = 'cyclic_poisson': sampling "
                                       "'cyclic_poisson' needs min_separation"),
      ({"sampling": "min_sep", "min_separation": 7}, "'min_separation' = 7: min_separation 7 "
                                                     "with sampling 'min_sep': must be 1 to"),
      ({"sampling": "cyclic_poisson", "min_separation": 4, "num_clients": 50},
       "num_clients \\(50\\) must be a multiple of it"),
      ({"sampling": "balls_in_bins", "clients_per_round": 7}, "needs num_clients \\(60\\) a "
                                                              "multiple"),
      ({"sampling": "poisson", "min_separation": 3}, "'min_separation' = 3 is read by nothing"),
      ({"sampling": "cyclic_poisson", "min_separation": 3, "dp": "central"},
       "'sampling' = 'cyclic_poisson' with dp 'central'"),
      ({"sampling": "min_sep", "min_separation": 3, "client_state_store": "host",
        "algorithm": "scaffold", "dp": "none", "noise_multiplier": None},
       "'client_state_store' = 'host' with sampling 'min_sep'")):
    with pytest.raises(ConfigError, match=match):
      cfg = fedjax_dp.make_config({**base, **extra})
      setup_run(cfg)


def test_min_sep_state_resumes_and_replicas_differ(tmp_path):
  """min_sep's last-participation table lives in the round state: a run split in two
  chunks equals one chunk bit for bit, and replicas (other run keys) draw other
  cohorts."""
  from fedjax_dp.experiment.setup import setup
  sim = setup(fedjax_dp.make_config({**SMALL, "dp": "bandmf", "sampling": "min_sep",
                                     "min_separation": 3, "noise_multiplier": 1.0}))[2]
  one, _ = sim.run_rounds(sim.init_state(), 12)
  half, _ = sim.run_rounds(sim.init_state(), 6)
  two, _ = sim.run_rounds(half, 6)
  for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(two)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert np.asarray(one.sampler).shape == (N,)
  assert int(np.max(np.asarray(one.sampler))) == 11


def test_a_secret_key_restart_draws_the_same_bins_with_its_key(tmp_path):
  """audit: a noise_seed 'secret' run restarted without a checkpoint took its saved
  run key back but kept bins drawn from a fresh one: the same noise over other
  cohorts, whose difference exposes the clients' sums. The sampler's state now
  comes with the key."""
  import os
  values = {**SMALL, "dp": "bandmf", "sampling": "balls_in_bins", "noise_multiplier": 1.0,
            "noise_seed": "secret", "checkpoint_every": 0, "eval_every": 1}
  out = tmp_path / "s"
  fedjax_dp.run(values, out=str(out), progress=False, log=lambda m: None)
  rows = lambda: [(r["bytes_up"], r["test_loss"]) for r in
                  map(json.loads, open(out / "metrics.jsonl"))]
  first = rows()
  assert len({b for b, _ in first}) > 1   # the bins are uneven: the bytes tell the cohorts
  os.remove(out / "summary.json")
  fedjax_dp.run(values, out=str(out), progress=False, log=lambda m: None, resume=True)
  assert rows() == first


def test_central_dp_is_refused_with_any_sampling_but_its_own():
  for sampling, b in (("cyclic_poisson", 1), ("min_sep", 1), ("balls_in_bins", None)):
    with pytest.raises(ConfigError, match=f"'sampling' = '{sampling}' with dp 'central'"):
      fedjax_dp.make_config({**SMALL, "dp": "central", "noise_multiplier": 1.0,
                             "sampling": sampling, "min_separation": b})
